"""A workspace's own transitions: suspended (its GPUs released, its files kept) and resumed
(back through admission). Stop is ``run_cancel``, as for every run."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from core.types import UserLike, signed_in
from jobs.enqueue import admission_cycle_enqueue, attempt_cancel_enqueue
from jobs.models import Run, RunEvent, RunKind, RunState, Workspace
from jobs.services.lifecycle import run_transition
from tenants.services.audit import audit_record

# While its server runs: a workspace being started is suspended as soon as it runs.
SUSPENDABLE = (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)


def _workspace_locked(run: Run) -> tuple[Run, Workspace]:
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.kind != RunKind.INTERACTIVE:
        raise ValidationError({"run": f"Run {run.pk} is not a workspace."})
    return run, Workspace.objects.select_for_update().get(run=run)


@transaction.atomic
def workspace_suspend(*, run: Run, actor: UserLike | None, system_reason: str = "") -> Run:
    """Release a running workspace's GPUs and keep its files: its job is cancelled, and the
    sync that sees the job gone makes the run SUSPENDED (``workspace_settle_suspended``).
    Gantry suspends an idle workspace (``actor`` None, ``system_reason`` says why); its
    owner may suspend it too. Asking twice is harmless."""
    if (actor is None) != bool(system_reason):
        raise ValueError("Suspend either as a person (actor) or as Gantry (system_reason).")
    run, workspace = _workspace_locked(run)
    if actor is not None and run.submitted_by_id != actor.pk:
        raise PermissionDenied("Only its owner can suspend a workspace.")
    if run.state not in SUSPENDABLE or run.cancel_requested_at is not None:
        if workspace.suspended_at is not None and run.state in SUSPENDABLE:
            return run  # already being suspended
        raise ValidationError(
            {"state": f"The workspace is {run.get_state_display().lower()}: nothing to suspend."}
        )
    now = timezone.now()
    Workspace.objects.filter(pk=workspace.pk).update(suspended_at=now)
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=now)
    run.cancel_requested_at = now
    RunEvent.objects.create(
        run=run,
        from_state=run.state,
        to_state=run.state,
        reason="SUSPEND_REQUESTED",
        message=system_reason
        or f"Suspended by {actor.get_username()}: its GPUs are released, its files kept",  # type: ignore[union-attr]
        actor=None if actor is None else signed_in(actor),
    )
    if actor is not None:
        audit_record(
            actor=actor,
            action="workspace.suspend",
            target=f"run {run.pk}",
            tenant=run.tenant,
            before={"state": run.state},
            after={"state": run.state, "suspend_requested": True},
        )
    latest = run.attempts.order_by("-number").first()
    if latest is not None:
        attempt_cancel_enqueue(latest.pk)
    return run


def workspace_settle_suspended(*, run: Run, attempt) -> None:
    """The suspended workspace's job is gone: the run waits, holding nothing, for Resume."""
    run_transition(
        run=run,
        to=RunState.SUSPENDED,
        expected=SUSPENDABLE,
        reason="SUSPENDED",
        message="Suspended: its GPUs are released and its files kept; Resume queues it again",
        attempt=attempt,
        cancel_requested_at=None,
    )
    Workspace.objects.filter(run=run).update(attempt=None, host="", port=None)


@transaction.atomic
def workspace_resume(*, run: Run, actor: UserLike) -> Run:
    """Queue a suspended workspace again: admission decides when it starts (its estimate
    shows meanwhile), on whatever nodes are free; its files come back with it."""
    run, workspace = _workspace_locked(run)
    if run.submitted_by_id != actor.pk:
        raise PermissionDenied("Only its owner can resume a workspace.")
    if run.state != RunState.SUSPENDED:
        raise ValidationError(
            {"state": f"The workspace is {run.get_state_display().lower()}, not suspended."}
        )
    run_transition(
        run=run,
        to=RunState.QUEUED,
        expected=(RunState.SUSPENDED,),
        reason="RESUMED",
        message=f"Resumed by {actor.get_username()}: back in the queue",
        actor=actor,
        cluster=None,
        wait_reason="",
        wait_message="",
    )
    Workspace.objects.filter(pk=workspace.pk).update(
        attempt=None, host="", port=None, ready_at=None, warned_at=None, suspended_at=None
    )
    audit_record(
        actor=actor,
        action="workspace.resume",
        target=f"run {run.pk}",
        tenant=run.tenant,
        before={"state": RunState.SUSPENDED},
        after={"state": RunState.QUEUED},
    )
    admission_cycle_enqueue()
    run.refresh_from_db()
    return run
