"""Every state change of experiments, runs and attempts goes through here."""

import json
import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from uuid import UUID

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from images.models import DIGEST_PATTERN, Image
from images.selectors import image_list_usable
from images.services import TagResolutionError, tag_resolve
from jobs import admission, reproducibility, spec
from jobs.backends import (
    MULTI_NODE_ENV,
    BackendError,
    CheckpointReport,
    JobRef,
    JobSpec,
    JobStatus,
    PermanentBackendError,
    TransientBackendError,
    backend_for,
)
from jobs.calendar import month_start, split_by_month
from jobs.models import (
    COMMIT_PATTERN,
    HOLDING_STATES,
    LIVE_ATTEMPT_STATES,
    MAX_COMMAND_BYTES,
    MAX_PARAMS_BYTES,
    Attempt,
    AttemptState,
    Checkpoint,
    Cluster,
    ClusterFlavor,
    Experiment,
    ExperimentTemplate,
    FairShareUsage,
    Run,
    RunEvent,
    RunState,
    TenantMonthUsage,
)
from jobs.selectors import (
    experiment_list_viewable,
    flavor_node_limits,
    template_can_manage,
    template_list_usable,
)
from tenants.models import GpuFlavor, Quota, Tenant, slug_validator
from tenants.roles import is_platform_admin, is_tenant_admin
from tenants.selectors import tenant_list_submittable
from tenants.services import audit_record

logger = logging.getLogger(__name__)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ID = 2**63 - 1  # ids are bigint: anything larger can only be a mistake
# A job may report its runtime while it runs and for this long after it ended (late
# reporters, clocks a little apart); later reports are refused with 409.
RUNTIME_REPORT_GRACE = timedelta(hours=1)
MAX_RUNTIME_REPORT_BYTES = 64 * 1024
ADMISSION_LOCK_KEY = 0x67616E747279  # "gantry"

try:
    GANTRY_VERSION = version("gantry")
except PackageNotFoundError:  # running from a checkout that was never installed
    GANTRY_VERSION = "0+unknown"


@dataclass
class ExperimentInput:
    """What a researcher asks for, as parsed by a form, the API or a spec file."""

    tenant: str
    project: str
    image: str  # repository@sha256:<64 hex>, or repository:tag (resolved at submit)
    command: str
    flavor: str
    nodes: int
    gpus_per_node: int
    name: str = ""
    code_repository: str = ""
    code_commit: str = ""
    dataset_uri: str = ""
    dataset_version: str = ""
    params: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    priority: int = 50
    max_runtime_minutes: int = 24 * 60
    max_restarts: int = 0
    checkpoint_dir: str = ""
    cloned_from: int | None = None  # id of the experiment this one was cloned from


def _check(errors: dict[str, list[str]], name: str, ok: bool, message: str) -> bool:
    if not ok:
        errors.setdefault(name, []).append(message)
    return ok


def _is_unicode_text(value) -> bool:
    """Whether every string in a JSON value is Unicode text: an unpaired surrogate (JSON
    may spell one, ``"\\ud800"``) has no UTF-8 encoding, so PostgreSQL cannot store it."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def experiment_validate(*, user, data: ExperimentInput) -> dict:
    """Check a request against every rule; raise ValidationError naming each bad field."""
    errors: dict[str, list[str]] = {}
    resolved: dict = {}

    tenant = tenant_list_submittable(user=user).filter(slug=data.tenant).first()
    if _check(errors, "tenant", tenant is not None, "Unknown tenant, or you are not a member."):
        resolved["tenant"] = tenant
        project = tenant.projects.filter(slug=data.project).first()
        if _check(errors, "project", project is not None, "Unknown project for this tenant."):
            resolved["project"] = project
        resolved["image"] = _resolve_image(errors, tenant=tenant, reference=data.image)
        if data.cloned_from is not None:
            resolved["cloned_from_id"] = _check_cloned_from(
                errors, user=user, tenant=tenant, experiment_id=data.cloned_from
            )

    flavor = GpuFlavor.objects.filter(slug=data.flavor).first()
    limits = flavor_node_limits()
    if _check(errors, "flavor", flavor is not None, "Unknown GPU flavor.") and _check(
        errors, "flavor", data.flavor in limits, "No enabled cluster offers this GPU flavor."
    ):
        resolved["flavor"] = flavor
        max_nodes, max_gpus = limits[data.flavor]
        if _check(errors, "nodes", data.nodes >= 1, "Must be at least 1.") and _check(
            errors, "nodes", data.nodes <= max_nodes, f"At most {max_nodes} nodes of {data.flavor}."
        ):
            pass
        if _check(errors, "gpus_per_node", data.gpus_per_node >= 1, "Must be at least 1."):
            _check(
                errors,
                "gpus_per_node",
                data.gpus_per_node <= max_gpus,
                f"A {data.flavor} node has at most {max_gpus} GPUs.",
            )
        if tenant is not None and "nodes" not in errors and "gpus_per_node" not in errors:
            _check_quota_allows(errors, tenant=tenant, flavor=flavor, data=data)
        if "nodes" not in errors and "gpus_per_node" not in errors:
            fits = ClusterFlavor.objects.filter(
                cluster__enabled=True,
                flavor=flavor,
                nodes__gte=data.nodes,
                gpus_per_node__gte=data.gpus_per_node,
            ).exists()
            _check(
                errors,
                "nodes",
                fits,
                f"No single cluster has {data.nodes} nodes with {data.gpus_per_node} "
                f"{data.flavor} GPUs each.",
            )
    else:
        _check(errors, "nodes", data.nodes >= 1, "Must be at least 1.")
        _check(errors, "gpus_per_node", data.gpus_per_node >= 1, "Must be at least 1.")

    command = data.command or ""
    _check(errors, "command", command.strip() != "", "A command is required.")
    _check(
        errors,
        "command",
        len(command.encode()) <= MAX_COMMAND_BYTES,
        f"At most {MAX_COMMAND_BYTES // 1024} KiB.",
    )
    _check(errors, "command", "\x00" not in command, "Must not contain NUL characters.")

    if _check(errors, "params", isinstance(data.params, dict), "Must be a JSON object."):
        try:
            encoded = json.dumps(data.params, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError):
            _check(errors, "params", False, "Only JSON values; NaN and Infinity are not JSON.")
        else:
            size = len(encoded.encode())
            _check(errors, "params", size <= MAX_PARAMS_BYTES, "At most 64 KiB as JSON.")
            _check(errors, "params", "\\u0000" not in encoded, "Must not contain NUL characters.")
            _check(
                errors,
                "params",
                _is_unicode_text(data.params),
                "Must not contain unpaired surrogates (\\ud800 to \\udfff).",
            )
    if _check(errors, "env", isinstance(data.env, dict), "Must be an object of names to strings."):
        for key, value in data.env.items():
            if not ENV_NAME.match(str(key)):
                _check(errors, "env", False, f"{key!r} is not a valid variable name.")
            elif key in reproducibility.RESERVED_ENV:
                _check(errors, "env", False, f"{key} is set by Gantry for every job; leave it out.")
            elif key in MULTI_NODE_ENV and data.nodes > 1:
                _check(
                    errors,
                    "env",
                    False,
                    f"{key} is set by Gantry in every task of a multi-node job; leave it out.",
                )
            elif not isinstance(value, str) or "\x00" in value:
                _check(errors, "env", False, f"The value of {key} must be a string.")

    if data.code_repository or data.code_commit:
        _check(
            errors,
            "code_commit",
            re.fullmatch(COMMIT_PATTERN, data.code_commit or "") is not None,
            "A commit is 40 lowercase hex characters.",
        )
        _check(errors, "code_repository", bool(data.code_repository), "Required with a commit.")
    _check(errors, "priority", 0 <= data.priority <= 100, "Between 0 and 100.")
    _check(
        errors,
        "max_runtime_minutes",
        1 <= data.max_runtime_minutes <= 30 * 24 * 60,
        "Between 1 minute and 30 days.",
    )
    _check(errors, "max_restarts", 0 <= data.max_restarts <= 20, "Between 0 and 20.")
    for name in ("name", "code_repository", "dataset_uri", "dataset_version", "checkpoint_dir"):
        limit = Experiment._meta.get_field(name).max_length
        value = getattr(data, name) or ""
        _check(errors, name, len(value) <= limit, f"At most {limit} characters.")
        _check(errors, name, "\x00" not in value, "Must not contain NUL characters.")
    if errors:
        raise ValidationError(errors)
    return resolved


def _check_quota_allows(errors, *, tenant, flavor, data: ExperimentInput) -> None:
    """Refuse at submit what the tenant's quota could never admit."""
    gpus = data.nodes * data.gpus_per_node
    quota = Quota.objects.filter(tenant=tenant, flavor=flavor).first()
    ceiling = 0 if quota is None else quota.guaranteed_gpus + quota.borrow_limit_gpus
    if not _check(
        errors, "flavor", ceiling > 0, f"Tenant {tenant.slug} has no quota for {flavor.slug}."
    ):
        return
    if quota.max_gpus_per_run is not None and gpus > quota.max_gpus_per_run:
        _check(
            errors,
            "gpus_per_node",
            False,
            f"This run asks for {gpus} GPUs; tenant {tenant.slug} may use at most "
            f"{quota.max_gpus_per_run} {flavor.slug} GPUs per run.",
        )
        return
    _check(
        errors,
        "gpus_per_node",
        gpus <= ceiling,
        f"This run asks for {gpus} GPUs and could never start: tenant {tenant.slug} may hold "
        f"at most {ceiling} {flavor.slug} GPUs ({quota.guaranteed_gpus} guaranteed + "
        f"{quota.borrow_limit_gpus} borrowed).",
    )


