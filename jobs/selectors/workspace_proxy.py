"""Where the workspace proxy may connect for a person (docs/workspaces.md, "The proxy")."""

from dataclasses import dataclass

from django.db.models import Exists, F, OuterRef

from jobs.models import Attempt, AttemptState, RunKind, RunState, Workspace


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
