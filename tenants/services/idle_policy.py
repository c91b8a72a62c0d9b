"""A tenant's idle-GPU policy: when a run whose GPUs sit idle is warned about, and when
it is cancelled."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from core.types import UserLike
from tenants.access import idle_policy_can_edit
from tenants.models import IDLE_POLICY_MAX_MIN, Tenant, is_whole_number
from tenants.services.audit import audit_record, audit_snapshot

IDLE_POLICY_FIELDS = ("idle_notify_after_min", "idle_cancel_after_min")


@transaction.atomic
def tenant_idle_policy_update(
    *,
    tenant: Tenant,
    idle_notify_after_min: int | None,
    idle_cancel_after_min: int | None,
    actor: UserLike,
) -> Tenant:
    """Set the tenant's idle-GPU policy; audited as "tenant.idle_policy".

    Both values count consecutive idle minutes of a running attempt (telemetry/idle.py):
    after ``idle_notify_after_min`` its submitter is warned, after ``idle_cancel_after_min``
    the run is cancelled. None turns a step off. Each is 1 to ``IDLE_POLICY_MAX_MIN``, and
    cancelling must come later than warning when both are on. Raises PermissionDenied unless
    the actor administers the tenant or the platform, ValidationError naming every bad
    field; nothing is written then.
    """
    if not idle_policy_can_edit(user=actor, tenant=tenant):
        raise PermissionDenied(
            "Only a tenant admin of the tenant or a platform admin can change its idle-GPU policy."
        )
    values = {
        "idle_notify_after_min": idle_notify_after_min,
        "idle_cancel_after_min": idle_cancel_after_min,
    }
    errors: dict[str, list[str]] = {}
    for name, value in values.items():
        if value is None:
            continue
        if not is_whole_number(value):
            errors[name] = ["Enter a whole number of minutes, or leave it empty for off."]
        elif not 1 <= value <= IDLE_POLICY_MAX_MIN:
            errors[name] = [
                f"Between 1 and {IDLE_POLICY_MAX_MIN} minutes (a week), or empty for off."
            ]
    if (
        not errors
        and idle_notify_after_min is not None
        and idle_cancel_after_min is not None
        and idle_cancel_after_min <= idle_notify_after_min
    ):
        errors["idle_cancel_after_min"] = [
            f"Cancel after more idle minutes than the warning ({idle_notify_after_min}), so "
            "the submitter is warned first."
        ]
    if errors:
        raise ValidationError(errors)
    return tenant_policy_save(
        tenant=tenant, values=values, action="tenant.idle_policy", actor=actor
    )


def tenant_policy_save(*, tenant: Tenant, values: dict, action: str, actor: UserLike) -> Tenant:
    """Write the checked ``values`` of a tenant's policy under its row lock, audited as
    ``action`` with the fields before and after; nothing when they are unchanged."""
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    before = audit_snapshot(tenant, only=tuple(values))
    if before == values:
        return tenant
    for name, value in values.items():
        setattr(tenant, name, value)
    tenant.save(update_fields=list(values))
    audit_record(
        actor=actor, action=action, target=tenant.slug, tenant=tenant, before=before, after=values
    )
    return tenant
