"""Gantry's numbers at date edges: UTC midnight, month and year ends, 29 February, a rate
change at midnight; budgets, budget alerts, fair share, KPI windows and admission at the
first second of a month.

The clock is controlled: ``time_machine`` travels without ticking for every write that reads
the clock, and functions that take ``now=`` are given it. Every run is made the way runs are
(submitted, admitted, submitted to the simulator, then the backend's status is applied), so
the monthly ledger, attempt accounting and DailyUsage are written by their own services.
"""

import math
import re
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.urls import reverse
from django.utils.html import strip_tags

from clusters.backends import JobStatus
from finance import services as finance_services
from finance.costing import line_cost
from finance.models import DailyUsage
from finance.selectors.statements import statement_month
from jobs.models import Attempt, BudgetAlert, FairShareUsage, RunEvent, TenantMonthUsage
from jobs.selectors.queue import gpu_hours_this_month
from jobs.services import budgets
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_apply_status
from jobs.services.submission import run_submit
from telemetry.kpis import selectors as kpi_selectors
from telemetry.kpis.metrics import Ratio
from telemetry.kpis.selectors import KpiScope
from telemetry.services import accounting_compute_pending, sdk_events_ingest
from tenants.models import Notification, Quota
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

GPUS = 2  # experiment_input's 1 node x 2 GPUs
STARTUP_S = 1050  # the first step window starts 17.5 minutes after the GPUs are allocated
PRICE = Decimal("3.60")  # per GPU-hour: a cent per 10 GPU-seconds
KEY = ("vision", "a100-80gb")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


# --- runs made the way every run is made -------------------------------------------------------


def attempt_of(attempt_id: int) -> Attempt:
    return Attempt.objects.select_related("run", "cluster").get(pk=attempt_id)


def start(world, *, at: datetime, submitted: datetime | None = None, **overrides) -> Attempt:
    """A run of vision by alice (2 a100 GPUs unless ``overrides`` say otherwise), submitted
    5 minutes before ``at`` unless said, admitted, placed on the simulator, RUNNING from
    ``at``."""
    submitted = submitted or at - timedelta(minutes=5)
    with time_machine.travel(submitted, tick=False):
        run = run_submit(user=world.researcher_a, data=experiment_input(world, **overrides))
        admission_run_cycle(now=submitted)
        attempt_submit(attempt_id=run.attempts.get().pk)
    attempt = run.attempts.get()
    with time_machine.travel(at, tick=False):
        attempt_apply_status(
            attempt=attempt_of(attempt.pk), status=JobStatus(state="RUNNING", started_at=at), now=at
        )
    return attempt_of(attempt.pk)


def report_first_step(attempt: Attempt) -> None:
    """The job's SDK reports its first one-minute step window STARTUP_S after the start."""
    begin = attempt.started_at + timedelta(seconds=STARTUP_S)
    window = {
        "seq": 1,
        "type": "step_window",
        "ts": (begin + timedelta(minutes=1)).timestamp(),
        "start": begin.timestamp(),
        "end": (begin + timedelta(minutes=1)).timestamp(),
        "steps": 60,
        "step_time_s": 1.0,
    }
    with time_machine.travel(begin + timedelta(minutes=1), tick=False):
        result = sdk_events_ingest(attempt=attempt, source="rank0", events=[window])
    assert (result.accepted, result.rejected) == (1, 0)


def finish(attempt: Attempt, *, at: datetime) -> Attempt:
    with time_machine.travel(at, tick=False):
        attempt_apply_status(
            attempt=attempt_of(attempt.pk),
            status=JobStatus(state="SUCCEEDED", finished_at=at),
            now=at,
        )
    return attempt_of(attempt.pk)


def ran(world, *, start_at: datetime, end_at: datetime, **options) -> Attempt:
    """A run that held its GPUs over [start_at, end_at) and succeeded."""
    return finish(start(world, at=start_at, **options), at=end_at)