def _check_cloned_from(errors, *, user, tenant, experiment_id) -> int | None:
    """A clone's source must be an experiment of the same tenant that the user can read;
    anything else gets the same answer, so the check reveals nothing."""
    found = (
        isinstance(experiment_id, int)
        and 1 <= experiment_id <= MAX_ID
        and experiment_list_viewable(user=user).filter(pk=experiment_id, tenant=tenant).exists()
    )
    _check(
        errors,
        "cloned_from",
        found,
        f"Experiment {experiment_id} is not an experiment of tenant {tenant.slug} you can read.",
    )
    return experiment_id if found else None


def _resolve_image(errors, *, tenant, reference: str) -> Image | None:
    """The approved image visible to the tenant that ``reference`` names, pinned by digest.

    ``repository@sha256:…`` is looked up as given. ``repository:tag`` is accepted only to be
    resolved: the registry of the repository's host says which digest the tag points to now,
    and that digest must be an approved image; the experiment records the digest. Resolving
    calls the registry inside run_submit's transaction, so each request has a short timeout
    (images.services.SUBMIT_TIMEOUT_S); a registry that does not answer fails the submit.
    """
    reference = (reference or "").strip()
    repository, at, digest = reference.partition("@")
    if not at:
        repository, colon, tag = reference.rpartition(":")
        if not colon or not repository or "/" in tag:
            _check(
                errors,
                "image",
                False,
                "Pin the image by digest (repository@sha256:<64 hex>) or name a tag to "
                "resolve (repository:tag).",
            )
            return None
        try:
            digest = tag_resolve(repository=repository, tag=tag)
        except TagResolutionError as exc:
            _check(errors, "image", False, str(exc))
            return None
        image = (
            image_list_usable(tenant=tenant).filter(repository=repository, digest=digest).first()
        )
        _check(
            errors,
            "image",
            image is not None,
            f"This tag resolves to {digest}, which is not approved for this tenant.",
        )
        return image
    if not re.fullmatch(DIGEST_PATTERN, digest):
        _check(errors, "image", False, "Invalid digest: expected sha256: and 64 lowercase hex.")
        return None
    image = image_list_usable(tenant=tenant).filter(repository=repository, digest=digest).first()
    _check(errors, "image", image is not None, "This image is not approved for this tenant.")
    return image


def run_submitted_with(*, user, submission_key: UUID | None) -> Run | None:
    """The run this user already queued with this one-time form key, if any."""
    if submission_key is None:
        return None
    return Run.objects.filter(submitted_by=user, submission_key=submission_key).first()


def _submit_once(*, user, submission_key: UUID | None, create: Callable[[], Run]) -> Run:
    """``create()`` unless this user's ``submission_key`` already queued a run: then that run.

    The key is checked before validating, so a replay of a form that was accepted is never
    refused later (say, once the quota is used). Two requests racing with one key both pass
    the check; the unique constraint on (submitted_by, submission_key) makes the second insert
    wait for the first and fail, and the second then answers with the first's run: its
    savepoint rolls back the experiment it had recorded, so nothing is left behind.
    """
    earlier = run_submitted_with(user=user, submission_key=submission_key)
    if earlier is not None:
        return earlier
    try:
        with transaction.atomic():
            return create()
    except IntegrityError:
        earlier = run_submitted_with(user=user, submission_key=submission_key)
        if earlier is None:
            raise
        return earlier


def run_submit(*, user, data: ExperimentInput, submission_key: UUID | None = None) -> Run:
    """Record the experiment and queue a run of it; admission picks it up after commit.

    With a ``submission_key`` (the submit form's one-time key) a repeated request returns
    the run the first one queued and records nothing new.
    """
    return _submit_once(
        user=user,
        submission_key=submission_key,
        create=lambda: _run_submit_new(user=user, data=data, submission_key=submission_key),
    )


