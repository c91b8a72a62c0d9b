"""Reads of the cost a month has accrued beyond its statement: the GPU time of attempts
that are not in DailyUsage yet (still running, or ended but not rolled up), up to now.

A statement counts an attempt once it has ended and its accounting is rolled up; until then
an open month would read less than it has cost (16 GPUs running for a day read 0.00). The
accrual closes that gap: each such attempt's GPUs × the whole seconds it has held them in
the month up to ``now`` (from the project's clock), cut at UTC midnights and rate changes
and priced by the same rule as a statement line (``costing``): GPU-seconds of one project,
user, flavor, cluster and rate card × the price, rounded once, half to even, to the cent.
It has no waste categories yet (accounting computes them when the attempt ends).
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.db.models import Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from finance import costing
from finance.models import UsageRollupState
from finance.selectors.amounts import ZERO_MONEY, gpu_hours
from finance.selectors.months import month_after, month_first_day
from finance.selectors.rate_cards import rate_cards_for
from finance.selectors.statements import TenantMonths, tenant_month_overview
from jobs.models import LIVE_ATTEMPT_STATES, Attempt
from tenants.models import Tenant

# Before any rollup, every ended attempt is outside the statements.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Accrual:
    """What a tenant's attempts outside the statement have cost in the month so far."""

    attempts: int = 0
    gpu_s: int = 0
    unpriced_gpu_s: int = 0
    cost: Decimal = ZERO_MONEY

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_s)


def _outside_statement() -> Q:
    """Attempts DailyUsage does not hold yet: live ones, and ended ones whose accounting is
    missing or newer than what the rollup has taken in (read in the same query)."""
    rolled_up_until = Coalesce(
        Subquery(UsageRollupState.objects.values("accounted_until")[:1]), Value(EPOCH)
    )
    return (
        Q(finished_at__isnull=True, state__in=LIVE_ATTEMPT_STATES)
        | Q(finished_at__isnull=False, accounting__isnull=True)
        | Q(finished_at__isnull=False, accounting__computed_at__gt=rolled_up_until)
    )


def accrual_by_tenant(
    *, tenants: QuerySet[Tenant] | Iterable[Tenant], month: date, now: datetime
) -> dict[int, Accrual]:
    """Per tenant id (only those with such attempts), the accrual of the month starting
    ``month`` up to ``now``. One query for the attempts (``tenants`` as a subquery when it
    is a queryset), and one for the rate cards when there are any."""
    month = month_first_day(month)
    lo = costing.midnight(month)
    hi = min(costing.midnight(month_after(month)), now)
    if hi <= lo:
        return {}
    rows = list(
        Attempt.objects.filter(
            _outside_statement(),
            run__tenant__in=tenants,
            started_at__isnull=False,
            started_at__lt=hi,
        )
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=lo))
        .values_list(
            "run__tenant_id",
            "run__experiment__project_id",
            "run__submitted_by_id",
            "run__flavor_id",
            "cluster_id",
            "run__gpus",
            "started_at",
            "finished_at",
        )
        .order_by("pk")
    )
    if not rows:
        return {}
    rates = rate_cards_for(row[3] for row in rows)
    lines: dict[tuple, int] = {}
    prices: dict[int, Decimal] = {}
    attempts: dict[int, int] = {}
    for tenant, project, user, flavor, cluster, gpus, started, finished in rows:
        assert started is not None  # filtered so; said for the checker
        start: datetime = max(started, lo)
        seconds = int((min(finished or hi, hi) - start).total_seconds())
        if seconds <= 0:
            continue
        attempts[tenant] = attempts.get(tenant, 0) + 1
        shares = costing.split_attempt(
            start=start,
            end=start + timedelta(seconds=seconds),
            gpu_seconds={"effective": gpus * seconds},
            rates=rates.get(flavor, ()),
        )
        for share in shares:
            card = share.rate.card_id if share.rate is not None else None
            if share.rate is not None and card is not None:
                prices[card] = share.rate.price_per_gpu_hour
            key = (tenant, project, user, flavor, cluster, card)
            lines[key] = lines.get(key, 0) + share.allocated_gpu_s
    found: dict[int, Accrual] = {}
    for (tenant, *_, card), gpu_s in lines.items():
        price = prices.get(card) if card is not None else None
        before = found.get(tenant, Accrual(attempts=attempts[tenant]))
        found[tenant] = Accrual(
            attempts=before.attempts,
            gpu_s=before.gpu_s + gpu_s,
            unpriced_gpu_s=before.unpriced_gpu_s + (gpu_s if price is None else 0),
            cost=before.cost + costing.line_cost(gpu_s=gpu_s, price_per_gpu_hour=price),
        )
    return found


def accrual_month(*, tenant: Tenant, month: date, now: datetime) -> Accrual:
    """The tenant's accrual of the month starting ``month`` up to ``now``."""
    return accrual_by_tenant(tenants=[tenant], month=month, now=now).get(tenant.pk, Accrual())


@dataclass(frozen=True, slots=True)
class TenantMonthSoFar:
    """A tenant's last closed month and open month, with what the open month has accrued
    beyond its statement."""

    row: TenantMonths
    accrual: Accrual

    @property
    def accrued_cost(self) -> Decimal:
        return self.row.to_date.charged_cost + self.accrual.cost


def tenant_month_overview_accrued(
    *, tenants: QuerySet[Tenant], closed_month: date, current_month: date, now: datetime
) -> list[TenantMonthSoFar]:
    """``selectors.tenant_month_overview`` with each open month's accrual up to ``now``."""
    accrued = accrual_by_tenant(tenants=tenants, month=current_month, now=now)
    return [
        TenantMonthSoFar(row=row, accrual=accrued.get(row.tenant.pk, Accrual()))
        for row in tenant_month_overview(
            tenants=tenants, closed_month=closed_month, current_month=current_month
        )
    ]
