"""A tenant's month against its budgets: charged GPU-hours (allocated less what was credited
for hardware and platform failures, as the budget ledger counts them) added up day by day,
per flavor."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from django.db.models import F, Sum

from finance.selectors.amounts import gpu_hours
from finance.selectors.months import month_after, month_first_day
from finance.selectors.statements import month_rows
from tenants.models import Quota, Tenant


@dataclass(frozen=True)
class FlavorBurn:
    """One flavor's month: cumulative charged GPU-hours per day against its budget."""

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
    """Per flavor with a monthly budget or usage in the month: charged GPU-hours added up
    day by day (budgets do not burn on credited hours), up to ``as_of`` (later days have no
    value yet). One grouped query for the usage and one for the quotas."""
    month = month_first_day(month)
    end = month_after(month)
    days = [month + timedelta(days=n) for n in range((end - month).days)]
    used: dict[str, dict[date, int]] = defaultdict(dict)
    names: dict[str, str] = {}
    rows = (
        month_rows(tenant=tenant, month=month)
        .values("flavor__slug", "flavor__name", "date")
        .annotate(
            gpu_s=Sum(
                F("allocated_gpu_s") - F("credited_hardware_gpu_s") - F("credited_platform_gpu_s")
            )
        )
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
