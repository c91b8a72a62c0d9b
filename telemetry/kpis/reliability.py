"""The reliability figures of issue 34 (design §10): ETTR, MTBF and fault-to-quarantine
latency. (The GPU-seconds credited for a failure are finance's, stored on
``AttemptAccounting.credited_gpu_s``.) Pure: plain numbers in, plain numbers out (times
are Unix seconds), so every figure is tested without a database; the selectors in
``telemetry.kpis.reliability_reads`` feed it.

ETTR, the *effective training time ratio* (Kokolis et al., "Revisiting Reliability in
Large-Scale ML Research Clusters", HPCA 2025, arXiv 2410.21680): productive training time ÷
wall time. Gantry's precise reading, from what it records:

- productive time of a run = Σ effective GPU-seconds of its accounted attempts ÷ the run's
  GPUs (``AttemptAccounting.effective_gpu_s``: design §7's ``effective``, the GPU-time left
  after lost work, startup, checkpointing, idle, input and communication wait);
- wall time = from its first admission (the creation of its attempt 1, which admission
  does in the same transaction) to its end, or to now while it goes on.

A run still going counts only its ended attempts' productive time (an attempt's accounting
is final only once it ends), so its ETTR is a lower bound until then. For a tenant or the
platform the runs are weighted by their GPUs: Σ effective GPU-seconds ÷ Σ (GPUs × wall
seconds), so a 512-GPU run counts 512 times a 1-GPU one.

Goodput (design §7) is effective ÷ *allocated* GPU-seconds: it only sees the time a run
held GPUs. ETTR's wall time also holds the time between attempts (waiting to be placed
again after a failure, the requeue), so a failure costs ETTR its lost work *and* the time
to recover, while goodput sees only the lost work.

MTBF of a node = hours in service ÷ hardware faults (signals of ``HARDWARE_CLASSES``; a
flood of one signal is one fault); in service = the window less the time quarantined. Per
1,000 GPU-days: faults × 1,000 ÷ (GPUs × days in service).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from clusters.health import HARDWARE_CLASSES
from clusters.health_policy import GANTRY, PERSON, Act, Outcome
from telemetry.kpis.metrics import Ratio

SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
GPU_DAYS_PER_RATE = 1000  # "failures per 1,000 GPU-days"
# NodeHealthEvent rows that record an act, not a signal (clusters.health_policy): a
# person's quarantine or release, Gantry's push to the backend, a passing health check.
ACT_SOURCES = frozenset({PERSON, GANTRY})
ACT_SIGNALS = frozenset(act.value for act in Act)


def ettr(*, effective_gpu_s: float, gpus: int, wall_s: float) -> Ratio:
    """A run's ETTR: productive seconds (effective GPU-seconds ÷ GPUs) of its wall seconds.
    As GPU-seconds on both sides, so runs add up weighted by their GPUs."""
    if gpus < 1:
        raise ValueError(f"a run has at least one GPU, not {gpus}")
    if wall_s < 0 or effective_gpu_s < 0:
        raise ValueError("wall time and effective GPU-seconds are never negative")
    return Ratio(part=effective_gpu_s, whole=gpus * wall_s)


def wall_seconds(*, first_admission: float, end: float | None, now: float) -> float:
    """From the first admission to the end (to ``now`` while it goes on); 0 if the clock
    says the end came first (skewed clocks never make a negative time)."""
    return max(0.0, (now if end is None else end) - first_admission)


class EventKind(StrEnum):
    FAULT = "fault"  # a hardware signal
    QUARANTINE = "quarantine"  # the node was quarantined (by the policy or a person)
    RELEASE = "release"  # a person returned it to service
    OTHER = "other"  # anything else: observed, warned about, not hardware


def event_kind(*, source: str, signal: str, action: str) -> EventKind:
    """What a NodeHealthEvent row (as ``clusters.services.health`` writes it) means for
    these figures: its ``action`` says what was done (``Outcome``): a quarantine (the
    policy's, on the signal's own row, or a person's ``Act.QUARANTINE``) or a person's
    release. A row may be both a hardware signal and the quarantine it caused: it is the
    QUARANTINE then, and ``is_fault`` says it is a fault too. Gantry's push to the backend
    (``fenced``, ``fence_failed``, …) and a passing check are OTHER."""
    if action == Outcome.QUARANTINE:
        return EventKind.QUARANTINE
    if action == Outcome.RELEASE:
        return EventKind.RELEASE
    if is_fault(source=source, signal=signal):
        return EventKind.FAULT
    return EventKind.OTHER


def is_act(*, source: str, signal: str) -> bool:
    """A row that records an act on the node rather than a signal about it."""
    return source in ACT_SOURCES or signal in ACT_SIGNALS


def is_fault(*, source: str, signal: str) -> bool:
    """A hardware signal from a source (never an act: a person or Gantry sends none)."""
    return not is_act(source=source, signal=signal) and signal in HARDWARE_CLASSES


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One NodeHealthEvent row, reduced: when it was seen, when Gantry recorded it, what it
    means."""

    observed_at: float
    recorded_at: float
    kind: EventKind
    fault: bool  # a hardware signal (also true of a QUARANTINE the signal caused)


def _moment(event: NodeEvent) -> float:
    """When the event happened for the node's history: a signal when it was observed, a
    quarantine or release when it was recorded (a person's act, or Gantry's decision)."""
    if event.kind in (EventKind.QUARANTINE, EventKind.RELEASE):
        return event.recorded_at
    return event.observed_at


@dataclass(frozen=True, slots=True)
class NodeHistory:
    faults: int  # hardware faults in the window
    quarantined_s: float  # time quarantined inside the window
    latencies: tuple[float, ...]  # seconds from first fault to quarantine, per quarantine


def node_history(
    events: Iterable[NodeEvent], *, since: float, until: float, quarantined_before: bool = False
) -> NodeHistory:
    """Faults, time quarantined and fault-to-quarantine latencies of one node over
    [since, until), from its events in any order (those before ``since`` only set its state:
    ``quarantined_before`` says whether it was quarantined when the window began).

    Latency: from the first hardware fault since the node was last in service (its
    ``observed_at``) to the quarantine's ``recorded_at``; a quarantine with no fault before
    it (a person's, on a suspicion) has none. While quarantined, further quarantines and
    faults start nothing new, but faults still count."""
    if until < since:
        raise ValueError("the window ends before it begins")
    ordered = sorted(events, key=lambda event: (_moment(event), event.kind != EventKind.FAULT))
    quarantined_from: float | None = since if quarantined_before else None
    first_fault: float | None = None
    faults = 0
    quarantined_s = 0.0
    latencies: list[float] = []
    for event in ordered:
        at = _moment(event)
        if not since <= at < until:
            continue
        if event.fault:
            faults += 1
            if quarantined_from is None and first_fault is None:
                first_fault = event.observed_at
        if event.kind == EventKind.QUARANTINE and quarantined_from is None:
            quarantined_from = at
            if first_fault is not None:
                latencies.append(max(0.0, event.recorded_at - first_fault))
            first_fault = None
        elif event.kind == EventKind.RELEASE and quarantined_from is not None:
            quarantined_s += at - quarantined_from
            quarantined_from = None
    if quarantined_from is not None:
        quarantined_s += until - quarantined_from
    return NodeHistory(faults=faults, quarantined_s=quarantined_s, latencies=tuple(latencies))


@dataclass(frozen=True, slots=True)
class Mtbf:
    """Hardware faults over time in service, of one node or summed over nodes."""

    faults: int = 0
    in_service_s: float = 0.0
    gpu_s: float = 0.0  # GPUs * seconds in service

    @property
    def hours(self) -> float | None:
        """Mean hours in service between faults; None without a fault (nothing to divide)."""
        return self.in_service_s / SECONDS_PER_HOUR / self.faults if self.faults else None

    @property
    def per_1000_gpu_days(self) -> float | None:
        """Faults per 1,000 GPU-days in service; None with no GPU-time in service."""
        if not self.gpu_s:
            return None
        return self.faults * GPU_DAYS_PER_RATE * SECONDS_PER_DAY / self.gpu_s

    def __add__(self, other: "Mtbf") -> "Mtbf":
        return Mtbf(
            faults=self.faults + other.faults,
            in_service_s=self.in_service_s + other.in_service_s,
            gpu_s=self.gpu_s + other.gpu_s,
        )


def node_mtbf(history: NodeHistory, *, gpus: int, window_s: float) -> Mtbf:
    """MTBF of a node with ``gpus`` GPUs over a window of ``window_s`` seconds."""
    in_service = max(0.0, window_s - history.quarantined_s)
    return Mtbf(faults=history.faults, in_service_s=in_service, gpu_s=gpus * in_service)


def month_table(
    counts: Iterable[tuple[str, str, int]], *, months: Sequence[str], causes: Sequence[str]
) -> list[tuple[str, list[int]]]:
    """Failures per month and cause class: ``counts`` are (month "YYYY-MM", cause, n);
    one row per month of ``months`` (zeros where nothing failed), one column per cause
    of ``causes``. A cause or month outside them is left out."""
    cells = {(month, cause): n for month, cause, n in counts}
    return [(month, [cells.get((month, cause), 0) for cause in causes]) for month in months]


def months_between(first: tuple[int, int], last: tuple[int, int]) -> list[str]:
    """Every month from ``first`` to ``last`` (year, month), both included, as "YYYY-MM"."""
    year, month = first
    found = []
    while (year, month) <= last:
        found.append(f"{year:04d}-{month:02d}")
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return found
