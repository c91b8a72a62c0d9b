"""Reads of the finance pages and exports (design §8): the rate cards, monthly statements,
month-over-month trends, budget burn-down, the attempts behind a statement line and the rows
of an export. Who may read which tenant is ``finance.access``.

Every figure comes from ``DailyUsage``, the precomputed per-day rollup of attempt
accounting: a statement is one grouped query over one tenant's month, never a walk over
attempts. GPU time is kept in whole GPU-seconds; hours are Decimal GPU-seconds ÷ 3600.

Money follows one rule. A statement line is the GPU-seconds of one project, user, flavor
and cluster under one rate card in the month; its cost is those GPU-seconds × the card's
price, rounded once, half to even, to the cent (``costing.line_cost``), and so is its
effective cost. Every other figure (a breakdown line, a total, a month of the trend, an
export row) is a sum of such lines, so they all add up exactly.
"""

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import TruncMonth

from finance import costing
from finance.models import DailyUsage, RateCard, UsageRollupState
from jobs.models import Attempt
from telemetry.accounting import CATEGORIES, WASTE
from telemetry.selectors.gpu_seconds import CATEGORY_LABELS
from tenants.models import GpuFlavor, Quota, Tenant

SECONDS_PER_HOUR = Decimal(costing.SECONDS_PER_HOUR)
GPU_HOUR_PLACES = Decimal("0.000001")
ZERO_MONEY = Decimal("0.00")
TREND_MONTHS = 12
EXPORT_CHUNK_ROWS = 2000


def gpu_hours(gpu_seconds: int) -> Decimal:
    """GPU-seconds as GPU-hours, exact to the sixth decimal (half up)."""
    return (Decimal(gpu_seconds) / SECONDS_PER_HOUR).quantize(GPU_HOUR_PLACES, ROUND_HALF_UP)


def month_first_day(day: date) -> date:
    return day.replace(day=1)


def month_after(first_day: date) -> date:
    if first_day.month == 12:
        return first_day.replace(year=first_day.year + 1, month=1)
    return first_day.replace(month=first_day.month + 1)


