"""One attempt's accounting split into UTC days and rate segments, and the rounding rule of
statement lines. Pure.

Finance reports add up rows per day, so every attempt is cut at UTC midnights and where its
flavor's price changes. The cut keeps every total exact: a segment's GPU-seconds are its
share of the attempt rounded cumulatively (the running total is rounded, never the parts:
with whole-second times a segment gets exactly GPUs × its seconds), and the categories are
shared out inside each segment without ever going below zero. So the segments of an
attempt add up to its accounting to the GPU-second. Each segment carries the rate valid
over it (or none: time no rate card covers is unpriced and costs nothing).

No money is rounded here per attempt or per day. A statement line adds up the whole
GPU-seconds of its segments under one rate, and its cost is that quantity × the price,
rounded once, half to even, to the cent (``line_cost``); totals are sums of lines.

Credits (issue 34): a segment of an attempt that a platform or hardware fault ended is
credited its lost and startup GPU-seconds when its rate card's policy credits them (time no
card covers costs nothing and is credited too). A line's charged cost is its charged
GPU-seconds priced and rounded once; its credited amounts are what the allocated cost adds
to that, rounded cumulatively (``line_costs``), so charged + credited = allocated, to the
GPU-second and to the cent.
"""

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from fractions import Fraction

from telemetry.accounting import CREDITED, EFFECTIVE, WASTE

# The categories (``telemetry.accounting``'s) in the order a segment's leftover units are
# handed out on a tie: effective first, then the waste in precedence order. Every DailyUsage
# row was split in this order, so a rebuild of a past day gives the same rows; it is a
# rounding rule, not a second list of categories.
SHARE_ORDER = (EFFECTIVE, *WASTE)
CENT = Fraction(1, 100)
SECONDS_PER_HOUR = 3600


@dataclass(frozen=True, slots=True)
class Rate:
    """A price per GPU-hour valid over [valid_from, valid_to) (None: open-ended);
    ``card_id`` names the rate card it comes from."""

    valid_from: datetime
    valid_to: datetime | None
    price_per_gpu_hour: Decimal
    card_id: int | None = None
    credits: bool = True  # the card's policy: credit platform and hardware failures

    def covers(self, moment: datetime) -> bool:
        return self.valid_from <= moment and (self.valid_to is None or moment < self.valid_to)


@dataclass(frozen=True, slots=True)
class DayShare:
    """The part of an attempt on one UTC day under one rate (None: no rate card)."""

    day: date
    rate: Rate | None
    gpu_seconds: dict[str, int]  # per category; their sum is the share's allocated

    @property
    def allocated_gpu_s(self) -> int:
        return sum(self.gpu_seconds.values())

    @property
    def unpriced_gpu_s(self) -> int:
        return self.allocated_gpu_s if self.rate is None else 0

    def credited_gpu_s(self, *, credit_due: bool) -> int:
        """The share's credited GPU-seconds: its lost and startup ones when the attempt is
        due a credit (``telemetry.accounting.credit_due``) and its rate card credits (no
        card: nothing is charged anyway, so it is credited)."""
        if not credit_due or (self.rate is not None and not self.rate.credits):
            return 0
        return sum(self.gpu_seconds[name] for name in CREDITED)


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def line_amount(*, gpu_s: int, price_per_gpu_hour: Decimal) -> Fraction:
    """The exact cost of ``gpu_s`` GPU-seconds at ``price_per_gpu_hour``."""
    return Fraction(gpu_s) * Fraction(price_per_gpu_hour) / SECONDS_PER_HOUR


def cents(amount: Fraction) -> Decimal:
    """``amount`` rounded once, half to even, to the cent."""
    return Decimal(round(amount / CENT)).scaleb(-2)


def line_cost(*, gpu_s: int, price_per_gpu_hour: Decimal | None) -> Decimal:
    """The cost of a statement line: its whole GPU-seconds under one price × that price,
    rounded once, half to even, to the cent. No price: it costs nothing."""
    if price_per_gpu_hour is None:
        return Decimal("0.00")
    return cents(line_amount(gpu_s=gpu_s, price_per_gpu_hour=price_per_gpu_hour))


def line_costs(
    *, charged_gpu_s: int, credited_gpu_s: Sequence[int], price_per_gpu_hour: Decimal | None
) -> tuple[Decimal, list[Decimal]]:
    """A line's charged cost and its credited amounts (one per entry of ``credited_gpu_s``).

    The charged cost is ``line_cost`` of the charged GPU-seconds: rounded once, like any
    line. The credited amounts are rounded cumulatively: each is the cost of the charged
    and credited GPU-seconds so far minus the cost before it. So they add up to exactly
    ``line_cost`` of the whole allocation (charged + credited = allocated, to the cent), and
    each is within a cent of its exact amount."""
    charged = line_cost(gpu_s=charged_gpu_s, price_per_gpu_hour=price_per_gpu_hour)
    credited, seconds, before = [], charged_gpu_s, charged
    for gpu_s in credited_gpu_s:
        seconds += gpu_s
        after = line_cost(gpu_s=seconds, price_per_gpu_hour=price_per_gpu_hour)
        credited.append(after - before)
        before = after
    return charged, credited


