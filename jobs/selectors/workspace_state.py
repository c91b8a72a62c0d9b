"""A workspace's state beyond its run's."""

from jobs.models import Run, RunKind, Workspace


def workspace_suspending(run: Run) -> bool:
    """Whether the run is a workspace whose suspension was asked for: its attempt's end
    makes it SUSPENDED rather than cancelled or failed."""
    return (
        run.kind == RunKind.INTERACTIVE
        and run.cancel_requested_at is not None
        and Workspace.objects.filter(run=run, suspended_at__isnull=False).exists()
    )
