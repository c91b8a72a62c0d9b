"""Following the backends: inventory, status sync, cancels, checkpoints and runtime reports."""

import json
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from clusters.backends import (
    BackendError,
    CheckpointReport,
    JobRef,
    JobStatus,
    backend_for,
)
from clusters.backends.calls import backend_call
from clusters.models import Cluster
from core import metrics
from core.log_context import log_context
from jobs import reproducibility
from jobs.enqueue import admission_cycle_enqueue
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    RANK_VERSION_FIELDS,
    Attempt,
    AttemptState,
    Checkpoint,
    Run,
    RunEvent,
    RunState,
    WaitReason,
)
from jobs.selectors.runs import attempt_get_for_work, attempt_token_refusal
from jobs.services import attempt_end, rank_runtime
from jobs.services.lifecycle import (
    WAIT_MESSAGE_MAX_LENGTH,
    attempt_accept,
    pending_message,
    run_transition,
)
from jobs.services.usage import usage_record_attempt
from jobs.services.workspace_address import workspace_start_overdue
from tenants.models import max_length_of

logger = logging.getLogger(__name__)


MAX_RUNTIME_REPORT_BYTES = 64 * 1024

# A live attempt the backend still reports as it was gets its "last seen" written only once
# it is this old, not on every sync (every few seconds, for every live attempt): it only
# tells when the backend lost the job, and an attempt is declared LOST only after
# GANTRY_LOST_GRACE_S plus this.
LAST_SEEN_RESOLUTION = timedelta(seconds=15)


# Set by the sync that starts, for half a sync interval (``sync_slot_claim``).
SYNC_SLOT_KEY = "gantry:sync-slot"


def sync_slot_claim() -> bool:
    """Whether a sync may start now: none started in the last half sync interval. Beat sends
    one every interval, into the queue the submits share; copies that waited there behind a
    burst of submits, or behind a sync slower than its interval, reach the workers together
    (46 at once in the chaos test), and only the first of them syncs: the others would do
    the same work again. Expiring them instead would drop every copy while submits keep the
    queue busy. Without a cache that answers, every sync runs."""
    try:
        return bool(
            cache.add(SYNC_SLOT_KEY, 1, timeout=max(1, round(settings.GANTRY_SYNC_INTERVAL_S / 2)))
        )
    except Exception:
        logger.warning("sync: the cache did not answer; syncing anyway")
        return True


# The reclaiming attempt has not reached its backend yet: a job it preempts stays until then.
RECLAIM_NOT_SUBMITTED = (AttemptState.CREATED, AttemptState.SUBMITTING)


def attempt_cancel(*, attempt_id: int) -> None:
    """Cancel an attempt's job. A job preempted for another run's attempt on a backend that
    starts that attempt first (``reclaim_first``) waits until it was submitted: cancelled
    earlier, its GPUs would go to whatever waited in the backend's queue. The reclaiming
    attempt's submit sends this again (``attempt_submit``), and so does the periodic
    re-drive (``attempt_redrive_deferred_cancels``)."""
    attempt = attempt_get_for_work(attempt_id)
    if attempt.state not in LIVE_ATTEMPT_STATES:
        return
    backend = backend_for(attempt.cluster)
    # What admission assumed when it preempted: the backend's answer with the inventory.
    reclaim_first = bool((attempt.cluster.outside_claims or {}).get("reclaim_first"))
    if (
        attempt.preempted_for_id is not None
        and reclaim_first
        and Attempt.objects.filter(
            pk=attempt.preempted_for_id, state__in=RECLAIM_NOT_SUBMITTED
        ).exists()
    ):
        logger.info("cancel deferred until attempt %s is submitted", attempt.preempted_for_id)
        return
    with log_context(run_id=attempt.run_id, attempt_id=attempt.pk, cluster=attempt.cluster.name):
        with backend_call(cluster=attempt.cluster.name, operation="cancel"):
            backend.cancel(JobRef(name=attempt.name, backend_job_id=attempt.backend_job_id))
        logger.info("cancelled on %s: job %s", attempt.cluster.name, attempt.backend_job_id)
    cluster_sync(cluster=attempt.cluster)


def cluster_sync(*, cluster: Cluster) -> int:
    """Bring every live attempt of the cluster up to date in one batched backend call.
    Returns how many attempts changed state."""
    with log_context(cluster=cluster.name):
        return _cluster_sync(cluster=cluster)