def _run_submit_new(*, user, data: ExperimentInput, submission_key: UUID | None) -> Run:
    resolved = experiment_validate(user=user, data=data)
    image = resolved["image"]
    experiment = Experiment.objects.create(
        tenant=resolved["tenant"],
        project=resolved["project"],
        owner=user,
        name=data.name or f"{resolved['project'].slug}-{timezone.now():%Y%m%d-%H%M%S}",
        image=image,
        image_reference=image.reference,
        command=data.command,
        env=data.env,
        code_repository=data.code_repository,
        code_commit=data.code_commit,
        dataset_uri=data.dataset_uri,
        dataset_version=data.dataset_version,
        params=data.params,
        flavor=resolved["flavor"],
        nodes=data.nodes,
        gpus_per_node=data.gpus_per_node,
        priority=data.priority,
        max_runtime_minutes=data.max_runtime_minutes,
        max_restarts=data.max_restarts,
        checkpoint_dir=data.checkpoint_dir,
        cloned_from_id=resolved.get("cloned_from_id"),
        gantry_version=GANTRY_VERSION,
    )
    return _run_create(experiment=experiment, user=user, submission_key=submission_key)


def experiment_can_rerun(*, user, experiment: Experiment) -> bool:
    """Re-running spends the tenant's quota: membership is required, like submitting."""
    return tenant_list_submittable(user=user).filter(pk=experiment.tenant_id).exists()


def experiment_input_of(experiment: Experiment) -> ExperimentInput:
    """The request that would record this experiment again, as it was recorded."""
    return ExperimentInput(
        tenant=experiment.tenant.slug,
        project=experiment.project.slug,
        image=experiment.image_reference,
        command=experiment.command,
        flavor=experiment.flavor.slug,
        nodes=experiment.nodes,
        gpus_per_node=experiment.gpus_per_node,
        name=experiment.name,
        code_repository=experiment.code_repository,
        code_commit=experiment.code_commit,
        dataset_uri=experiment.dataset_uri,
        dataset_version=experiment.dataset_version,
        params=experiment.params,
        env=experiment.env,
        priority=experiment.priority,
        max_runtime_minutes=experiment.max_runtime_minutes,
        max_restarts=experiment.max_restarts,
        checkpoint_dir=experiment.checkpoint_dir,
    )


def run_rerun(*, experiment: Experiment, user, submission_key: UUID | None = None) -> Run:
    """Queue a new run of the same experiment record: same image digest, command, code,
    data, params and resources. Every submit rule is checked again (membership, the image
    still approved and visible to the tenant, a quota that could ever admit it). A repeated
    ``submission_key`` returns the run its first request queued."""
    if not experiment_can_rerun(user=user, experiment=experiment):
        raise PermissionDenied(
            f"Only members of tenant {experiment.tenant.slug} can run its experiments."
        )
    return _submit_once(
        user=user,
        submission_key=submission_key,
        create=lambda: _run_rerun_new(
            experiment=experiment, user=user, submission_key=submission_key
        ),
    )


def _run_rerun_new(*, experiment: Experiment, user, submission_key: UUID | None) -> Run:
    image = experiment.image
    if image.status != Image.Status.APPROVED:
        raise ValidationError(
            {
                "image": f"The image {experiment.image_reference} is "
                f"{image.get_status_display().lower()}, so this experiment cannot run again "
                "exactly. Clone and edit it to choose another image."
            }
        )
    if not image_list_usable(tenant=experiment.tenant).filter(pk=image.pk).exists():
        raise ValidationError(
            {
                "image": f"The image {experiment.image_reference} is no longer available to "
                f"tenant {experiment.tenant.slug}. Clone and edit it to choose another image."
            }
        )
    experiment_validate(user=user, data=experiment_input_of(experiment))
    return _run_create(
        experiment=experiment,
        user=user,
        reason="RERUN",
        message=f"Re-run of experiment {experiment.pk} (exact)",
        submission_key=submission_key,
    )


def _run_create(
    *,
    experiment: Experiment,
    user,
    reason: str = "SUBMITTED",
    message: str = "Submitted",
    submission_key: UUID | None = None,
) -> Run:
    run = Run.objects.create(
        experiment=experiment,
        tenant=experiment.tenant,
        flavor=experiment.flavor,
        gpus=experiment.total_gpus,
        priority=experiment.priority,
        submitted_by=user,
        submission_key=submission_key,
    )
    RunEvent.objects.create(
        run=run, to_state=RunState.QUEUED, reason=reason, actor=user, message=message
    )
    _enqueue_admission()
    return run


def _enqueue_admission() -> None:
    from jobs.tasks import admission_cycle

    # The broker is only a trigger and beat re-drives what a lost message would have done:
    # a broker that is down must not fail a write that has committed (robust=True logs it).
    transaction.on_commit(admission_cycle.delay, robust=True)


def run_transition(
    *,
    run: Run,
    to: RunState,
    expected: Iterable[RunState],
    reason: str,
    message: str = "",
    actor=None,
    attempt: Attempt | None = None,
    **fields,
) -> bool:
    """Move a run to ``to`` only if it is still in one of ``expected``; record the event.

    The conditional UPDATE is the claim: of two workers acting on the same run, one wins.
    """
    expected = tuple(expected)
    updated = Run.objects.filter(pk=run.pk, state__in=expected).update(state=to, **fields)
    if not updated:
        return False
    from_state = run.state if run.state in expected else ""
    RunEvent.objects.create(
        run=run,
        attempt=attempt,
        from_state=from_state,
        to_state=to,
        reason=reason,
        message=message,
        actor=actor,
    )
    run.state = to
    for name, value in fields.items():
        setattr(run, name, value)
    return True


def run_can_cancel(*, user, run: Run) -> bool:
    return (
        run.submitted_by_id == user.pk
        or is_tenant_admin(user, run.tenant_id)
        or is_platform_admin(user)
    )


