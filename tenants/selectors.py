from django.db.models import QuerySet
from django.http import Http404

from tenants.models import Project, Quota, Tenant
from tenants.roles import sees_all_tenants, tenant_roles


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
