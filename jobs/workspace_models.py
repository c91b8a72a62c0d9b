"""Interactive workspaces: a run of kind ``interactive`` and what only a workspace has."""

from django.db import models
from django.db.models import Q

# Where the proxy serves a workspace: every path of its server sits under this prefix.
PATH_PREFIX = "/w/"


def workspace_base_path(run_id: int) -> str:
    """The path under which the proxy serves run ``run_id``'s server (its base URL)."""
    return f"{PATH_PREFIX}{run_id}/"


class RunKind(models.TextChoices):
    BATCH = "batch", "Batch run"
    INTERACTIVE = "interactive", "Workspace"


class WorkspaceServer(models.TextChoices):
    JUPYTER = "jupyter", "JupyterLab"
    VSCODE = "vscode", "VS Code (code-server)"


# What a workspace may be launched with. VS Code stays a kind of the interface, refused at
# launch with its reason rather than failing on the node after admission.
OFFERED_SERVERS = (WorkspaceServer.JUPYTER,)
NOT_OFFERED = {
    WorkspaceServer.VSCODE: "VS Code (code-server) is not offered yet: it needs Node 24 on "
    "the nodes and a proxy that strips the path (docs/workspaces.md, VS Code). Choose jupyter."
}


class Workspace(models.Model):
    """The interactive side of a run of kind ``interactive`` (docs/workspaces.md).

    Where its server answers is set only from what the backend reported for the attempt
    that runs it (``attempt``): the proxy connects there and nowhere else, and an address
    of an earlier attempt is never used for a later one.
    """

    run = models.OneToOneField(
        "jobs.Run", on_delete=models.CASCADE, primary_key=True, related_name="workspace"
    )
    server = models.CharField(
        max_length=16, choices=WorkspaceServer.choices, default=WorkspaceServer.JUPYTER
    )
    attempt = models.ForeignKey(
        "jobs.Attempt",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The attempt whose server answers at host:port",
    )
    host = models.CharField(max_length=253, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True, help_text="When its server answered")
    # Idle handling: the latest evidence of use on any signal, and what was done about it.
    last_activity_at = models.DateTimeField(null=True, blank=True)
    # The proxy's own signal: the latest request or WebSocket message it relayed (bumped
    # at most every PROXY_ACTIVITY_EVERY_S by each proxy process, and while a WebSocket
    # stays open).
    proxy_activity_at = models.DateTimeField(null=True, blank=True)
    warned_at = models.DateTimeField(null=True, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True)
    extended_minutes = models.PositiveIntegerField(default=0)
    # When the clusters it ran on let go of its files (Kubernetes: its volume deleted), once
    # it ended for good; until then every sync cycle asks them again
    # (jobs.services.workspace_storage).
    storage_released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(port__isnull=True) | Q(port__gte=1, port__lte=65535),
                name="workspace_port_range",
            ),
            models.CheckConstraint(
                condition=Q(host="", port__isnull=True) | (~Q(host="") & Q(port__isnull=False)),
                name="workspace_address_whole",
            ),
        ]

    def __str__(self) -> str:
        return f"workspace of run {self.run_id}"

    @property
    def address(self) -> tuple[str, int] | None:
        return (self.host, self.port) if self.host and self.port else None
