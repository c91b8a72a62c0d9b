"""A window of the platform's past, read for a what-if replay (``jobs.replay``).

``replay_history(start=, end=)`` reads, in a fixed number of queries (ten, whatever the
window holds): the runs that were alive in the window or shortly before it (for fair share
and the month's budget use at its start), their events, attempts and checkpoints; the nodes
of the enabled clusters; the tenants, flavors and clusters with their queueing policies;
the quotas as they are and their changes from the audit log, undone back to the window's
start. ``jobs.replay_record`` makes each run's timeline into what a replay reads.
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Q

from clusters.models import Cluster
from jobs import admission_types
from jobs.calendar import month_start
from jobs.models import Attempt, Checkpoint, Run, RunEvent, TopologyMode
from jobs.replay_record import (
    EventRow,
    Hold,
    RunRow,
    decayed_usage,
    holding,
    submission,
    timeline,
    used_since,
)
from jobs.replay_types import History, Holding, Key, QuotaChange, Submission
from jobs.selectors.queue import cluster_nodes, quota_of, quotas_now
from tenants.models import AuditEvent, GpuFlavor, Tenant

# Fair share at the window's start is rebuilt from the holds of this many half-lives before
# it (what is older weighs less than 1/32).
FAIR_SHARE_LOOKBACK_HALF_LIVES = 5


def _quotas(
    start: datetime, end: datetime
) -> tuple[dict[Key, admission_types.Quota], tuple[QuotaChange, ...]]:
    """The quotas in force at ``start`` (today's, each changed since put back as the audit
    log's first change after ``start`` found it) and the changes made in the window."""
    quotas = quotas_now()
    undone: set[Key] = set()
    changes = []
    for target, before, after, at in (
        AuditEvent.objects.filter(action="quota.update", at__gte=start)
        .order_by("at", "id")
        .values_list("target", "before", "after", "at")
    ):
        tenant, _, flavor = target.partition(":")
        key = (tenant, flavor)
        if key not in undone:
            undone.add(key)
            if before is None:
                quotas.pop(key, None)
            else:
                quotas[key] = quota_of(before)
        if at < end:
            changes.append(
                QuotaChange(
                    at.timestamp(), tenant, flavor, None if after is None else quota_of(after)
                )
            )
    return quotas, tuple(changes)


def _alive(*, end: datetime, since: datetime, prefix: str = "") -> Q:
    """Runs submitted before ``end`` that had not ended by ``since``."""
    return Q(**{f"{prefix}submitted_at__lt": end}) & (
        Q(**{f"{prefix}finished_at__isnull": True}) | Q(**{f"{prefix}finished_at__gte": since})
    )


@dataclass
class _Recorded:
    runs: list[RunRow]
    events: dict[int, list[EventRow]]
    attempts: dict[int, dict[int, tuple[str, tuple[str, ...]]]]  # run -> number -> where
    checkpoints: dict[int, list[float]]


def _recorded(*, end: datetime, since: datetime) -> _Recorded:
    """Runs submitted before ``end`` that had not ended by ``since``, with their events,
    attempts and checkpoints: four queries."""
    rows = Run.objects.filter(_alive(end=end, since=since)).values_list(
        "id", "tenant__slug", "flavor__slug", "experiment__nodes", "experiment__gpus_per_node",
        "priority", "submitted_at", "experiment__max_runtime_minutes",
        "workspace__extended_minutes", "experiment__topology_level",
        "experiment__topology_mode", "state", "borrowed",
    )  # fmt: skip
    runs = [
        RunRow(
            id=r[0], tenant=r[1], flavor=r[2], nodes=r[3], gpus_per_node=r[4], priority=r[5],
            submitted=r[6].timestamp(), max_runtime_s=(r[7] + (r[8] or 0)) * 60.0,
            topology_level=r[9], topology_required=r[10] == TopologyMode.REQUIRED, state=r[11],
            borrowed=r[12],
        )
        for r in rows
    ]  # fmt: skip
    of_runs = _alive(end=end, since=since, prefix="run__")
    events: dict[int, list[EventRow]] = defaultdict(list)
    for run_id, at, from_state, to_state, reason, actor in (
        RunEvent.objects.filter(of_runs)
        .order_by("run_id", "at", "id")
        .values_list("run_id", "at", "from_state", "to_state", "reason", "actor__username")
    ):
        events[run_id].append(EventRow(at.timestamp(), from_state, to_state, reason, actor or ""))
    attempts: dict[int, dict[int, tuple[str, tuple[str, ...]]]] = defaultdict(dict)
    for run_id, number, cluster, node_list, placement in Attempt.objects.filter(
        of_runs
    ).values_list("run_id", "number", "cluster__name", "node_list", "placement"):
        attempts[run_id][number] = (cluster, tuple(node_list or placement or ()))
    checkpoints: dict[int, list[float]] = defaultdict(list)
    for run_id, saved_at in Checkpoint.objects.filter(of_runs).values_list("run_id", "saved_at"):
        checkpoints[run_id].append(saved_at.timestamp())
    return _Recorded(runs, events, attempts, checkpoints)


@dataclass
class _Window:
    submissions: list[Submission] = field(default_factory=list)
    holding: list[Holding] = field(default_factory=list)
    holds_before: list[tuple[Key, int, float, float | None]] = field(default_factory=list)
    requeued_holders: int = 0  # held at the start, back in the queue later in the window


def _window(recorded: _Recorded, *, start: float, end: float) -> _Window:
    """Each run as the window has it: held at its start, or submitted (or queued) in it;
    and the holds before it."""
    window = _Window()
    for run in recorded.runs:
        line = timeline(run, recorded.events[run.id])
        checkpoints = recorded.checkpoints[run.id]
        for number, hold in enumerate(line.holds, start=1):
            if hold.since < start:
                key = (run.tenant, run.flavor)
                window.holds_before.append((key, run.gpus, hold.since, hold.until))
            if hold.since < start and (hold.until is None or hold.until > start):
                cluster, on_nodes = recorded.attempts[run.id].get(number, ("", ()))
                spanning = Hold(hold.since, hold.until, hold.ended_by, cluster, on_nodes)
                window.holding.append(
                    holding(run, line, spanning, checkpoints, start=start, end=end)
                )
                window.requeued_holders += any(h.since >= start for h in line.holds)
                break
        else:
            waiting_at_start = any(
                since < start and (until is None or until > start) for since, until in line.waits
            )
            if run.submitted >= start or waiting_at_start:
                window.submissions.append(submission(run, line, checkpoints, start=start, end=end))
    return window


def replay_history(*, start: datetime, end: datetime) -> History:
    """The window [start, end) as recorded. Raises ValueError for an empty window."""
    if end <= start:
        raise ValueError("The window must end after it starts.")
    t0, t1 = start.timestamp(), end.timestamp()
    half_life_s = settings.GANTRY_FAIR_SHARE_HALF_LIFE_H * 3600.0
    lookback = min(
        t0 - FAIR_SHARE_LOOKBACK_HALF_LIVES * half_life_s, month_start(start).timestamp()
    )
    window = _window(
        _recorded(end=end, since=datetime.fromtimestamp(lookback, UTC)), start=t0, end=t1
    )
    clusters = list(
        Cluster.objects.filter(enabled=True).values_list("name", "queueing", "topology_levels")
    )
    tenants = list(Tenant.objects.filter(active=True).values_list("slug", "queueing"))
    quotas, changes = _quotas(start, end)
    nodes = tuple(cluster_nodes(now=start))
    notes = [
        f"Nodes: the {len(nodes)} nodes of the enabled clusters as they are now; the "
        "inventory keeps no history, so nodes added, removed or drained during the window "
        "are taken as they are now."
    ]
    if changes:
        notes.append(
            f"Quotas: as the audit log has them at the window's start; its {len(changes)} "
            "changes during the window are replayed when they were made."
        )
    if window.requeued_holders:
        notes.append(
            f"{window.requeued_holders} runs that held GPUs at the window's start went back to the "
            "queue later in it; the replay counts only the attempt they held then."
        )
    return History(
        start=t0,
        end=t1,
        submissions=tuple(window.submissions),
        holding=tuple(window.holding),
        nodes=nodes,
        quotas=quotas,
        tenants=tuple(slug for slug, _ in tenants),
        flavors=tuple(GpuFlavor.objects.order_by("slug").values_list("slug", flat=True)),
        quota_changes=changes,
        queueing={name: admission_types.Queueing(policy) for name, policy, _ in clusters},
        tenant_queueing={
            slug: admission_types.Queueing(policy) for slug, policy in tenants if policy
        },
        levels={name: tuple(levels) for name, _, levels in clusters},
        starvation_after_s=float(settings.GANTRY_STARVATION_AFTER_S),
        fair_share_half_life_s=half_life_s,
        decayed_usage=decayed_usage(window.holds_before, at=t0, half_life_s=half_life_s),
        budget_used=used_since(window.holds_before, since=month_start(start).timestamp(), until=t0),
        notes=tuple(notes),
    )
