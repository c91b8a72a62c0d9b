"""OpenID Connect single sign-on against a real provider on 127.0.0.1 (tests/oidc_provider.py).

Each login runs the whole authorization code flow over HTTP: Django's test client asks Gantry
to start it, the test follows the redirect to the provider by hand (``requests``), the
provider redirects back with a code, and Gantry exchanges the code, fetches the keys and the
userinfo from the provider, checks the ID token and applies the group-to-role mapping.
"""

import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.urls import reverse

from tenants.models import AuditEvent, ExternalIdentity, GlobalRole, Membership, Tenant
from tenants.oidc_roles import (
    GLOBAL_ROLES,
    TENANT_ROLES,
    GroupRolesError,
    RoleGrant,
    parse_group_roles,
    plan_roles,
)
from tests.conftest import PASSWORD
from tests.oidc_provider import OidcProvider
from tests.portal.test_settings_env import load_settings

CLIENT_ID = "gantry-portal"
CLIENT_SECRET = "oidc-client-secret-3f9a1c7e"  # a value that must never reach a log
GROUP_ROLES = {
    "gantry-admins": "platform_admin",
    "finance-team": "finance",
    "vision-ml": "vision:researcher",
    "vision-leads": ["vision:tenant_admin"],
    "nlp-ml": "nlp:researcher",
}
OLGA = {
    "sub": "a1b2c3-olga",
    "preferred_username": "olga",
    "email": "olga@example.org",
    "given_name": "Olga",
    "family_name": "Kim",
}


@pytest.fixture(scope="module")
def provider():
    with OidcProvider(client_id=CLIENT_ID, client_secret=CLIENT_SECRET) as running:
        yield running


@pytest.fixture
def sso(settings, provider, world):
    """Gantry configured for the test provider, which approves Olga with no groups."""
    settings.GANTRY_OIDC_ISSUER = provider.issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.GANTRY_OIDC_PROVIDER_NAME = "Example SSO"
    settings.GANTRY_OIDC_GROUP_ROLES = parse_group_roles(json.dumps(GROUP_ROLES))
    provider.user = {**OLGA, "groups": []}
    provider.tamper = None
    provider.authorizations.clear()
    provider.token_requests.clear()
    provider.requests.clear()
    return provider


def start_login(client, provider, next_url: str | None = None) -> str:
    """Gantry's redirect to the provider, followed; returns the provider's redirect back."""
    start = client.get(reverse("oidc_authentication_init"), {"next": next_url} if next_url else {})
    assert start.status_code == 302
    assert start["Location"].startswith(f"{provider.issuer}/authorize?")
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text
    return at_provider.headers["Location"]


def finish_login(client, callback_url: str, **replace: str):
    back = urlsplit(callback_url)
    assert (back.scheme, back.netloc, back.path) == ("http", "testserver", "/oidc/callback/")
    query = {name: values[0] for name, values in parse_qs(back.query).items()}
    return client.get(back.path, {**query, **replace})


def sso_login(client, provider, next_url: str | None = None, **replace: str):
    return finish_login(client, start_login(client, provider, next_url), **replace)


def logged_in_username(client) -> str | None:
    response = client.get(reverse("account"))
    if response.status_code != 200:
        return None
    return response.wsgi_request.user.get_username()


def roles_of(username: str) -> tuple[set[str], dict[str, str]]:
    user = User.objects.get(username=username)
    global_roles = set(user.groups.values_list("name", flat=True))
    memberships = dict(Membership.objects.filter(user=user).values_list("tenant__slug", "role"))
    return global_roles, memberships


def audit_trail(since_id: int = 0) -> list[tuple]:
    return list(
        AuditEvent.objects.filter(pk__gt=since_id)
        .order_by("pk")
        .values_list("actor", "action", "target", "before", "after")
    )


def refusal_message(client, response) -> str:
    assert response.status_code == 302
    assert response["Location"] == reverse("login")
    page = client.get(response["Location"]).content.decode()
    start = page.index('<ul class="messages"')
    return page[start : page.index("</ul>", start)]


# --- the flow -----------------------------------------------------------------------------


