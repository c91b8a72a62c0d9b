"""A tenant's workspace policy (tenants/services/workspace_policy.py and its page): bounds
from five minutes to a week, a warning before the suspension, audited, admins only."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from tenants.models import AuditEvent, Tenant
from tenants.services.workspace_policy import tenant_workspace_policy_update

pytestmark = pytest.mark.django_db

VALUES = {
    "workspace_suspend_after_min": 60,
    "workspace_warn_before_min": 10,
    "workspace_suspend_silent_busy": False,
    "workspace_max_hours": 12,
}


def policy(tenant: Tenant) -> dict:
    tenant.refresh_from_db()
    return {name: getattr(tenant, name) for name in VALUES}


@pytest.mark.parametrize(
    ("changes", "errors"),
    [
        (
            {"workspace_suspend_after_min": 0},
            {
                "workspace_suspend_after_min": [
                    "Between 5 and 10080 minutes (a week): shorter would suspend people who "
                    "read a notebook for a moment."
                ]
            },
        ),
        (
            {"workspace_suspend_after_min": 10081, "workspace_max_hours": 169},
            {
                "workspace_suspend_after_min": [
                    "Between 5 and 10080 minutes (a week): shorter would suspend people who "
                    "read a notebook for a moment."
                ],
                "workspace_max_hours": ["Between 1 and 168 hours (a week)."],
            },
        ),
        (
            {"workspace_suspend_after_min": 30, "workspace_warn_before_min": 30},
            {
                "workspace_warn_before_min": [
                    "Fewer minutes than the suspension's 30, so the warning comes after some "
                    "idle time, not at once."
                ]
            },
        ),
        ({"workspace_warn_before_min": 0}, {"workspace_warn_before_min": ["At least 1 minute."]}),
        (
            {"workspace_suspend_silent_busy": "yes"},
            {"workspace_suspend_silent_busy": ["Yes or no."]},
        ),
    ],
)
def test_bad_values_name_their_field_and_change_nothing(world, changes, errors):
    with pytest.raises(ValidationError) as refused:
        tenant_workspace_policy_update(
            tenant=world.vision, actor=world.tenant_admin_a, **(VALUES | changes)
        )
    assert refused.value.message_dict == errors
    assert policy(world.vision) == VALUES
    assert not AuditEvent.objects.filter(action="tenant.workspace_policy").exists()


def test_a_week_is_allowed_and_audited(world):
    week = VALUES | {"workspace_suspend_after_min": 10080, "workspace_max_hours": 168}
    tenant_workspace_policy_update(tenant=world.vision, actor=world.tenant_admin_a, **week)
    assert policy(world.vision) == week
    event = AuditEvent.objects.get(action="tenant.workspace_policy")
    assert (event.before, event.after, event.target) == (VALUES, week, "vision")
    with pytest.raises(PermissionDenied):
        tenant_workspace_policy_update(tenant=world.vision, actor=world.researcher_a, **VALUES)


def test_a_tenant_admin_saves_it_from_its_page_and_errors_show_beside_the_field(client, world):
    client.force_login(world.tenant_admin_a)
    url = reverse("tenants:workspace_policy", args=["vision"])
    assert (
        "after 60 idle minutes, its owner warned 10 minutes before"
        in client.get(url).content.decode()
    )
    bad = client.post(
        url,
        {
            "workspace_suspend_after_min": "0",
            "workspace_warn_before_min": "10",
            "workspace_max_hours": "12",
        },
    )
    assert bad.status_code == 400
    assert "Between 5 and 10080 minutes (a week)" in bad.content.decode()
    assert policy(world.vision) == VALUES
    saved = client.post(
        url,
        {
            "workspace_suspend_after_min": "90",
            "workspace_warn_before_min": "15",
            "workspace_max_hours": "24",
            "workspace_suspend_silent_busy": "on",
        },
        follow=True,
    )
    assert "Saved the workspace policy of vision." in saved.content.decode()
    assert policy(world.vision) == {
        "workspace_suspend_after_min": 90,
        "workspace_warn_before_min": 15,
        "workspace_suspend_silent_busy": True,
        "workspace_max_hours": 24,
    }