def _cluster_sync(*, cluster: Cluster) -> int:
    backend = backend_for(cluster)
    live = list(
        Attempt.objects.filter(cluster=cluster, state__in=LIVE_ATTEMPT_STATES).select_related(
            "run__experiment"
        )
    )
    now = timezone.now()
    try:
        with backend_call(cluster=cluster.name, operation="sync"):
            statuses = backend.sync([JobRef(a.name, a.backend_job_id) for a in live])
    except BackendError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(last_error=str(exc)[:2000])
        Attempt.objects.filter(pk__among=[a.pk for a in live]).update(
            backend_error=f"backend unreachable: {exc}"[:2000]
        )
        raise
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_at=now, last_error="")
    # A workspace whose server never answered ends here, as its job would have.
    statuses |= workspace_start_overdue(
        cluster_name=cluster.name, attempts=live, statuses=statuses, backend=backend, now=now
    )
    recorded = _checkpoint_steps_recorded(live=live, statuses=statuses)
    changed = 0
    for attempt in live:
        status = statuses.get(attempt.name)
        if status is not None and status.checkpoints:
            known = recorded.get(attempt.pk, set())
            status = replace(
                status, checkpoints=tuple(c for c in status.checkpoints if c.step not in known)
            )
        with log_context(run_id=attempt.run_id, attempt_id=attempt.pk):
            changed += _attempt_sync(attempt=attempt, status=status, backend=backend, now=now)
    return changed


def _checkpoint_steps_recorded(
    *, live: list[Attempt], statuses: dict[str, JobStatus]
) -> dict[int, set[int]]:
    """The steps already recorded of each live attempt whose status reports checkpoints,
    in one query: a backend may report every checkpoint so far on every sync (the
    simulator does), and only new ones need writing."""
    reporting = [
        attempt.pk
        for attempt in live
        if (status := statuses.get(attempt.name)) is not None and status.checkpoints
    ]
    steps: dict[int, set[int]] = defaultdict(set)
    if reporting:
        for attempt_id, step in Checkpoint.objects.filter(attempt_id__among=reporting).values_list(
            "attempt_id", "step"
        ):
            steps[attempt_id].add(step)
    return steps


def _attempt_sync(*, attempt: Attempt, status: JobStatus | None, backend, now) -> int:
    """Apply what the batched sync found about one attempt (None: the backend does not know
    it); returns how many attempts changed state."""
    if status is None:
        if attempt.state == AttemptState.SUBMITTING:
            return 0  # the submit task owns it until the backend has the job
        if attempt.run.cancel_requested_at is not None or attempt.run.state == RunState.PREEMPTED:
            # We deleted it ourselves (cancel or preemption): gone means done, not lost.
            status = JobStatus(
                state="CANCELLED",
                failure_reason="CANCELLED",
                message="Deleted from the cluster as requested",
            )
        elif attempt.last_seen_at and now - attempt.last_seen_at > (
            timedelta(seconds=settings.GANTRY_LOST_GRACE_S) + LAST_SEEN_RESOLUTION
        ):
            status = JobStatus(
                state="LOST", failure_reason="LOST", message="The backend no longer knows it"
            )
        else:
            return 0
    if _still_running(attempt=attempt, status=status, now=now):
        return 0  # nothing to write: no transaction either
    changed = attempt_apply_status(attempt=attempt, status=status, now=now)
    if backend.honours_placement and _placement_lapsed(attempt=attempt, status=status, now=now):
        changed += attempt_requeue_unplaced(
            attempt=attempt, backend=backend, status=status, now=now
        )
    return changed


def _placement_lapsed(*, attempt: Attempt, status: JobStatus, now) -> bool:
    """Admission placed the attempt, the backend has held it for longer than the grace
    without giving it nodes: the placement did not hold (load from outside Gantry took the
    GPUs first, a node went down)."""
    grace = timedelta(seconds=settings.GANTRY_PLACEMENT_GRACE_S)
    return (
        status.state == "PENDING"
        and attempt.state == AttemptState.PENDING
        and bool(attempt.placement)
        and not status.node_list
        and attempt.submitted_at is not None
        and now - attempt.submitted_at > grace
    )


