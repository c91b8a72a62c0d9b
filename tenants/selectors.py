from django.db.models import QuerySet
from django.http import Http404

from tenants.models import (
    ApiToken,
    AuditEvent,
    GpuFlavor,
    Membership,
    Notification,
    Project,
    Quota,
    Tenant,
)
from tenants.roles import is_platform_admin, sees_all_tenants, tenant_roles


def tenant_list_viewable(*, user) -> QuerySet[Tenant]:
    """Tenants whose runs and experiments the user may read."""
    if sees_all_tenants(user):
        return Tenant.objects.filter(active=True)
    return Tenant.objects.filter(active=True, id__in=tenant_roles(user).keys())


def tenant_list_submittable(*, user) -> QuerySet[Tenant]:
    """Tenants the user may submit to: membership is required, global roles are not enough."""
    return Tenant.objects.filter(active=True, id__in=tenant_roles(user).keys())


def project_list_submittable(*, user) -> QuerySet[Project]:
    return Project.objects.filter(tenant__in=tenant_list_submittable(user=user)).select_related(
        "tenant"
    )


def tenant_get_viewable(*, user, slug: str) -> Tenant:
    """The tenant, or 404 alike for a missing tenant and one the user may not see."""
    tenant = tenant_list_viewable(user=user).filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant")
    return tenant


def quota_list_for_tenant(*, tenant: Tenant) -> QuerySet[Quota]:
    return Quota.objects.filter(tenant=tenant).select_related("flavor")


def notification_list_for_user(*, user) -> QuerySet[Notification]:
    """The user's own notifications, newest first; nobody else's are ever reachable."""
    return Notification.objects.filter(user=user).select_related("tenant")


def notification_unread_count(*, user) -> int:
    """For the navigation badge: one COUNT on the (user, read_at) index."""
    if not user.is_authenticated:
        return 0
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


def require_platform_admin(user) -> None:
    """The gate of every platform page: 404 for everyone else, so the page stays unseen."""
    if not is_platform_admin(user):
        raise Http404("No such page")


def tenant_get_manageable(*, user, slug: str) -> Tenant:
    """A tenant whose quotas the user may change (platform admins only), else 404."""
    require_platform_admin(user)
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise Http404("No such tenant")
    return tenant


def flavor_list_manageable(*, user) -> QuerySet[GpuFlavor]:
    require_platform_admin(user)
    return GpuFlavor.objects.order_by("slug")


def flavor_get_manageable(*, user, slug: str) -> GpuFlavor:
    flavor = flavor_list_manageable(user=user).filter(slug=slug).first()
    if flavor is None:
        raise Http404("No such flavor")
    return flavor


def quota_get_manageable(
    *, user, tenant_slug: str, flavor_slug: str
) -> tuple[Tenant, GpuFlavor, Quota | None]:
    """What the quota editor needs: the tenant, the flavor and their quota if there is one
    yet. Platform admins only; 404 for everyone else and for an unknown tenant or flavor."""
    tenant = tenant_get_manageable(user=user, slug=tenant_slug)
    flavor = flavor_get_manageable(user=user, slug=flavor_slug)
    return tenant, flavor, Quota.objects.filter(tenant=tenant, flavor=flavor).first()


def quota_list_viewable(*, user) -> QuerySet[Quota]:
    """Quotas of every tenant the user may read, tenant by tenant."""
    return (
        Quota.objects.filter(tenant__in=tenant_list_viewable(user=user))
        .select_related("tenant", "flavor")
        .order_by("tenant__slug", "flavor__slug")
    )


def audit_tenant_ids(*, user) -> frozenset[int] | None:
    """Tenants whose audit log the user reads: None for all (platform admins), else the
    tenants the user administers (possibly none)."""
    if is_platform_admin(user):
        return None
    return frozenset(
        tenant_id
        for tenant_id, role in tenant_roles(user).items()
        if role == Membership.Role.TENANT_ADMIN
    )


def audit_list_viewable(*, user) -> QuerySet[AuditEvent]:
    """The audit log as the user may read it; 404 for users who may read none of it."""
    tenant_ids = audit_tenant_ids(user=user)
    if tenant_ids is not None and not tenant_ids:
        raise Http404("No such page")
    events = AuditEvent.objects.select_related("actor", "tenant").order_by("-at", "-id")
    if tenant_ids is not None:
        events = events.filter(tenant_id__in=tenant_ids)
    return events


def audit_tenant_choices(*, user) -> QuerySet[Tenant]:
    """Tenants to filter the audit log by."""
    tenant_ids = audit_tenant_ids(user=user)
    if tenant_ids is None:
        return Tenant.objects.order_by("slug")
    return Tenant.objects.filter(id__in=tenant_ids).order_by("slug")


def api_token_list_own(*, user) -> QuerySet[ApiToken]:
    """The user's own API tokens, newest first; nobody else's are ever reachable."""
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def api_token_get_own(*, user, token_id: int) -> ApiToken:
    """One of the user's own tokens; 404 alike for a missing token and another user's."""
    token = api_token_list_own(user=user).filter(pk=token_id).first()
    if token is None:
        raise Http404("No such token")
    return token
