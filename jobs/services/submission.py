"""Submitting experiments: validation, idempotent submits, re-runs."""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from uuid import UUID

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.backends import (
    MULTI_NODE_ENV,
)
from clusters.env_names import env_name_refusal
from core.ids import MAX_ID
from core.types import UserLike, signed_in
from images.access import image_list_usable
from images.models import DIGEST_PATTERN, Image
from images.services.registries import TagResolutionError, tag_resolve
from jobs.access import experiment_can_rerun, experiment_list_viewable
from jobs.enqueue import admission_cycle_enqueue
from jobs.experiment_fields import COMMIT_PATTERN, INPUT_FIELDS, RANGES, TEXT_LIMITS
from jobs.models import (
    MAX_COMMAND_BYTES,
    MAX_PARAMS_BYTES,
    Experiment,
    ExperimentTemplate,
    Run,
    RunEvent,
    RunKind,
    RunState,
    TopologyMode,
)
from jobs.selectors.refusals import resource_refusals
from jobs.selectors.runs import run_submitted_with
from jobs.selectors.submit_context import submit_context

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
    topology_level: str = ""
    topology_mode: str = ""  # "" is preferred: a mode says nothing without a level
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


def experiment_validate(*, user: UserLike, data: ExperimentInput) -> dict:
    """Check a request against every rule; raise ValidationError naming each bad field.
    Returns what it names, resolved: the tenant, project, image, flavor and cloned-from id."""
    errors: dict[str, list[str]] = {}
    # The tenant, project, pinned image, flavor, quota and node limits in one query.
    context = submit_context(
        user=user,
        tenant=data.tenant,
        project=data.project,
        flavor=data.flavor,
        image=_image_pin(data.image),
    )
    resolved = _resolve_owned(errors, user=user, data=data, context=context)
    # The same checks the submit form's preview makes (jobs.selectors.preview.admission_preview),
    # so the preview can never promise a wait for what the submit refuses.
    for name, messages in resource_refusals(
        tenant=context.tenant,
        flavor=data.flavor,
        nodes=data.nodes,
        gpus_per_node=data.gpus_per_node,
        topology_level=data.topology_level,
        topology_mode=data.topology_mode,
        context=context,
    ).items():
        errors.setdefault(name, []).extend(messages)
    if context.flavor is not None and "flavor" not in errors:
        resolved["flavor"] = context.flavor
    _check_command(errors, data.command or "")
    _check_params(errors, data.params)
    _check_env(errors, data.env, nodes=data.nodes)
    _check_code(errors, data)
    _check_limits(errors, data)
    if errors:
        raise ValidationError(errors)
    return resolved


def _resolve_owned(errors, *, user: UserLike, data: ExperimentInput, context) -> dict:
    """The tenant if the user may submit to it, and what must be of that tenant: the
    project, the image, the experiment it is a clone of."""
    resolved: dict = {}
    tenant = context.tenant
    known = _check(errors, "tenant", tenant is not None, "Unknown tenant, or you are not a member.")
    if known and tenant is not None:
        resolved["tenant"] = tenant
        project = context.project
        if _check(errors, "project", project is not None, "Unknown project for this tenant."):
            resolved["project"] = project
        resolved["image"] = _resolve_image(
            errors, tenant=tenant, reference=data.image, pinned=context.image
        )
        if data.cloned_from is not None:
            resolved["cloned_from_id"] = _check_cloned_from(
                errors, user=user, tenant=tenant, experiment_id=data.cloned_from
            )
    return resolved


def _check_command(errors, command: str) -> None:
    _check(errors, "command", command.strip() != "", "A command is required.")
    _check(
        errors,
        "command",
        len(command.encode()) <= MAX_COMMAND_BYTES,
        f"At most {MAX_COMMAND_BYTES // 1024} KiB.",
    )
    _check(errors, "command", "\x00" not in command, "Must not contain NUL characters.")


