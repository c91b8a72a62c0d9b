from tenants.models import Membership
from tenants.roles import is_finance, is_platform_admin, tenant_roles
from tenants.selectors import notification_unread_count


def navigation(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "nav_is_platform_admin": is_platform_admin(user),
        "nav_is_finance": is_finance(user),
        "nav_can_submit": bool(tenant_roles(user)),
        "nav_can_audit": is_platform_admin(user)
        or Membership.Role.TENANT_ADMIN in tenant_roles(user).values(),
        "nav_unread_notifications": notification_unread_count(user=user),
    }
