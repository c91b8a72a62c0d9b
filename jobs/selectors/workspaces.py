"""Reads of workspaces, scoped by ``jobs.access.workspace_list_viewable``: the list (a page
of them) and one workspace's card."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from core.types import UserLike
from jobs.access import (
    run_can_cancel,
    workspace_can_extend,
    workspace_can_open,
    workspace_list_viewable,
)
from jobs.models import (
    IDLE_WARNING_EVENT,
    Attempt,
    Run,
    RunEvent,
    RunState,
    Workspace,
    WorkspaceServer,
)
from jobs.selectors.paging import keyset_page
from jobs.workspace_card import (
    Phase,
    Step,
    WorkspaceTimes,
    duration_words,
    workspace_phase,
    workspace_steps,
    workspace_time_left,
)
from jobs.workspace_models import workspace_base_path

# The page of its server a workspace opens at, under its base path.
OPENS_AT = {WorkspaceServer.JUPYTER: "lab", WorkspaceServer.VSCODE: ""}


@dataclass(frozen=True)
class WorkspaceCard:
    """One workspace as the list, its page, the API and the CLI show it to ``user``."""

    run: Run
    workspace: Workspace
    phase: str
    steps: list[Step]
    time_left: timedelta | None
    max_hours_total: float  # its limit with the extensions, in hours
    url: str  # where it opens through the proxy; "" unless the user may open it now
    can_open: bool  # the user is its owner (whether it is ready or not)
    can_extend: bool
    can_stop: bool
    can_suspend: bool  # its owner, while its server runs
    can_resume: bool  # its owner, once suspended
    # While warned: what the warning said (why, since when, when it will be suspended).
    idle_warning: str = ""

    @property
    def time_left_words(self) -> str:
        return "" if self.time_left is None else duration_words(self.time_left)

    @property
    def extended_hours(self) -> float:
        return self.workspace.extended_minutes / 60


@dataclass(frozen=True)
class WorkspacePage:
    cards: list[WorkspaceCard]
    newer: int | None  # run ids to page from (after=, before=); None at either end
    older: int | None


def workspace_get_viewable(*, user: UserLike, run_id: int) -> Run:
    """The workspace (its run), or Run.DoesNotExist alike for a missing one, a batch run and
    one the user may not see."""
    return workspace_list_viewable(user=user).get(pk=run_id)


def workspace_page_viewable(
    *, user: UserLike, size: int, before: int | None = None, after: int | None = None
) -> WorkspacePage:
    """A page of the workspaces the user may see, newest first (keyset pages by run id),
    each as its card: three queries (roles aside), however many workspaces it shows."""
    viewable = workspace_list_viewable(user=user)
    runs, has_newer, has_older = keyset_page(
        viewable.defer("experiment__command", "experiment__params", "experiment__env"),
        readable=viewable,
        field="submitted_at",
        size=size,
        before=before,
        after=after,
    )
    latest = _latest_attempts(runs)
    warnings = _idle_warnings(runs)
    now = timezone.now()
    cards = [
        workspace_card(
            user=user,
            run=run,
            attempt=latest.get(run.pk),
            now=now,
            idle_warning=warnings.get(run.pk, ""),
        )
        for run in runs
    ]
    return WorkspacePage(
        cards=cards,
        newer=runs[0].pk if runs and has_newer else None,
        older=runs[-1].pk if runs and has_older else None,
    )


def workspace_card_of(*, user: UserLike, run: Run) -> WorkspaceCard:
    """The card of a workspace already fetched through ``workspace_get_viewable``."""
    return workspace_card(
        user=user,
        run=run,
        attempt=_latest_attempts([run]).get(run.pk),
        now=timezone.now(),
        idle_warning=_idle_warnings([run]).get(run.pk, ""),
    )


def workspace_card(
    *, user: UserLike, run: Run, attempt: Attempt | None, now: datetime, idle_warning: str = ""
) -> WorkspaceCard:
    workspace = run.workspace
    times = WorkspaceTimes(
        state=run.state,
        submitted_at=run.submitted_at,
        admitted_at=run.admitted_at,
        attempt_submitted_at=attempt.submitted_at if attempt else None,
        attempt_started_at=attempt.started_at if attempt else None,
        ready_at=workspace.ready_at,
        warned_at=workspace.warned_at,
        suspended_at=workspace.suspended_at,
        finished_at=run.finished_at,
        started_at=run.started_at,
        max_runtime_minutes=run.experiment.max_runtime_minutes,
        extended_minutes=workspace.extended_minutes,
    )
    phase = workspace_phase(times)
    can_open = workspace_can_open(user=user, run=run)
    ready = (
        run.state == RunState.RUNNING
        and workspace.address is not None
        and phase in (Phase.RUNNING, Phase.IDLE_WARNING)
    )
    ended = run.is_terminal
    return WorkspaceCard(
        run=run,
        workspace=workspace,
        phase=phase,
        steps=workspace_steps(times),
        time_left=None
        if ended
        else workspace_time_left(
            # A session's limit counts from its own start: a resumed workspace gets its
            # whole time again (the limit Gantry enforces, telemetry.workspace_policy).
            started_at=times.attempt_started_at if run.state == RunState.RUNNING else None,
            max_runtime_minutes=times.max_runtime_minutes,
            extended_minutes=times.extended_minutes,
            now=now,
        ),
        max_hours_total=(times.max_runtime_minutes + times.extended_minutes) / 60,
        url=workspace_url(run=run, server=workspace.server) if can_open and ready else "",
        can_open=can_open,
        can_extend=not ended and workspace_can_extend(user=user, run=run),
        can_stop=not ended and run_can_cancel(user=user, run=run),
        can_suspend=can_open
        and run.state == RunState.RUNNING
        and run.cancel_requested_at is None
        and workspace.suspended_at is None,
        can_resume=can_open and run.state == RunState.SUSPENDED,
        idle_warning=idle_warning if phase == Phase.IDLE_WARNING else "",
    )


def _idle_warnings(runs: list[Run]) -> dict[int, str]:
    """The latest idle warning of each of ``runs`` that is warned now: one query, none when
    no workspace is."""
    warned = [
        run.pk
        for run in runs
        if run.state == RunState.RUNNING and run.workspace.warned_at is not None
    ]
    if not warned:
        return {}
    messages: dict[int, str] = {}
    for run_id, message in (
        RunEvent.objects.filter(run_id__in=warned, reason=IDLE_WARNING_EVENT)
        .order_by("run_id", "-at", "-id")
        .values_list("run_id", "message")
    ):
        messages.setdefault(run_id, message)
    return messages


def workspace_url(*, run: Run, server: str) -> str:
    """Where the browser opens the workspace: the proxy's base URL, the workspace's path
    and its server's start page (Jupyter: ``lab``)."""
    page = OPENS_AT.get(WorkspaceServer(server), "")
    return f"{settings.GANTRY_WORKSPACE_URL}{workspace_base_path(run.pk)}{page}"


def _latest_attempts(runs: list[Run]) -> dict[int, Attempt]:
    """run id -> its latest attempt, for a page of runs in one query."""
    latest: dict[int, Attempt] = {}
    if not runs:
        return latest
    attempts = Attempt.objects.filter(run_id__in=[run.pk for run in runs]).order_by(
        "run_id", "-number"
    )
    for attempt in attempts.only("id", "run_id", "number", "submitted_at", "started_at"):
        latest.setdefault(attempt.run_id, attempt)
    return latest
