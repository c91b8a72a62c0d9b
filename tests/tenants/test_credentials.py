"""Issue 21.5: credentials follow the account. A password change, by any path, or a
deactivation revokes the user's API tokens and ends their sessions."""

import io

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from tenants.models import ApiToken, AuditEvent
from tenants.services.tokens import api_token_create
from tests.conftest import PASSWORD
from tests.tenants.test_audit_log import admin_form_data

NEW_PASSWORD = "a-much-longer-new-passphrase-41"
OUTLIVED = {
    "detail": "Token revoked: the account's password changed since it was made. "
    "Create a new one (your account page, POST /api/v1/tokens/ or gantry login)."
}


def runs_with(secret: str):
    return Client().get(reverse("api:run-list"), HTTP_AUTHORIZATION=f"Bearer {secret}")


def signed_in(username: str) -> Client:
    client = Client()
    response = client.post(reverse("login"), {"username": username, "password": PASSWORD})
    assert response.status_code == 302
    return client


def sessions_of(user: User) -> int:
    return sum(
        1 for s in Session.objects.all() if s.get_decoded().get("_auth_user_id") == str(user.pk)
    )


@pytest.fixture
def alice_token(world) -> tuple[ApiToken, str]:
    token, secret = api_token_create(user=world.researcher_a, name="laptop")
    assert runs_with(secret).status_code == 200
    return token, secret


def test_a_password_change_on_the_account_page_revokes_the_tokens(world, alice_token):
    token, secret = alice_token
    laptop, phone = signed_in("alice"), signed_in("alice")
    _, bobs_secret = api_token_create(user=world.researcher_b)

    response = laptop.post(
        reverse("password_change"),
        {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )

    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert (runs_with(secret).status_code, runs_with(secret).json()) == (
        401,
        {"detail": "Invalid or revoked token."},
    )
    assert laptop.get(reverse("jobs:run_list")).status_code == 200  # this session stays
    assert phone.get(reverse("jobs:run_list")).status_code == 302  # the other one is gone
    assert sessions_of(world.researcher_a) == 1
    event = AuditEvent.objects.get(action="user.credentials_revoke")
    assert (event.actor, event.target, event.after) == (
        world.researcher_a,
        "user alice",
        {"because": "password_changed", "tokens": 1, "sessions": 1},
    )
    # Another user's token is untouched, and a token made after the change works.
    assert runs_with(bobs_secret).status_code == 200
    _, fresh = api_token_create(user=User.objects.get(username="alice"))
    assert runs_with(fresh).status_code == 200


def test_a_password_set_anywhere_else_stops_the_tokens_too(world, alice_token):
    """``manage.py changepassword``, a shell or a password reset: set_password and save."""
    token, secret = alice_token
    alice = User.objects.get(username="alice")
    alice.set_password(NEW_PASSWORD)
    alice.save()

    response = runs_with(secret)

    assert (response.status_code, response.json()) == (401, OUTLIVED)
    token.refresh_from_db()
    assert token.revoked_at is None  # nothing wrote it: the stamp no longer matches
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("account")).content.decode()
    assert "revoked (password changed)" in page
    assert f'action="{reverse("api_token_revoke", args=[token.pk])}"' not in page


def test_the_same_password_set_again_still_revokes(world, alice_token):
    """A new salt makes a new hash: re-entering the same password is a change too."""
    _, secret = alice_token
    alice = User.objects.get(username="alice")
    alice.set_password(PASSWORD)
    alice.save()
    assert runs_with(secret).status_code == 401


def test_an_admin_setting_the_password_revokes_tokens_and_sessions(world, alice_token):
    token, secret = alice_token
    session = signed_in("alice")
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@gantry.example", PASSWORD))

    response = admin.post(
        reverse("admin:auth_user_password_change", args=[world.researcher_a.pk]),
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
    )

    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert runs_with(secret).status_code == 401
    assert session.get(reverse("jobs:run_list")).status_code == 302
    assert sessions_of(world.researcher_a) == 0
    assert AuditEvent.objects.get(action="user.credentials_revoke").after == {
        "because": "password_changed",
        "tokens": 1,
        "sessions": 1,
    }


def test_a_deactivation_is_final_even_after_reactivation(world, alice_token):
    token, secret = alice_token
    session = signed_in("alice")
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@gantry.example", PASSWORD))
    url = reverse("admin:auth_user_change", args=[world.researcher_a.pk])
    data = admin_form_data(admin.get(url))

    assert admin.post(url, {k: v for k, v in data.items() if k != "is_active"}).status_code == 302

    token.refresh_from_db()
    assert token.revoked_at is not None
    assert sessions_of(world.researcher_a) == 0
    assert AuditEvent.objects.get(action="user.credentials_revoke").after == {
        "because": "deactivated",
        "tokens": 1,
        "sessions": 1,
    }
    # Reactivated: what existed before stays dead; a new login works.
    assert admin.post(url, data).status_code == 302
    assert User.objects.get(pk=world.researcher_a.pk).is_active
    assert runs_with(secret).status_code == 401
    assert session.get(reverse("jobs:run_list")).status_code == 302
    assert signed_in("alice").get(reverse("jobs:run_list")).status_code == 200


