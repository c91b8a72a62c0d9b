"""One attempt's accounting split into UTC days and priced by the rate cards. Pure.

Finance reports add up rows per day, so every attempt is cut at UTC midnights. The cut
keeps every total exact: each category's whole GPU-seconds and the attempt's cost in cents
are handed out to the days by cumulative rounding (the running total is rounded, never the
parts), so the days of an attempt add up to its accounting to the GPU-second and to the
cent. Cost = allocated GPU-hours × the price valid at each moment: a day that crosses a
rate change is priced by the time under each rate. Time that no rate card covers is
counted as unpriced GPU-seconds and costs nothing.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from fractions import Fraction

CATEGORIES = ("effective", "lost", "startup", "checkpoint", "idle", "input_wait", "comm_wait")
CENT = Fraction(1, 100)
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True, slots=True)
class Rate:
    """A price per GPU-hour valid over [valid_from, valid_to) (None: open-ended)."""

    valid_from: datetime
    valid_to: datetime | None
    price_per_gpu_hour: Decimal


@dataclass(frozen=True, slots=True)
class DayShare:
    day: date
    gpu_seconds: dict[str, int]  # per category; their sum is the day's allocated
    unpriced_gpu_s: int
    cost: Decimal  # in currency units, whole cents
    effective_cost: Decimal

    @property
    def allocated_gpu_s(self) -> int:
        return sum(self.gpu_seconds.values())


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _seconds(delta: timedelta) -> Fraction:
    return Fraction(delta.days * 86400 + delta.seconds) + Fraction(delta.microseconds, 10**6)


def _spread(total: int | Fraction, cumulative: Sequence[Fraction], unit: Fraction) -> list:
    """``total`` handed out over parts whose cumulative shares are ``cumulative`` (ending at
    1), in whole ``unit``s: each part is the difference of rounded running totals."""
    parts, previous = [], 0
    for share in cumulative:
        running = _round(Fraction(total) * share, unit)
        parts.append(running - previous)
        previous = running
    return parts


def _day_segments(start: datetime, end: datetime) -> list[tuple[date, datetime, datetime]]:
    """[start, end) cut at UTC midnights; an empty interval is one empty segment."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    segments = []
    cursor = start
    while True:
        next_midnight = midnight(cursor.date() + timedelta(days=1))
        if end <= next_midnight:
            segments.append((cursor.date(), cursor, end))
            return segments
        segments.append((cursor.date(), cursor, next_midnight))
        cursor = next_midnight


def _priced(a: datetime, b: datetime, rates: Sequence[Rate]) -> tuple[Fraction, Fraction]:
    """(Σ price × seconds under each rate, seconds under no rate) over [a, b)."""
    weighted, covered = Fraction(0), Fraction(0)
    for rate in rates:
        lo = max(a, rate.valid_from)
        hi = b if rate.valid_to is None else min(b, rate.valid_to)
        if hi > lo:
            seconds = _seconds(hi - lo)
            weighted += Fraction(rate.price_per_gpu_hour) * seconds
            covered += seconds
    return weighted, _seconds(b - a) - covered


def split_attempt(
    *, start: datetime, end: datetime, gpu_seconds: dict[str, int], rates: Sequence[Rate]
) -> list[DayShare]:
    """The attempt's per-category GPU-seconds (``gpu_seconds``, whole, as accounted) and
    cost, per UTC day of [start, end). ``rates`` are the attempt's flavor's cards, in any
    order, not overlapping."""
    segments = _day_segments(start, end)
    total_s = _seconds(end - start)
    if total_s == 0:
        cumulative = [Fraction(0)] * (len(segments) - 1) + [Fraction(1)]
    else:
        cumulative = [_seconds(b - start) / total_s for _, _, b in segments]
    by_category = {
        name: _spread(gpu_seconds.get(name, 0), cumulative, Fraction(1)) for name in CATEGORIES
    }
    allocated = [sum(by_category[name][i] for name in CATEGORIES) for i in range(len(segments))]
    # Totals first, from the whole attempt: the time-weighted price and the uncovered share
    # do not depend on how the attempt is cut into days. Then the days get their parts of
    # the rounded totals, in proportion to their own prices and uncovered time.
    weighted, uncovered = _priced(start, end, rates) if total_s else (Fraction(0), Fraction(0))
    price_per_s = weighted / total_s / SECONDS_PER_HOUR if total_s else Fraction(0)
    day_prices, day_uncovered = [], []
    for _, a, b in segments:
        length = _seconds(b - a)
        day_weighted, day_missing = _priced(a, b, rates) if length else (0, 0)
        day_prices.append(Fraction(day_weighted) / length / SECONDS_PER_HOUR if length else 0)
        day_uncovered.append(Fraction(day_missing) / length if length else 0)
    total = sum(gpu_seconds.get(name, 0) for name in CATEGORIES)
    costs = _share_out(
        _round(total * price_per_s, CENT),
        [n * p for n, p in zip(allocated, day_prices, strict=True)],
        CENT,
    )
    effective_costs = _share_out(
        _round(gpu_seconds.get("effective", 0) * price_per_s, CENT),
        [n * p for n, p in zip(by_category["effective"], day_prices, strict=True)],
        CENT,
    )
    unpriced = _share_out(
        _round(total * uncovered / total_s if total_s else 0, Fraction(1)),
        [n * u for n, u in zip(allocated, day_uncovered, strict=True)],
        Fraction(1),
    )
    return [
        DayShare(
            day=day,
            gpu_seconds={name: int(by_category[name][i]) for name in CATEGORIES},
            unpriced_gpu_s=int(unpriced[i]),
            cost=_decimal(costs[i]),
            effective_cost=_decimal(effective_costs[i]),
        )
        for i, (day, _, _) in enumerate(segments)
    ]


def _round(value, unit: Fraction) -> Fraction:
    return round(Fraction(value) / unit) * unit


def _share_out(total: Fraction, weights: Sequence, unit: Fraction) -> list[Fraction]:
    """``total`` (whole ``unit``s) handed out in proportion to ``weights`` by cumulative
    rounding; all to the last part when every weight is zero."""
    weight_sum = sum(weights, Fraction(0))
    if weight_sum == 0:
        return [Fraction(0)] * (len(weights) - 1) + [total]
    cumulative, running = [], Fraction(0)
    for weight in weights:
        running += weight
        cumulative.append(running / weight_sum)
    return _spread(total, cumulative, unit)


def _decimal(amount: Fraction) -> Decimal:
    """A whole number of cents as a Decimal with two places."""
    cents = amount / CENT
    assert cents.denominator == 1, amount
    return Decimal(int(cents)).scaleb(-2)


def attempt_cost(
    *, start: datetime, end: datetime, allocated_gpu_s: int, rates: Sequence[Rate]
) -> Decimal:
    """The attempt's whole cost, as its days add up to."""
    shares = split_attempt(
        start=start, end=end, gpu_seconds={"effective": allocated_gpu_s}, rates=rates
    )
    return sum((share.cost for share in shares), Decimal("0.00"))
