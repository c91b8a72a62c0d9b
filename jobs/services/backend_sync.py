"""Following the backends: inventory, status sync, cancels, checkpoints and runtime reports."""

import json
import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from jobs import reproducibility
from jobs.backends import (
    BackendError,
    CheckpointReport,
    JobRef,
    JobStatus,
    backend_for,
)
from jobs.enqueue import admission_cycle_enqueue
from jobs.models import (
    LIVE_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    Checkpoint,
    Cluster,
    ClusterFlavor,
    RunEvent,
    RunState,
)
from jobs.selectors.runs import attempt_get_for_work
from jobs.services.lifecycle import (
    attempt_accept,
    run_requeue_after_preemption,
    run_transition,
)
from jobs.services.usage import usage_record_attempt
from tenants.models import GpuFlavor, max_length_of

logger = logging.getLogger(__name__)


# A job may report its runtime while it runs and for this long after it ended (late
# reporters, clocks a little apart); later reports are refused with 409.
RUNTIME_REPORT_GRACE = timedelta(hours=1)


MAX_RUNTIME_REPORT_BYTES = 64 * 1024


def attempt_cancel(*, attempt_id: int) -> None:
    attempt = attempt_get_for_work(attempt_id)
    if attempt.state not in LIVE_ATTEMPT_STATES:
        return
    backend = backend_for(attempt.cluster)
    backend.cancel(JobRef(name=attempt.name, backend_job_id=attempt.backend_job_id))
    cluster_sync(cluster=attempt.cluster)


def cluster_refresh_inventory(*, cluster: Cluster) -> None:
    """Mirror the backend's inventory into ClusterFlavor rows (capacity for admission)."""
    items = backend_for(cluster).inventory()
    flavors = GpuFlavor.objects.in_bulk([i.flavor for i in items], field_name="slug")
    wanted = {}
    for item in items:
        if item.flavor not in flavors:
            logger.warning("cluster %s reports unknown flavor %s", cluster.name, item.flavor)
            continue
        wanted[flavors[item.flavor].pk] = (item.nodes, item.gpus_per_node)
    current = {
        cf.flavor_id: (cf.nodes, cf.gpus_per_node)
        for cf in ClusterFlavor.objects.filter(cluster=cluster)
    }
    if wanted == current:
        return
    with transaction.atomic():
        for flavor_id, (nodes, gpus_per_node) in wanted.items():
            ClusterFlavor.objects.update_or_create(
                cluster=cluster,
                flavor_id=flavor_id,
                defaults={"nodes": nodes, "gpus_per_node": gpus_per_node},
            )
        ClusterFlavor.objects.filter(cluster=cluster).exclude(flavor_id__in=wanted).delete()


def cluster_sync(*, cluster: Cluster) -> int:
    """Bring every live attempt of the cluster up to date in one batched backend call.
    Returns how many attempts changed state."""
    backend = backend_for(cluster)
    live = list(
        Attempt.objects.filter(cluster=cluster, state__in=LIVE_ATTEMPT_STATES).select_related(
            "run__experiment"
        )
    )
    now = timezone.now()
    try:
        statuses = backend.sync([JobRef(a.name, a.backend_job_id) for a in live])
    except BackendError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(last_error=str(exc)[:2000])
        Attempt.objects.filter(pk__in=[a.pk for a in live]).update(
            backend_error=f"backend unreachable: {exc}"[:2000]
        )
        raise
    Cluster.objects.filter(pk=cluster.pk).update(last_sync_at=now, last_error="")
    changed = 0
    grace = timedelta(seconds=settings.GANTRY_LOST_GRACE_S)
    for attempt in live:
        status = statuses.get(attempt.name)
        if status is None:
            if attempt.state == AttemptState.SUBMITTING:
                continue  # the submit task owns it until the backend has the job
            if (
                attempt.run.cancel_requested_at is not None
                or attempt.run.state == RunState.PREEMPTED
            ):
                # We deleted it ourselves (cancel or preemption): gone means done, not lost.
                status = JobStatus(
                    state="CANCELLED",
                    failure_reason="CANCELLED",
                    message="Deleted from the cluster as requested",
                )
            elif attempt.last_seen_at and now - attempt.last_seen_at > grace:
                status = JobStatus(
                    state="LOST", failure_reason="LOST", message="The backend no longer knows it"
                )
            else:
                continue
        changed += attempt_apply_status(attempt=attempt, status=status, now=now)
    return changed


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


