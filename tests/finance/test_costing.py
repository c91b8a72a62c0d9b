"""finance.costing (pure, no database): attempts cut at UTC midnights and price changes, the
categories shared out over the parts, and the rounding of statement lines (docs/finance.md)."""

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finance import costing
from finance.costing import DayShare, Rate, attempt_cost, split_attempt
from telemetry.accounting import CATEGORIES
from tests.conftest import machine_time_zone

T0 = datetime(2026, 3, 1, 18, 0, tzinfo=UTC)
MARCH_1 = datetime(2026, 3, 1, tzinfo=UTC)
MARCH_2 = datetime(2026, 3, 2, tzinfo=UTC)


def rates(*cards: tuple[datetime, datetime | None, str]) -> list[Rate]:
    return [Rate(start, end, Decimal(price)) for start, end, price in cards]


def seconds(**values: int) -> dict[str, int]:
    """Every category, zero unless given."""
    return {name: values.get(name, 0) for name in CATEGORIES}


def test_an_attempt_across_midnight_and_a_rate_change_is_split_by_day_and_rate():
    # 2 GPUs from 18:00 to 06:00 next day; the price goes from 2.50 to 3.00 at 22:00.
    cards = rates(
        (T0 - timedelta(days=30), T0 + timedelta(hours=4), "2.50"),
        (T0 + timedelta(hours=4), None, "3.00"),
    )

    shares = split_attempt(
        start=T0,
        end=T0 + timedelta(hours=12),
        gpu_seconds={"effective": 2 * 12 * 3600 - 600, "idle": 600},
        rates=cards,
    )

    assert [
        (share.day, share.rate, share.allocated_gpu_s, share.gpu_seconds["idle"])
        for share in shares
    ] == [
        (date(2026, 3, 1), cards[0], 2 * 4 * 3600, 200),
        (date(2026, 3, 1), cards[1], 2 * 2 * 3600, 100),
        (date(2026, 3, 2), cards[1], 2 * 6 * 3600, 300),
    ]
    # 2 GPUs * (4 h * 2.50 + 8 h * 3.00) = 68.00
    assert costing.shares_cost(shares) == Decimal("68.00")
    assert attempt_cost(
        start=T0, end=T0 + timedelta(hours=12), allocated_gpu_s=2 * 12 * 3600, rates=cards
    ) == Decimal("68.00")


def test_time_no_rate_card_covers_is_unpriced_and_free():
    cards = rates((T0 + timedelta(hours=1), None, "4.00"))

    unpriced, priced = split_attempt(
        start=T0, end=T0 + timedelta(hours=3), gpu_seconds={"effective": 3 * 3600}, rates=cards
    )

    assert (unpriced.rate, unpriced.unpriced_gpu_s, priced.unpriced_gpu_s) == (None, 3600, 0)
    assert costing.shares_cost([unpriced, priced]) == Decimal("8.00")


@pytest.mark.parametrize(
    ("gpu_s", "price", "cost"),
    [
        (700, "2.99", "0.58"),  # 0.58138…
        (1800, "0.01", "0.00"),  # 0.005: a tie goes to the even cent
        (5400, "0.01", "0.02"),  # 0.015: to the even cent, up
        (3600, "2.9999", "3.00"),
        (0, "2.99", "0.00"),
    ],
)
def test_a_line_is_rounded_once_half_to_even_to_the_cent(gpu_s, price, cost):
    assert costing.line_cost(gpu_s=gpu_s, price_per_gpu_hour=Decimal(price)) == Decimal(cost)
    assert costing.line_cost(gpu_s=gpu_s, price_per_gpu_hour=None) == Decimal("0.00")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    start_s=st.integers(0, 3 * 86400),
    length_s=st.integers(0, 4 * 86400),
    micro=st.sampled_from([0, 0, 1, 250_000, 999_999]),
    gpus=st.integers(1, 64),
    shares=st.lists(st.integers(0, 1000), min_size=len(CATEGORIES), max_size=len(CATEGORIES)),
    change_s=st.integers(0, 6 * 86400),
    prices=st.tuples(st.decimals("0", "99.9999", places=4), st.decimals("0", "99.9999", places=4)),
)
def test_the_parts_of_an_attempt_add_up_to_its_accounting_exactly(
    start_s, length_s, micro, gpus, shares, change_s, prices
):
    base = datetime(2026, 1, 1, tzinfo=UTC)
    start = base + timedelta(seconds=start_s, microseconds=micro)
    end = start + timedelta(seconds=length_s)
    allocated = gpus * length_s
    weights = sum(shares) or 1
    seconds = {
        name: allocated * share // weights for name, share in zip(CATEGORIES, shares, strict=True)
    }
    seconds["effective"] += allocated - sum(seconds.values())
    cards = rates(
        (base + timedelta(seconds=change_s), base + timedelta(days=5), str(prices[0])),
        (base + timedelta(days=5), None, str(prices[1])),
    )

    parts = split_attempt(start=start, end=end, gpu_seconds=seconds, rates=cards)

    for name in CATEGORIES:
        assert sum(part.gpu_seconds[name] for part in parts) == seconds[name]
        assert all(part.gpu_seconds[name] >= 0 for part in parts)
    assert [part.day for part in parts] == sorted(part.day for part in parts)
    if micro == 0:  # whole seconds: a part holds exactly the GPU-seconds of its time
        cursor = start
        for part in parts:
            if end == start:
                break
            day_end = min(end, costing.midnight(part.day) + timedelta(days=1))
            part_end = min(
                [day_end] + [c.valid_from for c in cards if cursor < c.valid_from < day_end]
            )
            assert part.rate == next((c for c in cards if c.covers(cursor)), None)
            assert part.allocated_gpu_s == gpus * int((part_end - cursor).total_seconds())
            cursor = part_end