def roll_up(*, at: datetime) -> None:
    """The workers' periodic accounting and DailyUsage rollup, run at ``at``."""
    with time_machine.travel(at, tick=False):
        accounting_compute_pending()
        finance_services.daily_usage_update(now=at)


def price(world, amount: str, *, valid_from: date) -> None:
    finance_services.rate_card_add(
        flavor=world.a100,
        price_per_gpu_hour=amount,
        currency="EUR",
        valid_from=valid_from,
        actor=world.finance,
    )


# --- reading the figures --------------------------------------------------------------------------


def daily_rows() -> list[tuple]:
    """Each day's row, with the cost of its GPU-seconds alone on a line."""
    rows = DailyUsage.objects.order_by("date").values_list(
        "date",
        "attempts",
        "allocated_gpu_s",
        "startup_gpu_s",
        "effective_gpu_s",
        "unpriced_gpu_s",
        "rate_card__price_per_gpu_hour",
    )
    return [
        (
            *row[:-1],
            line_cost(gpu_s=row[2], price_per_gpu_hour=row[-1]),
            line_cost(gpu_s=row[4], price_per_gpu_hour=row[-1]),
        )
        for row in rows
    ]


def ledger() -> list[tuple]:
    return list(
        TenantMonthUsage.objects.order_by("month").values_list(
            "tenant__slug", "flavor__slug", "month", "gpu_seconds"
        )
    )


def statement_figures(world, month: date) -> tuple:
    """The statement's total and its lines by flavor (key, allocated GPU-seconds, cost)."""
    statement = statement_month(tenant=world.vision, month=month)
    total = statement.total
    return (
        total.allocated_gpu_s,
        total.startup_gpu_s,
        total.effective_gpu_s,
        total.allocated_hours,
        total.cost,
        total.effective_cost,
        [
            (line.key, line.usage.allocated_gpu_s, line.usage.cost)
            for line in statement.breakdowns["flavor"]
        ],
    )


def text(html: str) -> str:
    return " ".join(strip_tags(html).split())