@transaction.atomic
def run_cancel(*, run: Run, actor, system_reason: str = "") -> Run:
    """Cancel a run: at once if it holds no backend job yet, else through the backend.

    Gantry itself cancels (a tenant's idle-GPU policy) with ``actor`` None and a
    ``system_reason``: that becomes the message of the run's event, and no person's
    permission is checked. A person's cancel is audited as "run.cancel" (Gantry's are in
    the run's timeline only).
    """
    if (actor is None) != bool(system_reason):
        raise ValueError("Cancel either as a person (actor) or as Gantry (system_reason).")
    if actor is not None and not run_can_cancel(user=actor, run=run):
        raise PermissionDenied("Only the submitter, a tenant admin or a platform admin can cancel.")
    run = Run.objects.select_for_update().get(pk=run.pk)
    now = timezone.now()
    before = {"state": run.state, "cancel_requested": run.cancel_requested_at is not None}
    if run.state in (RunState.QUEUED, RunState.ADMITTED, RunState.PREEMPTED):
        run_transition(
            run=run,
            to=RunState.CANCELLED,
            expected=(RunState.QUEUED, RunState.ADMITTED, RunState.PREEMPTED),
            reason="CANCELLED",
            message=system_reason
            or f"Cancelled by {actor.get_username()} before it reached the cluster",
            actor=actor,
            finished_at=now,
            cancel_requested_at=now,
            failure_reason="CANCELLED",
            wait_reason="",
            wait_message="",
            queue_position=None,
        )
        Attempt.objects.filter(run=run, state=AttemptState.CREATED).update(
            state=AttemptState.CANCELLED, finished_at=now, failure_reason="CANCELLED"
        )
        _run_cancel_audit(run=run, actor=actor, before=before)
        _enqueue_admission()
        return run
    if run.state in (RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING):
        if run.cancel_requested_at is None:
            Run.objects.filter(pk=run.pk).update(cancel_requested_at=now)
            run.cancel_requested_at = now
            RunEvent.objects.create(
                run=run,
                from_state=run.state,
                to_state=run.state,
                reason="CANCEL_REQUESTED",
                message=system_reason or f"Cancel requested by {actor.get_username()}",
                actor=actor,
            )
            _run_cancel_audit(run=run, actor=actor, before=before)
            attempt = run.attempts.order_by("-number").first()
            from jobs.tasks import attempt_cancel

            transaction.on_commit(lambda: attempt_cancel.delay(attempt.pk), robust=True)
        return run
    raise ValidationError({"state": f"The run is already {run.get_state_display().lower()}."})


def _run_cancel_audit(*, run: Run, actor, before: dict) -> None:
    if actor is None:
        return
    audit_record(
        actor=actor,
        action="run.cancel",
        target=f"run {run.pk}",
        tenant=run.tenant,
        before=before,
        after={"state": run.state, "cancel_requested": True},
    )


# --- admission -------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionSummary:
    admitted: int
    preempted: int
    waiting: int


def _admission_lock() -> bool:
    """One admitter at a time. PostgreSQL: a transaction-scoped advisory lock. SQLite takes
    its single write lock at BEGIN (IMMEDIATE transactions), which serializes admitters."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADMISSION_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def _quota_of(row: dict) -> admission.Quota:
    return admission.Quota(
        guaranteed=row["guaranteed_gpus"],
        borrow_limit=row["borrow_limit_gpus"],
        max_gpus_per_run=row["max_gpus_per_run"],
        budget_gpu_hours=row["monthly_gpu_hour_budget"],
        budget_hard=row["budget_mode"] == Quota.BudgetMode.HARD,
        weight=row["fair_share_weight"],
    )


def admission_snapshot(*, now=None) -> tuple[admission.Snapshot, dict[str, Cluster]]:
    """Everything admission needs, read in a handful of queries."""
    now = now or timezone.now()
    queued = tuple(
        admission.QueuedRun(
            id=row["id"],
            tenant=row["tenant__slug"],
            flavor=row["flavor__slug"],
            nodes=row["experiment__nodes"],
            gpus_per_node=row["experiment__gpus_per_node"],
            priority=row["priority"],
            submitted=row["submitted_at"].timestamp(),
        )
        for row in Run.objects.filter(state=RunState.QUEUED).values(
            "id",
            "tenant__slug",
            "flavor__slug",
            "experiment__nodes",
            "experiment__gpus_per_node",
            "priority",
            "submitted_at",
        )
    )
    held = tuple(
        admission.HeldRun(
            id=row["id"],
            tenant=row["tenant__slug"],
            flavor=row["flavor__slug"],
            cluster=row["cluster__name"],
            gpus=row["gpus"],
            priority=row["priority"],
            admitted=(row["admitted_at"] or row["submitted_at"]).timestamp(),
            borrowed=row["borrowed"],
        )
        for row in Run.objects.filter(state__in=HOLDING_STATES).values(
            "id",
            "tenant__slug",
            "flavor__slug",
            "cluster__name",
            "gpus",
            "priority",
            "admitted_at",
            "submitted_at",
            "borrowed",
        )
    )
    clusters: dict[str, Cluster] = {}
    pools = []
    for cf in ClusterFlavor.objects.filter(cluster__enabled=True).select_related(
        "cluster", "flavor"
    ):
        clusters[cf.cluster.name] = cf.cluster
        pools.append(
            admission.Pool(
                cluster=cf.cluster.name,
                flavor=cf.flavor.slug,
                nodes=cf.nodes,
                gpus_per_node=cf.gpus_per_node,
            )
        )
    quotas = {
        (row["tenant__slug"], row["flavor__slug"]): _quota_of(row)
        for row in Quota.objects.filter(tenant__active=True).values(
            "tenant__slug",
            "flavor__slug",
            "guaranteed_gpus",
            "borrow_limit_gpus",
            "max_gpus_per_run",
            "monthly_gpu_hour_budget",
            "budget_mode",
            "fair_share_weight",
        )
    }
    decayed = {
        (tenant, flavor): gpu_seconds
        for tenant, flavor, gpu_seconds in FairShareUsage.objects.values_list(
            "tenant__slug", "flavor__slug", "decayed_gpu_seconds"
        )
    }
    snapshot = admission.Snapshot(
        queued=queued,
        held=held,
        pools=tuple(pools),
        quotas=quotas,
        budget_used=gpu_hours_this_month(now=now),
        decayed_usage=decayed,
        now=now.timestamp(),
        starvation_after_s=settings.GANTRY_STARVATION_AFTER_S,
    )
    return snapshot, clusters


def gpu_hours_this_month(*, now, tenant=None) -> dict[tuple[str, str], float]:
    """Allocated GPU-hours this month per (tenant, flavor): finished attempts from the
    ledger, running ones prorated up to ``now``."""
    month = month_start(now)
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    ledger = TenantMonthUsage.objects.filter(month=month.date())
    live = Attempt.objects.filter(state__in=LIVE_ATTEMPT_STATES, started_at__isnull=False)
    if tenant is not None:
        ledger, live = ledger.filter(tenant=tenant), live.filter(run__tenant=tenant)
    for tenant_slug, flavor, gpu_seconds in ledger.values_list(
        "tenant__slug", "flavor__slug", "gpu_seconds"
    ):
        seconds[(tenant_slug, flavor)] += gpu_seconds
    for tenant_slug, flavor, gpus, started in live.values_list(
        "run__tenant__slug", "run__flavor__slug", "run__gpus", "started_at"
    ):
        seconds[(tenant_slug, flavor)] += gpus * max(
            0.0, (now - max(started, month)).total_seconds()
        )
    return {key: value / 3600 for key, value in seconds.items()}


def usage_record_attempt(*, attempt: Attempt, started, finished) -> None:
    """Add a finished attempt's allocated GPU-seconds to the monthly ledger (split by month)."""
    if started is None or finished is None or finished <= started:
        return
    run = attempt.run
    for month, seconds in split_by_month(started, finished):
        row, _ = TenantMonthUsage.objects.get_or_create(
            tenant_id=run.tenant_id, flavor_id=run.flavor_id, month=month
        )
        TenantMonthUsage.objects.filter(pk=row.pk).update(
            gpu_seconds=F("gpu_seconds") + seconds * run.gpus
        )


