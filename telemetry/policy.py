"""The tenants' idle-GPU policy: warn the submitter of a run whose GPUs have been idle for
a tenant's number of minutes, cancel the run after another. Off unless a tenant sets it.

Every action is an event of the run. Whether an attempt stands warned is read from those
events: its latest ``IDLE_WARNING`` or ``IDLE_CLEARED`` event says, so a streak is warned
once, and the run's timeline tells the whole story. Each action is decided again under
the run's row lock, so two enforcers never warn or cancel twice.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import F, Q, Window
from django.db.models.functions import DenseRank
from django.utils import timezone

from jobs.models import (
    IDLE_WARNING_EVENT,
    Attempt,
    AttemptState,
    Run,
    RunEvent,
    RunKind,
    RunState,
)
from jobs.services.lifecycle import run_cancel
from telemetry.accounting import IDLE_THRESHOLD
from telemetry.idle import IdleAction, IdleStreak, idle_action, idle_streak
from telemetry.models import GpuMinute
from tenants.models import Notification, Tenant
from tenants.services.notifications import notification_create

IDLE_CLEARED = "IDLE_CLEARED"


@dataclass(frozen=True, slots=True)
class IdlePolicySummary:
    checked: int  # running attempts of tenants with a policy
    warned: int
    cleared: int
    cancelled: int


def _percent(threshold: float) -> str:
    return f"{threshold * 100:g} %"


def _minutes(count: int) -> str:
    return "minute" if count == 1 else "minutes"


def _policy_on() -> Q:
    return Q(idle_notify_after_min__isnull=False) | Q(idle_cancel_after_min__isnull=False)


def idle_streaks(
    *, attempt_ids: list[int], now: datetime, limit: int
) -> dict[int, IdleStreak[datetime]]:
    """The idle streak of each attempt from its GPU minutes up to ``now``, counted up to
    ``limit`` minutes: only each attempt's latest ``limit`` minutes with data are read, so a
    run idle for days costs no more than that."""
    rows = (
        GpuMinute.objects.filter(
            attempt_id__among=attempt_ids, minute__lte=now, activity__isnull=False
        )
        .annotate(
            recency=Window(DenseRank(), partition_by=[F("attempt_id")], order_by=F("minute").desc())
        )
        .filter(recency__lte=limit)
        .order_by()
        .values_list("attempt_id", "minute", "activity")
    )
    samples: dict[int, list[tuple[datetime, float | None]]] = {}
    for attempt_id, minute, activity in rows:
        samples.setdefault(attempt_id, []).append((minute, activity))
    return {attempt_id: idle_streak(values) for attempt_id, values in samples.items()}


def _warned(*, attempt_ids: list[int]) -> set[int]:
    """Attempts whose latest idle-policy event is a warning."""
    latest: dict[int, str] = {}
    for attempt_id, reason in (
        RunEvent.objects.filter(
            attempt_id__among=attempt_ids, reason__in=(IDLE_WARNING_EVENT, IDLE_CLEARED)
        )
        .order_by("id")
        .values_list("attempt_id", "reason")
    ):
        latest[attempt_id] = reason
    return {attempt_id for attempt_id, reason in latest.items() if reason == IDLE_WARNING_EVENT}


def idle_policy_enforce(*, now: datetime | None = None) -> IdlePolicySummary:
    """Apply each tenant's idle-GPU policy to its running attempts: warn the submitter
    (a run event and a notification) once per idle streak, clear the warning when the
    streak ends, cancel the run through ``run_cancel`` once it reaches the cancel threshold.
    Idempotent: running it again with the same data does nothing more."""
    now = now or timezone.now()
    attempts = list(
        Attempt.objects.filter(
            state=AttemptState.RUNNING,
            run__state=RunState.RUNNING,
            run__cancel_requested_at__isnull=True,
            # Workspaces have their own policy, on every signal (telemetry/workspace_policy):
            # idle GPUs while a person edits a notebook are not a reason to cancel it.
            run__kind=RunKind.BATCH,
            run__tenant__in=Tenant.objects.filter(_policy_on()),
        ).select_related("run__tenant")
    )
    if not attempts:
        return IdlePolicySummary(checked=0, warned=0, cleared=0, cancelled=0)
    ids = [attempt.pk for attempt in attempts]
    limit = max(
        max(
            attempt.run.tenant.idle_notify_after_min or 0,
            attempt.run.tenant.idle_cancel_after_min or 0,
        )
        for attempt in attempts
    )
    streaks = idle_streaks(attempt_ids=ids, now=now, limit=limit)
    warned = _warned(attempt_ids=ids)
    done = dict.fromkeys(IdleAction, 0)
    for attempt in attempts:
        tenant = attempt.run.tenant
        streak = streaks.get(attempt.pk, IdleStreak(minutes=0))
        planned = idle_action(
            streak=streak.minutes,
            notify_after=tenant.idle_notify_after_min,
            cancel_after=tenant.idle_cancel_after_min,
            warned=attempt.pk in warned,
        )
        if planned != IdleAction.NONE:
            action = _act(attempt=attempt, streak=streak, now=now)
            done[action] += 1
    return IdlePolicySummary(
        checked=len(attempts),
        warned=done[IdleAction.WARN],
        cleared=done[IdleAction.CLEAR],
        cancelled=done[IdleAction.CANCEL],
    )


@transaction.atomic
def _act(*, attempt: Attempt, streak: IdleStreak, now: datetime) -> IdleAction:
    """Decide again under the run's lock, from the policy and events as they are now, and
    act. Returns what was done."""
    run = (
        Run.objects.select_for_update()
        .select_related("tenant", "submitted_by", "experiment")
        .get(pk=attempt.run_id)
    )
    if (
        run.state != RunState.RUNNING
        or run.cancel_requested_at is not None
        or not Attempt.objects.filter(pk=attempt.pk, state=AttemptState.RUNNING).exists()
    ):
        return IdleAction.NONE
    tenant = run.tenant
    action = idle_action(
        streak=streak.minutes,
        notify_after=tenant.idle_notify_after_min,
        cancel_after=tenant.idle_cancel_after_min,
        warned=attempt.pk in _warned(attempt_ids=[attempt.pk]),
    )
    idle = f"{streak.minutes} idle {_minutes(streak.minutes)}"
    threshold = _percent(IDLE_THRESHOLD)
    run_name = f"Run {run.pk} ({run.experiment.name})"
    if action == IdleAction.WARN:
        cancel_after = tenant.idle_cancel_after_min
        then = f"; it cancels the run after {cancel_after} idle minutes" if cancel_after else ""
        _event(
            run=run,
            attempt=attempt,
            reason=IDLE_WARNING_EVENT,
            message=f"Idle GPUs: {idle} (threshold {threshold} activity). The idle-GPU policy "
            f"of tenant {tenant.slug} warned {run.submitted_by.get_username()}{then}.",
        )
        advice = (
            f"The idle-GPU policy of tenant {tenant.slug} cancels it after {cancel_after} idle "
            "minutes; cancel it yourself if it is done."
            if cancel_after
            else "Cancel it if it is done, so that others can use the GPUs."
        )
        notification_create(
            user=run.submitted_by,
            tenant=tenant,
            kind=Notification.Kind.IDLE_WARNING,
            message=f"{run_name} has had idle GPUs for {streak.minutes} "
            f"{_minutes(streak.minutes)} (below {threshold} activity). {advice}",
            now=now,
        )
    elif action == IdleAction.CLEAR:
        _event(
            run=run,
            attempt=attempt,
            reason=IDLE_CLEARED,
            message=f"Idle warning cleared: {idle} now, below the warning threshold of "
            f"{tenant.idle_notify_after_min} of the idle-GPU policy of tenant {tenant.slug}.",
        )
    elif action == IdleAction.CANCEL:
        run_cancel(
            run=run,
            actor=None,
            system_reason=f"Cancelled by the idle-GPU policy of tenant {tenant.slug}: {idle} "
            f"(threshold {threshold} activity)",
        )
        notification_create(
            user=run.submitted_by,
            tenant=tenant,
            kind=Notification.Kind.IDLE_CANCELLED,
            message=f"{run_name} was cancelled by the idle-GPU policy of tenant {tenant.slug}: "
            f"its GPUs were idle for {streak.minutes} {_minutes(streak.minutes)} (below "
            f"{threshold} activity).",
            now=now,
        )
    return action


def _event(*, run: Run, attempt: Attempt, reason: str, message: str) -> None:
    RunEvent.objects.create(
        run=run,
        attempt=attempt,
        from_state=run.state,
        to_state=run.state,
        reason=reason,
        message=message,
    )