def quota_row(client, user, tenant_flavor: str) -> list[str]:
    """The cells of the quota page's row ``<tr data-quota="tenant:flavor">``, as text."""
    client.force_login(user)
    response = client.get(reverse("jobs:quota_list"))
    assert response.status_code == 200
    content = response.content.decode()
    match = re.search(rf'<tr data-quota="{tenant_flavor}">(.*?)</tr>', content, re.S)
    assert match, tenant_flavor
    return [text(cell) for cell in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", match.group(1), re.S)]


# --- 1. one attempt across a date edge, in every figure ------------------------------------------

# Each case: (start, end, [(day, allocated, startup, effective, cost, effective cost)],
# {month: statement (allocated, startup, effective, cost, effective cost)}, ledger by month,
# the quota page's budget cell an hour after the end: burn % and GPU-hours this month).
# 2 GPUs; the 2,100 GPU-seconds of startup are shared out over the days by their time, like
# every category; at 3.60 a GPU-hour a cent is 10 GPU-seconds.
EDGE_CASES = {
    "utc-midnight": (
        utc(2026, 3, 10, 22),
        utc(2026, 3, 11, 2),
        [
            (date(2026, 3, 10), 14400, 1050, 13350, "14.40", "13.35"),
            (date(2026, 3, 11), 14400, 1050, 13350, "14.40", "13.35"),
        ],
        {date(2026, 3, 1): (28800, 2100, 26700, "28.80", "26.70")},
        [(date(2026, 3, 1), 28800.0)],
        "40 % 8.0 of 20 GPU-hours (40 %)",
    ),
    "month-end": (
        utc(2026, 4, 30, 21),
        utc(2026, 5, 1, 3),
        [
            (date(2026, 4, 30), 21600, 1050, 20550, "21.60", "20.55"),
            (date(2026, 5, 1), 21600, 1050, 20550, "21.60", "20.55"),
        ],
        {
            date(2026, 4, 1): (21600, 1050, 20550, "21.60", "20.55"),
            date(2026, 5, 1): (21600, 1050, 20550, "21.60", "20.55"),
        },
        [(date(2026, 4, 1), 21600.0), (date(2026, 5, 1), 21600.0)],
        "30 % 6.0 of 20 GPU-hours (30 %)",
    ),
    "year-end": (
        utc(2026, 12, 31, 23),
        utc(2027, 1, 1, 1, 30),
        [  # 1 h of 2.5 h on 31 December: two fifths of every figure
            (date(2026, 12, 31), 7200, 840, 6360, "7.20", "6.36"),
            (date(2027, 1, 1), 10800, 1260, 9540, "10.80", "9.54"),
        ],
        {
            date(2026, 12, 1): (7200, 840, 6360, "7.20", "6.36"),
            date(2027, 1, 1): (10800, 1260, 9540, "10.80", "9.54"),
        },
        [(date(2026, 12, 1), 7200.0), (date(2027, 1, 1), 10800.0)],
        "15 % 3.0 of 20 GPU-hours (15 %)",
    ),
    "29-february": (
        utc(2028, 2, 28, 22),
        utc(2028, 3, 1, 2),
        [  # 2 h, 24 h and 2 h of 28 h: 1/14, 12/14 and 1/14
            (date(2028, 2, 28), 14400, 150, 14250, "14.40", "14.25"),
            (date(2028, 2, 29), 172800, 1800, 171000, "172.80", "171.00"),
            (date(2028, 3, 1), 14400, 150, 14250, "14.40", "14.25"),
        ],
        {
            date(2028, 2, 1): (187200, 1950, 185250, "187.20", "185.25"),
            date(2028, 3, 1): (14400, 150, 14250, "14.40", "14.25"),
        },
        [(date(2028, 2, 1), 187200.0), (date(2028, 3, 1), 14400.0)],
        "20 % 4.0 of 20 GPU-hours (20 %)",
    ),
    "ends-at-the-first-second-of-a-month": (
        utc(2026, 5, 31, 20),
        utc(2026, 6, 1),
        [(date(2026, 5, 31), 28800, 2100, 26700, "28.80", "26.70")],
        {
            date(2026, 5, 1): (28800, 2100, 26700, "28.80", "26.70"),
            date(2026, 6, 1): (0, 0, 0, "0.00", "0.00"),
        },
        [(date(2026, 5, 1), 28800.0)],
        "0 % 0.0 of 20 GPU-hours (0 %)",
    ),
}


@pytest.fixture
def budgeted(world):
    """A hard budget of 20 a100 GPU-hours a month for vision; one price from 2026 on."""
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        monthly_gpu_hour_budget=20, budget_mode=Quota.BudgetMode.HARD
    )
    price(world, str(PRICE), valid_from=date(2026, 1, 1))
    return world


def assert_every_figure(client, world, attempt, *, days, statements, months, budget_now):
    end = attempt.finished_at
    roll_up(at=end + timedelta(hours=1))

    assert attempt.accounting.allocated_gpu_s == GPUS * (end - attempt.started_at).total_seconds()
    assert attempt.accounting.startup_gpu_s == GPUS * STARTUP_S
    assert daily_rows() == [
        (day, 1, allocated, startup, effective, 0, Decimal(cost), Decimal(effective_cost))
        for day, allocated, startup, effective, cost, effective_cost in days
    ]
    for month, (allocated, startup, effective, cost, effective_cost) in statements.items():
        assert statement_figures(world, month) == (
            allocated,
            startup,
            effective,
            Decimal(allocated) / 3600,
            Decimal(cost),
            Decimal(effective_cost),
            [("a100-80gb", allocated, Decimal(cost))] if allocated else [],
        )
    assert ledger() == [("vision", "a100-80gb", month, seconds) for month, seconds in months]
    for month, seconds in months:  # each month's budget sees that month's share only
        mid_month = utc(month.year, month.month, 15, 12)
        assert gpu_hours_this_month(now=mid_month) == {KEY: seconds / 3600}
    with time_machine.travel(end + timedelta(hours=1), tick=False):
        row = quota_row(client, world.researcher_a, "vision:a100-80gb")
    assert row[-1] == f"{budget_now} Hard: runs wait when the budget is spent"


