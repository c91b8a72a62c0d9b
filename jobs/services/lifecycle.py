"""Run and attempt state transitions: the one way a state changes, cancels and preemptions."""

from collections.abc import Iterable

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from core.types import UserLike, signed_in
from jobs.access import run_can_cancel
from jobs.enqueue import admission_cycle_enqueue, attempt_cancel_enqueue
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Run,
    RunEvent,
    RunState,
    WaitReason,
    Workspace,
)
from tenants.models import max_length_of
from tenants.services.audit import audit_record

WAIT_MESSAGE_MAX_LENGTH = max_length_of(Run, "wait_message")


def run_transition(
    *,
    run: Run,
    to: RunState,
    expected: Iterable[RunState],
    reason: str,
    message: str = "",
    admin_detail: str = "",
    actor: UserLike | None = None,
    attempt: Attempt | None = None,
    **fields,
) -> bool:
    """Move a run to ``to`` only if it is still in one of ``expected``; record the event.

    The conditional UPDATE is the claim: of two workers acting on the same run, one wins.
    ``message`` is read by everyone who may see the run; ``admin_detail``, when given, is
    the text platform admins read instead (it may name other tenants and their runs).
    """
    expected = tuple(expected)
    updated = Run.objects.filter(pk=run.pk, state__in=expected).update(state=to, **fields)
    if not updated:
        return False
    from_state = run.state if run.state in expected else ""
    RunEvent.objects.create(
        run=run,
        attempt=attempt,
        from_state=from_state,
        to_state=to,
        reason=reason,
        message=message,
        admin_detail=admin_detail,
        actor=None if actor is None else signed_in(actor),
    )
    run.state = to
    for name, value in fields.items():
        setattr(run, name, value)
    return True


@transaction.atomic
def run_cancel(*, run: Run, actor: UserLike | None, system_reason: str = "") -> Run:
    """Cancel a run: at once if it holds no backend job yet, else through the backend.

    A run and its attempt end together: a run whose job is still on the cluster (running,
    or preempted with the job not yet gone) is only marked as cancel requested here, and
    ends as cancelled when the sync sees its attempt end. Cancelling it at once would leave
    a cancelled run with a running attempt (and the job on the cluster unaccounted for).

    Gantry itself cancels (a tenant's idle-GPU policy) with ``actor`` None and a
    ``system_reason``: that becomes the message of the run's event, and no person's
    permission is checked. A person's cancel is audited as "run.cancel" (Gantry's are in
    the run's timeline only).
    """
    if (actor is None) != bool(system_reason):
        raise ValueError("Cancel either as a person (actor) or as Gantry (system_reason).")
    if actor is not None and not run_can_cancel(user=actor, run=run):
        raise PermissionDenied("Only the submitter, a tenant admin or a platform admin can cancel.")
    run = Run.objects.select_for_update().get(pk=run.pk)
    now = timezone.now()
    before = {"state": run.state, "cancel_requested": run.cancel_requested_at is not None}
    latest = run.attempts.order_by("-number").first()
    job_on_cluster = latest is not None and latest.state in LIVE_ATTEMPT_STATES
    waiting = (RunState.QUEUED, RunState.ADMITTED, RunState.PREEMPTED, RunState.SUSPENDED)
    if run.state in waiting and not (run.state == RunState.PREEMPTED and job_on_cluster):
        run_transition(
            run=run,
            to=RunState.CANCELLED,
            expected=waiting,
            reason="CANCELLED",
            message=(
                system_reason
                if actor is None
                else f"Stopped by {actor.get_username()} while suspended"
                if run.state == RunState.SUSPENDED
                else f"Cancelled by {actor.get_username()} before it reached the cluster"
            ),
            actor=actor,
            finished_at=now,
            cancel_requested_at=now,
            failure_reason="CANCELLED",
            wait_reason="",
            wait_message="",
        )
        Attempt.objects.filter(run=run, state=AttemptState.CREATED).update(
            state=AttemptState.CANCELLED, finished_at=now, failure_reason="CANCELLED"
        )
        _run_cancel_audit(run=run, actor=actor, before=before)
        admission_cycle_enqueue()
        return run
    if run.state in (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING, RunState.PREEMPTED):
        # Stopped while being suspended: it ends cancelled, not suspended.
        if Workspace.objects.filter(run=run, suspended_at__isnull=False).update(suspended_at=None):
            run.cancel_requested_at = None
        if run.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=now)
            run.cancel_requested_at = now
            RunEvent.objects.create(
                run=run,
                from_state=run.state,
                to_state=run.state,
                reason="CANCEL_REQUESTED",
                message=(
                    system_reason
                    if actor is None
                    else f"Cancel requested by {actor.get_username()}"
                ),
                actor=None if actor is None else signed_in(actor),
            )
            _run_cancel_audit(run=run, actor=actor, before=before)
            assert latest is not None  # a run that was submitted has an attempt
            # A preempted run's job is being cancelled already; asking again is harmless.
            attempt_cancel_enqueue(latest.pk)
        return run
    raise ValidationError({"state": f"The run is already {run.get_state_display().lower()}."})


