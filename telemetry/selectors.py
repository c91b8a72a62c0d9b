"""Reads of the telemetry app."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import date, datetime, timedelta, tzinfo
from fractions import Fraction
from itertools import groupby
from typing import Any

from django.db import connection, models
from django.db.models import (
    Avg,
    Count,
    DateField,
    Exists,
    F,
    FloatField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    TextChoices,
)
from django.db.models.functions import Coalesce, TruncDay, TruncHour, TruncMinute, TruncWeek
from django.utils import timezone

from jobs.durations import duration_text
from jobs.models import Attempt, AttemptState, Checkpoint, Run
from telemetry import accounting, diagnosis
from telemetry.models import AttemptAccounting, GpuMinute, SdkEvent, StepWindow, UnmappedSamples
from tenants.models import Tenant

FINISHED_STATES = (
    AttemptState.SUCCEEDED,
    AttemptState.FAILED,
    AttemptState.PREEMPTED,
    AttemptState.LOST,
    AttemptState.CANCELLED,
)


def attempts_pending_accounting(*, limit: int) -> QuerySet[Attempt]:
    """Finished attempts without accounting, or with data newer than their accounting:
    step windows, SDK events or GPU minutes received since, a next attempt created since
    (it decides which checkpoint was resumed, hence the lost time). Oldest first."""
    computed_at = OuterRef("accounting__computed_at")
    newer = (
        Exists(StepWindow.objects.filter(attempt=OuterRef("pk"), received_at__gt=computed_at))
        | Exists(SdkEvent.objects.filter(attempt=OuterRef("pk"), received_at__gt=computed_at))
        | Exists(GpuMinute.objects.filter(attempt=OuterRef("pk"), updated_at__gt=computed_at))
        | Exists(
            Attempt.objects.filter(
                run=OuterRef("run"),
                number=OuterRef("number") + 1,
                created_at__gt=computed_at,
            )
        )
    )
    return (
        Attempt.objects.filter(state__in=FINISHED_STATES, finished_at__isnull=False)
        .filter(Q(accounting__isnull=True) | newer)
        .select_related("run")
        .order_by("finished_at", "pk")[:limit]
    )


# --- pages: a run's telemetry, a tenant's goodput, unmapped samples -------------------------
#
# Plain data out: the views turn it into tables and chart series. Every function answers in
# one query per table it reads, grouping in SQL.

SECONDS_PER_HOUR = 3600
CATEGORY_LABELS = {
    "effective": "Effective",
    "lost": "Lost work",
    "startup": "Startup",
    "checkpoint": "Checkpointing",
    "idle": "Idle",
    "input_wait": "Input wait",
    "comm_wait": "Communication wait",
}
STEP_PART_LABELS = {
    "compute": "Compute",
    "data_wait": "Data wait",
    "comm_wait": "Communication wait",
}
# Points per chart line at most: per minute up to 12 hours, per hour up to 30 days, then per
# day. Enough to see the shape of a run; few enough for the browser to draw at once.
MAX_CHART_POINTS = 720
_RESOLUTIONS = (
    ("minute", timedelta(minutes=1)),
    ("hour", timedelta(hours=1)),
    ("day", timedelta(days=1)),
)


def _percent(part: float, whole: float) -> float | None:
    return part * 100 / whole if whole else None


@dataclass(frozen=True, slots=True)
class CategoryShare:
    key: str  # effective or one of accounting.WASTE
    label: str
    gpu_s: int
    percent: float | None  # of allocated

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class GpuSeconds:
    """Accounting of one attempt or summed over several: whole GPU-seconds per category
    (``effective + Σ waste == allocated``), activity-weighted GPU-seconds, queue seconds."""

    allocated: int = 0
    effective: int = 0
    lost: int = 0
    startup: int = 0
    checkpoint: int = 0
    idle: int = 0
    input_wait: int = 0
    comm_wait: int = 0
    activity_weighted: float = 0.0
    queue_s: float | None = None
    attempts: int = 0

    @classmethod
    def from_sums(cls, sums: Mapping[str, Any]) -> "GpuSeconds":
        """From the ``_ACCOUNTING_SUMS`` of an aggregate query (None where nothing summed)."""
        return cls(
            **{name: sums[name] or 0 for name in ("allocated", *accounting.CATEGORIES)},
            activity_weighted=sums["activity_weighted"] or 0.0,
            queue_s=sums["queue_s"],
            attempts=sums["attempts"],
        )

    def __add__(self, other: "GpuSeconds") -> "GpuSeconds":
        queue = [value for value in (self.queue_s, other.queue_s) if value is not None]
        return GpuSeconds(
            **{
                name: getattr(self, name) + getattr(other, name)
                for name in ("allocated", *accounting.CATEGORIES, "activity_weighted", "attempts")
            },
            queue_s=sum(queue) if queue else None,
        )

    @property
    def allocated_hours(self) -> float:
        return self.allocated / SECONDS_PER_HOUR

    @property
    def effective_hours(self) -> float:
        return self.effective / SECONDS_PER_HOUR

    @property
    def waste(self) -> int:
        return sum(getattr(self, name) for name in accounting.WASTE)

    @property
    def waste_hours(self) -> float:
        return self.waste / SECONDS_PER_HOUR

    @property
    def activity_weighted_hours(self) -> float:
        return self.activity_weighted / SECONDS_PER_HOUR

    @property
    def goodput_percent(self) -> float | None:
        return _percent(self.effective, self.allocated)

    @property
    def queue_text(self) -> str:
        return "—" if self.queue_s is None else duration_text(self.queue_s)

    def shares(self) -> list[CategoryShare]:
        """Effective first, then the waste categories in accounting precedence."""
        return [
            CategoryShare(
                key=name,
                label=CATEGORY_LABELS[name],
                gpu_s=getattr(self, name),
                percent=_percent(getattr(self, name), self.allocated),
            )
            for name in ("effective", *accounting.WASTE)
        ]

    @property
    def largest_waste(self) -> CategoryShare | None:
        """The waste category with the most GPU-seconds (the first in precedence on a
        tie); None when nothing was wasted."""
        waste = [share for share in self.shares()[1:] if share.gpu_s > 0]
        return max(waste, key=lambda share: share.gpu_s) if waste else None

    @property
    def largest_wastes(self) -> list[CategoryShare]:
        """Every waste category that has the most GPU-seconds, in precedence order: one, or
        all of a tie (a page names them all, never one of them as "mostly")."""
        top = self.largest_waste
        if top is None:
            return []
        return [share for share in self.shares()[1:] if share.gpu_s == top.gpu_s]

    def as_accounting(self) -> accounting.Accounting:
        """The pure ``Accounting`` that ``diagnosis.diagnose`` reads."""
        return accounting.Accounting(
            allocated=Fraction(self.allocated),
            **{name: Fraction(getattr(self, name)) for name in accounting.CATEGORIES},
            active_gpu_hours=self.activity_weighted_hours,
            queue_s=None if self.queue_s is None else Fraction(repr(self.queue_s)),
        )


_ACCOUNTING_SUMS = {
    "allocated": Sum("allocated_gpu_s"),
    **{name: Sum(f"{name}_gpu_s") for name in accounting.CATEGORIES},
    "activity_weighted": Sum("activity_weighted_gpu_s"),
    "queue_s": Sum("queue_s"),
    "attempts": Count("pk"),
}


@dataclass(frozen=True, slots=True)
class StepSplit:
    """Where the step time of SDK step windows went. ``step_s`` is Σ steps × mean step time
    (the waits included); what is neither data nor communication wait is compute."""

    windows: int = 0
    steps: int = 0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    comm_wait_s: float = 0.0
    checkpoint_s: float = 0.0  # blocked outside the steps

    def __add__(self, other: "StepSplit") -> "StepSplit":
        return StepSplit(
            **{
                field.name: getattr(self, field.name) + getattr(other, field.name)
                for field in fields(self)
            }
        )

    @property
    def compute_s(self) -> float:
        # A hand-built window may report more wait than step time (docs/sdk.md): no negative
        # compute, the waits then fill the step.
        return max(0.0, self.step_s - self.data_wait_s - self.comm_wait_s)

    @property
    def data_wait_share(self) -> float:
        return min(1.0, self.data_wait_s / self.step_s) if self.step_s else 0.0

    @property
    def comm_wait_share(self) -> float:
        return (
            min(1.0 - self.data_wait_share, self.comm_wait_s / self.step_s) if self.step_s else 0.0
        )

    @property
    def compute_share(self) -> float:
        return 1.0 - self.data_wait_share - self.comm_wait_share if self.step_s else 0.0

    def parts(self) -> list[tuple[str, str, str, float]]:
        """(key, label, time as text, percent of step time) of compute, data wait and
        communication wait."""
        return [
            (
                key,
                label,
                duration_text(getattr(self, f"{key}_s")),
                getattr(self, f"{key}_share") * 100,
            )
            for key, label in STEP_PART_LABELS.items()
        ]

    @property
    def step_text(self) -> str:
        return duration_text(self.step_s)

    @property
    def checkpoint_text(self) -> str:
        return duration_text(self.checkpoint_s)


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """One GPU of one attempt over the attempt: means of the minute rollups (0-1)."""

    attempt_id: int
    host: str
    gpu: str
    minutes: int
    activity_minutes: int  # minutes with an activity value
    mean_activity: float | None
    mean_sm_active: float | None
    tensor_minutes: int
    mean_tensor_active: float | None
    peak_fb_used: float | None  # MiB
    xid_minutes: int  # minutes with an XID error

    @property
    def activity_percent(self) -> float | None:
        return _percent_of_one(self.mean_activity)

    @property
    def sm_active_percent(self) -> float | None:
        return _percent_of_one(self.mean_sm_active)

    @property
    def tensor_active_percent(self) -> float | None:
        return _percent_of_one(self.mean_tensor_active)


@dataclass(frozen=True, slots=True)
class GpuSeries:
    """One GPU of one attempt over time, in percent (None where a bucket has no value)."""

    attempt_id: int
    attempt_number: int
    host: str
    gpu: str
    times: list[datetime]
    activity: list[float | None]
    sm_active: list[float | None]
    tensor_active: list[float | None]


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    attempt_id: int
    attempt_number: int
    at: datetime  # when the save or restore finished
    kind: str  # "saved" or "restored"
    reported_by: str  # "cluster" (a jobs Checkpoint row) or "SDK" (an SDK event)
    step: int
    uri: str
    seconds: float | None


@dataclass(frozen=True, slots=True)
class AttemptTelemetry:
    attempt: Attempt
    accounting: GpuSeconds | None  # None until computed
    steps: StepSplit
    gpus: list[GpuSummary]
    findings: list[diagnosis.Finding] | None  # None without accounting

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


def _percent_of_one(value: float | None) -> float | None:
    return None if value is None else round(value * 100, 1)


def _in_sql(sql: str, params: list) -> list[tuple]:
    """Rows of a hand-written query. The page's reads are few, small and on every visit:
    SQL spares the ORM's compilation of each (most of their cost) and its per-value
    converters; identifiers come from model metadata, every value is a parameter."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _bucket_sql(column: str) -> str:
    """``column`` truncated to a bucket of the current time zone's wall time (as the ORM's
    ``Trunc*`` writes it); the two parameters are the resolution and the zone's name."""
    return f"DATE_TRUNC(%s, {column} AT TIME ZONE %s)"


