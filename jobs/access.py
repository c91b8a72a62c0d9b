"""Who may see and do what with experiments, runs and templates: jobs' one access module,
used by views, the API, templates and the services that check before they act.

Restricted querysets (``*_list_viewable``, ``*_list_usable``, ``*_list_manageable``) are
where every scoped list and lookup starts, in the spirit of NetBox's ``restrict()``;
predicates (``*_can_*``) answer for one object. Built on ``tenants.access``.
"""

from django.db.models import F, Q, QuerySet

from core.types import UserLike
from jobs.models import (
    Experiment,
    ExperimentTemplate,
    Run,
    RunKind,
)
from tenants.access import (
    NotVisible,
    is_platform_admin,
    is_tenant_admin,
    tenant_ids_administered,
    tenant_ids_member,
    tenant_list_submittable,
    tenant_list_viewable,
    tenant_roles,
)
from tenants.models import Membership, Tenant


def run_list_viewable(*, user: UserLike) -> QuerySet[Run]:
    """Runs of every tenant the user may read; the start of every run list."""
    return Run.objects.filter(tenant__in=tenant_list_viewable(user=user)).select_related(
        "tenant", "flavor", "cluster", "submitted_by", "experiment__project"
    )


def workspace_list_viewable(*, user: UserLike) -> QuerySet[Run]:
    """Workspaces (runs of kind interactive) the user may see as workspaces: their own in
    the tenants they are a member of, every one of the tenants they administer, all of them
    for platform admins. Narrower than the runs a member reads: a workspace is a person's
    desk, not a shared result. The start of every workspace list and lookup."""
    runs = Run.objects.filter(kind=RunKind.INTERACTIVE, tenant__active=True).select_related(
        "tenant", "flavor", "submitted_by", "experiment__project", "workspace"
    )
    if is_platform_admin(user):
        return runs
    if not user.is_authenticated:
        return runs.none()
    return runs.filter(
        Q(submitted_by_id=user.pk, tenant_id__in=tenant_ids_member(user))
        | Q(tenant_id__in=tenant_ids_administered(user))
    )


def experiment_list_viewable(*, user: UserLike) -> QuerySet[Experiment]:
    return Experiment.objects.filter(tenant__in=tenant_list_viewable(user=user)).select_related(
        "tenant", "project", "owner", "flavor", "image"
    )


def template_list_usable(*, user: UserLike) -> QuerySet[ExperimentTemplate]:
    """Templates the user may submit from: global ones and those of their tenants."""
    return (
        ExperimentTemplate.objects.filter(
            Q(tenant__isnull=True) | Q(tenant__in=tenant_list_submittable(user=user))
        )
        .select_related("tenant")
        .order_by(F("tenant__slug").asc(nulls_first=True), "name")
    )


def template_tenants_manageable(*, user: UserLike) -> QuerySet[Tenant]:
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


def template_can_manage(*, user: UserLike, tenant: Tenant | None) -> bool:
    """Global templates are the platform admins'; a tenant's also its tenant admins'."""
    if is_platform_admin(user):
        return True
    return tenant is not None and is_tenant_admin(user, tenant.pk)


def template_list_manageable(*, user: UserLike) -> QuerySet[ExperimentTemplate]:
    """Templates the user may edit; NotVisible for users who may manage none (researchers)."""
    templates = ExperimentTemplate.objects.select_related("tenant").order_by(
        F("tenant__slug").asc(nulls_first=True), "name"
    )
    if is_platform_admin(user):
        return templates
    tenants = list(template_tenants_manageable(user=user))
    if not tenants:
        raise NotVisible("No such page")
    return templates.filter(tenant__in=tenants)


def run_can_submit(*, user: UserLike) -> bool:
    """The submit form is for members of a tenant (``tenant_list_submittable`` is not
    empty): global roles are not enough. No query beyond the request's cached roles."""
    return bool(tenant_roles(user))


def run_can_cancel(*, user: UserLike, run: Run) -> bool:
    return (
        run.submitted_by_id == user.pk
        or is_tenant_admin(user, run.tenant_id)
        or is_platform_admin(user)
    )


def workspace_can_open(*, user: UserLike, run: Run) -> bool:
    """Only its owner opens a workspace (its files, kernels and terminals are theirs):
    neither a tenant admin nor a platform admin, who may see and stop it."""
    return user.is_authenticated and run.submitted_by_id == user.pk


def workspace_can_extend(*, user: UserLike, run: Run) -> bool:
    """Extending spends the tenant's GPU time: its owner or a tenant admin of its tenant."""
    return user.is_authenticated and (
        run.submitted_by_id == user.pk or is_tenant_admin(user, run.tenant_id)
    )


def experiment_can_rerun(*, user: UserLike, experiment: Experiment) -> bool:
    """Re-running spends the tenant's quota: membership is required, like submitting
    (``tenant_list_submittable``: a membership in an active tenant, read from the request's
    cached roles)."""
    return experiment.tenant_id in tenant_roles(user)