def months_back(first_day: date, count: int) -> date:
    index = first_day.year * 12 + first_day.month - 1 - count
    return date(index // 12, index % 12 + 1, 1)


# The months a statement can be asked for. A statement page reaches TREND_MONTHS back and a
# month forward, so both ends stay inside what ``date`` can represent; GPU time before the
# Unix epoch does not exist.
EARLIEST_MONTH = date(1970, 1, 1)
LATEST_MONTH = date(9998, 12, 1)


def month_is_statable(first_day: date) -> bool:
    return EARLIEST_MONTH <= first_day <= LATEST_MONTH


def last_closed_month(today: date) -> date:
    """The first day of the month before ``today``'s: the latest month that is over, the one
    finance reviews."""
    return months_back(month_first_day(today), 1)


# --- amounts ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WasteShare:
    key: str
    label: str
    gpu_s: int

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_s)


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-seconds by category and cost of some DailyUsage rows, added up."""

    allocated_gpu_s: int = 0
    effective_gpu_s: int = 0
    lost_gpu_s: int = 0
    startup_gpu_s: int = 0
    checkpoint_gpu_s: int = 0
    idle_gpu_s: int = 0
    input_wait_gpu_s: int = 0
    comm_wait_gpu_s: int = 0
    unpriced_gpu_s: int = 0
    cost: Decimal = ZERO_MONEY
    effective_cost: Decimal = ZERO_MONEY

    @property
    def waste_gpu_s(self) -> int:
        return self.allocated_gpu_s - self.effective_gpu_s

    @property
    def waste_cost(self) -> Decimal:
        return self.cost - self.effective_cost

    @property
    def allocated_hours(self) -> Decimal:
        return gpu_hours(self.allocated_gpu_s)

    @property
    def effective_hours(self) -> Decimal:
        return gpu_hours(self.effective_gpu_s)

    @property
    def waste_hours(self) -> Decimal:
        return gpu_hours(self.waste_gpu_s)

    @property
    def unpriced_hours(self) -> Decimal:
        return gpu_hours(self.unpriced_gpu_s)

    @property
    def goodput_percent(self) -> Decimal | None:
        if not self.allocated_gpu_s:
            return None
        return Decimal(self.effective_gpu_s * 100) / Decimal(self.allocated_gpu_s)

    @property
    def waste_shares(self) -> list[WasteShare]:
        return [
            WasteShare(key=name, label=CATEGORY_LABELS[name], gpu_s=getattr(self, f"{name}_gpu_s"))
            for name in WASTE
        ]

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(**{name: getattr(self, name) + getattr(other, name) for name in _USAGE_FIELDS})


_USAGE_FIELDS = [item.name for item in fields(Usage)]
_GPU_FIELDS = [name for name in _USAGE_FIELDS if name.endswith("_gpu_s")]
# Annotations may not reuse the model's field names.
_GPU_SUMS = {f"sum_{name}": Sum(name) for name in _GPU_FIELDS}
# What makes a statement line: GPU-seconds of one project, user, flavor and cluster under one
# rate card (none: unpriced).
LINE_FIELDS = ("project_id", "user_id", "flavor_id", "cluster_id", "rate_card_id")
_PRICE = "rate_card__price_per_gpu_hour"


def _priced(row: Mapping[str, Any]) -> Usage:
    """A statement line from its grouped row: the GPU-seconds added up, the money rounded
    once."""
    seconds = {name: row[f"sum_{name}"] or 0 for name in _GPU_FIELDS}
    price = row[_PRICE]
    return Usage(
        **seconds,
        cost=costing.line_cost(gpu_s=seconds["allocated_gpu_s"], price_per_gpu_hour=price),
        effective_cost=costing.line_cost(
            gpu_s=seconds["effective_gpu_s"], price_per_gpu_hour=price
        ),
    )


def _lines(rows: QuerySet[DailyUsage], *group: str) -> Iterator[tuple[dict[str, Any], Usage]]:
    """The statement lines of ``rows``, each also grouped by the ``group`` lookups (and in
    their order): one grouped query, read as it streams."""
    lines = (
        rows.values(*group, *LINE_FIELDS, _PRICE)
        .annotate(**_GPU_SUMS)
        .order_by(*group, *LINE_FIELDS)
    )
    for row in lines.iterator(chunk_size=EXPORT_CHUNK_ROWS):
        yield row, _priced(row)


def _total(usages: Iterable[Usage]) -> Usage:
    return sum(usages, Usage())


# --- statements ---------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Statement:
    tenant: Tenant
    month: date  # the first day
    total: Usage
    breakdowns: dict[str, list[StatementLine]]  # by dimension name, in DIMENSIONS order

    @property
    def month_end(self) -> date:
        """The first day after the month."""
        return month_after(self.month)

    @property
    def last_day(self) -> date:
        return self.month_end - timedelta(days=1)


def _month_rows(*, tenant: Tenant, month: date) -> QuerySet[DailyUsage]:
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
    rows = _month_rows(tenant=tenant, month=month_first_day(month))
    return _total(usage for _, usage in _lines(rows))


def statement_month(*, tenant: Tenant, month: date) -> Statement:
    """The tenant's statement of the month starting ``month``: its lines in one query, the
    total and every breakdown added up from them."""
    month = month_first_day(month)
    lines = list(_lines(_month_rows(tenant=tenant, month=month), *_LABELS))
    return Statement(
        tenant=tenant,
        month=month,
        total=_total(usage for _, usage in lines),
        breakdowns={name: _breakdown(lines, name) for name in DIMENSIONS},
    )


def statement_line_total(*, tenant: Tenant, month: date, filters: dict[str, str]) -> Usage:
    """The usage of the statement lines that match ``filters`` (dimension name → key)."""
    rows = _month_rows(tenant=tenant, month=month_first_day(month)).filter(
        **{DIMENSIONS[name].key: value for name, value in filters.items()}
    )
    return _total(usage for _, usage in _lines(rows))


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
    for row, usage in _lines(rows, "tenant_id", "month"):
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
    for row, usage in _lines(rows, "month"):
        found[row["month"]] = found.get(row["month"], Usage()) + usage
    series, cursor = [], first
    for _ in range(months):
        series.append(MonthUsage(month=cursor, usage=found.get(cursor, Usage())))
        cursor = month_after(cursor)
    return series


# --- budget burn-down ---------------------------------------------------------------------


@dataclass(frozen=True)
class FlavorBurn:
    """One flavor's month: cumulative allocated GPU-hours per day against its budget."""

    flavor_slug: str
    flavor_name: str
    budget_gpu_hours: int | None
    budget_mode: str  # the label, or "" without a budget
    cumulative_hours: list[Decimal | None]  # per day of the month; None after ``as_of``
    used_gpu_s: int

    @property
    def used_hours(self) -> Decimal:
        return gpu_hours(self.used_gpu_s)

    @property
    def remaining_hours(self) -> Decimal | None:
        if self.budget_gpu_hours is None:
            return None
        return Decimal(self.budget_gpu_hours) - self.used_hours

    @property
    def used_percent(self) -> Decimal | None:
        if not self.budget_gpu_hours:
            return None
        return self.used_hours * 100 / Decimal(self.budget_gpu_hours)