def shares_cost(shares: Iterable[DayShare]) -> Decimal:
    """The cost of some shares, priced each by its rate and rounded once at the end."""
    exact = sum(
        (
            line_amount(
                gpu_s=share.allocated_gpu_s, price_per_gpu_hour=share.rate.price_per_gpu_hour
            )
            for share in shares
            if share.rate is not None
        ),
        Fraction(0),
    )
    return cents(exact)


def _seconds(delta: timedelta) -> Fraction:
    return Fraction(delta.days * 86400 + delta.seconds) + Fraction(delta.microseconds, 10**6)


def _rate_at(moment: datetime, rates: Sequence[Rate]) -> Rate | None:
    return next((rate for rate in rates if rate.covers(moment)), None)


def _segments(
    start: datetime, end: datetime, rates: Sequence[Rate]
) -> list[tuple[date, Rate | None, datetime, datetime]]:
    """[start, end) cut at UTC midnights and where a rate starts or ends; each segment with
    the rate valid over it. An empty interval is one empty segment."""
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    cuts = {
        moment
        for rate in rates
        for moment in (rate.valid_from, rate.valid_to)
        if moment is not None and start < moment < end
    }
    day = start.date() + timedelta(days=1)
    while midnight(day) < end:
        cuts.add(midnight(day))
        day += timedelta(days=1)
    bounds = [start, *sorted(cuts), end]
    if start == end:
        return [(start.date(), _rate_at(start, rates), start, end)]
    return [(a.date(), _rate_at(a, rates), a, b) for a, b in itertools.pairwise(bounds)]


def split_attempt(
    *, start: datetime, end: datetime, gpu_seconds: dict[str, int], rates: Sequence[Rate]
) -> list[DayShare]:
    """The attempt's per-category GPU-seconds (``gpu_seconds``, whole, as accounted) per
    UTC day and rate of [start, end), in time order. ``rates`` are the attempt's flavor's
    cards, in any order, not overlapping."""
    segments = _segments(start, end, rates)
    if len(segments) == 1:  # most attempts: inside one day and under one price
        day, rate, _, _ = segments[0]
        return [DayShare(day, rate, {name: gpu_seconds.get(name, 0) for name in SHARE_ORDER})]
    total_s = _seconds(end - start)
    cumulative = [_seconds(b - start) / total_s for _, _, _, b in segments]
    by_category = _split_parts(gpu_seconds, cumulative)
    return [
        DayShare(day, rate, {name: by_category[name][i] for name in SHARE_ORDER})
        for i, (day, rate, _, _) in enumerate(segments)
    ]


def _split_parts(
    gpu_seconds: dict[str, int], cumulative: Sequence[Fraction]
) -> dict[str, list[int]]:
    """Each category's whole GPU-seconds per part. A part's total is its share of the whole
    attempt, rounded cumulatively (so with whole-second times it is exactly GPUs × the
    part's seconds); inside a part, each category gets the floor of what it is still owed by
    then, and the units left go to the categories owed the most fraction. A category never
    gets more than it has left, and the last part (owed exactly what is left) gets the rest:
    every category adds up to its total, every part is zero or more."""
    totals = {name: gpu_seconds.get(name, 0) for name in SHARE_ORDER}
    total = sum(totals.values())
    used = dict.fromkeys(SHARE_ORDER, 0)
    parts: dict[str, list[int]] = {name: [] for name in SHARE_ORDER}
    handed_out = 0
    for share in cumulative:
        running = round(total * share)  # the running total is rounded, never the parts
        owed = {name: totals[name] * share - used[name] for name in SHARE_ORDER}
        # The floor, or zero when a category was given a unit ahead and is owed less than
        # nothing (int() truncates towards zero). Owed never exceeds what is left: share ≤ 1.
        take = {name: max(0, int(owed[name])) for name in SHARE_ORDER}
        left = running - handed_out - sum(take.values())
        handed_out = running

        # The units left go to the categories owed the most fraction, ties in ``SHARE_ORDER``.
        # There are never more units left than categories owed a fraction (the part's total
        # is the rounded sum of what is owed), and each of those has a unit left to take.
        by_fraction = sorted(SHARE_ORDER, key=lambda name: owed[name] - take[name], reverse=True)
        for name in by_fraction[: max(left, 0)]:
            take[name] += 1
        # More taken than the part holds (the zeros above): the least owed give units back.
        for _ in range(-left):
            name = min((n for n in SHARE_ORDER if take[n]), key=lambda n: owed[n] - take[n])
            take[name] -= 1
        for name in SHARE_ORDER:
            parts[name].append(take[name])
            used[name] += take[name]
    return parts


def attempt_cost(
    *, start: datetime, end: datetime, allocated_gpu_s: int, rates: Sequence[Rate]
) -> Decimal:
    """The attempt's whole cost, alone on a line: its GPU-seconds under each rate × the
    price, rounded once to the cent."""
    return shares_cost(
        split_attempt(start=start, end=end, gpu_seconds={"effective": allocated_gpu_s}, rates=rates)
    )
