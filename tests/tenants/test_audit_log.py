"""The audit log: every change a person makes is an AuditEvent (who, when, what, before and
after), and the log is append-only, for the ORM and, on PostgreSQL, for raw SQL.

One test per kind of change, each asserting the exact event; then the Django admin, where
what only the admin can change is recorded and what Gantry's pages change is read-only;
then append-only.
"""

import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django import forms
from django.contrib.auth.models import Group, User
from django.db import IntegrityError, connection, transaction
from django.db.models import ProtectedError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from finance.services import rate_card_add
from images.models import Image
from images.services.catalog import image_recheck, image_set_status, image_set_visibility
from images.services.registries import registry_create, registry_update
from jobs.models import Run, RunState
from jobs.services import capacity
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from jobs.services.templates import template_delete, template_save
from tenants.models import (
    ApiToken,
    AuditEvent,
    AuditLogAppendOnly,
    GlobalRole,
    Membership,
    Quota,
    Tenant,
)
from tenants.services.audit import audit_snapshot
from tenants.services.idle_policy import tenant_idle_policy_update
from tenants.services.memberships import global_role_grant, membership_set
from tenants.services.quotas import flavor_create, flavor_update
from tenants.services.tokens import api_token_create, api_token_revoke
from tests.conftest import DIGEST_A, PASSWORD, experiment_input
from tests.jobs.test_lifecycle import submit
from tests.registry_support import free_port

pytestmark = pytest.mark.django_db

QUOTA_BEFORE = {
    "guaranteed_gpus": 16,
    "borrow_limit_gpus": 0,
    "max_gpus_per_run": None,
    "monthly_gpu_hour_budget": None,
    "budget_mode": "hard",
    "fair_share_weight": 1,
}


def event_of(action: str) -> AuditEvent:
    """The one event of ``action``; fails if there is none or more than one."""
    return AuditEvent.objects.get(action=action)


def recorded(event: AuditEvent) -> tuple:
    return (event.actor, event.tenant, event.target, event.before, event.after)


@pytest.fixture
def window():
    """The moments a test's events must fall between."""
    start = timezone.now()
    yield lambda event: start <= event.at <= timezone.now()


# --- tenants: quotas, flavors, memberships, roles, idle policy, tokens ----------------------


def test_a_quota_change_records_every_field_before_and_after(world, window):
    capacity.quota_update_checked(
        tenant=world.vision,
        flavor=world.a100,
        guaranteed_gpus=24,
        borrow_limit_gpus=8,
        max_gpus_per_run=16,
        monthly_gpu_hour_budget=500,
        budget_mode="soft",
        fair_share_weight=2,
        actor=world.platform_admin,
        confirm_overcommit=True,  # 24 + nlp's 16 is more than sim-1's 32 A100s
    )

    event = event_of("quota.update")
    assert recorded(event) == (
        world.platform_admin,
        world.vision,
        "vision:a100-80gb",
        QUOTA_BEFORE,
        {
            "guaranteed_gpus": 24,
            "borrow_limit_gpus": 8,
            "max_gpus_per_run": 16,
            "monthly_gpu_hour_budget": 500,
            "budget_mode": "soft",
            "fair_share_weight": 2,
        },
    )
    assert window(event)


def test_flavor_creation_and_edit_are_recorded(world):
    flavor = flavor_create(
        slug="a100-1g.10gb",
        name="A100 MIG 1g.10gb",
        memory_gb=10,
        gpu_fraction=Decimal("0.1429"),
        actor=world.platform_admin,
    )
    flavor_update(
        flavor=flavor,
        name="A100 MIG slice",
        memory_gb=10,
        gpu_fraction=Decimal("0.1429"),
        actor=world.platform_admin,
    )

    created = {"name": "A100 MIG 1g.10gb", "memory_gb": 10, "gpu_fraction": "0.1429"}
    assert recorded(event_of("flavor.create")) == (
        world.platform_admin,
        None,
        "a100-1g.10gb",
        None,
        {"slug": "a100-1g.10gb", **created},
    )
    assert recorded(event_of("flavor.update")) == (
        world.platform_admin,
        None,
        "a100-1g.10gb",
        created,
        {**created, "name": "A100 MIG slice"},
    )