@pytest.mark.parametrize("case", EDGE_CASES)
def test_an_attempt_across_a_date_edge_is_cut_there_in_every_figure(client, budgeted, case):
    # Given a run that holds 2 GPUs across the edge, with 17.5 minutes of startup
    started_at, ended_at, days, statements, months, budget_now = EDGE_CASES[case]
    attempt = start(budgeted, at=started_at)
    report_first_step(attempt)

    # When it ends and the workers account it and roll it up an hour later
    attempt = finish(attempt, at=ended_at)

    # Then DailyUsage, the statements, the budget ledger and the quota page cut it at the edge
    assert_every_figure(
        client,
        budgeted,
        attempt,
        days=days,
        statements=statements,
        months=months,
        budget_now=budget_now,
    )


# 3.60 until 14 June 2026, 7.20 from 00:00 on 15 June. Across that midnight the effective
# cost is 55,500 effective GPU-seconds at the attempt's mean price (5.40), shared 1 : 2 by
# the days' prices.
PRICE_CHANGE_CASES = {
    "across-the-change": (
        utc(2026, 6, 14, 20),
        utc(2026, 6, 15, 4),
        [
            (date(2026, 6, 14), 28800, 1050, 27750, "28.80", "27.75"),
            (date(2026, 6, 15), 28800, 1050, 27750, "57.60", "55.50"),
        ],
        (57600, 2100, 55500, "86.40", "83.25"),
        "80 % 16.0 of 20 GPU-hours (80 %)",
    ),
    "starts-at-the-change": (
        utc(2026, 6, 15),
        utc(2026, 6, 15, 4),
        [(date(2026, 6, 15), 28800, 2100, 26700, "57.60", "53.40")],
        (28800, 2100, 26700, "57.60", "53.40"),
        "40 % 8.0 of 20 GPU-hours (40 %)",
    ),
    "ends-at-the-change": (
        utc(2026, 6, 14, 20),
        utc(2026, 6, 15),
        [(date(2026, 6, 14), 28800, 2100, 26700, "28.80", "26.70")],
        (28800, 2100, 26700, "28.80", "26.70"),
        "40 % 8.0 of 20 GPU-hours (40 %)",
    ),
}


@pytest.mark.parametrize("case", PRICE_CHANGE_CASES)
def test_a_price_change_at_midnight_prices_each_day_by_its_own_card(client, budgeted, case):
    # Given a new price for a100 from 00:00 on 15 June 2026
    price(budgeted, "7.20", valid_from=date(2026, 6, 15))
    started_at, ended_at, days, june, budget_now = PRICE_CHANGE_CASES[case]
    attempt = start(budgeted, at=started_at)
    report_first_step(attempt)

    # When a run holds 2 GPUs across, from or up to that midnight
    attempt = finish(attempt, at=ended_at)

    # Then every second is priced by the card valid at it, to the cent
    assert_every_figure(
        client,
        budgeted,
        attempt,
        days=days,
        statements={date(2026, 6, 1): june},
        months=[(date(2026, 6, 1), GPUS * (ended_at - started_at).total_seconds())],
        budget_now=budget_now,
    )


# --- 2. budgets restart at the first second of a month -------------------------------------