def attempt_requeue_unplaced(*, attempt: Attempt, backend, status: JobStatus, now) -> int:
    """Take back a placed attempt the backend has not started within the grace and put its
    run back in the queue, for admission to place it anew with what is free now. The
    backend's job is cancelled first, so it cannot start later beside the new attempt; if
    that call fails, the next sync tries again."""
    try:
        with backend_call(cluster=attempt.cluster.name, operation="cancel"):
            backend.cancel(JobRef(name=attempt.name, backend_job_id=attempt.backend_job_id))
    except BackendError as exc:
        logger.warning("attempt %s: not requeued yet, the cancel failed: %s", attempt.pk, exc)
        return 0
    nodes = ", ".join(attempt.placement)
    why = f" ({status.message})" if status.message else ""
    message = (
        f"{attempt.cluster.name} had not started it on {nodes} after "
        f"{settings.GANTRY_PLACEMENT_GRACE_S} s{why}: back in the queue for a new placement"
    )
    with transaction.atomic():
        moved = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.PENDING).update(
            state=AttemptState.CANCELLED,
            finished_at=now,
            failure_reason="CANCELLED",
            failure_message=message[:2000],
            last_seen_at=now,
        )
        if not moved:
            return 0
        run_transition(
            run=attempt.run,
            to=RunState.QUEUED,
            expected=(RunState.PENDING,),
            reason="REPLACED",
            message=message,
            attempt=attempt,
            cluster=None,
            borrowed=False,
            over_budget=False,
            wait_reason="",
            wait_message="",
        )
        admission_cycle_enqueue()
    return 1


CHECKPOINT_URI_MAX_LENGTH = max_length_of(Checkpoint, "uri")


def checkpoints_record(*, attempt: Attempt, reports: Iterable[CheckpointReport]) -> None:
    """Record the checkpoints an attempt reported, through its backend's status or the
    job-side SDK; the latest one is where a requeued run resumes.

    Idempotent on (attempt, step): a step already recorded is left as it is, so reports
    repeated on every sync or in a resent SDK batch add nothing. A report whose URI is
    longer than a checkpoint can hold is skipped and logged: resuming from a cut URI fails.
    """
    by_step: dict[int, CheckpointReport] = {}
    for report in reports:
        if len(report.uri) > CHECKPOINT_URI_MAX_LENGTH:
            logger.warning(
                "attempt %s: checkpoint step %s not recorded, its URI has %d characters",
                attempt.pk,
                report.step,
                len(report.uri),
            )
            continue
        by_step.setdefault(report.step, report)
    if not by_step:
        return
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                run_id=attempt.run_id,
                attempt=attempt,
                step=report.step,
                uri=report.uri,
                saved_at=report.saved_at,
                save_seconds=report.save_seconds,
            )
            for report in by_step.values()
        ],
        ignore_conflicts=True,  # the first report of a step wins
    )


# How far ahead of Gantry's clock a backend's may be before its times are not believed
# (backends report whole seconds, and hosts keep time only so well).
CLOCK_SKEW_TOLERANCE = timedelta(seconds=60)


def clock_skew(*, attempt: Attempt, status: JobStatus, now: datetime) -> str:
    """Why the times the backend reports for the attempt cannot be true by Gantry's clock
    (a job that started or ended after now, or ended before it started), in words; "" when
    they can. (A start before the submit is not refused: a backend's history can be older
    than the attempt row that adopted it.)"""
    cluster = attempt.cluster.name
    for what, moment in (("started", status.started_at), ("ended", status.finished_at)):
        if moment is None:
            continue
        if moment > now + CLOCK_SKEW_TOLERANCE:
            ahead = (moment - now).total_seconds()
            return (
                f"{cluster} says the job {what} at {moment:%Y-%m-%d %H:%M:%S} UTC, {ahead:,.0f} s "
                f"after Gantry's clock ({now:%H:%M:%S} UTC): the clocks disagree"
            )
    if status.started_at and status.finished_at and status.finished_at < status.started_at:
        return f"{cluster} says the job ended before it started: its clock is not to be trusted"
    return ""