def test_a_membership_change_records_the_role_before_and_after(world):
    membership_set(
        user=world.researcher_a2,
        tenant=world.vision,
        role="tenant_admin",
        actor=world.platform_admin,
    )

    assert recorded(event_of("membership.set")) == (
        world.platform_admin,
        world.vision,
        "arthur@vision",
        {"role": "researcher"},
        {"role": "tenant_admin"},
    )


def test_granting_a_global_role_is_recorded(world):
    global_role_grant(user=world.researcher_b, role=GlobalRole.FINANCE, actor=world.platform_admin)

    assert recorded(event_of("role.grant")) == (
        world.platform_admin,
        None,
        "bob",
        None,
        {"role": "finance"},
    )


def test_an_idle_policy_change_is_recorded(world):
    tenant_idle_policy_update(
        tenant=world.vision,
        idle_notify_after_min=30,
        idle_cancel_after_min=60,
        actor=world.tenant_admin_a,
    )

    assert recorded(event_of("tenant.idle_policy")) == (
        world.tenant_admin_a,
        world.vision,
        "vision",
        {"idle_notify_after_min": None, "idle_cancel_after_min": None},
        {"idle_notify_after_min": 30, "idle_cancel_after_min": 60},
    )


def test_creating_and_revoking_a_token_are_recorded_without_the_secret(world):
    expires = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    token, secret = api_token_create(user=world.researcher_a, name="laptop", expires_at=expires)
    api_token_revoke(token=token)
    api_token_revoke(token=token)  # already revoked: nothing to record

    token.refresh_from_db()
    target = f"token {token.prefix}… of alice"
    assert recorded(event_of("token.create")) == (
        world.researcher_a,
        None,
        target,
        None,
        {"name": "laptop", "prefix": token.prefix, "expires_at": "2030-01-02T03:04:05+00:00"},
    )
    assert recorded(event_of("token.revoke")) == (
        world.researcher_a,
        None,
        target,
        {"revoked_at": None},
        {"revoked_at": token.revoked_at.isoformat()},
    )
    stored = json.dumps(list(AuditEvent.objects.values()), default=str)
    assert secret not in stored
    assert token.key_hash not in stored


def test_the_token_endpoints_record_creation_and_revocation_by_the_owner(world):
    client = Client()
    created = client.post(
        reverse("api:token-create"),
        {"username": "bob", "password": PASSWORD, "name": "ci"},
        content_type="application/json",
    )
    revoked = client.delete(
        reverse("api:token-revoke"), headers={"Authorization": f"Bearer {created.json()['token']}"}
    )

    assert (created.status_code, revoked.status_code) == (201, 204)
    assert list(AuditEvent.objects.order_by("id").values_list("action", "actor__username")) == [
        ("token.create", "bob"),
        ("token.revoke", "bob"),
    ]


# --- images and registries ------------------------------------------------------------------


def test_approving_and_blocking_an_image_are_recorded(world):
    image = Image.objects.create(
        repository="registry.example.org/ml/new", digest=DIGEST_A[:-1] + "e"
    )

    image_set_status(image=image, status="approved", actor=world.platform_admin)
    image_set_status(image=image, status="blocked", actor=world.platform_admin)

    assert list(
        AuditEvent.objects.order_by("id").values_list("actor", "target", "before", "after")
    ) == [
        (world.platform_admin.pk, image.reference, {"status": "pending"}, {"status": "approved"}),
        (world.platform_admin.pk, image.reference, {"status": "approved"}, {"status": "blocked"}),
    ]


def test_a_visibility_change_is_recorded(world):
    image_set_visibility(
        image=world.image,
        visible_to_all=False,
        allowed_tenants=[world.vision, world.nlp],
        actor=world.platform_admin,
    )

    assert recorded(event_of("image.visibility")) == (
        world.platform_admin,
        None,
        world.image.reference,
        {"visible_to_all": True, "allowed_tenants": []},
        {"visible_to_all": False, "allowed_tenants": ["nlp", "vision"]},
    )