def _bucket_params(resolution: str) -> tuple[list, tzinfo]:
    """The parameters of ``_bucket_sql`` and the zone that turns a bucket back into the
    aware datetime the ORM would have made of it."""
    zone = timezone.get_current_timezone()
    # What the ORM binds for the zone (Postgres reads a "+05:00" offset the other way).
    name = connection.ops._prepare_tzname_delta(  # type: ignore[attr-defined]
        timezone.get_current_timezone_name()
    )
    return [resolution, name], zone


def accounting_by_attempt(*, attempt_ids: list[int]) -> dict[int, GpuSeconds]:
    """The stored accounting of each of ``attempt_ids`` that has one."""
    if connection.vendor != "postgresql":
        return _accounting_by_attempt_orm(attempt_ids)
    names = ("allocated", *accounting.CATEGORIES, "activity_weighted")
    columns = ", ".join(f"{name}_gpu_s" for name in names)
    rows = _in_sql(
        f"SELECT attempt_id, {columns}, queue_s FROM {_table(AttemptAccounting)} "  # noqa: S608
        "WHERE attempt_id = ANY(%s)",
        [attempt_ids],
    )
    return {
        attempt_id: GpuSeconds(**dict(zip(names, gpu_s, strict=True)), queue_s=queue_s, attempts=1)
        for attempt_id, *gpu_s, queue_s in rows
    }


