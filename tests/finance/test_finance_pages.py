"""Finance pages: monthly statements, drill-down, rate cards, CSV and XLSX exports.

Attempts and their accounting are written with the ORM at exact times, rate cards through
``rate_card_add`` and DailyUsage by the real rollup, so every number on the pages is known.

The month of the statements is March 2025, tenant vision, a100 at 2.50 EUR per GPU-hour,
h100 without a rate card. Every run has 2 GPUs:

    run      user    project       flavor cluster  attempt (UTC)            GPU-s  cost
    alpha    alice   detection     a100   sim-1    03-03 09:00, 3 h         21600  15.00
             (startup 1800, idle 3600: effective 16200, 11.25)
    beta     arthur  segmentation  a100   slurm-1  03-10 22:00, 4 h         28800  20.00
    gamma    alice   detection     h100   sim-1    03-20 00:00, 1 h          7200   0.00 unpriced
    epsilon  arthur  detection     a100   sim-1    02-28 23:00, 2 h: half in March 7200  5.00
    nlp's    bob     llm           a100   sim-1    03-05 10:00, 1 h (another tenant)
"""

import csv
import io
import json
import re
from dataclasses import asdict, fields
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import strip_tags
from openpyxl import load_workbook

from clusters.models import Cluster
from finance import costing
from finance import views as finance_views
from finance.models import DailyUsage, RateCard
from finance.selectors.exports import EXPORT_COLUMNS
from finance.selectors.rate_cards import rate_cards_for
from finance.selectors.statements import statement_month
from finance.services import daily_usage_update, rate_card_add
from jobs.models import Attempt, AttemptState, Run
from jobs.services.submission import run_submit
from telemetry.accounting import WASTE
from telemetry.models import AttemptAccounting
from tenants.models import AuditEvent, Membership, Project, Quota
from tests.conftest import experiment_input, make_user

pytestmark = pytest.mark.django_db

MARCH = date(2025, 3, 1)
ROLLUP_AT = datetime(2025, 4, 1, 6, 0, tzinfo=UTC)
STATEMENT_URL = "/finance/vision/2025-03/"


# --- helpers -------------------------------------------------------------------------------


def submit(world, user, **overrides) -> Run:
    return run_submit(user=user, data=experiment_input(world, **overrides))


def ran(
    world, run: Run, *, start: datetime, hours: float, cluster: Cluster | None = None, **waste
) -> Attempt:
    """A finished attempt of ``run`` over [start, start + hours) with its accounting: the
    waste categories given (GPU-seconds), the rest effective."""
    end = start + timedelta(hours=hours)
    attempt = Attempt.objects.create(
        run=run,
        number=run.attempts.count() + 1,
        cluster=cluster or world.cluster,
        state=AttemptState.SUCCEEDED,
        started_at=start,
        finished_at=end,
    )
    allocated = round(run.gpus * hours * 3600)
    AttemptAccounting.objects.create(
        attempt=attempt,
        allocated_gpu_s=allocated,
        effective_gpu_s=allocated - sum(waste.values()),
        **{f"{name}_gpu_s": waste.get(name, 0) for name in WASTE},
        activity_weighted_gpu_s=0.0,
        computed_at=ROLLUP_AT,  # accounting computed late: every rollup picks it up
    )
    return attempt


def add_rate(world, flavor=None, *, price: str, valid_from: date, currency: str = "EUR"):
    return rate_card_add(
        flavor=flavor or world.a100,
        price_per_gpu_hour=Decimal(price),
        currency=currency,
        valid_from=valid_from,
        actor=world.finance,
    )


@pytest.fixture
def march(world):
    """The runs of the module docstring, rolled up into DailyUsage."""
    Project.objects.create(tenant=world.vision, slug="segmentation", name="Segmentation")
    slurm = Cluster.objects.create(name="slurm-1", backend=Cluster.Backend.SLURM)
    add_rate(world, price="2.50", valid_from=date(2025, 1, 1))
    alice, arthur = world.researcher_a, world.researcher_a2
    attempts = {
        "alpha": ran(
            world,
            submit(world, alice, name="alpha"),
            start=datetime(2025, 3, 3, 9, tzinfo=UTC),
            hours=3,
            startup=1800,
            idle=3600,
        ),
        "beta": ran(
            world,
            submit(world, arthur, name="beta", project="segmentation"),
            start=datetime(2025, 3, 10, 22, tzinfo=UTC),
            hours=4,
            cluster=slurm,
        ),
        "gamma": ran(
            world,
            submit(world, alice, name="gamma", flavor="h100-80gb"),
            start=datetime(2025, 3, 20, tzinfo=UTC),
            hours=1,
        ),
        "epsilon": ran(
            world,
            submit(world, arthur, name="epsilon"),
            start=datetime(2025, 2, 28, 23, tzinfo=UTC),
            hours=2,
        ),
        "nlp": ran(
            world,
            submit(world, world.researcher_b, name="nlp", tenant="nlp", project="llm"),
            start=datetime(2025, 3, 5, 10, tzinfo=UTC),
            hours=1,
        ),
    }
    daily_usage_update(now=ROLLUP_AT)
    return attempts


def get(client, user, url: str, status: int = 200):
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == status, (url, response.status_code)
    return response


def text(html: str) -> str:
    return " ".join(strip_tags(html).split())


def kpi(content: str, name: str) -> str:
    match = re.search(rf'<dd data-kpi="{name}">(.*?)</dd>', content, re.S)
    assert match, name
    return text(match.group(1))