def test_registry_creation_edit_and_recheck_are_recorded(world):
    first_url = f"http://127.0.0.1:{free_port()}"
    second_url = f"http://127.0.0.1:{free_port()}"
    registry = registry_create(name="internal", url=first_url, actor=world.platform_admin)
    registry = registry_update(
        registry=registry, url=second_url, auth_kind="anonymous", actor=world.platform_admin
    )
    image = Image.objects.create(
        registry=registry,
        repository=f"{second_url.removeprefix('http://')}/ml/model",
        digest=DIGEST_A,
    )
    image_recheck(image=image, actor=world.platform_admin)

    settings = {
        "auth_kind": "anonymous",
        "username": "",
        "password_secret_ref": "",
        "ca_bundle_path": "",
        "timeout_s": 10,
        "enabled": True,
    }
    assert recorded(event_of("registry.create")) == (
        world.platform_admin,
        None,
        "internal",
        None,
        {"name": "internal", "url": first_url, **settings},
    )
    assert recorded(event_of("registry.update")) == (
        world.platform_admin,
        None,
        "internal",
        {"url": first_url, **settings},
        {"url": second_url, **settings},
    )
    image.refresh_from_db()
    recheck = event_of("image.recheck")
    assert (recheck.actor, recheck.target, recheck.before) == (
        world.platform_admin,
        image.reference,
        {"check_status": "", "check_message": ""},
    )
    assert recheck.after == {"check_status": "error", "check_message": image.check_message}


# --- runs, templates, clusters --------------------------------------------------------------


def test_cancelling_a_queued_run_is_recorded(world):
    run = submit(world)

    run_cancel(run=run, actor=world.researcher_a)

    assert recorded(event_of("run.cancel")) == (
        world.researcher_a,
        world.vision,
        f"run {run.pk}",
        {"state": "QUEUED", "cancel_requested": False},
        {"state": "CANCELLED", "cancel_requested": True},
    )


def test_a_cancel_request_for_a_running_run_is_recorded_once(world):
    run = submit(world)
    admission_run_cycle()
    attempt_submit(attempt_id=run.attempts.get().pk)
    cluster_sync(cluster=world.cluster)

    run_cancel(run=run, actor=world.tenant_admin_a)
    run_cancel(run=run, actor=world.tenant_admin_a)  # already requested

    assert recorded(event_of("run.cancel")) == (
        world.tenant_admin_a,
        world.vision,
        f"run {run.pk}",
        {"state": "RUNNING", "cancel_requested": False},
        {"state": "RUNNING", "cancel_requested": True},
    )


def test_gantry_cancelling_a_run_is_not_a_person_s_change(world):
    run = submit(world)

    run_cancel(run=run, actor=None, system_reason="Idle GPUs for 60 minutes")

    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED
    assert not AuditEvent.objects.filter(action="run.cancel").exists()


def test_template_creation_edit_and_deletion_are_recorded(world):
    values = {"resources": {"flavor": "a100-80gb", "gpus_per_node": 1}}
    state = {"name": "small", "description": "", "values": values, "locked": [], "ranges": {}}
    template = template_save(actor=world.tenant_admin_a, tenant=world.vision, **state)
    template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        template=template,
        **(state | {"locked": ["resources.flavor"]}),
    )
    template_delete(actor=world.platform_admin, template=template)

    edited = state | {"locked": ["resources.flavor"]}
    tara, paul = world.tenant_admin_a, world.platform_admin
    assert [(e.action, *recorded(e)) for e in AuditEvent.objects.order_by("id")] == [
        ("template.create", tara, world.vision, "template vision/small", None, state),
        ("template.update", tara, world.vision, "template vision/small", state, edited),
        ("template.delete", paul, world.vision, "template vision/small", edited, None),
    ]


def test_a_cluster_capacity_change_is_recorded(world):
    capacity.cluster_capacity_set(
        cluster=world.cluster,
        flavor=world.h100,
        nodes=3,
        gpus_per_node=4,
        actor=world.platform_admin,
    )

    assert recorded(event_of("cluster.capacity")) == (
        world.platform_admin,
        None,
        "sim-1:h100-80gb",
        {"nodes": 2, "gpus_per_node": 8},
        {"nodes": 3, "gpus_per_node": 4},
    )


def test_adding_a_rate_card_and_ending_the_previous_one_are_recorded(world):
    rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour=Decimal("2.50"),
        currency="EUR",
        valid_from=date(2026, 1, 1),
        actor=world.finance,
    )
    rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour=Decimal("3.00"),
        currency="EUR",
        valid_from=date(2026, 7, 1),
        actor=world.platform_admin,
    )

    first, second = "a100-80gb@2026-01-01", "a100-80gb@2026-07-01"
    fiona, paul = world.finance, world.platform_admin
    assert [(e.action, *recorded(e)) for e in AuditEvent.objects.order_by("id")] == [
        ("ratecard.add", fiona, None, first, None, price("2.50")),
        ("ratecard.end", paul, None, first, {"valid_to": None}, {"valid_to": "2026-07-01"}),
        ("ratecard.add", paul, None, second, None, price("3.00")),
    ]


