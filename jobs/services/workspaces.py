"""Interactive workspaces (docs/workspaces.md): launched as runs of kind ``interactive``,
through the same validation, admission, accounting and billing as every run."""

import hashlib
import hmac
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import F
from django.template.defaultfilters import pluralize
from django.utils import timezone

from core.types import UserLike, signed_in
from jobs.access import workspace_can_extend
from jobs.models import (
    TERMINAL_STATES,
    Run,
    RunEvent,
    RunKind,
    Workspace,
    WorkspaceServer,
)
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import (
    ExperimentInput,
    Submission,
    run_record,
    submission_once,
)
from jobs.workspace_models import NOT_OFFERED, OFFERED_SERVERS

# Defined beside the model, so that selectors read them too; imported here as before.
from jobs.workspace_models import PATH_PREFIX as PATH_PREFIX
from jobs.workspace_models import workspace_base_path as workspace_base_path
from tenants.models import Tenant
from tenants.services.audit import audit_record

# What the job runs: Gantry's launcher starts the server on the allocated node, on a free
# port, with the attempt's secret, and reports the address back (docs/workspaces.md).
LAUNCH_COMMANDS = {
    WorkspaceServer.JUPYTER: "gantry-workspace jupyter",
    WorkspaceServer.VSCODE: "gantry-workspace vscode",
}


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
    return workspace_submission(user=user, data=data, submission_key=submission_key).run


def workspace_submission(
    *, user: UserLike, data: WorkspaceInput, submission_key: UUID | None
) -> Submission:
    """``workspace_launch``, saying whether the key had launched it already (``replayed``)."""
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: _workspace_record(user=user, data=data, submission_key=submission_key),
    )


def _workspace_record(*, user: UserLike, data: WorkspaceInput, submission_key: UUID | None) -> Run:
    errors: dict[str, list[str]] = {}
    if data.server in NOT_OFFERED:
        errors["server"] = [NOT_OFFERED[WorkspaceServer(data.server)]]
    elif data.server not in OFFERED_SERVERS:
        errors["server"] = [f"Choose one of: {', '.join(OFFERED_SERVERS)}."]
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


@transaction.atomic
def workspace_extend(*, run: Run, actor: UserLike, hours: int) -> Workspace:
    """Give the workspace ``hours`` more: its limit (the hours it was launched with and
    every extension) stays within its tenant's ``workspace_max_hours``. Its owner or a
    tenant admin of its tenant; audited as "workspace.extend", in its timeline too.
    Refused, nothing changes: PermissionDenied, or ValidationError naming ``hours`` (or
    ``state`` for a workspace that has ended)."""
    if not workspace_can_extend(user=actor, run=run):
        raise PermissionDenied(
            f"Only the owner of the workspace or a tenant admin of {run.tenant.slug} can extend it."
        )
    if not isinstance(hours, int) or isinstance(hours, bool) or hours < 1:
        raise ValidationError({"hours": ["Extend by at least 1 hour."]})
    workspace = (
        Workspace.objects.select_for_update()
        .select_related("run__experiment", "run__tenant")
        .get(run_id=run.pk)
    )
    locked = workspace.run
    if locked.state in TERMINAL_STATES:
        raise ValidationError({"state": ["The workspace has ended: launch a new one."]})
    tenant = locked.tenant
    limit_minutes = locked.experiment.max_runtime_minutes + workspace.extended_minutes
    allowed_minutes = tenant.workspace_max_hours * 60 - limit_minutes
    if hours * 60 > allowed_minutes:
        more = (
            f"it may get {allowed_minutes // 60} more hour{pluralize(allowed_minutes // 60)}"
            if allowed_minutes >= 60
            else "it cannot be extended further"
        )
        raise ValidationError(
            {
                "hours": [
                    f"Tenant {tenant.slug} allows a workspace at most "
                    f"{tenant.workspace_max_hours} hours (extensions included): it has "
                    f"{_hours(limit_minutes)} already, {more}."
                ]
            }
        )
    before = workspace.extended_minutes
    Workspace.objects.filter(pk=workspace.pk).update(
        extended_minutes=F("extended_minutes") + hours * 60
    )
    workspace.refresh_from_db(fields=["extended_minutes"])
    total = _hours(limit_minutes + hours * 60)
    RunEvent.objects.create(
        run=locked,
        from_state=locked.state,
        to_state=locked.state,
        reason="EXTENDED",
        message=f"Extended by {hours} h by {actor.get_username()}: {total} in all",
        actor=signed_in(actor),
    )
    audit_record(
        actor=actor,
        action="workspace.extend",
        target=f"run {locked.pk}",
        tenant=tenant,
        before={"extended_minutes": before},
        after={"extended_minutes": workspace.extended_minutes},
    )
    return workspace


def _hours(minutes: int) -> str:
    hours, rest = divmod(minutes, 60)
    return f"{hours} h" if not rest else f"{hours} h {rest:02d} min"


@transaction.atomic
def workspace_stop(*, run: Run, actor: UserLike) -> Run:
    """Stop a workspace as a person: a run's cancel (``run_cancel``: the same permission,
    audit and backend cancel; a suspended one holds no job and ends at once)."""
    if run.kind != RunKind.INTERACTIVE:
        raise ValueError(f"Run {run.pk} is no workspace.")
    return run_cancel(run=run, actor=actor)
