"""Who may do what: global roles come from groups, tenant roles from memberships."""

from tenants.models import GlobalRole, Membership


def global_roles(user) -> frozenset[str]:
    if not user.is_authenticated:
        return frozenset()
    cached = getattr(user, "_gantry_global_roles", None)
    if cached is None:
        names = set(user.groups.values_list("name", flat=True))
        if user.is_superuser:
            names.add(GlobalRole.PLATFORM_ADMIN)
        cached = frozenset(names & set(GlobalRole.values))
        user._gantry_global_roles = cached
    return cached


def is_platform_admin(user) -> bool:
    return GlobalRole.PLATFORM_ADMIN in global_roles(user)


def is_finance(user) -> bool:
    return GlobalRole.FINANCE in global_roles(user)


def sees_all_tenants(user) -> bool:
    """Platform admins and finance read every tenant's runs (finance drills down to runs)."""
    return bool(global_roles(user))


def tenant_roles(user) -> dict[int, str]:
    """tenant id -> membership role, cached on the user object for the request."""
    if not user.is_authenticated:
        return {}
    cached = getattr(user, "_gantry_tenant_roles", None)
    if cached is None:
        cached = dict(
            Membership.objects.filter(user=user, tenant__active=True).values_list(
                "tenant_id", "role"
            )
        )
        user._gantry_tenant_roles = cached
    return cached


def is_tenant_admin(user, tenant_id: int) -> bool:
    return tenant_roles(user).get(tenant_id) == Membership.Role.TENANT_ADMIN
