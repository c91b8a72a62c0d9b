"""Writes of the telemetry app: SDK events and per-attempt accounting.

Every write is idempotent: SDK events and step windows are keyed by (attempt, source, seq),
minute rollups by (attempt, host, GPU, minute), accounting by attempt; running a write
again gives the same rows.
"""

from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction

from django.db import transaction
from django.utils import timezone

from clusters.backends import CheckpointReport
from jobs.models import Attempt, AttemptState, Checkpoint
from jobs.selectors.runs import attempt_token_refusal
from jobs.services.backend_sync import checkpoints_record
from telemetry import accounting, sdk_events
from telemetry.models import (
    SOURCE_MAX_LENGTH,
    AttemptAccounting,
    GpuMinute,
    SdkEvent,
    StepWindow,
)
from telemetry.selectors.finished_attempts import attempts_pending_accounting

MAX_EVENTS_PER_BATCH = 500
MAX_EVENTS_BODY_BYTES = 256 * 1024


class AttemptClosed(Exception):
    """The attempt is no longer live: its events (checkpoints above all, which a requeued
    run resumes from) are settled, as its token is dead."""


@dataclass(frozen=True, slots=True)
class IngestResult:
    accepted: int
    duplicates: int
    rejected: int


# --- SDK events -------------------------------------------------------------------------