def table_rows(content: str, table: str) -> list[list[str]]:
    """The cell texts of every body row of the table marked ``data-table``."""
    match = re.search(rf'<table[^>]*data-table="{table}".*?<tbody>(.*?)</tbody>', content, re.S)
    assert match, table
    return [
        [text(cell) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", match.group(1), re.S)
    ]


def chart_payload(content: str, element_id: str) -> dict:
    match = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>', content, re.S
    )
    assert match, element_id
    return json.loads(match.group(1))


def csv_rows(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


def export_url(kind: str, **query) -> str:
    return f"{reverse(f'finance:export_{kind}')}?{urlencode(query)}"


# --- the statement ---------------------------------------------------------------------------


def test_statement_totals_in_gpu_hours_and_cents(client, world, march):
    content = get(client, world.finance, STATEMENT_URL).content.decode()

    assert kpi(content, "allocated") == "18.00 GPU-hours"
    assert kpi(content, "effective") == "16.50 GPU-hours"
    assert kpi(content, "waste") == "1.50 GPU-hours"
    assert kpi(content, "goodput") == "91.7 %"
    # alpha: 2 GPUs x 3 h at 2.50 = 15.00; beta 20.00; epsilon's March hour 5.00; gamma 0.
    assert kpi(content, "cost") == "40.00 EUR"
    assert kpi(content, "effective-cost") == "36.25 EUR"
    assert kpi(content, "waste-cost") == "3.75 EUR"
    assert kpi(content, "unpriced") == "2.00 GPU-hours"
    assert table_rows(content, "waste") == [
        ["Lost work", "0 GPU-h"],
        ["Startup", "0.50 GPU-h"],
        ["Checkpointing", "0 GPU-h"],
        ["Interactive idle", "0 GPU-h"],
        ["Idle", "1.00 GPU-h"],
        ["Input wait", "0 GPU-h"],
        ["Communication wait", "0 GPU-h"],
    ]


def test_statement_breakdowns_by_project_user_flavor_and_cluster(client, world, march):
    content = get(client, world.finance, STATEMENT_URL).content.decode()

    # Line, allocated, effective, wasted, goodput, cost, effective cost, waste cost, unpriced;
    # the costliest line first (the larger one first on a tie).
    assert table_rows(content, "by-project") == [
        ["Detection detection",
         "10.00", "8.50", "1.50", "85.0 %", "20.00", "16.25", "3.75", "2.00"],
        ["Segmentation segmentation",
         "8.00", "8.00", "0.00", "100.0 %", "20.00", "20.00", "0.00", "0.00"],
    ]  # fmt: skip
    assert table_rows(content, "by-user") == [
        ["arthur", "10.00", "10.00", "0.00", "100.0 %", "25.00", "25.00", "0.00", "0.00"],
        ["alice", "8.00", "6.50", "1.50", "81.3 %", "15.00", "11.25", "3.75", "2.00"],
    ]  # fmt: skip
    assert table_rows(content, "by-flavor") == [
        ["NVIDIA A100 80GB a100-80gb",
         "16.00", "14.50", "1.50", "90.6 %", "40.00", "36.25", "3.75", "0.00"],
        ["NVIDIA H100 80GB h100-80gb",
         "2.00", "2.00", "0.00", "100.0 %", "0.00", "0.00", "0.00", "2.00"],
    ]  # fmt: skip
    assert table_rows(content, "by-cluster") == [
        ["sim-1", "10.00", "8.50", "1.50", "85.0 %", "20.00", "16.25", "3.75", "2.00"],
        ["slurm-1", "8.00", "8.00", "0.00", "100.0 %", "20.00", "20.00", "0.00", "0.00"],
    ]  # fmt: skip
    for link in (
        "/finance/vision/2025-03/runs/?project=detection",
        "/finance/vision/2025-03/runs/?user=alice",
        "/finance/vision/2025-03/runs/?flavor=h100-80gb",
        "/finance/vision/2025-03/runs/?cluster=slurm-1",
    ):
        assert f'href="{link}"' in content, link
    assert 'href="/finance/export.csv?tenant=vision&amp;from=2025-03-01&amp;to=2025-03-31"' in (
        content
    )
    assert 'href="/finance/export.xlsx?tenant=vision&amp;from=2025-03-01&amp;to=2025-03-31"' in (
        content
    )


def test_unpriced_gpu_hours_are_called_out(client, world, march):
    content = get(client, world.finance, STATEMENT_URL).content.decode()

    notice = re.search(r'<p [^>]*data-notice="unpriced"[^>]*>(.*?)</p>', content, re.S)
    assert notice
    assert text(notice.group(1)).startswith("No rate card covered 2.00 GPU-hours this month")


def test_no_unpriced_notice_when_every_hour_is_priced(client, world, march):
    content = get(client, world.finance, "/finance/vision/2025-02/").content.decode()

    assert kpi(content, "allocated") == "2.00 GPU-hours"
    assert kpi(content, "cost") == "5.00 EUR"
    assert 'data-notice="unpriced"' not in content


def test_statement_totals_reconcile_with_attempt_accounting_and_costing(world):
    """Odd prices, odd lengths, a rate change inside an attempt and month boundaries: the
    months' statements add up to the attempts' accounting to the GPU-second and to their
    cost to the cent."""
    add_rate(world, price="1.2345", valid_from=date(2025, 1, 1))
    add_rate(world, price="3.3333", valid_from=date(2025, 3, 10))
    add_rate(world, world.h100, price="4.0001", valid_from=date(2025, 2, 1))
    alice = world.researcher_a
    starts = (
        (datetime(2025, 2, 27, 17, 13, 7, tzinfo=UTC), 41.3, {}),
        (datetime(2025, 3, 9, 20, 0, 1, tzinfo=UTC), 7.77, {"idle": 777, "lost": 1001}),
        (datetime(2025, 3, 31, 23, 59, 59, tzinfo=UTC), 0.51, {"comm_wait": 13}),
        (datetime(2025, 1, 31, 12, 0, tzinfo=UTC), 12.25, {"startup": 99}),
    )
    attempts = [
        ran(world, submit(world, alice, name=f"odd-{n}", gpus_per_node=3), start=s, hours=h, **w)
        for n, (s, h, w) in enumerate(starts)
    ]
    attempts.append(
        ran(
            world,
            submit(world, alice, name="odd-h100", flavor="h100-80gb", gpus_per_node=1),
            start=datetime(2025, 1, 31, 22, 30, tzinfo=UTC),
            hours=3.1,
        )
    )
    daily_usage_update(now=ROLLUP_AT)

    months = [statement_month(tenant=world.vision, month=date(2025, m, 1)) for m in (1, 2, 3, 4)]

    accounts = [attempt.accounting for attempt in attempts]
    assert sum(m.total.allocated_gpu_s for m in months) == sum(a.allocated_gpu_s for a in accounts)
    assert sum(m.total.effective_gpu_s for m in months) == sum(a.effective_gpu_s for a in accounts)
    assert sum(m.total.waste_gpu_s for m in months) == sum(a.waste_gpu_s for a in accounts)
    rates = rate_cards_for([world.a100.pk, world.h100.pk])
    expected_cost = sum(
        (
            costing.attempt_cost(
                start=attempt.started_at,
                end=attempt.finished_at,
                allocated_gpu_s=attempt.accounting.allocated_gpu_s,
                rates=rates[attempt.run.flavor_id],
            )
            for attempt in attempts
        ),
        Decimal("0.00"),
    )
    assert sum((m.total.cost for m in months), Decimal(0)) == expected_cost
    # h100 was priced from 1 February: the attempt's January hour and a half is unpriced.
    assert months[0].total.unpriced_gpu_s == 5400
    for report in months:  # every breakdown adds up to the totals
        for lines in report.breakdowns.values():
            assert {
                item.name: sum(getattr(line.usage, item.name) for line in lines)
                for item in fields(report.total)
            } == asdict(report.total)


def test_trend_chart_holds_twelve_months_of_effective_and_waste(client, world, march):
    content = get(client, world.finance, STATEMENT_URL).content.decode()

    hours = chart_payload(content, "trend-hours-chart-data")
    assert hours["categories"] == [f"2024-{m:02d}" for m in range(4, 13)] + [
        "2025-01",
        "2025-02",
        "2025-03",
    ]
    assert [(trace["key"], trace["values"][-2:]) for trace in hours["traces"]] == [
        ("effective", [2.0, 16.5]),
        ("waste", [0.0, 1.5]),
    ]
    assert hours["traces"][0]["values"][:10] == [0.0] * 10
    cost = chart_payload(content, "trend-cost-chart-data")
    assert cost["unit"] == "EUR"
    assert [(trace["key"], trace["values"][-2:]) for trace in cost["traces"]] == [
        ("effective", [5.0, 36.25]),
        ("waste", [0.0, 3.75]),
    ]
    assert table_rows(content, "trend")[-2:] == [
        ["2025-02", "2.00", "2.00", "0.00", "5.00", "5.00", "0.00"],
        ["2025-03", "18.00", "16.50", "1.50", "40.00", "36.25", "3.75"],
    ]
    assert '<script src="/static/gantry/finance.js" defer></script>' in content


def test_budget_burn_down_per_flavor(client, world, march):
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(monthly_gpu_hour_budget=20)

    content = get(client, world.finance, STATEMENT_URL).content.decode()

    assert table_rows(content, "burn") == [
        ["a100-80gb", "20", "16.00", "4.00", "80.0 %", "Hard: runs wait when the budget is spent"],
        ["h100-80gb", "—", "2.00", "—", "no budget", "—"],
    ]
    chart = chart_payload(content, "burn-chart-data")
    assert chart["x"][0] == "2025-03-01" and chart["x"][-1] == "2025-03-31"
    used, budget, h100 = chart["lines"]
    assert (used["name"], used["dash"], budget["name"], budget["dash"]) == (
        "a100-80gb used",
        False,
        "a100-80gb budget",
        True,
    )
    # epsilon's hour on the 1st, alpha on the 3rd, beta on the 10th and 11th.
    assert used["y"][:3] == [2.0, 2.0, 8.0]
    assert used["y"][8:11] == [8.0, 12.0, 16.0]
    assert used["y"][-1] == 16.0
    assert budget["y"] == [20] * 31
    assert h100["name"] == "h100-80gb used" and h100["y"][19] == 2.0
    assert chart["y_range"] is None  # the budget is in sight of the use: Plotly scales


def test_a_budget_far_above_the_use_does_not_flatten_it(client, world, march):
    """16 GPU-hours of a 5,000 GPU-hour budget: the axis ends a quarter above the use, the
    budget is named with its size and the use with its share."""
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        monthly_gpu_hour_budget=5000
    )

    content = get(client, world.finance, STATEMENT_URL).content.decode()

    chart = chart_payload(content, "burn-chart-data")
    assert chart["y_range"] == [0, 20.0]
    assert [(line["name"], line["y"][-1]) for line in chart["lines"]] == [
        ("a100-80gb used (0.3 % of its budget)", 16.0),
        ("a100-80gb budget (5,000 GPU-hours, above the scale)", 5000),
        ("h100-80gb used", 2.0),
    ]