@transaction.atomic
def attempt_apply_status(*, attempt: Attempt, status: JobStatus, now) -> int:
    """Apply what the backend reports about one attempt to the attempt and its run. Times
    that cannot be true by Gantry's clock (``clock_skew``) change nothing but the error the
    attempt shows, and a pending run's wait reason: no start, end or charge on a guess."""
    run = attempt.run
    common = _seen(status=status, now=now)
    skew = clock_skew(attempt=attempt, status=status, now=now)
    if skew:
        error = f"{skew}; nothing is recorded or charged until they agree"
        Attempt.objects.filter(pk=attempt.pk).update(last_seen_at=now, backend_error=error)
        Run.objects.filter(pk=run.pk, state__in=(RunState.SUBMITTING, RunState.PENDING)).update(
            wait_reason=WaitReason.BACKEND, wait_message=error[:WAIT_MESSAGE_MAX_LENGTH]
        )
        return 0
    checkpoints_record(attempt=attempt, reports=status.checkpoints)
    adopted = 0
    if attempt.state == AttemptState.SUBMITTING and status.backend_job_id:
        # The backend has the job, its submit has not recorded it: the worker died after
        # creating it. Record it as that submit would have, then apply what it reports.
        adopted, _ = attempt_accept(
            attempt=attempt, job_id=status.backend_job_id, now=now, found_by_sync=True
        )
    if status.state == "PENDING":
        message = pending_message(attempt=attempt, why=status.message)[:WAIT_MESSAGE_MAX_LENGTH]
        Run.objects.filter(pk=run.pk, state=RunState.PENDING).exclude(
            wait_reason=WaitReason.BACKEND, wait_message=message
        ).update(wait_reason=WaitReason.BACKEND, wait_message=message)
    if status.state == attempt.state or (
        status.state == "PENDING" and attempt.state == AttemptState.SUBMITTING
    ):
        if adopted or _news(attempt=attempt, common=common, now=now):
            Attempt.objects.filter(pk=attempt.pk).update(**common)
        return int(adopted)
    if status.state == "RUNNING":
        updated = Attempt.objects.filter(
            pk=attempt.pk, state__in=(AttemptState.SUBMITTING, AttemptState.PENDING)
        ).update(state=AttemptState.RUNNING, started_at=status.started_at or now, **common)
        if updated:
            _run_started(
                run=run,
                attempt=attempt,
                started_at=status.started_at or now,
                message=f"Running on {', '.join(status.node_list) or attempt.cluster.name}",
            )
        return int(adopted or updated)
    if status.state == "PENDING":
        return int(adopted)
    return int(adopted or _attempt_finish(attempt=attempt, status=status, now=now, common=common))


def _seen(*, status: JobStatus, now) -> dict[str, Any]:
    """The attempt's fields a status it was found in sets, whatever its state."""
    common: dict[str, Any] = {"last_seen_at": now, "backend_error": ""}
    if status.node_list:
        common["node_list"] = status.node_list
    return common


def _still_running(*, attempt: Attempt, status: JobStatus, now) -> bool:
    """A running attempt the backend reports running as it was, with no new checkpoint and
    nothing to write (``_news``): most live attempts on most syncs."""
    return (
        attempt.state == AttemptState.RUNNING
        and status.state == "RUNNING"
        and not status.checkpoints
        and not _news(attempt=attempt, common=_seen(status=status, now=now), now=now)
    )


def _news(*, attempt: Attempt, common: dict, now) -> bool:
    """Whether a sync that found the attempt as it was has anything to write: an error to
    clear, other nodes, or a "last seen" older than ``LAST_SEEN_RESOLUTION``."""
    return (
        attempt.backend_error != common["backend_error"]
        or common.get("node_list", attempt.node_list) != attempt.node_list
        or attempt.last_seen_at is None
        or now - attempt.last_seen_at >= LAST_SEEN_RESOLUTION
    )


def start_missed_by(*, run: Run, started_at: datetime) -> dict[str, Any]:
    """The track record of a run's first start: how many seconds after the full-limits
    estimate it was admitted with it started (negative: before it). Nothing for a run
    without one, or one that has started before."""
    if run.started_at is not None or run.start_full_limits_was is None:
        return {}
    return {"start_missed_by_s": (started_at - run.start_full_limits_was).total_seconds()}


def _run_started(*, run: Run, attempt: Attempt, started_at, message: str) -> None:
    """The run is RUNNING since its attempt's job started (a run that restarts keeps its
    first start, and the record of its estimate against it)."""
    if run_transition(
        run=run,
        to=RunState.RUNNING,
        expected=(RunState.SUBMITTING, RunState.PENDING),
        reason="STARTED",
        message=message,
        attempt=attempt,
        started_at=run.started_at or started_at,
        wait_reason="",
        wait_message="",
        **start_missed_by(run=run, started_at=started_at),
    ):
        metrics.run_started(
            cluster=attempt.cluster.name, admitted_at=run.admitted_at, started_at=started_at
        )


# What each end a backend reports makes of the attempt; any other is a failure.
_ENDED_STATES = {
    "SUCCEEDED": AttemptState.SUCCEEDED,
    "FAILED": AttemptState.FAILED,
    "CANCELLED": AttemptState.CANCELLED,
    "PREEMPTED": AttemptState.PREEMPTED,
    "LOST": AttemptState.LOST,
}


