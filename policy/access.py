"""Who may ask for what-if reports and who reads which of their rows (issue 38), in one place.

Platform admins ask for reports, cancel, share and apply them, and read every report whole.
A shared report is read by finance (whole: finance reads every tenant's money) and by the
tenant admins of the tenants it concerns, who see their own tenants' rows and the platform
totals, never another tenant's row. Everybody else, and anybody asking for a report not
shared with them, gets the same ``DoesNotExist`` as for a report that does not exist (404 at
the edge).
"""

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from core.types import UserLike
from policy.models import ReplayReport
from tenants.access import NotVisible, is_finance, is_platform_admin, tenant_ids_administered


def replay_can_request(*, user: UserLike) -> bool:
    """Asking for a report, cancelling, sharing and applying one: platform admins only."""
    return is_platform_admin(user)


def replay_can_list(*, user: UserLike) -> bool:
    """Whether the list of reports is for the user (the gate that 404s everybody else):
    platform admins, finance and tenant admins, who may have reports shared with them."""
    return is_platform_admin(user) or is_finance(user) or bool(tenant_ids_administered(user))


def require_replay_requester(user: UserLike) -> None:
    if not replay_can_request(user=user):
        raise NotVisible("No such page")


def require_replay_reader(user: UserLike) -> None:
    if not replay_can_list(user=user):
        raise NotVisible("No such page")


def report_list_viewable(*, user: UserLike) -> QuerySet[ReplayReport]:
    """The reports the user may read, newest first."""
    reports = ReplayReport.objects.all()
    if is_platform_admin(user):
        return reports
    shared = reports.filter(shared=True)
    if is_finance(user):
        return shared
    concerning = ReplayReport.tenants.through.objects.filter(
        tenant_id__in=tenant_ids_administered(user)
    )
    return shared.filter(pk__in=concerning.values("replayreport_id"))


def report_get_viewable(*, user: UserLike, report_id: int) -> ReplayReport:
    """The report, or DoesNotExist alike for a missing one and one the user may not read."""
    return report_list_viewable(user=user).get(pk=report_id)


def report_get_manageable(*, user: UserLike, report_id: int) -> ReplayReport:
    """The report a platform admin acts on (cancel, share, apply, run again): DoesNotExist
    for whoever may not read it, as for a missing report; PermissionDenied for a reader who
    may not act on it (the report is no secret to them)."""
    report = report_get_viewable(user=user, report_id=report_id)
    if not replay_can_request(user=user):
        raise PermissionDenied("Only platform admins act on what-if reports.")
    return report


def report_tenant_scope(*, user: UserLike, report: ReplayReport) -> frozenset[int] | None:
    """The tenants whose rows of ``report`` the user reads, by id, or None for every row
    (platform admins and finance). A tenant admin reads the report's tenants they
    administer."""
    if is_platform_admin(user) or is_finance(user):
        return None
    administered = set(tenant_ids_administered(user))
    return frozenset(
        tenant_id
        for tenant_id in report.tenants.values_list("pk", flat=True)
        if tenant_id in administered
    )
