"""Issue 22.4, people: platform admins add existing users to a tenant (tenant admins invite
them: test_invitations.py), tenant admins change roles and remove members (services and the
members page), with audit rows; every user creates API tokens on their account page, the
secret shown once."""

import hashlib
import re
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from jobs.access import run_list_viewable
from jobs.models import Run, RunState
from jobs.services.submission import run_submit
from tenants.access import tenant_list_submittable
from tenants.invitations import membership_invite
from tenants.models import ApiToken, AuditEvent, Membership
from tenants.services.memberships import membership_add, membership_remove, membership_role_change
from tenants.services.tokens import API_TOKEN_MAX_DAYS, api_token_issue
from tests.conftest import experiment_input

RESEARCHER, TENANT_ADMIN = Membership.Role.RESEARCHER, Membership.Role.TENANT_ADMIN
UNKNOWN = {"user": ["No user has this username or e-mail address."]}
LAST_ADMIN_DEMOTED = (
    "tara is the last tenant admin of vision and cannot be demoted: make another member "
    "tenant admin first."
)
LAST_ADMIN_REMOVED = (
    "tara is the last tenant admin of vision and cannot be removed: make another member "
    "tenant admin first."
)
SECRET = re.compile(r"gty_[A-Za-z0-9_-]{43}")


def roles(tenant) -> dict[str, str]:
    return dict(Membership.objects.filter(tenant=tenant).values_list("user__username", "role"))


VISION_BEFORE = {"alice": RESEARCHER, "arthur": RESEARCHER, "tara": TENANT_ADMIN}


def audit_rows() -> list[tuple]:
    return [
        (event.actor.username, event.tenant.slug, event.action, event.target, event.before,
         event.after)
        for event in AuditEvent.objects.order_by("id")
    ]  # fmt: skip


def membership(world, user) -> Membership:
    return Membership.objects.get(tenant=world.vision, user=user)


# --- adding ---------------------------------------------------------------------------------


def test_a_platform_admin_adds_a_user_by_username_with_an_audit_row(world):
    added = membership_add(
        tenant=world.vision, identifier=" fiona ", role=RESEARCHER, actor=world.platform_admin
    )

    assert (added.user, added.tenant, added.role) == (world.finance, world.vision, RESEARCHER)
    assert roles(world.vision) == VISION_BEFORE | {"fiona": RESEARCHER}
    assert audit_rows() == [
        ("paul", "vision", "membership.add", "fiona@vision", None, {"role": "researcher"})
    ]


def test_a_tenant_admin_cannot_add_anybody_directly(world):
    with pytest.raises(PermissionDenied) as refused:
        membership_add(
            tenant=world.vision, identifier="fiona", role=RESEARCHER, actor=world.tenant_admin_a
        )

    assert str(refused.value) == (
        "Only platform admins add people to vision directly; tenant admins invite them."
    )
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_a_user_is_found_by_e_mail_address_whatever_its_case(world):
    User.objects.filter(pk=world.researcher_b.pk).update(email="Bob@Example.org")

    added = membership_add(
        tenant=world.vision,
        identifier="bob@example.ORG",
        role=TENANT_ADMIN,
        actor=world.platform_admin,
    )

    assert (added.user, added.role) == (world.researcher_b, TENANT_ADMIN)
    assert audit_rows() == [
        ("paul", "vision", "membership.add", "bob@vision", None, {"role": "tenant_admin"})
    ]


@pytest.mark.parametrize(
    "identifier",
    ["nobody", "ALICE", "bo", "b", "bob@", "nobody@example.org", "x" * 255, "bo\x00b"],
)
def test_only_an_exact_username_or_address_is_accepted(world, identifier):
    User.objects.filter(pk=world.researcher_b.pk).update(email="bob@example.org")

    with pytest.raises(ValidationError) as refused:
        membership_add(
            tenant=world.nlp, identifier=identifier, role=RESEARCHER, actor=world.platform_admin
        )

    assert refused.value.message_dict == UNKNOWN
    assert roles(world.nlp) == {"bob": RESEARCHER}
    assert not AuditEvent.objects.exists()