def test_statement_uses_a_fixed_number_of_queries(
    client, world, march, django_assert_max_num_queries
):
    client.force_login(world.finance)
    with django_assert_max_num_queries(20), CaptureQueriesContext(connection) as few:
        assert client.get(STATEMENT_URL).status_code == 200
    for n in range(6):  # more users, projects and days: still the same queries
        user = make_user(f"extra-{n}")
        Membership.objects.create(user=user, tenant=world.vision)
        Project.objects.create(tenant=world.vision, slug=f"p{n}", name=f"P{n}")
        run = submit(world, user, name=f"extra-{n}", project=f"p{n}")
        ran(world, run, start=datetime(2025, 3, 2 + n, tzinfo=UTC), hours=30)
    daily_usage_update(now=ROLLUP_AT)
    client.force_login(world.finance)
    with django_assert_max_num_queries(20), CaptureQueriesContext(connection) as many:
        content = client.get(STATEMENT_URL).content.decode()
    assert len(table_rows(content, "by-user")) == 8
    assert len(many.captured_queries) == len(few.captured_queries)


def test_drill_down_uses_a_fixed_number_of_queries(client, world, march):
    client.force_login(world.finance)
    with CaptureQueriesContext(connection) as few:
        client.get("/finance/vision/2025-03/runs/")
    for n in range(5):
        run = submit(world, world.researcher_a, name=f"more-{n}", flavor="h100-80gb")
        ran(world, run, start=datetime(2025, 3, 12 + n, tzinfo=UTC), hours=2)
    with CaptureQueriesContext(connection) as many:
        content = client.get("/finance/vision/2025-03/runs/").content.decode()
    assert len(re.findall(r"<tr data-attempt=", content)) == 9
    assert len(many.captured_queries) == len(few.captured_queries)