def gpu_summaries(*, attempt_ids: list[int]) -> list[GpuSummary]:
    """Per attempt and GPU: minutes, mean activities, peak memory, minutes with XIDs."""
    if connection.vendor != "postgresql":
        return _gpu_summaries_orm(attempt_ids)
    rows = _in_sql(
        "SELECT attempt_id, host, gpu, COUNT(*), COUNT(activity), AVG(activity), "  # noqa: S608
        "AVG(sm_active), COUNT(tensor_active), AVG(tensor_active), MAX(fb_used), "
        f"COUNT(*) FILTER (WHERE xid <> 0) FROM {_table(GpuMinute)} "
        "WHERE attempt_id = ANY(%s) GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        [attempt_ids],
    )
    return [GpuSummary(*row) for row in rows]


def gpu_activity_series(*, numbers: dict[int, int], resolution: str) -> list[GpuSeries]:
    """Activity, SM and tensor activity in percent per attempt and GPU over time, averaged
    per ``resolution`` bucket. ``numbers``: attempt id -> attempt number."""
    if connection.vendor != "postgresql":
        return _gpu_activity_series_orm(numbers, resolution)
    params, zone = _bucket_params(resolution)
    rows = _in_sql(
        f"SELECT attempt_id, host, gpu, {_bucket_sql('minute')}, AVG(activity), "  # noqa: S608
        f"AVG(sm_active), AVG(tensor_active) FROM {_table(GpuMinute)} "
        "WHERE attempt_id = ANY(%s) GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
        [*params, list(numbers)],
    )
    series: list[GpuSeries] = []
    for (attempt_id, host, gpu), group in groupby(rows, key=lambda row: row[:3]):
        points = list(group)
        series.append(
            GpuSeries(
                attempt_id=attempt_id,
                attempt_number=numbers[attempt_id],
                host=host,
                gpu=gpu,
                times=[point[3].replace(tzinfo=zone) for point in points],
                activity=[_percent_of_one(point[4]) for point in points],
                sm_active=[_percent_of_one(point[5]) for point in points],
                tensor_active=[_percent_of_one(point[6]) for point in points],
            )
        )
    return series