# --- the gaps mutation testing found (issue 32): each value worked out by hand ---------------


def test_one_gpu_hour_inside_one_day_under_one_price_costs_exactly_that_price():
    # Given one card at 3.60 per GPU-hour and an attempt of 1 GPU from 10:00 to 11:00
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))
    start, end = MARCH_1 + timedelta(hours=10), MARCH_1 + timedelta(hours=11)

    # When it is split and priced
    shares = split_attempt(start=start, end=end, gpu_seconds={"effective": 3600}, rates=cards)

    # Then it is one share of that day, every category present, and it costs 3.60
    assert shares == [DayShare(date(2026, 3, 1), cards[0], seconds(effective=3600))]
    assert attempt_cost(start=start, end=end, allocated_gpu_s=3600, rates=cards) == Decimal("3.60")


def test_an_empty_attempt_is_one_empty_share_of_its_day():
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))
    moment = MARCH_1 + timedelta(hours=10)

    shares = split_attempt(start=moment, end=moment, gpu_seconds={}, rates=cards)

    assert shares == [DayShare(date(2026, 3, 1), cards[0], seconds())]
    assert attempt_cost(start=moment, end=moment, allocated_gpu_s=0, rates=cards) == Decimal("0.00")


def test_an_attempt_over_several_days_is_cut_at_every_midnight():
    # Given 2 GPUs from 1 March 12:00 to 4 March 18:00 (78 h = 561,600 GPU-s), 7,800 lost
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))
    start, end = MARCH_1 + timedelta(hours=12), MARCH_1 + timedelta(days=3, hours=18)

    shares = split_attempt(
        start=start, end=end, gpu_seconds={"effective": 553_800, "lost": 7_800}, rates=cards
    )

    # Then one share per day: 12 h, 24 h, 24 h, 18 h of 78 h; each category by the same shares
    # (lost: 7,800 x 12/78 = 1,200, x 36/78 = 3,600 running, x 60/78 = 6,000 running, rest)
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=85_200, lost=1_200)),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=170_400, lost=2_400)),
        DayShare(date(2026, 3, 3), cards[0], seconds(effective=170_400, lost=2_400)),
        DayShare(date(2026, 3, 4), cards[0], seconds(effective=127_800, lost=1_800)),
    ]
    # 156 GPU-hours x 3.60
    assert attempt_cost(start=start, end=end, allocated_gpu_s=561_600, rates=cards) == Decimal(
        "561.60"
    )


def test_an_attempt_ending_at_midnight_has_no_share_dated_the_next_day():
    # Given a card that ends exactly at the midnight the attempts end at
    cards = rates((MARCH_1 - timedelta(days=28), MARCH_2, "3.60"), (MARCH_2, None, "9.00"))

    # When an attempt ends at 00:00, within one day and across one
    one_day = split_attempt(
        start=MARCH_1 + timedelta(hours=22), end=MARCH_2, gpu_seconds={"idle": 7200}, rates=cards
    )
    two_days = split_attempt(
        start=MARCH_1 - timedelta(hours=12),
        end=MARCH_2,
        gpu_seconds={"effective": 129_600},
        rates=cards,
    )

    # Then nothing is dated 2 March or priced by its card
    assert one_day == [DayShare(date(2026, 3, 1), cards[0], seconds(idle=7200))]
    assert two_days == [
        DayShare(date(2026, 2, 28), cards[0], seconds(effective=43_200)),
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=86_400)),
    ]


