"""Finance pages (design §8): monthly statements per tenant with their breakdowns, trend
and budget burn-down, the attempts behind a statement line, rate cards, CSV and XLSX
exports.

Finance and platform admins read every tenant; tenant admins the tenants they administer;
everybody else gets 404 on every page, and a tenant admin asking for another tenant gets
the same 404 as for a tenant that does not exist (``finance.access``). Thin: parse, call
selectors or the ``rate_card_add`` service, shape plain series for ``json_script``, render.
"""

import csv
from collections.abc import Iterable, Iterator
from datetime import date, timedelta
from decimal import Decimal
from tempfile import SpooledTemporaryFile
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    QueryDict,
    StreamingHttpResponse,
)
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.http import or_404
from finance import access
from finance.access import rate_card_can_manage
from finance.accrual import accrual_month, tenant_month_overview_accrued
from finance.forms import CreditPolicyForm, ExportForm, RateCardForm, StatementChoiceForm
from finance.models import RateCard
from finance.selectors.amounts import gpu_hours
from finance.selectors.burn_down import BurnDown, budget_burn_down
from finance.selectors.drill_down import attempts_in_month, statement_attempts
from finance.selectors.exports import EXPORT_COLUMNS, export_rows, export_rows_count
from finance.selectors.months import last_closed_month, month_after, months_back
from finance.selectors.rate_cards import platform_currency, rate_cards_by_flavor
from finance.selectors.statements import (
    DIMENSIONS,
    MonthUsage,
    Statement,
    statement_line_total,
    statement_month,
    usage_by_month,
    usage_rolled_up_until,
)
from finance.services import rate_card_add, rate_card_credit_policy_set
from finance.spreadsheet import usage_workbook_write
from telemetry.templatetags.gpu_units import share_percent

DRILL_DOWN_PER_PAGE = 50
# A budget more than this many times the month's use would flatten the use to the axis.
BUDGET_OFF_SCALE = 4
# An XLSX file is a zip that is only complete at its end, so it is built whole before it is
# sent (in a temporary file that spills to disk above XLSX_SPOOL_BYTES). The cap keeps that
# bounded: 100 000 rows is years of a large tenant, far below Excel's 1 048 576 rows, and
# builds in seconds. Above it the export is CSV, which streams in constant memory.
XLSX_MAX_ROWS = 100_000
XLSX_SPOOL_BYTES = 8 * 1024 * 1024
XLSX_CONTENT_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP "CSV
# injection"); user names are chosen by people, so such a cell gets a leading apostrophe.
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _today() -> date:
    """Today in UTC: DailyUsage days and budget months are UTC."""
    return timezone.now().date()


# --- index --------------------------------------------------------------------------------


def _export_form(request: HttpRequest, data: QueryDict | None = None) -> ExportForm:
    closed = last_closed_month(_today())
    return ExportForm(
        data,
        tenants=access.finance_tenant_list(user=request.user),
        all_tenants=access.finance_sees_all(request.user),
        initial={"from": closed, "to": month_after(closed) - timedelta(days=1)},
    )


def _index(
    request: HttpRequest,
    *,
    choice_form: StatementChoiceForm | None = None,
    export_form: ExportForm | None = None,
    status: int = 200,
) -> HttpResponse:
    tenants = access.finance_tenant_list(user=request.user)
    now = timezone.now()
    current = now.date().replace(day=1)
    closed = last_closed_month(current)
    return render(
        request,
        "finance/index.html",
        {
            "closed_month": closed,
            "current_month": current,
            "accrued_at": now,
            "overview": tenant_month_overview_accrued(
                tenants=tenants, closed_month=closed, current_month=current, now=now
            ),
            "currency": platform_currency(),
            "choice_form": choice_form
            or StatementChoiceForm(tenants=tenants, initial={"month": closed}),
            "export_form": export_form or _export_form(request),
            "xlsx_max_rows": f"{XLSX_MAX_ROWS:,}",
        },
        status=status,
    )