_STEP_SUMS_SQL = (
    "COUNT(*), SUM(steps), SUM(steps * step_time_s), SUM(data_wait_s), SUM(comm_wait_s), "
    "SUM(checkpoint_s)"
)


def _step_split(sums: Sequence[Any]) -> StepSplit:
    """From the ``_STEP_SUMS_SQL`` of a group (None where nothing summed)."""
    windows, steps, step_s, data_wait_s, comm_wait_s, checkpoint_s = sums
    return StepSplit(
        windows=windows,
        steps=steps or 0,
        step_s=step_s or 0,
        data_wait_s=data_wait_s or 0,
        comm_wait_s=comm_wait_s or 0,
        checkpoint_s=checkpoint_s or 0,
    )


def step_split_by_attempt(*, attempt_ids: list[int]) -> dict[int, StepSplit]:
    if connection.vendor != "postgresql":
        return _step_split_by_attempt_orm(attempt_ids)
    rows = _in_sql(
        f"SELECT attempt_id, {_STEP_SUMS_SQL} FROM {_table(StepWindow)} "  # noqa: S608
        "WHERE attempt_id = ANY(%s) GROUP BY 1 ORDER BY 1",
        [attempt_ids],
    )
    return {attempt_id: _step_split(sums) for attempt_id, *sums in rows}


