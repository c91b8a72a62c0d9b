"""What an attempt's end makes of it and its run: its cause class and evidence stored, and
the run succeeded, cancelled, requeued (a restart the user allowed, or a retry after a
hardware or platform fault, on other nodes) or failed."""

from datetime import datetime

from clusters.backends import JobStatus
from jobs.models import Attempt, AttemptState, CauseClass, Run, RunState
from jobs.selectors.node_health import health_policy_value
from jobs.selectors.workspace_state import workspace_suspending
from jobs.services.attribution import (
    attempt_cause,
    attempt_failures_check,
    excluded_after,
    give_up_words,
    retry_words,
)
from jobs.services.lifecycle import run_requeue_after_preemption, run_transition
from jobs.services.workspace_lifecycle import workspace_settle_suspended

Cause = tuple[str, dict[str, str]]


def attempt_cause_store(
    *, attempt: Attempt, status: JobStatus, state: str, reason: str, finished_at, now: datetime
) -> Cause:
    """Attribute the ended attempt and store its cause (kept when something set it first:
    the quarantine that took the attempt off its node knows better than its end); an
    attempt that failed for the program's reasons may make its nodes suspect."""
    if attempt.cause_class:
        return attempt.cause_class, dict(attempt.cause_evidence or {})
    cause, evidence = attempt_cause(
        attempt=attempt,
        state=state,
        failure_reason=reason,
        exit_code=status.exit_code,
        message=status.message,
        finished_at=finished_at,
        node_list=status.node_list,
    )
    if not cause:
        return cause, evidence
    stored = Attempt.objects.filter(pk=attempt.pk, cause_class="").update(
        cause_class=cause, cause_evidence=evidence
    )
    if not stored:
        cause, evidence = Attempt.objects.values_list("cause_class", "cause_evidence").get(
            pk=attempt.pk
        )
        return cause, evidence
    if state == AttemptState.FAILED:
        if status.node_list:
            attempt.node_list = list(status.node_list)
        attempt_failures_check(attempt=attempt, cause=cause, now=now)
    return cause, evidence


def preempted_run_settle(*, run: Run, attempt: Attempt, finished_at) -> None:
    """The run was preempted and this was its job being taken off: the attempt ends
    PREEMPTED and the run goes back to the queue, or ends if it was cancelled meanwhile."""
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.PREEMPTED, failure_reason="PREEMPTED"
    )
    if run.cancel_requested_at is None:
        run_requeue_after_preemption(run=run, attempt=attempt)
    else:  # cancelled while its job was being taken off: it ends here, not in the queue
        run_transition(
            run=run,
            to=RunState.CANCELLED,
            expected=(RunState.PREEMPTED,),
            reason="CANCELLED",
            message="Cancelled as requested",
            attempt=attempt,
            finished_at=finished_at,
            failure_reason="CANCELLED",
        )


def run_end(
    *,
    run: Run,
    attempt: Attempt,
    status: JobStatus,
    state: str,
    reason: str,
    finished_at,
    cause: Cause = ("", {}),
) -> None:
    """What the attempt's end makes of its live run: succeeded, cancelled, queued again for
    a retry after a hardware or platform fault or a restart it has left, or failed."""
    live_states = (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
    if workspace_suspending(run):
        # However its server ended once told to stop: the workspace waits for Resume.
        workspace_settle_suspended(run=run, attempt=attempt)
    elif state == AttemptState.SUCCEEDED:
        run_transition(
            run=run,
            to=RunState.SUCCEEDED,
            expected=live_states,
            reason="SUCCEEDED",
            message=status.message or "Finished successfully",
            attempt=attempt,
            finished_at=finished_at,
        )
    elif state == AttemptState.CANCELLED:
        run_transition(
            run=run,
            to=RunState.CANCELLED,
            expected=live_states,
            reason="CANCELLED",
            message="Cancelled on the cluster"
            if run.cancel_requested_at is None
            else "Cancelled as requested",
            attempt=attempt,
            finished_at=finished_at,
            failure_reason="CANCELLED",
        )
    elif cause[0] in (CauseClass.HARDWARE, CauseClass.PLATFORM) and run.cancel_requested_at is None:
        _run_retry(run=run, attempt=attempt, reason=reason, finished_at=finished_at, cause=cause)
    elif run.restarts < run.experiment.max_restarts and run.cancel_requested_at is None:
        run_transition(
            run=run,
            to=RunState.QUEUED,
            expected=live_states,
            reason=reason,
            message=(
                f"Attempt {attempt.number} ended {status.state} ({reason}); requeued, restart "
                f"{run.restarts + 1} of {run.experiment.max_restarts}"
            ),
            attempt=attempt,
            restarts=run.restarts + 1,
            cluster=None,
        )
    else:
        detail = f" exit code {status.exit_code}" if status.exit_code is not None else ""
        run_transition(
            run=run,
            to=RunState.FAILED,
            expected=live_states,
            reason=reason,
            message=f"Attempt {attempt.number} ended {status.state} ({reason}){detail}. "
            f"{status.message}".strip(),
            attempt=attempt,
            finished_at=finished_at,
            failure_reason=reason,
        )


def _run_retry(*, run: Run, attempt: Attempt, reason: str, finished_at, cause: Cause) -> None:
    """A hardware or platform fault ended the attempt: the run goes back to the queue to
    resume from its latest checkpoint on other nodes (the faulty one excluded), not counted
    against the user's ``max_restarts``; after the cluster's ``max_platform_retries`` such
    retries it fails, so a run cannot loop on broken hardware."""
    live_states = (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
    cause_class, evidence = cause
    limit = int(health_policy_value(attempt.cluster, "max_platform_retries"))
    if run.platform_retries < limit:
        step = run.checkpoints.order_by("-step").values_list("step", flat=True).first()
        run_transition(
            run=run,
            to=RunState.QUEUED,
            expected=live_states,
            reason=reason,
            message=retry_words(attempt=attempt, cause=cause_class, evidence=evidence, step=step),
            attempt=attempt,
            platform_retries=run.platform_retries + 1,
            excluded_nodes=excluded_after(run, cause_class, evidence),
            cluster=None,
        )
        return
    run_transition(
        run=run,
        to=RunState.FAILED,
        expected=live_states,
        reason=reason,
        message=give_up_words(attempt=attempt, cause=cause_class, evidence=evidence, limit=limit),
        attempt=attempt,
        finished_at=finished_at,
        failure_reason=reason,
        excluded_nodes=excluded_after(run, cause_class, evidence),
    )
