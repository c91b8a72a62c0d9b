"""The admission cycle: snapshot, pure decision, apply it, one admitter at a time."""

import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from clusters.models import Cluster
from core import metrics
from core.bulk import rows_update
from jobs import admission, backfill
from jobs.admission_types import Decisions, Shadow
from jobs.enqueue import admission_kick_clear, attempt_submit_enqueue
from jobs.models import (
    AdmissionState,
    Attempt,
    Checkpoint,
    Run,
    RunState,
)
from jobs.selectors.queue import admission_fingerprint, admission_snapshot, gpus_held
from jobs.services.lifecycle import WAIT_MESSAGE_MAX_LENGTH, run_preempt, run_transition
from jobs.services.usage import fair_share_update

ADMISSION_LOCK_KEY = 0x67616E747279  # "gantry"
# An admitted run has started waiting for nothing: its estimate goes with the wait.
NO_START_ESTIMATE: dict[str, Any] = {
    "start_full_limits_at": None,
    "start_expected_at": None,
    "start_note": "",
    "start_nodes": [],
    "start_behind": [],
    "start_estimated_at": None,
}


def estimate_kept(run: Run) -> dict[str, Any]:
    """The estimates ``run`` is admitted with, which its admission clears: kept for the
    track record of its first start (``jobs.services.backend_sync``). A run that has started
    before keeps the record of its first start."""
    if run.started_at is not None:
        return {}
    return {
        "start_full_limits_was": run.start_full_limits_at,
        "start_expected_was": run.start_expected_at,
    }


@dataclass(frozen=True)
class AdmissionSummary:
    admitted: int
    preempted: int
    waiting: int  # -1: nothing changed since the last full cycle, so nothing was decided

    @property
    def skipped(self) -> bool:
        return self.waiting < 0


def _unchanged(inputs: tuple[str, datetime], *, now: datetime) -> bool:
    last = AdmissionState.objects.filter(pk=1).first()
    return (
        last is not None
        and last.fingerprint == inputs[0]
        and now < last.valid_until
        and now - last.decided_at < timedelta(seconds=settings.GANTRY_ADMISSION_FULL_EVERY_S)
    )


