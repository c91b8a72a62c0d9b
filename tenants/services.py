import json
from collections.abc import Collection
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.core.validators import RegexValidator
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from core.types import UserLike, signed_in
from tenants.access import idle_policy_can_edit, is_platform_admin, membership_can_manage
from tenants.models import (
    IDLE_POLICY_MAX_MIN,
    ApiToken,
    AuditEvent,
    GlobalRole,
    GpuFlavor,
    Membership,
    Notification,
    Quota,
    Tenant,
    max_length_of,
)


def audit_record(
    *,
    actor: UserLike | None,
    action: str,
    target: str,
    tenant: Tenant | None = None,
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEvent:
    return AuditEvent.objects.create(
        actor=actor if actor is not None and actor.is_authenticated else None,
        tenant=tenant,
        action=action,
        target=target,
        before=before,
        after=after,
    )


def audit_snapshot(
    instance: models.Model,
    *,
    only: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> dict:
    """What the audit log records of a model instance, as JSON: every concrete field (a
    foreign key as its id) and many-to-many field (the related objects' names, sorted), or
    the fields ``only`` names. A decimal is its exact string at the field's places (JSON
    has no decimals). ``exclude`` names fields that must never be recorded, such as
    password hashes."""
    values = {}
    fields = (*instance._meta.concrete_fields, *instance._meta.many_to_many)
    if only is not None:
        by_name = {field.name: field for field in fields}
        fields = tuple(by_name[name] for name in only)
    for field in fields:
        if field.name in exclude:
            continue
        if field.many_to_many:
            values[field.name] = sorted(
                str(related) for related in getattr(instance, field.name).all()
            )
            continue
        value = field.value_from_object(instance)
        if isinstance(field, models.DecimalField) and value is not None:
            value = str(Decimal(value).quantize(Decimal(1).scaleb(-field.decimal_places)))
        values[field.attname] = value
    return json.loads(json.dumps(values, cls=DjangoJSONEncoder))


def audit_model_change(
    *, actor: UserLike, instance: models.Model, verb: str, before: dict | None, after: dict | None
) -> AuditEvent | None:
    """Record a change made with a generic editor (Django admin) as "<model>.<verb>"
    ("membership.update", "cluster.delete"), with ``audit_snapshot``s before and after;
    None when an update changed nothing.

    The event is filed under the instance's tenant (a tenant's own changes under itself),
    except when that tenant is the thing being deleted: the log outlives it.
    """
    if verb == "update" and before == after:
        return None
    tenant = instance if isinstance(instance, Tenant) else getattr(instance, "tenant", None)
    if not isinstance(tenant, Tenant) or (verb == "delete" and tenant is instance):
        tenant = None
    target = f"{instance._meta.model_name} {instance}"
    return audit_record(
        actor=actor,
        action=f"{instance._meta.model_name}.{verb}",
        target=target[: max_length_of(AuditEvent, "target")],
        tenant=tenant,
        before=before,
        after=after,
    )


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


# Upper bound of the integer columns quotas and flavors are stored in (PostgreSQL integer).
MAX_STORED_INT = 2**31 - 1
QUOTA_FIELDS = (
    "guaranteed_gpus",
    "borrow_limit_gpus",
    "max_gpus_per_run",
    "monthly_gpu_hour_budget",
    "budget_mode",
    "fair_share_weight",
)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(
    errors: dict[str, list[str]], name: str, value, *, minimum: int, optional: bool = False
) -> None:
    """A whole number in [minimum, MAX_STORED_INT]; None too when ``optional``."""
    if value is None and optional:
        return
    if not _is_int(value):
        errors.setdefault(name, []).append("Enter a whole number.")
    elif value < minimum:
        errors.setdefault(name, []).append(f"Must be at least {minimum}.")
    elif value > MAX_STORED_INT:
        errors.setdefault(name, []).append(f"At most {MAX_STORED_INT}.")


@transaction.atomic
def quota_update(
    *,
    tenant: Tenant,
    flavor: GpuFlavor,
    guaranteed_gpus: int,
    borrow_limit_gpus: int,
    max_gpus_per_run: int | None,
    monthly_gpu_hour_budget: int | None,
    budget_mode: str,
    fair_share_weight: int,
    offered_flavors: Collection[str] | None,
    actor: UserLike,
) -> Quota:
    """Create or replace the quota of ``tenant`` for ``flavor``; audited as "quota.update".

    ``max_gpus_per_run`` None means no per-run limit, ``monthly_gpu_hour_budget`` None no
    budget. ``offered_flavors`` are the slugs of flavors some enabled cluster offers: a
    borrow limit on any other flavor is refused. Pass None only where the borrow limit is
    not being changed. Lowering the guarantee below what running runs hold is allowed: they
    keep running, and the caller shows the difference. Raises ValidationError naming every
    bad field; nothing is written then.
    """
    values = {
        "guaranteed_gpus": guaranteed_gpus,
        "borrow_limit_gpus": borrow_limit_gpus,
        "max_gpus_per_run": max_gpus_per_run,
        "monthly_gpu_hour_budget": monthly_gpu_hour_budget,
        "budget_mode": budget_mode,
        "fair_share_weight": fair_share_weight,
    }
    errors: dict[str, list[str]] = {}
    _check_int(errors, "guaranteed_gpus", guaranteed_gpus, minimum=0)
    _check_int(errors, "borrow_limit_gpus", borrow_limit_gpus, minimum=0)
    _check_int(errors, "max_gpus_per_run", max_gpus_per_run, minimum=1, optional=True)
    _check_int(errors, "monthly_gpu_hour_budget", monthly_gpu_hour_budget, minimum=0, optional=True)
    _check_int(errors, "fair_share_weight", fair_share_weight, minimum=1)
    if budget_mode not in Quota.BudgetMode.values:
        errors.setdefault("budget_mode", []).append(
            f"Choose one of: {', '.join(Quota.BudgetMode.values)}."
        )
    if (
        "borrow_limit_gpus" not in errors
        and borrow_limit_gpus > 0
        and offered_flavors is not None
        and flavor.slug not in offered_flavors
    ):
        errors.setdefault("borrow_limit_gpus", []).append(
            f"No enabled cluster offers {flavor.slug}: there are no idle GPUs to borrow."
        )
    if errors:
        raise ValidationError(errors)

    quota = Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor).first()
    before = None if quota is None else audit_snapshot(quota, only=QUOTA_FIELDS)
    if quota is not None and before == values:
        return quota
    if quota is None:
        quota = Quota.objects.create(tenant=tenant, flavor=flavor, **values)
    else:
        for name, value in values.items():
            setattr(quota, name, value)
        quota.save(update_fields=list(QUOTA_FIELDS))
    audit_record(
        actor=actor,
        action="quota.update",
        target=f"{tenant.slug}:{flavor.slug}",
        tenant=tenant,
        before=before,
        after=values,
    )
    return quota


@transaction.atomic
def quota_set(*, tenant: Tenant, flavor: GpuFlavor, guaranteed_gpus: int, actor: UserLike) -> Quota:
    """Change only the guarantee, keeping the rest of the quota (defaults for a new one)."""
    quota = Quota.objects.select_for_update().filter(tenant=tenant, flavor=flavor).first()
    current = {name: getattr(quota or Quota(), name) for name in QUOTA_FIELDS}
    current["guaranteed_gpus"] = guaranteed_gpus
    return quota_update(tenant=tenant, flavor=flavor, offered_flavors=None, actor=actor, **current)


FLAVOR_FIELDS = ("name", "memory_gb", "gpu_fraction")
# Like tenant slugs, plus dots: MIG slices are named like a100-1g.10gb.
flavor_slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$",
    "Use 1-63 lowercase letters, digits, dots and dashes, starting and ending with a letter "
    "or digit.",
)
_FRACTION_QUANTUM = Decimal("0.0001")