def test_first_login_creates_the_user_with_the_mapped_roles(client, sso):
    sso.user = {**OLGA, "groups": ["vision-ml", "finance-team", "not-mapped"]}

    response = sso_login(client, sso, next_url="/quotas/")

    assert response.status_code == 302
    assert response["Location"] == "/quotas/"
    assert logged_in_username(client) == "olga"
    olga = User.objects.get(username="olga")
    assert (olga.email, olga.first_name, olga.last_name) == ("olga@example.org", "Olga", "Kim")
    assert not olga.has_usable_password()
    assert list(ExternalIdentity.objects.values_list("user", "issuer", "subject")) == [
        (olga.pk, sso.issuer, "a1b2c3-olga")
    ]
    assert roles_of("olga") == ({"finance"}, {"vision": "researcher"})
    assert audit_trail() == [
        (None, "user.create", "olga", None,
         {"source": "oidc", "issuer": sso.issuer, "subject": "a1b2c3-olga"}),
        (None, "role.grant", "olga", None, {"role": "finance", "source": "oidc"}),
        (None, "membership.set", "olga@vision", None, {"role": "researcher", "source": "oidc"}),
    ]  # fmt: skip


def test_the_flow_uses_pkce_a_nonce_and_the_client_secret_in_basic_auth(client, sso):
    sso_login(client, sso)

    [authorization] = sso.authorizations
    assert authorization["code_challenge_method"] == "S256"
    assert len(authorization["code_challenge"]) == 43  # base64url of a SHA-256
    assert len(authorization["nonce"]) == 32
    assert len(authorization["state"]) == 32
    assert authorization["scope"] == "openid email profile"
    assert authorization["redirect_uri"] == "http://testserver/oidc/callback/"
    [token_request] = sso.token_requests
    assert set(token_request) == {
        "client_id",
        "grant_type",
        "code",
        "redirect_uri",
        "code_verifier",
    }
    assert "client_secret" not in token_request  # sent in the Authorization header only
    # (Discovery is read once an hour per process, so it may not be among them.)
    assert [line for line in sso.requests if "openid-configuration" not in line] == [
        "GET /authorize",
        "POST /token",
        "GET /jwks",
        "GET /userinfo",
    ]
    assert logged_in_username(client) == "olga"


def test_every_login_brings_the_roles_in_line_with_the_groups(client, sso, world):
    climate = Tenant.objects.create(slug="climate", name="Climate")
    sso.user = {**OLGA, "groups": ["vision-ml", "finance-team"]}
    sso_login(client, sso)
    olga = User.objects.get(username="olga")
    Membership.objects.create(user=olga, tenant=climate, role="researcher")  # given locally
    before = AuditEvent.objects.latest("pk").pk

    # The provider now puts Olga in other groups, and renames her.
    sso.user = {**OLGA, "preferred_username": "olga.k", "groups": ["vision-leads", "gantry-admins"]}
    client.logout()
    sso_login(client, sso)

    assert logged_in_username(client) == "olga"  # the subject identifies her, not the name
    assert User.objects.filter(pk=olga.pk).count() == User.objects.filter(username="olga").count()
    assert roles_of("olga") == (
        {"platform_admin"},
        {"vision": "tenant_admin", "climate": "researcher"},  # climate is not SSO's to manage
    )
    assert audit_trail(before) == [
        (None, "role.revoke", "olga", {"role": "finance"}, {"source": "oidc"}),
        (None, "role.grant", "olga", None, {"role": "platform_admin", "source": "oidc"}),
        (None, "membership.set", "olga@vision", {"role": "researcher"},
         {"role": "tenant_admin", "source": "oidc"}),
    ]  # fmt: skip
    before = AuditEvent.objects.latest("pk").pk

    sso.user = {**OLGA, "groups": ["not-mapped"]}
    client.logout()
    sso_login(client, sso)

    assert roles_of("olga") == (set(), {"climate": "researcher"})
    assert audit_trail(before) == [
        (None, "role.revoke", "olga", {"role": "platform_admin"}, {"source": "oidc"}),
        (None, "membership.remove", "olga@vision", {"role": "tenant_admin"}, {"source": "oidc"}),
    ]
    before = AuditEvent.objects.latest("pk").pk

    client.logout()
    sso_login(client, sso)  # nothing changed at the provider: nothing to audit

    assert audit_trail(before) == []


