"""The rows of a spreadsheet export: statement lines of a date range, one tuple each."""

from collections.abc import Iterator
from datetime import date, timedelta

from django.db.models import QuerySet
from django.db.models.functions import TruncMonth

from finance.models import DailyUsage
from finance.selectors.amounts import (
    GPU_FIELDS,
    LINE_FIELDS,
    PRICE,
    Usage,
    gpu_hours,
    usage_lines,
)
from finance.selectors.months import month_after
from telemetry.accounting import WASTE
from telemetry.models import CREDITED_CAUSES
from tenants.models import Tenant

EXPORT_COLUMNS = (
    "from", "to", "tenant", "project", "user", "flavor", "cluster", "price_per_gpu_hour",
    "allocated_gpu_h", "effective_gpu_h", *(f"{name}_gpu_h" for name in WASTE),
    "unpriced_gpu_h", *(f"credited_{cause.value}_gpu_h" for cause in CREDITED_CAUSES),
    *(f"credited_{cause.value}_cost" for cause in CREDITED_CAUSES), "charged_cost",
    "cost", "effective_cost", "waste_cost", "currency",
)  # fmt: skip
_EXPORT_NAMES = (
    "tenant__slug", "project__slug", "user__username", "flavor__slug", "cluster__name",
    "rate_card__valid_from",
)  # fmt: skip


def _credit_amounts(usage: Usage) -> list:
    return [getattr(usage, f"credited_{cause.value}_cost") for cause in CREDITED_CAUSES]


def _export_rows(*, tenant: Tenant | None, first_day: date, last_day: date) -> QuerySet:
    rows = DailyUsage.objects.filter(date__gte=first_day, date__lte=last_day)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    return rows.annotate(month=TruncMonth("date"))


def export_rows_count(*, tenant: Tenant | None, first_day: date, last_day: date) -> int:
    rows = _export_rows(tenant=tenant, first_day=first_day, last_day=last_day)
    return rows.values("month", "tenant_id", *LINE_FIELDS).distinct().count()


def export_rows(
    *, tenant: Tenant | None, first_day: date, last_day: date, currency: str
) -> Iterator[tuple]:
    """The statement lines of [first_day, last_day] (of ``tenant``, or of every tenant), one
    tuple per line in ``EXPORT_COLUMNS`` order: the days of the month the line covers (the
    whole month, or the part of it inside the range), names as text, the price (None:
    unpriced), GPU-hours as Decimal with six places, money rounded once per line as on the
    statements. Read in chunks through a server-side cursor, so memory stays flat however
    many lines there are."""
    rows = _export_rows(tenant=tenant, first_day=first_day, last_day=last_day)
    for row, usage in usage_lines(rows, "month", *_EXPORT_NAMES):
        month = row["month"]
        yield (
            max(first_day, month),
            min(last_day, month_after(month) - timedelta(days=1)),
            *(row[name] for name in _EXPORT_NAMES[:-1]),
            row[PRICE],
            *(gpu_hours(getattr(usage, name)) for name in GPU_FIELDS),
            *_credit_amounts(usage),
            usage.charged_cost,
            usage.cost,
            usage.effective_cost,
            usage.waste_cost,
            currency,
        )