def price(amount: str) -> dict:
    return {"price_per_gpu_hour": amount, "currency": "EUR", "credit_policy": "credit"}


# --- Django admin ---------------------------------------------------------------------------


@pytest.fixture
def superuser_client(world) -> Client:
    root = User.objects.create_superuser("root", "root@gantry.example", PASSWORD)
    client = Client()
    client.force_login(root)
    client.root = root
    return client


def admin_form_data(response) -> dict:
    """What a browser posts back from an admin change page left as it is: the main form,
    and each inline's management form and forms, with their current values."""
    forms_on_page = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        forms_on_page += [inline.formset.management_form, *inline.formset.forms]
    data = {}
    for form in forms_on_page:
        for name, field in form.fields.items():
            key, value = form.add_prefix(name), form[name].value()
            if value is None or value is False or field.disabled:
                continue
            if isinstance(field.widget, forms.MultiWidget):
                for index, part in enumerate(field.widget.decompress(value)):
                    data[f"{key}_{index}"] = "" if part is None else str(part)
            elif value is True:
                data[key] = "on"
            elif isinstance(value, list | tuple):
                data[key] = [str(item) for item in value]
            else:
                data[key] = str(value)
    return data


def inline_prefix(data: dict, model_name: str, user: User) -> str:
    """The form prefix of the membership inline row of ``user``."""
    for key, value in data.items():
        if key.endswith("-user") and value == str(user.pk):
            return key.removesuffix("-user")
    raise AssertionError(f"no {model_name} row for {user}")


def test_admin_changes_to_a_tenant_and_its_memberships_are_recorded(world, superuser_client):
    root = superuser_client.root
    url = reverse("admin:tenants_tenant_change", args=[world.vision.pk])
    data = admin_form_data(superuser_client.get(url))
    arthur_row = inline_prefix(data, "membership", world.researcher_a2)
    alice_row = inline_prefix(data, "membership", world.researcher_a)
    data |= {
        "cost_center": "CC-42",
        f"{arthur_row}-role": "tenant_admin",
        f"{alice_row}-DELETE": "on",
    }

    response = superuser_client.post(url, data)

    assert response.status_code == 302
    arthur = Membership.objects.get(user=world.researcher_a2)
    alice_id = int(data[f"{alice_row}-id"])
    arthur_was = {"id": arthur.pk, "user_id": world.researcher_a2.pk, "tenant_id": world.vision.pk}
    arthur_was["role"] = "researcher"
    alice_was = arthur_was | {"id": alice_id, "user_id": world.researcher_a.pk}
    assert [
        (e.action, e.actor, e.tenant, e.target, e.before, e.after)
        for e in AuditEvent.objects.order_by("id")
    ] == [
        (
            "membership.update",
            root,
            world.vision,
            "membership arthur in vision (tenant_admin)",
            arthur_was,
            arthur_was | {"role": "tenant_admin"},
        ),
        (
            "membership.delete",
            root,
            world.vision,
            "membership alice in vision (researcher)",
            alice_was,
            None,
        ),
        (
            "tenant.update",
            root,
            world.vision,
            "tenant vision",
            tenant_state(world.vision, cost_center=""),
            tenant_state(world.vision, cost_center="CC-42"),
        ),
    ]


def tenant_state(tenant: Tenant, **changes) -> dict:
    return {
        "id": tenant.pk,
        "slug": "vision",
        "name": "Vision Lab",
        "cost_center": "",
        "active": True,
        "created_at": audit_snapshot(tenant)["created_at"],
        "idle_notify_after_min": None,
        "idle_cancel_after_min": None,
        "queueing": "",
        "workspace_suspend_after_min": 60,
        "workspace_warn_before_min": 10,
        "workspace_suspend_silent_busy": False,
        "workspace_max_hours": 12,
    } | changes


