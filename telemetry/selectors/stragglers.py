"""What the straggler detector (``telemetry.stragglers.detect``) takes about one attempt, read
from what is stored: its recent rank windows, the GPUs it holds, the DCGM evidence of its
GPUs over its span and its placement. Five queries (six on the simulator) whatever the
number of ranks (docs/stragglers.md, "Flags").

The look-back: the windows that ended in the last ``LOOKBACK_WINDOWS`` window lengths
before the attempt's latest window, a window length being the latest window's (at least
``MIN_WINDOW_S``, the SDK's default window: a short last window, flushed at exit, does
not shrink it). The detector needs ``CONSECUTIVE`` windows in a row; 20 leave room for a
run of them with gaps and skewed clocks around it, and bound what one scan reads to about
20 rows per rank however long the attempt has run."""

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from clusters.health import SignalClass, Source, xid_class
from clusters.models import ClusterNode, NodeHealthEvent
from jobs.models import Attempt
from telemetry.models import RankStepWindow
from telemetry.rank_windows import short_host
from telemetry.selectors.evidence import attempt_clock_evidence
from telemetry.selectors.rank_windows import attempt_held_gpus, attempt_rank_windows
from telemetry.stragglers import Cause, GpuEvidence, Placement, RankWindow

LOOKBACK_WINDOWS = 20
MIN_WINDOW_S = 30.0
# The node-health classes that say a GPU runs slow, as the detector's evidence takes them.
THROTTLE_CLASSES = frozenset({SignalClass.THERMAL_THROTTLE, SignalClass.POWER_THROTTLE})

# The causes that count against the node for the slow-ranks signal: a slow GPU (its DCGM
# evidence shows throttling, PCIe replays, an XID or a low clock), and no cause found (the
# node is where the rank was slow, and nothing else explains it). Not slow input: the data
# path (storage, the job's own loader and preprocessing) is slow for that rank, not the
# node's GPU; not network: the placement put the node apart from the gang, which is the
# placement's doing, not the node's.
COUNTING_CAUSES = frozenset({Cause.SLOW_GPU, Cause.UNKNOWN})

GpuKey = tuple[str, str]  # (short host, GPU as DCGM names it: its index)
Clock = tuple[float | None, float | None]  # mean SM clock, its maximum (MHz)


@dataclass(frozen=True, slots=True)
class StragglerInputs:
    """``detect``'s arguments for one attempt, and the latest window end they cover."""

    windows: list[RankWindow]
    attempt_gpus: frozenset[tuple[str, str]] | None
    evidence: tuple[GpuEvidence, ...]
    placement: Placement | None
    latest_end: datetime | None  # None: the attempt has no rank windows
    nodes: dict[str, str] = field(default_factory=dict)  # short host -> the node's name


def attempt_span(attempt: Attempt, *, now: datetime) -> tuple[datetime, datetime]:
    """From its start (its creation if it never started) to its end, or now."""
    return attempt.started_at or attempt.created_at, attempt.finished_at or now


def latest_window(*, attempt_id: int) -> tuple[datetime, datetime] | None:
    """(start, end) of the attempt's window that ended last, or None: one query, on the
    index (attempt, end)."""
    return (
        RankStepWindow.objects.filter(attempt_id=attempt_id)
        .order_by("-end")
        .values_list("start", "end")
        .first()
    )


def lookback_since(start: datetime, end: datetime) -> datetime:
    """Where the look-back begins, given the latest window."""
    length = max((end - start).total_seconds(), MIN_WINDOW_S)
    return end - timedelta(seconds=LOOKBACK_WINDOWS * length)


def _events(
    *, attempt: Attempt, hosts: Iterable[str], start: datetime, end: datetime
) -> list[tuple[str, str, str, str, str, int, datetime]]:
    """The node-health events of the attempt's nodes that overlap its span: one query."""
    nodes = list(hosts)
    if not nodes:
        return []
    return list(
        NodeHealthEvent.objects.filter(
            cluster_id=attempt.cluster_id,
            node__in=nodes,
            observed_at__lte=end,
            last_observed_at__gte=start,
        )
        .filter(
            Q(signal__in=[c.value for c in THROTTLE_CLASSES])
            | Q(signal=SignalClass.PCIE_REPLAY.value)
            | Q(source=Source.DCGM.value, code__regex=r"^[0-9]+$")
        )
        .values_list("node", "gpu", "source", "signal", "code", "count", "observed_at")
        .order_by("observed_at", "id")
    )


@dataclass(slots=True)
class _Signs:
    throttle: set[str] = field(default_factory=set)
    pcie_replays: int = 0
    xid: int | None = None


