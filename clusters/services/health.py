"""Node health (design §10, docs/node-health.md): recording signals and acting on them as
the cluster's policy says (``node_signals_record``), a person's quarantine and return to
service (``node_quarantine``, ``node_release``), the policy itself
(``cluster_health_policy_set``) and the push of quarantines to the backend
(``node_fences_push``, from the periodic sync).

Every decision about a cluster's nodes holds the cluster's health lock (``_health_lock``):
two recorders at once (the DCGM collection, the inventory refresh) count the quarantined
nodes one after the other, so the blast radius holds across them. Backend calls are made
outside it.
"""

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from clusters.backends import BackendError, backend_for
from clusters.backends.calls import backend_call
from clusters.health import NodeHealth, Signal, SignalClass, Source
from clusters.health_policy import (
    GANTRY,
    Act,
    HealthPolicy,
    NodeView,
    Outcome,
    decide,
    policy_edit_problem,
    policy_from,
    policy_raw,
    signal_checked,
)
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from clusters.selectors import cluster_health_policy
from clusters.services.health_events import act_event, events_write, moment, stamp
from core.log_context import log_context
from core.schema import SchemaError
from core.types import UserLike
from tenants.access import require_platform_admin
from tenants.models import max_length_of
from tenants.services.audit import audit_record

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock(HEALTH_LOCK_KEY, cluster id): one health writer per cluster.
HEALTH_LOCK_KEY = 0x6E6F6465
REASON_MAX_LENGTH = max_length_of(ClusterNode, "health_reason")
# The prefix of every reason Gantry gives the backend (Slurm drain reason, Kubernetes
# taint): a node the backend shows unschedulable with it was fenced by Gantry.
FENCE_REASON_PREFIX = "gantry:"


