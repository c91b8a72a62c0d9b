"""Everything a run's telemetry page shows, from the stored accounting and the raw
telemetry of every attempt (its reads: ``run_page_sql``)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.models import Attempt, Run
from telemetry import diagnosis, verdicts
from telemetry.selectors.finished_attempts import FINISHED_STATES
from telemetry.selectors.gpu_seconds import GpuSeconds
from telemetry.selectors.rank_windows import RankCoverage, rank_coverage
from telemetry.selectors.run_page_sql import (
    CheckpointMark,
    GpuSeries,
    GpuSummary,
    StepSplit,
    accounting_by_attempt,
    gpu_activity_series,
    gpu_summaries,
    run_checkpoint_marks,
    step_split_by_attempt,
    step_split_series,
)
from telemetry.selectors.verdict_facts import attempts_facts

# Points per chart line at most: per minute up to 12 hours, per hour up to 30 days, then per
# day. Enough to see the shape of a run; few enough for the browser to draw at once.
MAX_CHART_POINTS = 720
_RESOLUTIONS = (
    ("minute", timedelta(minutes=1)),
    ("hour", timedelta(hours=1)),
    ("day", timedelta(days=1)),
)


@dataclass(frozen=True, slots=True)
class AttemptTelemetry:
    attempt: Attempt
    accounting: GpuSeconds | None  # None until computed
    steps: StepSplit
    gpus: list[GpuSummary]
    # The troubleshooting tree's verdicts (None before the attempt started); those that
    # need the accounting follow when it is computed.
    verdicts: verdicts.Verdicts | None
    ranks: RankCoverage | None = None  # None when no rank sent per-rank windows

    @property
    def findings(self) -> tuple[diagnosis.Finding, ...] | None:
        return self.verdicts.findings if self.verdicts is not None else None

    @property
    def status(self) -> str:
        """accounted; pending (ended, accounting not computed yet); running; waiting (no
        GPUs allocated yet)."""
        if self.accounting is not None:
            return "accounted"
        if self.attempt.state in FINISHED_STATES:
            return "pending"
        return "running" if self.attempt.started_at is not None else "waiting"


@dataclass(frozen=True, slots=True)
class RunTelemetry:
    attempts: list[AttemptTelemetry]
    resolution: str  # of the time series: minute, hour or day
    gpu_series: list[GpuSeries]
    step_series: list[tuple[datetime, StepSplit]]
    checkpoints: list[CheckpointMark]

    @property
    def total(self) -> GpuSeconds | None:
        """The run's accounting: the sum over its accounted attempts."""
        accounted = [item.accounting for item in self.attempts if item.accounting is not None]
        return sum(accounted[1:], accounted[0]) if accounted else None

    @property
    def steps_total(self) -> StepSplit:
        return sum((item.steps for item in self.attempts), StepSplit())

    @property
    def running(self) -> list[AttemptTelemetry]:
        return [item for item in self.attempts if item.status == "running"]

    @property
    def pending(self) -> list[AttemptTelemetry]:
        """Attempts that ended and wait for their accounting."""
        return [item for item in self.attempts if item.status == "pending"]


def chart_resolution(*, first: datetime | None, last: datetime | None) -> str:
    """The finest of minute, hour and day that draws ``first``…``last`` in at most
    ``MAX_CHART_POINTS`` points per line."""
    if first is None or last is None:
        return "minute"
    for name, step in _RESOLUTIONS:
        if last - first <= step * MAX_CHART_POINTS:
            return name
    return _RESOLUTIONS[-1][0]


def _signals(*, attempt: Attempt, gpus: list[GpuSummary], steps: StepSplit) -> diagnosis.Signals:
    """The diagnosis inputs: activity means over every GPU-minute with a value, wait
    shares of the step time."""
    activity_minutes = sum(gpu.activity_minutes for gpu in gpus)
    tensor_minutes = sum(gpu.tensor_minutes for gpu in gpus)
    return diagnosis.Signals(
        mean_activity=sum(
            gpu.mean_activity * gpu.activity_minutes
            for gpu in gpus
            if gpu.activity_minutes and gpu.mean_activity is not None  # a mean if any minutes
        )
        / activity_minutes
        if activity_minutes
        else None,
        mean_tensor_activity=sum(
            gpu.mean_tensor_active * gpu.tensor_minutes
            for gpu in gpus
            if gpu.tensor_minutes and gpu.mean_tensor_active is not None  # a mean if any minutes
        )
        / tensor_minutes
        if tensor_minutes
        else None,
        data_wait_share=steps.data_wait_share,
        comm_wait_share=steps.comm_wait_share,
        failure_reason=attempt.failure_reason,
    )


def run_telemetry(*, run: Run, attempts: list[Attempt], now: datetime) -> RunTelemetry:
    """Everything the run's telemetry page shows, from the stored accounting (final once
    an attempt ended) and the raw telemetry of every attempt. ``attempts`` are the run's,
    in order; the run must already be access-checked."""
    numbers = {attempt.pk: attempt.number for attempt in attempts}
    attempt_ids = list(numbers)
    started = [attempt.started_at for attempt in attempts if attempt.started_at]
    resolution = chart_resolution(
        first=min(started, default=None),
        last=max(
            (attempt.finished_at or now for attempt in attempts if attempt.started_at), default=None
        ),
    )
    if not attempts:  # nothing to read: spare the queries
        return RunTelemetry(
            attempts=[], resolution=resolution, gpu_series=[], step_series=[], checkpoints=[]
        )
    items = attempt_items(run=run, attempts=attempts, now=now)
    return RunTelemetry(
        attempts=items,
        resolution=resolution,
        gpu_series=gpu_activity_series(numbers=numbers, resolution=resolution),
        step_series=step_split_series(attempt_ids=attempt_ids, resolution=resolution),
        checkpoints=run_checkpoint_marks(run_id=run.pk, numbers=numbers),
    )


def attempt_items(*, run: Run, attempts: list[Attempt], now: datetime) -> list[AttemptTelemetry]:
    """Each attempt's accounting, step split, GPUs and verdicts: the page's per-attempt
    part, and all the run's verdicts API reads. A fixed number of queries."""
    if not attempts:
        return []
    attempt_ids = [attempt.pk for attempt in attempts]
    accounted = accounting_by_attempt(attempt_ids=attempt_ids)
    summaries = gpu_summaries(attempt_ids=attempt_ids)
    splits = step_split_by_attempt(attempt_ids=attempt_ids)
    coverage = rank_coverage(attempt_ids=attempt_ids)
    gpus = {
        attempt.pk: [gpu for gpu in summaries if gpu.attempt_id == attempt.pk]
        for attempt in attempts
    }
    signals = {
        attempt.pk: _signals(
            attempt=attempt, gpus=gpus[attempt.pk], steps=splits.get(attempt.pk, StepSplit())
        )
        for attempt in attempts
    }
    facts = attempts_facts(
        run=run,
        attempts=attempts,
        signals=signals,
        summaries=summaries,
        coverage=coverage,
        now=now,
    )
    items = []
    for attempt in attempts:
        seconds = accounted.get(attempt.pk)
        found = facts.get(attempt.pk)
        items.append(
            AttemptTelemetry(
                attempt=attempt,
                accounting=seconds,
                steps=splits.get(attempt.pk, StepSplit()),
                gpus=gpus[attempt.pk],
                verdicts=None
                if found is None
                else verdicts.tree(seconds.as_accounting() if seconds else None, found),
                ranks=coverage.get(attempt.pk),
            )
        )
    return items