def test_an_admin_edit_that_keeps_the_account_active_revokes_nothing(world, alice_token):
    token, secret = alice_token
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@gantry.example", PASSWORD))
    url = reverse("admin:auth_user_change", args=[world.researcher_a.pk])

    assert (
        admin.post(url, admin_form_data(admin.get(url)) | {"first_name": "Alice"}).status_code
        == 302
    )

    token.refresh_from_db()
    assert token.revoked_at is None
    assert runs_with(secret).status_code == 200
    assert not AuditEvent.objects.filter(action="user.credentials_revoke").exists()


def test_a_refused_password_change_leaves_tokens_and_sessions_alone(world, alice_token):
    token, secret = alice_token
    laptop, phone = signed_in("alice"), signed_in("alice")

    response = laptop.post(
        reverse("password_change"),
        {"old_password": "not-it", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )

    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is None
    assert runs_with(secret).status_code == 200
    assert phone.get(reverse("jobs:run_list")).status_code == 200
    assert sessions_of(world.researcher_a) == 2
    assert not AuditEvent.objects.filter(action="user.credentials_revoke").exists()


# --- issue 31.2: every path that deactivates an account revokes what it held ---------------


def _assert_deactivated_for_good(world, token: ApiToken, secret: str, session: Client) -> None:
    """Inactive, the token revoked and the session gone, each recorded once; reactivated,
    nothing of before comes back."""
    alice = User.objects.get(pk=world.researcher_a.pk)
    assert not alice.is_active
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert sessions_of(alice) == 0
    assert runs_with(secret).status_code == 401
    assert session.get(reverse("jobs:run_list")).status_code == 302
    assert AuditEvent.objects.filter(action="user.deactivate").count() == 1
    assert AuditEvent.objects.get(action="user.credentials_revoke").after == {
        "because": "deactivated",
        "tokens": 1,
        "sessions": 1,
    }
    User.objects.filter(pk=alice.pk).update(is_active=True)
    assert runs_with(secret).status_code == 401
    assert session.get(reverse("jobs:run_list")).status_code == 302


def _staff_client() -> Client:
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@gantry.example", PASSWORD))
    return admin


def test_deactivating_in_the_admin_form_goes_through_the_one_service(world, alice_token):
    token, secret = alice_token
    session = signed_in("alice")
    admin = _staff_client()
    url = reverse("admin:auth_user_change", args=[world.researcher_a.pk])
    data = admin_form_data(admin.get(url))

    changed = {k: v for k, v in data.items() if k != "is_active"} | {"first_name": "Alice"}
    assert admin.post(url, changed).status_code == 302

    assert User.objects.get(pk=world.researcher_a.pk).first_name == "Alice"
    _assert_deactivated_for_good(world, token, secret, session)


def test_deactivating_with_the_admin_action_revokes_the_tokens(world, alice_token):
    token, secret = alice_token
    session = signed_in("alice")

    response = _staff_client().post(
        reverse("admin:auth_user_changelist"),
        {"action": "deactivate_selected", "_selected_action": [world.researcher_a.pk]},
    )

    assert response.status_code == 302
    _assert_deactivated_for_good(world, token, secret, session)
    assert User.objects.get(pk=world.researcher_b.pk).is_active


def test_deactivating_with_the_management_command_revokes_the_tokens(world, alice_token):
    token, secret = alice_token
    session = signed_in("alice")
    out = io.StringIO()

    call_command("user_deactivate", "alice", stdout=out)
    call_command("user_deactivate", "alice", stdout=out)  # again: nothing more happens

    assert out.getvalue() == (
        "Deactivated alice; API tokens and sessions revoked.\n"
        "alice was inactive already; nothing changed.\n"
    )
    _assert_deactivated_for_good(world, token, secret, session)
    with pytest.raises(CommandError, match=r"No user is named 'nobody'\."):
        call_command("user_deactivate", "nobody")


def test_a_token_of_an_account_made_inactive_by_any_other_means_is_refused(world, alice_token):
    _, secret = alice_token

    User.objects.filter(pk=world.researcher_a.pk).update(is_active=False)  # a shell, a script

    assert (runs_with(secret).status_code, runs_with(secret).json()) == (
        401,
        {"detail": "Invalid or revoked token."},
    )