def test_next_must_stay_on_gantry_and_deactivation_ends_the_session(client, sso):
    response = sso_login(client, sso, next_url="https://evil.example/steal")

    assert response["Location"] == reverse("home")
    assert logged_in_username(client) == "olga"
    User.objects.filter(username="olga").update(is_active=False)
    assert logged_in_username(client) is None


def test_two_groups_for_one_tenant_give_the_stronger_role(client, sso):
    sso.user = {**OLGA, "groups": ["vision-leads", "vision-ml", "nlp-ml"]}

    sso_login(client, sso)

    assert roles_of("olga") == (set(), {"vision": "tenant_admin", "nlp": "researcher"})


# --- refusals: nothing is created, nobody is logged in ------------------------------------


def assert_nothing_created(users_before: int, audit_before: int) -> None:
    assert User.objects.count() == users_before
    assert not User.objects.filter(username="olga").exists()
    assert ExternalIdentity.objects.count() == 0
    assert AuditEvent.objects.count() == audit_before
    assert Membership.objects.filter(user__username="olga").count() == 0


def test_a_wrong_state_is_refused(client, sso):
    sso.user = {**OLGA, "groups": ["gantry-admins"]}
    users, audits = User.objects.count(), AuditEvent.objects.count()

    response = sso_login(client, sso, state="a-state-this-session-never-started")

    assert "Sign-in with Example SSO failed" in refusal_message(client, response)
    assert logged_in_username(client) is None
    assert_nothing_created(users, audits)
    assert "POST /token" not in sso.requests  # the code was never exchanged


def test_a_callback_in_another_browser_session_is_refused(client, sso):
    """Login CSRF: a code obtained by an attacker, replayed into a victim's browser."""
    callback = start_login(client, sso)
    users, audits = User.objects.count(), AuditEvent.objects.count()

    victim = client.__class__()
    response = finish_login(victim, callback)

    assert response.status_code == 302
    assert logged_in_username(victim) is None
    assert_nothing_created(users, audits)


@pytest.mark.parametrize("tamper", ["nonce", "signature", "audience"])
def test_a_tampered_id_token_is_refused(client, sso, tamper):
    sso.user = {**OLGA, "groups": ["gantry-admins"]}
    sso.tamper = tamper
    users, audits = User.objects.count(), AuditEvent.objects.count()

    response = sso_login(client, sso)

    assert "Sign-in with Example SSO failed" in refusal_message(client, response)
    assert "POST /token" in sso.requests  # Gantry itself refused the token
    assert logged_in_username(client) is None
    assert_nothing_created(users, audits)


def test_a_code_verifier_that_does_not_match_the_challenge_is_refused(client, sso):
    callback = start_login(client, sso)
    session = client.session
    for state in session["oidc_states"].values():
        state["code_verifier"] = "x" * 64
    session.save()
    users, audits = User.objects.count(), AuditEvent.objects.count()

    response = finish_login(client, callback)

    assert "Sign-in with Example SSO failed" in refusal_message(client, response)
    assert sso.token_requests[-1]["code_verifier"] == "x" * 64
    assert_nothing_created(users, audits)


def test_a_wrong_client_secret_is_refused(client, sso, settings):
    settings.OIDC_RP_CLIENT_SECRET = "not-the-secret"
    users, audits = User.objects.count(), AuditEvent.objects.count()

    response = sso_login(client, sso)

    assert "Sign-in with Example SSO failed" in refusal_message(client, response)
    assert_nothing_created(users, audits)


def test_a_provider_name_taken_by_a_local_account_is_not_linked(client, sso, world):
    sso.user = {**OLGA, "preferred_username": "alice", "groups": ["gantry-admins"]}
    audits = AuditEvent.objects.count()

    response = sso_login(client, sso)

    assert (
        "A Gantry account named alice exists and is not linked to this sign-in."
        in refusal_message(client, response)
    )
    assert logged_in_username(client) is None
    assert ExternalIdentity.objects.count() == 0
    assert roles_of("alice") == (set(), {"vision": "researcher"})
    assert AuditEvent.objects.count() == audits


def test_an_unreachable_provider_sends_back_to_the_password_login(client, sso, settings):
    with OidcProvider(client_id=CLIENT_ID, client_secret=CLIENT_SECRET) as gone:
        settings.GANTRY_OIDC_ISSUER = gone.issuer  # stopped when the block ends

    response = client.get(reverse("oidc_authentication_init"))

    assert (
        "Example SSO cannot be reached right now; try again later or log in with your "
        "password." in refusal_message(client, response)
    )