def fair_share_update(*, held: tuple[admission.HeldRun, ...], now) -> None:
    """Decay every tenant's usage by the time since the last update and add what it held."""
    half_life_s = settings.GANTRY_FAIR_SHARE_HALF_LIFE_H * 3600
    holding: dict[tuple[str, str], int] = defaultdict(int)
    for run in held:
        holding[(run.tenant, run.flavor)] += run.gpus
    rows = {
        (row.tenant.slug, row.flavor.slug): row
        for row in FairShareUsage.objects.select_related("tenant", "flavor")
    }
    changed = []
    for key, row in rows.items():
        row.decayed_gpu_seconds = admission.fair_share_decayed(
            row.decayed_gpu_seconds,
            gpus_held=holding.get(key, 0),
            elapsed_s=max(0.0, (now - row.updated_at).total_seconds()),
            half_life_s=half_life_s,
        )
        row.updated_at = now
        changed.append(row)
    _update_rows(
        FairShareUsage,
        ["decayed_gpu_seconds", "updated_at"],
        [(row.pk, row.decayed_gpu_seconds, row.updated_at) for row in changed],
    )
    missing = [key for key in holding if key not in rows]
    if missing:
        tenants = dict(
            Tenant.objects.filter(slug__in={t for t, _ in missing}).values_list("slug", "id")
        )
        flavors = dict(
            GpuFlavor.objects.filter(slug__in={f for _, f in missing}).values_list("slug", "id")
        )
        FairShareUsage.objects.bulk_create(
            [
                FairShareUsage(tenant_id=tenants[t], flavor_id=flavors[f], updated_at=now)
                for t, f in missing
            ],
            ignore_conflicts=True,
        )


def _update_rows(model, fields: list[str], rows: list[tuple], **only_if) -> None:
    """Set ``fields`` of many rows, given as ``(pk, *values)``, in one statement per 5,000.

    bulk_update's CASE WHEN per row costs seconds at 10,000 rows (in Django and in the
    database); a join against VALUES costs milliseconds. ``only_if`` (column=value) skips
    rows that changed meanwhile.
    """
    if not rows:
        return
    table = connection.ops.quote_name(model._meta.db_table)
    pk = connection.ops.quote_name(model._meta.pk.column)
    columns = [connection.ops.quote_name(model._meta.get_field(f).column) for f in fields]
    names = ", ".join(f"v{i}" for i in range(len(fields)))
    assignments = ", ".join(f"{c} = v.v{i}" for i, c in enumerate(columns))
    conditions = "".join(
        f" AND {table}.{connection.ops.quote_name(model._meta.get_field(f).column)} = %s"
        for f in only_if
    )
    placeholder = "(" + ", ".join(["%s"] * (len(fields) + 1)) + ")"
    for start in range(0, len(rows), 5000):
        batch = rows[start : start + 5000]
        with connection.cursor() as cursor:
            # Identifiers come from model metadata (quoted); every value is a parameter.
            sql = (
                f"WITH v(id, {names}) AS (VALUES {', '.join([placeholder] * len(batch))}) "  # noqa: S608
                f"UPDATE {table} SET {assignments} FROM v WHERE {table}.{pk} = v.id{conditions}"
            )
            cursor.execute(
                sql,
                [value for row in batch for value in row] + list(only_if.values()),
            )


@transaction.atomic
def admission_run_cycle(*, now=None) -> AdmissionSummary | None:
    """Decide on every queued run and apply the decisions. None if another admitter runs."""
    if not _admission_lock():
        return None
    now = now or timezone.now()
    snapshot, clusters = admission_snapshot(now=now)
    fair_share_update(held=snapshot.held, now=now)
    decisions = admission.decide(snapshot)

    preempted = 0
    if decisions.preempted:
        victims = Run.objects.in_bulk([p.run_id for p in decisions.preempted])
        for decision in decisions.preempted:
            preempted += run_preempt(run=victims[decision.run_id], message=decision.message)

    admitted_ids = [d.run_id for d in decisions.admitted]
    runs = Run.objects.select_related("flavor").in_bulk(admitted_ids)
    attempt_counts = dict(
        Attempt.objects.filter(run_id__in=admitted_ids)
        .values("run_id")
        .annotate(n=Count("id"))
        .values_list("run_id", "n")
    )
    latest_checkpoints = {
        checkpoint.run_id: checkpoint
        for checkpoint in Checkpoint.objects.filter(run_id__in=admitted_ids).order_by("step")
    }
    new_attempts = []
    for decision in decisions.admitted:
        run = runs[decision.run_id]
        cluster = clusters[decision.cluster]
        how = "borrowing idle GPUs (preemptible)" if decision.borrowed else "within its guarantee"
        if decision.over_budget:
            how += "; past its soft monthly budget"
        claimed = run_transition(
            run=run,
            to=RunState.ADMITTED,
            expected=(RunState.QUEUED,),
            reason="ADMITTED",
            message=f"Admitted to {cluster.name}: {run.gpus} {run.flavor.slug} GPUs {how}",
            cluster=cluster,
            admitted_at=now,
            borrowed=decision.borrowed,
            over_budget=decision.over_budget,
            wait_reason="",
            wait_message="",
            queue_position=None,
        )
        if claimed:
            new_attempts.append(
                Attempt.objects.create(
                    run=run,
                    number=attempt_counts.get(run.pk, 0) + 1,
                    cluster=cluster,
                    resumed_from=latest_checkpoints.get(run.pk),
                )
            )
    reservations = {r.run_id: r for r in decisions.reservations}
    written = {
        run_id: (reason, message, position)
        for run_id, reason, message, position in Run.objects.filter(
            state=RunState.QUEUED
        ).values_list("id", "wait_reason", "wait_message", "queue_position")
    }
    changed = []
    for wait in decisions.waiting:
        message = wait.message
        if wait.run_id in reservations:
            held = reservations[wait.run_id]
            message += f"; {held.gpus} GPUs on {held.cluster} are held for it"
        row = (wait.reason.value, message[:500], wait.position)
        if written.get(wait.run_id, row) != row:
            changed.append((wait.run_id, *row))
    _update_rows(
        Run, ["wait_reason", "wait_message", "queue_position"], changed, state=RunState.QUEUED
    )
    if new_attempts:
        from jobs.tasks import attempt_submit

        ids = [a.pk for a in new_attempts]
        transaction.on_commit(lambda: [attempt_submit.delay(i) for i in ids], robust=True)
    return AdmissionSummary(
        admitted=len(new_attempts), preempted=preempted, waiting=len(decisions.waiting)
    )


