"""Effective and wasted GPU-seconds of one attempt (design §7). Pure: plain data in and out.

Every GPU-second of the allocation falls in exactly one category, by precedence:
lost → startup → checkpoint → interactive_idle → idle → input_wait → comm_wait → effective.
``interactive_idle`` is a workspace's time idle on every signal (telemetry/workspace_idle.py):
all its GPUs, whatever their activity, as nobody used them. The sums are exact
``Fraction``s, so ``effective + Σ waste == allocated`` holds exactly; ``whole_seconds()``
rounds them to integer GPU-seconds that still add up to the rounded allocation. An attempt
that ended by the platform's or the hardware's fault is credited its lost and startup
GPU-seconds (``credited``): charged = allocated − credited, exactly.
Times are Unix seconds (int, float or Fraction); the edges convert datetimes.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from itertools import pairwise

IDLE_THRESHOLD = 0.05  # activity below this in a minute makes the GPU idle for that minute
MINUTE = 60

Seconds = int | float | Fraction


class Outcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    LOST = "LOST"
    CANCELLED = "CANCELLED"


# Outcomes whose progress since the resumed checkpoint is thrown away. A cancelled attempt
# is stopped on purpose and a succeeded one kept its work.
LOSING_OUTCOMES = frozenset({Outcome.FAILED, Outcome.PREEMPTED, Outcome.LOST})

# The accounting categories: the one definition every app derives from (finance's costing,
# statements, exports and charts, the telemetry pages). Adding a category starts here.
EFFECTIVE = "effective"
# Waste, in precedence order: a GPU-second goes to the first category that claims it.
WASTE = ("lost", "startup", "checkpoint", "interactive_idle", "idle", "input_wait", "comm_wait")
# Every category, effective last: ``whole_seconds`` breaks rounding ties in this order.
CATEGORIES = (*WASTE, EFFECTIVE)
# The waste credited back when an attempt ended by the platform's or the hardware's fault:
# the work it lost, and its startup (the time to get going again was ours to cause too).
CREDITED = ("lost", "startup")


@dataclass(frozen=True, slots=True)
class StepWindow:
    """An SDK step window: ``steps`` training steps over [start, end), with the seconds of
    that time spent waiting for input, on communication, and blocked checkpointing."""

    start: Seconds
    end: Seconds
    steps: int
    step_time_s: float
    data_wait_s: float = 0.0
    comm_wait_s: float = 0.0
    checkpoint_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ResumedCheckpoint:
    """The checkpoint saved in this attempt that the next attempt resumed from."""

    step: int
    saved_at: Seconds  # when the save finished


@dataclass(frozen=True, slots=True)
class AttemptTimeline:
    gpus: int
    start: Seconds  # GPUs allocated
    end: Seconds  # GPUs released
    outcome: Outcome
    resumed_checkpoint: ResumedCheckpoint | None = None
    step_windows: Sequence[StepWindow] = ()
    checkpoint_intervals: Sequence[tuple[Seconds, Seconds]] = ()  # blocked saving / restoring
    # A workspace's streaks idle on every signal (WorkspaceIdleSpan), empty for a batch run.
    interactive_idle_intervals: Sequence[tuple[Seconds, Seconds]] = ()
    activity: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    """GPU -> minute start (Unix seconds, a multiple of 60) -> activity 0-1. A minute
    without a value is not idle: idleness needs evidence."""
    idle_threshold: float = IDLE_THRESHOLD
    submitted_at: Seconds | None = None


@dataclass(frozen=True, slots=True)
class Accounting:
    """GPU-seconds per category (exact), with utilisation and queue time beside them."""

    allocated: Fraction
    lost: Fraction
    startup: Fraction
    checkpoint: Fraction
    interactive_idle: Fraction
    idle: Fraction
    input_wait: Fraction
    comm_wait: Fraction
    effective: Fraction
    active_gpu_hours: float  # activity-weighted time: what the GPUs were busy for, in GPU-hours
    queue_s: Fraction | None  # submitted → allocated, wall seconds (not GPU-seconds)

    @property
    def waste(self) -> Fraction:
        return sum((getattr(self, name) for name in WASTE), Fraction(0))

    @property
    def goodput(self) -> Fraction | None:
        return self.effective / self.allocated if self.allocated else None

    def categories(self) -> dict[str, Fraction]:
        return {name: getattr(self, name) for name in CATEGORIES}

    def whole_seconds(self) -> dict[str, int]:
        """Categories in whole GPU-seconds (largest remainder), summing exactly to
        ``allocated`` rounded half up, which is also returned as ``allocated``."""
        exact = self.categories()
        total = int(self.allocated + Fraction(1, 2))
        whole = {name: int(value) for name, value in exact.items()}  # values are ≥ 0
        by_remainder = sorted(CATEGORIES, key=lambda name: -(exact[name] - whole[name]))
        for name in by_remainder[: total - sum(whole.values())]:
            whole[name] += 1
        whole["allocated"] = total
        return whole


def credit_due(*, outcome: Outcome, ours: bool) -> bool:
    """Whether an attempt's ``CREDITED`` categories are credited: it ended by losing its
    work (failed, preempted, lost) and the cause was the platform's or the hardware's
    (``ours``). A succeeded or cancelled attempt is never credited, whatever its cause."""
    return ours and outcome in LOSING_OUTCOMES


def credited(accounting: Accounting, *, outcome: Outcome, ours: bool) -> Fraction:
    """The attempt's credited GPU-seconds, exact: ``lost + startup`` when credit is due."""
    if not credit_due(outcome=outcome, ours=ours):
        return Fraction(0)
    return sum((getattr(accounting, name) for name in CREDITED), Fraction(0))


