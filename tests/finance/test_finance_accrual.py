"""The open month's cost so far, accrued: the statement plus the GPU time of attempts not in
it yet (running, or ended and not rolled up), up to the clock's now, priced like a line.

The world of ``test_finance_pages`` (March 2025 rolled up, a100 at 2.50 EUR per GPU-hour),
plus a100 at 3.00 from 3 April and, with the clock at 2025-04-03 10:00:30.5 UTC:

    attempt  user    state      held (UTC)                   GPUs  April GPU-s  cost
    r1       alice   running    04-02 10:00 → now            2     172 860      70.00 + 60.05
    r2       arthur  running    03-31 23:00 → now            2     417 660      240.00 + 60.05
                                (and March's last hour:       2       7 200      5.00)
    ended    alice   succeeded  04-01 00:00 → 02:00           2      14 400      10.00
                                (no accounting yet)
    queued   alice   submitting never started                 2           0       0

r1 at 2.50 for 14 h × 2 GPUs = 70.00, then 10:00:30 × 2 GPUs at 3.00 = 60.05 (the half
second is not held yet: whole seconds); r2 at 2.50 for 48 h × 2 = 240.00, then 60.05; the
ended attempt 2 h × 2 GPUs at 2.50 = 10.00.
"""

from datetime import UTC, date, datetime

import pytest
import time_machine

from finance.accrual import accrual_month
from finance.services import daily_usage_update
from jobs.models import Attempt, AttemptState
from telemetry.models import AttemptAccounting
from tests.finance.test_finance_pages import (  # noqa: F401 (march is a fixture)
    MARCH_ROWS,
    STATEMENT_URL,
    add_rate,
    csv_rows,
    export_url,
    get,
    kpi,
    march,
    submit,
    table_rows,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 4, 3, 10, 0, 30, 500000, tzinfo=UTC)
APRIL_URL = "/finance/vision/2025-04/"


def attempt(world, run, *, state, start=None, end=None) -> Attempt:
    return Attempt.objects.create(
        run=run,
        number=run.attempts.count() + 1,
        cluster=world.cluster,
        state=state,
        started_at=start,
        finished_at=end,
    )


@pytest.fixture
def april(world, request):
    request.getfixturevalue("march")
    add_rate(world, price="3.00", valid_from=date(2025, 4, 3))
    alice, arthur = world.researcher_a, world.researcher_a2
    runs = {
        "r1": attempt(
            world,
            submit(world, alice, name="r1"),
            state=AttemptState.RUNNING,
            start=datetime(2025, 4, 2, 10, tzinfo=UTC),
        ),
        "r2": attempt(
            world,
            submit(world, arthur, name="r2"),
            state=AttemptState.RUNNING,
            start=datetime(2025, 3, 31, 23, tzinfo=UTC),
        ),
        "ended": attempt(
            world,
            submit(world, alice, name="ended"),
            state=AttemptState.SUCCEEDED,
            start=datetime(2025, 4, 1, tzinfo=UTC),
            end=datetime(2025, 4, 1, 2, tzinfo=UTC),
        ),
        "queued": attempt(
            world, submit(world, alice, name="queued"), state=AttemptState.SUBMITTING
        ),
    }
    # nlp's running attempt is nlp's, never vision's.
    attempt(
        world,
        submit(world, world.researcher_b, name="nlp-run", tenant="nlp", project="llm"),
        state=AttemptState.RUNNING,
        start=datetime(2025, 4, 3, 9, tzinfo=UTC),
    )
    daily_usage_update(now=NOW)  # the ended attempt has no accounting: not rolled up
    return runs


@time_machine.travel(NOW, tick=False)
def test_the_open_months_accrual_counts_running_and_unrolled_attempts_to_the_cent(world, april):
    accrual = accrual_month(tenant=world.vision, month=date(2025, 4, 1), now=NOW)

    assert accrual.attempts == 3
    assert accrual.gpu_s == 172_860 + 417_660 + 14_400
    assert str(accrual.cost) == "440.10"  # 130.05 + 300.05 + 10.00
    assert accrual.unpriced_gpu_s == 0


@time_machine.travel(NOW, tick=False)
def test_the_open_months_statement_shows_its_cost_so_far_labelled_accrued(client, world, april):
    content = get(client, world.finance, APRIL_URL).content.decode()

    assert "Cost so far, accrued" in content
    assert "(to 2025-04-03 10:00 UTC)" in content
    assert kpi(content, "statement-cost") == "0.00 EUR"
    assert kpi(content, "accrual-cost") == "440.10 EUR, 3 attempts, 168.03 GPU-hours"
    assert kpi(content, "accrued-cost") == "440.10 EUR, 168.03 GPU-hours"


@time_machine.travel(NOW, tick=False)
def test_a_closed_month_with_an_attempt_running_across_its_end_shows_that_accrual(
    client, world, april
):
    content = get(client, world.finance, STATEMENT_URL).content.decode()

    # r2's last hour of March, 2 GPUs at 2.50, beside March's 40.00 statement.
    assert kpi(content, "statement-cost") == "40.00 EUR"
    assert kpi(content, "accrual-cost") == "5.00 EUR, 1 attempt, 2.00 GPU-hours"
    assert kpi(content, "accrued-cost") == "45.00 EUR, 20.00 GPU-hours"


@time_machine.travel(NOW, tick=False)
def test_the_index_shows_each_tenants_open_month_accrued(client, world, april):
    content = get(client, world.finance, "/finance/").content.decode()

    assert "Apr 2025 so far, accrued" in content
    # nlp: 2 GPUs for 1:00:30 at 3.00 = 6.05; vision as on its statement.
    assert table_rows(content, "review") == [
        [
            "NLP Group (nlp)",
            "2.00",
            "5.00 EUR",
            "6.05 EUR incl. 6.05 of 1 attempt running or not yet rolled up",
        ],
        [
            "Vision Lab (vision)",
            "18.00",
            "40.00 EUR",
            "440.10 EUR incl. 440.10 of 3 attempts running or not yet rolled up",
        ],
    ]


def test_once_rolled_up_an_ended_attempt_leaves_the_accrual_for_the_statement(world, april):
    ended = april["ended"]
    AttemptAccounting.objects.create(
        attempt=ended,
        allocated_gpu_s=14_400,
        effective_gpu_s=14_400,
        **{
            f"{name}_gpu_s": 0
            for name in ("lost", "startup", "checkpoint", "idle", "input_wait", "comm_wait")
        },
        activity_weighted_gpu_s=0.0,
        computed_at=NOW,
    )
    daily_usage_update(now=NOW)

    accrual = accrual_month(tenant=world.vision, month=date(2025, 4, 1), now=NOW)
    assert (accrual.attempts, str(accrual.cost)) == (2, "430.10")


@pytest.mark.usefixtures("march")
def test_the_export_form_says_what_a_row_is_and_the_export_holds_exactly_that(client, world):
    """The form promises one row per statement line of a month, not per day: March's export
    is March's statement lines, and beta, over two days (03-10 22:00 for 4 h), is one row."""
    content = " ".join(get(client, world.finance, "/finance/").content.decode().split())
    assert "One row per day" not in content
    assert "One row per statement line: per calendar month" in content

    response = get(
        client,
        world.finance,
        export_url("csv", tenant="vision", **{"from": "2025-03-01", "to": "2025-03-31"}),
    )

    assert csv_rows(response)[1:] == MARCH_ROWS
