"""Issue 34, acceptance 5, the pure half: credited GPU-seconds cut into days and rates, and
the money of a line with credits. charged + credited = allocated, to the GPU-second and to
the cent, whatever the prices, the policies and the cuts."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from finance.costing import Rate, line_amount, line_cost, line_costs, split_attempt
from telemetry.accounting import CATEGORIES

MARCH_1 = datetime(2026, 3, 1, tzinfo=UTC)
CENT = Fraction(1, 100)


def test_a_line_with_credits_is_charged_its_charged_seconds_rounded_once():
    # 7,200 GPU-s at 2.50: 5.00. 2,400 credited for hardware, 1,000 for the platform: the
    # charged 3,800 GPU-s cost 2.6388… → 2.64; charged + hardware = 6,200 GPU-s cost
    # 4.3055… → 4.31, so hardware is 4.31 - 2.64 = 1.67; the platform the 0.69 left.
    charged, credited = line_costs(
        charged_gpu_s=3800, credited_gpu_s=[2400, 1000], price_per_gpu_hour=Decimal("2.50")
    )

    assert (charged, credited) == (Decimal("2.64"), [Decimal("1.67"), Decimal("0.69")])
    assert charged + sum(credited) == line_cost(gpu_s=7200, price_per_gpu_hour=Decimal("2.50"))


def test_an_unpriced_line_costs_nothing_charged_or_credited():
    assert line_costs(charged_gpu_s=10, credited_gpu_s=[5, 0], price_per_gpu_hour=None) == (
        Decimal("0.00"),
        [Decimal("0.00"), Decimal("0.00")],
    )


@settings(max_examples=500, deadline=None)
@given(
    charged=st.integers(0, 10**9),
    credited=st.lists(st.integers(0, 10**8), min_size=0, max_size=3),
    price=st.decimals("0", "99999.9999", places=4),
)
def test_charged_and_credited_amounts_add_up_to_the_allocations_cost_to_the_cent(
    charged, credited, price
):
    charged_cost, amounts = line_costs(
        charged_gpu_s=charged, credited_gpu_s=credited, price_per_gpu_hour=price
    )

    allocated = charged + sum(credited)
    assert charged_cost + sum(amounts, Decimal("0.00")) == line_cost(
        gpu_s=allocated, price_per_gpu_hour=price
    )
    # The charged cost is its own exact amount rounded once; each credit is within a cent
    # of its exact amount and never negative.
    assert charged_cost == line_cost(gpu_s=charged, price_per_gpu_hour=price)
    assert abs(Fraction(charged_cost) - line_amount(gpu_s=charged, price_per_gpu_hour=price)) <= (
        CENT / 2
    )
    for gpu_s, amount in zip(credited, amounts, strict=True):
        assert amount >= 0
        assert abs(Fraction(amount) - line_amount(gpu_s=gpu_s, price_per_gpu_hour=price)) <= CENT


def rate(day: int, until: int | None, price: str, *, credits: bool) -> Rate:
    return Rate(
        MARCH_1 + timedelta(days=day),
        None if until is None else MARCH_1 + timedelta(days=until),
        Decimal(price),
        card_id=day,
        credits=credits,
    )


def test_only_the_shares_under_a_crediting_card_are_credited():
    # 2 GPUs for 48 h from March 1: the card crediting ends on March 2, the next charges.
    rates = [rate(0, 1, "2.00", credits=True), rate(1, None, "2.00", credits=False)]
    whole = {"lost": 100_000, "startup": 3600, "effective": 2 * 48 * 3600 - 103_600}
    shares = split_attempt(
        start=MARCH_1, end=MARCH_1 + timedelta(hours=48), gpu_seconds=whole, rates=rates
    )

    # Each day holds half of every category; only the first day's half is credited.
    assert [share.credited_gpu_s(credit_due=True) for share in shares] == [51_800, 0]
    assert [share.credited_gpu_s(credit_due=False) for share in shares] == [0, 0]


def test_time_no_card_covers_is_credited_too():
    shares = split_attempt(
        start=MARCH_1,
        end=MARCH_1 + timedelta(hours=1),
        gpu_seconds={"lost": 600, "startup": 60, "effective": 2940},
        rates=[],
    )
    assert [share.credited_gpu_s(credit_due=True) for share in shares] == [660]


@settings(max_examples=300, deadline=None)
@given(
    start_s=st.integers(0, 5 * 86400),
    seconds=st.integers(0, 4 * 86400),
    gpus=st.integers(1, 16),
    weights=st.lists(st.integers(0, 1000), min_size=len(CATEGORIES), max_size=len(CATEGORIES)),
    policies=st.lists(st.booleans(), min_size=4, max_size=4),
    due=st.booleans(),
)
def test_the_days_of_an_attempt_are_credited_its_credit_to_the_second(
    start_s, seconds, gpus, weights, policies, due
):
    # Cards start on days 0, 2, 3 and 5, each crediting or charging per ``policies``.
    starts = [0, 2, 3, 5]
    rates = [
        rate(day, starts[i + 1] if i + 1 < len(starts) else None, "1.00", credits=policies[i])
        for i, day in enumerate(starts)
    ]
    allocated = gpus * seconds
    total_weight = sum(weights) or 1
    whole = {
        name: allocated * weight // total_weight
        for name, weight in zip(CATEGORIES, weights, strict=True)
    }
    whole["effective"] += allocated - sum(whole.values())
    start = MARCH_1 + timedelta(seconds=start_s)

    shares = split_attempt(
        start=start, end=start + timedelta(seconds=seconds), gpu_seconds=whole, rates=rates
    )

    credits = [share.credited_gpu_s(credit_due=due) for share in shares]
    assert sum(share.allocated_gpu_s for share in shares) == allocated
    for credit, share in zip(credits, shares, strict=True):
        assert 0 <= credit <= share.allocated_gpu_s
    if due and all(policies):
        assert sum(credits) == whole["lost"] + whole["startup"]
    if not due or not any(policies):
        assert sum(credits) == 0
    assert sum(credits) <= whole["lost"] + whole["startup"]
