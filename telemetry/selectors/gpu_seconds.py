"""GPU-seconds per accounting category, of one attempt or summed over several, and the
sums that build them in the ORM (``ACCOUNTING_SUMS``) and in hand-written SQL
(``RUN_SUM_COLUMNS``)."""

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from django.db.models import Count, Sum

from jobs.durations import duration_text
from telemetry import accounting

SECONDS_PER_HOUR = 3600
CATEGORY_LABELS = {
    "effective": "Effective",
    "lost": "Lost work",
    "startup": "Startup",
    "checkpoint": "Checkpointing",
    "interactive_idle": "Interactive idle",
    "idle": "Idle",
    "input_wait": "Input wait",
    "comm_wait": "Communication wait",
}


def _percent(part: float, whole: float) -> float | None:
    return part * 100 / whole if whole else None


@dataclass(frozen=True, slots=True)
class CategoryShare:
    key: str  # effective or one of accounting.WASTE
    label: str
    gpu_s: int
    percent: float | None  # of allocated

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class GpuSeconds:
    """Accounting of one attempt or summed over several: whole GPU-seconds per category
    (``effective + Σ waste == allocated``), activity-weighted GPU-seconds, queue seconds."""

    allocated: int = 0
    effective: int = 0
    lost: int = 0
    startup: int = 0
    checkpoint: int = 0
    interactive_idle: int = 0
    idle: int = 0
    input_wait: int = 0
    comm_wait: int = 0
    activity_weighted: float = 0.0
    queue_s: float | None = None
    attempts: int = 0

    @classmethod
    def from_sums(cls, sums: Mapping[str, Any]) -> "GpuSeconds":
        """From the ``ACCOUNTING_SUMS`` of an aggregate query (None where nothing summed)."""
        return cls(
            **{name: sums[name] or 0 for name in ("allocated", *accounting.CATEGORIES)},
            activity_weighted=sums["activity_weighted"] or 0.0,
            queue_s=sums["queue_s"],
            attempts=sums["attempts"],
        )

    def __add__(self, other: "GpuSeconds") -> "GpuSeconds":
        queue = [value for value in (self.queue_s, other.queue_s) if value is not None]
        return GpuSeconds(
            **{
                name: getattr(self, name) + getattr(other, name)
                for name in ("allocated", *accounting.CATEGORIES, "activity_weighted", "attempts")
            },
            queue_s=sum(queue) if queue else None,
        )

    @property
    def allocated_hours(self) -> float:
        return self.allocated / SECONDS_PER_HOUR

    @property
    def effective_hours(self) -> float:
        return self.effective / SECONDS_PER_HOUR

    @property
    def waste(self) -> int:
        return sum(getattr(self, name) for name in accounting.WASTE)

    @property
    def waste_hours(self) -> float:
        return self.waste / SECONDS_PER_HOUR

    @property
    def activity_weighted_hours(self) -> float:
        return self.activity_weighted / SECONDS_PER_HOUR

    @property
    def goodput_percent(self) -> float | None:
        return _percent(self.effective, self.allocated)

    @property
    def queue_text(self) -> str:
        return "—" if self.queue_s is None else duration_text(self.queue_s)

    def shares(self) -> list[CategoryShare]:
        """Effective first, then the waste categories in accounting precedence."""
        return [
            CategoryShare(
                key=name,
                label=CATEGORY_LABELS[name],
                gpu_s=getattr(self, name),
                percent=_percent(getattr(self, name), self.allocated),
            )
            for name in ("effective", *accounting.WASTE)
        ]

    @property
    def largest_waste(self) -> CategoryShare | None:
        """The waste category with the most GPU-seconds (the first in precedence on a
        tie); None when nothing was wasted."""
        waste = [share for share in self.shares()[1:] if share.gpu_s > 0]
        return max(waste, key=lambda share: share.gpu_s) if waste else None

    @property
    def largest_wastes(self) -> list[CategoryShare]:
        """Every waste category that has the most GPU-seconds, in precedence order: one, or
        all of a tie (a page names them all, never one of them as "mostly")."""
        top = self.largest_waste
        if top is None:
            return []
        return [share for share in self.shares()[1:] if share.gpu_s == top.gpu_s]

    def as_accounting(self) -> accounting.Accounting:
        """The pure ``Accounting`` that ``diagnosis.diagnose`` reads."""
        return accounting.Accounting(
            allocated=Fraction(self.allocated),
            **{name: Fraction(getattr(self, name)) for name in accounting.CATEGORIES},
            active_gpu_hours=self.activity_weighted_hours,
            queue_s=None if self.queue_s is None else Fraction(repr(self.queue_s)),
        )


# The sums of AttemptAccounting in the ORM, as ``GpuSeconds.from_sums`` reads them
# (tenant_goodput).
ACCOUNTING_SUMS = {
    "allocated": Sum("allocated_gpu_s"),
    **{name: Sum(f"{name}_gpu_s") for name in accounting.CATEGORIES},
    "activity_weighted": Sum("activity_weighted_gpu_s"),
    "queue_s": Sum("queue_s"),
    "attempts": Count("pk"),
}


# The columns of AttemptAccounting summed in SQL (telemetry.goodput), and their types.
RUN_SUM_COLUMNS = {
    "allocated": "allocated_gpu_s",
    **{name: f"{name}_gpu_s" for name in accounting.CATEGORIES},
    "activity_weighted": "activity_weighted_gpu_s",
    "queue_s": "queue_s",
}
RUN_SUM_TYPES: dict[str, type] = {
    **dict.fromkeys(("allocated", *accounting.CATEGORIES, "attempts"), int),
    "activity_weighted": float,
    "queue_s": float,
}
