"""Rate cards and the DailyUsage rollup: attempts cut into UTC days and priced exactly."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from finance import costing, selectors, services
from finance.costing import CATEGORIES, Rate, attempt_cost, split_attempt
from finance.models import DailyUsage, RateCard, UsageRollupState
from jobs.models import Attempt, AttemptState
from telemetry.models import AttemptAccounting
from tenants.models import AuditEvent
from tests.jobs.test_lifecycle import submit

T0 = datetime(2026, 3, 1, 18, 0, tzinfo=UTC)
MARCH_2 = datetime(2026, 3, 2, tzinfo=UTC)


def rates(*cards: tuple[datetime, datetime | None, str]) -> list[Rate]:
    return [Rate(start, end, Decimal(price)) for start, end, price in cards]


# --- costing (pure) -------------------------------------------------------------------------


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


# --- rate cards -------------------------------------------------------------------------------


def test_a_new_rate_card_ends_the_current_one_and_both_are_audited(world):
    first = services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="2.50",
        currency="eur",
        valid_from=date(2026, 1, 1),
        actor=world.finance,
    )

    second = services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="3",
        currency="EUR",
        valid_from=date(2026, 3, 1),
        actor=world.platform_admin,
    )

    first.refresh_from_db()
    assert (first.currency, first.valid_to, second.valid_to) == ("EUR", date(2026, 3, 1), None)
    assert list(AuditEvent.objects.order_by("pk").values_list("action", "target")) == [
        ("ratecard.add", "a100-80gb@2026-01-01"),
        ("ratecard.end", "a100-80gb@2026-01-01"),
        ("ratecard.add", "a100-80gb@2026-03-01"),
    ]
    assert UsageRollupState.objects.get().rates_changed_from == date(2026, 1, 1)


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour", "A price cannot be negative."),
        ({"price_per_gpu_hour": "abc"}, "price_per_gpu_hour", "Enter a price such as 2.50."),
        (
            {"price_per_gpu_hour": "2.123456"},
            "price_per_gpu_hour",
            "Enter at most 100,000 with up to 4 decimal places.",
        ),
        (
            {"currency": "USD"},
            "currency",
            "Every rate card is in EUR: statements add up in one currency.",
        ),
        ({"currency": "euro"}, "currency", "Enter a three-letter ISO 4217 code such as EUR."),
        (
            {"valid_from": date(2026, 1, 1)},
            "valid_from",
            "The current card of a100-80gb starts on 2026-01-01; a new card must start after it "
            "(it then ends the current one).",
        ),
    ],
)
def test_a_bad_rate_card_is_refused_with_a_clear_error_and_changes_nothing(
    world, values, field, message
):
    services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="2.50",
        currency="EUR",
        valid_from=date(2026, 1, 1),
        actor=world.finance,
    )
    before = (list(RateCard.objects.values()), AuditEvent.objects.count())

    with pytest.raises(ValidationError) as error:
        services.rate_card_add(
            flavor=world.a100,
            actor=world.finance,
            **{"price_per_gpu_hour": "3", "currency": "EUR", "valid_from": date(2026, 2, 1)}
            | values,
        )

    assert error.value.message_dict[field] == [message]
    assert (list(RateCard.objects.values()), AuditEvent.objects.count()) == before


def test_only_finance_and_platform_admins_manage_rate_cards(world):
    with pytest.raises(PermissionDenied):
        services.rate_card_add(
            flavor=world.a100,
            price_per_gpu_hour="1",
            currency="EUR",
            valid_from=date(2026, 1, 1),
            actor=world.tenant_admin_a,
        )
    assert not RateCard.objects.exists()


# --- DailyUsage ------------------------------------------------------------------------------


def finished(world, *, start: datetime, hours: float, user=None, **waste) -> Attempt:
    run = submit(world, user=user)
    attempt = Attempt.objects.create(
        run=run,
        number=1,
        cluster=world.cluster,
        state=AttemptState.SUCCEEDED,
        started_at=start,
        finished_at=start + timedelta(hours=hours),
    )
    allocated = round(run.gpus * hours * 3600)
    AttemptAccounting.objects.create(
        attempt=attempt,
        allocated_gpu_s=allocated,
        effective_gpu_s=allocated - sum(waste.values()),
        **{f"{name}_gpu_s": waste.get(name, 0) for name in CATEGORIES if name != "effective"},
        activity_weighted_gpu_s=0,
        computed_at=attempt.finished_at,
    )
    return attempt


def usage_rows() -> list[tuple]:
    return list(
        DailyUsage.objects.order_by("date", "user_id").values_list(
            "date",
            "user__username",
            "attempts",
            "allocated_gpu_s",
            "effective_gpu_s",
            "idle_gpu_s",
            "unpriced_gpu_s",
            "rate_card__price_per_gpu_hour",
        )
    )


def test_daily_usage_reconciles_with_attempt_accounting_to_the_second_and_the_cent(world):
    services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="2.50",
        currency="EUR",
        valid_from=date(2026, 1, 1),
        actor=world.finance,
    )
    services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="3.00",
        currency="EUR",
        valid_from=date(2026, 3, 2),
        actor=world.finance,
    )
    attempts = [
        finished(world, start=T0, hours=12, idle=600),  # across midnight and the new price
        finished(world, start=T0 + timedelta(hours=1), hours=1, user=world.researcher_a2),
        finished(world, start=MARCH_2 + timedelta(hours=3), hours=0.5, input_wait=100),
    ]

    summary = services.daily_usage_update(now=MARCH_2 + timedelta(days=1))

    # New rate cards reprice every day from the first card's start (Jan 1 to Mar 3).
    assert (summary.days, summary.rows) == (62, 3)
    # 2 GPUs each. Alice's 12 h: 6 h of March 1 at 2.50 and 6 h of March 2 at 3.00. A row
    # holds whole GPU-seconds and names the card in force on its day, no money.
    assert usage_rows() == [
        (date(2026, 3, 1), "alice", 1, 43200, 42900, 300, 0, Decimal("2.5000")),
        (date(2026, 3, 1), "arthur", 1, 7200, 7200, 0, 0, Decimal("2.5000")),
        (date(2026, 3, 2), "alice", 2, 46800, 46400, 300, 0, Decimal("3.0000")),
    ]
    assert sum(DailyUsage.objects.values_list("allocated_gpu_s", flat=True)) == sum(
        AttemptAccounting.objects.values_list("allocated_gpu_s", flat=True)
    )
    # The lines: alice at 2.50, 43,200 GPU-s = 30.00 (effective 42,900 = 29.79…, 29.79);
    # arthur at 2.50, 5.00; alice at 3.00, 46,800 GPU-s = 39.00 (effective 46,400 = 38.666…,
    # 38.67). The total is their sum.
    total = selectors.statement_month(tenant=world.vision, month=date(2026, 3, 1)).total
    assert (total.allocated_gpu_s, total.cost, total.effective_cost) == (
        97200,
        Decimal("74.00"),
        Decimal("73.46"),
    )
    assert total.cost == sum(
        costing.attempt_cost(
            start=a.started_at,
            end=a.finished_at,
            allocated_gpu_s=a.accounting.allocated_gpu_s,
            rates=selectors.rate_cards_for([world.a100.pk])[world.a100.pk],
        )
        for a in attempts
    )


def test_rebuilding_a_day_gives_identical_rows_and_a_new_price_reprices_the_days_after_it(world):
    services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="2.00",
        currency="EUR",
        valid_from=date(2026, 1, 1),
        actor=world.finance,
    )
    finished(world, start=T0, hours=12)
    services.daily_usage_update(now=MARCH_2)
    rows = usage_rows()

    services.daily_usage_rebuild(days=[date(2026, 3, 1), date(2026, 3, 2)])
    again = services.daily_usage_update(now=MARCH_2)

    assert usage_rows() == rows
    assert [row[-1] for row in rows] == [Decimal("2.0000"), Decimal("2.0000")]
    assert again.days == 2  # the accounting computed within the watermark lag is redone

    services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour="4.00",
        currency="EUR",
        valid_from=date(2026, 3, 2),
        actor=world.finance,
    )
    services.daily_usage_update(now=MARCH_2 + timedelta(hours=12))

    assert [row[-1] for row in usage_rows()] == [Decimal("2.0000"), Decimal("4.0000")]
    statement = selectors.statement_month(tenant=world.vision, month=date(2026, 3, 1))
    assert statement.total.cost == Decimal("72.00")  # 12 h of 2 GPUs: 6 at 2.00, 6 at 4.00
    assert UsageRollupState.objects.get().rates_changed_from is None