def run_preempt(*, run: Run, message: str) -> int:
    """Take a borrowed run off its GPUs. It is requeued once its backend job is gone and
    resumes from its latest checkpoint when admitted again."""
    holding = (RunState.ADMITTED, RunState.SUBMITTING, RunState.PENDING, RunState.RUNNING)
    if not run_transition(
        run=run, to=RunState.PREEMPTED, expected=holding, reason="PREEMPTED", message=message
    ):
        return 0
    attempt = run.attempts.order_by("-number").first()
    if attempt is None or attempt.state == AttemptState.CREATED:
        if attempt is not None:
            Attempt.objects.filter(pk=attempt.pk).update(
                state=AttemptState.PREEMPTED, finished_at=timezone.now(), failure_reason="PREEMPTED"
            )
        _run_requeue_after_preemption(run=run, attempt=attempt)
        return 1
    from jobs.tasks import attempt_cancel

    attempt_id = attempt.pk
    transaction.on_commit(lambda: attempt_cancel.delay(attempt_id), robust=True)
    return 1


def _run_requeue_after_preemption(*, run: Run, attempt: Attempt | None) -> None:
    checkpoint = run.checkpoints.order_by("-step").first()
    resume = f"; it will resume from checkpoint step {checkpoint.step}" if checkpoint else ""
    run_transition(
        run=run,
        to=RunState.QUEUED,
        expected=(RunState.PREEMPTED,),
        reason="REQUEUED",
        message=f"Back in the queue after preemption{resume}",
        attempt=attempt,
        cluster=None,
        borrowed=False,
    )
    _enqueue_admission()


# --- backend work ----------------------------------------------------------------------


def job_spec_for(attempt: Attempt) -> JobSpec:
    experiment = attempt.run.experiment
    env = {str(k): str(v) for k, v in experiment.env.items()}
    checkpoint = attempt.resumed_from
    if checkpoint is not None:
        # How a job learns where to resume: the same two variables on every backend.
        env |= {"GANTRY_RESUME_FROM": checkpoint.uri, "GANTRY_RESUME_STEP": str(checkpoint.step)}
    # Where the job reports its runtime, with the token the backend passes it separately.
    env[reproducibility.API_URL_ENV] = f"{settings.GANTRY_PUBLIC_URL}/api/v1"
    return JobSpec(
        name=attempt.name,
        attempt_id=attempt.pk,
        run_id=attempt.run_id,
        tenant=attempt.run.tenant.slug,
        project=experiment.project.slug,
        image=experiment.image_reference,
        command=experiment.command,
        env=env,
        flavor=experiment.flavor.slug,
        nodes=experiment.nodes,
        gpus_per_node=experiment.gpus_per_node,
        max_runtime_s=experiment.max_runtime_minutes * 60,
        checkpoint_dir=experiment.checkpoint_dir,
        resume_step=checkpoint.step if checkpoint else None,
        resume_uri=checkpoint.uri if checkpoint else "",
        attempt_token=reproducibility.attempt_token(
            secret=settings.SECRET_KEY, attempt_id=attempt.pk
        ),
    )


def _attempt_for_work(attempt_id: int) -> Attempt:
    return Attempt.objects.select_related(
        "cluster",
        "resumed_from",
        "run__tenant",
        "run__experiment__project",
        "run__experiment__flavor",
    ).get(pk=attempt_id)


def attempt_submit(*, attempt_id: int) -> None:
    """Send an admitted attempt to its backend. Safe to call again for the same attempt:
    the backend adopts the job already named after the attempt."""
    attempt = _attempt_for_work(attempt_id)
    run = attempt.run
    backend = backend_for(attempt.cluster)
    spec = job_spec_for(attempt)
    with transaction.atomic():
        if attempt.state == AttemptState.CREATED:
            if not run_transition(
                run=run,
                to=RunState.SUBMITTING,
                expected=(RunState.ADMITTED,),
                reason="SUBMITTING",
                message=f"Submitting to {attempt.cluster.name}",
                attempt=attempt,
            ):
                return  # cancelled (or otherwise moved on) before we got to it
            try:
                rendered = backend.render(spec)
            except PermanentBackendError as exc:
                rendered = ""
                _attempt_fail_submit(attempt, run, exc)
                return
            Attempt.objects.filter(pk=attempt.pk, state=AttemptState.CREATED).update(
                state=AttemptState.SUBMITTING, rendered_spec=rendered
            )
            attempt.state = AttemptState.SUBMITTING
        elif attempt.state != AttemptState.SUBMITTING:
            return  # already submitted: a redelivered task has nothing to do
    try:
        job_id = backend.submit(spec)
    except TransientBackendError as exc:
        waited = (timezone.now() - attempt.created_at).total_seconds()
        if waited <= settings.GANTRY_SUBMIT_GIVE_UP_S:
            Attempt.objects.filter(pk=attempt.pk).update(
                backend_error=f"backend unreachable: {exc}"[:2000]
            )
            raise
        # A cluster that never answers (wrong URL, long outage) must not hold a run forever.
        exc = PermanentBackendError(
            f"backend unreachable for {waited / 60:.0f} minutes, giving up: {exc}"
        )
        with transaction.atomic():
            _attempt_fail_submit(attempt, run, exc)
        return
    except PermanentBackendError as exc:
        with transaction.atomic():
            _attempt_fail_submit(attempt, run, exc)
        return
    with transaction.atomic():
        moved, accepted = _attempt_accept(attempt=attempt, job_id=job_id, now=timezone.now())
    run.refresh_from_db(fields=["state", "cancel_requested_at"])
    if moved and (not accepted or run.cancel_requested_at is not None):
        # Cancelled or preempted while the job was on its way: take it off the cluster too.
        backend.cancel(JobRef(name=attempt.name, backend_job_id=job_id))