def _attempt_finish(*, attempt: Attempt, status: JobStatus, now, common: dict) -> int:
    """The attempt's job ended: record the end and its usage (once: 0 when another sync
    recorded it first), move the run on and wake admission."""
    run = attempt.run
    state = _ENDED_STATES.get(status.state, AttemptState.FAILED)
    reason = "" if state == AttemptState.SUCCEEDED else (status.failure_reason or "UNKNOWN")
    finished_at = status.finished_at or now
    updated = Attempt.objects.filter(pk=attempt.pk, state__in=LIVE_ATTEMPT_STATES).update(
        state=state,
        started_at=attempt.started_at or status.started_at,
        finished_at=finished_at,
        exit_code=status.exit_code,
        failure_reason=reason,
        # A success's message (what the workload did) is its run event's, not a failure's.
        failure_message="" if state == AttemptState.SUCCEEDED else status.message[:2000],
        **common,
    )
    if not updated:
        return 0
    usage_record_attempt(
        attempt=attempt, started=attempt.started_at or status.started_at, finished=finished_at
    )
    run.refresh_from_db(
        fields=["state", "cancel_requested_at", "restarts", "platform_retries", "excluded_nodes"]
    )
    preempted = run.state == RunState.PREEMPTED
    cause, evidence = attempt_end.attempt_cause_store(
        attempt=attempt,
        status=status,
        state=AttemptState.PREEMPTED if preempted else state,
        reason="PREEMPTED" if preempted else reason,
        finished_at=finished_at,
        now=now,
    )
    if preempted:
        attempt_end.preempted_run_settle(run=run, attempt=attempt, finished_at=finished_at)
        return 1
    # A job that started and ended between two syncs (a sync held up by an outage, a short
    # job): its run's timeline still says it ran, when the backend says it started.
    ran_at = status.started_at or (finished_at if state == AttemptState.SUCCEEDED else None)
    if ran_at is not None and run.state in (RunState.SUBMITTING, RunState.PENDING):
        _run_started(
            run=run,
            attempt=attempt,
            started_at=ran_at,
            message=f"Ran on {', '.join(status.node_list) or attempt.cluster.name}",
        )
    attempt_end.run_end(
        run=run,
        attempt=attempt,
        status=status,
        state=state,
        reason=reason,
        finished_at=finished_at,
        cause=(cause, evidence),
    )
    admission_cycle_enqueue()
    return 1


@transaction.atomic
def attempt_report_runtime(*, attempt: Attempt, report: dict, now=None) -> bool:
    """Store what a job reports about its runtime (driver, CUDA, framework and NCCL
    versions, nodes, GPU UUIDs). Returns whether anything changed.

    The latest report wins: ``runtime_env`` is replaced by it, and its node list and GPU
    UUIDs, when given, replace the attempt's. It is rank 0's: a report that names an NCCL,
    driver or CUDA version also stands for rank 0's versions beside those the other ranks
    reported (``jobs.services.rank_runtime``), which it leaves alone. Reporting the same
    values again writes nothing. Reports are accepted while the attempt is live (its token
    dies when it ends); one that arrives as it ends is refused with a reason (``state``).
    """
    now = now or timezone.now()
    encoded = json.dumps(report, separators=(",", ":"), sort_keys=True)
    if len(encoded.encode()) > MAX_RUNTIME_REPORT_BYTES:
        raise ValidationError({"report": f"At most {MAX_RUNTIME_REPORT_BYTES // 1024} KiB."})
    attempt = Attempt.objects.select_for_update().select_related("run").get(pk=attempt.pk)
    refusal = attempt_token_refusal(attempt)
    if refusal is not None:
        raise ValidationError({"state": refusal})
    changes: dict[str, Any] = {"runtime_env": reproducibility.runtime_env_of(report)}
    for name in ("node_list", "gpu_uuids"):
        if name in report:
            changes[name] = list(report[name])
    changes = {name: value for name, value in changes.items() if getattr(attempt, name) != value}
    rank_changed = any(report.get(name) for name in RANK_VERSION_FIELDS) and (
        rank_runtime.rank_runtime_record(attempt_id=attempt.pk, rank=0, report=report, now=now)
    )
    if not changes:
        return rank_changed
    Attempt.objects.filter(pk=attempt.pk).update(runtime_reported_at=now, **changes)
    RunEvent.objects.create(
        run=attempt.run,
        attempt=attempt,
        from_state=attempt.run.state,
        to_state=attempt.run.state,
        reason="RUNTIME_REPORTED",
        message=reproducibility.runtime_summary(report, attempt_number=attempt.number),
    )
    return True
