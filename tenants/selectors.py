from datetime import datetime

from django.db import connection
from django.db.models import Q, QuerySet

from core.types import UserLike, signed_in
from tenants.access import (
    NotVisible,
    audit_tenant_ids,
    require_platform_admin,
    tenant_list_submittable,
    tenant_list_viewable,
)
from tenants.models import (
    ApiToken,
    AuditEvent,
    GpuFlavor,
    Invitation,
    Membership,
    Notification,
    Project,
    Quota,
    Tenant,
)


def project_list_submittable(*, user: UserLike) -> QuerySet[Project]:
    return Project.objects.filter(tenant__in=tenant_list_submittable(user=user)).select_related(
        "tenant"
    )


def tenant_get_viewable(*, user: UserLike, slug: str) -> Tenant:
    """The tenant, or DoesNotExist alike for a missing tenant and one the user may not see."""
    return tenant_list_viewable(user=user).get(slug=slug)


def membership_get(*, tenant: Tenant, user_id: int) -> Membership:
    """The membership of user ``user_id`` in ``tenant`` (which the caller has checked the
    user may manage); DoesNotExist for anybody who is not a member of it."""
    return Membership.objects.select_related("user", "tenant").get(tenant=tenant, user_id=user_id)


def quota_list_for_tenant(*, tenant: Tenant) -> QuerySet[Quota]:
    return Quota.objects.filter(tenant=tenant).select_related("flavor")


def invitation_list_for_user(*, user: UserLike, now: datetime) -> QuerySet[Invitation]:
    """The user's pending invitations to active tenants they are not a member of, newest
    first: those naming their username, or their e-mail address (in any case)."""
    user = signed_in(user)
    names = Q(identifier=user.username)
    if user.email:
        names |= Q(identifier__iexact=user.email)
    return (
        Invitation.objects.filter(
            names, state=Invitation.State.PENDING, expires_at__gt=now, tenant__active=True
        )
        .exclude(tenant__memberships__user=user)
        .select_related("tenant", "invited_by")
    )


def invitation_list_pending(*, tenant: Tenant, now: datetime) -> QuerySet[Invitation]:
    """The tenant's invitations still waiting for an answer, for its members page."""
    return Invitation.objects.filter(
        tenant=tenant, state=Invitation.State.PENDING, expires_at__gt=now
    ).select_related("invited_by")


def invitation_get_pending(*, tenant: Tenant, invitation_id: int) -> Invitation:
    """A pending invitation of ``tenant`` (which the caller has checked the user may manage);
    DoesNotExist for any other."""
    return Invitation.objects.select_related("tenant").get(
        tenant=tenant, pk=invitation_id, state=Invitation.State.PENDING
    )


def notification_list_for_user(*, user: UserLike) -> QuerySet[Notification]:
    """The user's own notifications, newest first; nobody else's are ever reachable."""
    return Notification.objects.filter(user=signed_in(user)).select_related("tenant")


def notification_unread_count(*, user: UserLike) -> int:
    """For the navigation badge: one COUNT on the (user, read_at) index. In SQL: every
    signed-in page asks, and the ORM's compilation would cost more than the query."""
    if not user.is_authenticated:
        return 0
    # Identifiers from model metadata (quoted); the value is a parameter.
    sql = (
        f"SELECT COUNT(*) FROM {connection.ops.quote_name(Notification._meta.db_table)} "  # noqa: S608
        "WHERE user_id = %s AND read_at IS NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [user.pk])
        (count,) = cursor.fetchone()
    return count


def tenant_get_manageable(*, user: UserLike, slug: str) -> Tenant:
    """A tenant whose quotas the user may change (platform admins only), else NotVisible."""
    require_platform_admin(user)
    return Tenant.objects.get(slug=slug)


def flavor_list_manageable(*, user: UserLike) -> QuerySet[GpuFlavor]:
    require_platform_admin(user)
    return GpuFlavor.objects.order_by("slug")


def flavor_get_manageable(*, user: UserLike, slug: str) -> GpuFlavor:
    return flavor_list_manageable(user=user).get(slug=slug)


def quota_get_manageable(
    *, user: UserLike, tenant_slug: str, flavor_slug: str
) -> tuple[Tenant, GpuFlavor, Quota | None]:
    """What the quota editor needs: the tenant, the flavor and their quota if there is one
    yet. Platform admins only: NotVisible for everyone else, DoesNotExist for an unknown
    tenant or flavor."""
    tenant = tenant_get_manageable(user=user, slug=tenant_slug)
    flavor = flavor_get_manageable(user=user, slug=flavor_slug)
    return tenant, flavor, Quota.objects.filter(tenant=tenant, flavor=flavor).first()


def quota_list_viewable(*, user: UserLike) -> QuerySet[Quota]:
    """Quotas of every tenant the user may read, tenant by tenant."""
    return (
        Quota.objects.filter(tenant__in=tenant_list_viewable(user=user))
        .select_related("tenant", "flavor")
        .order_by("tenant__slug", "flavor__slug")
    )


def audit_list_viewable(*, user: UserLike) -> QuerySet[AuditEvent]:
    """The audit log as the user may read it; NotVisible for users who may read none of it."""
    tenant_ids = audit_tenant_ids(user=user)
    if tenant_ids is not None and not tenant_ids:
        raise NotVisible("No such page")
    events = AuditEvent.objects.select_related("actor", "tenant").order_by("-at", "-id")
    if tenant_ids is not None:
        events = events.filter(tenant_id__in=tenant_ids)
    return events


def audit_tenant_choices(*, user: UserLike) -> QuerySet[Tenant]:
    """Tenants to filter the audit log by."""
    tenant_ids = audit_tenant_ids(user=user)
    if tenant_ids is None:
        return Tenant.objects.order_by("slug")
    return Tenant.objects.filter(id__in=tenant_ids).order_by("slug")


def api_token_list_own(*, user: UserLike) -> QuerySet[ApiToken]:
    """The user's own API tokens, newest first; nobody else's are ever reachable."""
    return (
        ApiToken.objects.filter(user=signed_in(user))
        .select_related("user")
        .order_by("-created_at", "-id")
    )


def api_token_get_own(*, user: UserLike, token_id: int) -> ApiToken:
    """One of the user's own tokens; DoesNotExist alike for a missing token and another user's."""
    return api_token_list_own(user=user).get(pk=token_id)
