"""Telemetry pages: a run's GPU usage, a tenant's goodput, unmapped samples.

Thin: parse, call selectors, shape their series for ``json_script``, render. Every page
starts from an access helper that answers 404 to users who may not see it. The numbers in
the charts are computed here and in the selectors; static/gantry/telemetry.js only hands
them to Plotly.
"""

from datetime import datetime
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.views.decorators.http import require_GET

from core.http import or_404
from jobs.selectors.runs import run_attempts, run_get_viewable
from telemetry.goodput import DEFAULT_GOODPUT_DAYS, GOODPUT_DAYS, goodput_window
from telemetry.kpis.metrics import Ratio
from telemetry.kpis.reliability_reads import ettr_by_tenant, run_ettr
from telemetry.selectors import run_page
from telemetry.selectors.gpu_seconds import CATEGORY_LABELS, SECONDS_PER_HOUR, GpuSeconds
from telemetry.selectors.run_page import AttemptTelemetry, RunTelemetry
from telemetry.selectors.run_page_sql import STEP_PART_LABELS
from telemetry.selectors.tenant_goodput import (
    GoodputPeriod,
    goodput_by_period,
    goodput_by_project,
    goodput_by_user,
)
from telemetry.selectors.unmapped import unmapped_samples_recent, unmapped_totals_by_source
from tenants.access import require_platform_admin, tenant_list_viewable
from tenants.selectors import tenant_get_viewable

UNMAPPED_PER_PAGE = 50
RESOLUTION_TEXT = {"minute": "per minute", "hour": "hourly means", "day": "daily means"}
ACTIVITY_METRICS = (
    ("activity", "GPU activity"),
    ("sm_active", "SM active"),
    ("tensor_active", "Tensor active"),
)
GOODPUT_AXIS = {
    GoodputPeriod.DAY: "Day the attempts finished",
    GoodputPeriod.WEEK: "Week the attempts finished (Monday)",
}
# Checkpoint markers sit at the top of the 0-100 % activity axis.
MARKER_Y = 100


def _label(text: str) -> str:
    """Text for a Plotly label. Plotly reads a few HTML tags in labels (links, bold);
    escaped, a host or URI with markup in it shows as the text it is."""
    return escape(text)


