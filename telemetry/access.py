"""Who may read telemetry's platform-wide pages: telemetry's one access module. Per-tenant
telemetry (goodput, run telemetry) follows the tenant's and the run's visibility
(``tenants.access``, ``jobs.access``)."""

from core.types import UserLike
from tenants.access import is_finance, is_platform_admin


def kpi_can_read(*, user: UserLike) -> bool:
    """The platform KPIs: platform admins and finance."""
    return is_platform_admin(user) or is_finance(user)
