"""The navigation of every page, by role: what the signed-in user may open, in three groups.

One place decides which links a persona sees, so the layout (templates/base.html) only
draws them. A link is shown only where its page answers the user with something other
than 404: researchers do not see platform pages, finance does not see the submit form.
"""

from dataclasses import dataclass

from django.urls import reverse

from finance.access import finance_can_read
from jobs.access import run_can_submit
from tenants.access import is_finance, is_platform_admin, tenant_roles
from tenants.models import Membership
from tenants.selectors import notification_unread_count


@dataclass(frozen=True)
class NavLink:
    label: str
    url: str
    current: bool


@dataclass(frozen=True)
class NavGroup:
    label: str
    links: tuple[NavLink, ...]


def _link(request, label: str, url_name: str, *, pages: tuple[str, ...] = ()) -> NavLink:
    """A link that is the current page at its own URL, or on any of ``pages``: view names,
    or ``app:`` for every page of an app namespace."""
    url = reverse(url_name)
    match = getattr(request, "resolver_match", None)
    current = request.path == url
    if match is not None and not current:
        current = match.view_name in pages or f"{match.app_name}:" in pages
    return NavLink(label, url, current)


_WORKSPACE_PAGES = ("jobs:workspace_launch", "jobs:workspace_detail")


def navigation_groups(
    request, *, admin: bool, finance: bool, finance_reader: bool, member: bool, tenant_admin: bool
):
    """The groups of links a user with these roles sees, empty groups left out.
    ``finance_reader``: the finance pages answer the user (``finance.access``)."""
    work = [
        _link(request, "Runs", "jobs:run_list"),
        _link(
            request,
            "Experiments",
            "jobs:experiment_list",
            pages=("jobs:experiment_detail", "jobs:experiment_diff"),
        ),
    ]
    if member:
        work.append(_link(request, "Submit", "jobs:run_submit"))
    if member or admin:
        work.append(_link(request, "Workspaces", "jobs:workspace_list", pages=_WORKSPACE_PAGES))
    if admin or tenant_admin:
        work.append(_link(request, "Templates", "jobs:template_list"))
    work.append(_link(request, "Images", "images:image_list"))
    work.append(_link(request, "Quotas", "jobs:quota_list"))
    if tenant_admin:
        work.append(
            _link(
                request,
                "Members",
                "members",
                pages=("jobs:tenant_members", "jobs:member_add", "jobs:member_role"),
            )
        )
    if member or admin or finance:
        work.append(_link(request, "Nodes", "jobs:cluster_nodes"))

    reports = []
    if member or admin or finance:
        reports.append(
            _link(request, "Goodput", "telemetry:goodput", pages=("telemetry:tenant_goodput",))
        )
    if finance_reader:
        reports.append(_link(request, "Finance", "finance:index", pages=("finance:",)))
    if admin or finance:
        reports.append(_link(request, "KPIs", "telemetry:platform_kpis"))
    if admin or finance or tenant_admin:
        # What-if reports: platform admins ask for them, and share them with finance and
        # the admins of the tenants they concern.
        reports.append(_link(request, "What-if", "policy:report_list", pages=("policy:",)))

    platform = []
    if admin:
        platform += [
            _link(request, "Clusters", "jobs:cluster_list"),
            _link(
                request,
                "Node health",
                "telemetry:node_health",
                pages=("telemetry:node_detail",),
            ),
            _link(request, "Flavors", "tenants:flavor_list"),
            _link(request, "Registries", "images:registry_list"),
            _link(request, "Unmapped", "telemetry:unmapped_samples"),
        ]
    if admin or tenant_admin:
        platform.append(_link(request, "Audit", "tenants:audit_list"))
    if admin:
        platform.append(_link(request, "Admin", "admin:index"))
    groups = (("Work", work), ("Reports", reports), ("Platform", platform))
    return [NavGroup(label, tuple(links)) for label, links in groups if links]


def navigation(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    admin = is_platform_admin(user)
    finance = is_finance(user)
    roles = tenant_roles(user)
    tenant_admin = Membership.Role.TENANT_ADMIN in roles.values()
    return {
        "nav_groups": navigation_groups(
            request,
            admin=admin,
            finance=finance,
            finance_reader=finance_can_read(user=user),
            member=run_can_submit(user=user),
            tenant_admin=tenant_admin,
        ),
        "nav_is_platform_admin": admin,
        "nav_is_finance": finance,
        # Page actions use the same answers as the links: the submit button and links of
        # the run list show only where the submit form takes the user.
        "nav_can_submit": run_can_submit(user=user),
        "nav_can_audit": admin or tenant_admin,
        "nav_unread_notifications": notification_unread_count(user=user),
    }