# --- who may read ----------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["finance", "platform_admin", "tenant_admin_a"])
def test_readers_see_the_statement_of_vision(client, world, march, persona):
    content = get(client, getattr(world, persona), STATEMENT_URL).content.decode()

    assert kpi(content, "cost") == "40.00 EUR"
    assert ">Finance</a>" in content


@pytest.mark.parametrize(
    "url",
    [
        "/finance/nlp/2025-03/",
        "/finance/nlp/2025-03/runs/?project=llm",
        "/finance/missing/2025-03/",
        "/finance/?tenant=nlp&month=2025-03",
        "/finance/export.csv?tenant=nlp&from=2025-03-01&to=2025-03-31",
        "/finance/export.xlsx?tenant=nlp&from=2025-03-01&to=2025-03-31",
    ],
)
def test_tenant_admin_asking_for_another_tenant_gets_404(client, world, march, url):
    get(client, world.tenant_admin_a, url, status=404)


@pytest.mark.parametrize(
    "url",
    [
        "/finance/",
        "/finance/rates/",
        STATEMENT_URL,
        "/finance/vision/2025-03/runs/",
        "/finance/export.csv?tenant=vision&from=2025-03-01&to=2025-03-31",
        "/finance/export.xlsx?tenant=vision&from=2025-03-01&to=2025-03-31",
    ],
)
@pytest.mark.parametrize("persona", ["researcher_a", "researcher_b"])
def test_researchers_get_404_everywhere(client, world, march, url, persona):
    response = get(client, getattr(world, persona), url, status=404)
    assert b"40.00" not in response.content


def test_researchers_have_no_finance_link(client, world):
    content = get(client, world.researcher_a, reverse("jobs:run_list")).content.decode()
    assert reverse("finance:index") not in content


