"""Reads of the node-health pages (platform admins): every node's state, faults, MTBF and
GPU-hours lost over a window, the worst offenders, and one node's history with the attempts
its faults ended. A fixed number of queries whatever the number of nodes and events: the
events of the window are read once and grouped here.

"Lost there" counts the attempts whose cause evidence (``Attempt.cause_evidence["node"]``,
jobs.attribution) names the node and whose cause class is hardware or platform. Platform-wide:
the caller checks access."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Max, Q, Sum

from clusters.health import NodeHealth
from clusters.models import ClusterNode, NodeHealthEvent
from jobs.durations import duration_text
from jobs.models import Attempt
from telemetry.kpis import metrics, reliability
from telemetry.kpis.metrics import Distribution
from telemetry.kpis.reliability import EventKind, Mtbf, NodeEvent
from telemetry.kpis.reliability_reads import HARDWARE_OR_PLATFORM
from telemetry.models import CREDITED_CAUSES, AttemptAccounting, StragglerFlag
from telemetry.selectors.gpu_seconds import SECONDS_PER_HOUR
from telemetry.selectors.stragglers import COUNTING_CAUSES

NODE_WINDOW_DAYS = 30
WORST_SHOWN = 5
EVENTS_SHOWN = 200
ATTEMPTS_SHOWN = 50


@dataclass(frozen=True, slots=True)
class LastSignal:
    signal: str
    code: str
    gpu: str
    detail: str
    observed_at: datetime


@dataclass(frozen=True, slots=True)
class SlowRanks:
    """A node's straggler flags over the window: the runs with a rank flagged there, those
    whose cause counts for the slow-ranks signal (a slow GPU or no cause found), and the
    latest time one was seen slow."""

    runs: int
    counted: int
    last_at: datetime


@dataclass(slots=True)
class NodeRow:
    cluster: str
    name: str
    flavor: str
    gpus: int
    health: str
    health_reason: str
    health_since: datetime | None
    fenced_at: datetime | None
    fence_error: str
    schedulable: bool
    reason: str
    last_signal: LastSignal | None = None
    mtbf: Mtbf = field(default_factory=Mtbf)
    latencies: tuple[float, ...] = ()
    lost_gpu_s: int = 0
    lost_attempts: int = 0
    slow: SlowRanks | None = None  # its straggler flags over the window, if any

    @property
    def faults(self) -> int:
        return self.mtbf.faults

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_gpu_s / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class NodeOverview:
    since: datetime
    until: datetime
    nodes: list[NodeRow]
    by_health: dict[str, int]
    worst_by_faults: list[NodeRow]
    worst_by_lost: list[NodeRow]
    mtbf: Mtbf  # all nodes together
    latency: Distribution  # seconds from a fault to the quarantine

    @property
    def latency_p50_text(self) -> str:
        return "—" if self.latency.p50 is None else duration_text(self.latency.p50)

    @property
    def latency_p95_text(self) -> str:
        return "—" if self.latency.p95 is None else duration_text(self.latency.p95)


def _event(source: str, signal: str, action: str, observed: datetime, recorded: datetime):
    return NodeEvent(
        observed_at=observed.timestamp(),
        recorded_at=recorded.timestamp(),
        kind=reliability.event_kind(source=source, signal=signal, action=action),
        fault=reliability.is_fault(source=source, signal=signal),
    )


def quarantined_at_start(events: list[NodeEvent], *, quarantined_now: bool) -> bool:
    """Whether the node was quarantined when the window began, from its state now and the
    acts inside the window: the first act there undoes what held before it."""
    acts = sorted(
        (e for e in events if e.kind in (EventKind.QUARANTINE, EventKind.RELEASE)),
        key=lambda e: e.recorded_at,
    )
    if not acts:
        return quarantined_now
    return acts[0].kind == EventKind.RELEASE


def _window_events(since: datetime, **filters) -> dict[tuple[int, str], list[tuple]]:
    """The window's events per (cluster id, node), newest first: one query."""
    rows = (
        NodeHealthEvent.objects.filter(Q(observed_at__gte=since) | Q(recorded_at__gte=since))
        .filter(**filters)
        .values_list(
            "cluster_id",
            "node",
            "source",
            "signal",
            "action",
            "code",
            "gpu",
            "detail",
            "observed_at",
            "recorded_at",
        )
        .order_by("-observed_at", "-id")
    )
    found: dict[tuple[int, str], list[tuple]] = defaultdict(list)
    for cluster_id, node, *rest in rows:
        found[cluster_id, node].append(tuple(rest))
    return found


def _lost_by_node(since: datetime, until: datetime) -> dict[tuple[int, str], tuple[int, int]]:
    rows = (
        AttemptAccounting.objects.filter(
            attempt__finished_at__gte=since, attempt__finished_at__lt=until
        )
        .filter(Q(attempt__cause_class__in=sorted(CREDITED_CAUSES)))
        .values_list("attempt__cluster_id", "attempt__cause_evidence__node")
        .annotate(lost=Sum("lost_gpu_s"), attempts=Count("pk"))
        .order_by()
    )
    return {
        (cluster_id, node): (lost or 0, attempts)
        for cluster_id, node, lost, attempts in rows
        if isinstance(node, str)
    }


def _slow_by_node(since: datetime) -> dict[tuple[int, str], SlowRanks]:
    """Straggler flags seen since ``since``, per (cluster id, node): one query, grouped in
    SQL."""
    counting = Q(cause__in=[cause.value for cause in COUNTING_CAUSES])
    rows = (
        StragglerFlag.objects.filter(updated_at__gte=since)
        .values("cluster_id", "node")
        .annotate(
            runs=Count("run_id", distinct=True),
            counted=Count("run_id", distinct=True, filter=counting),
            last=Max("updated_at"),
        )
        .order_by()
    )
    return {
        (row["cluster_id"], row["node"]): SlowRanks(row["runs"], row["counted"], row["last"])
        for row in rows
    }


