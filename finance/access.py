"""Who reads which tenant's money and who prices GPU-hours: the permission checks of every
finance page and export (design §8), in one place.

Finance and platform admins read every tenant, also inactive ones, whose past months still
need statements; tenant admins read the tenants they administer; everybody else reads none,
and gets the same 404 for a tenant they may not read as for one that does not exist (a
``DoesNotExist`` or ``NotVisible`` here, a 404 at the edge: ``core.http.or_404``). Rate
cards are managed by finance and platform admins only.
"""

from django.db.models import QuerySet

from core.types import UserLike
from tenants.access import NotVisible, is_finance, is_platform_admin, tenant_roles
from tenants.models import Membership, Tenant


def finance_sees_all(user: UserLike) -> bool:
    """Finance and platform admins read every tenant's statements and export them all."""
    return is_finance(user) or is_platform_admin(user)


def finance_tenant_list(*, user: UserLike) -> QuerySet[Tenant]:
    """Tenants whose statements the user may read: every tenant (also inactive ones, whose
    past months still need statements) for finance and platform admins, the tenants they
    administer for tenant admins, none for anyone else."""
    if finance_sees_all(user):
        return Tenant.objects.order_by("slug")
    administered = [
        tenant_id
        for tenant_id, role in tenant_roles(user).items()
        if role == Membership.Role.TENANT_ADMIN
    ]
    return Tenant.objects.filter(id__in=administered).order_by("slug")


def finance_can_read(*, user: UserLike) -> bool:
    """Whether any finance page is for the user: the gate that 404s everybody else."""
    return finance_sees_all(user) or Membership.Role.TENANT_ADMIN in tenant_roles(user).values()


def require_finance_reader(user: UserLike) -> None:
    if not finance_can_read(user=user):
        raise NotVisible("No such page")


def finance_tenant_get(*, user: UserLike, slug: str) -> Tenant:
    """The tenant, or DoesNotExist alike for a missing tenant and one the user may not read."""
    return finance_tenant_list(user=user).get(slug=slug)


def rate_card_can_manage(*, user: UserLike) -> bool:
    """Finance and platform admins add rate cards; tenant admins only read them."""
    return is_platform_admin(user) or is_finance(user)