def test_the_days_are_utc_days_whatever_the_zone_of_the_times():
    # 00:30 to 02:30 at UTC+2 is 22:30 to 00:30 UTC: 1.5 h on 1 March, 0.5 h on 2 March
    plus_two = timezone(timedelta(hours=2))
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))

    shares = split_attempt(
        start=datetime(2026, 3, 2, 0, 30, tzinfo=plus_two),
        end=datetime(2026, 3, 2, 2, 30, tzinfo=plus_two),
        gpu_seconds={"effective": 7200},
        rates=cards,
    )

    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=5400)),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=1800)),
    ]


@pytest.fixture
def kiritimati():
    """The machine's local time zone at UTC+14 for the test, then as it was."""
    with machine_time_zone("Pacific/Kiritimati"):
        yield


def test_the_days_are_utc_days_whatever_the_machines_time_zone(kiritimati):
    # 22:30 to 00:30 UTC is 12:30 to 14:30 on 2 March in Kiritimati
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))

    shares = split_attempt(
        start=MARCH_2 - timedelta(minutes=90),
        end=MARCH_2 + timedelta(minutes=30),
        gpu_seconds={"effective": 7200},
        rates=cards,
    )

    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=5400)),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=1800)),
    ]


def test_a_part_gives_back_the_units_its_categories_were_given_ahead():
    # Given parts of 7 s, 1 s and 4 s (cut at midnight and at a price change at 00:00:01) and
    # 8 GPU-seconds: effective 1, startup 1, idle 6. Running totals 8 x 7/12 → 5, 8 x 8/12
    # → 5, 8: parts of 5, 0 and 3.
    cards = rates(
        (MARCH_1 - timedelta(days=28), MARCH_2 + timedelta(seconds=1), "2.00"),
        (MARCH_2 + timedelta(seconds=1), None, "4.00"),
    )

    shares = split_attempt(
        start=MARCH_2 - timedelta(seconds=7),
        end=MARCH_2 + timedelta(seconds=5),
        gpu_seconds={"effective": 1, "startup": 1, "idle": 6},
        rates=cards,
    )

    # Then part 1 takes the floors (idle 3 of 3.5) and hands its 2 units left to the most owed
    # fraction (effective and startup, 7/12 each); part 2 owes effective and startup -1/3
    # (taken as 0) and idle 1, one more than its 0: idle gives the unit back; the last part
    # takes the rest.
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=1, startup=1, idle=3)),
        DayShare(date(2026, 3, 2), cards[0], seconds()),
        DayShare(date(2026, 3, 2), cards[1], seconds(idle=3)),
    ]


def test_fractions_of_a_second_are_shared_by_the_time_on_each_side_of_midnight():
    # Given 5 GPUs from 23:59:59.2 to 00:00:01.0: 0.8 s and 1 s, 9 GPU-seconds
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))

    shares = split_attempt(
        start=MARCH_2 - timedelta(seconds=0.8),
        end=MARCH_2 + timedelta(seconds=1),
        gpu_seconds={"effective": 9},
        rates=cards,
    )

    # Then each day gets 5 x its seconds: 4 and 5
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=4)),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=5)),
    ]


def test_the_unit_left_in_a_part_goes_to_the_category_owed_the_most_fraction():
    # Given 30 min before midnight and 60 after (a third, two thirds): effective 5,399, idle 1
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))

    shares = split_attempt(
        start=MARCH_2 - timedelta(minutes=30),
        end=MARCH_2 + timedelta(hours=1),
        gpu_seconds={"effective": 5399, "idle": 1},
        rates=cards,
    )

    # Then the first part holds 1,800: floors 1,799 (of 1,799.67) and 0 (of 0.33), and the
    # unit left goes to effective, owed .67 more; idle's second is on 2 March
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=1800)),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=3599, idle=1)),
    ]