@dataclass(frozen=True)
class BurnDown:
    days: list[date]
    flavors: list[FlavorBurn] = field(default_factory=list)

    @property
    def budgeted(self) -> list[FlavorBurn]:
        return [burn for burn in self.flavors if burn.budget_gpu_hours is not None]

    @property
    def budget_total_hours(self) -> int:
        """The sum of the tenant's monthly budgets: GPU-hours of every budgeted flavor."""
        return sum(burn.budget_gpu_hours or 0 for burn in self.budgeted)

    @property
    def used_in_budgets_hours(self) -> Decimal:
        return sum((burn.used_hours for burn in self.budgeted), Decimal(0))


def budget_burn_down(*, tenant: Tenant, month: date, as_of: date) -> BurnDown:
    """Per flavor with a monthly budget or usage in the month: allocated GPU-hours added up
    day by day, up to ``as_of`` (later days have no value yet). One grouped query for the
    usage and one for the quotas."""
    month = month_first_day(month)
    end = month_after(month)
    days = [month + timedelta(days=n) for n in range((end - month).days)]
    used: dict[str, dict[date, int]] = defaultdict(dict)
    names: dict[str, str] = {}
    rows = (
        _month_rows(tenant=tenant, month=month)
        .values("flavor__slug", "flavor__name", "date")
        .annotate(gpu_s=Sum("allocated_gpu_s"))
        .order_by("flavor__slug", "date")
    )
    for row in rows:
        used[row["flavor__slug"]][row["date"]] = row["gpu_s"]
        names[row["flavor__slug"]] = row["flavor__name"]
    budgets = {}
    for quota in Quota.objects.filter(
        tenant=tenant, monthly_gpu_hour_budget__isnull=False
    ).select_related("flavor"):
        budgets[quota.flavor.slug] = quota
        names[quota.flavor.slug] = quota.flavor.name
    flavors = []
    for slug in sorted(names):
        running, cumulative = 0, []
        for day in days:
            running += used[slug].get(day, 0)
            cumulative.append(gpu_hours(running) if day <= as_of else None)
        budget = budgets.get(slug)
        flavors.append(
            FlavorBurn(
                flavor_slug=slug,
                flavor_name=names[slug],
                budget_gpu_hours=budget.monthly_gpu_hour_budget if budget else None,
                budget_mode=budget.get_budget_mode_display() if budget else "",
                cumulative_hours=cumulative,
                used_gpu_s=sum(used[slug].values()),
            )
        )
    return BurnDown(days=days, flavors=flavors)


def usage_rolled_up_until() -> datetime | None:
    """Accounting computed up to this moment is in the statements."""
    return UsageRollupState.objects.values_list("accounted_until", flat=True).first()


# --- drill-down ---------------------------------------------------------------------------


# Large texts the drill-down does not show.
_DRILL_DOWN_DEFERRED = (
    "rendered_spec",
    "failure_message",
    "backend_error",
    "runtime_env",
    "node_list",
    "gpu_uuids",
    "run__wait_message",
    "run__experiment__command",
    "run__experiment__params",
    "run__experiment__env",
)


def statement_attempts(
    *, tenant: Tenant, month: date, filters: dict[str, str]
) -> QuerySet[Attempt]:
    """The accounted attempts behind the statement lines that ``filters`` (dimension name →
    key) pick: the tenant's attempts with GPU time in the month, as the rollup cuts them
    (an attempt over [start, end) counts in the months it overlaps; one of no length, in
    the month it started). Ordered by start."""
    month = month_first_day(month)
    lo, hi = costing.midnight(month), costing.midnight(month_after(month))
    return (
        Attempt.objects.filter(
            run__tenant=tenant,
            accounting__isnull=False,
            started_at__lt=hi,
            finished_at__isnull=False,
        )
        .filter(Q(finished_at__gt=lo) | Q(started_at__gte=lo))
        .filter(**{DIMENSIONS[name].attempt_lookup: value for name, value in filters.items()})
        .select_related(
            "accounting",
            "cluster",
            "run__flavor",
            "run__submitted_by",
            "run__experiment__project",
        )
        .defer(*_DRILL_DOWN_DEFERRED)
        .order_by("started_at", "pk")
    )


