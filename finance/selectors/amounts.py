"""GPU time and money of ``DailyUsage`` rows added up: a statement line is priced once,
every other figure is a sum of lines (the rule of ``finance.selectors``)."""

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import QuerySet, Sum

from finance import costing
from finance.models import DailyUsage
from telemetry.accounting import WASTE
from telemetry.models import CREDITED_CAUSES
from telemetry.selectors.gpu_seconds import CATEGORY_LABELS

SECONDS_PER_HOUR = Decimal(costing.SECONDS_PER_HOUR)
GPU_HOUR_PLACES = Decimal("0.000001")
ZERO_MONEY = Decimal("0.00")
EXPORT_CHUNK_ROWS = 2000


def gpu_hours(gpu_seconds: int) -> Decimal:
    """GPU-seconds as GPU-hours, exact to the sixth decimal (half up)."""
    return (Decimal(gpu_seconds) / SECONDS_PER_HOUR).quantize(GPU_HOUR_PLACES, ROUND_HALF_UP)


@dataclass(frozen=True, slots=True)
class WasteShare:
    key: str
    label: str
    gpu_s: int

    @property
    def gpu_hours(self) -> Decimal:
        return gpu_hours(self.gpu_s)


@dataclass(frozen=True, slots=True)
class Credit:
    """GPU time credited for one cause (hardware or platform) and its amount."""

    cause: str
    label: str
    gpu_s: int
    amount: Decimal

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
    interactive_idle_gpu_s: int = 0
    idle_gpu_s: int = 0
    input_wait_gpu_s: int = 0
    comm_wait_gpu_s: int = 0
    unpriced_gpu_s: int = 0
    credited_hardware_gpu_s: int = 0
    credited_platform_gpu_s: int = 0
    cost: Decimal = ZERO_MONEY  # of the allocation: charged_cost + the credited amounts
    effective_cost: Decimal = ZERO_MONEY
    charged_cost: Decimal = ZERO_MONEY
    credited_hardware_cost: Decimal = ZERO_MONEY
    credited_platform_cost: Decimal = ZERO_MONEY

    @property
    def credited_gpu_s(self) -> int:
        return self.credited_hardware_gpu_s + self.credited_platform_gpu_s

    @property
    def charged_gpu_s(self) -> int:
        return self.allocated_gpu_s - self.credited_gpu_s

    @property
    def credited_cost(self) -> Decimal:
        return self.credited_hardware_cost + self.credited_platform_cost

    @property
    def charged_hours(self) -> Decimal:
        return gpu_hours(self.charged_gpu_s)

    @property
    def credited_hours(self) -> Decimal:
        return gpu_hours(self.credited_gpu_s)

    @property
    def credits(self) -> list["Credit"]:
        """The credited GPU-seconds and amounts per cause, the causes with none left out."""
        return [
            Credit(
                cause=cause.value,
                label=cause.label,
                gpu_s=getattr(self, f"credited_{cause.value}_gpu_s"),
                amount=getattr(self, f"credited_{cause.value}_cost"),
            )
            for cause in CREDITED_CAUSES
            if getattr(self, f"credited_{cause.value}_gpu_s")
        ]

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
GPU_FIELDS = [name for name in _USAGE_FIELDS if name.endswith("_gpu_s")]
# Annotations may not reuse the model's field names.
_GPU_SUMS = {f"sum_{name}": Sum(name) for name in GPU_FIELDS}
# What makes a statement line: GPU-seconds of one project, user, flavor and cluster under one
# rate card (none: unpriced).
LINE_FIELDS = ("project_id", "user_id", "flavor_id", "cluster_id", "rate_card_id")
# The price of a line's rate card (None: unpriced), as the grouped rows name it.
PRICE = "rate_card__price_per_gpu_hour"


def _priced(row: Mapping[str, Any]) -> Usage:
    """A statement line from its grouped row: the GPU-seconds added up, the money rounded
    once."""
    seconds = {name: row[f"sum_{name}"] or 0 for name in GPU_FIELDS}
    price = row[PRICE]
    credited = [seconds[f"credited_{cause.value}_gpu_s"] for cause in CREDITED_CAUSES]
    charged, amounts = costing.line_costs(
        charged_gpu_s=seconds["allocated_gpu_s"] - sum(credited),
        credited_gpu_s=credited,
        price_per_gpu_hour=price,
    )
    values: dict[str, Any] = {
        **seconds,
        "cost": charged + sum(amounts, ZERO_MONEY),  # = line_cost of the allocation, exactly
        "effective_cost": costing.line_cost(
            gpu_s=seconds["effective_gpu_s"], price_per_gpu_hour=price
        ),
        "charged_cost": charged,
    }
    for cause, amount in zip(CREDITED_CAUSES, amounts, strict=True):
        values[f"credited_{cause.value}_cost"] = amount
    return Usage(**values)


def usage_lines(rows: QuerySet[DailyUsage], *group: str) -> Iterator[tuple[dict[str, Any], Usage]]:
    """The statement lines of ``rows``, each also grouped by the ``group`` lookups (and in
    their order): one grouped query, read as it streams."""
    lines = (
        rows.values(*group, *LINE_FIELDS, PRICE)
        .annotate(**_GPU_SUMS)
        .order_by(*group, *LINE_FIELDS)
    )
    for row in lines.iterator(chunk_size=EXPORT_CHUNK_ROWS):
        yield row, _priced(row)


def usage_total(usages: Iterable[Usage]) -> Usage:
    """The sum of ``usages``; zero for none."""
    return sum(usages, Usage())