def test_granting_a_role_in_the_admin_is_recorded_without_the_password(world, superuser_client):
    # The admin's form shows whole seconds: a stored fraction would be edited away.
    User.objects.filter(pk=world.researcher_b.pk).update(
        date_joined=datetime(2026, 1, 5, tzinfo=UTC)
    )
    url = reverse("admin:auth_user_change", args=[world.researcher_b.pk])
    data = admin_form_data(superuser_client.get(url))
    finance = Group.objects.get(name=GlobalRole.FINANCE)

    response = superuser_client.post(url, data | {"groups": [str(finance.pk)]})

    assert response.status_code == 302
    event = event_of("user.update")
    assert (event.actor, event.target) == (superuser_client.root, "user bob")
    changed = {key for key in event.after if event.after[key] != event.before.get(key)}
    assert (changed, event.before["groups"], event.after["groups"]) == ({"groups"}, [], ["finance"])
    assert "password" not in event.before | event.after
    assert world.researcher_b.password not in json.dumps([event.before, event.after])


def test_setting_a_password_in_the_admin_is_recorded_without_it(world, superuser_client):
    url = reverse("admin:auth_user_password_change", args=[world.researcher_b.pk])
    new_password = "an-entirely-new-password-42"

    response = superuser_client.post(url, {"password1": new_password, "password2": new_password})

    assert response.status_code == 302
    assert recorded(event_of("user.password")) == (
        superuser_client.root,
        None,
        "user bob",
        None,
        None,
    )


def test_an_admin_edit_of_a_cluster_is_recorded(world, superuser_client):
    url = reverse("admin:clusters_cluster_change", args=[world.cluster.pk])
    data = admin_form_data(superuser_client.get(url))
    data.pop("enabled")

    response = superuser_client.post(url, data)

    assert response.status_code == 302
    event = event_of("cluster.update")
    assert (event.actor, event.target, event.before["enabled"], event.after["enabled"]) == (
        superuser_client.root,
        "cluster sim-1",
        True,
        False,
    )
    assert {k for k in event.after if event.after[k] != event.before[k]} == {"enabled"}


def test_revoking_a_token_in_the_admin_is_recorded_without_its_hash(world, superuser_client):
    token, _ = api_token_create(user=world.researcher_a)
    url = reverse("admin:tenants_apitoken_change", args=[token.pk])
    data = admin_form_data(superuser_client.get(url))
    now = timezone.localtime().replace(microsecond=0)
    data |= {"revoked_at_0": f"{now:%Y-%m-%d}", "revoked_at_1": f"{now:%H:%M:%S}"}

    response = superuser_client.post(url, data)

    assert response.status_code == 302
    event = event_of("apitoken.update")
    stored_as = now.astimezone(UTC).isoformat().replace("+00:00", "Z")  # DjangoJSONEncoder
    assert (event.before["revoked_at"], event.after["revoked_at"]) == (None, stored_as)
    assert {k for k in event.after if event.after[k] != event.before[k]} == {"revoked_at"}
    assert token.key_hash not in json.dumps([event.before, event.after])


@pytest.mark.parametrize(
    "admin_url",
    [
        "admin:tenants_quota_change",
        "admin:tenants_gpuflavor_change",
        "admin:images_image_change",
        "admin:jobs_run_change",
        "admin:jobs_experimenttemplate_change",
        "admin:tenants_auditevent_change",
    ],
)
def test_what_gantry_pages_change_is_read_only_in_the_admin(world, superuser_client, admin_url):
    """Even a superuser cannot change these here: they change through services that check
    and audit them. The page shows the object; posting a change is refused, changing
    nothing."""
    template = template_save(
        actor=world.platform_admin,
        tenant=None,
        name="global",
        description="",
        values={},
        locked=[],
        ranges={},
    )
    run = submit(world)
    objects = {
        "admin:tenants_quota_change": Quota.objects.get(tenant=world.vision, flavor=world.a100),
        "admin:tenants_gpuflavor_change": world.a100,
        "admin:images_image_change": world.image,
        "admin:jobs_run_change": run,
        "admin:jobs_experimenttemplate_change": template,
        "admin:tenants_auditevent_change": AuditEvent.objects.get(action="template.create"),
    }
    target = objects[admin_url]
    url = reverse(admin_url, args=[target.pk])
    stored = audit_snapshot(type(target).objects.get(pk=target.pk))
    events = AuditEvent.objects.count()

    page = superuser_client.get(url)
    posted = superuser_client.post(url, {"name": "changed", "status": "blocked"})

    assert (page.status_code, posted.status_code) == (200, 403)
    assert audit_snapshot(type(target).objects.get(pk=target.pk)) == stored
    assert AuditEvent.objects.count() == events