def test_the_budget_month_restarts_at_its_first_second_and_counts_a_running_attempt_from_it(
    client, budgeted
):
    # Given 8 GPU-hours finished on 31 March and 2 GPUs running since 22:00 that evening
    ran(budgeted, start_at=utc(2026, 3, 31, 10), end_at=utc(2026, 3, 31, 14))
    running = start(budgeted, at=utc(2026, 3, 31, 22))
    last_second, first_second = utc(2026, 3, 31, 23, 59, 59), utc(2026, 4, 1)

    # When the month's GPU-hours are read at the last and the first second of a month, and
    # half an hour into April
    used = [
        gpu_hours_this_month(now=moment)
        for moment in (last_second, first_second, utc(2026, 4, 1, 0, 30))
    ]

    # Then March holds all of March's use; April starts at zero and counts the running
    # attempt's GPUs from 00:00:00 only
    assert used == [
        {KEY: (8 * 3600 + GPUS * 7199) / 3600},
        {KEY: 0.0},
        {KEY: 1.0},
    ]
    with time_machine.travel(last_second, tick=False):
        assert quota_row(client, budgeted.researcher_a, "vision:a100-80gb")[-1] == (
            "60 % 12.0 of 20 GPU-hours (60 %) Hard: runs wait when the budget is spent"
        )
    with time_machine.travel(first_second, tick=False):
        assert quota_row(client, budgeted.researcher_a, "vision:a100-80gb")[-1] == (
            "0 % 0.0 of 20 GPU-hours (0 %) Hard: runs wait when the budget is spent"
        )

    # And when it ends at 01:00, the ledger books 2 h to March and 1 h to April
    finish(running, at=utc(2026, 4, 1, 1))
    assert ledger() == [
        ("vision", "a100-80gb", date(2026, 3, 1), 8 * 3600 + GPUS * 2 * 3600.0),
        ("vision", "a100-80gb", date(2026, 4, 1), GPUS * 3600.0),
    ]
    assert gpu_hours_this_month(now=utc(2026, 4, 1, 1)) == {KEY: 2.0}


def budget_message(percent: int, hours: str, month: str) -> str:
    consequence = (
        "new runs wait until the budget is raised or the month ends."
        if percent >= 100
        else "new runs will wait when it is spent."
    )
    return (
        f"Tenant vision has used {percent} % of its 10 a100-80gb GPU-hour budget for {month} "
        f"({hours} GPU-hours). Hard budget: {consequence}"
    )


def test_each_budget_alert_fires_once_a_month_and_again_in_the_next(budgeted):
    # Given a hard budget of 10 a100 GPU-hours a month
    Quota.objects.filter(tenant=budgeted.vision, flavor=budgeted.a100).update(
        monthly_gpu_hour_budget=10
    )

    def check(moment: datetime) -> int:
        return budgets.budget_alerts_check(now=moment)

    # When usage crosses 80 % and 100 % in March, checked twice each time and at the edges
    ran(budgeted, start_at=utc(2026, 3, 30, 10), end_at=utc(2026, 3, 30, 14, 15))  # 8.5
    march_80 = [check(utc(2026, 3, 30, 15)), check(utc(2026, 3, 31, 19))]
    ran(budgeted, start_at=utc(2026, 3, 31, 20), end_at=utc(2026, 3, 31, 20, 45))  # 10.0
    march_100 = [
        check(utc(2026, 3, 31, 23, 59, 59)),
        check(utc(2026, 3, 31, 23, 59, 59, 999999)),
        check(utc(2026, 4, 1)),  # April has used nothing yet
    ]
    # and again in April, from a run submitted and started at 00:00:00
    ran(budgeted, start_at=utc(2026, 4, 1), end_at=utc(2026, 4, 1, 4), submitted=utc(2026, 4, 1))
    april_80 = [check(utc(2026, 4, 1, 4)), check(utc(2026, 4, 1, 4, 30))]
    ran(budgeted, start_at=utc(2026, 4, 1, 5), end_at=utc(2026, 4, 1, 6))
    april_100 = [
        check(utc(2026, 4, 1, 6)),
        check(utc(2026, 4, 30, 23, 59, 59)),
        check(utc(2026, 5, 1)),
    ]

    # Then each threshold fired once in each month, at the first check that saw it
    assert (march_80, march_100, april_80, april_100) == ([1, 0], [1, 0, 0], [1, 0], [1, 0, 0])
    assert list(
        BudgetAlert.objects.order_by("sent_at").values_list(
            "month", "threshold", "used_gpu_hours", "sent_at"
        )
    ) == [
        (date(2026, 3, 1), 80, 8.5, utc(2026, 3, 30, 15)),
        (date(2026, 3, 1), 100, 10.0, utc(2026, 3, 31, 23, 59, 59)),
        (date(2026, 4, 1), 80, 8.0, utc(2026, 4, 1, 4)),
        (date(2026, 4, 1), 100, 10.0, utc(2026, 4, 1, 6)),
    ]
    assert list(
        Notification.objects.filter(user=budgeted.researcher_a)
        .order_by("created_at")
        .values_list("kind", "message")
    ) == [
        ("budget_80", budget_message(85, "8.5", "March 2026")),
        ("budget_100", budget_message(100, "10.0", "March 2026")),
        ("budget_80", budget_message(80, "8.0", "April 2026")),
        ("budget_100", budget_message(100, "10.0", "April 2026")),
    ]


