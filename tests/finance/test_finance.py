"""Rate cards and the DailyUsage rollup: attempts cut into UTC days and priced exactly.
The pure cut and pricing (finance.costing) are tested in test_costing.py."""

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from finance import costing, services
from finance.models import DailyUsage, RateCard, UsageRollupState
from finance.selectors.rate_cards import rate_cards_for
from finance.selectors.statements import statement_month
from jobs.models import Attempt, AttemptState
from telemetry.accounting import WASTE
from telemetry.models import AttemptAccounting
from tenants.models import AuditEvent
from tests.jobs.test_lifecycle import submit

T0 = datetime(2026, 3, 1, 18, 0, tzinfo=UTC)
MARCH_2 = datetime(2026, 3, 2, tzinfo=UTC)


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
        **{f"{name}_gpu_s": waste.get(name, 0) for name in WASTE},
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
    total = statement_month(tenant=world.vision, month=date(2026, 3, 1)).total
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
            rates=rate_cards_for([world.a100.pk])[world.a100.pk],
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
    statement = statement_month(tenant=world.vision, month=date(2026, 3, 1))
    assert statement.total.cost == Decimal("72.00")  # 12 h of 2 GPUs: 6 at 2.00, 6 at 4.00
    assert UsageRollupState.objects.get().rates_changed_from is None
