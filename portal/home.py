"""The home page's reads: one section per role the user holds, each built from the
selectors of the pages it summarises, so a number here is the number there.

- researcher (a member of a tenant): their latest runs, their waiting runs with the start
  estimate, the goodput of their runs over the last days;
- tenant admin: per tenant they administer, quota and budget use per flavor, members, the
  runs waiting;
- platform admin: the cluster's GPUs per flavor (held, free, fragmentation), the KPIs of
  the KPI page's default range, each backend's health;
- finance: every tenant's last closed month and the month so far.

A person with several roles gets each of their sections. Every section costs a fixed
number of queries whatever the number of runs, tenants and clusters.
"""

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from django.db.models import Count, QuerySet
from django.http import QueryDict
from django.utils import timezone

from finance import selectors as finance_selectors
from finance.access import finance_tenant_list
from jobs.access import run_can_submit, run_list_viewable
from jobs.models import Run, RunState
from jobs.selectors.clusters import ClusterHealth, cluster_health_list
from jobs.selectors.nodes import FlavorView, cluster_node_map
from jobs.selectors.runs import runs_place_in_line
from jobs.services.capacity import QuotaUsage, quota_usage_list
from telemetry.kpis.forms import KpiFilterForm, kpi_filter_data
from telemetry.kpis.selectors import KpiScope, PlatformKpis, platform_kpis
from telemetry.selectors import GpuSeconds, goodput_of_runs
from tenants.access import is_finance, is_platform_admin, tenant_ids_administered
from tenants.models import Membership, Tenant
from tenants.selectors import quota_list_viewable
from tenants.types import UserLike

RECENT_RUNS = 5
WAITING_RUNS_SHOWN = 10
GOODPUT_DAYS = 30
# What a run row never shows: the experiment's large fields stay in the database.
_RUN_ROW_DEFERRED = ("experiment__command", "experiment__params", "experiment__env")


@dataclass(frozen=True)
class ResearcherSection:
    recent: list[Run]
    waiting: list[Run]  # the first WAITING_RUNS_SHOWN, first in line first
    waiting_count: int
    goodput: GpuSeconds  # of the user's attempts that ended in the last GOODPUT_DAYS days
    goodput_days: int


@dataclass(frozen=True)
class AdministeredTenant:
    tenant: Tenant
    usages: list[QuotaUsage]
    members: int
    waiting: list[Run]
    waiting_count: int


@dataclass(frozen=True)
class PlatformSection:
    flavors: list[tuple[str, FlavorView]]  # (cluster, flavor), clusters by name
    kpis: PlatformKpis
    kpi_first_day: date
    kpi_last_day: date
    clusters: list[ClusterHealth]


@dataclass(frozen=True)
class FinanceSection:
    closed_month: date
    current_month: date
    overview: list[finance_selectors.TenantMonths]
    currency: str | None


@dataclass(frozen=True)
class Home:
    researcher: ResearcherSection | None
    tenant_admin: list[AdministeredTenant] | None
    platform: PlatformSection | None
    finance: FinanceSection | None

    @property
    def empty(self) -> bool:
        return not (self.researcher or self.tenant_admin or self.platform or self.finance)


def home_for(*, user: UserLike, now: datetime) -> Home:
    """The sections ``user``'s roles entitle them to, as of ``now``."""
    administered = tenant_ids_administered(user)
    return Home(
        researcher=_researcher(user=user, now=now) if run_can_submit(user=user) else None,
        tenant_admin=_tenant_admin(user=user, tenant_ids=administered) if administered else None,
        platform=_platform(user=user, now=now) if is_platform_admin(user) else None,
        finance=_finance(user=user, now=now) if is_finance(user) else None,
    )


def _run_rows(runs: QuerySet[Run]) -> QuerySet[Run]:
    return runs.select_related("experiment").defer(*_RUN_ROW_DEFERRED)


