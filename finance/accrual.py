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
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.db.models import Q

from finance import costing
from finance.selectors import (
    ZERO_MONEY,
    gpu_hours,
    month_after,
    month_first_day,
    rate_cards_for,
    usage_rolled_up_until,
)
from jobs.models import LIVE_ATTEMPT_STATES, Attempt
from tenants.models import Tenant


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


def _outside_statement(rolled_up_until: datetime | None) -> Q:
    """Attempts DailyUsage does not hold yet: live ones, and ended ones whose accounting is
    missing or newer than what the rollup has taken in."""
    ended_not_rolled_up = Q(finished_at__isnull=False) & Q(accounting__isnull=True)
    if rolled_up_until is None:
        ended_not_rolled_up |= Q(finished_at__isnull=False)
    else:
        ended_not_rolled_up |= Q(
            finished_at__isnull=False, accounting__computed_at__gt=rolled_up_until
        )
    return Q(finished_at__isnull=True, state__in=LIVE_ATTEMPT_STATES) | ended_not_rolled_up


def accrual_by_tenant(
    *, tenants: Iterable[Tenant], month: date, now: datetime
) -> dict[int, Accrual]:
    """Per tenant id (only those with such attempts), the accrual of the month starting
    ``month`` up to ``now``. Two queries: the attempts and the rate cards."""
    month = month_first_day(month)
    lo = costing.midnight(month)
    hi = min(costing.midnight(month_after(month)), now)
    if hi <= lo:
        return {}
    rows = list(
        Attempt.objects.filter(
            _outside_statement(usage_rolled_up_until()),
            run__tenant__in=list(tenants),
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
    rates = rate_cards_for(row[3] for row in rows)
    lines: dict[tuple, int] = {}
    prices: dict[int, Decimal] = {}
    attempts: dict[int, int] = {}
    for tenant, project, user, flavor, cluster, gpus, started, finished in rows:
        start = max(started, lo)
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
