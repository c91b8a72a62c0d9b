"""API tokens: issued, created and revoked one at a time, and every credential of a
person revoked at once (tokens and sessions)."""

from datetime import datetime, timedelta
from uuid import UUID

from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from core.types import UserLike, signed_in
from tenants.models import ApiToken, is_whole_number, max_length_of
from tenants.services.audit import audit_record

API_TOKEN_DEFAULT_DAYS = 90
API_TOKEN_MAX_DAYS = 365


def api_token_issue(
    *,
    user: UserLike,
    name: str,
    expires_in_days: int = API_TOKEN_DEFAULT_DAYS,
    submission_key: UUID | None = None,
) -> tuple[ApiToken, str]:
    """A token a person asks for, on the account page or with ``POST /api/v1/tokens/``:
    one set of rules for both. ``name`` is 1 to 100 characters (trimmed), the token expires
    ``expires_in_days`` (1 to ``API_TOKEN_MAX_DAYS``) from now. Returns the row and the
    secret (see ``api_token_create``); raises ValidationError naming every bad field, and
    nothing is written then."""
    errors: dict[str, list[str]] = {}
    limit = max_length_of(ApiToken, "name")
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        errors["name"] = ["A name is required."]
    elif len(name) > limit or "\x00" in name:
        errors["name"] = [f"At most {limit} characters, no NUL characters."]
    if not is_whole_number(expires_in_days) or not 1 <= expires_in_days <= API_TOKEN_MAX_DAYS:
        errors["expires_in_days"] = [f"Between 1 and {API_TOKEN_MAX_DAYS} days."]
    if errors:
        raise ValidationError(errors)
    return api_token_create(
        user=user,
        name=name,
        expires_at=timezone.now() + timedelta(days=expires_in_days),
        submission_key=submission_key,
    )


def api_token_create(
    *,
    user: UserLike,
    name: str = "api",
    expires_at: datetime | None = None,
    submission_key: UUID | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the secret, which is never stored or shown again.

    Audited as "token.create" by its owner (who proved it with a password or a session):
    name, prefix and expiry only, never the secret or its hash.
    """
    secret = ApiToken.new_secret()
    owner = signed_in(user)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=owner,
            name=name,
            prefix=secret[4 : 4 + ApiToken.PREFIX_LENGTH],
            key_hash=ApiToken.hash_secret(secret),
            expires_at=expires_at,
            credential_stamp=ApiToken.stamp_for(owner),
            submission_key=submission_key,
        )
        audit_record(
            actor=user,
            action="token.create",
            target=_token_target(token),
            after={
                "name": token.name,
                "prefix": token.prefix,
                "expires_at": None if expires_at is None else expires_at.isoformat(),
            },
        )
    return token, secret


def _token_target(token: ApiToken) -> str:
    return f"token {token.prefix}… of {token.user.get_username()}"


@transaction.atomic
def api_token_revoke(*, token: ApiToken) -> None:
    """Revoke a token (again: nothing happens); audited as "token.revoke" by its owner, the
    only one who can revoke it (with the token itself, or on their account page)."""
    now = timezone.now()
    if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
        audit_record(
            actor=token.user,
            action="token.revoke",
            target=_token_target(token),
            before={"revoked_at": None},
            after={"revoked_at": now.isoformat()},
        )


class CredentialsRevokedBecause(models.TextChoices):
    PASSWORD_CHANGED = "password_changed", "the password changed"
    DEACTIVATED = "deactivated", "the account was deactivated"


@transaction.atomic
def user_credentials_revoke(
    *,
    user: User,
    actor: UserLike | None,
    because: CredentialsRevokedBecause,
    keep_session_key: str | None = None,
) -> tuple[int, int]:
    """Revoke every API token of ``user`` and end their sessions (all but
    ``keep_session_key``: the session that changed its own password stays). Returns
    (tokens revoked, sessions ended); audited as "user.credentials_revoke" when either is
    not zero.

    A changed password alone already stops the user's tokens (``ApiToken.credential_stamp``)
    and sessions (Django's session hash of the password), whatever changed it; this makes it
    visible, and is what makes a deactivation final: a reactivated account finds no token or
    session of before."""
    now = timezone.now()
    tokens = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(revoked_at=now)
    # Sessions are signed blobs keyed by a random key; only decoding tells whose each is.
    # Only unexpired ones count, and this runs on a password change or a deactivation.
    user_id = str(user.pk)
    ended = [
        session.session_key
        for session in Session.objects.filter(expire_date__gt=now).iterator()
        if session.session_key != keep_session_key
        and session.get_decoded().get(SESSION_KEY) == user_id
    ]
    Session.objects.filter(session_key__among=list(ended)).delete()
    if tokens or ended:
        audit_record(
            actor=actor,
            action="user.credentials_revoke",
            target=f"user {user.get_username()}",
            after={"because": because.value, "tokens": tokens, "sessions": len(ended)},
        )
    return tokens, len(ended)