# --- 3. fair share decays continuously across the month boundary ------------------------------


@pytest.fixture
def half_life_24h(settings):
    settings.GANTRY_FAIR_SHARE_HALF_LIFE_H = 24
    return 24 * 3600


def fair_share_of(world, tenant) -> tuple[float, datetime]:
    return (
        FairShareUsage.objects.filter(tenant=tenant, flavor=world.a100)
        .values_list("decayed_gpu_seconds", "updated_at")
        .get()
    )


@pytest.mark.parametrize(
    "cycles",
    [
        pytest.param((utc(2026, 3, 31, 23, 59, 59), utc(2026, 4, 1, 0, 0, 1)), id="two-updates"),
        pytest.param((utc(2026, 4, 1, 0, 0, 1),), id="one-update"),
    ],
)
def test_fair_share_decays_across_the_month_boundary_as_across_any_other_second(
    world, half_life_24h, cycles
):
    # Given nlp's decayed a100 usage of 7,200 GPU-seconds, last updated at noon on 31 March,
    # and nothing held since
    FairShareUsage.objects.create(
        tenant=world.nlp,
        flavor=world.a100,
        decayed_gpu_seconds=7200.0,
        updated_at=utc(2026, 3, 31, 12),
    )

    # When admission cycles run just before and after midnight, or once after it
    for moment in cycles:
        admission_run_cycle(now=moment)

    # Then the value is the same either way: half a half-life and one second of decay, and
    # no monthly reset
    expected = 7200.0 * 0.5 ** (43201 / half_life_24h)
    value, updated_at = fair_share_of(world, world.nlp)
    assert value == pytest.approx(expected, rel=1e-12)
    assert value == pytest.approx(7200.0 * math.sqrt(0.5) * 0.5 ** (1 / half_life_24h), rel=1e-12)
    assert updated_at == utc(2026, 4, 1, 0, 0, 1)