def _flavor_errors(*, name: str, memory_gb: int, gpu_fraction) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    limit = max_length_of(GpuFlavor, "name")
    if not isinstance(name, str) or not name.strip():
        errors["name"] = ["A name is required."]
    elif len(name) > limit or "\x00" in name:
        errors["name"] = [f"At most {limit} characters, no NUL characters."]
    _check_int(errors, "memory_gb", memory_gb, minimum=1)
    if (
        not isinstance(gpu_fraction, Decimal)
        or not gpu_fraction.is_finite()
        or not Decimal(0) < gpu_fraction <= Decimal(1)
    ):
        errors["gpu_fraction"] = ["A fraction of a full GPU: more than 0 and at most 1."]
    elif gpu_fraction != gpu_fraction.quantize(_FRACTION_QUANTUM):
        errors["gpu_fraction"] = ["At most 4 decimal places."]
    return errors


@transaction.atomic
def flavor_create(
    *, slug: str, name: str, memory_gb: int, gpu_fraction: Decimal, actor: UserLike
) -> GpuFlavor:
    """A new GPU flavor (a full device or a MIG slice); audited as "flavor.create"."""
    errors = _flavor_errors(name=name, memory_gb=memory_gb, gpu_fraction=gpu_fraction)
    try:
        flavor_slug_validator(slug)
    except ValidationError as exc:
        errors["slug"] = exc.messages
    else:
        if GpuFlavor.objects.filter(slug=slug).exists():
            errors["slug"] = ["A flavor with this slug exists already."]
    if errors:
        raise ValidationError(errors)
    try:
        with transaction.atomic():
            flavor = GpuFlavor.objects.create(
                slug=slug, name=name.strip(), memory_gb=memory_gb, gpu_fraction=gpu_fraction
            )
    except IntegrityError:  # created concurrently since the check above
        raise ValidationError({"slug": ["A flavor with this slug exists already."]}) from None
    audit_record(
        actor=actor,
        action="flavor.create",
        target=slug,
        after={"slug": slug, **audit_snapshot(flavor, only=FLAVOR_FIELDS)},
    )
    return flavor