def test_anonymous_is_sent_to_log_in(client, world):
    response = client.get(STATEMENT_URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_index_redirects_to_the_statement(client, world, march):
    response = get(client, world.finance, "/finance/?tenant=vision&month=2025-03", status=302)
    assert response["Location"] == STATEMENT_URL


def test_index_lists_only_administered_tenants_for_a_tenant_admin(client, world):
    content = get(client, world.tenant_admin_a, "/finance/").content.decode()
    assert '<option value="vision"' in content
    assert '<option value="nlp"' not in content
    content = get(client, world.finance, "/finance/").content.decode()
    assert '<option value="nlp"' in content


def test_index_with_a_bad_month_is_400(client, world):
    response = get(client, world.finance, "/finance/?tenant=vision&month=2025-13", status=400)
    assert "Enter a month as YYYY-MM, e.g. 2025-03." in response.content.decode()


@pytest.mark.parametrize(
    "month", ["9999-12", "9999-01", "0000-01", "0001-06", "1969-12", "2025-13", "2025-00"]
)
def test_index_with_a_month_outside_the_statable_range_is_400(client, world, month):
    response = get(client, world.finance, f"/finance/?tenant=vision&month={month}", status=400)
    content = response.content.decode()
    if month.endswith(("-13", "-00")):
        assert "Enter a month as YYYY-MM, e.g. 2025-03." in content
    else:
        assert "Statements cover 1970-01 to 9998-12: choose a month in that range." in content


@pytest.mark.parametrize(
    "month", ["9999-12", "0000-01", "0001-01", "1969-12", "2025-13", "2025-00"]
)
@pytest.mark.parametrize("page", ["", "runs/"])
def test_a_statement_of_a_month_outside_the_calendar_is_404(client, world, month, page):
    get(client, world.finance, f"/finance/vision/{month}/{page}", status=404)


def test_the_statable_range_has_its_pages_at_both_ends(client, world):
    for url in ("/finance/vision/1970-01/", "/finance/vision/9998-12/runs/"):
        get(client, world.finance, url)


@time_machine.travel(datetime(2025, 4, 1, 0, 20, tzinfo=UTC), tick=False)
def test_the_index_leads_with_the_last_closed_month_and_links_the_month_to_date(
    client, world, march
):
    """In the first hour of April, finance reviews March: each tenant's March totals, a
    link to its statement, and April so far one click away; the forms default to March."""
    content = get(client, world.finance, "/finance/").content.decode()

    assert "March 2025, the last closed month" in content
    assert table_rows(content, "review") == [
        ["NLP Group (nlp)", "2.00", "5.00 EUR", "0.00 EUR"],
        ["Vision Lab (vision)", "18.00", "40.00 EUR", "0.00 EUR"],
    ]
    assert 'href="/finance/vision/2025-03/" data-statement="closed"' in content
    assert 'href="/finance/vision/2025-04/" data-statement="to-date"' in content
    assert 'name="month" value="2025-03"' in content
    assert 'name="from" value="2025-03-01"' in content
    assert 'name="to" value="2025-03-31"' in content


@pytest.mark.parametrize(
    ("now", "closed", "first_day", "last_day"),
    [
        (datetime(2025, 3, 1, 0, 0, 0, tzinfo=UTC), "2025-02", "2025-02-01", "2025-02-28"),
        (datetime(2027, 1, 1, 0, 0, 0, tzinfo=UTC), "2026-12", "2026-12-01", "2026-12-31"),
        (datetime(2024, 3, 1, 0, 0, 0, tzinfo=UTC), "2024-02", "2024-02-01", "2024-02-29"),
        (datetime(2025, 7, 16, 13, 5, tzinfo=UTC), "2025-06", "2025-06-01", "2025-06-30"),
        (datetime(2025, 7, 31, 23, 59, 59, tzinfo=UTC), "2025-06", "2025-06-01", "2025-06-30"),
    ],
    ids=["1st-midnight", "new-year-midnight", "leap-february", "mid-month", "last-second"],
)
def test_statement_and_exports_default_to_the_last_closed_month_whatever_the_day(
    client, world, now, closed, first_day, last_day
):
    """The month finance reviews is the last one that is over, even at 00:00 UTC on the 1st:
    the statement links, the month picker and the export range all default to it."""
    with time_machine.travel(now, tick=False):
        content = get(client, world.finance, "/finance/").content.decode()

    assert f'href="/finance/vision/{closed}/" data-statement="closed"' in content
    assert f'name="month" value="{closed}"' in content
    assert f'name="from" value="{first_day}"' in content
    assert f'name="to" value="{last_day}"' in content


@time_machine.travel(datetime(2025, 4, 1, 0, 20, tzinfo=UTC), tick=False)
def test_the_closed_month_leads_to_the_open_one_which_says_it_is_open(client, world, march):
    closed = get(client, world.finance, STATEMENT_URL).content.decode()
    assert 'href="/finance/vision/2025-04/" rel="next"' in closed
    assert "The month so far" not in closed

    open_month = get(client, world.finance, "/finance/vision/2025-04/").content.decode()
    assert "The month so far: it is still open" in open_month
    assert "No GPU time in April 2025" in open_month
    assert 'rel="next"' not in open_month


# --- drill-down ------------------------------------------------------------------------------


def test_drill_down_lists_exactly_the_attempts_behind_a_line(client, world, march):
    content = get(client, world.finance, "/finance/vision/2025-03/runs/?project=detection")
    content = content.content.decode()

    listed = [int(pk) for pk in re.findall(r'<tr data-attempt="(\d+)">', content)]
    assert listed == [march["epsilon"].pk, march["alpha"].pk, march["gamma"].pk]
    rows = {row[0]: row for row in table_rows(content, "attempts")}
    epsilon = rows[f"#{march['epsilon'].run_id}"]
    # Its whole accounting (4 GPU-hours) and the March half of it, 5.00 EUR.
    assert epsilon[-5:] == ["4.00", "4.00", "0.00", "2.00", "5.00"]
    alpha = rows[f"#{march['alpha'].run_id}"]
    assert alpha[-5:] == ["6.00", "4.50", "1.50", "6.00", "15.00"]
    assert f'href="/runs/{march["alpha"].run_id}/"' in content
    # The line's total as the statement has it.
    assert kpi(content, "allocated") == "10.00 GPU-hours"
    assert kpi(content, "cost") == "20.00 EUR"


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("user=arthur", ["epsilon", "beta"]),
        ("flavor=h100-80gb", ["gamma"]),
        ("cluster=slurm-1", ["beta"]),
        ("user=alice&flavor=a100-80gb", ["alpha"]),
        ("", ["epsilon", "alpha", "beta", "gamma"]),
        ("user=bob", []),
    ],
)
def test_drill_down_per_dimension(client, world, march, query, names):
    content = get(client, world.finance, f"/finance/vision/2025-03/runs/?{query}")
    listed = [int(pk) for pk in re.findall(r'<tr data-attempt="(\d+)">', content.content.decode())]
    assert listed == [march[name].pk for name in names]


def test_drill_down_of_february_has_the_other_half_of_epsilon(client, world, march):
    content = get(client, world.tenant_admin_a, "/finance/vision/2025-02/runs/").content.decode()
    assert re.findall(r'<tr data-attempt="(\d+)">', content) == [str(march["epsilon"].pk)]