@login_required
@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """Every tenant's last closed month (what finance reviews) and month to date, each a
    link to its statement; choose another tenant and month, or a range to export."""
    or_404(access.require_finance_reader, request.user)
    if "tenant" not in request.GET and "month" not in request.GET:
        return _index(request)
    slug = request.GET.get("tenant", "")
    if slug:
        or_404(access.finance_tenant_get, user=request.user, slug=slug)  # 404 for outsiders
    form = StatementChoiceForm(request.GET, tenants=access.finance_tenant_list(user=request.user))
    if not form.is_valid():
        return _index(request, choice_form=form, status=400)
    return redirect(
        "finance:statement",
        tenant_slug=form.cleaned_data["tenant"].slug,
        month=form.cleaned_data["month"],
    )


# --- statement ----------------------------------------------------------------------------


def _hours(value: Decimal) -> float:
    """For a chart: GPU-hours to the hundredth (the tables carry the exact figures)."""
    return float(value.quantize(Decimal("0.01")))


def _trend_chart(trend: list[MonthUsage], *, money: bool, currency: str | None) -> dict:
    """Effective and wasted, stacked, per month: GPU-hours, or cost in ``currency``."""
    if money:
        effective = [float(item.usage.effective_cost) for item in trend]
        waste = [float(item.usage.waste_cost) for item in trend]
        unit = currency or ""
    else:
        effective = [_hours(item.usage.effective_hours) for item in trend]
        waste = [_hours(item.usage.waste_hours) for item in trend]
        unit = "GPU-hours"
    return {
        "kind": "bar",
        "categories": [f"{item.month:%Y-%m}" for item in trend],
        "unit": unit,
        "x_title": "Month (UTC)",
        "y_title": unit,
        "traces": [
            {"key": "effective", "name": "Effective", "values": effective},
            {"key": "waste", "name": "Wasted", "values": waste},
        ],
    }


def _burn_chart(burn: BurnDown) -> dict | None:
    """Per flavor: allocated GPU-hours so far, day by day, and its budget as a dashed line
    in the same colour. When every budget is far above the use (more than
    ``BUDGET_OFF_SCALE`` times it), the axis ends a quarter above the use so that the use is
    visible: the budgets are then named with their size and the use with its share of them."""
    if not burn.flavors:
        return None
    days = [f"{day:%Y-%m-%d}" for day in burn.days]
    used_top = max(
        (value for flavor in burn.flavors for value in flavor.cumulative_hours if value),
        default=Decimal(0),
    )
    budgets = [flavor.budget_gpu_hours or 0 for flavor in burn.budgeted]
    off_scale = bool(used_top and budgets and min(budgets) > BUDGET_OFF_SCALE * used_top)
    lines = []
    for group, flavor in enumerate(burn.flavors):
        used_name = f"{flavor.flavor_slug} used"
        if off_scale and flavor.used_percent is not None:
            used_name += f" ({share_percent(flavor.used_percent)} of its budget)"
        lines.append(
            {
                "name": used_name,
                "group": group,
                "dash": False,
                "y": [
                    None if value is None else _hours(value) for value in flavor.cumulative_hours
                ],
            }
        )
        if flavor.budget_gpu_hours is not None:
            budget_name = f"{flavor.flavor_slug} budget"
            if off_scale:
                budget_name += f" ({flavor.budget_gpu_hours:,} GPU-hours, above the scale)"
            lines.append(
                {
                    "name": budget_name,
                    "group": group,
                    "dash": True,
                    "y": [flavor.budget_gpu_hours] * len(days),
                }
            )
    return {
        "kind": "lines",
        "x": days,
        "unit": "GPU-hours",
        "x_title": "Day (UTC)",
        "y_title": "Allocated GPU-hours, cumulative",
        "y_range": [0, _hours(used_top * Decimal("1.25"))] if off_scale else None,
        "lines": lines,
    }


def _export_query(statement: Statement) -> str:
    return urlencode(
        {
            "tenant": statement.tenant.slug,
            "from": statement.month.isoformat(),
            "to": statement.last_day.isoformat(),
        }
    )