@transaction.atomic
def flavor_update(
    *, flavor: GpuFlavor, name: str, memory_gb: int, gpu_fraction: Decimal, actor: UserLike
) -> GpuFlavor:
    """Change a flavor's name, memory and GPU fraction; audited as "flavor.update".

    The slug stays: cluster settings, inventories, quotas and reports refer to it.
    """
    errors = _flavor_errors(name=name, memory_gb=memory_gb, gpu_fraction=gpu_fraction)
    if errors:
        raise ValidationError(errors)
    flavor = GpuFlavor.objects.select_for_update().get(pk=flavor.pk)
    before = audit_snapshot(flavor, only=FLAVOR_FIELDS)
    flavor.name, flavor.memory_gb, flavor.gpu_fraction = name.strip(), memory_gb, gpu_fraction
    after = audit_snapshot(flavor, only=FLAVOR_FIELDS)
    if after != before:
        flavor.save(update_fields=list(FLAVOR_FIELDS))
        audit_record(
            actor=actor, action="flavor.update", target=flavor.slug, before=before, after=after
        )
    return flavor


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
    if not _is_int(expires_in_days) or not 1 <= expires_in_days <= API_TOKEN_MAX_DAYS:
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


def notification_mark_all_read(*, user: UserLike) -> int:
    """Mark every unread notification of the user read; returns how many changed."""
    return Notification.objects.filter(user=signed_in(user), read_at__isnull=True).update(
        read_at=timezone.now()
    )


def notification_create(
    *, user: UserLike, tenant: Tenant | None, kind: Notification.Kind, message: str, now: datetime
) -> Notification:
    """An in-app message to one user, dated ``now``."""
    return Notification.objects.create(
        user=signed_in(user), tenant=tenant, kind=kind, message=message, created_at=now
    )


IDLE_POLICY_FIELDS = ("idle_notify_after_min", "idle_cancel_after_min")


@transaction.atomic
def tenant_idle_policy_update(
    *,
    tenant: Tenant,
    idle_notify_after_min: int | None,
    idle_cancel_after_min: int | None,
    actor: UserLike,
) -> Tenant:
    """Set the tenant's idle-GPU policy; audited as "tenant.idle_policy".

    Both values count consecutive idle minutes of a running attempt (telemetry/idle.py):
    after ``idle_notify_after_min`` its submitter is warned, after ``idle_cancel_after_min``
    the run is cancelled. None turns a step off. Each is 1 to ``IDLE_POLICY_MAX_MIN``, and
    cancelling must come later than warning when both are on. Raises PermissionDenied unless
    the actor administers the tenant or the platform, ValidationError naming every bad
    field; nothing is written then.
    """
    if not idle_policy_can_edit(user=actor, tenant=tenant):
        raise PermissionDenied(
            "Only a tenant admin of the tenant or a platform admin can change its idle-GPU policy."
        )
    values = {
        "idle_notify_after_min": idle_notify_after_min,
        "idle_cancel_after_min": idle_cancel_after_min,
    }
    errors: dict[str, list[str]] = {}
    for name, value in values.items():
        if value is None:
            continue
        if not _is_int(value):
            errors[name] = ["Enter a whole number of minutes, or leave it empty for off."]
        elif not 1 <= value <= IDLE_POLICY_MAX_MIN:
            errors[name] = [
                f"Between 1 and {IDLE_POLICY_MAX_MIN} minutes (a week), or empty for off."
            ]
    if (
        not errors
        and idle_notify_after_min is not None
        and idle_cancel_after_min is not None
        and idle_cancel_after_min <= idle_notify_after_min
    ):
        errors["idle_cancel_after_min"] = [
            f"Cancel after more idle minutes than the warning ({idle_notify_after_min}), so "
            "the submitter is warned first."
        ]
    if errors:
        raise ValidationError(errors)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    before = audit_snapshot(tenant, only=IDLE_POLICY_FIELDS)
    if before == values:
        return tenant
    for name, value in values.items():
        setattr(tenant, name, value)
    tenant.save(update_fields=list(IDLE_POLICY_FIELDS))
    audit_record(
        actor=actor,
        action="tenant.idle_policy",
        target=tenant.slug,
        tenant=tenant,
        before=before,
        after=values,
    )
    return tenant
