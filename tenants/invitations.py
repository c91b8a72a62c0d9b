"""Invitations: how tenant admins add people, with the person's consent.

A tenant admin names a username or an e-mail address and gets one answer whatever the
platform holds: no account, an inactive one, or an address two accounts share are
indistinguishable, and no answer maps an address to a username. The person sees the
invitation once signed in (tenants/invitation_views.py) and becomes a member only by
accepting it. Platform admins, who manage every account anyway, add people directly.
"""

from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q

from core.types import UserLike, signed_in
from tenants.access import is_platform_admin
from tenants.models import Invitation, Membership, Notification, Tenant
from tenants.selectors import invitation_list_for_user
from tenants.services.audit import audit_record
from tenants.services.memberships import (
    MEMBER_IDENTIFIER_MAX_LENGTH,
    check_role,
    membership_add,
    require_member_manager,
)
from tenants.services.notifications import notification_create

INVITATION_DAYS = 14


def invitation_sent_message(invitation: Invitation) -> str:
    """The one answer to every invitation, whoever the identifier names or does not."""
    return (
        f"Invited {invitation.identifier} to {invitation.tenant.slug} as "
        f"{invitation.get_role_display().lower()}. If that is the username or e-mail address "
        "of an active account, its owner sees the invitation when signed in and joins once "
        f"they accept it; it expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC."
    )


def _identifier_clean(identifier: str) -> str:
    identifier = identifier.strip()
    if not identifier:
        raise ValidationError({"user": ["Enter a username or an e-mail address."]})
    if len(identifier) > MEMBER_IDENTIFIER_MAX_LENGTH:
        raise ValidationError(
            {
                "user": [
                    f"A username or an e-mail address has at most {MEMBER_IDENTIFIER_MAX_LENGTH} "
                    f"characters; this has {len(identifier)}."
                ]
            }
        )
    if any(ord(char) < 32 or ord(char) == 127 for char in identifier):
        raise ValidationError(
            {"user": ["A username or an e-mail address has no control characters."]}
        )
    return identifier


def _invitees(identifier: str) -> list[User]:
    """The active accounts an identifier names: its username, or (an address) its e-mail."""
    names = Q(username=identifier)
    if "@" in identifier:
        names |= Q(email__iexact=identifier)
    return list(User.objects.filter(names, is_active=True).order_by("pk"))


@transaction.atomic
def membership_invite(
    *, tenant: Tenant, identifier: str, role: str, actor: UserLike, now: datetime
) -> Invitation:
    """Invite whoever owns ``identifier`` (a username, or an e-mail address) to ``tenant``
    as ``role``; audited as "invitation.send".

    Inviting the same identifier again renews the pending invitation (its role, its expiry)
    instead of making a second. Matching accounts get a notification; the answer is the same
    whether there are none, one or several. Raises PermissionDenied unless the actor
    administers the tenant or the platform, ValidationError for an empty or over-long
    identifier, an unknown role, or the username of a member already (listed on the members
    page the actor sees); nothing is written then.
    """
    require_member_manager(actor=actor, tenant=tenant)
    check_role(role)
    identifier = _identifier_clean(identifier)
    if Membership.objects.filter(tenant=tenant, user__username=identifier).exists():
        raise ValidationError({"user": [f"{identifier} is already a member of {tenant.slug}."]})
    expires_at = now + timedelta(days=INVITATION_DAYS)
    pending = Invitation.objects.select_for_update().filter(
        tenant=tenant, identifier=identifier, state=Invitation.State.PENDING
    )
    invitation = pending.first()
    if invitation is None:
        try:
            with transaction.atomic():
                invitation = Invitation.objects.create(
                    tenant=tenant,
                    identifier=identifier,
                    role=role,
                    invited_by=signed_in(actor),
                    created_at=now,
                    expires_at=expires_at,
                )
        except IntegrityError:  # invited concurrently since the look-up above
            invitation = pending.get()
        else:
            _notify_invitees(invitation, actor=actor, now=now)
    if (invitation.role, invitation.expires_at) != (role, expires_at):  # renewed
        invitation.role, invitation.expires_at = role, expires_at
        invitation.invited_by = signed_in(actor)
        invitation.save(update_fields=["role", "expires_at", "invited_by"])
    audit_record(
        actor=actor,
        action="invitation.send",
        target=f"{identifier} to {tenant.slug}",
        tenant=tenant,
        after={"role": role},
    )
    return invitation