def _fill(row: NodeRow, events: list[tuple], *, since: datetime, until: datetime) -> None:
    """The node's last signal, MTBF and latencies from its window's events (newest first)."""
    reduced = [_event(s, sig, act, obs, rec) for s, sig, act, _, _, _, obs, rec in events]
    for source, signal, _, code, gpu, detail, observed, _ in events:
        if not reliability.is_act(source=source, signal=signal):
            row.last_signal = LastSignal(signal, code, gpu, detail, observed)
            break
    history = reliability.node_history(
        reduced,
        since=since.timestamp(),
        until=until.timestamp(),
        quarantined_before=quarantined_at_start(
            reduced, quarantined_now=row.health == NodeHealth.QUARANTINED
        ),
    )
    row.mtbf = reliability.node_mtbf(
        history, gpus=row.gpus, window_s=(until - since).total_seconds()
    )
    row.latencies = history.latencies


def node_overview(*, now: datetime, days: int = NODE_WINDOW_DAYS) -> NodeOverview:
    """Every node of every cluster over the last ``days`` days up to ``now``: four queries."""
    since = now - timedelta(days=days)
    nodes = ClusterNode.objects.values_list(
        "cluster_id",
        "cluster__name",
        "name",
        "flavor__slug",
        "gpus",
        "health",
        "health_reason",
        "health_since",
        "fenced_at",
        "fence_error",
        "schedulable",
        "reason",
    ).order_by("cluster__name", "name")
    events = _window_events(since)
    lost = _lost_by_node(since, now)
    slow = _slow_by_node(since)
    rows = []
    for (
        cluster_id,
        cluster,
        name,
        flavor,
        gpus,
        health,
        reason_health,
        since_health,
        fenced_at,
        fence_error,
        schedulable,
        reason,
    ) in nodes:
        row = NodeRow(
            cluster,
            name,
            flavor,
            gpus,
            health,
            reason_health,
            since_health,
            fenced_at,
            fence_error,
            schedulable,
            reason,
        )
        _fill(row, events.get((cluster_id, name), []), since=since, until=now)
        row.lost_gpu_s, row.lost_attempts = lost.get((cluster_id, name), (0, 0))
        row.slow = slow.get((cluster_id, name))
        rows.append(row)
    by_health = {health.value: 0 for health in NodeHealth}
    for row in rows:
        by_health[row.health] = by_health.get(row.health, 0) + 1
    return NodeOverview(
        since=since,
        until=now,
        nodes=rows,
        by_health=by_health,
        worst_by_faults=sorted(
            (row for row in rows if row.faults), key=lambda r: (-r.faults, r.cluster, r.name)
        )[:WORST_SHOWN],
        worst_by_lost=sorted(
            (row for row in rows if row.lost_gpu_s),
            key=lambda r: (-r.lost_gpu_s, r.cluster, r.name),
        )[:WORST_SHOWN],
        mtbf=sum((row.mtbf for row in rows), Mtbf()),
        latency=metrics.distribution(latency for row in rows for latency in row.latencies),
    )


@dataclass(frozen=True, slots=True)
class NodeDetail:
    node: ClusterNode
    row: NodeRow
    events: list[NodeHealthEvent]
    attempts: list[Attempt]


def node_detail(
    *, cluster: str, node: str, now: datetime, days: int = NODE_WINDOW_DAYS
) -> NodeDetail:
    """One node: its state, figures over the window, its latest events (with who acted)
    and the hardware- or platform-caused attempts that name it. Raises
    ClusterNode.DoesNotExist for a node no inventory reported."""
    found = ClusterNode.objects.select_related("cluster", "flavor").get(
        cluster__name=cluster, name=node
    )
    since = now - timedelta(days=days)
    events = list(
        NodeHealthEvent.objects.filter(cluster_id=found.cluster_id, node=node)
        .select_related("actor")
        .order_by("-observed_at", "-id")[:EVENTS_SHOWN]
    )
    row = NodeRow(
        found.cluster.name,
        found.name,
        found.flavor.slug,
        found.gpus,
        found.health,
        found.health_reason,
        found.health_since,
        found.fenced_at,
        found.fence_error,
        found.schedulable,
        found.reason,
    )
    in_window = [
        (e.source, e.signal, e.action, e.code, e.gpu, e.detail, e.observed_at, e.recorded_at)
        for e in events
        if e.observed_at >= since or e.recorded_at >= since
    ]
    _fill(row, in_window, since=since, until=now)
    on_node = Q(cause_evidence__node=node)
    if connection.features.supports_json_field_contains:
        on_node |= Q(node_list__contains=[node])
    attempts = list(
        Attempt.objects.filter(HARDWARE_OR_PLATFORM, on_node, cluster_id=found.cluster_id)
        .select_related("run__tenant", "accounting")
        .order_by("-finished_at", "-id")[:ATTEMPTS_SHOWN]
    )
    for attempt in attempts:
        accounting = getattr(attempt, "accounting", None)
        if (
            accounting is not None
            and attempt.finished_at is not None
            and attempt.finished_at >= since
            and attempt.cause_evidence.get("node") == node
        ):
            row.lost_gpu_s += accounting.lost_gpu_s
            row.lost_attempts += 1
    return NodeDetail(node=found, row=row, events=events, attempts=attempts)