def gpu_clocks(*, attempt: Attempt, start: datetime, end: datetime) -> dict[GpuKey, Clock]:
    """Each GPU's mean SM clock and its maximum (MHz) over the span, by (short host, GPU),
    for the GPUs DCGM reported a clock of (``DCGM_FI_DEV_SM_CLOCK``,
    ``DCGM_FI_DEV_MAX_SM_CLOCK``): a GPU named here gets an evidence row even without a
    node-health event. One query."""
    return {
        (short_host(clock.host), clock.gpu): (clock.sm_clock_mhz, clock.max_sm_clock_mhz)
        for clock in attempt_clock_evidence(attempt_id=attempt.pk, since=start, until=end)
        if clock.minutes
    }


def gpu_evidence(
    events: Iterable[tuple[str, str, str, str, str, int, datetime]],
    clocks: Mapping[GpuKey, Clock] | None = None,
) -> tuple[GpuEvidence, ...]:
    """One ``GpuEvidence`` per GPU that has a sign or a clock, by (short host, GPU index):
    thermal and power throttling from their classes, PCIe replays (each event counts the
    growths it merged: at least one replay each), the latest XID that implicates the
    hardware (an application XID is the program's, NVIDIA's catalog says: not a sign)."""
    signs: dict[GpuKey, _Signs] = defaultdict(_Signs)
    for node, gpu, source, signal, code, count, _ in events:
        if not gpu:
            continue  # a node-level event names no GPU to slow
        key = (short_host(node), gpu)
        if signal in THROTTLE_CLASSES:
            signs[key].throttle.add(signal)
        elif signal == SignalClass.PCIE_REPLAY:
            signs[key].pcie_replays += count
        elif (
            source == Source.DCGM
            and code.isdigit()
            and xid_class(int(code)) != SignalClass.XID_APPLICATION
        ):
            signs[key].xid = int(code)  # in time order: the latest stays
    clocks = clocks or {}
    rows = []
    for host, gpu in sorted(set(signs) | set(clocks)):
        found = signs.get((host, gpu), _Signs())
        sm_clock, max_sm_clock = clocks.get((host, gpu), (None, None))
        rows.append(
            GpuEvidence(
                host=host,
                gpu=gpu,
                sm_clock_mhz=sm_clock,
                max_sm_clock_mhz=max_sm_clock,
                throttle_reasons=frozenset(found.throttle),
                pcie_replays=found.pcie_replays,
                xid=found.xid,
            )
        )
    return tuple(rows)


def _placement(*, attempt: Attempt, nodes: list[str]) -> Placement | None:
    """The attempt's nodes with their topology paths, hosts by short name: one query. None
    when the inventory knows none of them."""
    if not nodes:
        return None
    paths = {
        short_host(name): tuple(str(level) for level in path or ())
        for name, path in ClusterNode.objects.filter(
            cluster_id=attempt.cluster_id, name__in=nodes
        ).values_list("name", "path")
    }
    return Placement(paths=paths) if paths else None


def attempt_straggler_inputs(*, attempt: Attempt, now: datetime | None = None) -> StragglerInputs:
    """``detect``'s inputs for ``attempt`` (loaded with its run): its windows of the look-back
    (hosts by short name), the (host, GPU) pairs it holds when known (plus the UUIDs its
    ranks named that its runtime report listed), its GPUs' evidence over its span, its
    placement."""
    now = now or timezone.now()
    latest = latest_window(attempt_id=attempt.pk)
    if latest is None:
        return StragglerInputs([], None, (), None, None)
    held = attempt_held_gpus(attempt=attempt)
    rows = attempt_rank_windows(attempt_id=attempt.pk, since=lookback_since(*latest))
    windows = [RankWindow(**{**row, "host": short_host(row["host"])}) for row in rows]
    attempt_gpus = None
    if held.pairs is not None:
        named_by_uuid = {(w.host, w.gpu) for w in windows if w.gpu in held.uuids}
        attempt_gpus = frozenset(held.pairs | named_by_uuid)
    nodes = attempt.nodes
    start, end = attempt_span(attempt, now=now)
    events = _events(attempt=attempt, hosts=nodes, start=start, end=end)
    clocks = gpu_clocks(attempt=attempt, start=start, end=end)
    return StragglerInputs(
        windows=windows,
        attempt_gpus=attempt_gpus,
        evidence=gpu_evidence(events, clocks),
        placement=_placement(attempt=attempt, nodes=nodes),
        latest_end=latest[1],
        nodes={short_host(name): name for name in nodes},
    )