def step_split_series(
    *, attempt_ids: list[int], resolution: str
) -> list[tuple[datetime, StepSplit]]:
    """The step time split per ``resolution`` bucket of the windows' start, all attempts
    together (they do not overlap in time)."""
    if connection.vendor != "postgresql":
        return _step_split_series_orm(attempt_ids, resolution)
    params, zone = _bucket_params(resolution)
    rows = _in_sql(
        f"SELECT {_bucket_sql('start')}, {_STEP_SUMS_SQL} FROM {_table(StepWindow)} "  # noqa: S608
        "WHERE attempt_id = ANY(%s) GROUP BY 1 ORDER BY 1",
        [*params, attempt_ids],
    )
    return [(bucket.replace(tzinfo=zone), _step_split(sums)) for bucket, *sums in rows]


def run_checkpoint_marks(*, run_id: int, numbers: dict[int, int]) -> list[CheckpointMark]:
    """The run's checkpoints and the SDK's saved / restored events, in time order.
    ``numbers``: attempt id -> attempt number of the run's attempts.

    A save the SDK reported is also a checkpoint of the run: it is listed once, as the SDK
    timed it (as accounting counts it); the other checkpoints came from the cluster."""
    if connection.vendor != "postgresql":
        return _run_checkpoint_marks_orm(run_id, numbers)
    saved, restored = SdkEvent.Type.CHECKPOINT_SAVED, SdkEvent.Type.CHECKPOINT_RESTORED
    events = _in_sql(
        f"SELECT e.attempt_id, e.ts, e.type, e.payload FROM {_table(SdkEvent)} e "  # noqa: S608
        f"JOIN {_table(Attempt)} a ON a.id = e.attempt_id "
        "WHERE e.attempt_id = ANY(%s) AND e.type IN (%s, %s) ORDER BY a.number, e.ts, e.id",
        [list(numbers), saved.value, restored.value],
    )
    marks = []
    for attempt_id, at, kind, payload in events:
        data = json.loads(payload) if isinstance(payload, str) else payload
        marks.append(
            CheckpointMark(
                attempt_id=attempt_id,
                attempt_number=numbers[attempt_id],
                at=at,
                kind="saved" if kind == saved else "restored",
                reported_by="SDK",
                step=data["step"],
                uri=data["uri"],
                seconds=data["seconds"],
            )
        )
    saved_by_sdk = {(mark.attempt_id, mark.step) for mark in marks if mark.kind == "saved"}
    checkpoints = _in_sql(
        "SELECT attempt_id, saved_at, step, uri, save_seconds "  # noqa: S608
        f"FROM {_table(Checkpoint)} WHERE run_id = %s ORDER BY step",
        [run_id],
    )
    marks.extend(
        CheckpointMark(
            attempt_id=attempt_id,
            attempt_number=numbers[attempt_id],
            at=at,
            kind="saved",
            reported_by="cluster",
            step=step,
            uri=uri,
            seconds=save_seconds or None,
        )
        for attempt_id, at, step, uri, save_seconds in checkpoints
        if (attempt_id, step) not in saved_by_sdk
    )
    return sorted(marks, key=lambda mark: (mark.at, mark.attempt_id, mark.reported_by))


# The same six reads through the ORM (accounting_by_attempt, gpu_summaries,
# gpu_activity_series, step_split_by_attempt, step_split_series, run_checkpoint_marks). Why
# both: the hand-written SQL above is what PostgreSQL runs, because the run page asks these
# on every visit and the ORM's compilation was most of their cost (``_in_sql``); the twins
# are what SQLite runs (the embedded mode's default database), whose SQL has no DATE_TRUNC,
# AT TIME ZONE, = ANY or FILTER. Neither is unused. tests/telemetry/test_run_telemetry_sql.py
# holds each pair to the same answers on PostgreSQL, and each read to its own twin off it.

