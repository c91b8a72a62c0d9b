from datetime import datetime

from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from tenants.models import ApiToken, AuditEvent, GlobalRole, Membership, Quota, Tenant


def audit_record(
    *,
    actor,
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


@transaction.atomic
def membership_set(*, user, tenant: Tenant, role: str, actor) -> Membership:
    membership, created = Membership.objects.select_for_update().get_or_create(
        user=user, tenant=tenant, defaults={"role": role}
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


@transaction.atomic
def global_role_grant(*, user, role: GlobalRole, actor) -> None:
    group, _ = Group.objects.get_or_create(name=role.value)
    user.groups.add(group)
    audit_record(
        actor=actor, action="role.grant", target=user.get_username(), after={"role": role.value}
    )


@transaction.atomic
def quota_set(*, tenant: Tenant, flavor, guaranteed_gpus: int, actor) -> Quota:
    quota, created = Quota.objects.select_for_update().get_or_create(
        tenant=tenant, flavor=flavor, defaults={"guaranteed_gpus": guaranteed_gpus}
    )
    before = None if created else {"guaranteed_gpus": quota.guaranteed_gpus}
    if not created:
        quota.guaranteed_gpus = guaranteed_gpus
        quota.full_clean()
        quota.save(update_fields=["guaranteed_gpus"])
    audit_record(
        actor=actor,
        action="quota.set",
        target=f"{tenant.slug}:{flavor.slug}",
        tenant=tenant,
        before=before,
        after={"guaranteed_gpus": guaranteed_gpus},
    )
    return quota


def api_token_create(
    *, user, name: str = "api", expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the secret, which is never stored or shown again."""
    secret = ApiToken.new_secret()
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[4 : 4 + ApiToken.PREFIX_LENGTH],
        key_hash=ApiToken.hash_secret(secret),
        expires_at=expires_at,
    )
    return token, secret


def api_token_revoke(*, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
