"""One attempt's accounting split into UTC days and priced by the rate cards. Pure.

Finance reports add up rows per day, so every attempt is cut at UTC midnights. The cut
keeps every total exact: a day's GPU-seconds are its share of the attempt rounded
cumulatively (the running total is rounded, never the parts: with whole-second times a day
gets exactly GPUs × its seconds), the categories are shared out inside each day without
ever going below zero, and the cost in cents is handed out like the day totals. So the
days of an attempt add up to its accounting to the GPU-second and to its cost to the
cent. Cost = allocated GPU-hours × the price valid at each moment: a day that crosses a
rate change is priced by the time under each rate. Time that no rate card covers is
counted as unpriced GPU-seconds and costs nothing.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
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


def _spread(
    total: int | Fraction, cumulative: Sequence[Fraction], unit: Fraction
) -> list[Fraction]:
    """``total`` handed out over parts whose cumulative shares are ``cumulative`` (ending at
    1), in whole ``unit``s: each part is the difference of rounded running totals."""
    parts: list[Fraction] = []
    previous = Fraction(0)
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
    if start.astimezone(UTC).date() == end.astimezone(UTC).date() and end > start:
        # Most attempts: inside one day and under one price. Decimal division is exact to
        # 28 digits and a tie at half a cent is exact in decimal, so this rounds as below.
        rate = next(
            (
                rate
                for rate in rates
                if rate.valid_from <= start and (rate.valid_to is None or end <= rate.valid_to)
            ),
            None,
        )
        if rate is not None:
            price = rate.price_per_gpu_hour
            seconds = {name: gpu_seconds.get(name, 0) for name in CATEGORIES}
            return [
                DayShare(
                    day=start.astimezone(UTC).date(),
                    gpu_seconds=seconds,
                    unpriced_gpu_s=0,
                    cost=_cents(sum(seconds.values()) * price / SECONDS_PER_HOUR),
                    effective_cost=_cents(seconds["effective"] * price / SECONDS_PER_HOUR),
                )
            ]
    return _split(start=start, end=end, gpu_seconds=gpu_seconds, rates=rates)


def _cents(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)


def _split(
    *, start: datetime, end: datetime, gpu_seconds: dict[str, int], rates: Sequence[Rate]
) -> list[DayShare]:
    """``split_attempt`` for any attempt, in exact fractions."""
    segments = _day_segments(start, end)
    total_s = _seconds(end - start)
    if total_s == 0:
        cumulative = [Fraction(0)] * (len(segments) - 1) + [Fraction(1)]
    else:
        cumulative = [_seconds(b - start) / total_s for _, _, b in segments]
    if len(segments) == 1:  # most attempts: no cut, and only the price to work out
        by_category = {name: [gpu_seconds.get(name, 0)] for name in CATEGORIES}
    else:
        by_category = _split_days(gpu_seconds, cumulative)
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


def _split_days(
    gpu_seconds: dict[str, int], cumulative: Sequence[Fraction]
) -> dict[str, list[int]]:
    """Each category's whole GPU-seconds per day. A day's total is its share of the whole
    attempt, rounded cumulatively (so with whole-second times it is exactly GPUs × the day's
    seconds); inside a day, each category gets the floor of what it is still owed by then,
    and the units left go to the categories owed the most fraction. A category never gets
    more than it has left, and the last day gets the rest: every category adds up to its
    total, every part is zero or more."""
    totals = {name: gpu_seconds.get(name, 0) for name in CATEGORIES}
    day_totals = _spread(sum(totals.values()), cumulative, Fraction(1))
    used = dict.fromkeys(CATEGORIES, 0)
    parts: dict[str, list[int]] = {name: [] for name in CATEGORIES}
    last = len(cumulative) - 1
    for day, (share, day_total) in enumerate(zip(cumulative, day_totals, strict=True)):
        if day == last:
            take = {name: totals[name] - used[name] for name in CATEGORIES}
        else:
            owed = {name: totals[name] * share - used[name] for name in CATEGORIES}
            take = {
                name: max(0, min(int(owed[name] // 1), totals[name] - used[name]))
                for name in CATEGORIES
            }
            left = int(day_total) - sum(take.values())
            # Most owed first; ties in category order. Each pass moves one unit per category.
            while left:
                order = sorted(
                    CATEGORIES, key=lambda name: owed[name] - take[name], reverse=left > 0
                )
                for name in order:
                    if left > 0 and take[name] < totals[name] - used[name]:
                        take[name] += 1
                        left -= 1
                    elif left < 0 and take[name] > 0:
                        take[name] -= 1
                        left += 1
                    if not left:
                        break
        for name in CATEGORIES:
            parts[name].append(take[name])
            used[name] += take[name]
    return parts


def _round(value: int | Fraction, unit: Fraction) -> Fraction:
    return round(Fraction(value) / unit) * unit


def _share_out(
    total: Fraction, weights: Sequence[int | Fraction], unit: Fraction
) -> list[Fraction]:
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
