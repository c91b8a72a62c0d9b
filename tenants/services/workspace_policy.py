"""A tenant's workspace policy (docs/workspaces.md, "Idle from evidence"): how long a
workspace may be idle on every signal before it is suspended, how long before that its
owner is warned, whether a silent busy kernel is suspended too, and the longest a
workspace may run."""

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from core.types import UserLike
from tenants.access import idle_policy_can_edit
from tenants.models import (
    WORKSPACE_IDLE_MAX_MIN,
    WORKSPACE_IDLE_MIN_MIN,
    WORKSPACE_MAX_HOURS,
    Tenant,
    is_whole_number,
)
from tenants.services.idle_policy import tenant_policy_save

WORKSPACE_POLICY_FIELDS = (
    "workspace_suspend_after_min",
    "workspace_warn_before_min",
    "workspace_suspend_silent_busy",
    "workspace_max_hours",
)


def _errors(values: dict) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    suspend = values["workspace_suspend_after_min"]
    warn = values["workspace_warn_before_min"]
    hours = values["workspace_max_hours"]
    in_range = WORKSPACE_IDLE_MIN_MIN <= suspend <= WORKSPACE_IDLE_MAX_MIN
    if not is_whole_number(suspend) or not in_range:
        errors["workspace_suspend_after_min"] = [
            f"Between {WORKSPACE_IDLE_MIN_MIN} and {WORKSPACE_IDLE_MAX_MIN} minutes (a week): "
            "shorter would suspend people who read a notebook for a moment."
        ]
    if not is_whole_number(warn) or warn < 1:
        errors["workspace_warn_before_min"] = ["At least 1 minute."]
    elif "workspace_suspend_after_min" not in errors and warn >= suspend:
        errors["workspace_warn_before_min"] = [
            f"Fewer minutes than the suspension's {suspend}, so the warning comes after some "
            "idle time, not at once."
        ]
    if not is_whole_number(hours) or not 1 <= hours <= WORKSPACE_MAX_HOURS:
        errors["workspace_max_hours"] = [f"Between 1 and {WORKSPACE_MAX_HOURS} hours (a week)."]
    if not isinstance(values["workspace_suspend_silent_busy"], bool):
        errors["workspace_suspend_silent_busy"] = ["Yes or no."]
    return errors


@transaction.atomic
def tenant_workspace_policy_update(
    *,
    tenant: Tenant,
    workspace_suspend_after_min: int,
    workspace_warn_before_min: int,
    workspace_suspend_silent_busy: bool,
    workspace_max_hours: int,
    actor: UserLike,
) -> Tenant:
    """Set the tenant's workspace policy; audited as "tenant.workspace_policy". It applies
    from the next idle scan (a minute) to every running workspace of the tenant. Raises
    PermissionDenied unless the actor administers the tenant or the platform,
    ValidationError naming every bad field; nothing is written then."""
    if not idle_policy_can_edit(user=actor, tenant=tenant):
        raise PermissionDenied(
            "Only a tenant admin of the tenant or a platform admin can change its workspace policy."
        )
    values = {
        "workspace_suspend_after_min": workspace_suspend_after_min,
        "workspace_warn_before_min": workspace_warn_before_min,
        "workspace_suspend_silent_busy": workspace_suspend_silent_busy,
        "workspace_max_hours": workspace_max_hours,
    }
    errors = _errors(values)
    if errors:
        raise ValidationError(errors)
    return tenant_policy_save(
        tenant=tenant, values=values, action="tenant.workspace_policy", actor=actor
    )