def credited_whole(whole: Mapping[str, int], *, outcome: Outcome, ours: bool) -> int:
    """The credited GPU-seconds in whole seconds: the sum of the credited categories as
    ``Accounting.whole_seconds`` rounded them (not the exact credit rounded again), so
    ``charged = allocated - credited`` and the categories still add up to the second."""
    if not credit_due(outcome=outcome, ours=ours):
        return 0
    return sum(whole[name] for name in CREDITED)


def _exact(value: Seconds) -> Fraction:
    """Floats as the decimal they print as (0.6 is 3/5, not its binary neighbour)."""
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)


def _merge(intervals: Iterable[tuple[Fraction, Fraction]]) -> list[tuple[Fraction, Fraction]]:
    merged: list[tuple[Fraction, Fraction]] = []
    for start, end in sorted(interval for interval in intervals if interval[1] > interval[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(
    intervals: list[tuple[Fraction, Fraction]], start: Fraction, end: Fraction
) -> Fraction:
    return sum(
        (min(end, b) - max(start, a) for a, b in intervals if a < end and b > start), Fraction(0)
    )


@dataclass(slots=True)
class _Window:
    start: Fraction
    end: Fraction
    checkpoint_share: Fraction  # of the window's time not already in a checkpoint interval
    data_share: Fraction  # of the step time that remains
    comm_share: Fraction
    remaining: Fraction = Fraction(0)  # GPU-seconds left after idle, split by the shares


def _windows(
    step_windows: Sequence[StepWindow],
    checkpoints: list[tuple[Fraction, Fraction]],
    start: Fraction,
    end: Fraction,
) -> list[_Window]:
    """Step windows clipped to the allocation, overlaps trimmed, with their time shares."""
    windows: list[_Window] = []
    previous_end = start
    for step in sorted(step_windows, key=lambda window: _exact(window.start)):
        w_start = max(_exact(step.start), previous_end)
        w_end = min(_exact(step.end), end)
        if w_end <= w_start:
            continue
        previous_end = w_end
        open_s = (w_end - w_start) - _overlap(checkpoints, w_start, w_end)
        extra_checkpoint = max(Fraction(0), _exact(step.checkpoint_s) - (w_end - w_start - open_s))
        checkpoint_share = (
            min(Fraction(1), extra_checkpoint / open_s) if open_s > 0 else Fraction(0)
        )
        step_s = open_s - extra_checkpoint
        data_share = comm_share = Fraction(0)
        if step_s > 0:
            data_share = min(Fraction(1), max(Fraction(0), _exact(step.data_wait_s) / step_s))
            comm_share = min(1 - data_share, max(Fraction(0), _exact(step.comm_wait_s) / step_s))
        windows.append(_Window(w_start, w_end, checkpoint_share, data_share, comm_share))
    return windows


def _activity(
    timeline: AttemptTimeline, start: Fraction, end: Fraction
) -> tuple[dict[int, int], Fraction | None, float]:
    """Idle GPUs per minute (at most the attempt's GPUs), the first active moment, and the
    activity-weighted GPU-seconds, within [start, end)."""
    idle_gpus: dict[int, int] = {}
    first_active: Fraction | None = None
    active_gpu_seconds = 0.0
    for minutes in timeline.activity.values():
        for raw_minute, activity in minutes.items():
            minute = raw_minute // MINUTE * MINUTE
            lo, hi = max(start, Fraction(minute)), min(end, Fraction(minute + MINUTE))
            if hi <= lo:
                continue
            active_gpu_seconds += activity * float(hi - lo)
            if activity < timeline.idle_threshold:
                idle_gpus[minute] = min(timeline.gpus, idle_gpus.get(minute, 0) + 1)
            elif first_active is None or lo < first_active:
                first_active = lo
    return idle_gpus, first_active, active_gpu_seconds


def account(timeline: AttemptTimeline) -> Accounting:
    """Split one attempt's allocated GPU-seconds into the categories of design §7."""
    gpus = timeline.gpus
    start = _exact(timeline.start)
    end = max(_exact(timeline.end), start)
    zero = Fraction(0)

    idle_gpus, first_active, active_gpu_seconds = _activity(timeline, start, end)

    checkpoints = _merge(
        (max(_exact(a), start), min(_exact(b), end)) for a, b in timeline.checkpoint_intervals
    )
    windows = _windows(timeline.step_windows, checkpoints, start, end)
    unused = _merge(
        (max(_exact(a), start), min(_exact(b), end)) for a, b in timeline.interactive_idle_intervals
    )

    # Startup ends at the first step window, else the first active minute.
    if windows:
        productive_start = windows[0].start
    elif first_active is not None:
        productive_start = first_active
    else:
        productive_start = start
    lost_from = end
    if timeline.outcome in LOSING_OUTCOMES:
        lost_from = productive_start
        if timeline.resumed_checkpoint is not None:
            lost_from = min(end, max(lost_from, _exact(timeline.resumed_checkpoint.saved_at)))

    cuts = {start, end, productive_start, lost_from}
    cuts.update(point for interval in checkpoints for point in interval)
    cuts.update(point for interval in unused for point in interval)
    cuts.update(point for window in windows for point in (window.start, window.end))
    for minute in idle_gpus:
        cuts.update((Fraction(minute), Fraction(minute + MINUTE)))
    points = sorted(point for point in cuts if start <= point <= end)

    lost = startup = checkpoint = interactive_idle = idle = effective = zero
    c_index = u_index = w_index = 0
    for a, b in pairwise(points):
        length = b - a
        if a >= lost_from:
            lost += gpus * length
            continue
        if a < productive_start:
            startup += gpus * length
            continue
        while c_index < len(checkpoints) and checkpoints[c_index][1] <= a:
            c_index += 1
        if c_index < len(checkpoints) and checkpoints[c_index][0] <= a:
            checkpoint += gpus * length
            continue
        while u_index < len(unused) and unused[u_index][1] <= a:
            u_index += 1
        if u_index < len(unused) and unused[u_index][0] <= a:
            interactive_idle += gpus * length
            continue
        while w_index < len(windows) and windows[w_index].end <= a:
            w_index += 1
        idle_count = idle_gpus.get(int(a // MINUTE) * MINUTE, 0)
        if w_index < len(windows) and windows[w_index].start <= a:
            window = windows[w_index]
            checkpoint += gpus * length * window.checkpoint_share
            rest = length * (1 - window.checkpoint_share)
            idle += idle_count * rest
            window.remaining += (gpus - idle_count) * rest
        else:
            idle += idle_count * length
            effective += (gpus - idle_count) * length

    input_wait = comm_wait = zero
    for window in windows:
        input_wait += window.remaining * window.data_share
        comm_wait += window.remaining * window.comm_share
        effective += window.remaining * (1 - window.data_share - window.comm_share)

    queue_s = None
    if timeline.submitted_at is not None:
        queue_s = max(zero, start - _exact(timeline.submitted_at))
    return Accounting(
        allocated=gpus * (end - start),
        lost=lost,
        startup=startup,
        checkpoint=checkpoint,
        interactive_idle=interactive_idle,
        idle=idle,
        input_wait=input_wait,
        comm_wait=comm_wait,
        effective=effective,
        active_gpu_hours=active_gpu_seconds / 3600,
        queue_s=queue_s,
    )


# KPIs -----------------------------------------------------------------------------------


def goodput(accountings: Iterable[Accounting]) -> Fraction | None:
    """Effective ÷ allocated over several attempts; None when nothing was allocated."""
    allocated = effective = Fraction(0)
    for accounting in accountings:
        allocated += accounting.allocated
        effective += accounting.effective
    return effective / allocated if allocated else None


@dataclass(frozen=True, slots=True)
class ResumedAttempt:
    restored_step: int  # the checkpoint step the attempt started from
    last_step: int  # the largest step it reported (step windows or checkpoints it saved)
    succeeded: bool = False


def recovered(attempt: ResumedAttempt) -> bool:
    """A resumed attempt recovered when it got past the restored step or succeeded; one
    that failed (or was preempted, lost or cancelled) before getting past it did not."""
    return attempt.succeeded or attempt.last_step > attempt.restored_step


def checkpoint_recovery_success(resumed: Iterable[ResumedAttempt]) -> Fraction | None:
    """Recovered resumed attempts (``recovered``) ÷ resumed attempts."""
    attempts = list(resumed)
    if not attempts:
        return None
    return Fraction(sum(1 for attempt in attempts if recovered(attempt)), len(attempts))
