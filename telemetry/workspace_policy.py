"""The tenants' workspace idle policy, applied once a minute (``workspace-idle-scan``):
each running workspace's signals are read (its server's kernels and terminals, what a
person did through the proxy, its GPUs), judged (``telemetry.workspace_idle``), and the
owner warned, the workspace suspended, its idle streaks kept for the accounting.

Every action is decided again under the run's row lock (``workspace_suspend``), and a
warning is recorded with the moment it was sent, so two scans never warn or suspend twice.
"""

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import requests
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.models import (
    IDLE_WARNING_EVENT,
    AttemptState,
    Run,
    RunEvent,
    RunKind,
    RunState,
    Workspace,
)
from jobs.services.lifecycle import run_cancel
from jobs.services.workspace_lifecycle import workspace_suspend
from jobs.services.workspaces import workspace_base_path, workspace_server_token
from telemetry.accounting import IDLE_THRESHOLD, MINUTE
from telemetry.models import GpuMinute, WorkspaceIdleSpan
from telemetry.workspace_idle import (
    IdleAction,
    IdleVerdict,
    WorkspacePolicy,
    WorkspaceSignals,
    idle_verdict,
)
from tenants.models import Notification, Tenant
from tenants.services.notifications import notification_create

logger = logging.getLogger(__name__)

# A streak idle on every signal counts as interactive idle waste once it lasted this long
# (a person reading or thinking for a few minutes is using the workspace).
INTERACTIVE_IDLE_MIN_S = 15 * 60
SERVER_TIMEOUT_S = 5
SCAN_THREADS = 16


@dataclass(frozen=True, slots=True)
class ServerActivity:
    """What the workspace server said: None when it did not answer."""

    busy_kernels: int
    kernel_activity_at: datetime | None
    terminal_activity_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkspaceScanSummary:
    checked: int
    warned: int
    suspended: int
    unanswered: int
    ended: int = 0  # sessions that reached their time limit


def workspace_policy_of(tenant: Tenant) -> WorkspacePolicy:
    return WorkspacePolicy(
        suspend_after=timedelta(minutes=tenant.workspace_suspend_after_min),
        warn_before=timedelta(minutes=tenant.workspace_warn_before_min),
        suspend_silent_busy=tenant.workspace_suspend_silent_busy,
    )


def _latest(values: list[str | None]) -> datetime | None:
    moments = [moment for value in values if value and (moment := parse_datetime(value))]
    return max(moments) if moments else None


def server_activity(workspace: Workspace) -> ServerActivity | None:
    """Ask the workspace's Jupyter Server (at the address its backend reported, with the
    attempt's secret) for its kernels and terminals. ``no_track_activity`` keeps the
    question from counting as activity. None when it does not answer sensibly."""
    assert workspace.attempt_id is not None and workspace.address is not None
    base = f"http://{workspace.host}:{workspace.port}{workspace_base_path(workspace.run_id)}"
    headers = {"Authorization": f"token {workspace_server_token(workspace.attempt_id)}"}
    try:
        kernels = requests.get(
            f"{base}api/kernels?no_track_activity=1", headers=headers, timeout=SERVER_TIMEOUT_S
        )
        terminals = requests.get(
            f"{base}api/terminals?no_track_activity=1", headers=headers, timeout=SERVER_TIMEOUT_S
        )
        kernels.raise_for_status()
        kernel_rows = kernels.json()
        terminal_rows = terminals.json() if terminals.ok else []
    except (requests.RequestException, ValueError) as exc:
        logger.info("workspace of run %s did not answer: %s", workspace.run_id, type(exc).__name__)
        return None
    if not isinstance(kernel_rows, list) or not isinstance(terminal_rows, list):
        return None
    return ServerActivity(
        busy_kernels=sum(
            1
            for row in kernel_rows
            if isinstance(row, dict) and row.get("execution_state") == "busy"
        ),
        kernel_activity_at=_latest(
            [row.get("last_activity") for row in kernel_rows if isinstance(row, dict)]
        ),
        terminal_activity_at=_latest(
            [row.get("last_activity") for row in terminal_rows if isinstance(row, dict)]
        ),
    )


def _gpu_active_at(attempt_ids: list[int]) -> dict[int, datetime]:
    """Each attempt's latest GPU-active minute's end (DCGM), one query."""
    rows = (
        GpuMinute.objects.filter(attempt_id__in=attempt_ids, activity__gte=IDLE_THRESHOLD)
        .values("attempt_id")
        .annotate(latest=Max("minute"))
    )
    return {row["attempt_id"]: row["latest"] + timedelta(seconds=MINUTE) for row in rows}


def running_workspaces() -> list[Workspace]:
    """Workspaces whose server answered for the attempt running now."""
    return list(
        Workspace.objects.filter(
            run__kind=RunKind.INTERACTIVE,
            run__state=RunState.RUNNING,
            run__cancel_requested_at__isnull=True,  # not already being stopped or suspended
            attempt__state=AttemptState.RUNNING,
            ready_at__isnull=False,
            port__isnull=False,
        )
        .exclude(host="")
        .select_related("run__tenant", "run__submitted_by", "run__experiment", "attempt")
    )


