from tenants.roles import is_finance, is_platform_admin, tenant_roles


def navigation(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "nav_is_platform_admin": is_platform_admin(user),
        "nav_is_finance": is_finance(user),
        "nav_can_submit": bool(tenant_roles(user)),
    }
