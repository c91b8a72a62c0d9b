"""A finished attempt's timeline as plain data (``telemetry.accounting.AttemptTimeline``):
its rows and its telemetry, read for the accounting service."""

from datetime import UTC, datetime
from fractions import Fraction

from django.utils import timezone

from jobs.models import Attempt, AttemptState, Checkpoint
from telemetry import accounting
from telemetry.models import GpuMinute, SdkEvent, StepWindow, WorkspaceIdleSpan

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
    # A workspace's streaks idle on every signal; one still open ends with the attempt.
    unused = [
        (_unix(started_at), _unix(ended_at or end))
        for started_at, ended_at in WorkspaceIdleSpan.objects.filter(attempt=attempt).values_list(
            "started_at", "ended_at"
        )
    ]
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
        interactive_idle_intervals=unused,
        activity=activity,
        submitted_at=_unix(queued_since) if attempt.started_at and queued_since else None,
    )