def _chart_times(moments: list[datetime]) -> list[str]:
    """Plotly ignores time zones: send local wall time and name the zone on the axis. As
    ``timezone.localtime`` does, with the zone looked up once for the whole series."""
    zone = timezone.get_current_timezone()
    return [moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S") for moment in moments]


def _time_axis() -> str:
    return f"Time ({timezone.get_current_timezone_name()})"


def _bar_chart(
    *,
    orientation: str,
    categories: list[str],
    unit: str,
    traces: list[tuple[str, str, list]],
    x_title: str = "",
    y_title: str = "",
) -> dict:
    """A stacked bar chart: one trace per (key, name, values), ``values`` aligned with
    ``categories``; the key picks the trace's colour."""
    return {
        "kind": "bar",
        "orientation": orientation,
        "categories": categories,
        "unit": unit,
        "x_title": x_title,
        "y_title": y_title,
        "traces": [{"key": key, "name": name, "values": values} for key, name, values in traces],
    }


def _category_traces(columns: list[GpuSeconds]) -> list[tuple[str, str, list]]:
    """Effective and each waste category in GPU-hours, one value per column."""
    return [
        (key, label, [_gpu_hours(getattr(seconds, key)) for seconds in columns])
        for key, label in CATEGORY_LABELS.items()
    ]


def _gpu_hours(gpu_seconds: float) -> float:
    return round(gpu_seconds / SECONDS_PER_HOUR, 3)


def _waste_chart(telemetry: RunTelemetry) -> dict | None:
    bars = [
        (f"Attempt {item.attempt.number}", item.accounting)
        for item in telemetry.attempts
        if item.accounting is not None
    ]
    if not bars:
        return None
    total = telemetry.total
    if len(bars) > 1 and total is not None:  # not None: some attempt was accounted
        bars.append(("Run", total))
    return _bar_chart(
        orientation="h",
        categories=[title for title, _ in bars],
        unit="GPU-hours",
        traces=_category_traces([seconds for _, seconds in bars]),
        x_title="GPU-hours",
    )


def _activity_chart(telemetry: RunTelemetry) -> dict | None:
    if not telemetry.gpu_series:
        return None
    marks = telemetry.checkpoints
    return {
        "kind": "activity",
        "x_title": _time_axis(),
        "y_title": "% of the time",
        "lines": [
            {
                "name": _label(f"Attempt {line.attempt_number} · {line.host} GPU {line.gpu}"),
                "x": _chart_times(line.times),
                "activity": line.activity,
                "sm_active": line.sm_active,
                "tensor_active": line.tensor_active,
            }
            for line in telemetry.gpu_series
        ],
        "markers": {
            "name": "Checkpoints",
            "x": _chart_times([mark.at for mark in marks]),
            "y": [MARKER_Y] * len(marks),
            "text": [
                _label(
                    f"Attempt {mark.attempt_number}: checkpoint of step {mark.step} "
                    f"{mark.kind} ({mark.reported_by}) {mark.uri}"
                )
                for mark in marks
            ],
        },
    }


def _steps_chart(telemetry: RunTelemetry) -> dict | None:
    if not telemetry.step_series:
        return None
    splits = [split for _, split in telemetry.step_series]
    return _bar_chart(
        orientation="v",
        categories=_chart_times([bucket for bucket, _ in telemetry.step_series]),
        unit="% of step time",
        traces=[
            (key, label, [round(getattr(split, f"{key}_share") * 100, 1) for split in splits])
            for key, label in STEP_PART_LABELS.items()
        ],
        x_title=_time_axis(),
        y_title="% of step time",
    )


def _waste_table(telemetry: RunTelemetry) -> tuple[list, list]:
    """Columns (title, AttemptTelemetry or None for the run, accounting or None) and rows
    (category label, [CategoryShare or None per column])."""
    columns: list[tuple[str, AttemptTelemetry | None, GpuSeconds | None]] = [
        (f"Attempt {item.attempt.number}", item, item.accounting) for item in telemetry.attempts
    ]
    if len(columns) > 1:
        columns.append(("Run", None, telemetry.total))
    shares = [seconds.shares() if seconds else None for _, _, seconds in columns]
    rows = [
        (label, [column[index] if column else None for column in shares])
        for index, label in enumerate(CATEGORY_LABELS.values())
    ]
    return columns, rows


@login_required
@require_GET
def run_telemetry(request: HttpRequest, run_id: int) -> HttpResponse:
    """GPU activity, where the allocated GPU-hours went, step time, checkpoints and a
    diagnosis of every attempt of the run.

    Accounting is the stored one, computed once an attempt has ended: while an attempt runs,
    whether its work will count as lost depends on how it ends, so a live figure could only
    mislead; the activity and step charts are live instead."""
    run = or_404(run_get_viewable, user=request.user, run_id=run_id)
    attempts = list(run_attempts(run=run))
    now = timezone.now()
    telemetry = run_page.run_telemetry(run=run, attempts=attempts, now=now)
    columns, rows = _waste_table(telemetry)
    charts = {
        "activity_chart": _activity_chart(telemetry),
        "waste_chart": _waste_chart(telemetry),
        "steps_chart": _steps_chart(telemetry),
    }
    return render(
        request,
        "telemetry/run_telemetry.html",
        {
            "run": run,
            "telemetry": telemetry,
            "waste_columns": columns,
            "waste_rows": rows,
            "total": telemetry.total,
            "resolution_text": RESOLUTION_TEXT[telemetry.resolution],
            "metrics": ACTIVITY_METRICS,
            "has_charts": any(charts.values()),
            "ettr": run_ettr(run=run, now=now),
            **charts,
        },
    )


def _goodput_query(request: HttpRequest) -> tuple[int, GoodputPeriod]:
    """The period (days) and grouping asked for; anything else means the defaults."""
    days = request.GET.get("days", "")
    by = request.GET.get("by", "")
    return (
        int(days) if days in {str(choice) for choice in GOODPUT_DAYS} else DEFAULT_GOODPUT_DAYS,
        GoodputPeriod(by) if by in GoodputPeriod.values else GoodputPeriod.DAY,
    )


@login_required
@require_GET
def goodput(request: HttpRequest) -> HttpResponse:
    """The goodput page of ``?tenant=`` or of the user's first tenant."""
    slug = request.GET.get("tenant", "")
    if slug:
        tenant = or_404(tenant_get_viewable, user=request.user, slug=slug)
    else:
        first = tenant_list_viewable(user=request.user).order_by("slug").first()
        if first is None:
            raise Http404("No such tenant")
        tenant = first
    days, period = _goodput_query(request)
    url = reverse("telemetry:tenant_goodput", args=[tenant.slug])
    return redirect(f"{url}?{urlencode({'days': days, 'by': period.value})}")


@login_required
@require_GET
def tenant_goodput(request: HttpRequest, slug: str) -> HttpResponse:
    """Goodput and waste of the tenant's attempts that finished in the last ``?days=``,
    per day or week (``?by=``), per user and per project."""
    tenant = or_404(tenant_get_viewable, user=request.user, slug=slug)
    days, period = _goodput_query(request)
    today = timezone.localdate()
    since, until = goodput_window(days=days, today=today)
    by_period = goodput_by_period(tenant=tenant, since=since, until=until, period=period)
    total = sum((seconds for _, seconds in by_period), GpuSeconds())
    chart = None
    if total.attempts:
        chart = _bar_chart(
            orientation="v",
            categories=[start.isoformat() for start, _ in by_period],
            unit="GPU-hours",
            traces=_category_traces([seconds for _, seconds in by_period]),
            x_title=GOODPUT_AXIS[period],
            y_title="GPU-hours",
        )
    return render(
        request,
        "telemetry/tenant_goodput.html",
        {
            "tenant": tenant,
            "tenants": tenant_list_viewable(user=request.user).order_by("slug"),
            "days": days,
            "day_choices": GOODPUT_DAYS,
            "period": period,
            "periods": GoodputPeriod,
            "first_day": since.date(),
            "last_day": today,
            "by_period": by_period,
            "total": total,
            "by_user": goodput_by_user(tenant=tenant, since=since, until=until),
            "by_project": goodput_by_project(tenant=tenant, since=since, until=until),
            "goodput_chart": chart,
            "ettr": ettr_by_tenant(since=since, until=until, tenant_id=tenant.pk).get(
                tenant.slug, Ratio()
            ),
            "has_charts": chart is not None,
        },
    )


@login_required
@require_GET
def unmapped_samples(request: HttpRequest) -> HttpResponse:
    """Samples no attempt claimed, per source (platform admins only)."""
    or_404(require_platform_admin, request.user)
    page = Paginator(unmapped_samples_recent(), UNMAPPED_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "telemetry/unmapped_samples.html",
        {
            "totals": unmapped_totals_by_source(now=timezone.now()),
            "page_obj": page,
            "rows": page.object_list,
        },
    )
