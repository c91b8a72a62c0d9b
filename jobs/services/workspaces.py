"""Interactive workspaces (docs/workspaces.md): launched as runs of kind ``interactive``,
through the same validation, admission, accounting and billing as every run."""

import hashlib
import hmac
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.utils import timezone

from core.types import UserLike
from jobs.models import Run, RunKind, Workspace, WorkspaceServer
from jobs.services.submission import ExperimentInput, run_record, submission_once
from tenants.models import Tenant

# What the job runs: Gantry's launcher starts the server on the allocated node, on a free
# port, with the attempt's secret, and reports the address back (docs/workspaces.md).
LAUNCH_COMMANDS = {
    WorkspaceServer.JUPYTER: "gantry-workspace jupyter",
    WorkspaceServer.VSCODE: "gantry-workspace vscode",
}
# Where the proxy serves a workspace: every path of its server sits under this prefix.
PATH_PREFIX = "/w/"


@dataclass
class WorkspaceInput:
    """What a researcher asks for when launching a workspace (form, API, CLI)."""

    tenant: str
    project: str
    image: str  # repository@sha256:<64 hex>, or repository:tag (resolved at launch)
    flavor: str
    gpus: int
    server: str = WorkspaceServer.JUPYTER
    name: str = ""
    hours: int = 4


def workspace_base_path(run_id: int) -> str:
    """The path under which the proxy serves run ``run_id``'s server (its base URL)."""
    return f"{PATH_PREFIX}{run_id}/"


def workspace_server_token(attempt_id: int) -> str:
    """The secret the workspace server of ``attempt_id`` accepts, and only the proxy sends.

    Derived, never stored: the job gets it in its environment at submit, and the proxy
    derives it again for every request. A new attempt (a resume) has a new secret, so a
    server of an earlier attempt can never be reached with it.
    """
    return hmac.new(
        settings.SECRET_KEY.encode(), f"gantry-workspace:{attempt_id}".encode(), hashlib.sha256
    ).hexdigest()


def workspace_launch(
    *, user: UserLike, data: WorkspaceInput, submission_key: UUID | None = None
) -> Run:
    """Record a workspace and queue it: one node, ``data.gpus`` GPUs of ``data.flavor``,
    for ``data.hours`` at most (within its tenant's ``workspace_max_hours``). A repeated
    ``submission_key`` returns the workspace the first request queued."""
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: _workspace_record(user=user, data=data, submission_key=submission_key),
    ).run


def _workspace_record(*, user: UserLike, data: WorkspaceInput, submission_key: UUID | None) -> Run:
    errors: dict[str, list[str]] = {}
    if data.server not in WorkspaceServer.values:
        known = ", ".join(WorkspaceServer.values)
        errors["server"] = [f"Choose one of: {known}."]
    tenant = Tenant.objects.filter(slug=data.tenant).first()
    max_hours = tenant.workspace_max_hours if tenant else None
    if not isinstance(data.hours, int) or isinstance(data.hours, bool) or data.hours < 1:
        errors["hours"] = ["Ask for at least 1 hour."]
    elif max_hours is not None and data.hours > max_hours:
        errors["hours"] = [
            f"Tenant {data.tenant} allows a workspace at most {max_hours} hours (extensions "
            "included)."
        ]
    if errors:
        raise ValidationError(errors)
    run = run_record(
        user=user,
        data=ExperimentInput(
            tenant=data.tenant,
            project=data.project,
            image=data.image,
            command=LAUNCH_COMMANDS[WorkspaceServer(data.server)],
            flavor=data.flavor,
            nodes=1,
            gpus_per_node=data.gpus,
            name=data.name or f"{data.project}-workspace-{timezone.now():%Y%m%d-%H%M%S}",
            max_runtime_minutes=data.hours * 60,
        ),
        submission_key=submission_key,
        template=None,
        kind=RunKind.INTERACTIVE,
    )
    Workspace.objects.create(run=run, server=data.server)
    return run
