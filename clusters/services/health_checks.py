"""The active health check on demand (docs/node-health.md): a platform admin asks for one
(``node_health_check_request``, audited); the periodic sync submits it to the backend
(``Backend.health_check``: a short job pinned to the node), follows it like any job and
records its verdict through ``node_health_check_record`` (``node_health_checks_follow``).
A pass lets a quarantined node return to service where the policy says
``release_needs_check``; a failure is a HEALTH_CHECK_FAILED signal, acted on as the policy
says."""

import logging
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from clusters.backends import BackendError, TransientBackendError, backend_for
from clusters.backends.base import JobRef
from clusters.backends.calls import backend_call
from clusters.backends.health_check import (
    FAILED,
    PASSED,
    RUNNING,
    health_check_result,
)
from clusters.models import Cluster, ClusterNode, NodeHealthCheck
from clusters.services.health import node_health_check_record
from core.log_context import log_context
from core.types import UserLike
from tenants.access import require_platform_admin
from tenants.models import max_length_of
from tenants.services.audit import audit_record

logger = logging.getLogger(__name__)

DETAIL_MAX_LENGTH = max_length_of(NodeHealthCheck, "detail")
OPEN = (NodeHealthCheck.State.PENDING, NodeHealthCheck.State.RUNNING)


@transaction.atomic
def node_health_check_request(
    *, cluster: Cluster, node: str, actor: UserLike, now: datetime | None = None
) -> NodeHealthCheck:
    """A platform admin asks for a health check of ``node``; the next sync submits it.
    ClusterNode.DoesNotExist for a node the cluster does not have; ValidationError while
    a check of the node is still open (one at a time). Audited as "node.health_check"."""
    if not getattr(actor, "is_superuser", False):
        require_platform_admin(actor)
    now = now or timezone.now()
    ClusterNode.objects.select_for_update().get(cluster=cluster, name=node)
    if NodeHealthCheck.objects.filter(cluster=cluster, node=node, state__in=OPEN).exists():
        raise ValidationError(f"a health check of {node} is under way already")
    check = NodeHealthCheck.objects.create(
        cluster=cluster,
        node=node,
        requested_by=actor if actor.is_authenticated else None,
        requested_at=now,
    )
    audit_record(
        actor=actor,
        action="node.health_check",
        target=f"{cluster.name}/{node}",
        after={"check": check.pk},
    )
    return check


def node_health_checks_follow(*, cluster: Cluster, now: datetime | None = None) -> int:
    """Submit the cluster's pending checks and follow the running ones (from the periodic
    sync); a check that ended has its verdict recorded on the node. Returns how many
    checks changed state. A backend that refuses a check makes it inconclusive, saying
    why; one that cannot be reached leaves it for the next sync."""
    with log_context(cluster=cluster.name):
        now = now or timezone.now()
        checks = list(NodeHealthCheck.objects.filter(cluster=cluster, state__in=OPEN))
        if not checks:
            return 0
        backend = backend_for(cluster)
        changed = 0
        for check in checks:
            if check.state == NodeHealthCheck.State.PENDING:
                changed += _submit(cluster=cluster, check=check, backend=backend)
        running = [c for c in checks if c.state == NodeHealthCheck.State.RUNNING]
        if running:
            try:
                with backend_call(cluster=cluster.name, operation="sync"):
                    statuses = backend.sync([JobRef(c.job_name, c.backend_job_id) for c in running])
            except BackendError as exc:
                logger.warning("health checks not followed: %s", exc)
                return changed
            for check in running:
                changed += _settle(
                    cluster=cluster, check=check, status=statuses.get(check.job_name), now=now
                )
        return changed


def _submit(*, cluster: Cluster, check: NodeHealthCheck, backend: object) -> int:
    node = ClusterNode.objects.filter(cluster=cluster, name=check.node).first()
    call = getattr(backend, "health_check", None)
    try:
        if node is None:
            raise BackendError(f"{check.node} is no longer in the cluster's inventory")
        if call is None:
            raise BackendError(f"the {cluster.get_backend_display()} backend runs no health checks")
        with backend_call(cluster=cluster.name, operation="health_check"):
            ref = call(check.node, check_id=check.pk, flavor=node.flavor.slug, gpus=node.gpus)
    except BackendError as exc:
        if isinstance(exc, TransientBackendError):
            return 0  # tried again at the next sync
        check.state = NodeHealthCheck.State.INCONCLUSIVE
        check.finished_at = timezone.now()
        check.detail = f"not submitted: {exc}"[:DETAIL_MAX_LENGTH]
        check.save(update_fields=["state", "finished_at", "detail"])
        return 1
    check.job_name, check.backend_job_id = ref.name, ref.backend_job_id
    check.state = NodeHealthCheck.State.RUNNING
    check.save(update_fields=["job_name", "backend_job_id", "state"])
    return 1


def _settle(*, cluster: Cluster, check: NodeHealthCheck, status, now: datetime) -> int:
    result = health_check_result(status)
    if result.verdict == RUNNING:
        return 0
    finished = (status.finished_at if status is not None else None) or now
    check.state = result.verdict
    check.finished_at = finished
    check.detail = result.detail[:DETAIL_MAX_LENGTH]
    check.save(update_fields=["state", "finished_at", "detail"])
    if result.verdict in (PASSED, FAILED):
        node_health_check_record(
            cluster=cluster,
            node=check.node,
            passed=result.verdict == PASSED,
            at=finished,
            detail=result.detail,
            now=now,
        )
    return 1


__all__ = ["node_health_check_request", "node_health_checks_follow"]