@dataclass(frozen=True, slots=True)
class AttemptInMonth:
    """An attempt behind a statement line: its whole accounting, and the part of its GPU
    time that falls in the month (what the statement counts), with its cost as if it were
    alone on a line. The line itself is rounded once over all its attempts, so the
    attempts' costs can differ from it by their rounding."""

    attempt: Attempt
    month_allocated_gpu_s: int
    month_cost: Decimal
    unpriced_gpu_s: int

    @property
    def month_allocated_hours(self) -> Decimal:
        return gpu_hours(self.month_allocated_gpu_s)

    @property
    def allocated_hours(self) -> Decimal:
        return gpu_hours(self.attempt.accounting.allocated_gpu_s)

    @property
    def effective_hours(self) -> Decimal:
        return gpu_hours(self.attempt.accounting.effective_gpu_s)

    @property
    def waste_hours(self) -> Decimal:
        return gpu_hours(self.attempt.accounting.waste_gpu_s)


def attempts_in_month(*, attempts: list[Attempt], month: date) -> list[AttemptInMonth]:
    """The month's share of each attempt, cut and priced as the rollup does
    (``costing.split_attempt``); one query for the rate cards."""
    month = month_first_day(month)
    end = month_after(month)
    rates = rate_cards_for(attempt.run.flavor_id for attempt in attempts)
    result = []
    for attempt in attempts:
        account = attempt.accounting
        # Only ended attempts have accounting: both times are known.
        assert attempt.started_at is not None and attempt.finished_at is not None
        shares = costing.split_attempt(
            start=attempt.started_at,
            end=attempt.finished_at,
            gpu_seconds={name: getattr(account, f"{name}_gpu_s") for name in CATEGORIES},
            rates=rates.get(attempt.run.flavor_id, ()),
        )
        inside = [share for share in shares if month <= share.day < end]
        result.append(
            AttemptInMonth(
                attempt=attempt,
                month_allocated_gpu_s=sum(share.allocated_gpu_s for share in inside),
                month_cost=costing.shares_cost(inside),
                unpriced_gpu_s=sum(share.unpriced_gpu_s for share in inside),
            )
        )
    return result


# --- rate cards ---------------------------------------------------------------------------


def rate_cards_for(flavor_ids: Iterable[int]) -> dict[int, list[costing.Rate]]:
    """Each flavor's cards as plain rates."""
    rates: dict[int, list[costing.Rate]] = defaultdict(list)
    for card in RateCard.objects.filter(flavor_id__in=set(flavor_ids)):
        rates[card.flavor_id].append(
            costing.Rate(
                valid_from=costing.midnight(card.valid_from),
                valid_to=costing.midnight(card.valid_to) if card.valid_to else None,
                price_per_gpu_hour=card.price_per_gpu_hour,
                card_id=card.pk,
            )
        )
    return rates


def platform_currency() -> str | None:
    """The currency of the rate cards: one for the whole platform, so every statement
    adds up in one unit. None before the first card."""
    return RateCard.objects.order_by("pk").values_list("currency", flat=True).first()


@dataclass(frozen=True)
class FlavorRates:
    """A flavor's rate cards, the newest first, and the one in force on the day asked."""

    flavor: GpuFlavor
    cards: list[RateCard]
    current: RateCard | None


def rate_cards_by_flavor(*, today: date) -> list[FlavorRates]:
    """Every flavor, with or without cards: two queries."""
    cards: dict[int, list[RateCard]] = defaultdict(list)
    for card in RateCard.objects.select_related("created_by").order_by("flavor_id", "-valid_from"):
        cards[card.flavor_id].append(card)
    result = []
    for flavor in GpuFlavor.objects.order_by("slug"):
        history = cards.get(flavor.pk, [])
        current = next(
            (
                card
                for card in history
                if card.valid_from <= today and (card.valid_to is None or today < card.valid_to)
            ),
            None,
        )
        result.append(FlavorRates(flavor=flavor, cards=history, current=current))
    return result


# --- exports ------------------------------------------------------------------------------

EXPORT_COLUMNS = (
    "from", "to", "tenant", "project", "user", "flavor", "cluster", "price_per_gpu_hour",
    "allocated_gpu_h", "effective_gpu_h", *(f"{name}_gpu_h" for name in WASTE),
    "unpriced_gpu_h", "cost", "effective_cost", "waste_cost", "currency",
)  # fmt: skip
_EXPORT_NAMES = (
    "tenant__slug", "project__slug", "user__username", "flavor__slug", "cluster__name",
    "rate_card__valid_from",
)  # fmt: skip


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
    for row, usage in _lines(rows, "month", *_EXPORT_NAMES):
        month = row["month"]
        yield (
            max(first_day, month),
            min(last_day, month_after(month) - timedelta(days=1)),
            *(row[name] for name in _EXPORT_NAMES[:-1]),
            row[_PRICE],
            *(gpu_hours(getattr(usage, name)) for name in _GPU_FIELDS),
            usage.cost,
            usage.effective_cost,
            usage.waste_cost,
            currency,
        )
