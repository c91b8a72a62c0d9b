"""Reads of experiment templates: which a user may use or manage."""

from django.db.models import F, Q, QuerySet
from django.http import Http404

from jobs.models import ExperimentTemplate
from tenants.models import Membership, Tenant
from tenants.roles import is_platform_admin, is_tenant_admin, tenant_roles
from tenants.selectors import tenant_list_submittable


def template_list_usable(*, user) -> QuerySet[ExperimentTemplate]:
    """Templates the user may submit from: global ones and those of their tenants."""
    return (
        ExperimentTemplate.objects.filter(
            Q(tenant__isnull=True) | Q(tenant__in=tenant_list_submittable(user=user))
        )
        .select_related("tenant")
        .order_by(F("tenant__slug").asc(nulls_first=True), "name")
    )


def template_get_usable(*, user, template_id: int) -> ExperimentTemplate:
    """The template, or 404 alike for a missing one and one of another tenant."""
    template = template_list_usable(user=user).filter(pk=template_id).first()
    if template is None:
        raise Http404("No such template")
    return template


def template_tenants_manageable(*, user) -> QuerySet[Tenant]:
    """Tenants whose templates the user manages: all for platform admins, else those the
    user is tenant admin of."""
    if is_platform_admin(user):
        return Tenant.objects.filter(active=True).order_by("slug")
    admin_of = [
        tenant_id
        for tenant_id, role in tenant_roles(user).items()
        if role == Membership.Role.TENANT_ADMIN
    ]
    return Tenant.objects.filter(active=True, id__in=admin_of).order_by("slug")


def template_can_manage(*, user, tenant: Tenant | None) -> bool:
    """Global templates are the platform admins'; a tenant's also its tenant admins'."""
    if is_platform_admin(user):
        return True
    return tenant is not None and is_tenant_admin(user, tenant.pk)


def template_list_manageable(*, user) -> QuerySet[ExperimentTemplate]:
    """Templates the user may edit; 404 for users who may manage none (researchers)."""
    templates = ExperimentTemplate.objects.select_related("tenant").order_by(
        F("tenant__slug").asc(nulls_first=True), "name"
    )
    if is_platform_admin(user):
        return templates
    tenants = list(template_tenants_manageable(user=user))
    if not tenants:
        raise Http404("No such page")
    return templates.filter(tenant__in=tenants)


def template_get_manageable(*, user, template_id: int) -> ExperimentTemplate:
    template = template_list_manageable(user=user).filter(pk=template_id).first()
    if template is None:
        raise Http404("No such template")
    return template