@transaction.atomic
def attempt_apply_status(*, attempt: Attempt, status: JobStatus, now) -> int:
    """Apply what the backend reports about one attempt to the attempt and its run."""
    run = attempt.run
    common = {"last_seen_at": now, "backend_error": ""}
    if status.node_list:
        common["node_list"] = status.node_list
    checkpoints_record(attempt=attempt, reports=status.checkpoints)
    adopted = 0
    if attempt.state == AttemptState.SUBMITTING and status.backend_job_id:
        # The backend has the job, its submit has not recorded it: the worker died after
        # creating it. Record it as that submit would have, then apply what it reports.
        adopted, _ = attempt_accept(
            attempt=attempt, job_id=status.backend_job_id, now=now, found_by_sync=True
        )
    if status.state == attempt.state or (
        status.state == "PENDING" and attempt.state == AttemptState.SUBMITTING
    ):
        Attempt.objects.filter(pk=attempt.pk).update(**common)
        return int(adopted)
    if status.state == "RUNNING":
        updated = Attempt.objects.filter(
            pk=attempt.pk, state__in=(AttemptState.SUBMITTING, AttemptState.PENDING)
        ).update(state=AttemptState.RUNNING, started_at=status.started_at or now, **common)
        if updated:
            run_transition(
                run=run,
                to=RunState.RUNNING,
                expected=(RunState.SUBMITTING, RunState.PENDING),
                reason="STARTED",
                message=f"Running on {', '.join(status.node_list) or attempt.cluster.name}",
                attempt=attempt,
                started_at=run.started_at or status.started_at or now,
            )
        return int(adopted or updated)
    if status.state == "PENDING":
        return int(adopted)
    return int(adopted or _attempt_finish(attempt=attempt, status=status, now=now, common=common))


def _attempt_finish(*, attempt: Attempt, status: JobStatus, now, common: dict) -> int:
    run = attempt.run
    state = {
        "SUCCEEDED": AttemptState.SUCCEEDED,
        "FAILED": AttemptState.FAILED,
        "CANCELLED": AttemptState.CANCELLED,
        "PREEMPTED": AttemptState.PREEMPTED,
        "LOST": AttemptState.LOST,
    }.get(status.state, AttemptState.FAILED)
    reason = "" if state == AttemptState.SUCCEEDED else (status.failure_reason or "UNKNOWN")
    finished_at = status.finished_at or now
    updated = Attempt.objects.filter(pk=attempt.pk, state__in=LIVE_ATTEMPT_STATES).update(
        state=state,
        started_at=attempt.started_at or status.started_at,
        finished_at=finished_at,
        exit_code=status.exit_code,
        failure_reason=reason,
        failure_message=status.message[:2000],
        **common,
    )
    if not updated:
        return 0
    usage_record_attempt(
        attempt=attempt, started=attempt.started_at or status.started_at, finished=finished_at
    )
    run.refresh_from_db(fields=["state", "cancel_requested_at", "restarts"])
    live_states = (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
    if run.state == RunState.PREEMPTED:
        Attempt.objects.filter(pk=attempt.pk).update(
            state=AttemptState.PREEMPTED, failure_reason="PREEMPTED"
        )
        run_requeue_after_preemption(run=run, attempt=attempt)
        return 1
    if state == AttemptState.SUCCEEDED:
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
    admission_cycle_enqueue()
    return 1


@transaction.atomic
def attempt_report_runtime(*, attempt: Attempt, report: dict, now=None) -> bool:
    """Store what a job reports about its runtime (driver, CUDA, framework and NCCL
    versions, nodes, GPU UUIDs). Returns whether anything changed.

    The latest report wins: ``runtime_env`` is replaced by it, and its node list and GPU
    UUIDs, when given, replace the attempt's. Reporting the same values again writes
    nothing. Reports are accepted until ``RUNTIME_REPORT_GRACE`` after the attempt ended.
    """
    now = now or timezone.now()
    encoded = json.dumps(report, separators=(",", ":"), sort_keys=True)
    if len(encoded.encode()) > MAX_RUNTIME_REPORT_BYTES:
        raise ValidationError({"report": f"At most {MAX_RUNTIME_REPORT_BYTES // 1024} KiB."})
    attempt = Attempt.objects.select_for_update().select_related("run").get(pk=attempt.pk)
    if attempt.finished_at is not None and now > attempt.finished_at + RUNTIME_REPORT_GRACE:
        raise ValidationError(
            {
                "state": f"Attempt {attempt.number} of run {attempt.run_id} ended at "
                f"{attempt.finished_at:%Y-%m-%d %H:%M:%S %Z}; runtime reports are accepted "
                "until one hour after an attempt ends."
            }
        )
    changes: dict[str, Any] = {"runtime_env": reproducibility.runtime_env_of(report)}
    for name in ("node_list", "gpu_uuids"):
        if name in report:
            changes[name] = list(report[name])
    changes = {name: value for name, value in changes.items() if getattr(attempt, name) != value}
    if not changes:
        return False
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