def _health_lock(cluster: Cluster) -> None:
    """Within a transaction: wait for the cluster's health lock. SQLite serialises writers
    at BEGIN already."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [HEALTH_LOCK_KEY, cluster.pk])


def _views(rows: dict[str, ClusterNode]) -> dict[str, NodeView]:
    return {
        name: NodeView(NodeHealth(row.health), stamp(row.health_since))
        for name, row in rows.items()
    }


def node_signals_record(
    *, cluster: Cluster, signals: Sequence[Signal], now: datetime
) -> list[NodeHealthEvent]:
    """Record a batch of node-health signals and do what the cluster's policy says: the
    events written or added to (a flood of one GPU's signal is one event whose count
    grows), the nodes made suspect or quarantined (within the blast radius).

    Never raises on a bad signal: a class nobody knows is recorded as XID_UNKNOWN, a time
    that is no time or lies ahead of ours is now (docs/node-health.md), and each such
    repair is logged; a signal naming no node is logged and dropped. A signal about a
    node not in the inventory is recorded and changes no node."""
    with log_context(cluster=cluster.name):
        stamp = now.timestamp()
        checked, repaired = [], []
        for signal in signals:
            clean, problem = signal_checked(signal, now=stamp)
            if problem:
                repaired.append((problem, signal))
            if clean is not None:
                checked.append(clean)
        if repaired:  # one line for a flood of bad signals, not one per signal
            problem, first = repaired[0]
            logger.warning(
                "%d node-health signal(s) repaired; the first: %s: %r",
                len(repaired),
                problem,
                first,
            )
        if not checked:
            return []
        return _signals_record(cluster=cluster, signals=checked, now=now)


@transaction.atomic
def _signals_record(
    *, cluster: Cluster, signals: list[Signal], now: datetime
) -> list[NodeHealthEvent]:
    policy = _policy(cluster)
    _health_lock(cluster)
    rows = {
        row.name: row
        for row in ClusterNode.objects.filter(cluster=cluster).only(
            "name", "health", "health_reason", "health_since"
        )
    }
    views = _views(rows)
    decisions = decide(policy, nodes=views, signals=signals)
    events = events_write(
        cluster=cluster, policy=policy, views=views, signals=signals, decisions=decisions, now=now
    )
    for name, decision in decisions.nodes.items():
        row = rows[name]
        reason = decision.reason[:REASON_MAX_LENGTH]
        if decision.health == row.health and reason == row.health_reason:
            continue
        changes: dict[str, object] = {"health": decision.health.value, "health_reason": reason}
        if decision.changed:
            changes["health_since"] = now
        if decision.health == NodeHealth.QUARANTINED:
            changes["fence_error"] = ""  # a new quarantine: the next push tries afresh
        ClusterNode.objects.filter(pk=row.pk).update(**changes)
        logger.warning("node %s %s: %s", name, decision.health.value, reason)
    return events


def _policy(cluster: Cluster) -> HealthPolicy:
    """The cluster's policy as stored now, not as the caller's copy of the cluster had it
    (a sync loop holds its clusters for minutes)."""
    if cluster.pk is not None:
        cluster.refresh_from_db(fields=["health_policy"])
    return cluster_health_policy(cluster=cluster)


def _require_admin(actor: UserLike) -> None:
    """Platform admins act on nodes and policies; so do superusers, whom the Django admin
    (where a cluster's policy can be edited too) lets change anything."""
    if not getattr(actor, "is_superuser", False):
        require_platform_admin(actor)


def _node_locked(*, cluster: Cluster, node: str) -> ClusterNode:
    """The node's row under the cluster's health lock; ClusterNode.DoesNotExist (a 404 at
    the edges) for a node the cluster does not have."""
    _health_lock(cluster)
    return ClusterNode.objects.select_for_update().get(cluster=cluster, name=node)


def _health_of(row: ClusterNode) -> dict[str, object]:
    return {"health": row.health, "reason": row.health_reason}


@transaction.atomic
def node_quarantine(
    *, cluster: Cluster, node: str, actor: UserLike, note: str, now: datetime | None = None
) -> NodeHealthEvent:
    """A platform admin takes a node out of service: no new work from Gantry's placement
    from the next admission cycle, and the next sync drains it on the backend (if the
    policy lets Gantry). Not bound by the blast radius: it is a person's decision. Audited
    as "node.quarantine"; ValidationError if the node is quarantined already."""
    _require_admin(actor)
    now = now or timezone.now()
    row = _node_locked(cluster=cluster, node=node)
    if row.health == NodeHealth.QUARANTINED:
        since = row.health_since
        raise ValidationError(
            f"{node} is quarantined already"
            + (f" (since {since.astimezone(UTC):%Y-%m-%d %H:%M} UTC)" if since else "")
            + f": {row.health_reason}"
        )
    before = _health_of(row)
    note = note.strip()
    who = getattr(actor, "username", "a person")
    reason = f"quarantined by {who}: {note}" if note else f"quarantined by {who}"
    return _person_act(
        cluster=cluster,
        row=row,
        health=NodeHealth.QUARANTINED,
        reason=reason[:REASON_MAX_LENGTH],
        act=Act.QUARANTINE,
        outcome=Outcome.QUARANTINE,
        before=before,
        actor=actor,
        note=note,
        now=now,
    )


@transaction.atomic
def node_release(
    *, cluster: Cluster, node: str, actor: UserLike, note: str, now: datetime | None = None
) -> NodeHealthEvent:
    """A platform admin returns a suspect or quarantined node to service, saying why (a
    note is required); if the policy says so (``release_needs_check``), only after a
    health check passed on it since its quarantine. The next sync undoes Gantry's drain on
    the backend. Audited as "node.release"; ValidationError, nothing changed, otherwise."""
    _require_admin(actor)
    now = now or timezone.now()
    note = note.strip()
    if not note:
        raise ValidationError(
            {"note": ["Say why the node may take work again: a release needs a note."]}
        )
    row = _node_locked(cluster=cluster, node=node)
    if row.health == NodeHealth.HEALTHY:
        raise ValidationError(f"{node} is healthy: there is nothing to release.")
    policy = _policy(cluster)
    if policy.release_needs_check and row.health == NodeHealth.QUARANTINED:
        checked = NodeHealthEvent.objects.filter(
            cluster=cluster, node=node, signal=Act.CHECK_PASSED.value
        )
        if row.health_since is not None:
            checked = checked.filter(observed_at__gte=row.health_since)
        if not checked.exists():
            raise ValidationError(
                f"{node} returns to service only after a health check passes on it since its "
                "quarantine (this cluster's policy: release_needs_check); none has yet."
            )
    return _person_act(
        cluster=cluster,
        row=row,
        health=NodeHealth.HEALTHY,
        reason="",
        act=Act.RELEASE,
        outcome=Outcome.RELEASE,
        before=_health_of(row),
        actor=actor,
        note=note,
        now=now,
    )


def _person_act(
    *,
    cluster: Cluster,
    row: ClusterNode,
    health: NodeHealth,
    reason: str,
    act: Act,
    outcome: Outcome,
    before: dict,
    actor: UserLike,
    note: str,
    now: datetime,
) -> NodeHealthEvent:
    """A person's quarantine or release of ``row``: its new health, the audit row
    ("node.quarantine", "node.release") and the node's history event."""
    row.health = health.value
    row.health_reason = reason
    row.health_since = now
    row.fence_error = ""
    row.save(update_fields=["health", "health_reason", "health_since", "fence_error"])
    audit_record(
        actor=actor,
        action=f"node.{act.value}",
        target=f"{cluster.name}/{row.name}",
        before=before,
        after={**_health_of(row), "note": note},
    )
    return act_event(
        cluster=cluster, node=row.name, act=act, outcome=outcome, actor=actor, note=note, now=now
    )


def node_health_check_record(
    *,
    cluster: Cluster,
    node: str,
    passed: bool,
    at: datetime,
    detail: str = "",
    now: datetime | None = None,
) -> list[NodeHealthEvent]:
    """An active health check's result on a node: a pass is recorded (it lets a person
    return the node to service where the policy asks for one); a failure is a
    HEALTH_CHECK_FAILED signal, acted on as the policy says."""
    if not passed:
        signal = Signal(
            node=node,
            signal=SignalClass.HEALTH_CHECK_FAILED,
            source=Source.HEALTH_CHECK,
            at=at.timestamp(),
            detail=detail or "the health check failed",
        )
        return node_signals_record(cluster=cluster, signals=[signal], now=now or timezone.now())
    return [
        act_event(
            cluster=cluster,
            node=node,
            act=Act.CHECK_PASSED,
            outcome=Outcome.OBSERVE,
            actor=None,
            detail=detail or "the health check passed",
            source=Source.HEALTH_CHECK.value,
            now=at,
        )
    ]


def cluster_health_policy_check(
    *, cluster: Cluster, raw: object, now: datetime | None = None
) -> HealthPolicy:
    """The policy ``raw`` describes, if it may be set on ``cluster`` now; ValidationError on
    ``health_policy`` saying why not: it is no policy (the key and what is wrong), or the
    signals of its window would, under it, quarantine more nodes than its blast radius
    allows (``policy_edit_problem``)."""
    now = now or timezone.now()
    try:
        policy = policy_from(raw)  # type: ignore[arg-type]  # checked: any JSON is told why
    except SchemaError as exc:
        raise ValidationError({"health_policy": [str(exc)]}) from None
    if cluster.pk is None:  # a cluster being created has no nodes yet
        return policy
    rows = {row.name: row for row in ClusterNode.objects.filter(cluster=cluster)}
    recent = (
        NodeHealthEvent.objects.filter(
            cluster=cluster,
            last_observed_at__gte=moment(now.timestamp() - policy.suspect_window_s),
            source__in=[s.value for s in Source],
            signal__in=[c.value for c in SignalClass],
        )
        .values_list("node", "signal")
        .distinct()
    )
    problem = policy_edit_problem(
        policy,
        nodes=_views(rows),
        recent=[(node, SignalClass(signal)) for node, signal in recent],
    )
    if problem is not None:
        raise ValidationError({"health_policy": [problem]})
    return policy


@transaction.atomic
def cluster_health_policy_set(
    *, cluster: Cluster, actor: UserLike, raw: dict, now: datetime | None = None
) -> HealthPolicy:
    """A platform admin sets the cluster's node-health policy (``raw``: what differs from
    the defaults, docs/node-health.md); audited as "cluster.health_policy", stored as its
    overrides only. It acts on signals from now on. Refused as
    ``cluster_health_policy_check`` says (ValidationError, nothing changed)."""
    _require_admin(actor)
    _health_lock(cluster)
    policy = cluster_health_policy_check(cluster=cluster, raw=raw, now=now)
    before = Cluster.objects.select_for_update().get(pk=cluster.pk).health_policy
    stored = policy_raw(policy)
    if stored != before:
        cluster.health_policy = stored
        cluster.save(update_fields=["health_policy"])
        audit_record(
            actor=actor,
            action="cluster.health_policy",
            target=cluster.name,
            before=before,
            after=stored,
        )
    return policy


def node_fences_push(*, cluster: Cluster, now: datetime | None = None) -> int:
    """Push the cluster's quarantines to its backend: drain (Slurm) or cordon and taint
    (Kubernetes) each quarantined node not fenced yet, with Gantry's reason; undo it for
    each node no longer quarantined. Returns the backend calls that took.

    Idempotent: a fenced node is not fenced again, and a crash between a quarantine and
    its push is repaired by the next push (a fence that took but was not recorded is
    undone on release: the backend shows the node unschedulable with Gantry's reason). A
    backend that cannot fence (no ``fence`` yet, or it raises: a permission error) leaves
    ``fence_error`` on the node, which stays quarantined in Gantry's own placement. With
    the policy's ``fence_backend`` off the backend is never called."""
    with log_context(cluster=cluster.name):
        now = now or timezone.now()
        policy = _policy(cluster)
        nodes = ClusterNode.objects.filter(cluster=cluster)
        to_fence = list(nodes.filter(health=NodeHealth.QUARANTINED, fenced_at__isnull=True))
        to_unfence = list(
            nodes.exclude(health=NodeHealth.QUARANTINED).filter(
                Q(fenced_at__isnull=False)
                | Q(schedulable=False, reason__contains=FENCE_REASON_PREFIX)
            )
        )
        if not policy.fence_backend:
            _fenced_left_say(cluster=cluster, rows=to_unfence)
            return 0
        if not to_fence and not to_unfence:
            return 0
        backend = backend_for(cluster)
        done = 0
        for row in to_fence:
            reason = " ".join(f"{FENCE_REASON_PREFIX} {row.health_reason}".split())[:200]
            done += _push(cluster=cluster, row=row, backend=backend, reason=reason, now=now)
        for row in to_unfence:
            done += _push(cluster=cluster, row=row, backend=backend, reason=None, now=now)
        return done


def _fenced_left_say(*, cluster: Cluster, rows: list[ClusterNode]) -> None:
    """fence_backend off: a node Gantry drained before stays drained on the cluster until
    someone undoes it there; say so on the node."""
    for row in rows:
        if row.fenced_at is None:
            continue
        error = (
            "Gantry drained this node before its policy stopped it from changing the "
            "backend (fence_backend off): undo the drain on the cluster"
        )
        if row.fence_error != error:
            ClusterNode.objects.filter(pk=row.pk).update(fence_error=error)


def _push(
    *, cluster: Cluster, row: ClusterNode, backend: object, reason: str | None, now: datetime
) -> int:
    """One fence (with ``reason``) or unfence (``reason`` None); 1 if it took. Its row is
    written only if its health is still what the push found (a person may have acted
    meanwhile: the next push sees it)."""
    fence = reason is not None
    name = "fence" if fence else "unfence"
    call = getattr(backend, name, None)
    error = ""
    try:
        if call is None:
            raise BackendError(
                f"the {cluster.get_backend_display()} backend cannot {name} nodes yet: Gantry "
                "only keeps the node out of its own placement"
            )
        with backend_call(cluster=cluster.name, operation=name):
            if fence:
                call(row.name, reason)
            else:
                call(row.name)
    except BackendError as exc:
        error = str(exc) or type(exc).__name__
    except Exception as exc:  # a backend's bug must not stop the sync of the others
        logger.exception("node %s: %s failed", row.name, name)
        error = f"{type(exc).__name__}: {exc}"
    still = ClusterNode.objects.filter(pk=row.pk)
    still = (
        still.filter(health=NodeHealth.QUARANTINED, fenced_at__isnull=True)
        if fence
        else still.exclude(health=NodeHealth.QUARANTINED)
    )
    act = Act.FENCE if fence else Act.UNFENCE
    if error:
        error = error[:2000]
        if still.exclude(fence_error=error).update(fence_error=error):
            logger.warning("node %s: %s failed: %s", row.name, name, error)
            failed = Outcome.FENCE_FAILED if fence else Outcome.UNFENCE_FAILED
            act_event(
                cluster=cluster,
                node=row.name,
                act=act,
                outcome=failed,
                actor=None,
                detail=error,
                source=GANTRY,
                now=now,
            )
        return 0
    if still.update(fenced_at=now if fence else None, fence_error=""):
        took = Outcome.FENCED if fence else Outcome.UNFENCED
        act_event(
            cluster=cluster,
            node=row.name,
            act=act,
            outcome=took,
            actor=None,
            detail=reason or "",
            source=GANTRY,
            now=now,
        )
    return 1


__all__ = [
    "FENCE_REASON_PREFIX",
    "cluster_health_policy_check",
    "cluster_health_policy_set",
    "node_fences_push",
    "node_health_check_record",
    "node_quarantine",
    "node_release",
    "node_signals_record",
]