def test_an_inactive_user_is_refused_exactly_like_an_unknown_one(world):
    User.objects.filter(pk=world.finance.pk).update(is_active=False, email="fiona@example.org")

    for identifier in ("fiona", "fiona@example.org"):
        with pytest.raises(ValidationError) as refused:
            membership_add(
                tenant=world.vision,
                identifier=identifier,
                role=RESEARCHER,
                actor=world.platform_admin,
            )
        assert refused.value.message_dict == UNKNOWN
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("identifier", "role", "errors"),
    [
        ("alice", RESEARCHER, {"user": ["alice is already a member of vision."]}),
        ("alice", TENANT_ADMIN, {"user": ["alice is already a member of vision."]}),
        ("   ", RESEARCHER, {"user": ["Enter a username or an e-mail address."]}),
        ("fiona", "owner", {"role": ["Choose a role: researcher or tenant admin."]}),
        ("fiona", "", {"role": ["Choose a role: researcher or tenant admin."]}),
        (
            "twins@example.org",
            RESEARCHER,
            {"user": ["More than one user has this e-mail address: enter the username instead."]},
        ),
    ],
)
def test_bad_additions_are_refused_and_change_nothing(world, identifier, role, errors):
    User.objects.filter(pk__in=[world.finance.pk, world.researcher_b.pk]).update(
        email="twins@example.org"
    )

    with pytest.raises(ValidationError) as refused:
        membership_add(
            tenant=world.vision, identifier=identifier, role=role, actor=world.platform_admin
        )

    assert refused.value.message_dict == errors
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("persona", ["researcher_a", "researcher_b", "finance"])
def test_only_tenant_and_platform_admins_manage_members(world, persona):
    actor = getattr(world, persona)
    alice = membership(world, world.researcher_a)
    attempts = [
        lambda: membership_invite(
            tenant=world.vision, identifier="fiona", role=RESEARCHER, actor=actor, now=NOW
        ),
        lambda: membership_role_change(membership=alice, role=TENANT_ADMIN, actor=actor),
        lambda: membership_remove(membership=alice, actor=actor),
    ]

    for attempt in attempts:
        with pytest.raises(PermissionDenied) as refused:
            attempt()
        assert str(refused.value) == (
            "Only tenant admins of vision and platform admins manage its members."
        )
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_a_tenant_admin_manages_only_their_own_tenant(world):
    with pytest.raises(PermissionDenied):
        membership_invite(
            tenant=world.nlp,
            identifier="alice",
            role=RESEARCHER,
            actor=world.tenant_admin_a,
            now=NOW,
        )
    with pytest.raises(PermissionDenied):
        membership_remove(
            membership=Membership.objects.get(tenant=world.nlp), actor=world.tenant_admin_a
        )
    assert roles(world.nlp) == {"bob": RESEARCHER}


# --- changing roles -------------------------------------------------------------------------


def test_a_role_change_records_the_old_and_the_new_role(world):
    changed = membership_role_change(
        membership=membership(world, world.researcher_a),
        role=TENANT_ADMIN,
        actor=world.tenant_admin_a,
    )

    assert changed.role == TENANT_ADMIN
    assert roles(world.vision) == VISION_BEFORE | {"alice": TENANT_ADMIN}
    assert audit_rows() == [
        (
            "tara",
            "vision",
            "membership.role_change",
            "alice@vision",
            {"role": "researcher"},
            {"role": "tenant_admin"},
        )
    ]


def test_the_same_role_again_changes_and_records_nothing(world):
    membership_role_change(
        membership=membership(world, world.researcher_a),
        role=RESEARCHER,
        actor=world.platform_admin,
    )

    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_an_unknown_role_is_refused(world):
    with pytest.raises(ValidationError) as refused:
        membership_role_change(
            membership=membership(world, world.researcher_a),
            role="root",
            actor=world.tenant_admin_a,
        )

    assert refused.value.message_dict == {"role": ["Choose a role: researcher or tenant admin."]}
    assert roles(world.vision) == VISION_BEFORE


@pytest.mark.parametrize("actor", ["tenant_admin_a", "platform_admin"])
def test_the_last_tenant_admin_can_be_neither_demoted_nor_removed(world, actor):
    tara = membership(world, world.tenant_admin_a)

    with pytest.raises(ValidationError) as demoted:
        membership_role_change(membership=tara, role=RESEARCHER, actor=getattr(world, actor))
    with pytest.raises(ValidationError) as removed:
        membership_remove(membership=tara, actor=getattr(world, actor))

    assert demoted.value.messages == [LAST_ADMIN_DEMOTED]
    assert removed.value.messages == [LAST_ADMIN_REMOVED]
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_with_a_second_admin_the_first_may_step_down(world):
    membership_role_change(
        membership=membership(world, world.researcher_a),
        role=TENANT_ADMIN,
        actor=world.tenant_admin_a,
    )

    membership_role_change(
        membership=membership(world, world.tenant_admin_a),
        role=RESEARCHER,
        actor=world.tenant_admin_a,
    )

    assert roles(world.vision) == {"alice": TENANT_ADMIN, "arthur": RESEARCHER, "tara": RESEARCHER}
    # Now alice is the last one.
    with pytest.raises(ValidationError):
        membership_remove(
            membership=membership(world, world.researcher_a), actor=world.platform_admin
        )