def _attempt_accept(
    *, attempt: Attempt, job_id: str, now, found_by_sync: bool = False
) -> tuple[bool, bool]:
    """Record that the backend holds the attempt's job: the attempt goes from SUBMITTING to
    PENDING with the job's id, its run with it. Returns (attempt moved, run moved).

    The submit that created the job records it, or, when that worker died in between, the
    sync that finds the job (before the re-driven submit would adopt it): the conditional
    UPDATE lets exactly one of them write the id and the run's event.
    """
    moved = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.SUBMITTING).update(
        state=AttemptState.PENDING,
        backend_job_id=job_id,
        submitted_at=now,
        last_seen_at=now,
        backend_error="",
    )
    if not moved:
        return False, False
    attempt.state, attempt.backend_job_id = AttemptState.PENDING, job_id
    found = " (found by the sync)" if found_by_sync else ""
    accepted = run_transition(
        run=attempt.run,
        to=RunState.PENDING,
        expected=(RunState.SUBMITTING,),
        reason="SUBMITTED",
        message=f"{attempt.cluster.name} accepted job {job_id}{found}",
        attempt=attempt,
    )
    return True, accepted


def _attempt_fail_submit(attempt: Attempt, run: Run, exc: PermanentBackendError) -> None:
    now = timezone.now()
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.FAILED,
        finished_at=now,
        failure_reason=exc.failure_reason,
        failure_message=str(exc)[:2000],
    )
    run_transition(
        run=run,
        to=RunState.FAILED,
        expected=(RunState.SUBMITTING, RunState.ADMITTED),
        reason=exc.failure_reason,
        message=f"The cluster refused the job: {exc}",
        attempt=attempt,
        finished_at=now,
        failure_reason=exc.failure_reason,
    )
    _enqueue_admission()


def attempt_cancel(*, attempt_id: int) -> None:
    attempt = _attempt_for_work(attempt_id)
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