def test_ties_between_categories_go_by_category_order_both_ways():
    # Given parts of 4 s, 3 s and 7 s (midnight, a price change at 00:00:03) and 13 GPU-s:
    # startup 4, idle 1, input wait 8. Running totals 13 x 4/14 = 3.71 -> 4, 13 x 7/14 = 6.5
    # -> 6 (half to even), 13: parts of 4, 2 and 7.
    cards = rates(
        (MARCH_1 - timedelta(days=28), MARCH_2 + timedelta(seconds=3), "2.00"),
        (MARCH_2 + timedelta(seconds=3), None, "4.00"),
    )

    shares = split_attempt(
        start=MARCH_2 - timedelta(seconds=4),
        end=MARCH_2 + timedelta(seconds=10),
        gpu_seconds={"startup": 4, "idle": 1, "input_wait": 8},
        rates=cards,
    )

    # Then in part 1 (owed 1.14, 0.29, 2.29) idle and input wait tie at .29 for the unit
    # left: idle comes first. In part 2 (owed 1, -0.5, 2; taken 1, 0, 2 for a total of 2)
    # startup and input wait tie at 0 to give one back: startup comes first.
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(startup=1, idle=1, input_wait=2)),
        DayShare(date(2026, 3, 2), cards[0], seconds(input_wait=2)),
        DayShare(date(2026, 3, 2), cards[1], seconds(startup=3, input_wait=4)),
    ]


def test_a_tie_between_effective_and_waste_goes_to_effective_first():
    # Given one second either side of midnight and 2 GPU-s: effective 1, lost 1. The first
    # part holds round(2 x 1/2) = 1 and both are owed .5 of it.
    cards = rates((MARCH_1 - timedelta(days=28), None, "3.60"))

    shares = split_attempt(
        start=MARCH_2 - timedelta(seconds=1),
        end=MARCH_2 + timedelta(seconds=1),
        gpu_seconds={"effective": 1, "lost": 1},
        rates=cards,
    )

    # Then effective takes the unit (costing.SHARE_ORDER, the order every DailyUsage row was
    # split in), not lost (first in telemetry.accounting.CATEGORIES)
    assert shares == [
        DayShare(date(2026, 3, 1), cards[0], seconds(effective=1)),
        DayShare(date(2026, 3, 2), cards[0], seconds(lost=1)),
    ]


def test_the_unit_given_back_comes_from_the_category_owed_the_least_fraction():
    # Given parts of 655 s, 2 s and 77 s (midnight, a price change at 00:00:02) and 873 GPU-s:
    # effective 152, startup 12, idle 2, input wait 705, comm wait 2. Running totals
    # 873 x 655/734 = 779.03 -> 779, 873 x 657/734 = 781.41 -> 781, 873: parts of 779, 2, 92.
    cards = rates(
        (MARCH_1 - timedelta(days=28), MARCH_2 + timedelta(seconds=2), "2.00"),
        (MARCH_2 + timedelta(seconds=2), None, "4.00"),
    )

    shares = split_attempt(
        start=MARCH_2 - timedelta(seconds=655),
        end=MARCH_2 + timedelta(seconds=79),
        gpu_seconds={"effective": 152, "startup": 12, "idle": 2, "input_wait": 705, "comm_wait": 2},
        rates=cards,
    )

    # Then part 1 takes the floors (135, 10, 1, 629, 1) and its 3 units left go to idle and
    # comm wait (.785 each) and startup (.708). Part 2 owes effective 1.055 and input wait
    # 2.042 (the others were given a unit ahead: taken as 0): 3 taken for a part of 2, and
    # input wait, owed the least fraction (.042 against .055), gives the unit back, although
    # it is owed more seconds.
    assert shares == [
        DayShare(
            date(2026, 3, 1),
            cards[0],
            seconds(effective=135, startup=11, idle=2, input_wait=629, comm_wait=2),
        ),
        DayShare(date(2026, 3, 2), cards[0], seconds(effective=1, input_wait=1)),
        DayShare(date(2026, 3, 2), cards[1], seconds(effective=16, startup=1, input_wait=75)),
    ]


def test_an_attempt_starting_when_a_rate_starts_is_one_share_under_that_rate():
    # Given the price changing at 10:00 and an attempt from 10:00 to 11:00
    start = MARCH_1 + timedelta(hours=10)
    cards = rates((MARCH_1 - timedelta(days=28), start, "2.50"), (start, None, "3.60"))

    shares = split_attempt(
        start=start, end=start + timedelta(hours=1), gpu_seconds={"effective": 3600}, rates=cards
    )

    # Then one share under the new rate: no empty one cut at its start
    assert shares == [DayShare(date(2026, 3, 1), cards[1], seconds(effective=3600))]