_TRUNC = {"minute": TruncMinute, "hour": TruncHour, "day": TruncDay}
_STEP_SUMS = {
    "sum_windows": Count("pk"),
    "sum_steps": Sum("steps"),
    "sum_step_s": Sum(F("steps") * F("step_time_s"), output_field=FloatField()),
    "sum_data_wait_s": Sum("data_wait_s"),
    "sum_comm_wait_s": Sum("comm_wait_s"),
    "sum_checkpoint_s": Sum("checkpoint_s"),
}


def _accounting_by_attempt_orm(attempt_ids: list[int]) -> dict[int, GpuSeconds]:
    return {
        row.attempt_id: GpuSeconds(
            allocated=row.allocated_gpu_s,
            **{name: getattr(row, f"{name}_gpu_s") for name in accounting.CATEGORIES},
            activity_weighted=row.activity_weighted_gpu_s,
            queue_s=row.queue_s,
            attempts=1,
        )
        for row in AttemptAccounting.objects.filter(attempt_id__among=attempt_ids)
    }


def _gpu_summaries_orm(attempt_ids: list[int]) -> list[GpuSummary]:
    rows = (
        GpuMinute.objects.filter(attempt_id__among=attempt_ids)
        .values("attempt_id", "host", "gpu")
        .annotate(
            minutes=Count("pk"),
            activity_minutes=Count("activity"),
            mean_activity=Avg("activity"),
            mean_sm_active=Avg("sm_active"),
            tensor_minutes=Count("tensor_active"),
            mean_tensor_active=Avg("tensor_active"),
            peak_fb_used=Max("fb_used"),
            xid_minutes=Count("pk", filter=~Q(xid=0)),
        )
        .order_by("attempt_id", "host", "gpu")
    )
    return [GpuSummary(**row) for row in rows]


def _gpu_activity_series_orm(numbers: dict[int, int], resolution: str) -> list[GpuSeries]:
    rows = (
        GpuMinute.objects.filter(attempt_id__among=list(numbers))
        .annotate(bucket=_TRUNC[resolution]("minute"))
        .values("attempt_id", "host", "gpu", "bucket")
        .annotate(
            mean_activity=Avg("activity"),
            mean_sm_active=Avg("sm_active"),
            mean_tensor_active=Avg("tensor_active"),
        )
        .order_by("attempt_id", "host", "gpu", "bucket")
    )
    series: list[GpuSeries] = []
    for (attempt_id, host, gpu), group in groupby(
        rows, key=lambda row: (row["attempt_id"], row["host"], row["gpu"])
    ):
        points = list(group)
        series.append(
            GpuSeries(
                attempt_id=attempt_id,
                attempt_number=numbers[attempt_id],
                host=host,
                gpu=gpu,
                times=[point["bucket"] for point in points],
                activity=[_percent_of_one(point["mean_activity"]) for point in points],
                sm_active=[_percent_of_one(point["mean_sm_active"]) for point in points],
                tensor_active=[_percent_of_one(point["mean_tensor_active"]) for point in points],
            )
        )
    return series


def _step_split_by_attempt_orm(attempt_ids: list[int]) -> dict[int, StepSplit]:
    rows = (
        StepWindow.objects.filter(attempt_id__among=attempt_ids)
        .values("attempt_id")
        .annotate(**_STEP_SUMS)
        .order_by("attempt_id")
    )
    return {row["attempt_id"]: _step_split_orm(row) for row in rows}


def _step_split_series_orm(
    attempt_ids: list[int], resolution: str
) -> list[tuple[datetime, StepSplit]]:
    rows = (
        StepWindow.objects.filter(attempt_id__among=attempt_ids)
        .annotate(bucket=_TRUNC[resolution]("start"))
        .values("bucket")
        .annotate(**_STEP_SUMS)
        .order_by("bucket")
    )
    return [(row["bucket"], _step_split_orm(row)) for row in rows]


