"""Experiment templates: saved by tenant admins, submitted by researchers."""

from uuid import UUID

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from core.types import UserLike
from jobs import spec
from jobs.access import template_can_manage
from jobs.models import (
    ExperimentTemplate,
    Run,
)
from jobs.services.submission import ExperimentInput, run_record, submission_once
from tenants.models import Tenant, slug_validator
from tenants.services.audit import audit_record, audit_snapshot

# What a template is made of: what the form edits, the service saves and the audit records.
TEMPLATE_FIELDS = ("name", "description", "values", "locked", "ranges")


@transaction.atomic
def template_save(
    *,
    actor: UserLike,
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
        before = audit_snapshot(template, only=TEMPLATE_FIELDS)
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
        after=audit_snapshot(template, only=TEMPLATE_FIELDS),
    )
    return template


@transaction.atomic
def template_delete(*, actor: UserLike, template: ExperimentTemplate) -> None:
    if not template_can_manage(user=actor, tenant=template.tenant):
        raise PermissionDenied("Only platform admins and the tenant's admins manage templates.")
    # The audit records the template as stored, not as the caller last saw it.
    template = ExperimentTemplate.objects.select_for_update().get(pk=template.pk)
    audit_record(
        actor=actor,
        action="template.delete",
        target=f"template {template}",
        tenant=template.tenant,
        before=audit_snapshot(template, only=TEMPLATE_FIELDS),
    )
    template.delete()


def template_submit(
    *,
    user: UserLike,
    template: ExperimentTemplate,
    values: dict,
    submission_key: UUID | None = None,
) -> Run:
    """Submit ``values`` (ExperimentInput fields, those given) on top of the template
    (``template_run_record``). A repeated ``submission_key`` returns the run its first
    request queued, before any check (``submission_once``)."""
    return submission_once(
        user=user,
        submission_key=submission_key,
        create=lambda: template_run_record(
            user=user, template=template, values=values, submission_key=submission_key
        ),
    ).run


def template_run_record(
    *,
    user: UserLike,
    template: ExperimentTemplate,
    values: dict,
    submission_key: UUID | None,
) -> Run:
    """The template's locks and ranges checked, then every rule of run_submit, and the run
    queued with ``submission_key`` on it. ValidationError names the fields (ExperimentInput
    names, as every service does); nothing is created on error. The ``create`` of
    ``submission_once``: it does not look the key up."""
    if template.tenant is not None and template.tenant.slug != values.get("tenant"):
        raise ValidationError(
            {"template": [f"Template {template.name} belongs to tenant {template.tenant.slug}."]}
        )
    defaults, _ = spec.template_values_parse(template.values)  # checked when saved
    merged, errors = spec.template_apply(
        defaults or {}, template.locked, template.ranges, values, template_name=template.name
    )
    if errors:
        raise ValidationError(errors)
    return run_record(
        user=user, data=ExperimentInput(**merged), submission_key=submission_key, template=template
    )