@login_required
@require_GET
def statement(request: HttpRequest, tenant_slug: str, month: date) -> HttpResponse:
    """A tenant's month: totals; breakdowns by project, user, flavor and cluster, each line
    leading to the attempts behind it; the 12-month trend; budget burn-down; exports."""
    tenant = or_404(access.finance_tenant_get, user=request.user, slug=tenant_slug)
    now = timezone.now()
    today = now.date()
    report = statement_month(tenant=tenant, month=month)
    accrual = accrual_month(tenant=tenant, month=report.month, now=now)
    trend = usage_by_month(tenant=tenant, last_month=report.month)
    burn = budget_burn_down(tenant=tenant, month=report.month, as_of=today)
    currency = platform_currency()
    has_trend = any(item.usage.allocated_gpu_s for item in trend)
    charts = {
        "trend_hours_chart": _trend_chart(trend, money=False, currency=currency)
        if has_trend
        else None,
        "trend_cost_chart": _trend_chart(trend, money=True, currency=currency)
        if has_trend and currency
        else None,
        "burn_chart": _burn_chart(burn),
    }
    return render(
        request,
        "finance/statement.html",
        {
            "tenant": tenant,
            "statement": report,
            "total": report.total,
            "accrual": accrual,
            "accrued_cost": report.total.charged_cost + accrual.cost,
            "accrued_gpu_hours": gpu_hours(report.total.allocated_gpu_s + accrual.gpu_s),
            "accrued_at": now,
            "breakdowns": [(DIMENSIONS[name], lines) for name, lines in report.breakdowns.items()],
            "trend": trend,
            "burn": burn,
            "currency": currency,
            "previous_month": months_back(report.month, 1),
            "next_month": report.month_end if report.month_end <= today else None,
            "month_open": report.month <= today < report.month_end,
            "rolled_up_until": usage_rolled_up_until(),
            "export_query": _export_query(report),
            "has_charts": any(charts.values()),
            **charts,
        },
    )


@login_required
@require_GET
def statement_runs(request: HttpRequest, tenant_slug: str, month: date) -> HttpResponse:
    """The attempts behind a statement line (``?project=``, ``?user=``, ``?flavor=``,
    ``?cluster=``, combinable; none: the whole statement), with their accounting and the
    month's share of their GPU time and cost."""
    tenant = or_404(access.finance_tenant_get, user=request.user, slug=tenant_slug)
    filters = {name: request.GET[name] for name in DIMENSIONS if request.GET.get(name)}
    month = month.replace(day=1)
    attempts = statement_attempts(tenant=tenant, month=month, filters=filters)
    page = Paginator(attempts, DRILL_DOWN_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "finance/runs.html",
        {
            "tenant": tenant,
            "month": month,
            "filters": [(DIMENSIONS[name], value) for name, value in filters.items()],
            "line": statement_line_total(tenant=tenant, month=month, filters=filters),
            "page_obj": page,
            "rows": attempts_in_month(attempts=list(page.object_list), month=month),
            "currency": platform_currency(),
        },
    )


# --- rate cards ---------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def rate_cards(request: HttpRequest) -> HttpResponse:
    """Every flavor's rate cards, current and past; finance and platform admins add one."""
    or_404(access.require_finance_reader, request.user)
    can_manage = rate_card_can_manage(user=request.user)
    currency = platform_currency()
    form = None
    if request.method == "POST":
        if not can_manage:  # a tenant admin: the page is no secret to them, so 403 leaks nothing
            raise PermissionDenied("Only finance and platform admins manage rate cards.")
        form = RateCardForm(request.POST)
        if form.is_valid():
            try:
                card = rate_card_add(actor=request.user, **form.cleaned_data)
            except ValidationError as exc:
                form.add_service_errors(exc)
            else:
                messages.success(
                    request,
                    f"Added the rate card of {card.flavor.slug}: {card.price_per_gpu_hour} "
                    f"{card.currency} per GPU-hour from {card.valid_from:%Y-%m-%d}.",
                )
                return redirect("finance:rate_cards")
    elif can_manage:
        form = RateCardForm(initial={"currency": currency or "", "valid_from": _today()})
    return render(
        request,
        "finance/rates.html",
        {
            "flavors": rate_cards_by_flavor(today=_today()),
            "form": form,
            "currency": currency,
            "today": _today(),
            "credit_policies": RateCard.CreditPolicy.choices,
        },
        status=400 if form is not None and form.errors else 200,
    )


