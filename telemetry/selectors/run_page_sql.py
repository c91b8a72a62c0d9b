"""The reads of a run's telemetry page, each written twice: in hand-written SQL, which
PostgreSQL runs, and through the ORM, which SQLite runs (the twins below say why); and
the plain values they return."""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, tzinfo
from itertools import groupby
from typing import Any

from django.db import connection, models
from django.db.models import Avg, Count, F, FloatField, Max, Q, Sum
from django.db.models.functions import TruncDay, TruncHour, TruncMinute
from django.utils import timezone

from jobs.durations import duration_text
from jobs.models import Attempt, Checkpoint
from telemetry import accounting
from telemetry.models import AttemptAccounting, GpuMinute, SdkEvent, StepWindow
from telemetry.selectors.gpu_seconds import GpuSeconds

STEP_PART_LABELS = {
    "compute": "Compute",
    "data_wait": "Data wait",
    "comm_wait": "Communication wait",
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
    dram_minutes: int = 0  # minutes with a DRAM activity value
    mean_dram_active: float | None = None
    nvlink_minutes: int = 0  # minutes with an NVLink traffic value
    mean_nvlink_bytes_s: float | None = None

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
        "COUNT(*) FILTER (WHERE xid <> 0), COUNT(dram_active), AVG(dram_active), "
        "COUNT(nvlink_bytes_s), AVG(nvlink_bytes_s) "
        f"FROM {_table(GpuMinute)} WHERE attempt_id = ANY(%s) GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
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
            dram_minutes=Count("dram_active"),
            mean_dram_active=Avg("dram_active"),
            nvlink_minutes=Count("nvlink_bytes_s"),
            mean_nvlink_bytes_s=Avg("nvlink_bytes_s"),
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
