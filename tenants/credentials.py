"""Credentials that must hold under concurrency and by every path: a token form that makes
one token however often it is sent, and a deactivation that revokes what the account held."""

from uuid import UUID

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from core.types import UserLike, signed_in
from tenants.models import ApiToken
from tenants.services.audit import audit_record
from tenants.services.tokens import (
    API_TOKEN_DEFAULT_DAYS,
    CredentialsRevokedBecause,
    api_token_issue,
    user_credentials_revoke,
)


def api_token_issue_once(
    *,
    user: UserLike,
    name: str,
    submission_key: UUID,
    expires_in_days: int = API_TOKEN_DEFAULT_DAYS,
) -> tuple[ApiToken, str | None]:
    """``api_token_issue`` for the account page's form, once per form: ``submission_key`` is
    the form's one-time key. The first submission gets the token and its secret; every other
    one, concurrent or later, gets that same token and None (its secret was shown once, to
    the first). The database decides which is first: the token row holds the key under a
    unique constraint, so of concurrent inserts one commits and the others wait and fail."""
    try:
        with transaction.atomic():
            return api_token_issue(
                user=user, name=name, expires_in_days=expires_in_days, submission_key=submission_key
            )
    except IntegrityError:
        made = ApiToken.objects.filter(user=signed_in(user), submission_key=submission_key).first()
        if made is None:
            raise
        return made, None


@transaction.atomic
def user_deactivate(*, user: User, actor: UserLike | None) -> bool:
    """Deactivate an account, by whatever path asks (Django admin's form and its action,
    ``manage.py user_deactivate``): it can no longer log in, its API tokens are revoked and
    its sessions end, for good (reactivating it brings none back). Audited as
    "user.deactivate". False when it was inactive already (nothing happens)."""
    if not User.objects.filter(pk=user.pk, is_active=True).update(is_active=False):
        return False
    user.is_active = False
    audit_record(
        actor=actor,
        action="user.deactivate",
        target=f"user {user.get_username()}",
        before={"is_active": True},
        after={"is_active": False},
    )
    user_credentials_revoke(user=user, actor=actor, because=CredentialsRevokedBecause.DEACTIVATED)
    return True