def _run_cancel_audit(*, run: Run, actor: UserLike | None, before: dict) -> None:
    if actor is None:
        return
    audit_record(
        actor=actor,
        action="run.cancel",
        target=f"run {run.pk}",
        tenant=run.tenant,
        before=before,
        after={"state": run.state, "cancel_requested": True},
    )


def run_preempt(
    *,
    run: Run,
    message: str,
    admin_detail: str = "",
    for_attempt: Attempt | None = None,
    actor: UserLike | None = None,
) -> int:
    """Take a borrowed run off its GPUs. It is requeued once its backend job is gone and
    resumes from its latest checkpoint when admitted again. ``message`` names no other
    tenant; ``admin_detail`` (platform admins only) may say who reclaimed the GPUs.
    ``for_attempt``: the reclaiming run's attempt; on a backend that starts it first, the
    job here is cancelled once that one was submitted (``attempt_cancel``). ``actor``: the
    person who asked for it (a restart excluding a node), in the run's timeline."""
    holding = (RunState.ADMITTED, RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
    if not run_transition(
        run=run,
        to=RunState.PREEMPTED,
        expected=holding,
        reason="PREEMPTED",
        message=message,
        admin_detail=admin_detail,
        actor=actor,
    ):
        return 0
    attempt = run.attempts.order_by("-number").first()
    if attempt is None or attempt.state == AttemptState.CREATED:
        if attempt is not None:
            Attempt.objects.filter(pk=attempt.pk).update(
                state=AttemptState.PREEMPTED, finished_at=timezone.now(), failure_reason="PREEMPTED"
            )
        run_requeue_after_preemption(run=run, attempt=attempt)
        return 1
    if for_attempt is not None:
        Attempt.objects.filter(pk=attempt.pk).update(preempted_for=for_attempt)
    attempt_cancel_enqueue(attempt.pk)
    return 1


def run_requeue_after_preemption(*, run: Run, attempt: Attempt | None) -> None:
    checkpoint = run.checkpoints.order_by("-step").first()
    resume = f"; it will resume from checkpoint step {checkpoint.step}" if checkpoint else ""
    run_transition(
        run=run,
        to=RunState.QUEUED,
        expected=(RunState.PREEMPTED,),
        reason="REQUEUED",
        message=f"Back in the queue after preemption{resume}",
        attempt=attempt,
        cluster=None,
        borrowed=False,
    )
    admission_cycle_enqueue()


def pending_message(*, attempt: Attempt, why: str = "") -> str:
    """Why a run the backend holds has not started, in the backend's words."""
    cluster = attempt.cluster
    why = why or "waiting for it to start the job"
    where = f"; placed on {', '.join(attempt.placement)}" if attempt.placement else ""
    return f"Pending at {cluster.get_backend_display()} ({cluster.name}): {why}{where}"


def attempt_accept(
    *, attempt: Attempt, job_id: str, now, found_by_sync: bool = False
) -> tuple[bool, bool]:
    """Record that the backend holds the attempt's job: the attempt goes from SUBMITTING to
    PENDING with the job's id, its run with it. Returns (attempt moved, run moved).

    The submit that created the job records it, or, when that worker died in between, the
    sync that finds the job (before the re-driven submit would adopt it): the conditional
    UPDATE lets exactly one of them write the id and the run's event.
    """
    moved = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.SUBMITTING).update(
        state=AttemptState.PENDING,
        backend_job_id=job_id,
        submitted_at=now,
        last_seen_at=now,
        backend_error="",
    )
    if not moved:
        return False, False
    attempt.state, attempt.backend_job_id = AttemptState.PENDING, job_id
    found = " (found by the sync)" if found_by_sync else ""
    accepted = run_transition(
        run=attempt.run,
        to=RunState.PENDING,
        expected=(RunState.SUBMITTING,),
        reason="SUBMITTED",
        message=f"{attempt.cluster.name} accepted job {job_id}{found}",
        attempt=attempt,
        wait_reason=WaitReason.BACKEND,
        wait_message=pending_message(attempt=attempt)[:WAIT_MESSAGE_MAX_LENGTH],
    )
    return True, accepted
