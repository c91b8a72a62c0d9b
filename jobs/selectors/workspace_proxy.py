"""Where the workspace proxy may connect for a person (docs/workspaces.md, "The proxy")."""

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Exists, F, OuterRef

from jobs.models import TERMINAL_STATES, Attempt, AttemptState, Run, RunKind, RunState, Workspace


@dataclass(frozen=True)
class WorkspaceAddress:
    run_id: int
    attempt_id: int
    host: str
    port: int


def workspace_address_for_owner(*, run_id: int, user_id: int) -> WorkspaceAddress | None:
    """The address the backend reported for run ``run_id``'s workspace, if ``user_id``
    submitted it, it is running, and the address is its current attempt's: the run's latest
    attempt, itself running. None for every other case alike (another person's run, a
    batch run, a missing id, a workspace not or no longer answering). One query."""
    later_attempt = Attempt.objects.filter(
        run_id=OuterRef("run_id"), number__gt=OuterRef("attempt__number")
    )
    row = (
        Workspace.objects.filter(
            run_id=run_id,
            run__submitted_by_id=user_id,
            run__kind=RunKind.INTERACTIVE,
            run__state=RunState.RUNNING,
            attempt__run_id=F("run_id"),
            attempt__state=AttemptState.RUNNING,
            port__isnull=False,
        )
        .exclude(host="")
        .exclude(Exists(later_attempt))
        .values_list("attempt_id", "host", "port")
        .first()
    )
    if row is None:
        return None
    attempt_id, host, port = row
    assert port is not None  # filtered above
    return WorkspaceAddress(run_id=run_id, attempt_id=attempt_id, host=host, port=port)


def workspace_closed_for_owner(*, run_id: int, user_id: int) -> str | None:
    """Why run ``run_id``'s workspace does not answer now, told to its owner only (an old
    tab after a suspend, say): where it stands and where to go. None for anybody else and
    for an id that is not a workspace, whom the proxy answers as for a missing one. One
    query; asked only when ``workspace_address_for_owner`` found nothing."""
    state = (
        Run.objects.filter(pk=run_id, submitted_by_id=user_id, kind=RunKind.INTERACTIVE)
        .values_list("state", flat=True)
        .first()
    )
    if state is None:
        return None
    page = f"{settings.GANTRY_PUBLIC_URL.rstrip('/')}/workspaces/{run_id}/"
    if state == RunState.SUSPENDED:
        now = "is suspended: its GPUs were released and its files kept. Resume it from"
    elif state in TERMINAL_STATES:
        now = "has ended. Its page is"
    else:
        now = "is not answering yet (queued or starting). Its page shows where it stands:"
    return f"Workspace {run_id} {now} {page}\n"