def admission_lock() -> bool:
    """One admitter at a time. PostgreSQL: a transaction-scoped advisory lock. SQLite takes
    its single write lock at BEGIN (IMMEDIATE transactions), which serializes admitters."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADMISSION_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def admission_run_cycle(*, now=None) -> AdmissionSummary | None:
    """Decide on every queued run and apply the decisions. None if another admitter runs.

    A cycle whose inputs are those of the last full one (``admission_fingerprint``), before
    the moment time alone changes a decision and within ``GANTRY_ADMISSION_FULL_EVERY_S``
    of it, stops after reading the fingerprint: the decisions would be the same, and they
    are in place. The fingerprint is read before the snapshot, so a change that commits in
    between makes the next cycle decide again rather than be missed."""
    started = time.perf_counter()
    # Before anything is read: a change committed from here on sends a cycle of its own.
    admission_kick_clear()
    summary = _admission_cycle_locked(now=now)
    if summary is not None:  # a cycle that found another admitter at work did nothing
        metrics.ADMISSION_CYCLE_SECONDS.observe(time.perf_counter() - started)
    return summary


@transaction.atomic
def _admission_cycle_locked(*, now=None) -> AdmissionSummary | None:
    if not admission_lock():
        return None
    now = now or timezone.now()
    inputs = admission_fingerprint(now=now)
    if inputs is not None and _unchanged(inputs, now=now):
        # Fair share still follows the clock (the pages show it): one aggregate query.
        fair_share_update(holding=gpus_held(), now=now)
        return AdmissionSummary(admitted=0, preempted=0, waiting=-1)
    written: dict[int, tuple[str, str]] = {}  # queued run -> its reason and message, stored
    snapshot, clusters = admission_snapshot(now=now, written=written)
    holding: dict[tuple[str, str], int] = defaultdict(int)
    for holder in snapshot.held:
        holding[(holder.tenant, holder.flavor)] += holder.gpus
    fair_share_update(holding=holding, now=now)
    decisions = admission.decide(snapshot)

    new_attempts = _admissions_apply(decisions, clusters=clusters, now=now)
    # After the admissions: each preempted run's job is cancelled for the reclaiming run's
    # attempt, which a backend that starts it first submits before that cancel.
    preempted = _preemptions_apply(decisions, new_attempts=new_attempts)
    _wait_reasons_write(decisions, written=written)
    attempt_submit_enqueue(attempt.pk for attempt in new_attempts)
    if inputs is not None:
        # Admissions and preemptions change what the next cycle reads: it decides in full.
        fingerprint = inputs[0] if not (new_attempts or preempted) else ""
        AdmissionState.objects.update_or_create(
            pk=1,
            defaults={"fingerprint": fingerprint, "valid_until": inputs[1], "decided_at": now},
        )
    return AdmissionSummary(
        admitted=len(new_attempts), preempted=preempted, waiting=len(decisions.waiting)
    )


def _admissions_apply(
    decisions: Decisions, *, clusters: Mapping[str, Cluster], now: datetime
) -> list[Attempt]:
    """Each admitted run moved to ADMITTED (if still queued) with its first or next attempt
    on the nodes chosen; returns the attempts created."""
    admitted_ids = [d.run_id for d in decisions.admitted]
    runs = Run.objects.select_related("flavor").filter(pk__among=admitted_ids).in_bulk()
    attempt_counts = dict(
        Attempt.objects.filter(run_id__among=admitted_ids)
        .values("run_id")
        .annotate(n=Count("id"))
        .values_list("run_id", "n")
    )
    latest_checkpoints = {
        checkpoint.run_id: checkpoint
        for checkpoint in Checkpoint.objects.filter(run_id__among=admitted_ids).order_by("step")
    }
    new_attempts = []
    for decision in decisions.admitted:
        run = runs[decision.run_id]
        cluster = clusters[decision.cluster]
        how = "borrowing idle GPUs (preemptible)" if decision.borrowed else "within its guarantee"
        if decision.over_budget:
            how += "; past its soft monthly budget"
        if decision.ahead_of is not None:
            # Backfilled: the head it passed is of its own tenant's line (admission_types.Admit).
            how += f"; started ahead of run {decision.ahead_of}: {decision.ahead_because}"
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
            )[:WAIT_MESSAGE_MAX_LENGTH],
            **NO_START_ESTIMATE,
            **estimate_kept(run),
        )
        if claimed:
            metrics.run_admitted(
                flavor=run.flavor.slug, submitted_at=run.submitted_at, admitted_at=now
            )
            new_attempts.append(
                Attempt.objects.create(
                    run=run,
                    number=attempt_counts.get(run.pk, 0) + 1,
                    cluster=cluster,
                    resumed_from=latest_checkpoints.get(run.pk),
                    placement=list(decision.nodes),
                    tighter_wait_s=decision.tighter_wait_s,
                )
            )
    return new_attempts


def _preemptions_apply(decisions: Decisions, *, new_attempts: list[Attempt]) -> int:
    """Each preempted run taken off its GPUs for the reclaiming run's new attempt; returns
    how many were."""
    preempted = 0
    if decisions.preempted:
        victims = Run.objects.filter(pk__among=[p.run_id for p in decisions.preempted]).in_bulk()
        reclaiming = {attempt.run_id: attempt for attempt in new_attempts}
        for preempt in decisions.preempted:
            preempted += run_preempt(
                run=victims[preempt.run_id],
                message=preempt.message,
                admin_detail=preempt.detail,
                for_attempt=reclaiming.get(preempt.by_run_id),
            )
    return preempted


def _wait_reasons_write(decisions: Decisions, *, written: Mapping[int, tuple[str, str]]) -> None:
    """Each waiting run's reason and message, with the GPUs held for it if it starves.

    Only reasons are written, and only where they changed (``written``, read with the
    snapshot): positions are counted when read (jobs.selectors.runs), so a run admitted
    ahead rewrites no row behind it."""
    reservations = {r.run_id: r for r in decisions.reservations}
    shadows = {shadow.run_id: shadow for shadow in decisions.shadows}
    changed = []
    for wait in decisions.waiting:
        message = wait.message
        if wait.run_id in reservations:
            held = reservations[wait.run_id]
            message += (
                f"; {held.gpus} GPUs on {held.cluster} ({', '.join(held.nodes)}) are held for it"
            )
        if wait.run_id in shadows:
            message = _with_ending(message, shadow_text(shadows[wait.run_id]))
        row = (wait.reason.value, message[:WAIT_MESSAGE_MAX_LENGTH])
        if written.get(wait.run_id, row) != row:
            changed.append((wait.run_id, *row))
    rows_update(Run, ["wait_reason", "wait_message"], changed, state=RunState.QUEUED)


def shadow_text(shadow: Shadow) -> str:
    """The start reserved for a waiting head, as its wait message ends: its nodes, and from
    when (UTC, as stored messages say every time; rounded up to the minute, so never
    earlier than reserved)."""
    where = f"; reserved: {', '.join(shadow.nodes)} on {shadow.cluster}"
    if shadow.at is None:
        return f"{where}, from when the runs there end (one has no maximum runtime)"
    return f"{where} from {backfill.clock(shadow.at)}"


def _with_ending(message: str, ending: str) -> str:
    """``message`` then ``ending``, within WAIT_MESSAGE_MAX_LENGTH: the message is cut, not
    the ending, which says what the run's page must show (the nodes and time reserved)."""
    return message[: max(0, WAIT_MESSAGE_MAX_LENGTH - len(ending))] + ending