def _check_params(errors, params) -> None:
    if not _check(errors, "params", isinstance(params, dict), "Must be a JSON object."):
        return
    try:
        encoded = json.dumps(params, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        _check(errors, "params", False, "Only JSON values; NaN and Infinity are not JSON.")
        return
    size = len(encoded.encode())
    _check(errors, "params", size <= MAX_PARAMS_BYTES, "At most 64 KiB as JSON.")
    _check(errors, "params", "\\u0000" not in encoded, "Must not contain NUL characters.")
    _check(
        errors,
        "params",
        _is_unicode_text(params),
        "Must not contain unpaired surrogates (\\ud800 to \\udfff).",
    )


def _check_env(errors, env, *, nodes: int) -> None:
    if not _check(errors, "env", isinstance(env, dict), "Must be an object of names to strings."):
        return
    for key, value in env.items():
        refusal = env_name_refusal(key)
        if refusal is not None:
            _check(errors, "env", False, refusal)
        elif key in MULTI_NODE_ENV and nodes > 1:
            _check(
                errors,
                "env",
                False,
                f"{key} is set by Gantry in every task of a multi-node job; leave it out.",
            )
        elif not isinstance(value, str) or "\x00" in value:
            _check(errors, "env", False, f"The value of {key} must be a string.")


def _check_code(errors, data: ExperimentInput) -> None:
    if data.code_repository or data.code_commit:
        _check(
            errors,
            "code_commit",
            re.fullmatch(COMMIT_PATTERN, data.code_commit or "") is not None,
            "A commit is 40 lowercase hex characters.",
        )
        _check(errors, "code_repository", bool(data.code_repository), "Required with a commit.")


def _check_limits(errors, data: ExperimentInput) -> None:
    """The topology mode, the integers' ranges and the free texts' lengths
    (``jobs.experiment_fields``)."""
    _check(
        errors,
        "topology_mode",
        data.topology_mode in ("", *TopologyMode.values),
        "Either preferred or required.",
    )
    _check(
        errors,
        "topology_mode",
        data.topology_mode != TopologyMode.REQUIRED or bool(data.topology_level),
        "Name the topology level that is required.",
    )
    for name, (low, high) in RANGES.items():
        message = _RANGE_MESSAGES.get(name, f"Between {low} and {high}.")
        _check(errors, name, low <= getattr(data, name) <= high, message)
    for name, limit in TEXT_LIMITS.items():
        value = getattr(data, name) or ""
        _check(errors, name, len(value) <= limit, f"At most {limit} characters.")
        _check(errors, name, "\x00" not in value, "Must not contain NUL characters.")


_RANGE_MESSAGES = {"max_runtime_minutes": "Between 1 minute and 30 days."}


def _check_cloned_from(errors, *, user: UserLike, tenant, experiment_id) -> int | None:
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


def _image_pin(reference: str) -> tuple[str, str] | None:
    """(repository, digest) of a reference pinned by a well-formed digest, else None."""
    repository, at, digest = (reference or "").strip().partition("@")
    return (repository, digest) if at and re.fullmatch(DIGEST_PATTERN, digest) else None


def _resolve_image(errors, *, tenant, reference: str, pinned: Image | None) -> Image | None:
    """The approved image visible to the tenant that ``reference`` names, pinned by digest.
    ``pinned``: the image ``submit_context`` found usable by the tenant for a reference
    pinned by digest (``_image_pin``).

    ``repository@sha256:…`` is looked up as given. ``repository:tag`` is accepted only to be
    resolved: the registry of the repository's host says which digest the tag points to now,
    and that digest must be an approved image; the experiment records the digest. Resolving
    calls the registry inside run_submit's transaction, so each request has a short timeout
    (images.services.registries.SUBMIT_TIMEOUT_S); a registry that does not answer fails the submit.
    """
    reference = (reference or "").strip()
    if not reference:
        _check(errors, "image", False, "Choose an image.")
        return None
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
    _check(errors, "image", pinned is not None, "This image is not approved for this tenant.")
    return pinned


@dataclass(frozen=True)
class Submission:
    """What a submit queued: a new run, or (``replayed``) the run an earlier request with the
    same submission key had queued, nothing new being recorded."""

    run: Run
    replayed: bool


def submission_once(
    *, user: UserLike, submission_key: UUID | None, create: Callable[[], Run]
) -> Submission:
    """``create()`` unless this user's ``submission_key`` already queued a run: then that run.
    The one place a submission key is checked; every submit path (the form, the API, spec
    files, templates, re-runs) comes through here, and ``create`` records the key on its run.

    The key is checked before ``create`` validates anything, so a replay of a request that
    was accepted is never refused later (say, once the quota is used, or the template
    changed). Two requests racing with one key both pass the check; the unique constraint on
    (submitted_by, submission_key) makes the second insert wait for the first and fail, and
    the second then answers with the first's run: its savepoint rolls back the experiment it
    had recorded, so nothing is left behind. Without a key every call creates.
    """
    earlier = run_submitted_with(user=user, submission_key=submission_key)
    if earlier is not None:
        return Submission(run=earlier, replayed=True)
    try:
        with transaction.atomic():
            return Submission(run=create(), replayed=False)
    except IntegrityError:
        earlier = run_submitted_with(user=user, submission_key=submission_key)
        if earlier is None:
            raise
        return Submission(run=earlier, replayed=True)


def run_submit(
    *,
    user: UserLike,
    data: ExperimentInput,
    submission_key: UUID | None = None,
    template: ExperimentTemplate | None = None,
) -> Run:
    """Record the experiment and queue a run of it; admission picks it up after commit.

    With a ``submission_key`` (the submit form's one-time key, the API's Idempotency-Key) a
    repeated request returns the run the first one queued and records nothing new
    (``submission_once``). ``template``: the template the values came from
    (``template_submit``), kept with the experiment (its runs' history predicts how long the
    next ones take).
    """
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: run_record(
            user=user, data=data, submission_key=submission_key, template=template
        ),
    ).run


