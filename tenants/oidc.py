"""Single sign-on with OpenID Connect: the authorization code flow with PKCE and a nonce.

Built on mozilla-django-oidc (state, nonce and PKCE verifier kept in the session, code
exchange, signature check against the provider's JWKS), with what Gantry adds:
- the provider's endpoints come from its discovery document (``GANTRY_OIDC_ISSUER``), whose
  ``issuer`` must be the configured one;
- the ID token must name that issuer and this client as its audience, and carry ``sub``,
  ``exp`` and ``iat``; the userinfo answer must be about the same ``sub``;
- a person is their ``(issuer, sub)`` (``ExternalIdentity``): e-mail and user name are only
  copied, so nobody takes over an account by choosing an address or a name at the provider;
- the user's groups are turned into Gantry roles at every login (``tenants/oidc_roles.py``),
  every change audited.
Off unless ``GANTRY_OIDC_ISSUER`` is set; password logins keep working either way.
"""

import logging
import threading
import time
from dataclasses import dataclass

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import Group, User
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import transaction
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from tenants.models import ExternalIdentity, Membership, Tenant, max_length_of
from tenants.oidc_roles import plan_roles
from tenants.services.audit import audit_record

logger = logging.getLogger("gantry.oidc")

DISCOVERY_PATH = "/.well-known/openid-configuration"
DISCOVERY_TTL_S = 3600
CLOCK_SKEW_S = 60
SOURCE = "oidc"


def oidc_enabled() -> bool:
    return bool(settings.GANTRY_OIDC_ISSUER)


class ProviderError(Exception):
    """The provider could not be reached or described itself wrongly."""


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None
    token_auth_basic: bool


_metadata_cache: dict[str, tuple[float, ProviderMetadata]] = {}
_metadata_lock = threading.Lock()