def _waiting(runs: QuerySet[Run]) -> list[Run]:
    """The first queued runs in line (priority, then submission), with their places."""
    waiting = list(
        _run_rows(runs.filter(state=RunState.QUEUED)).order_by("-priority", "submitted_at", "id")[
            :WAITING_RUNS_SHOWN
        ]
    )
    runs_place_in_line(waiting)
    return waiting


def _all_shown(waiting: list[Run]) -> bool:
    """Whether the first runs in line are all there are (fewer than a full list): their
    number is then known without counting them."""
    return len(waiting) < WAITING_RUNS_SHOWN


def _researcher(*, user: UserLike, now: datetime) -> ResearcherSection:
    mine = run_list_viewable(user=user).filter(submitted_by_id=user.pk)
    waiting = _waiting(mine)
    return ResearcherSection(
        recent=list(_run_rows(mine).order_by("-submitted_at", "-id")[:RECENT_RUNS]),
        waiting=waiting,
        waiting_count=len(waiting)
        if _all_shown(waiting)
        else mine.filter(state=RunState.QUEUED).count(),
        goodput=goodput_of_runs(runs=mine, since=now - timedelta(days=GOODPUT_DAYS), until=now),
        goodput_days=GOODPUT_DAYS,
    )


def _tenant_admin(*, user: UserLike, tenant_ids: list[int]) -> list[AdministeredTenant]:
    tenants = list(Tenant.objects.filter(id__in=tenant_ids).order_by("slug"))
    usages = quota_usage_list(
        quotas=list(quota_list_viewable(user=user).filter(tenant_id__in=tenant_ids))
    )
    members = dict(
        Membership.objects.filter(tenant_id__in=tenant_ids)
        .values_list("tenant_id")
        .annotate(count=Count("id"))
        .values_list("tenant_id", "count")
    )
    queued = run_list_viewable(user=user).filter(tenant_id__in=tenant_ids, state=RunState.QUEUED)
    waiting = _waiting(queued)
    if _all_shown(waiting):
        waiting_counts = Counter(run.tenant_id for run in waiting)
    else:
        waiting_counts = Counter(
            dict(
                queued.order_by()
                .values_list("tenant_id")
                .annotate(count=Count("id"))
                .values_list("tenant_id", "count")
            )
        )
    return [
        AdministeredTenant(
            tenant=tenant,
            usages=[usage for usage in usages if usage.quota.tenant_id == tenant.pk],
            members=members.get(tenant.pk, 0),
            waiting=[run for run in waiting if run.tenant_id == tenant.pk],
            waiting_count=waiting_counts.get(tenant.pk, 0),
        )
        for tenant in tenants
    ]


def _platform(*, user: UserLike, now: datetime) -> PlatformSection:
    node_map = cluster_node_map(user=user, now=now)
    # The KPI page's default range (its last days up to today), so the figures match it.
    form = KpiFilterForm(data=kpi_filter_data(QueryDict(), today=timezone.localdate(now)))
    if not form.is_valid():  # the default range always is; a failure here is a bug
        raise AssertionError(form.errors)
    kpis = platform_kpis(scope=KpiScope(since=form.since, until=form.until, now=now))
    return PlatformSection(
        flavors=[
            (cluster.name, flavor) for cluster in node_map.clusters for flavor in cluster.flavors
        ],
        kpis=kpis,
        kpi_first_day=form.cleaned_data["from"],
        kpi_last_day=form.cleaned_data["to"],
        clusters=cluster_health_list(now=now),
    )


def _finance(*, user: UserLike, now: datetime) -> FinanceSection:
    # Statement months are UTC, as on the finance pages.
    current = finance_selectors.month_first_day(now.astimezone(UTC).date())
    closed = finance_selectors.last_closed_month(current)
    return FinanceSection(
        closed_month=closed,
        current_month=current,
        overview=finance_selectors.tenant_month_overview(
            tenants=finance_tenant_list(user=user), closed_month=closed, current_month=current
        ),
        currency=finance_selectors.platform_currency(),
    )