# --- exports ---------------------------------------------------------------------------------

HEADER = [
    "from", "to", "tenant", "project", "user", "flavor", "cluster", "price_per_gpu_hour",
    "allocated_gpu_h", "effective_gpu_h", "lost_gpu_h", "startup_gpu_h", "checkpoint_gpu_h",
    "interactive_idle_gpu_h", "idle_gpu_h", "input_wait_gpu_h", "comm_wait_gpu_h", "unpriced_gpu_h",
    "credited_hardware_gpu_h", "credited_platform_gpu_h",
    "credited_hardware_cost", "credited_platform_cost", "charged_cost",
    "cost", "effective_cost", "waste_cost", "currency",
]  # fmt: skip
Z = "0.000000"


def uncredited(row: list[str]) -> list[str]:
    """An export row of a line nothing was credited on (no hardware or platform failure):
    its credited GPU-hours and amounts are zero, and it is charged its whole cost."""
    return [*row[:18], Z, Z, "0.00", "0.00", row[18], *row[18:]]


# The statement's lines: one per project, user, flavor, cluster and rate card of the month.
MARCH_ROWS = [uncredited(row) for row in [
    ["2025-03-01", "2025-03-31", "vision", "detection", "alice", "a100-80gb", "sim-1", "2.5000",
     "6.000000", "4.500000", Z, "0.500000", Z, Z, "1.000000", Z, Z, Z,
     "15.00", "11.25", "3.75", "EUR"],
    ["2025-03-01", "2025-03-31", "vision", "detection", "alice", "h100-80gb", "sim-1", "",
     "2.000000", "2.000000", Z, Z, Z, Z, Z, Z, Z, "2.000000", "0.00", "0.00", "0.00", "EUR"],
    ["2025-03-01", "2025-03-31", "vision", "detection", "arthur", "a100-80gb", "sim-1", "2.5000",
     "2.000000", "2.000000", Z, Z, Z, Z, Z, Z, Z, Z, "5.00", "5.00", "0.00", "EUR"],
    ["2025-03-01", "2025-03-31", "vision", "segmentation", "arthur", "a100-80gb", "slurm-1",
     "2.5000", "8.000000", "8.000000", Z, Z, Z, Z, Z, Z, Z, Z, "20.00", "20.00", "0.00", "EUR"],
]]  # fmt: skip


def test_csv_export_of_a_tenants_month(client, world, march):
    response = get(
        client,
        world.tenant_admin_a,
        export_url("csv", tenant="vision", **{"from": "2025-03-01", "to": "2025-03-31"}),
    )

    assert response.streaming
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"] == (
        'attachment; filename="gantry-usage-vision-20250301-20250331.csv"'
    )
    assert csv_rows(response) == [HEADER, *MARCH_ROWS]
    assert tuple(HEADER) == EXPORT_COLUMNS


def test_csv_export_of_every_tenant_for_finance(client, world, march):
    response = get(
        client, world.finance, export_url("csv", **{"from": "2025-03-05", "to": "2025-03-05"})
    )

    assert csv_rows(response) == [
        HEADER,
        uncredited(
            ["2025-03-05", "2025-03-05", "nlp", "llm", "bob", "a100-80gb", "sim-1", "2.5000",
             "2.000000", "2.000000", Z, Z, Z, Z, Z, Z, Z, Z, "5.00", "5.00", "0.00", "EUR"]
        ),
    ]  # fmt: skip
    assert (
        'filename="gantry-usage-all-tenants-20250305-20250305.csv"'
        in (response["Content-Disposition"])
    )


def test_csv_gpu_hours_are_exact_to_six_places(client, world):
    add_rate(world, price="2.50", valid_from=date(2025, 1, 1))
    run = submit(world, world.researcher_a, name="odd", gpus_per_node=1)
    ran(world, run, start=datetime(2025, 3, 3, tzinfo=UTC), hours=1 / 3600 * 7, idle=1)
    daily_usage_update(now=ROLLUP_AT)

    response = get(
        client, world.finance, export_url("csv", **{"from": "2025-03-03", "to": "2025-03-03"})
    )

    row = csv_rows(response)[1]
    # 7 GPU-seconds = 0.0019444… GPU-hours; 6 effective = 0.001666…; idle 1 = 0.000277…
    assert row[8:10] == ["0.001944", "0.001667"]
    assert row[14] == "0.000278"
    assert row[23:26] == ["0.00", "0.00", "0.00"]  # 7 GPU-s at 2.50 = 0.0048…


def test_csv_cells_that_a_spreadsheet_would_run_get_an_apostrophe(client, world):
    add_rate(world, price="1", valid_from=date(2025, 1, 1))
    start = datetime(2025, 3, 3, tzinfo=UTC)
    for day, name in enumerate(("=1+2", "+cmd", "-2+3", "@SUM(A1)")):
        user = make_user(name)
        Membership.objects.create(user=user, tenant=world.vision)
        ran(world, submit(world, user, name=f"x{day}"), start=start + timedelta(days=day), hours=1)
    daily_usage_update(now=ROLLUP_AT)

    response = get(
        client, world.finance, export_url("csv", **{"from": "2025-03-01", "to": "2025-03-31"})
    )

    # One line per user, in the order of their names.
    expected = ["'+cmd", "'-2+3", "'=1+2", "'@SUM(A1)"]
    assert [row[4] for row in csv_rows(response)[1:]] == expected
    workbook = load_workbook(
        io.BytesIO(
            b"".join(
                get(
                    client,
                    world.finance,
                    export_url("xlsx", **{"from": "2025-03-01", "to": "2025-03-31"}),
                ).streaming_content
            )
        )
    )
    cells = [row[4] for row in workbook.active.iter_rows(min_row=2, values_only=True)]
    assert cells == expected