@pytest.mark.parametrize(
    "midnight",
    [
        pytest.param(utc(2026, 4, 1), id="month-boundary"),
        pytest.param(utc(2026, 3, 16), id="mid-month"),
    ],
)
def test_held_gpus_add_to_fair_share_across_the_month_boundary_as_on_any_night(
    world, half_life_24h, midnight
):
    # Given vision holding 2 a100 GPUs, and its decayed usage of 7,200 GPU-seconds updated at
    # noon before midnight
    start(world, at=midnight - timedelta(hours=13))
    FairShareUsage.objects.create(
        tenant=world.vision,
        flavor=world.a100,
        decayed_gpu_seconds=7200.0,
        updated_at=midnight - timedelta(hours=12),
    )

    # When admission cycles run at 23:59:59 and at 00:00:01
    admission_run_cycle(now=midnight - timedelta(seconds=1))
    before_midnight = fair_share_of(world, world.vision)[0]
    admission_run_cycle(now=midnight + timedelta(seconds=1))

    # Then the usage is the exact integral of the decayed GPUs held (docs/admission.md): the
    # same value as one update over the whole 12 h 1 s, whatever lies between the cycles
    tau = half_life_24h / math.log(2)

    def integral(seconds: float) -> float:
        kept = 0.5 ** (seconds / half_life_24h)
        return 7200.0 * kept + GPUS * tau * (1 - kept)

    assert before_midnight == pytest.approx(integral(43199), rel=1e-12)
    assert fair_share_of(world, world.vision) == (
        pytest.approx(integral(43201), rel=1e-12),
        midnight + timedelta(seconds=1),
    )


# --- 4. KPI windows by day and by month --------------------------------------------------------


@pytest.fixture
def around_midnight(world):
    """Three runs of vision, all accounted: on a100, 2 GPUs from 23:00 until 23:59:59 on
    31 March (queued 5 min) and 4 GPUs from 00:00:00 to 01:00 on 1 April (queued 2 min); on
    h100, 2 GPUs from 23:00 on 31 March until 00:00:00 exactly (queued 5 min)."""
    ran(world, start_at=utc(2026, 3, 31, 23), end_at=utc(2026, 3, 31, 23, 59, 59))
    ran(
        world,
        start_at=utc(2026, 4, 1),
        end_at=utc(2026, 4, 1, 1),
        submitted=utc(2026, 3, 31, 23, 58),
        gpus_per_node=4,
    )
    ran(world, start_at=utc(2026, 3, 31, 23), end_at=utc(2026, 4, 1), flavor="h100-80gb")
    with time_machine.travel(utc(2026, 4, 1, 2), tick=False):
        assert accounting_compute_pending() == 3
    return world


# (attempts started, their median queue seconds, runs succeeded of rated, goodput GPU-seconds,
# a100 and h100 GPU-seconds allocated inside the window). The h100 run ends at 00:00:00: its
# outcome and goodput are the new day's, all its GPU time the old day's.
LAST_DAY = (2, 300.0, Ratio(1, 1), Ratio(7198, 7198), GPUS * 3599.0, GPUS * 3600.0)
FIRST_DAY = (1, 120.0, Ratio(2, 2), Ratio(21600, 21600), 4 * 3600.0, 0.0)


@pytest.mark.parametrize(
    ("since", "until", "expected"),
    [
        pytest.param(utc(2026, 3, 31), utc(2026, 4, 1), LAST_DAY, id="31-march"),
        pytest.param(utc(2026, 4, 1), utc(2026, 4, 2), FIRST_DAY, id="1-april"),
        pytest.param(utc(2026, 3, 1), utc(2026, 4, 1), LAST_DAY, id="march"),
        pytest.param(utc(2026, 4, 1), utc(2026, 5, 1), FIRST_DAY, id="april"),
    ],
)
def test_kpi_windows_count_an_attempt_by_its_own_second(around_midnight, since, until, expected):
    # Given attempts ending at 23:59:59 and at 00:00:00, and one starting at 00:00:00

    # When the KPIs of a day or a month are read (after the range)
    kpis = kpi_selectors.platform_kpis(
        scope=KpiScope(since=since, until=until, now=utc(2026, 5, 2))
    )

    # Then each counts in its own day and month only: queue time by start, success and
    # goodput by end, allocation by the seconds inside
    total = kpis.total
    allocated = {row.flavor: row.allocated_gpu_s for row in kpis.allocation}
    assert (
        total.queue.count,
        total.queue.distribution.p50,
        total.success,
        total.goodput,
        allocated["a100-80gb"],
        allocated["h100-80gb"],
    ) == expected


