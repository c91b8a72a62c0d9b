"""Where a workspace's server answers (docs/workspaces.md, "Backends"): recorded from what
its job reports (the port) and what its backend says (the host), and the end of a
workspace whose server never answered.

The host is never the job's word: code in a workspace holds the attempt's token and could
report any address, and the proxy would then connect wherever it was told (a server-side
request forgery). The backend resolves the node the attempt runs on to the address the
proxy connects to (``Backend.workspace_address``).
"""

import logging
import re
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from clusters.backends import (
    BackendError,
    JobRef,
    JobStatus,
    PermanentBackendError,
    TransientBackendError,
    backend_for,
)
from clusters.backends.calls import backend_call
from jobs.models import Attempt, AttemptState, Run, RunEvent, RunKind, RunState, Workspace

logger = logging.getLogger(__name__)

# Ports a workspace server may report: not the privileged ones, where a node's own
# services listen (sshd, slurmd's peers below 1024 on some sites).
PORT_MIN, PORT_MAX = 1024, 65535
# A host name (RFC 1123 labels, dotted) or an IPv4 or IPv6 address: what a backend may
# give as the address; anything else (a URL, a path, a user-info "@") is refused.
_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?)*|[0-9A-Fa-f:.]{2,45})$"
)
REPORTING_RUN_STATES = (RunState.PENDING, RunState.RUNNING)


class AddressNotYetKnown(Exception):
    """The job reported before Gantry or its cluster can say where it runs: report again."""