def test_xlsx_export_holds_the_same_rows_as_the_csv(client, world, march):
    query = {"tenant": "vision", "from": "2025-03-01", "to": "2025-03-31"}

    response = get(client, world.finance, export_url("xlsx", **query))

    assert response["Content-Type"] == finance_views.XLSX_CONTENT_TYPE
    assert (
        'filename="gantry-usage-vision-20250301-20250331.xlsx"' in (response["Content-Disposition"])
    )
    sheet = load_workbook(io.BytesIO(b"".join(response.streaming_content))).active
    rows = list(sheet.iter_rows(values_only=True))
    assert list(rows[0]) == HEADER
    as_text = [
        [
            cell.date().isoformat()
            if isinstance(cell, datetime)
            else str(cell)
            if isinstance(cell, str | int)
            else cell
            for cell in row
        ]
        for row in rows[1:]
    ]
    assert len(as_text) == len(MARCH_ROWS)
    for got, expected in zip(as_text, MARCH_ROWS, strict=True):
        assert got[:7] == expected[:7]
        assert got[7] == (Decimal(expected[7]) if expected[7] else None)
        assert [Decimal(str(value)) for value in got[8:26]] == [
            Decimal(value) for value in expected[8:26]
        ]
        assert got[26] == "EUR"


def test_xlsx_opens_ready_to_read_formatted_frozen_and_wide_enough(client, world, march):
    """Dates as dates, GPU-hours and money as numbers in their formats (money in EUR), the
    header bold and frozen, every column wide enough for its header and values."""
    query = {"tenant": "vision", "from": "2025-03-01", "to": "2025-03-31"}

    response = get(client, world.finance, export_url("xlsx", **query))

    sheet = load_workbook(io.BytesIO(b"".join(response.streaming_content))).active
    assert sheet.freeze_panes == "A2"
    assert [cell.font.b for cell in sheet[1]] == [True] * 27
    first = dict(zip(HEADER, sheet[2], strict=True))
    assert first["from"].value == datetime(2025, 3, 1)
    assert {name: cell.number_format for name, cell in first.items()} == {
        "from": "yyyy-mm-dd", "to": "yyyy-mm-dd",
        "tenant": "General", "project": "General", "user": "General", "flavor": "General",
        "cluster": "General",
        "price_per_gpu_hour": '#,##0.0000 "EUR"',
        **dict.fromkeys(HEADER[8:20], "#,##0.00####"),
        "credited_hardware_cost": '#,##0.00 "EUR"', "credited_platform_cost": '#,##0.00 "EUR"',
        "charged_cost": '#,##0.00 "EUR"',
        "cost": '#,##0.00 "EUR"', "effective_cost": '#,##0.00 "EUR"',
        "waste_cost": '#,##0.00 "EUR"',
        "currency": "General",
    }  # fmt: skip
    assert (first["price_per_gpu_hour"].value, first["cost"].value) == (2.5, 15)
    widths = {
        name: sheet.column_dimensions[cell.column_letter].width for name, cell in first.items()
    }
    assert widths == {
        "from": 12, "to": 12, "tenant": 16, "project": 20, "user": 16, "flavor": 14,
        "cluster": 14, "price_per_gpu_hour": 20, "allocated_gpu_h": 17, "effective_gpu_h": 17,
        "lost_gpu_h": 14, "startup_gpu_h": 15, "checkpoint_gpu_h": 18,
        "interactive_idle_gpu_h": 24, "idle_gpu_h": 14,
        "input_wait_gpu_h": 18, "comm_wait_gpu_h": 17, "unpriced_gpu_h": 16,
        "credited_hardware_gpu_h": 25, "credited_platform_gpu_h": 25,
        "credited_hardware_cost": 24, "credited_platform_cost": 24, "charged_cost": 14, "cost": 14,
        "effective_cost": 16, "waste_cost": 14, "currency": 10,
    }  # fmt: skip
    unpriced = dict(zip(HEADER, sheet[3], strict=True))
    assert unpriced["price_per_gpu_hour"].value is None


def test_xlsx_above_its_row_cap_is_refused_pointing_to_csv(client, world, march, monkeypatch):
    monkeypatch.setattr(finance_views, "XLSX_MAX_ROWS", 3)
    query = {"tenant": "vision", "from": "2025-03-01", "to": "2025-03-31"}

    response = get(client, world.finance, export_url("xlsx", **query), status=400)

    assert (
        "The range holds 4 rows; an XLSX export holds at most 3. Download it as CSV, or "
        "choose a shorter range."
    ) in response.content.decode()
    monkeypatch.setattr(finance_views, "XLSX_MAX_ROWS", 4)
    get(client, world.finance, export_url("xlsx", **query))