def _run_checkpoint_marks_orm(run_id: int, numbers: dict[int, int]) -> list[CheckpointMark]:
    events = SdkEvent.objects.filter(
        attempt_id__among=list(numbers),
        type__in=(SdkEvent.Type.CHECKPOINT_SAVED, SdkEvent.Type.CHECKPOINT_RESTORED),
    )
    marks = [
        CheckpointMark(
            attempt_id=event.attempt_id,
            attempt_number=numbers[event.attempt_id],
            at=event.ts,
            kind="saved" if event.type == SdkEvent.Type.CHECKPOINT_SAVED else "restored",
            reported_by="SDK",
            step=event.payload["step"],
            uri=event.payload["uri"],
            seconds=event.payload["seconds"],
        )
        for event in events
    ]
    saved_by_sdk = {(mark.attempt_id, mark.step) for mark in marks if mark.kind == "saved"}
    marks.extend(
        CheckpointMark(
            attempt_id=checkpoint.attempt_id,
            attempt_number=numbers[checkpoint.attempt_id],
            at=checkpoint.saved_at,
            kind="saved",
            reported_by="cluster",
            step=checkpoint.step,
            uri=checkpoint.uri,
            seconds=checkpoint.save_seconds or None,
        )
        for checkpoint in Checkpoint.objects.filter(run_id=run_id)
        if (checkpoint.attempt_id, checkpoint.step) not in saved_by_sdk
    )
    return sorted(marks, key=lambda mark: (mark.at, mark.attempt_id, mark.reported_by))


def _step_split_orm(row: Mapping[str, Any]) -> StepSplit:
    return StepSplit(**{name.removeprefix("sum_"): row[name] or 0 for name in _STEP_SUMS})


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
    accounted = accounting_by_attempt(attempt_ids=attempt_ids)
    summaries = gpu_summaries(attempt_ids=attempt_ids)
    splits = step_split_by_attempt(attempt_ids=attempt_ids)
    items = []
    for attempt in attempts:
        seconds = accounted.get(attempt.pk)
        gpus = [gpu for gpu in summaries if gpu.attempt_id == attempt.pk]
        steps = splits.get(attempt.pk, StepSplit())
        findings = None
        if seconds is not None:
            signals = _signals(attempt=attempt, gpus=gpus, steps=steps)
            findings = diagnosis.diagnose(seconds.as_accounting(), signals)
        items.append(
            AttemptTelemetry(
                attempt=attempt, accounting=seconds, steps=steps, gpus=gpus, findings=findings
            )
        )
    return RunTelemetry(
        attempts=items,
        resolution=resolution,
        gpu_series=gpu_activity_series(numbers=numbers, resolution=resolution),
        step_series=step_split_series(attempt_ids=attempt_ids, resolution=resolution),
        checkpoints=run_checkpoint_marks(run_id=run.pk, numbers=numbers),
    )


# Goodput of a tenant. An attempt counts on the day it finished: only then is its accounting
# final (the lost time depends on how it ended and on the next attempt), so a past day's
# numbers do not move while later attempts run. A long attempt therefore lands whole on its
# last day.


class GoodputPeriod(TextChoices):
    DAY = "day", "Per day"
    WEEK = "week", "Per week"


_PERIOD_TRUNC = {GoodputPeriod.DAY: TruncDay, GoodputPeriod.WEEK: TruncWeek}


def _accounting_finished(
    *, tenant: Tenant, since: datetime, until: datetime
) -> QuerySet[AttemptAccounting]:
    return AttemptAccounting.objects.filter(
        attempt__run__tenant=tenant,
        attempt__finished_at__gte=since,
        attempt__finished_at__lt=until,
    )


def period_starts(*, first: date, last: date, period: GoodputPeriod) -> list[date]:
    """The first day of every day or week (Monday) from ``first`` through ``last``."""
    start = first - timedelta(days=first.weekday()) if period == GoodputPeriod.WEEK else first
    step = timedelta(weeks=1) if period == GoodputPeriod.WEEK else timedelta(days=1)
    starts = []
    while start <= last:
        starts.append(start)
        start += step
    return starts