def _notify_invitees(invitation: Invitation, *, actor: UserLike, now: datetime) -> None:
    tenant = invitation.tenant
    for user in _invitees(invitation.identifier):
        if Membership.objects.filter(user=user, tenant=tenant).exists():
            continue
        notification_create(
            user=user,
            tenant=tenant,
            kind=Notification.Kind.INVITATION,
            message=(
                f"{actor.get_username()} invited you to join {tenant.name} ({tenant.slug}) as "
                f"{invitation.get_role_display().lower()}. Accept or decline it on your "
                "Invitations page."
            ),
            now=now,
        )


def member_add_or_invite(
    *, tenant: Tenant, identifier: str, role: str, actor: UserLike, now: datetime
) -> Membership | Invitation:
    """What "add a member" does: platform admins add the account directly
    (``membership_add``), tenant admins invite whoever owns the identifier."""
    if is_platform_admin(actor):
        return membership_add(tenant=tenant, identifier=identifier, role=role, actor=actor)
    return membership_invite(tenant=tenant, identifier=identifier, role=role, actor=actor, now=now)


def _invitation_locked(*, invitation_id: int, user: UserLike, now: datetime) -> Invitation:
    """The user's own pending invitation, locked; DoesNotExist alike for one that is missing,
    someone else's, expired, or decided already."""
    return (
        invitation_list_for_user(user=user, now=now)
        .select_for_update(of=("self",))
        .get(pk=invitation_id)
    )


def _decide(invitation: Invitation, *, state: str, user: UserLike, now: datetime) -> None:
    invitation.state, invitation.decided_by, invitation.decided_at = state, signed_in(user), now
    invitation.save(update_fields=["state", "decided_by", "decided_at"])


@transaction.atomic
def invitation_accept(*, invitation_id: int, user: UserLike, now: datetime) -> Membership:
    """Join the tenant of the user's pending invitation with the invitation's role; audited
    as "invitation.accept". DoesNotExist when it is not the user's to accept (missing,
    someone else's, expired, or decided already); nothing is written then."""
    invitation = _invitation_locked(invitation_id=invitation_id, user=user, now=now)
    membership, _ = Membership.objects.get_or_create(
        user=signed_in(user), tenant=invitation.tenant, defaults={"role": invitation.role}
    )
    _decide(invitation, state=Invitation.State.ACCEPTED, user=user, now=now)
    audit_record(
        actor=user,
        action="invitation.accept",
        target=f"{user.get_username()}@{invitation.tenant.slug}",
        tenant=invitation.tenant,
        after={"role": membership.role},
    )
    return membership


@transaction.atomic
def invitation_decline(*, invitation_id: int, user: UserLike, now: datetime) -> Invitation:
    """Turn the user's pending invitation down; audited as "invitation.decline".
    DoesNotExist as for ``invitation_accept``."""
    invitation = _invitation_locked(invitation_id=invitation_id, user=user, now=now)
    _decide(invitation, state=Invitation.State.DECLINED, user=user, now=now)
    audit_record(
        actor=user,
        action="invitation.decline",
        target=f"{user.get_username()}@{invitation.tenant.slug}",
        tenant=invitation.tenant,
    )
    return invitation


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, actor: UserLike, now: datetime) -> None:
    """Withdraw a pending invitation; audited as "invitation.revoke". Raises PermissionDenied
    unless the actor administers its tenant or the platform, DoesNotExist when it is no
    longer pending; nothing is written then."""
    require_member_manager(actor=actor, tenant=invitation.tenant)
    current = Invitation.objects.select_for_update().get(
        pk=invitation.pk, state=Invitation.State.PENDING
    )
    _decide(current, state=Invitation.State.REVOKED, user=actor, now=now)
    audit_record(
        actor=actor,
        action="invitation.revoke",
        target=f"{current.identifier} to {current.tenant.slug}",
        tenant=current.tenant,
        before={"role": current.role},
    )
