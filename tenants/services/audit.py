"""The audit log: one event per change, with what it was before and after."""

import json
from collections.abc import Collection
from decimal import Decimal

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from core.types import UserLike
from tenants.models import AuditEvent, Tenant, max_length_of


def audit_record(
    *,
    actor: UserLike | None,
    action: str,
    target: str,
    tenant: Tenant | None = None,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=actor if actor is not None and actor.is_authenticated else None,
        tenant=tenant,
        action=action,
        target=target,
        before=before,
        after=after,
    )


def audit_snapshot(
    instance: models.Model,
    *,
    only: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> dict:
    """What the audit log records of a model instance, as JSON: every concrete field (a
    foreign key as its id) and many-to-many field (the related objects' names, sorted), or
    the fields ``only`` names. A decimal is its exact string at the field's places (JSON
    has no decimals). ``exclude`` names fields that must never be recorded, such as
    password hashes."""
    values = {}
    fields = (*instance._meta.concrete_fields, *instance._meta.many_to_many)
    if only is not None:
        by_name = {field.name: field for field in fields}
        fields = tuple(by_name[name] for name in only)
    for field in fields:
        if field.name in exclude:
            continue
        if field.many_to_many:
            values[field.name] = sorted(
                str(related) for related in getattr(instance, field.name).all()
            )
            continue
        value = field.value_from_object(instance)
        if isinstance(field, models.DecimalField) and value is not None:
            value = str(Decimal(value).quantize(Decimal(1).scaleb(-field.decimal_places)))
        values[field.attname] = value
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def audit_model_change(
    *, actor: UserLike, instance: models.Model, verb: str, before: dict | None, after: dict | None
) -> AuditEvent | None:
    """Record a change made with a generic editor (Django admin) as "<model>.<verb>"
    ("membership.update", "cluster.delete"), with ``audit_snapshot``s before and after;
    None when an update changed nothing.

    The event is filed under the instance's tenant (a tenant's own changes under itself),
    except when that tenant is the thing being deleted: the log outlives it.
    """
    if verb == "update" and before == after:
        return None
    tenant = instance if isinstance(instance, Tenant) else getattr(instance, "tenant", None)
    if not isinstance(tenant, Tenant) or (verb == "delete" and tenant is instance):
        tenant = None
    target = f"{instance._meta.model_name} {instance}"
    return audit_record(
        actor=actor,
        action=f"{instance._meta.model_name}.{verb}",
        target=target[: max_length_of(AuditEvent, "target")],
        tenant=tenant,
        before=before,
        after=after,
    )
