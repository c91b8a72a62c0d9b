"""The arithmetic of the platform KPIs (design §7). Pure: plain numbers and datetimes in,
plain numbers out, so the page gives the same answer on PostgreSQL and SQLite.

Percentiles are by nearest rank: the p-th percentile of n values is the ⌈p/100 · n⌉-th
smallest. It is always a value that was observed (a time some attempt really waited),
needs no interpolation, and is exact for any n.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction


def percentile(values: Iterable[float], percent: int) -> float | None:
    """The nearest-rank ``percent``-th percentile (1–100) of ``values``, in any order;
    None when there are none."""
    if not 1 <= percent <= 100:
        raise ValueError(f"percent must be 1–100, not {percent}")
    ordered = sorted(values)
    if not ordered:
        return None
    rank = math.ceil(Fraction(percent, 100) * len(ordered))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Distribution:
    """How many values there were, and their median and 95th percentile (nearest rank)."""

    count: int = 0
    p50: float | None = None
    p95: float | None = None


def distribution(values: Iterable[float]) -> Distribution:
    ordered = sorted(values)
    return Distribution(
        count=len(ordered), p50=percentile(ordered, 50), p95=percentile(ordered, 95)
    )


@dataclass(frozen=True, slots=True)
class Ratio:
    """``part`` of ``whole``: success rate, recovery rate, goodput, allocation."""

    part: float = 0
    whole: float = 0

    @property
    def percent(self) -> float | None:
        """``part`` ÷ ``whole`` in percent; None when ``whole`` is zero (nothing to rate)."""
        return self.part * 100 / self.whole if self.whole else None

    @property
    def percent_text(self) -> str:
        """ "66.7 %", or "—" when there is nothing to rate."""
        percent = self.percent
        return "—" if percent is None else f"{percent:.1f} %"

    def __add__(self, other: "Ratio") -> "Ratio":
        return Ratio(part=self.part + other.part, whole=self.whole + other.whole)


def span_seconds(start: datetime, end: datetime) -> float:
    """Seconds from ``start`` to ``end`` (timezone-aware), 0 when ``end`` comes first."""
    # In UTC: subtracting two times of one zoneinfo zone ignores a DST change between them.
    return max(0.0, (end.astimezone(UTC) - start.astimezone(UTC)).total_seconds())