def workspace_idle_scan(*, now: datetime | None = None) -> WorkspaceScanSummary:
    """Judge every running workspace once and act on the verdicts."""
    now = now or timezone.now()
    workspaces = running_workspaces()
    ended = [workspace for workspace in workspaces if _time_limit_reached(workspace, now)]
    workspaces = [workspace for workspace in workspaces if workspace not in ended]
    if not workspaces:
        return WorkspaceScanSummary(0, 0, 0, 0, ended=len(ended))
    with ThreadPoolExecutor(max_workers=min(SCAN_THREADS, len(workspaces))) as pool:
        answers = list(pool.map(server_activity, workspaces))
    gpu = _gpu_active_at([workspace.attempt_id for workspace in workspaces])  # type: ignore[misc]
    warned = suspended = unanswered = 0
    for workspace, answer in zip(workspaces, answers, strict=True):
        unanswered += answer is None
        assert workspace.ready_at is not None and workspace.attempt_id is not None
        signals = WorkspaceSignals(
            now=now,
            ready_at=workspace.ready_at,
            busy_kernels=answer.busy_kernels if answer else 0,
            kernel_activity_at=answer.kernel_activity_at if answer else None,
            terminal_activity_at=answer.terminal_activity_at if answer else None,
            proxy_activity_at=workspace.proxy_activity_at,
            server_answered=answer is not None,
            gpu_active_at=gpu.get(workspace.attempt_id),
        )
        verdict = idle_verdict(
            signals, workspace_policy_of(workspace.run.tenant), warned_at=workspace.warned_at
        )
        idle_span_keep(workspace=workspace, verdict=verdict, now=now)
        if verdict.action == IdleAction.WARN and _warn(workspace, verdict, now):
            warned += 1
        elif verdict.action == IdleAction.SUSPEND:
            suspended += _suspend(workspace, verdict, now)
        elif verdict.action == IdleAction.IN_USE and workspace.warned_at is not None:
            Workspace.objects.filter(pk=workspace.pk).update(warned_at=None)
    return WorkspaceScanSummary(len(workspaces), warned, suspended, unanswered, len(ended))


def session_limit(workspace: Workspace) -> timedelta:
    """How long one session of the workspace may run: its hours and every extension."""
    minutes = workspace.run.experiment.max_runtime_minutes + workspace.extended_minutes
    return timedelta(minutes=minutes)


def _time_limit_reached(workspace: Workspace, now: datetime) -> bool:
    """Stop a session that reached its limit (the backend's own limit is the tenant's
    longest, so that an Extend needs no change to the running job): True when it did."""
    attempt = workspace.attempt
    assert attempt is not None
    limit = session_limit(workspace)
    if attempt.started_at is None or now < attempt.started_at + limit:
        return False
    hours = limit.total_seconds() / 3600
    run_cancel(
        run=workspace.run,
        actor=None,
        system_reason=f"Stopped: its session reached its time limit of {hours:g} h "
        "(its hours and extensions)",
    )
    return True


def idle_span_keep(*, workspace: Workspace, verdict: IdleVerdict, now: datetime) -> None:
    """Open the attempt's idle span once its streak lasted ``INTERACTIVE_IDLE_MIN_S`` (from
    the streak's start), close it at the last use when use came back."""
    attempt_id = workspace.attempt_id
    assert attempt_id is not None  # a running workspace's
    open_span = WorkspaceIdleSpan.objects.filter(attempt_id=attempt_id, ended_at__isnull=True)
    since = verdict.idle_since
    long_enough = since is not None and (now - since).total_seconds() >= INTERACTIVE_IDLE_MIN_S
    current = open_span.first()
    if current is not None and not (long_enough and since == current.started_at):
        # Used again: at ``since`` when a new streak began then, else now (in use now).
        open_span.update(ended_at=max(current.started_at, since or now))
        current = None
    if since is not None and long_enough and current is None:
        WorkspaceIdleSpan.objects.create(attempt_id=attempt_id, started_at=since)


def _clock(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def _warn(workspace: Workspace, verdict: IdleVerdict, now: datetime) -> bool:
    """Warn the owner once per idle streak; False when this streak was warned already."""
    run = workspace.run
    assert verdict.idle_since is not None
    if workspace.warned_at is not None and workspace.warned_at >= verdict.idle_since:
        return False  # this streak was warned already
    with transaction.atomic():
        Workspace.objects.filter(pk=workspace.pk).update(warned_at=now)
        if verdict.silent_busy and verdict.suspend_at is None:
            message = (
                f"Workspace {run.pk} has had a kernel busy without output and its GPUs idle "
                f"since {_clock(verdict.idle_since)}; it keeps its GPUs. Stop it if the "
                "kernel is stuck."
            )
        else:
            assert verdict.suspend_at is not None
            message = (
                f"Workspace {run.pk} has been idle since {_clock(verdict.idle_since)} (no "
                "kernel or terminal ran, nothing was done through Gantry, its GPUs were "
                f"idle); it will be suspended at {_clock(verdict.suspend_at)} unless it is "
                "used. Its files are kept."
            )
        RunEvent.objects.create(
            run=run,
            from_state=run.state,
            to_state=run.state,
            reason=IDLE_WARNING_EVENT,
            message=message,
        )
        notification_create(
            user=run.submitted_by,
            tenant=run.tenant,
            kind=Notification.Kind.WORKSPACE_IDLE,
            message=message,
            now=now,
        )
    return True


def _suspend(workspace: Workspace, verdict: IdleVerdict, now: datetime) -> int:
    run: Run = workspace.run
    assert verdict.idle_since is not None
    message = (
        f"Suspended for being idle since {_clock(verdict.idle_since)} (tenant "
        f"{run.tenant.slug}'s limit: {run.tenant.workspace_suspend_after_min} minutes): its "
        "GPUs are released, its files kept; Resume queues it again"
    )
    before = run.cancel_requested_at
    run = workspace_suspend(run=run, actor=None, system_reason=message)
    if before is not None:
        return 0
    notification_create(
        user=run.submitted_by,
        tenant=run.tenant,
        kind=Notification.Kind.WORKSPACE_SUSPENDED,
        message=message,
        now=now,
    )
    return 1