def provider_metadata(issuer: str) -> ProviderMetadata:
    """The provider's discovery document, fetched once an hour per process."""
    with _metadata_lock:
        cached = _metadata_cache.get(issuer)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
    try:
        response = requests.get(issuer.rstrip("/") + DISCOVERY_PATH, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ProviderError(f"discovery at {issuer} failed: {error}") from None
    if not isinstance(document, dict) or document.get("issuer") != issuer:
        raise ProviderError(f"discovery at {issuer} names another issuer")
    try:
        methods = document.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
        metadata = ProviderMetadata(
            issuer=issuer,
            authorization_endpoint=document["authorization_endpoint"],
            token_endpoint=document["token_endpoint"],
            jwks_uri=document["jwks_uri"],
            userinfo_endpoint=document.get("userinfo_endpoint"),
            token_auth_basic="client_secret_basic" in methods,
        )
    except KeyError as missing:
        raise ProviderError(f"discovery at {issuer} lacks {missing}") from None
    with _metadata_lock:
        _metadata_cache[issuer] = (time.monotonic() + DISCOVERY_TTL_S, metadata)
    return metadata


class OidcBackend(OIDCAuthenticationBackend):
    """Authenticates the callback of the code flow; see the module docstring."""

    def __init__(self, *args, **kwargs):
        # The parent reads every endpoint from settings here; ours come from discovery, and
        # only when a callback is being authenticated.
        self.UserModel = User
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self._use_basic_auth = True

    def get_settings(self, attr, *args):
        if attr == "OIDC_TOKEN_USE_BASIC_AUTH":
            return self._use_basic_auth
        return import_from_settings(attr, *args)

    def authenticate(self, request, **kwargs):
        if not oidc_enabled() or request is None or "code" not in request.GET:
            return None
        try:
            metadata = provider_metadata(settings.GANTRY_OIDC_ISSUER)
            self.OIDC_OP_TOKEN_ENDPOINT = metadata.token_endpoint
            self.OIDC_OP_JWKS_ENDPOINT = metadata.jwks_uri
            self.OIDC_OP_USER_ENDPOINT = metadata.userinfo_endpoint
            self._use_basic_auth = metadata.token_auth_basic
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, ProviderError, requests.RequestException) as error:
            # The message names what failed, never a token, a code or the client secret.
            logger.warning("OpenID Connect login refused: %s", error)
            return None

    def _verify_jws(self, payload, key):
        try:
            return jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=settings.GANTRY_OIDC_ISSUER,
                leeway=CLOCK_SKEW_S,
                options={"require": ["iss", "aud", "sub", "exp", "iat"]},
            )
        except jwt.InvalidTokenError as error:
            raise SuspiciousOperation(f"ID token rejected: {error}") from None

    def retrieve_matching_jwk(self, token):
        try:
            return super().retrieve_matching_jwk(token)
        except (jwt.PyJWTError, KeyError) as error:
            raise SuspiciousOperation(f"no usable signing key: {error}") from None

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims, completed by the userinfo endpoint when there is one."""
        if not self.OIDC_OP_USER_ENDPOINT:
            return dict(payload)
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload["sub"]:
            raise SuspiciousOperation("userinfo is about another subject")
        return {**payload, **userinfo}

    def verify_claims(self, claims):
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        if not self.verify_claims(claims):
            raise SuspiciousOperation("the provider sent no subject")
        try:
            return oidc_user_login(issuer=settings.GANTRY_OIDC_ISSUER, claims=claims)
        except OidcLoginRefused as refusal:
            self.request.oidc_refusal = str(refusal)  # shown by OidcCallbackView
            raise

    def get_user(self, user_id):
        # Each request of a session signed in here: a deactivated user is logged out at once.
        user = User.objects.filter(pk=user_id).first()
        return user if user is not None and self.user_can_authenticate(user) else None


class OidcLoginRefused(SuspiciousOperation):
    """A valid login that Gantry cannot accept; the message is shown to the person."""


def _username(claims: dict) -> str:
    username = claims.get(settings.GANTRY_OIDC_USERNAME_CLAIM) or claims.get("email")
    if not isinstance(username, str) or not username:
        raise OidcLoginRefused(
            f"The provider sent no {settings.GANTRY_OIDC_USERNAME_CLAIM} to name the account."
        )
    try:
        UnicodeUsernameValidator()(username)
    except ValidationError:
        raise OidcLoginRefused(f"{username!r} cannot be a Gantry user name.") from None
    if len(username) > max_length_of(User, "username"):
        raise OidcLoginRefused(f"{username!r} is too long for a Gantry user name.")
    return username


def _groups(claims: dict) -> list[str]:
    groups = claims.get(settings.GANTRY_OIDC_GROUPS_CLAIM, [])
    if isinstance(groups, str):
        return [groups]
    if not isinstance(groups, list):
        return []
    return [group for group in groups if isinstance(group, str)]


@transaction.atomic
def oidc_user_login(*, issuer: str, claims: dict) -> User:
    """The user ``claims`` identify (created on first login), their roles brought in line."""
    identity = (
        ExternalIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=claims["sub"])
        .first()
    )
    if identity is None:
        username = _username(claims)
        if User.objects.filter(username=username).exists():
            raise OidcLoginRefused(
                f"A Gantry account named {username} exists and is not linked to this sign-in. "
                "A platform admin can link it."
            )
        user = User(username=username)
        user.set_unusable_password()
        user.save()
        identity = ExternalIdentity.objects.create(user=user, issuer=issuer, subject=claims["sub"])
        audit_record(
            actor=None,
            action="user.create",
            target=username,
            after={"source": SOURCE, "issuer": issuer, "subject": claims["sub"]},
        )
    user = identity.user
    profile = {
        "email": claims.get("email") if isinstance(claims.get("email"), str) else "",
        "first_name": str(claims.get("given_name") or "")[:150],
        "last_name": str(claims.get("family_name") or "")[:150],
    }
    changed = [name for name, value in profile.items() if value and getattr(user, name) != value]
    for name in changed:
        setattr(user, name, profile[name])
    if changed:
        user.save(update_fields=changed)
    identity.last_login_at = timezone.now()
    identity.save(update_fields=["last_login_at"])
    oidc_roles_apply(user=user, groups=_groups(claims))
    return user


def oidc_roles_apply(*, user: User, groups: list[str]) -> None:
    """Grant and revoke the roles ``GANTRY_OIDC_GROUP_ROLES`` manages; each change audited."""
    plan = plan_roles(groups, settings.GANTRY_OIDC_GROUP_ROLES)
    held = set(
        user.groups.filter(name__in=plan.managed_global_roles).values_list("name", flat=True)
    )
    for role in sorted(plan.managed_global_roles):
        wanted = role in plan.global_roles
        if wanted == (role in held):
            continue
        group, _ = Group.objects.get_or_create(name=role)  # global roles are groups
        if wanted:
            user.groups.add(group)
        else:
            user.groups.remove(group)
        audit_record(
            actor=None,
            action="role.grant" if wanted else "role.revoke",
            target=user.get_username(),
            before=None if wanted else {"role": role},
            after={"role": role, "source": SOURCE} if wanted else {"source": SOURCE},
        )
    tenants = Tenant.objects.in_bulk(plan.managed_tenants, field_name="slug")
    for slug in sorted(plan.managed_tenants - set(tenants)):
        logger.warning("GANTRY_OIDC_GROUP_ROLES names tenant %s, which does not exist", slug)
    memberships = {
        m.tenant_id: m
        for m in Membership.objects.select_for_update().filter(
            user=user, tenant__in=tenants.values()
        )
    }
    for slug, tenant in sorted(tenants.items()):
        membership = memberships.get(tenant.pk)
        tenant_role = plan.memberships.get(slug)
        before = None if membership is None else {"role": membership.role}
        if tenant_role is None and membership is not None:
            membership.delete()
            action, after = "membership.remove", {"source": SOURCE}
        elif tenant_role is not None and membership is None:
            Membership.objects.create(user=user, tenant=tenant, role=tenant_role)
            action, after = "membership.set", {"role": tenant_role, "source": SOURCE}
        elif tenant_role is not None and membership is not None and membership.role != tenant_role:
            membership.role = tenant_role
            membership.save(update_fields=["role"])
            action, after = "membership.set", {"role": tenant_role, "source": SOURCE}
        else:
            continue
        audit_record(
            actor=None,
            action=action,
            target=f"{user.get_username()}@{slug}",
            tenant=tenant,
            before=before,
            after=after,
        )
    # tenants.access caches roles on the user object for the request.
    for cached in ("_gantry_global_roles", "_gantry_tenant_roles"):
        user.__dict__.pop(cached, None)


class OidcLoginView(OIDCAuthenticationRequestView):
    """``/oidc/authenticate/``: sends the browser to the provider (404 when SSO is off)."""

    def __init__(self, *args, **kwargs):
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        if not oidc_enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            metadata = provider_metadata(settings.GANTRY_OIDC_ISSUER)
        except ProviderError as error:
            logger.warning("OpenID Connect login not started: %s", error)
            messages.error(
                request,
                f"{settings.GANTRY_OIDC_PROVIDER_NAME} cannot be reached right now; "
                "try again later or log in with your password.",
            )
            return HttpResponseRedirect(resolve_url("login"))
        self.OIDC_OP_AUTH_ENDPOINT = metadata.authorization_endpoint
        return super().get(request)


class OidcCallbackView(OIDCAuthenticationCallbackView):
    """``/oidc/callback/``: the provider sends the browser back here with a code."""

    def get(self, request):
        if not oidc_enabled():
            raise Http404("Single sign-on is not configured.")
        try:
            return super().get(request)
        except SuspiciousOperation as error:  # a state this session did not start
            logger.warning("OpenID Connect callback refused: %s", error)
            return self.login_failure()

    @property
    def failure_url(self):
        return resolve_url("login")

    def login_failure(self):
        refusal = getattr(self.request, "oidc_refusal", None)
        messages.error(
            self.request,
            refusal or f"Sign-in with {settings.GANTRY_OIDC_PROVIDER_NAME} failed. Try again.",
        )
        return super().login_failure()