# --- append-only ----------------------------------------------------------------------------


@pytest.fixture
def event(world) -> AuditEvent:
    membership_set(
        user=world.researcher_a2,
        tenant=world.vision,
        role="tenant_admin",
        actor=world.platform_admin,
    )
    return event_of("membership.set")


def stored_events() -> list[dict]:
    return list(AuditEvent.objects.order_by("id").values())


def test_saving_a_stored_event_again_is_refused(event):
    before = stored_events()
    event.action = "membership.forged"

    with pytest.raises(AuditLogAppendOnly, match="append-only: AuditEvent rows cannot be updated"):
        event.save()
    assert stored_events() == before


def test_a_new_event_with_an_existing_id_is_an_insert_that_fails(event):
    before = stored_events()
    forged = AuditEvent(pk=event.pk, action="membership.forged", target="arthur@vision")

    with pytest.raises(IntegrityError), transaction.atomic():
        forged.save()
    assert stored_events() == before


def test_deleting_an_event_is_refused(event):
    before = stored_events()

    with pytest.raises(AuditLogAppendOnly, match="cannot be deleted"):
        event.delete()
    assert stored_events() == before


@pytest.mark.parametrize(
    ("operation", "message"),
    [
        (lambda events: events.update(action="membership.forged"), "cannot be updated"),
        (lambda events: events.delete(), "cannot be deleted"),
        (
            lambda events: AuditEvent.objects.bulk_update(
                [AuditEvent(pk=e.pk, action="forged") for e in events], ["action"]
            ),
            "cannot be updated",
        ),
    ],
    ids=["update", "delete", "bulk_update"],
)
def test_bulk_changes_through_the_orm_are_refused(event, operation, message):
    before = stored_events()

    with pytest.raises(AuditLogAppendOnly, match=message):
        operation(AuditEvent.objects.filter(pk=event.pk))
    assert stored_events() == before


@pytest.mark.parametrize(
    ("sql", "operation"),
    [
        ("UPDATE tenants_auditevent SET action = 'membership.forged'", "UPDATE"),
        ("UPDATE tenants_auditevent SET actor_id = NULL, tenant_id = NULL", "UPDATE"),
        ("DELETE FROM tenants_auditevent", "DELETE"),
    ],
    ids=["update", "null-out", "delete"],
)
def test_postgresql_refuses_raw_updates_and_deletes(event, sql, operation):
    assert connection.vendor == "postgresql"
    before = stored_events()

    refused = f"append-only: {operation} of tenants_auditevent"
    with (
        pytest.raises(IntegrityError, match=refused),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql)
    assert stored_events() == before


def test_a_user_who_made_changes_cannot_be_deleted_but_can_be_deactivated(event, world):
    admin = world.platform_admin

    with pytest.raises(ProtectedError), transaction.atomic():
        admin.delete()
    admin.is_active = False
    admin.save(update_fields=["is_active"])

    event.refresh_from_db()
    assert (event.actor, event.actor.is_active) == (admin, False)


def test_a_tenant_in_the_log_cannot_be_deleted(world):
    climate = Tenant.objects.create(slug="climate", name="Climate")
    tenant_idle_policy_update(
        tenant=climate,
        idle_notify_after_min=10,
        idle_cancel_after_min=None,
        actor=world.platform_admin,
    )

    with pytest.raises(ProtectedError), transaction.atomic():
        climate.delete()
    assert event_of("tenant.idle_policy").tenant == climate


def test_a_refused_token_request_creates_and_records_nothing(world):
    response = Client().post(
        reverse("api:token-create"),
        {"username": "alice", "password": "wrong"},
        content_type="application/json",
    )

    assert response.status_code == 400
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.exists()


def test_submitting_is_in_the_run_timeline_not_the_audit_log(world):
    """A submission is its own record (experiment, run and its QUEUED event with the actor
    and time); the audit log is for changes to settings and to other people's work."""
    run = run_submit(user=world.researcher_a, data=experiment_input(world))

    assert list(run.events.values_list("to_state", "actor")) == [("QUEUED", world.researcher_a.pk)]
    assert not AuditEvent.objects.exists()
