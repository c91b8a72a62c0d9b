"""The attempts behind a statement line, each with the share of its GPU time and cost that
falls in the month."""

from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from django.db.models import Q, QuerySet

from finance import costing
from finance.selectors.amounts import gpu_hours
from finance.selectors.months import month_after, month_first_day
from finance.selectors.rate_cards import rate_cards_for
from finance.selectors.statements import DIMENSIONS
from jobs.models import Attempt
from telemetry.accounting import CATEGORIES
from tenants.models import Tenant

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
