"""Who belongs to which tenant, with which role, and the platform-wide roles."""

from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from core.types import UserLike, signed_in
from tenants.access import is_platform_admin, membership_can_manage
from tenants.models import GlobalRole, Membership, Tenant
from tenants.services.audit import audit_record


@transaction.atomic
def membership_set(*, user: UserLike, tenant: Tenant, role: str, actor: UserLike) -> Membership:
    membership, created = Membership.objects.select_for_update().get_or_create(
        user=signed_in(user), tenant=tenant, defaults={"role": role}
    )
    before = None if created else {"role": membership.role}
    if not created and membership.role != role:
        membership.role = role
        membership.save(update_fields=["role"])
    audit_record(
        actor=actor,
        action="membership.set",
        target=f"{user.get_username()}@{tenant.slug}",
        tenant=tenant,
        before=before,
        after={"role": role},
    )
    return membership


def require_member_manager(*, actor: UserLike, tenant: Tenant) -> None:
    if not membership_can_manage(user=actor, tenant=tenant):
        raise PermissionDenied(
            f"Only tenant admins of {tenant.slug} and platform admins manage its members."
        )


def check_role(role: str) -> None:
    if role not in Membership.Role.values:
        labels = " or ".join(str(label).lower() for label in Membership.Role.labels)
        raise ValidationError({"role": [f"Choose a role: {labels}."]})


def _membership_target(membership: Membership) -> str:
    return f"{membership.user.get_username()}@{membership.tenant.slug}"


# The longest identifier worth looking up: usernames have 150 characters, e-mail addresses 254.
MEMBER_IDENTIFIER_MAX_LENGTH = 254
UNKNOWN_MEMBER = "No user has this username or e-mail address."


def _user_by_username_or_email(identifier: str) -> User:
    """The active user whose username is exactly ``identifier``, else the one whose e-mail
    address it is (case-insensitively, as mail servers treat them in practice).

    Inactive and missing users get the same ValidationError: a tenant admin learns that a
    person can be added, nothing else about the accounts of the platform.
    """
    if len(identifier) > MEMBER_IDENTIFIER_MAX_LENGTH or "\x00" in identifier:
        raise ValidationError({"user": [UNKNOWN_MEMBER]})
    active = User.objects.filter(is_active=True)
    by_username = active.filter(username=identifier).first()
    if by_username is not None:
        return by_username
    by_email = list(active.filter(email__iexact=identifier)[:2]) if "@" in identifier else []
    if len(by_email) > 1:
        raise ValidationError(
            {"user": ["More than one user has this e-mail address: enter the username instead."]}
        )
    if not by_email:
        raise ValidationError({"user": [UNKNOWN_MEMBER]})
    return by_email[0]


@transaction.atomic
def membership_add(*, tenant: Tenant, identifier: str, role: str, actor: UserLike) -> Membership:
    """Make an existing, active user a member of ``tenant`` with ``role``, without asking
    them; audited as "membership.add". Platform admins only: they manage every account, while
    tenant admins invite people (tenants/invitations.py), who join by accepting.

    ``identifier`` is the user's exact username or e-mail address. Raises PermissionDenied
    unless the actor is a platform admin, ValidationError for an unknown user (alike for an
    inactive one), a user who is a member already or an unknown role; nothing is written
    then.
    """
    if not is_platform_admin(actor):
        raise PermissionDenied(
            f"Only platform admins add people to {tenant.slug} directly; tenant admins invite them."
        )
    check_role(role)
    identifier = identifier.strip()
    if not identifier:
        raise ValidationError({"user": ["Enter a username or an e-mail address."]})
    user = _user_by_username_or_email(identifier)
    already = ValidationError(
        {"user": [f"{user.get_username()} is already a member of {tenant.slug}."]}
    )
    if Membership.objects.filter(user=user, tenant=tenant).exists():
        raise already
    try:
        with transaction.atomic():
            membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    except IntegrityError:  # added concurrently since the check above
        raise already from None
    audit_record(
        actor=actor,
        action="membership.add",
        target=_membership_target(membership),
        tenant=tenant,
        before=None,
        after={"role": role},
    )
    return membership


def _lock_for_change(membership: Membership) -> tuple[Membership, list[Membership]]:
    """The membership as stored now, and the tenant's tenant admins, all locked: the admins
    first and in id order, so two changes that could leave the tenant without an admin
    wait for each other instead of both passing the check. DoesNotExist when the membership
    was removed meanwhile."""
    admins = list(
        Membership.objects.select_for_update()
        .filter(tenant_id=membership.tenant_id, role=Membership.Role.TENANT_ADMIN)
        .order_by("pk")
    )
    current = (
        Membership.objects.select_for_update(of=("self",))
        .select_related("user", "tenant")
        .get(pk=membership.pk)
    )
    return current, admins


def _refuse_losing_the_last_admin(
    membership: Membership, admins: list[Membership], *, doing: str
) -> None:
    if membership.role == Membership.Role.TENANT_ADMIN and all(
        admin.pk == membership.pk for admin in admins
    ):
        raise ValidationError(
            f"{membership.user.get_username()} is the last tenant admin of "
            f"{membership.tenant.slug} and cannot be {doing}: make another member tenant admin "
            "first."
        )


@transaction.atomic
def membership_role_change(*, membership: Membership, role: str, actor: UserLike) -> Membership:
    """Give a member another role; audited as "membership.role_change" with the old and the
    new role (nothing is written when the role stays).

    The tenant's last tenant admin cannot be demoted. Raises PermissionDenied unless the
    actor administers the tenant or the platform, ValidationError for an unknown role or the
    last admin, DoesNotExist when the membership is gone; nothing is written then.
    """
    require_member_manager(actor=actor, tenant=membership.tenant)
    check_role(role)
    membership, admins = _lock_for_change(membership)
    before = membership.role
    if before == role:
        return membership
    _refuse_losing_the_last_admin(membership, admins, doing="demoted")
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        actor=actor,
        action="membership.role_change",
        target=_membership_target(membership),
        tenant=membership.tenant,
        before={"role": before},
        after={"role": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership, actor: UserLike) -> None:
    """Remove a member from the tenant; audited as "membership.remove" with the role they had.

    Only the membership goes: the person's experiments and runs stay the tenant's (runs still
    queued are admitted and run as submitted; tenant admins can cancel them), but they can
    no longer see the tenant's runs nor submit to it. The tenant's last tenant admin cannot
    be removed. Raises PermissionDenied unless the actor administers the tenant or the
    platform, ValidationError for the last admin, DoesNotExist when the membership is gone
    already; nothing is written then.
    """
    require_member_manager(actor=actor, tenant=membership.tenant)
    membership, admins = _lock_for_change(membership)
    _refuse_losing_the_last_admin(membership, admins, doing="removed")
    membership.delete()
    audit_record(
        actor=actor,
        action="membership.remove",
        target=_membership_target(membership),
        tenant=membership.tenant,
        before={"role": membership.role},
        after=None,
    )


@transaction.atomic
def global_role_grant(*, user: UserLike, role: GlobalRole, actor: UserLike) -> None:
    group, _ = Group.objects.get_or_create(name=role.value)
    signed_in(user).groups.add(group)
    audit_record(
        actor=actor, action="role.grant", target=user.get_username(), after={"role": role.value}
    )
