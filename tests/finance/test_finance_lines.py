"""Issue 21, acceptance 7: money adds up per line. A statement line is the GPU-seconds of one
project, user, flavor and cluster under one rate card in the month; its cost is those whole
GPU-seconds × the price, rounded once, half to even, to the cent. Totals, breakdowns, the
trend and the exports are sums of lines, so they add up exactly, and they stay within half a
cent per line of the exact GPU-seconds × rate."""

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from finance.models import DailyUsage
from finance.selectors.statements import statement_month
from finance.services import daily_usage_update, rate_card_add
from jobs.models import Attempt, AttemptState
from telemetry.accounting import WASTE
from telemetry.models import AttemptAccounting
from tests.finance.test_finance_pages import export_url, get
from tests.jobs.test_lifecycle import submit

MARCH = date(2026, 3, 1)
ROLLUP_AT = datetime(2026, 4, 1, 6, tzinfo=UTC)


def attempts_of(world, run, spans: list[tuple[datetime, int]]) -> None:
    """Finished attempts of ``run``, each [start, start + seconds), all of it effective."""
    for number, (start, seconds) in enumerate(spans, start=run.attempts.count() + 1):
        attempt = Attempt.objects.create(
            run=run,
            number=number,
            cluster=world.cluster,
            state=AttemptState.SUCCEEDED,
            started_at=start,
            finished_at=start + timedelta(seconds=seconds),
        )
        AttemptAccounting.objects.create(
            attempt=attempt,
            allocated_gpu_s=run.gpus * seconds,
            effective_gpu_s=run.gpus * seconds,
            **{f"{name}_gpu_s": 0 for name in WASTE},
            activity_weighted_gpu_s=0,
            computed_at=ROLLUP_AT,
        )


def price(world, amount: str, valid_from: date) -> None:
    rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour=amount,
        currency="EUR",
        valid_from=valid_from,
        actor=world.finance,
    )


def test_a_hundred_short_attempts_cost_their_gpu_seconds_times_the_rate(client, world):
    # Given 100 attempts of 7 s on 1 GPU at 2.99 a GPU-hour. Alone, each costs 0.0058…, a
    # cent when rounded: summing per-attempt cents made 1.00, 72 % above the 0.58 they cost.
    price(world, "2.99", date(2026, 1, 1))
    run = submit(world, gpus_per_node=1)
    attempts_of(
        world,
        run,
        [(datetime(2026, 3, 3, tzinfo=UTC) + timedelta(minutes=n), 7) for n in range(100)],
    )

    # When they are rolled up
    daily_usage_update(now=ROLLUP_AT)

    # Then the line is 700 GPU-s * 2.99 / 3600 = 0.5813…, rounded once: 0.58
    statement = statement_month(tenant=world.vision, month=MARCH)
    assert (statement.total.allocated_gpu_s, statement.total.cost) == (700, Decimal("0.58"))
    assert [line.usage.cost for line in statement.breakdowns["user"]] == [Decimal("0.58")]
    # and the export of the month has the same line
    response = get(
        client,
        world.finance,
        export_url("csv", tenant="vision", **{"from": "2026-03-01", "to": "2026-03-31"}),
    )
    body = b"".join(response.streaming_content).decode().splitlines()
    assert body[1].split(",")[7:9] == ["2.9900", "0.194444"]
    assert body[1].split(",")[-4:] == ["0.58", "0.58", "0.00", "EUR"]


attempt_spans = st.lists(
    st.tuples(
        st.integers(0, 1),  # which user
        st.integers(0, 6 * 86400 - 1),  # start, in seconds after March 1 (some cross midnight)
        st.integers(1, 600),  # length: short attempts above all
    ),
    min_size=1,
    max_size=30,
)
rate_changes = st.lists(
    st.tuples(st.integers(-3, 5), st.decimals("0", "99.9999", places=4)),  # day in March, price
    min_size=1,
    max_size=4,
    unique_by=lambda change: change[0],
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spans=attempt_spans, changes=rate_changes)
def test_every_line_is_its_exact_amount_rounded_once_and_the_totals_add_up(world, spans, changes):
    with transaction.atomic():
        run_of = [submit(world, user=world.researcher_a), submit(world, user=world.researcher_a2)]
        cards = []  # (start, price), in order; each ends where the next starts
        for day, amount in sorted(changes):
            start = MARCH + timedelta(days=day)
            price(world, str(amount), start)
            cards.append((datetime.combine(start, datetime.min.time(), tzinfo=UTC), amount))
        base = datetime(2026, 3, 1, tzinfo=UTC)
        # Expected, straight from the definition: each user's GPU-seconds in March under each
        # card * its price, summed exactly, rounded once per line.
        exact: dict[tuple[int, int], Fraction] = defaultdict(Fraction)
        gpu_s_in_march = 0
        for who, offset, seconds in spans:
            run = run_of[who]
            start = base + timedelta(seconds=offset)
            attempts_of(world, run, [(start, seconds)])
            end = start + timedelta(seconds=seconds)  # March 7 at the latest
            gpu_s_in_march += run.gpus * seconds
            for index, (card_start, amount) in enumerate(cards):
                card_end = cards[index + 1][0] if index + 1 < len(cards) else end
                overlap = (min(end, card_end) - max(start, card_start)).total_seconds()
                if overlap > 0:
                    exact[(who, index)] += (
                        Fraction(run.gpus * int(overlap)) * Fraction(amount) / 3600
                    )
        lines = {key: Decimal(round(amount * 100)).scaleb(-2) for key, amount in exact.items()}
        expected_total = sum(lines.values(), Decimal("0.00"))

        daily_usage_update(now=ROLLUP_AT)
        statement = statement_month(tenant=world.vision, month=MARCH)

        # Each line is its exact amount rounded once (line by line, through the users'
        # breakdown of every card), the total is the sum of the lines
        assert statement.total.cost == expected_total
        by_user = {line.key: line.usage.cost for line in statement.breakdowns["user"]}
        for who, user in enumerate((world.researcher_a, world.researcher_a2)):
            mine = sum((cost for (w, _), cost in lines.items() if w == who), Decimal("0.00"))
            assert by_user.get(user.username, Decimal("0.00")) == mine
        # every breakdown adds up to the total, and the total is within half a cent per line
        # of the exact amount
        for found in statement.breakdowns.values():
            assert sum((line.usage.cost for line in found), Decimal("0.00")) == statement.total.cost
        exact_total = sum(exact.values(), Fraction(0))
        assert abs(Fraction(statement.total.cost) - exact_total) <= Fraction(5, 1000) * len(lines)
        # and the GPU-hours reconcile with the accounting
        assert statement.total.allocated_gpu_s == gpu_s_in_march
        assert sum(DailyUsage.objects.values_list("allocated_gpu_s", flat=True)) == sum(
            AttemptAccounting.objects.values_list("allocated_gpu_s", flat=True)
        )
        transaction.set_rollback(True)