def goodput_by_period(
    *, tenant: Tenant, since: datetime, until: datetime, period: GoodputPeriod
) -> list[tuple[date, GpuSeconds]]:
    """The tenant's accounting per day or week (in the current time zone) of the attempts
    that finished in [since, until); every day or week of the range is listed, empty ones
    as zeros. One query."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .annotate(bucket=_PERIOD_TRUNC[period]("attempt__finished_at", output_field=DateField()))
        .values("bucket")
        .annotate(**_ACCOUNTING_SUMS)
        .order_by("bucket")
    )
    found = {row["bucket"]: GpuSeconds.from_sums(row) for row in rows}
    first = timezone.localtime(since).date()
    last = timezone.localtime(until - timedelta(microseconds=1)).date()
    return [
        (start, found.get(start, GpuSeconds()))
        for start in period_starts(first=first, last=last, period=period)
    ]


# The columns of AttemptAccounting summed in SQL (telemetry.goodput), and their types.
RUN_SUM_COLUMNS = {
    "allocated": "allocated_gpu_s",
    **{name: f"{name}_gpu_s" for name in accounting.CATEGORIES},
    "activity_weighted": "activity_weighted_gpu_s",
    "queue_s": "queue_s",
}
RUN_SUM_TYPES: dict[str, type] = {
    **dict.fromkeys(("allocated", *accounting.CATEGORIES, "attempts"), int),
    "activity_weighted": float,
    "queue_s": float,
}


def goodput_by_user(
    *, tenant: Tenant, since: datetime, until: datetime
) -> list[tuple[str, GpuSeconds]]:
    """(username, accounting) per user who submitted the runs, most allocated first."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .values("attempt__run__submitted_by_id", "attempt__run__submitted_by__username")
        .annotate(**_ACCOUNTING_SUMS)
        # The plugin does not see annotations passed as **kwargs (_ACCOUNTING_SUMS).
        .order_by("-allocated", "attempt__run__submitted_by__username")  # type: ignore[misc]
    )
    return [
        (row["attempt__run__submitted_by__username"], GpuSeconds.from_sums(row)) for row in rows
    ]


def goodput_by_project(
    *, tenant: Tenant, since: datetime, until: datetime
) -> list[tuple[str, str, GpuSeconds]]:
    """(project slug, name, accounting) per project of the runs' experiments, most
    allocated first."""
    rows = (
        _accounting_finished(tenant=tenant, since=since, until=until)
        .values(
            "attempt__run__experiment__project_id",
            "attempt__run__experiment__project__slug",
            "attempt__run__experiment__project__name",
        )
        .annotate(**_ACCOUNTING_SUMS)
        # The plugin does not see annotations passed as **kwargs (_ACCOUNTING_SUMS).
        .order_by("-allocated", "attempt__run__experiment__project__slug")  # type: ignore[misc]
    )
    return [
        (
            row["attempt__run__experiment__project__slug"],
            row["attempt__run__experiment__project__name"],
            GpuSeconds.from_sums(row),
        )
        for row in rows
    ]


# Unmapped samples (platform admins): GPU use outside Gantry, or a mapping gap.


@dataclass(frozen=True, slots=True)
class UnmappedTotal:
    source: str
    last_day: int
    last_week: int
    last_seen: datetime


def unmapped_totals_by_source(*, now: datetime) -> list[UnmappedTotal]:
    """Per source, the unmapped samples of the last 24 hours and 7 days, most first."""
    day_ago, week_ago = now - timedelta(days=1), now - timedelta(days=7)
    rows = (
        UnmappedSamples.objects.filter(minute__gte=week_ago, minute__lte=now)
        .values("source")
        .annotate(
            last_week=Sum("count"),
            last_day=Coalesce(Sum("count", filter=Q(minute__gte=day_ago)), 0),
            last_seen=Max("minute"),
        )
        .order_by("-last_week", "source")
    )
    return [UnmappedTotal(**row) for row in rows]


def unmapped_samples_recent() -> QuerySet[UnmappedSamples]:
    return UnmappedSamples.objects.order_by("-minute", "source")