@pytest.mark.parametrize(
    ("day", "expected"),
    [
        (
            "2026-03-31",
            (
                "p50 5 min 00 s · p95 5 min 00 s (2 attempts)",
                "100.0 % (1 of 1 run)",
                "100.0 % (2.00 of 2.00 GPU-hours)",
            ),
        ),
        (
            "2026-04-01",
            (
                "p50 2 min 00 s · p95 2 min 00 s (1 attempt)",
                "100.0 % (2 of 2 runs)",
                "100.0 % (6.00 of 6.00 GPU-hours)",
            ),
        ),
    ],
    ids=["31-march", "1-april"],
)
def test_the_kpi_page_of_a_day_shows_only_that_days_attempts(
    client, around_midnight, day, expected
):
    client.force_login(around_midnight.platform_admin)

    with time_machine.travel(utc(2026, 4, 2, 12), tick=False):
        response = client.get(reverse("telemetry:platform_kpis"), {"from": day, "to": day})

    content = response.content.decode()
    assert response.status_code == 200

    def kpi(name: str) -> str:
        match = re.search(rf'<td[^>]* data-kpi="{name}">(.*?)</td>', content, re.S)
        assert match, name
        return text(match.group(1))

    assert (kpi("queue"), kpi("success"), kpi("goodput")) == expected


# --- 5. admission at the last and the first tenth of a second of a month ------------------------


def test_a_spent_hard_budget_holds_a_run_until_the_first_cycle_of_the_next_month(budgeted):
    # Given vision's hard budget of 10 GPU-hours: 4 finished on 31 March and 2 GPUs running
    # since 18:00, 16.0 by midnight; a run submitted at 23:00 waits in the queue
    Quota.objects.filter(tenant=budgeted.vision, flavor=budgeted.a100).update(
        monthly_gpu_hour_budget=10
    )
    ran(budgeted, start_at=utc(2026, 3, 31, 8), end_at=utc(2026, 3, 31, 10))
    start(budgeted, at=utc(2026, 3, 31, 18))
    with time_machine.travel(utc(2026, 3, 31, 23), tick=False):
        run = run_submit(user=budgeted.researcher_a, data=experiment_input(budgeted))

    # When admission cycles run at 23:59:59.8 and .9 on 31 March and at 00:00:00.1 and .2 on
    # 1 April
    seen = []
    for moment in (
        utc(2026, 3, 31, 23, 59, 59, 800000),
        utc(2026, 3, 31, 23, 59, 59, 900000),
        utc(2026, 4, 1, 0, 0, 0, 100000),
        utc(2026, 4, 1, 0, 0, 0, 200000),
    ):
        with time_machine.travel(moment, tick=False):
            admission_run_cycle(now=moment)
        run.refresh_from_db()
        seen.append((run.state, run.wait_reason, run.wait_message, run.admitted_at))

    # Then it waits for the budget in March and is admitted by April's first cycle, once
    waiting = (
        "QUEUED",
        "BUDGET_EXHAUSTED",
        "tenant vision has used 16 of its 10 a100-80gb GPU-hour budget this month (hard limit)",
        None,
    )
    admitted = (
        "ADMITTED",
        "",
        "Placed on sim-1 (sim-1-a100-80gb-00); being submitted",
        utc(2026, 4, 1, 0, 0, 0, 100000),
    )
    assert seen == [waiting, waiting, admitted, admitted]
    assert list(
        RunEvent.objects.filter(run=run)
        .order_by("pk")
        .values_list("from_state", "to_state", "reason", "message", "at")
    ) == [
        ("", "QUEUED", "SUBMITTED", "Submitted", utc(2026, 3, 31, 23)),
        (
            "QUEUED",
            "ADMITTED",
            "ADMITTED",
            "Admitted to sim-1 on sim-1-a100-80gb-00: 2 a100-80gb GPUs within its guarantee",
            utc(2026, 4, 1, 0, 0, 0, 100000),
        ),
    ]
    assert run.attempts.count() == 1