def run_record(
    *,
    user: UserLike,
    data: ExperimentInput,
    submission_key: UUID | None,
    template: ExperimentTemplate | None,
    kind: str = RunKind.BATCH,
) -> Run:
    """Validate, record the experiment and queue its run (of ``kind``), keeping
    ``submission_key`` on it. The ``create`` of ``submission_once``: it does not look the
    key up."""
    resolved = experiment_validate(user=user, data=data)
    image = resolved["image"]
    # Every field as given, but those that name a row (resolved) and the defaults made here.
    values = {field.name: getattr(data, field.name) for field in INPUT_FIELDS} | {
        "tenant": resolved["tenant"],
        "project": resolved["project"],
        "name": data.name or f"{resolved['project'].slug}-{timezone.now():%Y%m%d-%H%M%S}",
        "image": image,
        "flavor": resolved["flavor"],
        "topology_mode": data.topology_mode or TopologyMode.PREFERRED,
    }
    del values["cloned_from"]
    experiment = Experiment.objects.create(
        **values,
        image_reference=image.reference,
        owner=signed_in(user),
        cloned_from_id=resolved.get("cloned_from_id"),
        template=template,
        gantry_version=GANTRY_VERSION,
    )
    return _run_create(experiment=experiment, user=user, submission_key=submission_key, kind=kind)


def experiment_input_of(experiment: Experiment) -> ExperimentInput:
    """The request that would record this experiment again, as it was recorded."""
    values = experiment.values_of(INPUT_FIELDS)
    del values["cloned_from"]  # a clone of it records its own source
    if not experiment.topology_level:
        values["topology_mode"] = ""  # a mode says nothing without a level
    return ExperimentInput(**values)


def run_rerun(*, experiment: Experiment, user: UserLike, submission_key: UUID | None = None) -> Run:
    """Queue a new run of the same experiment record: same image digest, command, code,
    data, params and resources. Every submit rule is checked again (``run_rerun_record``).
    A repeated ``submission_key`` returns the run its first request queued
    (``submission_once``)."""
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: run_rerun_record(
            experiment=experiment, user=user, submission_key=submission_key
        ),
    ).run


def run_rerun_record(*, experiment: Experiment, user: UserLike, submission_key: UUID | None) -> Run:
    """Check every submit rule again (membership, the image still approved and visible to
    the tenant, a quota that could ever admit it) and queue the re-run, keeping
    ``submission_key`` on it. The ``create`` of ``submission_once``: it does not look the
    key up."""
    if not experiment_can_rerun(user=user, experiment=experiment):
        raise PermissionDenied(
            f"Only members of tenant {experiment.tenant.slug} can run its experiments."
        )
    if experiment.runs.filter(kind=RunKind.INTERACTIVE).exists():
        # A workspace is more than its run (its Workspace row, its hours within the tenant's
        # limit): it is launched anew, or resumed once suspended, never re-run as a batch.
        raise ValidationError(
            {
                "kind": [
                    f"Experiment {experiment.pk} is a workspace's: launch a new workspace instead."
                ]
            }
        )
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
    user: UserLike,
    reason: str = "SUBMITTED",
    message: str = "Submitted",
    submission_key: UUID | None = None,
    kind: str = RunKind.BATCH,
) -> Run:
    submitter = signed_in(user)
    run = Run.objects.create(
        experiment=experiment,
        kind=kind,
        tenant=experiment.tenant,
        flavor=experiment.flavor,
        gpus=experiment.total_gpus,
        priority=experiment.priority,
        submitted_by=submitter,
        submission_key=submission_key,
    )
    RunEvent.objects.create(
        run=run, to_state=RunState.QUEUED, reason=reason, actor=submitter, message=message
    )
    admission_cycle_enqueue()
    return run
