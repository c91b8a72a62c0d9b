"""What a replay or the record of a window delivered, per tenant and in total
(``jobs.replay``): queue times, GPU-hours, budgets, preemptions, utilisation, one definition
for the observed outcome and the replayed one.

Pure: no ORM, no clock, no I/O.
"""

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from jobs.admission_types import Quota
from jobs.calendar import month_start, next_month
from jobs.replay_types import BudgetBurn, History, Key, Outcome, TenantOutcome


@dataclass
class RunRecord:
    """One run's part in an outcome, observed or replayed."""

    tenant: str
    flavor: str
    gpus: int
    counted: bool  # submitted in the window: its queue time counts
    queued_s: float = 0.0
    started: bool = False
    held: list[tuple[float, float]] = field(default_factory=list)
    preemptions: int = 0
    lost_gpu_s: float = 0.0


def month_starts(start: float, end: float) -> list[float]:
    """The starts of the calendar months (UTC) the window touches, the first at or before
    ``start``."""
    month = month_start(datetime.fromtimestamp(start, UTC))
    starts = [month.timestamp()]
    while (month := next_month(month)).timestamp() < end:
        starts.append(month.timestamp())
    return starts


def by_month(months: list[float], since: float, until: float) -> Iterable[tuple[int, float]]:
    """(index in ``months``, seconds) of [since, until) in each month it touches, in order
    (``months`` as ``month_starts`` gives them; before the first counts in the first)."""
    index = max(0, bisect.bisect_right(months, since) - 1)
    while since < until:
        # months[index] <= since < months[index + 1]: every part is longer than 0
        stop = months[index + 1] if index + 1 < len(months) else math.inf
        yield index, min(stop, until) - since
        since, index = min(stop, until), index + 1


def nearest_rank(values: list[float], share: float) -> float | None:
    """The smallest value that at least ``share`` of ``values`` do not exceed."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def outcome_of(
    history: History,
    quotas: Mapping[Key, Quota],
    records: list[RunRecord],
    *,
    capacity_gpus: int,
) -> Outcome:
    start, end = history.start, history.end
    months = month_starts(start, end)
    by_tenant: dict[str, list[RunRecord]] = defaultdict(list)
    for record in records:
        by_tenant[record.tenant].append(record)
    for tenant, _ in quotas:
        by_tenant.setdefault(tenant, [])
    tenants = []
    for tenant, runs in sorted(by_tenant.items()):
        held_s = 0.0
        month_used: dict[tuple[str, int], float] = defaultdict(float)
        for record in runs:
            for since, until in record.held:
                since, until = max(since, start), min(until, end)
                if until > since:
                    held_s += record.gpus * (until - since)
                    for month, seconds in by_month(months, since, until):
                        month_used[(record.flavor, month)] += record.gpus * seconds
        counted = [r for r in runs if r.counted]
        waits = [r.queued_s for r in counted]
        budgets = []
        for (of_tenant, flavor), quota in sorted(quotas.items()):
            if of_tenant != tenant or quota.budget_gpu_hours is None:
                continue
            for index, month_began in enumerate(months):
                used = month_used.get((flavor, index), 0.0) / 3600
                if index == 0:
                    used += history.budget_used.get((tenant, flavor), 0.0)
                budgets.append(
                    BudgetBurn(
                        flavor=flavor,
                        month=datetime.fromtimestamp(month_began, UTC).strftime("%Y-%m"),
                        used_gpu_hours=used,
                        budget_gpu_hours=float(quota.budget_gpu_hours),
                        hard=quota.budget_hard,
                    )
                )
        tenants.append(
            TenantOutcome(
                tenant=tenant,
                runs=len(counted),
                started=sum(1 for r in counted if r.started),
                not_started=sum(1 for r in counted if not r.started),
                queue_p50_s=nearest_rank(waits, 0.5),
                queue_p95_s=nearest_rank(waits, 0.95),
                gpu_hours=held_s / 3600,
                preemptions=sum(r.preemptions for r in runs),
                lost_gpu_hours=sum(r.lost_gpu_s for r in runs) / 3600,
                budgets=tuple(budgets),
            )
        )
    capacity = capacity_gpus * history.seconds
    return Outcome(
        start=start,
        end=end,
        tenants=tuple(tenants),
        capacity_gpu_hours=capacity / 3600,
        gpu_hours=sum(t.gpu_hours for t in tenants),
        runs=sum(t.runs for t in tenants),
        started=sum(t.started for t in tenants),
        not_started=sum(t.not_started for t in tenants),
        preemptions=sum(t.preemptions for t in tenants),
        lost_gpu_hours=sum(t.lost_gpu_hours for t in tenants),
    )
