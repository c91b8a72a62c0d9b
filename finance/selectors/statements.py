"""A tenant's monthly statement, its breakdowns, the month-over-month trend, every
tenant's last closed month and month so far, and how far the rollup has got."""

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.db.models.functions import TruncMonth

from finance.models import DailyUsage, UsageRollupState
from finance.selectors.amounts import Credit, Usage, usage_lines, usage_total
from finance.selectors.months import TREND_MONTHS, month_after, month_first_day, months_back
from telemetry.models import CREDITED_CAUSES
from tenants.models import Tenant


@dataclass(frozen=True, slots=True)
class Dimension:
    """A breakdown of a statement: the DailyUsage columns that name a line and the
    lookup that finds the attempts behind it."""

    name: str
    title: str
    key: str  # DailyUsage lookup of the value the drill-down filters by
    label: str  # DailyUsage lookup of what the line shows
    attempt_lookup: str


DIMENSIONS = {
    dimension.name: dimension
    for dimension in (
        Dimension("project", "Project", "project__slug", "project__name",
                  "run__experiment__project__slug"),
        Dimension("user", "User", "user__username", "user__username",
                  "run__submitted_by__username"),
        Dimension("flavor", "Flavor", "flavor__slug", "flavor__name", "run__flavor__slug"),
        Dimension("cluster", "Cluster", "cluster__name", "cluster__name", "cluster__name"),
    )
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class StatementLine:
    dimension: str
    key: str
    label: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class CreditLine:
    """A statement line's GPU time credited for one cause: what the line names, and the
    cause class only (its evidence, which may name nodes other tenants use, is not here)."""

    project: str
    user: str
    flavor: str
    cluster: str
    credit: Credit


@dataclass(frozen=True)
class Statement:
    tenant: Tenant
    month: date  # the first day
    total: Usage
    breakdowns: dict[str, list[StatementLine]]  # by dimension name, in DIMENSIONS order
    credits: list[CreditLine] = field(default_factory=list)  # the credited lines, by cause

    @property
    def month_end(self) -> date:
        """The first day after the month."""
        return month_after(self.month)

    @property
    def last_day(self) -> date:
        return self.month_end - timedelta(days=1)


def month_rows(*, tenant: Tenant, month: date) -> QuerySet[DailyUsage]:
    return DailyUsage.objects.filter(tenant=tenant, date__gte=month, date__lt=month_after(month))


_LABELS = tuple(
    dict.fromkeys(name for spec in DIMENSIONS.values() for name in (spec.key, spec.label))
)


def _breakdown(lines: list[tuple[dict[str, Any], Usage]], dimension: str) -> list[StatementLine]:
    """The statement lines added up per value of ``dimension``, the costliest first."""
    spec = DIMENSIONS[dimension]
    found: dict[tuple[str, str], Usage] = {}
    for row, usage in lines:
        value = (row[spec.key], row[spec.label])
        found[value] = found.get(value, Usage()) + usage
    ordered = sorted(
        found.items(), key=lambda item: (-item[1].cost, -item[1].allocated_gpu_s, item[0][0])
    )
    return [
        StatementLine(dimension=dimension, key=key, label=label, usage=usage)
        for (key, label), usage in ordered
    ]


def statement_total(*, tenant: Tenant, month: date) -> Usage:
    """The month's total: the sum of its statement lines."""
    rows = month_rows(tenant=tenant, month=month_first_day(month))
    return usage_total(usage for _, usage in usage_lines(rows))


def statement_month(*, tenant: Tenant, month: date) -> Statement:
    """The tenant's statement of the month starting ``month``: its lines in one query, the
    total and every breakdown added up from them."""
    month = month_first_day(month)
    lines = list(usage_lines(month_rows(tenant=tenant, month=month), *_LABELS))
    return Statement(
        tenant=tenant,
        month=month,
        total=usage_total(usage for _, usage in lines),
        breakdowns={name: _breakdown(lines, name) for name in DIMENSIONS},
        credits=_credit_lines(lines),
    )


def _credit_lines(lines: list[tuple[dict[str, Any], Usage]]) -> list[CreditLine]:
    """The credited part of every statement line, per cause, hardware first, then by
    project, user, flavor and cluster: read from the lines already fetched."""
    found = [
        CreditLine(
            project=row[DIMENSIONS["project"].label],
            user=row[DIMENSIONS["user"].label],
            flavor=row[DIMENSIONS["flavor"].label],
            cluster=row[DIMENSIONS["cluster"].label],
            credit=credit,
        )
        for row, usage in lines
        for credit in usage.credits
    ]
    causes = [cause.value for cause in CREDITED_CAUSES]
    return sorted(
        found,
        key=lambda line: (
            causes.index(line.credit.cause),
            line.project,
            line.user,
            line.flavor,
            line.cluster,
        ),
    )


def statement_line_total(*, tenant: Tenant, month: date, filters: dict[str, str]) -> Usage:
    """The usage of the statement lines that match ``filters`` (dimension name → key)."""
    rows = month_rows(tenant=tenant, month=month_first_day(month)).filter(
        **{DIMENSIONS[name].key: value for name, value in filters.items()}
    )
    return usage_total(usage for _, usage in usage_lines(rows))


@dataclass(frozen=True, slots=True)
class TenantMonths:
    """A tenant's totals of the last closed month and of the month so far."""

    tenant: Tenant
    closed: Usage
    to_date: Usage


def tenant_month_overview(
    *, tenants: QuerySet[Tenant], closed_month: date, current_month: date
) -> list[TenantMonths]:
    """Per tenant (in ``tenants``' order), its usage of ``closed_month`` and of
    ``current_month``: one grouped query."""
    rows = DailyUsage.objects.filter(
        tenant__in=tenants, date__gte=closed_month, date__lt=month_after(current_month)
    ).annotate(month=TruncMonth("date"))
    found: dict[tuple[int, date], Usage] = {}
    for row, usage in usage_lines(rows, "tenant_id", "month"):
        key = (row["tenant_id"], row["month"])
        found[key] = found.get(key, Usage()) + usage
    return [
        TenantMonths(
            tenant=tenant,
            closed=found.get((tenant.pk, closed_month), Usage()),
            to_date=found.get((tenant.pk, current_month), Usage()),
        )
        for tenant in tenants
    ]


@dataclass(frozen=True, slots=True)
class MonthUsage:
    month: date
    usage: Usage


def usage_by_month(
    *, tenant: Tenant, last_month: date, months: int = TREND_MONTHS
) -> list[MonthUsage]:
    """The tenant's usage per month over the ``months`` months ending with ``last_month``,
    months without usage included, oldest first: one grouped query."""
    last_month = month_first_day(last_month)
    first = months_back(last_month, months - 1)
    rows = DailyUsage.objects.filter(
        tenant=tenant, date__gte=first, date__lt=month_after(last_month)
    ).annotate(month=TruncMonth("date"))
    found: dict[date, Usage] = {}
    for row, usage in usage_lines(rows, "month"):
        found[row["month"]] = found.get(row["month"], Usage()) + usage
    series, cursor = [], first
    for _ in range(months):
        series.append(MonthUsage(month=cursor, usage=found.get(cursor, Usage())))
        cursor = month_after(cursor)
    return series


def usage_rolled_up_until() -> datetime | None:
    """Accounting computed up to this moment is in the statements."""
    return UsageRollupState.objects.values_list("accounted_until", flat=True).first()
