"""The home page's reads: one section per role the user holds, each built from the
selectors of the pages it summarises, so a number here is the number there. The run lists
are SQL written by hand (one statement for both of a researcher's lists), kept to the runs
the user may read by ``tenants.access.tenant_scope_sql``, the rule ``run_list_viewable``
starts from (tests/portal/test_tenant_scope_sql.py holds them to it).

- researcher (a member of a tenant): their latest runs, their waiting runs with the start
  estimate, the goodput of each of their tenants and of their own runs there over the
  goodput page's default period (``telemetry.goodput``: the figures that page shows);
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
from datetime import UTC, date, datetime

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count
from django.http import QueryDict
from django.utils import timezone

from clusters.selectors import ClusterHealth, cluster_health_list
from core.types import UserLike
from finance.access import finance_tenant_list
from finance.accrual import TenantMonthSoFar, tenant_month_overview_accrued
from finance.selectors.months import last_closed_month, month_first_day
from finance.selectors.rate_cards import platform_currency
from jobs.access import run_can_submit, run_list_viewable
from jobs.models import Experiment, Run, RunState
from jobs.selectors.capacity import QuotaUsage, quota_usage_list
from jobs.selectors.estimates import shows_full_limits, start_records_shown
from jobs.selectors.nodes import FlavorView, cluster_node_map
from jobs.selectors.runs import runs_place_in_line
from telemetry.goodput import (
    DEFAULT_GOODPUT_DAYS,
    TenantGoodput,
    goodput_of_my_tenants,
    goodput_window,
)
from telemetry.kpis.forms import KpiFilterForm, kpi_filter_data
from telemetry.kpis.selectors import KpiScope, PlatformKpis, platform_kpis
from tenants.access import (
    is_finance,
    is_platform_admin,
    tenant_ids_administered,
    tenant_scope_sql,
)
from tenants.models import GpuFlavor, Membership, Project, Tenant
from tenants.selectors import quota_list_viewable

RECENT_RUNS = 5
WAITING_RUNS_SHOWN = 10
# What a run row of the home page shows, and the related names it shows beside the run's
# own fields (attributes of the Run, read by templates/home.html; nothing else is loaded).
_RUN_ROW_FIELDS = (
    "id",
    "experiment_id",
    "tenant_id",
    "flavor_id",
    "submitted_by_id",
    "priority",
    "state",
    "wait_reason",
    "submitted_at",
    "start_full_limits_at",
    "start_expected_at",
    "start_note",
)
_FLAVOR_SLUG = "flavor_slug"
_RUN_ROW_NAMES = {
    "experiment_name": "e.name",
    "experiment_nodes": "e.nodes",
    "experiment_gpus_per_node": "e.gpus_per_node",
    "tenant_slug": "t.slug",
    "project_slug": "p.slug",
    _FLAVOR_SLUG: "f.slug",
    "submitter_username": "u.username",
}


@dataclass(frozen=True)
class ResearcherSection:
    recent: list[Run]
    waiting: list[Run]  # the first WAITING_RUNS_SHOWN, first in line first
    waiting_count: int
    # Per tenant of the user: its goodput over the goodput page's default period, and that
    # of the user's own runs, the figures that page shows as its total and the user's row.
    goodput: list[TenantGoodput]
    goodput_days: int
    goodput_since: date


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
    kpi_days: int  # the KPIs' window, beside figures of this moment
    clusters: list[ClusterHealth]


@dataclass(frozen=True)
class FinanceSection:
    closed_month: date
    current_month: date
    overview: list[TenantMonthSoFar]
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


# Columns beside a run's fields: the number of runs its query matched (all of them, not
# only those shown), and which of the researcher's two lists it belongs to.
_MATCHING = "home_matching"
_LIST = "home_list"


def _run_rows(
    *, user: UserLike, where: str, params: list, order: str, limit: int, counted: bool = True
) -> tuple[str, list]:
    """SQL of the first ``limit`` runs the user may read (``run_list_viewable``'s rule, as
    ``tenant_scope_sql`` writes it for SQL) that match ``where``, in ``order``; with the
    count of all that match (``_MATCHING``) when ``counted``, else NULL there. Counting
    reads every matching run, not only the first ``limit``: a list whose number is not
    shown does not pay for it."""
    quote = connection.ops.quote_name
    columns = ", ".join(
        [
            f"r.{quote(str(field.column))}"  # a concrete field always has its column
            for field in Run._meta.concrete_fields
            if field.attname in _RUN_ROW_FIELDS
        ]
        + [f"{column} AS {name}" for name, column in _RUN_ROW_NAMES.items()]
        + [f"{'count(*) OVER ()' if counted else 'CAST(NULL AS bigint)'} AS {_MATCHING}"]
    )
    viewable, scope = tenant_scope_sql(user=user, tenant="t")
    # Identifiers from model metadata (quoted), fragments from this module; every value
    # is a parameter.
    return (
        f"SELECT {columns} FROM {quote(Run._meta.db_table)} r "  # noqa: S608
        f"JOIN {quote(Tenant._meta.db_table)} t ON t.id = r.tenant_id "
        f"JOIN {quote(Experiment._meta.db_table)} e ON e.id = r.experiment_id "
        f"JOIN {quote(Project._meta.db_table)} p ON p.id = e.project_id "
        f"JOIN {quote(GpuFlavor._meta.db_table)} f ON f.id = r.flavor_id "
        f"JOIN {quote(User._meta.db_table)} u ON u.id = r.submitted_by_id "
        f"WHERE {viewable} AND {where} ORDER BY {order} LIMIT {int(limit)}"
    ), [*scope, *params]


# The order of the line (as admission orders it), and of the latest runs.
_IN_LINE = "r.priority DESC, r.submitted_at, r.id"
_LATEST = "r.submitted_at DESC, r.id DESC"


def _runs(sql: str, params: list) -> list[Run]:
    """Runs (only the fields of a home row, the names beside) of a ``_run_rows`` query."""
    return list(Run.objects.raw(sql, params))


def _waiting_places(waiting: list[Run]) -> list[Run]:
    runs_place_in_line(waiting)
    return waiting


def _start_records(waiting: list[Run], *, now: datetime) -> None:
    """Each waiting run's full-limits estimate with its track record (one query for them
    all, none when none shows one)."""
    records = start_records_shown(waiting, flavor_of=_flavor_slug, now=now)
    for run in waiting:
        if shows_full_limits(run):
            run.start_record = records[_flavor_slug(run)].summary(now=now)


def _flavor_slug(run: Run) -> str:
    """The flavor of a home row, read beside it (``_RUN_ROW_NAMES``), not through the run."""
    return str(getattr(run, _FLAVOR_SLUG))


def _all_shown(waiting: list[Run]) -> bool:
    """Whether the first runs in line are all there are (fewer than a full list): their
    number is then known without counting them."""
    return len(waiting) < WAITING_RUNS_SHOWN


def _researcher(*, user: UserLike, now: datetime) -> ResearcherSection:
    """The user's latest runs and first waiting ones, in one query (both lists side by
    side), the number waiting counted by the same query."""
    user_id = user.pk
    assert user_id is not None  # a member of a tenant: signed in
    since, until = goodput_window(days=DEFAULT_GOODPUT_DAYS, today=timezone.localdate(now))
    recent_sql, recent_params = _run_rows(
        user=user,
        where="r.submitted_by_id = %s",
        params=[user.pk],
        order=_LATEST,
        limit=RECENT_RUNS,
        counted=False,  # "your latest runs" shows no total
    )
    waiting_sql, waiting_params = _run_rows(
        user=user,
        where="r.submitted_by_id = %s AND r.state = %s",
        params=[user.pk, RunState.QUEUED],
        order=_IN_LINE,
        limit=WAITING_RUNS_SHOWN,
    )
    rows = _runs(
        # Both queries from _run_rows; their values are parameters.
        f"SELECT 0 AS {_LIST}, latest.* FROM ({recent_sql}) latest "  # noqa: S608
        f"UNION ALL SELECT 1, in_line.* FROM ({waiting_sql}) in_line",
        [*recent_params, *waiting_params],
    )
    recent = [run for run in rows if getattr(run, _LIST) == 0]
    waiting = _waiting_places([run for run in rows if getattr(run, _LIST) == 1])
    _start_records(waiting, now=now)
    return ResearcherSection(
        recent=recent,
        waiting=waiting,
        waiting_count=getattr(waiting[0], _MATCHING) if waiting else 0,
        goodput=goodput_of_my_tenants(user=user, since=since, until=until),
        goodput_days=DEFAULT_GOODPUT_DAYS,
        goodput_since=since.date(),
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
    in_tenants = ", ".join(["%s"] * len(tenant_ids))
    waiting = _waiting_places(
        _runs(
            *_run_rows(
                user=user,
                where=f"r.tenant_id IN ({in_tenants}) AND r.state = %s",
                params=[*tenant_ids, RunState.QUEUED],
                order=_IN_LINE,
                limit=WAITING_RUNS_SHOWN,
            )
        )
    )
    if _all_shown(waiting):
        waiting_counts = Counter(run.tenant_id for run in waiting)
    else:
        queued = run_list_viewable(user=user).filter(
            tenant_id__in=tenant_ids, state=RunState.QUEUED
        )
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
        kpi_days=form.days,
        clusters=cluster_health_list(now=now),
    )


def _finance(*, user: UserLike, now: datetime) -> FinanceSection:
    # Statement months are UTC, as on the finance pages.
    current = month_first_day(now.astimezone(UTC).date())
    closed = last_closed_month(current)
    return FinanceSection(
        closed_month=closed,
        current_month=current,
        overview=tenant_month_overview_accrued(
            tenants=finance_tenant_list(user=user),
            closed_month=closed,
            current_month=current,
            now=now,
        ),
        currency=platform_currency(),
    )