CHECKPOINT_URI_MAX_LENGTH = Checkpoint._meta.get_field("uri").max_length


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
        adopted, _ = _attempt_accept(
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
        _run_requeue_after_preemption(run=run, attempt=attempt)
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
    _enqueue_admission()
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
    changes = {"runtime_env": reproducibility.runtime_env_of(report)}
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


def _latest_submitted_attempt(run: Run) -> Attempt | None:
    attempt = run.attempts.select_related("cluster").order_by("-number").first()
    return attempt if attempt is not None and attempt.backend_job_id else None


def run_logs(*, run: Run, tail: int = 200) -> str:
    attempt = _latest_submitted_attempt(run)
    if attempt is None:
        return ""
    try:
        return backend_for(attempt.cluster).logs(
            JobRef(attempt.name, attempt.backend_job_id), tail=tail
        )
    except TransientBackendError as exc:
        return f"(logs unavailable: {exc})"


def text_tail(text: str, *, max_chars: int) -> tuple[str, bool]:
    """At most the last ``max_chars`` characters of ``text``, from a line start where the
    cut leaves one, and whether anything was cut."""
    if len(text) <= max_chars:
        return text, False
    tail = text[-max_chars:]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return tail, True


def run_log_tail(*, run: Run, lines: int, max_chars: int) -> tuple[str, bool]:
    """The end of the latest attempt's log for a page: ``lines`` lines at most, and no more
    than ``max_chars`` characters however long they are (a multi-MB log must not become a
    multi-MB page); with whether it was cut to ``max_chars``."""
    return text_tail(run_logs(run=run, tail=lines), max_chars=max_chars)


# Backends that cannot stream a whole log give this many of its last lines for a download.
LOG_DOWNLOAD_MAX_LINES = 1_000_000


def run_log_download(*, run: Run) -> tuple[str, Iterator[bytes]] | None:
    """The latest attempt's whole log, as a file name and chunks to stream; None while the
    backend has none. A backend that can (``log_chunks``) streams it from its start; the
    others give their last LOG_DOWNLOAD_MAX_LINES lines. TransientBackendError propagates."""
    attempt = _latest_submitted_attempt(run)
    if attempt is None:
        return None
    backend = backend_for(attempt.cluster)
    ref = JobRef(attempt.name, attempt.backend_job_id)
    log_chunks = getattr(backend, "log_chunks", None)
    if log_chunks is not None:
        chunks = log_chunks(ref)
    else:
        text = backend.logs(ref, tail=LOG_DOWNLOAD_MAX_LINES)
        chunks = iter([text.encode()]) if text else None
    if chunks is None:
        return None
    return f"run-{run.pk}-attempt-{attempt.number}.log", chunks


STUCK_SUBMIT_AFTER = timedelta(seconds=30)


def attempt_redrive_stuck_submits() -> int:
    """Re-enqueue submits whose task was lost (broker restart, worker killed). Harmless if
    the task is merely slow: a second submit adopts the first job."""
    from jobs.tasks import attempt_submit

    cutoff = timezone.now() - STUCK_SUBMIT_AFTER
    ids = list(
        Attempt.objects.filter(
            state__in=(AttemptState.CREATED, AttemptState.SUBMITTING),
            created_at__lt=cutoff,
            run__state__in=(RunState.ADMITTED, RunState.SUBMITTING, RunState.PREEMPTED),
        ).values_list("pk", flat=True)
    )
    for attempt_id in ids:
        attempt_submit.delay(attempt_id)
    return len(ids)


@dataclass(frozen=True)
class AdmissionPreview:
    """What the submit form shows before submitting: the quota picture and the verdict."""

    tenant: str
    flavor: str
    gpus: int
    guaranteed: int
    borrow_limit: int
    in_use: int
    idle: int  # idle GPUs of the flavor across enabled clusters
    budget_gpu_hours: float | None
    budget_used_gpu_hours: float
    budget_mode: str
    verdict: str  # "start", "borrow" or "wait"
    message: str

    @property
    def borrowable(self) -> int:
        """GPUs the tenant could borrow right now beyond its guarantee."""
        room = self.guaranteed + self.borrow_limit - max(self.in_use, self.guaranteed)
        return max(0, min(room, self.idle))

    @property
    def budget_left_gpu_hours(self) -> float | None:
        if self.budget_gpu_hours is None:
            return None
        return max(0.0, self.budget_gpu_hours - self.budget_used_gpu_hours)


def admission_preview(
    *, user, tenant: str, flavor: str, nodes: int, gpus_per_node: int, priority: int = 50
) -> AdmissionPreview:
    """Run admission on the current snapshot plus this hypothetical run, changing nothing."""
    tenant_obj = tenant_list_submittable(user=user).filter(slug=tenant).first()
    if tenant_obj is None:
        raise ValidationError({"tenant": "Unknown tenant, or you are not a member."})
    if not GpuFlavor.objects.filter(slug=flavor).exists():
        raise ValidationError({"flavor": "Unknown GPU flavor."})
    now = timezone.now()
    snapshot, _ = admission_snapshot(now=now)
    probe = admission.QueuedRun(
        id=-1,
        tenant=tenant,
        flavor=flavor,
        nodes=max(1, nodes),
        gpus_per_node=max(1, gpus_per_node),
        priority=priority,
        submitted=now.timestamp(),
    )
    decisions = admission.decide(replace(snapshot, queued=(*snapshot.queued, probe)))
    key = (tenant, flavor)
    quota = snapshot.quotas.get(key) or admission.Quota(guaranteed=0)
    in_use = sum(r.gpus for r in snapshot.held if (r.tenant, r.flavor) == key)
    idle = sum(p.capacity for p in snapshot.pools if p.flavor == flavor) - sum(
        r.gpus for r in snapshot.held if r.flavor == flavor
    )
    admit = next((a for a in decisions.admitted if a.run_id == -1), None)
    if admit is not None:
        verdict = "borrow" if admit.borrowed else "start"
        message = (
            f"Would start now on {admit.cluster}, borrowing idle GPUs (preemptible)"
            if admit.borrowed
            else f"Would start now on {admit.cluster}, within the tenant's guarantee"
        )
        if admit.over_budget:
            message += "; past the soft monthly budget, so it will be flagged"
    else:
        wait = next(w for w in decisions.waiting if w.run_id == -1)
        verdict = "wait"
        message = f"Would wait: {wait.message} (position {wait.position})"
    return AdmissionPreview(
        tenant=tenant,
        flavor=flavor,
        gpus=probe.gpus,
        guaranteed=quota.guaranteed,
        borrow_limit=quota.borrow_limit,
        in_use=in_use,
        idle=max(0, idle),
        budget_gpu_hours=quota.budget_gpu_hours,
        budget_used_gpu_hours=snapshot.budget_used.get(key, 0.0),
        budget_mode="hard" if quota.budget_hard else "soft",
        verdict=verdict,
        message=message,
    )


# --- experiment templates and specs --------------------------------------------------------


def _template_state(template: ExperimentTemplate) -> dict:
    return {
        "name": template.name,
        "description": template.description,
        "values": template.values,
        "locked": template.locked,
        "ranges": template.ranges,
    }


@transaction.atomic
def template_save(
    *,
    actor,
    tenant: Tenant | None,
    name: str,
    description: str,
    values: dict,
    locked: list,
    ranges: dict,
    template: ExperimentTemplate | None = None,
) -> ExperimentTemplate:
    """Create a template (``template`` None) or change one; ``tenant`` None is global.

    ``values`` must parse as a partial spec, ``locked`` name known dotted fields that have
    a value, ``ranges`` bound integer fields with integers, min ≤ max.
    """
    if not template_can_manage(user=actor, tenant=tenant) or (
        template is not None and not template_can_manage(user=actor, tenant=template.tenant)
    ):
        raise PermissionDenied("Only platform admins and the tenant's admins manage templates.")
    errors: dict[str, list[str]] = {}
    try:
        slug_validator(name)
    except ValidationError as exc:
        errors["name"] = exc.messages
    parsed, value_errors = spec.template_values_parse(values)
    for field_name, messages in value_errors.items():
        prefix = "" if field_name == spec.NON_FIELD else f"{field_name}: "
        errors.setdefault("values", []).extend(prefix + message for message in messages)
    if parsed is not None:
        for field_name, messages in spec.template_rules_check(parsed, locked, ranges).items():
            errors.setdefault(field_name, []).extend(messages)
    clash = ExperimentTemplate.objects.filter(tenant=tenant, name=name)
    if template is not None:
        clash = clash.exclude(pk=template.pk)
    if "name" not in errors and clash.exists():
        errors["name"] = ["A template with this name exists for this tenant."]
    if errors:
        raise ValidationError(errors)
    if template is None:
        before = None
        template = ExperimentTemplate(created_by=actor if actor.is_authenticated else None)
    else:
        template = ExperimentTemplate.objects.select_for_update().get(pk=template.pk)
        before = _template_state(template)
    template.tenant = tenant
    template.name = name
    template.description = description
    template.values = values
    template.locked = locked
    template.ranges = ranges
    template.save()
    audit_record(
        actor=actor,
        action="template.create" if before is None else "template.update",
        target=f"template {template}",
        tenant=tenant,
        before=before,
        after=_template_state(template),
    )
    return template


@transaction.atomic
def template_delete(*, actor, template: ExperimentTemplate) -> None:
    if not template_can_manage(user=actor, tenant=template.tenant):
        raise PermissionDenied("Only platform admins and the tenant's admins manage templates.")
    # The audit records the template as stored, not as the caller last saw it.
    template = ExperimentTemplate.objects.select_for_update().get(pk=template.pk)
    audit_record(
        actor=actor,
        action="template.delete",
        target=f"template {template}",
        tenant=template.tenant,
        before=_template_state(template),
    )
    template.delete()


def _submit_values(*, user, values: dict, submission_key: UUID | None = None) -> Run:
    """run_submit with ExperimentInput values; its errors by dotted spec name."""
    try:
        return run_submit(user=user, data=ExperimentInput(**values), submission_key=submission_key)
    except ValidationError as exc:
        raise ValidationError(spec.errors_to_spec(exc.message_dict)) from None


def template_submit(
    *, user, template: ExperimentTemplate, values: dict, submission_key: UUID | None = None
) -> Run:
    """Submit ``values`` (ExperimentInput fields, those given) on top of the template:
    its locks and ranges checked, then every rule of run_submit. ValidationError names
    dotted spec fields; nothing is created on error. A repeated ``submission_key`` returns
    the run its first request queued, before any check."""
    earlier = run_submitted_with(user=user, submission_key=submission_key)
    if earlier is not None:
        return earlier
    if template.tenant_id is not None and template.tenant.slug != values.get("tenant"):
        raise ValidationError(
            {"template": [f"Template {template.name} belongs to tenant {template.tenant.slug}."]}
        )
    defaults, _ = spec.template_values_parse(template.values)  # checked when saved
    merged, errors = spec.template_apply(
        defaults or {}, template.locked, template.ranges, values, template_name=template.name
    )
    if errors:
        raise ValidationError(errors)
    return _submit_values(user=user, values=merged, submission_key=submission_key)


def spec_submit(*, user, document) -> Run:
    """Submit a spec document: parse it, apply its template (the tenant's own of that name,
    else a global one), then run_submit. ValidationError names dotted spec fields."""
    values, errors = spec.spec_parse(document)
    if values is None:
        raise ValidationError(errors)
    name = spec.spec_template_name(document)
    if name is None:
        return _submit_values(user=user, values=values)
    template = (
        template_list_usable(user=user)
        .filter(Q(tenant__slug=values["tenant"]) | Q(tenant__isnull=True), name=name)
        .order_by(F("tenant").asc(nulls_last=True))
        .first()
    )
    if template is None:
        raise ValidationError(
            {"template": [f"No template {name} for tenant {values['tenant']}, nor a global one."]}
        )
    return template_submit(user=user, template=template, values=values)


def experiment_spec(experiment: Experiment) -> dict:
    """The spec that submits this experiment again, as recorded."""
    return spec.spec_of(vars(experiment_input_of(experiment)))
