"""The platform KPI page: queue and startup time, success rate, failure reasons,
checkpoint recovery, goodput and cluster allocation over a range of days (design §7).

Thin: parse the filters, call one selector, shape its numbers for ``json_script``, render.
Platform admins and finance only; everyone else gets 404, as for the other platform pages.
An invalid range answers 400 with the form's errors and computes nothing.
"""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from jobs.live import live_page, live_page_poll
from telemetry.access import kpi_can_read
from telemetry.accounting import IDLE_THRESHOLD
from telemetry.kpis import selectors
from telemetry.kpis.forms import KPI_MAX_RANGE_DAYS, KpiFilterForm, kpi_filter_data
from telemetry.kpis.selectors import KpiScope, PlatformKpis

TEMPLATE = "telemetry/platform_kpis_page.html"
SECONDS_PER_MINUTE = 60


# A range that reaches now changes with every second (its capacity grows): asked for less
# often than the pages of this moment, so the charts are not redrawn all the time.
KPIS_REFRESH_S = 30


def _minutes(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / SECONDS_PER_MINUTE, 1)


def _queue_chart(kpis: PlatformKpis) -> dict | None:
    """Queue time p50 and p95 per tenant, in minutes."""
    tenants = [group for group in kpis.by_tenant if group.queue.count]
    if not tenants:
        return None
    return {
        "orientation": "v",
        "categories": [group.name for group in tenants],
        "unit": "min",
        "x_title": "Tenant",
        "y_title": "Queue time (minutes)",
        "traces": [
            {
                "name": "p50 (median)",
                "values": [_minutes(group.queue.distribution.p50) for group in tenants],
            },
            {
                "name": "p95",
                "values": [_minutes(group.queue.distribution.p95) for group in tenants],
            },
        ],
    }


def _allocation_chart(kpis: PlatformKpis) -> dict | None:
    """Allocation per cluster and flavor, in percent of the capacity, on an axis from 0 to
    100 % whatever the values: a bar of 1 % is a hundredth of the width, never all of it."""
    rows = [row for row in kpis.allocation if row.rate.percent is not None]
    if not any(row.allocated_gpu_s for row in rows):
        return None  # bars of zero say less than the table
    return {
        "orientation": "h",
        "categories": [f"{row.cluster} · {row.flavor}" for row in rows],
        "unit": "%",
        "x_title": "Allocated, % of capacity",
        "y_title": "",
        "value_range": [0, 100],
        "traces": [
            {"name": "Allocated", "values": [round(row.rate.percent or 0.0, 1) for row in rows]}
        ],
    }


@never_cache
@login_required
@require_GET
def platform_kpis(request: HttpRequest) -> HttpResponse:
    """The KPIs of ``?from=`` through ``?to=`` (dates, both included; the last 30 days by
    default), optionally of one ``?tenant=``, ``?flavor=`` and ``?cluster=``."""
    if not kpi_can_read(user=request.user):
        raise Http404("No such page")
    form = KpiFilterForm(data=kpi_filter_data(request.GET, today=timezone.localdate()))
    context = {"form": form, "max_days": KPI_MAX_RANGE_DAYS}
    if not form.is_valid():
        return render(request, TEMPLATE, context, status=400)
    filters = form.cleaned_data
    scope = KpiScope(
        since=form.since,
        until=form.until,
        now=timezone.now(),
        tenant_id=filters["tenant"].pk if filters["tenant"] else None,
        flavor_id=filters["flavor"].pk if filters["flavor"] else None,
        cluster_id=filters["cluster"].pk if filters["cluster"] else None,
    )
    kpis = selectors.platform_kpis(scope=scope)
    group_tables = [("Tenant", "tenant", kpis.by_tenant), ("Flavor", "flavor", kpis.by_flavor)]
    charts = {"queue_chart": _queue_chart(kpis), "allocation_chart": _allocation_chart(kpis)}
    context = {
        **context,
        "kpis": kpis,
        "first_day": filters["from"],
        "last_day": filters["to"],
        "days": form.days,
        "time_zone": timezone.get_current_timezone_name(),
        "reaches_future": scope.until > scope.now,
        "idle_percent": IDLE_THRESHOLD * 100,
        "group_tables": group_tables,
        "has_charts": any(charts.values()),
        **charts,
    }
    part = live_page(
        request,
        part_id="kpis-live",
        template="telemetry/platform_kpis.html",
        context=context,
        refresh_s=KPIS_REFRESH_S,
    )
    return live_page_poll(request, part) or render(
        request, TEMPLATE, {**context, "live_page": part}
    )