def test_the_client_secret_and_tokens_never_reach_the_logs(client, sso, settings, caplog):
    caplog.set_level(logging.DEBUG)
    sso_login(client, sso)
    client.logout()
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET + "-wrong"
    sso_login(client, sso)

    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "OpenID Connect login refused" in logged  # the failure is logged...
    assert CLIENT_SECRET not in logged  # ...without the secret, the code or the tokens
    for code in (grant["code"] for grant in sso.token_requests):
        assert code not in logged
    for token in sso.access_tokens:
        assert token not in logged


# --- configuration -------------------------------------------------------------------------


def test_login_page_offers_sso_only_when_configured(client, world, settings, provider):
    settings.GANTRY_OIDC_ISSUER = ""
    page = client.get(reverse("login")).content.decode()
    assert "Sign in with" not in page
    assert client.get(reverse("oidc_authentication_init")).status_code == 404
    assert client.get(reverse("oidc_authentication_callback")).status_code == 404

    settings.GANTRY_OIDC_ISSUER = provider.issuer
    settings.GANTRY_OIDC_PROVIDER_NAME = "Example SSO"
    page = client.get(reverse("login"), {"next": "/quotas/"}).content.decode()
    assert (
        '<a class="button button-primary" href="/oidc/authenticate/?next=/quotas/">'
        "Sign in with Example SSO</a>"
    ) in page


def test_password_login_keeps_working_with_sso_on(client, sso, world):
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD})

    assert response.status_code == 302
    assert logged_in_username(client) == "alice"


def test_a_user_without_password_cannot_log_in_with_one(client, sso):
    sso_login(client, sso)
    client.logout()

    response = client.post(reverse("login"), {"username": "olga", "password": ""})
    assert response.status_code == 200
    assert logged_in_username(client) is None


def test_group_roles_are_parsed_strictly():
    assert parse_group_roles("") == {}
    assert parse_group_roles(json.dumps(GROUP_ROLES))["vision-leads"] == (
        RoleGrant(role="tenant_admin", tenant="vision"),
    )
    bad = {
        "[]": "must be a JSON object",
        "{": "not valid JSON",
        '{"g": "root"}': "unknown role 'root'",
        '{"g": "vision:owner"}': "a tenant role is one of researcher, tenant_admin",
        '{"g": "Vision Lab:researcher"}': "'Vision Lab' is not a tenant slug",
        '{"g": 3}': "group 'g': give a role or a list of roles",
    }
    for raw, message in bad.items():
        with pytest.raises(GroupRolesError, match=message):
            parse_group_roles(raw)


def test_the_pure_role_names_are_the_models_role_names():
    assert tuple(GlobalRole.values) == GLOBAL_ROLES
    assert tuple(Membership.Role.values) == TENANT_ROLES


def test_plan_manages_only_what_the_mapping_names():
    mapping = parse_group_roles(json.dumps(GROUP_ROLES))

    plan = plan_roles(["vision-ml", "vision-leads", "stranger"], mapping)

    assert plan.global_roles == frozenset()
    assert plan.memberships == {"vision": "tenant_admin"}
    assert plan.managed_global_roles == {"platform_admin", "finance"}
    assert plan.managed_tenants == {"vision", "nlp"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GANTRY_OIDC_ISSUER": "https://sso.example.org"},
            "environment variable GANTRY_OIDC_CLIENT_ID is required",
        ),
        (
            {"GANTRY_OIDC_ISSUER": "https://sso.example.org", "GANTRY_OIDC_CLIENT_ID": "g"},
            "environment variable GANTRY_OIDC_CLIENT_SECRET is required",
        ),
        ({"GANTRY_OIDC_ISSUER": "sso.example.org"}, "GANTRY_OIDC_ISSUER must be an https:// URL"),
        ({"GANTRY_OIDC_GROUP_ROLES": '{"g": "root"}'}, "GANTRY_OIDC_GROUP_ROLES: unknown role"),
    ],
)
def test_incomplete_sso_configuration_stops_start_up(tmp_path, env, message):
    result = load_settings(tmp_path, GANTRY_EMBEDDED="1", **env)

    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr
