"""The admission cycle: snapshot, pure decision, apply it, one admitter at a time."""

from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from jobs import admission
from jobs.enqueue import attempt_submit_enqueue
from jobs.models import (
    Attempt,
    Checkpoint,
    Run,
    RunState,
)
from jobs.selectors.queue import admission_snapshot
from jobs.services.bulk import rows_update
from jobs.services.lifecycle import run_preempt, run_transition
from jobs.services.usage import fair_share_update

ADMISSION_LOCK_KEY = 0x67616E747279  # "gantry"


@dataclass(frozen=True)
class AdmissionSummary:
    admitted: int
    preempted: int
    waiting: int


def admission_lock() -> bool:
    """One admitter at a time. PostgreSQL: a transaction-scoped advisory lock. SQLite takes
    its single write lock at BEGIN (IMMEDIATE transactions), which serializes admitters."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADMISSION_LOCK_KEY])
        return bool(cursor.fetchone()[0])


@transaction.atomic
def admission_run_cycle(*, now=None) -> AdmissionSummary | None:
    """Decide on every queued run and apply the decisions. None if another admitter runs."""
    if not admission_lock():
        return None
    now = now or timezone.now()
    snapshot, clusters = admission_snapshot(now=now)
    fair_share_update(held=snapshot.held, now=now)
    decisions = admission.decide(snapshot)

    preempted = 0
    if decisions.preempted:
        victims = Run.objects.in_bulk([p.run_id for p in decisions.preempted])
        for preempt in decisions.preempted:
            preempted += run_preempt(
                run=victims[preempt.run_id], message=preempt.message, admin_detail=preempt.detail
            )

    admitted_ids = [d.run_id for d in decisions.admitted]
    runs = Run.objects.select_related("flavor").in_bulk(admitted_ids)
    attempt_counts = dict(
        Attempt.objects.filter(run_id__in=admitted_ids)
        .values("run_id")
        .annotate(n=Count("id"))
        .values_list("run_id", "n")
    )
    latest_checkpoints = {
        checkpoint.run_id: checkpoint
        for checkpoint in Checkpoint.objects.filter(run_id__in=admitted_ids).order_by("step")
    }
    new_attempts = []
    for decision in decisions.admitted:
        run = runs[decision.run_id]
        cluster = clusters[decision.cluster]
        how = "borrowing idle GPUs (preemptible)" if decision.borrowed else "within its guarantee"
        if decision.over_budget:
            how += "; past its soft monthly budget"
        claimed = run_transition(
            run=run,
            to=RunState.ADMITTED,
            expected=(RunState.QUEUED,),
            reason="ADMITTED",
            message=(
                f"Admitted to {cluster.name} on {', '.join(decision.nodes)}: "
                f"{run.gpus} {run.flavor.slug} GPUs {how}"
            ),
            cluster=cluster,
            admitted_at=now,
            borrowed=decision.borrowed,
            over_budget=decision.over_budget,
            wait_reason="",
            wait_message=(
                f"Placed on {cluster.name} ({', '.join(decision.nodes)}); being submitted"
            )[:500],
            queue_position=None,
        )
        if claimed:
            new_attempts.append(
                Attempt.objects.create(
                    run=run,
                    number=attempt_counts.get(run.pk, 0) + 1,
                    cluster=cluster,
                    resumed_from=latest_checkpoints.get(run.pk),
                    placement=list(decision.nodes),
                )
            )
    reservations = {r.run_id: r for r in decisions.reservations}
    written = {
        run_id: (reason, message, position)
        for run_id, reason, message, position in Run.objects.filter(
            state=RunState.QUEUED
        ).values_list("id", "wait_reason", "wait_message", "queue_position")
    }
    changed = []
    for wait in decisions.waiting:
        message = wait.message
        if wait.run_id in reservations:
            held = reservations[wait.run_id]
            message += (
                f"; {held.gpus} GPUs on {held.cluster} ({', '.join(held.nodes)}) are held for it"
            )
        row = (wait.reason.value, message[:500], wait.position)
        if written.get(wait.run_id, row) != row:
            changed.append((wait.run_id, *row))
    rows_update(
        Run, ["wait_reason", "wait_message", "queue_position"], changed, state=RunState.QUEUED
    )
    attempt_submit_enqueue(attempt.pk for attempt in new_attempts)
    return AdmissionSummary(
        admitted=len(new_attempts), preempted=preempted, waiting=len(decisions.waiting)
    )