@login_required
@require_POST
def rate_card_credit_policy(request: HttpRequest, card_id: int) -> HttpResponse:
    """Finance and platform admins set whether a card credits or charges hardware and
    platform failures."""
    or_404(access.require_finance_reader, request.user)
    if not rate_card_can_manage(user=request.user):
        raise PermissionDenied("Only finance and platform admins manage rate cards.")
    card = or_404(RateCard.objects.select_related("flavor").get, pk=card_id)
    form = CreditPolicyForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose credit or charge: the card was not changed.")
        return redirect("finance:rate_cards")
    card = rate_card_credit_policy_set(
        card=card, credit_policy=form.cleaned_data["credit_policy"], actor=request.user
    )
    messages.success(
        request,
        f"The rate card of {card.flavor.slug} from {card.valid_from:%Y-%m-%d} now says: "
        f"{card.get_credit_policy_display().lower()}.",
    )
    return redirect("finance:rate_cards")


# --- exports ------------------------------------------------------------------------------


def _cell(value):
    """Text as a spreadsheet must not run it; everything else as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def _export_cells(rows: Iterable[tuple]) -> Iterator[list]:
    for row in rows:
        yield [_cell(value) for value in row]


class _Echo:
    """A file-like object that hands back what is written to it: csv.writer formats a row,
    the generator yields it (the Django streaming-CSV pattern)."""

    def write(self, value: str) -> str:
        return value


def _csv_lines(rows: Iterable[tuple]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(EXPORT_COLUMNS)
    for cells in _export_cells(rows):
        yield writer.writerow(cells)


def _export_request(request: HttpRequest) -> tuple[ExportForm, dict | None]:
    """The validated export form and the selector arguments, or None when it is invalid.
    A tenant the user may not read is a 404 before anything else."""
    or_404(access.require_finance_reader, request.user)
    slug = request.GET.get("tenant", "")
    if slug:
        or_404(access.finance_tenant_get, user=request.user, slug=slug)
    form = _export_form(request, request.GET)
    if not form.is_valid():
        return form, None
    return form, {
        "tenant": form.cleaned_data["tenant"],
        "first_day": form.cleaned_data["from"],
        "last_day": form.cleaned_data["to"],
    }


def _filename(query: dict, extension: str) -> str:
    tenant = query["tenant"].slug if query["tenant"] else "all-tenants"
    return (
        f"gantry-usage-{tenant}-{query['first_day']:%Y%m%d}-{query['last_day']:%Y%m%d}.{extension}"
    )


@login_required
@require_GET
def export_csv(request: HttpRequest) -> HttpResponseBase:
    """The statement lines of a range as CSV, streamed row by row: constant memory."""
    form, query = _export_request(request)
    if query is None:
        return _index(request, export_form=form, status=400)
    rows = export_rows(**query, currency=platform_currency() or "")
    response = StreamingHttpResponse(_csv_lines(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{_filename(query, "csv")}"'
    return response


@login_required
@require_GET
def export_xlsx(request: HttpRequest) -> HttpResponseBase:
    """The same rows as the CSV export in an XLSX workbook, up to ``XLSX_MAX_ROWS``."""
    form, query = _export_request(request)
    if query is None:
        return _index(request, export_form=form, status=400)
    count = export_rows_count(**query)
    if count > XLSX_MAX_ROWS:
        form.add_error(
            None,
            f"The range holds {count:,} rows; an XLSX export holds at most {XLSX_MAX_ROWS:,}. "
            "Download it as CSV, or choose a shorter range.",
        )
        return _index(request, export_form=form, status=400)
    currency = platform_currency() or ""
    buffer = SpooledTemporaryFile(max_size=XLSX_SPOOL_BYTES)  # noqa: SIM115 (FileResponse closes it)
    usage_workbook_write(
        _export_cells(export_rows(**query, currency=currency)),
        columns=EXPORT_COLUMNS,
        currency=currency,
        into=buffer,
    )
    buffer.seek(0)
    return FileResponse(
        buffer,
        as_attachment=True,
        filename=_filename(query, "xlsx"),
        content_type=XLSX_CONTENT_TYPE,
    )