def workspace_address_record(
    *, attempt: Attempt, port: int, now: datetime | None = None
) -> Workspace:
    """Record that the server of ``attempt``'s workspace answers on ``port`` of the host
    its backend names. Only the run's current attempt of a live (pending or running)
    workspace may report; the first port reported is the one kept (a repeat changes
    nothing, another port is refused).

    ValidationError (``port``: out of range; ``state``: not a live workspace's current
    attempt, or a different port already recorded); AddressNotYetKnown when the attempt's
    job is not recorded yet or its backend could not say where it runs.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not PORT_MIN <= port <= PORT_MAX:
        raise ValidationError({"port": [f"A port from {PORT_MIN} to {PORT_MAX}."]})
    now = now or timezone.now()
    attempt, workspace = _reporting(attempt)
    if workspace.attempt_id == attempt.pk and workspace.port is not None:
        if workspace.port == port:
            return workspace
        raise ValidationError(
            {"state": [f"Attempt {attempt.number} already reported port {workspace.port}."]}
        )
    if not attempt.backend_job_id:
        raise AddressNotYetKnown(f"attempt {attempt.number} is still being submitted")
    backend = backend_for(attempt.cluster)
    try:
        with backend_call(cluster=attempt.cluster.name, operation="workspace_address"):
            host, served_port = backend.workspace_address(
                JobRef(name=attempt.name, backend_job_id=attempt.backend_job_id), port=port
            )
    except TransientBackendError as exc:
        raise AddressNotYetKnown(
            f"{attempt.cluster.name} could not say where it runs: {exc}"
        ) from None
    except PermanentBackendError as exc:
        raise ValidationError({"state": [str(exc)]}) from None
    if not _HOST.match(host) or not PORT_MIN <= served_port <= PORT_MAX:
        # A backend's bug, not the job's: refused all the same, the proxy must never get it.
        logger.error("attempt %s: the backend gave the address %r:%r", attempt.pk, host, port)
        raise AddressNotYetKnown(f"{attempt.cluster.name} gave no usable address")
    return _record(attempt=attempt, host=host, port=served_port, now=now)


def _reporting(attempt: Attempt) -> tuple[Attempt, Workspace]:
    """The attempt and its workspace as they are now, if the attempt may report."""
    attempt = Attempt.objects.select_related("run", "cluster").get(pk=attempt.pk)
    run = attempt.run
    workspace = Workspace.objects.filter(run_id=run.pk).first()
    if run.kind != RunKind.INTERACTIVE or workspace is None:
        raise ValidationError({"state": [f"Run {run.pk} is not a workspace."]})
    latest = Attempt.objects.filter(run_id=run.pk).order_by("-number").values_list("pk", flat=True)
    if latest.first() != attempt.pk:
        raise ValidationError(
            {"state": [f"Attempt {attempt.number} of run {run.pk} is not its current attempt."]}
        )
    if run.state == RunState.SUBMITTING and attempt.state in (
        AttemptState.CREATED,
        AttemptState.SUBMITTING,
    ):
        raise AddressNotYetKnown(f"attempt {attempt.number} is still being submitted")
    if run.state not in REPORTING_RUN_STATES or attempt.state not in (
        AttemptState.PENDING,
        AttemptState.RUNNING,
    ):
        raise ValidationError(
            {
                "state": [
                    f"Run {run.pk} is {run.get_state_display().lower()}: only a pending or "
                    "running workspace reports its address."
                ]
            }
        )
    return attempt, workspace


@transaction.atomic
def _record(*, attempt: Attempt, host: str, port: int, now: datetime) -> Workspace:
    run = Run.objects.select_for_update().get(pk=attempt.run_id)
    workspace = Workspace.objects.select_for_update().get(run_id=run.pk)
    current = Attempt.objects.filter(run_id=run.pk).order_by("-number").first()
    if current is None or current.pk != attempt.pk or run.state not in REPORTING_RUN_STATES:
        raise ValidationError({"state": [f"Run {run.pk} moved on while its address was asked."]})
    if workspace.attempt_id == attempt.pk and workspace.port is not None:
        if (workspace.host, workspace.port) == (host, port):
            return workspace  # a concurrent repeat of the same report
        raise ValidationError(
            {"state": [f"Attempt {attempt.number} already reported port {workspace.port}."]}
        )
    workspace.attempt, workspace.host, workspace.port, workspace.ready_at = attempt, host, port, now
    workspace.save(update_fields=["attempt", "host", "port", "ready_at"])
    RunEvent.objects.create(
        run=run,
        attempt=attempt,
        from_state=run.state,
        to_state=run.state,
        reason="WORKSPACE_READY",
        message=f"The workspace's server answers (attempt {attempt.number})",
    )
    return workspace


def workspace_start_overdue(
    *,
    cluster_name: str,
    attempts: list[Attempt],
    statuses: dict[str, JobStatus],
    backend,
    now: datetime,
) -> dict[str, JobStatus]:
    """The statuses that end the workspaces among ``attempts`` whose server has not
    answered within GANTRY_WORKSPACE_START_TIMEOUT_S of their start (by name): the job is
    cancelled on its cluster first, so it holds no GPU past the end Gantry records. One
    query, only when a running workspace attempt is among them."""
    timeout = int(settings.GANTRY_WORKSPACE_START_TIMEOUT_S)
    candidates = {
        attempt.run_id: attempt
        for attempt in attempts
        if attempt.run.kind == RunKind.INTERACTIVE
        and attempt.state == AttemptState.RUNNING
        and attempt.started_at is not None
        and now - attempt.started_at > timedelta(seconds=timeout)
        and (status := statuses.get(attempt.name)) is not None
        and status.state == "RUNNING"
    }
    if not candidates:
        return {}
    answered = set(
        Workspace.objects.filter(
            run_id__in=list(candidates), attempt_id__isnull=False, port__isnull=False
        ).values_list("run_id", "attempt_id")
    )
    ended: dict[str, JobStatus] = {}
    for run_id, attempt in candidates.items():
        if (run_id, attempt.pk) in answered:
            continue
        try:
            with backend_call(cluster=cluster_name, operation="cancel"):
                backend.cancel(JobRef(name=attempt.name, backend_job_id=attempt.backend_job_id))
        except BackendError as exc:
            logger.warning(
                "attempt %s: the overdue workspace is not cancelled yet: %s", attempt.pk, exc
            )
            continue
        ended[attempt.name] = JobStatus(
            state="FAILED",
            backend_job_id=attempt.backend_job_id,
            started_at=attempt.started_at,
            finished_at=now,
            failure_reason="TIMEOUT",
            message=f"the workspace server did not answer within {timeout} s",
            node_list=list(statuses[attempt.name].node_list),
        )
    return ended