def test_a_change_to_a_membership_removed_meanwhile_is_does_not_exist(world):
    alice = membership(world, world.researcher_a)
    Membership.objects.filter(pk=alice.pk).delete()

    with pytest.raises(Membership.DoesNotExist):
        membership_role_change(membership=alice, role=TENANT_ADMIN, actor=world.tenant_admin_a)
    with pytest.raises(Membership.DoesNotExist):
        membership_remove(membership=alice, actor=world.tenant_admin_a)
    assert not AuditEvent.objects.exists()


def lock_waiters() -> int:
    """Other sessions of this database waiting on a row lock now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_two_admins_stepping_down_at_once_leave_one_admin(transactional_db, world):
    """tara and alice, the two admins, step down at the same moment: the first holds the
    tenant's admin memberships locked until it commits, the second waits for it, then sees
    that it would leave no admin and is refused."""
    Membership.objects.filter(user=world.researcher_a).update(role=TENANT_ADMIN)
    tara, alice = membership(world, world.tenant_admin_a), membership(world, world.researcher_a)
    first_changed, commit_first = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                membership_role_change(membership=tara, role=RESEARCHER, actor=world.platform_admin)
                first_changed.set()
                commit_first.wait(timeout=30)
        finally:
            connection.close()

    def second() -> None:
        try:
            membership_role_change(membership=alice, role=RESEARCHER, actor=world.platform_admin)
            outcome["second"] = "changed"
        except ValidationError as refused:
            outcome["second"] = refused.messages
        finally:
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_changed.wait(timeout=30)
    threads[1].start()
    deadline = time.monotonic() + 30
    while lock_waiters() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock_waiters() == 1  # the second change waits for the first one's locks
    commit_first.set()
    for thread in threads:
        thread.join(timeout=30)

    assert outcome == {
        "second": [
            "alice is the last tenant admin of vision and cannot be demoted: make another "
            "member tenant admin first."
        ]
    }
    assert roles(world.vision) == {"alice": TENANT_ADMIN, "arthur": RESEARCHER, "tara": RESEARCHER}
    assert [row[2:] for row in audit_rows()] == [
        ("membership.role_change", "tara@vision", {"role": "tenant_admin"}, {"role": "researcher"})
    ]


# --- removing -------------------------------------------------------------------------------


def test_removing_a_member_keeps_their_runs_and_stops_their_submissions(world):
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    assert run.state == RunState.QUEUED

    membership_remove(membership=membership(world, world.researcher_a), actor=world.tenant_admin_a)

    assert roles(world.vision) == {"arthur": RESEARCHER, "tara": TENANT_ADMIN}
    assert audit_rows() == [
        ("tara", "vision", "membership.remove", "alice@vision", {"role": "researcher"}, None)
    ]
    run.refresh_from_db()
    assert (run.state, run.submitted_by, run.tenant) == (
        RunState.QUEUED,
        world.researcher_a,
        world.vision,
    )
    assert Run.objects.count() == 1
    alice = User.objects.get(pk=world.researcher_a.pk)  # no cached roles
    assert list(tenant_list_submittable(user=alice)) == []
    assert list(run_list_viewable(user=alice)) == []
    with pytest.raises(ValidationError) as refused:
        run_submit(user=alice, data=experiment_input(world, name="after-removal"))
    assert refused.value.message_dict["tenant"] == ["Unknown tenant, or you are not a member."]


# --- the members page -----------------------------------------------------------------------


def members_url(slug: str = "vision") -> str:
    return reverse("jobs:tenant_members", args=[slug])


def add_url(slug: str = "vision") -> str:
    return reverse("jobs:member_add", args=[slug])


def role_url(user, slug: str = "vision") -> str:
    return reverse("jobs:member_role", args=[slug, user.pk])


def remove_url(user, slug: str = "vision") -> str:
    return reverse("jobs:member_remove", args=[slug, user.pk])


def writes(world) -> list[tuple[str, dict]]:
    """One of each write of the members page, valid for an admin of vision."""
    return [
        (add_url(), {"user": "fiona", "role": RESEARCHER}),
        (role_url(world.researcher_a), {"role": TENANT_ADMIN}),
        (remove_url(world.researcher_a), {}),
    ]


@pytest.mark.parametrize("persona", ["tenant_admin_a", "platform_admin"])
def test_admins_get_the_page_with_every_form(client, world, persona):
    client.force_login(getattr(world, persona))

    response = client.get(members_url())

    content = response.content.decode()
    assert response.status_code == 200
    assert f'action="{add_url()}"' in content
    for user in (world.researcher_a, world.researcher_a2, world.tenant_admin_a):
        assert f'action="{role_url(user)}"' in content
        assert f'action="{remove_url(user)}"' in content
    assert (
        f'<select id="role-{world.tenant_admin_a.pk}" name="role">'
        '<option value="researcher">Researcher</option>'
        '<option value="tenant_admin" selected>Tenant admin</option></select>'
    ) in re.sub(r">\s+<", "><", content)
    assert (
        'data-confirm="Remove alice from vision? Their runs stay; they can no longer submit to '
        'vision."'
    ) in content


def test_the_remove_confirmation_counts_the_members_queued_runs(client, world):
    run_submit(user=world.researcher_a, data=experiment_input(world))
    run_submit(user=world.researcher_a, data=experiment_input(world, name="second"))
    client.force_login(world.tenant_admin_a)

    content = client.get(members_url()).content.decode()

    assert (
        'data-confirm="Remove alice from vision? Their runs stay, and their 2 queued runs will '
        'still run unless you cancel them; they can no longer submit to vision."'
    ) in content


def test_outsiders_get_404_for_the_page_and_every_write(client, world):
    client.force_login(world.researcher_b)

    assert client.get(members_url()).status_code == 404
    for url, data in writes(world):
        assert client.post(url, data).status_code == 404, url
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("persona", ["researcher_a", "researcher_a2", "finance"])
def test_members_and_readers_without_rights_get_403_and_nothing_changes(client, world, persona):
    client.force_login(getattr(world, persona))

    assert client.get(members_url()).status_code == 403
    for url, data in writes(world):
        assert client.post(url, data).status_code == 403, url
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_anonymous_writes_go_to_the_login_page(client, world):
    for url, data in writes(world):
        response = client.post(url, data)
        assert (response.status_code, response.url) == (302, f"{reverse('login')}?next={url}")
    assert roles(world.vision) == VISION_BEFORE


def test_writes_without_a_csrf_token_are_refused(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.tenant_admin_a)

    for url, data in writes(world):
        assert client.post(url, data).status_code == 403, url
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_reading_the_page_is_the_only_get(client, world):
    client.force_login(world.tenant_admin_a)

    for url, _ in writes(world):
        assert client.get(url).status_code == 405, url


def test_memberships_of_other_tenants_and_unknown_ids_are_404(client, world):
    client.force_login(world.tenant_admin_a)

    for user_id in (world.researcher_b.pk, world.finance.pk, 2**63, 10**30):
        for name in ("jobs:member_role", "jobs:member_remove"):
            url = reverse(name, args=["vision", user_id])
            assert client.post(url, {"role": TENANT_ADMIN}).status_code == 404, url
    assert roles(world.nlp) == {"bob": RESEARCHER}
    assert roles(world.vision) == VISION_BEFORE


def test_a_platform_admin_adds_a_member_from_the_page(client, world):
    client.force_login(world.platform_admin)

    response = client.post(add_url(), {"user": "fiona", "role": TENANT_ADMIN})

    assert (response.status_code, response.url) == (302, members_url())
    assert roles(world.vision) == VISION_BEFORE | {"fiona": TENANT_ADMIN}
    page = client.get(members_url()).content.decode()
    assert "Added fiona to vision as tenant admin." in page
    assert '<tr data-member="fiona">' in page


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"user": "nobody", "role": RESEARCHER}, "No user has this username or e-mail address."),
        ({"user": "alice", "role": RESEARCHER}, "alice is already a member of vision."),
        ({"user": "", "role": RESEARCHER}, "This field is required."),
        ({"user": "fiona", "role": "owner"}, "Choose a role: researcher or tenant admin."),
    ],
)
def test_a_refused_addition_shows_the_error_by_its_field_and_changes_nothing(
    client, world, data, error
):
    client.force_login(world.platform_admin)

    response = client.post(add_url(), data)

    content = response.content.decode()
    assert response.status_code == 400
    assert "Nobody was added: please correct the fields marked below." in content
    assert f"<li>{error}</li>" in content
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_an_admin_changes_a_role_from_the_page(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(role_url(world.researcher_a2), {"role": TENANT_ADMIN})

    assert (response.status_code, response.url) == (302, members_url())
    assert roles(world.vision) == VISION_BEFORE | {"arthur": TENANT_ADMIN}
    assert "arthur is now tenant admin of vision." in client.get(members_url()).content.decode()


@pytest.mark.parametrize(
    ("user", "data", "error"),
    [
        ("researcher_a", {"role": "boss"}, "Choose a role: researcher or tenant admin."),
        ("researcher_a", {}, "Choose a role: researcher or tenant admin."),
        ("tenant_admin_a", {"role": RESEARCHER}, LAST_ADMIN_DEMOTED),
    ],
)
def test_a_refused_role_change_says_why_and_changes_nothing(client, world, user, data, error):
    client.force_login(world.tenant_admin_a)

    response = client.post(role_url(getattr(world, user)), data)

    assert response.status_code == 400
    assert (
        f'<div class="message message-error" role="alert" data-member-error>{error}</div>'
        in response.content.decode()
    )
    assert roles(world.vision) == VISION_BEFORE
    assert not AuditEvent.objects.exists()


def test_an_admin_removes_a_member_from_the_page(client, world):
    client.force_login(world.platform_admin)

    response = client.post(remove_url(world.researcher_a2))

    assert (response.status_code, response.url) == (302, members_url())
    assert roles(world.vision) == {"alice": RESEARCHER, "tara": TENANT_ADMIN}
    assert (
        "Removed arthur from vision. Their runs stay; they can no longer submit to vision."
        in client.get(members_url()).content.decode()
    )
    assert audit_rows() == [
        ("paul", "vision", "membership.remove", "arthur@vision", {"role": "researcher"}, None)
    ]


def test_removing_the_last_admin_from_the_page_is_refused(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(remove_url(world.tenant_admin_a))

    assert response.status_code == 400
    assert LAST_ADMIN_REMOVED in response.content.decode()
    assert roles(world.vision) == VISION_BEFORE


def test_an_admin_who_steps_down_is_sent_to_the_tenants_quotas(client, world):
    Membership.objects.filter(user=world.researcher_a).update(role=TENANT_ADMIN)
    client.force_login(world.tenant_admin_a)

    response = client.post(role_url(world.tenant_admin_a), {"role": RESEARCHER})

    quotas = f"{reverse('jobs:quota_list')}?tenant=vision"
    assert (response.status_code, response.url) == (302, quotas)
    assert "tara is now researcher of vision." in client.get(quotas).content.decode()
    assert client.get(members_url()).status_code == 403


# --- API tokens on the account page ---------------------------------------------------------

NOW = datetime(2025, 3, 4, 10, 30, tzinfo=UTC)


def create_token(client, **data):
    form = {"submission_key": str(uuid.uuid4()), "name": "laptop"}
    return client.post(reverse("api_token_create"), form | data)


def new_secret(response) -> str:
    found = SECRET.findall(response.content.decode())
    assert len(set(found)) == 1, found
    return found[0]


@time_machine.travel(NOW, tick=False)
def test_a_token_made_on_the_account_page_is_shown_once_and_stored_hashed(client, world):
    client.force_login(world.researcher_a)

    response = create_token(client, expires_in_days="30")

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    secret = new_secret(response)
    content = response.content.decode()
    assert "Copy it now: it is shown only this once." in content
    assert f'<input id="new-token" class="mono" type="text" readonly value="{secret}"' in content
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.prefix, token.expires_at, token.revoked_at) == (
        world.researcher_a,
        "laptop",
        secret[4:12],
        NOW + timedelta(days=30),
        None,
    )
    assert token.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    stored = [str(value) for value in ApiToken.objects.values_list().get()]
    assert not [value for value in stored if secret in value]
    assert audit_rows_of_tokens() == [
        (
            "alice",
            "token.create",
            f"token {secret[4:12]}… of alice",
            None,
            {"name": "laptop", "prefix": secret[4:12], "expires_at": "2025-04-03T10:30:00+00:00"},
        )
    ]
    assert not [s for s in Session.objects.all() if secret in str(s.get_decoded())]
    # Visiting the page again, or reloading it, never shows the secret again.
    again = client.get(reverse("account"))
    assert secret not in again.content.decode()
    assert f"<code>gty_{secret[4:12]}…</code>" in again.content.decode()
    assert not SECRET.search(again.content.decode())


def audit_rows_of_tokens() -> list[tuple]:
    return [
        (event.actor.username, event.action, event.target, event.before, event.after)
        for event in AuditEvent.objects.order_by("id")
    ]


@time_machine.travel(NOW, tick=False)
def test_the_token_works_against_the_api_and_the_page_shows_its_last_use(client, world):
    client.force_login(world.researcher_a)
    secret = new_secret(create_token(client, expires_in_days=""))
    assert ApiToken.objects.get().expires_at == NOW + timedelta(days=90)

    with time_machine.travel(NOW + timedelta(minutes=5), tick=False):
        api = Client().get(reverse("api:run-list"), HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.status_code == 200

    page = client.get(reverse("account")).content.decode()
    assert '<time datetime="2025-03-04T10:35:00+00:00">2025-03-04 10:35</time>' in page


@pytest.mark.parametrize(
    ("data", "field", "error"),
    [
        ({"expires_in_days": "0"}, "expires_in_days", f"Between 1 and {API_TOKEN_MAX_DAYS} days."),
        ({"expires_in_days": "366"}, "expires_in_days", "Between 1 and 365 days."),
        ({"expires_in_days": "-5"}, "expires_in_days", "Between 1 and 365 days."),
        ({"expires_in_days": "ten"}, "expires_in_days", "Enter a whole number."),
        ({"name": ""}, "name", "This field is required."),
        ({"name": "   "}, "name", "This field is required."),
        ({"name": "x" * 101}, "name", "At most 100 characters, no NUL characters."),
    ],
)
def test_a_refused_token_shows_the_error_and_creates_nothing(client, world, data, field, error):
    client.force_login(world.researcher_a)

    response = create_token(client, **data)

    content = response.content.decode()
    assert response.status_code == 400
    assert "No token was created: please correct the fields marked below." in content
    assert f'<ul class="errorlist" id="id_{field}_error"><li>{error}</li></ul>' in content
    assert not SECRET.search(content)
    assert not ApiToken.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("name", "days", "errors"),
    [
        ("ok", 0, {"expires_in_days": ["Between 1 and 365 days."]}),
        ("ok", 366, {"expires_in_days": ["Between 1 and 365 days."]}),
        ("ok", True, {"expires_in_days": ["Between 1 and 365 days."]}),
        ("ok", "30", {"expires_in_days": ["Between 1 and 365 days."]}),
        (" ", 30, {"name": ["A name is required."]}),
        ("a\x00b", 30, {"name": ["At most 100 characters, no NUL characters."]}),
    ],
)
def test_the_token_rules_are_the_services(world, name, days, errors):
    with pytest.raises(ValidationError) as refused:
        api_token_issue(user=world.researcher_a, name=name, expires_in_days=days)

    assert refused.value.message_dict == errors
    assert not ApiToken.objects.exists()


def test_the_api_refuses_the_same_lifetimes(client, world):
    for days in (0, 366):
        response = client.post(
            reverse("api:token-create"),
            {"username": "alice", "password": "correct-horse-battery", "expires_in_days": days},
            content_type="application/json",
        )
        assert response.status_code == 400
    assert not ApiToken.objects.exists()


@time_machine.travel(NOW, tick=False)
def test_the_api_and_the_page_make_the_same_token(client, world):
    response = client.post(
        reverse("api:token-create"),
        {"username": "alice", "password": "correct-horse-battery", "name": " ci "},
        content_type="application/json",
    )

    assert response.status_code == 201
    token = ApiToken.objects.get()
    assert (token.name, token.expires_at) == ("ci", NOW + timedelta(days=90))


def test_creating_a_token_needs_a_csrf_token_and_a_post(world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.researcher_a)

    assert client.post(reverse("api_token_create"), {"name": "x"}).status_code == 403
    assert client.get(reverse("api_token_create")).status_code == 405
    assert not ApiToken.objects.exists()


def test_the_account_page_offers_the_form_and_shows_no_secret(client, world):
    client.force_login(world.researcher_a)

    content = client.get(reverse("account")).content.decode()

    assert f'action="{reverse("api_token_create")}"' in content
    assert 'name="name" value="api"' in content
    assert 'name="expires_in_days" value="90"' in content
    assert "data-new-token" not in content