@pytest.mark.parametrize("kind", ["csv", "xlsx"])
@pytest.mark.parametrize(
    ("first", "last", "message"),
    [
        ("2025-03-31", "2025-03-01", "The range ends before it starts."),
        ("", "2025-03-01", "The range is empty: choose its first and its last day."),
        ("2025-03-01", "", "The range is empty: choose its first and its last day."),
        (
            "2024-01-01",
            "2025-01-01",
            "The range spans 367 days; an export covers at most 366 days. Export one year at a "
            "time.",
        ),
        ("2025-02-30", "2025-03-01", "Enter a valid date."),
    ],
)
def test_bad_export_ranges_are_400_with_a_clear_error(
    client, world, march, kind, first, last, message
):
    response = get(
        client,
        world.finance,
        export_url(kind, tenant="vision", **{"from": first, "to": last}),
        status=400,
    )

    assert message in response.content.decode()
    assert "Nothing was exported" in response.content.decode()
    assert not response.streaming


def test_a_year_is_not_too_long(client, world, march):
    response = get(
        client, world.finance, export_url("csv", **{"from": "2024-01-01", "to": "2024-12-31"})
    )
    assert csv_rows(response) == [HEADER]


def test_tenant_admin_must_name_their_tenant(client, world, march):
    response = get(
        client,
        world.tenant_admin_a,
        export_url("csv", **{"from": "2025-03-01", "to": "2025-03-31"}),
        status=400,
    )
    assert "Choose a tenant." in response.content.decode()


# --- rate cards ------------------------------------------------------------------------------


def rates_url() -> str:
    return reverse("finance:rate_cards")


def post_rate(client, user, **fields):
    data = {
        "flavor": "a100-80gb",
        "price_per_gpu_hour": "3.00",
        "currency": "EUR",
        "valid_from": "2025-06-01",
    } | fields
    client.force_login(user)
    return client.post(rates_url(), data)


def counts() -> tuple[int, int]:
    return RateCard.objects.count(), AuditEvent.objects.count()


@pytest.mark.parametrize("persona", ["finance", "platform_admin", "tenant_admin_a"])
def test_rate_cards_are_listed_current_and_past(client, world, persona):
    add_rate(world, price="2.50", valid_from=date(2025, 1, 1))
    add_rate(world, price="2.75", valid_from=date(2025, 2, 1))

    content = get(client, getattr(world, persona), rates_url()).content.decode()

    rows = table_rows(content, "rates-a100-80gb")
    assert [row[:3] for row in rows] == [
        ["2025-02-01", "open-ended", "2.7500 EUR"],
        ["2025-01-01", "2025-02-01 (excluded)", "2.5000 EUR"],
    ]
    assert rows[0][3] == "current" and rows[1][3] == "past"
    assert "No rate card: GPU-hours of h100-80gb are unpriced." in content
    can_add = persona != "tenant_admin_a"
    assert ("Add rate card" in content) == can_add


def test_finance_adds_a_rate_card(client, world):
    first = add_rate(world, price="2.50", valid_from=date(2025, 1, 1))
    cards, events = counts()

    response = post_rate(client, world.finance)

    assert response.status_code == 302 and response["Location"] == rates_url()
    assert counts() == (cards + 1, events + 2)
    card = RateCard.objects.get(flavor=world.a100, valid_from=date(2025, 6, 1))
    assert (card.price_per_gpu_hour, card.currency, card.created_by) == (
        Decimal("3.0000"),
        "EUR",
        world.finance,
    )
    first.refresh_from_db()
    assert first.valid_to == date(2025, 6, 1)
    assert list(AuditEvent.objects.values_list("action", "target")[:2]) == [
        ("ratecard.add", "a100-80gb@2025-06-01"),
        ("ratecard.end", "a100-80gb@2025-01-01"),
    ]
    content = client.get(rates_url()).content.decode()
    assert "Added the rate card of a100-80gb: 3.00 EUR per GPU-hour from 2025-06-01." in content


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour", "A price cannot be negative."),
        (
            {"valid_from": "2025-01-01"},
            "valid_from",
            "The current card of a100-80gb starts on 2025-01-01; a new card must start after "
            "it (it then ends the current one).",
        ),
        (
            {"valid_from": "2024-12-01"},
            "valid_from",
            "The current card of a100-80gb starts on 2025-01-01; a new card must start after "
            "it (it then ends the current one).",
        ),
        (
            {"currency": "USD"},
            "currency",
            "Every rate card is in EUR: statements add up in one currency.",
        ),
        ({"currency": "euro"}, "currency", "Enter a three-letter ISO 4217 code such as EUR."),
        ({"price_per_gpu_hour": "abc"}, "price_per_gpu_hour", "Enter a number."),
    ],
)
def test_bad_rate_cards_change_nothing(client, world, fields, field, message):
    add_rate(world, price="2.50", valid_from=date(2025, 1, 1))
    before = counts()

    response = post_rate(client, world.finance, **fields)

    assert response.status_code == 400
    content = response.content.decode()
    field_block = re.search(
        rf'<div class="field[^"]*" data-field="{field}">(.*?)</div>', content, re.S
    )
    assert field_block and message in text(field_block.group(1)), content
    assert "The rate card was not added" in content
    assert counts() == before
    assert RateCard.objects.get().valid_to is None


def test_tenant_admin_cannot_add_a_rate_card(client, world):
    before = counts()
    response = post_rate(client, world.tenant_admin_a)
    assert response.status_code == 403
    assert counts() == before


def test_researcher_posting_a_rate_card_gets_404(client, world):
    before = counts()
    response = post_rate(client, world.researcher_a)
    assert response.status_code == 404
    assert counts() == before


def test_statement_without_usage_or_rate_cards(client, world):
    content = get(client, world.finance, "/finance/nlp/2025-03/").content.decode()
    assert "No GPU time in March 2025" in content
    assert "no currency yet" in content
    assert DailyUsage.objects.count() == 0