def _moment(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


def _parse_event(raw, *, attempt: Attempt, source: str) -> tuple[int, StepWindow | SdkEvent] | None:
    """One event of a batch as an unsaved row, or None when it is unknown or malformed
    (``sdk_events.EVENT_SCHEMA``, and a step window may not end before it starts)."""
    if not sdk_events.EVENT.is_valid(raw):
        return None
    seq, ts, kind = raw["seq"], _moment(raw["ts"]), raw["type"]
    if kind == sdk_events.STEP_WINDOW:
        start, end = _moment(raw["start"]), _moment(raw["end"])
        if start > end:
            return None
        return seq, StepWindow(
            attempt=attempt,
            source=source,
            seq=seq,
            start=start,
            end=end,
            steps=raw["steps"],
            step_time_s=float(raw["step_time_s"]),
            data_wait_s=float(raw.get("data_wait_s", 0.0)),
            comm_wait_s=float(raw.get("comm_wait_s", 0.0)),
            checkpoint_s=float(raw.get("checkpoint_s", 0.0)),
            step=raw.get("step"),
        )
    payload = {}
    if kind != sdk_events.READY:
        payload = {"step": raw["step"], "uri": raw["uri"], "seconds": float(raw["seconds"])}
    return seq, SdkEvent(attempt=attempt, source=source, seq=seq, type=kind, ts=ts, payload=payload)


def sdk_events_ingest(*, attempt: Attempt, source: str, events: list) -> IngestResult:
    """Store one SDK batch of ``attempt``: valid new events are kept, a ``seq`` already
    stored for (attempt, source) is a duplicate, anything malformed or unknown is rejected.
    New ``checkpoint_saved`` events are recorded as the run's checkpoints too, which a
    requeued run resumes from. Raises ``AttemptClosed`` once the attempt is no longer live,
    so an ended attempt adds no checkpoint a later attempt could resume from."""
    if not 1 <= len(source) <= SOURCE_MAX_LENGTH:
        raise ValueError("source must be 1-64 characters")
    if len(events) > MAX_EVENTS_PER_BATCH:
        raise ValueError(f"At most {MAX_EVENTS_PER_BATCH} events per batch.")
    attempt.refresh_from_db(fields=["state"])
    refusal = attempt_token_refusal(attempt)
    if refusal is not None:
        raise AttemptClosed(refusal)
    rejected = 0
    parsed: dict[int, StepWindow | SdkEvent] = {}
    repeated = 0
    for raw in events:
        row = _parse_event(raw, attempt=attempt, source=source)
        if row is None:
            rejected += 1
        elif row[0] in parsed:
            repeated += 1  # the same seq twice in one batch: keep the first
        else:
            parsed[row[0]] = row[1]
    with transaction.atomic():
        stored = set(
            StepWindow.objects.filter(
                attempt=attempt, source=source, seq__among=list(parsed)
            ).values_list("seq", flat=True)
        ) | set(
            SdkEvent.objects.filter(
                attempt=attempt, source=source, seq__among=list(parsed)
            ).values_list("seq", flat=True)
        )
        new = [row for seq, row in parsed.items() if seq not in stored]
        StepWindow.objects.bulk_create(
            [row for row in new if isinstance(row, StepWindow)], ignore_conflicts=True
        )
        SdkEvent.objects.bulk_create(
            [row for row in new if isinstance(row, SdkEvent)], ignore_conflicts=True
        )
        checkpoints_record(
            attempt=attempt,
            reports=[
                CheckpointReport(
                    step=row.payload["step"],
                    uri=row.payload["uri"],
                    saved_at=row.ts,
                    save_seconds=row.payload["seconds"],
                )
                for row in new
                if isinstance(row, SdkEvent) and row.type == SdkEvent.Type.CHECKPOINT_SAVED
            ],
        )
    return IngestResult(
        accepted=len(new), duplicates=repeated + len(parsed) - len(new), rejected=rejected
    )


# --- accounting ------------------------------------------------------------------------------

_OUTCOMES: dict[str, accounting.Outcome] = {
    AttemptState.SUCCEEDED: accounting.Outcome.SUCCEEDED,
    AttemptState.FAILED: accounting.Outcome.FAILED,
    AttemptState.PREEMPTED: accounting.Outcome.PREEMPTED,
    AttemptState.LOST: accounting.Outcome.LOST,
    AttemptState.CANCELLED: accounting.Outcome.CANCELLED,
}


def _unix(moment: datetime) -> Fraction:
    """Exact Unix seconds of an aware datetime, microseconds included."""
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return Fraction(delta.days * 86400 + delta.seconds) + Fraction(delta.microseconds, 10**6)


def attempt_timeline(*, attempt: Attempt) -> accounting.AttemptTimeline:
    """The plain-data timeline of a finished attempt, from its rows and its telemetry."""
    end = attempt.finished_at or timezone.now()
    start = attempt.started_at or end
    resumed = None
    following = (
        Attempt.objects.filter(run_id=attempt.run_id, number=attempt.number + 1)
        .select_related("resumed_from")
        .first()
    )
    if following is not None and following.resumed_from is not None:
        checkpoint = following.resumed_from
        if checkpoint.attempt_id == attempt.pk:
            resumed = accounting.ResumedCheckpoint(
                step=checkpoint.step, saved_at=_unix(checkpoint.saved_at)
            )
    windows = [
        accounting.StepWindow(
            start=_unix(window.start),
            end=_unix(window.end),
            steps=window.steps,
            step_time_s=window.step_time_s,
            data_wait_s=window.data_wait_s,
            comm_wait_s=window.comm_wait_s,
            checkpoint_s=window.checkpoint_s,
        )
        for window in StepWindow.objects.filter(attempt=attempt).order_by("start", "source", "seq")
    ]
    blocked: list[tuple[Fraction, Fraction]] = []
    sdk_saved_steps = set()
    for event in SdkEvent.objects.filter(
        attempt=attempt,
        type__in=(SdkEvent.Type.CHECKPOINT_SAVED, SdkEvent.Type.CHECKPOINT_RESTORED),
    ):
        finished_at = _unix(event.ts)
        blocked.append((finished_at - Fraction(repr(event.payload["seconds"])), finished_at))
        if event.type == SdkEvent.Type.CHECKPOINT_SAVED:
            sdk_saved_steps.add(event.payload["step"])
    # A save the SDK reported is also a Checkpoint row: count it once, as the SDK timed it.
    for saved_at, save_seconds in (
        Checkpoint.objects.filter(attempt=attempt, save_seconds__gt=0)
        .exclude(step__among=list(sdk_saved_steps))
        .values_list("saved_at", "save_seconds")
    ):
        blocked.append((_unix(saved_at) - Fraction(repr(save_seconds)), _unix(saved_at)))
    activity: dict[str, dict[int, float]] = {}
    for host, gpu, minute, value in GpuMinute.objects.filter(
        attempt=attempt, activity__isnull=False
    ).values_list("host", "gpu", "minute", "activity"):
        assert value is not None  # filtered on activity__isnull=False
        activity.setdefault(f"{host}/{gpu}", {})[int(_unix(minute))] = value
    # Queue time: a run's first attempt waited from the run's submission, a later one
    # from its creation at re-admission.
    queued_since = attempt.run.submitted_at if attempt.number == 1 else attempt.created_at
    return accounting.AttemptTimeline(
        gpus=attempt.run.gpus,
        start=_unix(start),
        end=_unix(end),
        outcome=_OUTCOMES.get(attempt.state, accounting.Outcome.FAILED),
        resumed_checkpoint=resumed,
        step_windows=windows,
        checkpoint_intervals=blocked,
        activity=activity,
        submitted_at=_unix(queued_since) if attempt.started_at and queued_since else None,
    )


def accounting_compute(*, attempt: Attempt, now: datetime | None = None) -> AttemptAccounting:
    """Compute the attempt's accounting from its telemetry and store it, replacing the
    previous result. Recomputing from the same data gives the same values."""
    now = now or timezone.now()  # taken before reading: later data makes it pending again
    attempt = Attempt.objects.select_related("run").get(pk=attempt.pk)
    result = accounting.account(attempt_timeline(attempt=attempt))
    whole = result.whole_seconds()
    values = {
        "allocated_gpu_s": whole["allocated"],
        "effective_gpu_s": whole["effective"],
        **{f"{name}_gpu_s": whole[name] for name in accounting.WASTE},
        "activity_weighted_gpu_s": round(result.active_gpu_hours * 3600, 3),
        "queue_s": None if result.queue_s is None else round(float(result.queue_s), 3),
        "computed_at": now,
    }
    row, _ = AttemptAccounting.objects.update_or_create(attempt=attempt, defaults=values)
    return row


def accounting_compute_pending(*, limit: int = 200) -> int:
    """Account finished attempts that have no accounting yet or whose data changed since
    (new step windows, events or minutes, or a next attempt that may resume from one of
    their checkpoints). Returns how many were computed."""
    computed = 0
    for attempt in attempts_pending_accounting(limit=limit):
        accounting_compute(attempt=attempt)
        computed += 1
    return computed
