"""Every persona's journey in a real browser (headless Debian Chromium through Playwright)
against a live server, and the bad input people really produce: a double click on submit,
the back button after submitting, a session that ends while a form is open, a huge log.

The researcher's run is moved by a real Celery worker and beat on the simulator backend
while the run page polls; the other journeys drive state through services. Each journey
asserts what the pages show and saves full-page screenshots (tests/browser_support.py).
"""

import csv
import io
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import time_machine
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.utils import timezone
from playwright.sync_api import Page, expect

from clusters.models import Cluster
from finance.accrual import accrual_month
from finance.selectors.months import last_closed_month
from finance.selectors.statements import statement_month
from images.models import Image
from jobs.models import Attempt, AttemptState, Experiment, Run, RunState
from jobs.selectors.logs import text_tail
from jobs.selectors.preview import admission_preview
from jobs.selectors.runs import run_submitted_with
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_rerun, run_submit
from jobs.services.templates import template_save, template_submit
from portal.celery import app as celery_app
from portal.demo import DEMO_PASSWORD, STRAGGLER_RUN, demo_seed
from telemetry import services as telemetry_services
from tenants.models import AuditEvent, Quota, Tenant
from tests import REPOSITORY
from tests.browser_support import login, screenshot
from tests.celery_support import celery_env, start_worker_and_beat, stop_process
from tests.conftest import DIGEST_A, experiment_input
from tests.finance.test_finance_pages import HEADER as FINANCE_CSV_HEADER
from tests.finance.test_finance_pages import MARCH_ROWS, march  # noqa: F401 - march is a fixture
from tests.jobs.test_lifecycle import run_to_running
from tests.portal.test_demo import DEMO_INSTANTS

pytest_plugins = ["tests.browser_support"]

ROOT = REPOSITORY
IMAGE = "registry.example.org/ml/pytorch@" + DIGEST_A
RUN_PAGE = re.compile(r"/runs/[0-9]+/$")
# At the test cluster's 1000 simulated seconds per second: about 8 s of running.
RUN_FOR_S = "8000"


# --- helpers ---------------------------------------------------------------------------------


def submit(world, user, **overrides) -> Run:
    return run_submit(user=user, data=experiment_input(world, **overrides))


@pytest.fixture
def celery_starter(live_server, tmp_path):
    """``start()``: a real Celery worker and beat on this test's Redis database and the live
    server's PostgreSQL database, started when the test says (so a page can first show
    what happens without them); both stopped at the end."""
    celery_app.control.purge()
    started: list[subprocess.Popen] = []
    log = (tmp_path / "celery.log").open("w")

    def start() -> None:
        env = celery_env(tmp_path, GANTRY_TELEMETRY_INTERVAL_S="1")
        started.extend(start_worker_and_beat(env, log))

    yield start
    for process in reversed(started):
        stop_process(process)
    log.close()
    celery_app.control.purge()


def badge(page: Page):
    """The run's state badge in the polled status fragment."""
    return page.locator(".live .status-head .badge")


def mark_page(page: Page) -> None:
    """Tag the document: the tag survives until the page is reloaded or left."""
    page.evaluate("window.__sameDocument = true")


def still_same_document(page: Page) -> bool:
    return page.evaluate("window.__sameDocument === true")


def make_template(world, **values):
    return template_save(
        actor=world.tenant_admin_a,
        tenant=world.vision,
        name="pytorch-1node",
        description="One node of PyTorch",
        values={
            "image": IMAGE,
            "command": "python train.py",
            "resources": {"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 2},
            "env": {"GANTRY_SIM_DURATION_S": RUN_FOR_S},
            "priority": 40,
        }
        | values,
        locked=["image", "resources.flavor", "resources.nodes"],
        ranges={"resources.gpus_per_node": {"min": 1, "max": 4}},
    )


# --- the researcher --------------------------------------------------------------------------


@pytest.mark.integration
def test_researcher_and_platform_admin_journeys_with_a_real_worker(
    world, persona_page, celery_starter, tmp_path
):
    make_template(world)
    # Four guaranteed A100 GPUs, two of them held by arthur's long run all along: alice's
    # 2-GPU runs fit beside it, her 4-GPU run has to wait.
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=4)
    holder = submit(
        world, user=world.researcher_a2, name="holder", env={"GANTRY_SIM_DURATION_S": "1000000"}
    )
    page = persona_page(world.researcher_a)
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations of re-run and cancel

    page.goto("/runs/new/")
    page.get_by_role("link", name="pytorch-1node").click()
    expect(page.locator("[data-template]")).to_contain_text(
        "Starting from template pytorch-1node: One node of PyTorch."
    )
    expect(page.locator("#id_image")).to_be_disabled()
    page.select_option("#id_project", "detection")
    page.fill("#id_name", "resnet-live")
    page.fill("#id_command", "python train.py --epochs 1")
    screenshot(page, "researcher-submit", tmp_path)
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)

    run = Run.objects.get(experiment__name="resnet-live")
    assert page.url.endswith(f"/runs/{run.pk}/")
    expect(page.locator("h1")).to_have_text(f"Run #{run.pk} · resnet-live")
    expect(page.locator(".messages")).to_have_text(f"Run {run.pk} submitted.")
    expect(badge(page)).to_have_text("Queued")
    assert (run.experiment.command, run.gpus, run.experiment.env) == (
        "python train.py --epochs 1",
        2,
        {"GANTRY_SIM_DURATION_S": RUN_FOR_S},
    )

    # Nothing moves it until the worker and beat start; then the polling page follows it.
    mark_page(page)
    celery_starter()
    expect(badge(page)).to_have_text("Running", timeout=30_000)
    screenshot(page, "researcher-running", tmp_path)
    expect(badge(page)).to_have_text("Succeeded", timeout=30_000)
    assert still_same_document(page), "the page was reloaded instead of updated in place"
    expect(page.locator(".timeline-state")).to_have_text(
        ["QUEUED", "QUEUED → ADMITTED", "ADMITTED → SUBMITTING", "SUBMITTING → PENDING",
         "PENDING → RUNNING", "RUNNING → SUCCEEDED"]
    )  # fmt: skip
    screenshot(page, "researcher-succeeded", tmp_path)

    # Where the GPU-hours went, and the diagnosis (accounted now rather than by beat's minute).
    telemetry_services.accounting_compute_pending()
    accounting = run.attempts.get().accounting
    page.get_by_role("link", name="Open GPU usage").click()
    expect(page.locator("h1")).to_have_text(f"GPU usage · run #{run.pk} resnet-live")
    goodput = 100 * accounting.effective_gpu_s / accounting.allocated_gpu_s
    expect(page.locator("[data-kpi=goodput]")).to_have_text(f"{goodput:.1f} %")
    expect(page.locator("#diagnosis")).to_contain_text(
        "Nothing to fix: the GPUs were busy and little of the allocation was wasted."
    )
    # Plotly draws the charts (an SVG each) once it has loaded.
    for chart in ("#waste-chart", "#steps-chart"):
        expect(page.locator(chart)).to_have_attribute("aria-busy", "false")
        expect(page.locator(f"{chart} .main-svg").first).to_be_visible()
    screenshot(page, "researcher-telemetry", tmp_path)

    # Re-run exactly: a new run of the same experiment record; then cancel it.
    page.get_by_role("link", name=f"Run #{run.pk}").click()
    page.get_by_role("button", name="Re-run exactly").click()
    page.wait_for_url(re.compile(rf"/runs/(?!{run.pk}/)[0-9]+/$"))
    rerun = Run.objects.get(experiment=run.experiment, pk__gt=run.pk)
    expect(page.locator(".messages")).to_have_text(
        f"Run {rerun.pk} re-runs experiment {run.experiment_id} exactly."
    )
    expect(page.locator("h1")).to_have_text(f"Run #{rerun.pk} · resnet-live")
    page.get_by_role("button", name="Cancel run").click()
    expect(badge(page)).to_have_text("Cancelled", timeout=20_000)
    rerun.refresh_from_db()
    assert rerun.state == RunState.CANCELLED
    screenshot(page, "researcher-cancelled", tmp_path)

    # A run larger than the guarantee waits, and its page says why.
    page.goto("/runs/new/")
    page.get_by_role("link", name="pytorch-1node").click()
    page.select_option("#id_project", "detection")
    page.fill("#id_name", "resnet-wide")
    page.fill("#id_gpus_per_node", "4")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    waiting = Run.objects.get(experiment__name="resnet-wide")
    expect(page.locator(".live .wait strong")).to_have_text(
        "Guaranteed quota in use, no borrowing", timeout=20_000
    )
    waiting.refresh_from_db()
    assert (waiting.state, waiting.wait_reason) == (RunState.QUEUED, "QUOTA")
    expect(page.locator(".live .wait")).to_contain_text(waiting.wait_message)
    screenshot(page, "researcher-waiting", tmp_path)
    mark_page(page)

    # The platform admin raises the guarantee; the waiting run's page follows by itself.
    admin = persona_page(world.platform_admin)
    admin.goto("/quotas/edit/?tenant=vision&flavor=a100-80gb")
    admin.fill("#id_guaranteed_gpus", "6")
    admin.get_by_role("button", name="Save quota").click()
    expect(admin.locator(".messages")).to_contain_text("Saved the a100-80gb quota of vision.")
    screenshot(admin, "platform-admin-quota-saved", tmp_path)
    expect(badge(page)).to_have_text("Running", timeout=30_000)
    assert still_same_document(page)
    waiting.refresh_from_db()
    assert waiting.wait_reason == ""
    holder.refresh_from_db()
    assert holder.state == RunState.RUNNING


# --- the tenant admin, the platform admin, finance ------------------------------------------


def rows_of(page: Page, table: str) -> list[list[str]]:
    """The cell texts of each body row of the table marked ``data-table``; a cell holding a
    select reads as its chosen option."""
    return page.locator(f"table[data-table={table}] tbody tr").evaluate_all(
        """rows => rows.map(row => [...row.cells].map(cell => {
            const select = cell.querySelector("select");
            return select ? select.selectedOptions[0].text : cell.innerText.trim();
        }))"""
    )


def test_tenant_admin_sees_members_and_quota_use_and_cancels_a_members_run(
    world, persona_page, tmp_path
):
    running = submit(world, world.researcher_a, name="alice-running")
    run_to_running(world, running)
    queued = submit(world, world.researcher_a2, name="arthur-wide", nodes=2, gpus_per_node=8)
    admission_run_cycle()
    running.refresh_from_db()
    queued.refresh_from_db()
    assert (running.state, queued.state, queued.wait_reason) == ("RUNNING", "QUEUED", "QUOTA")

    page = persona_page(world.tenant_admin_a)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Quotas").click()
    page.locator("main a[href='/tenants/vision/members/']").click()
    expect(page.locator("h1")).to_have_text("Members of Vision Lab")
    assert rows_of(page, "members") == [
        ["tara", "Tenant admin", "0", "0", "0", "Remove"],
        ["alice", "Researcher", "2", "1", "0", "Remove"],
        ["arthur", "Researcher", "0", "0", "1", "Remove"],
    ]
    assert rows_of(page, "quota-use") == [
        ["a100-80gb", "2", "16", "0", "0.00"],
        ["h100-80gb", "0", "8", "0", "0.00"],
    ]
    screenshot(page, "tenant-admin-members", tmp_path)

    # A tenant admin may cancel any run of the tenant, here arthur's waiting one.
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"/runs/{queued.pk}/")
    expect(page.locator(".live .wait")).to_contain_text("Guaranteed quota in use, no borrowing")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator(".messages")).to_have_text(f"Run {queued.pk} is cancelled.")
    expect(badge(page)).to_have_text("Cancelled")
    queued.refresh_from_db()
    assert queued.state == RunState.CANCELLED
    page.goto("/tenants/vision/members/")
    assert [row[4] for row in rows_of(page, "members")] == ["0", "0", "0"]

    # Members are the tenant admins' business: not a researcher's, and no one else's tenant.
    researcher = persona_page(world.researcher_a)
    assert researcher.goto("/tenants/vision/members/").status == 403
    assert researcher.goto("/tenants/nlp/members/").status == 404


def test_platform_admin_approves_an_image_that_researchers_can_then_use(
    world, persona_page, tmp_path
):
    pending = Image.objects.create(
        repository="registry.example.org/ml/jax",
        digest="sha256:" + "d" * 64,
        tag="0.4.30",
        status=Image.Status.PENDING,
    )
    researcher = persona_page(world.researcher_a)
    researcher.goto("/runs/new/")
    assert pending.reference not in researcher.locator("#id_image option").all_inner_texts()
    expect(researcher.locator(f"#id_image option[value='{pending.reference}']")).to_have_count(0)

    page = persona_page(world.platform_admin)
    page.goto(f"/images/{pending.pk}/")
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".messages")).to_have_text(f"{pending} is approved.")
    pending.refresh_from_db()
    assert pending.status == Image.Status.APPROVED
    screenshot(page, "platform-admin-image-approved", tmp_path)

    researcher.reload()
    expect(researcher.locator(f"#id_image option[value='{pending.reference}']")).to_have_count(1)


@pytest.mark.usefixtures("march")
def test_finance_opens_a_statement_drills_down_and_exports_csv(world, persona_page, tmp_path):
    page = persona_page(world.finance)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Finance").click()
    page.select_option("#statement-tenant", "vision")
    page.fill("#statement-month", "2025-03")
    page.get_by_role("button", name="Show statement").click()
    page.wait_for_url("**/finance/vision/2025-03/")
    for name, value in (
        ("allocated", "18.00 GPU-hours"),
        ("effective", "16.50 GPU-hours"),
        ("waste", "1.50 GPU-hours"),
        ("goodput", "91.7 %"),
        ("cost", "40.00 EUR"),
        ("waste-cost", "3.75 EUR"),
    ):
        expect(page.locator(f"[data-kpi={name}]")).to_have_text(value)
    assert rows_of(page, "by-user") == [
        ["arthur", "10.00", "10.00", "0.00", "100.0 %", "25.00", "25.00", "0.00", "0.00"],
        ["alice", "8.00", "6.50", "1.50", "81.3 %", "15.00", "11.25", "3.75", "2.00"],
    ]
    screenshot(page, "finance-statement", tmp_path)

    page.locator("table[data-table=by-user]").get_by_role("link", name="alice").click()
    page.wait_for_url("**/finance/vision/2025-03/runs/?user=alice")
    expect(page.locator("h1")).to_have_text("Attempts behind user alice")
    expect(page.locator("[data-kpi=cost]")).to_have_text("15.00 EUR")
    assert [row[2] for row in rows_of(page, "attempts")] == ["alpha", "gamma"]
    screenshot(page, "finance-drilldown", tmp_path)

    page.go_back()
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Export CSV").click()
    download = download_info.value
    assert download.suggested_filename == "gantry-usage-vision-20250301-20250331.csv"
    rows = list(csv.reader(io.StringIO(Path(download.path()).read_text())))
    assert rows[0] == FINANCE_CSV_HEADER
    # One line per project, user, flavor, cluster and rate card: alice's A100 line first.
    assert rows[1][rows[0].index("user")] == "alice"
    assert rows[1][rows[0].index("cost")] == "15.00"
    assert rows == [FINANCE_CSV_HEADER, *MARCH_ROWS]


# --- the README's pictures --------------------------------------------------------------------


# The demo's journey whenever the suite runs (the README's pictures come from that one), and
# at the fixed instants of tests/portal/test_demo.py that the calendar makes hard. The clock stands
# still at a fixed instant, so the whole journey sees one date.
@pytest.fixture(params=list(DEMO_INSTANTS))
def demo_instant(request) -> Iterator[str]:
    instant = DEMO_INSTANTS[request.param]
    if instant is None:
        yield request.param
        return
    with time_machine.travel(instant, tick=False):
        yield request.param


@pytest.mark.django_db(transaction=True, reset_sequences=True)  # ids as in a fresh demo
def test_readme_pages_on_the_demo(demo_instant, persona_page, tmp_path):
    """The README's screenshots, from the `make run` demo: each page as its persona sees it,
    with a fact from the database checked on it. GANTRY_SCREENSHOTS=1 writes them to
    docs/screenshots (from the journey at the real time)."""

    def picture(page: Page, name: str) -> None:
        if demo_instant == "now":
            screenshot(page, name, tmp_path, readme=True)
        else:
            screenshot(page, f"{name}-{demo_instant}", tmp_path)

    demo_seed()
    # What the first admission and sync cycles of `make run` do: place the live runs.
    admission_run_cycle()
    for attempt in Attempt.objects.filter(state=AttemptState.CREATED):
        attempt_submit(attempt_id=attempt.pk)
    for cluster in Cluster.objects.all():
        cluster_sync(cluster=cluster)
    people = {user.username: user for user in User.objects.all()}
    waiting = Run.objects.filter(tenant__slug="vision", state=RunState.QUEUED).first()
    assert waiting is not None and waiting.wait_reason, "the demo has a waiting vision run"
    finished = (
        Run.objects.filter(tenant__slug="vision", state=RunState.SUCCEEDED).order_by("pk").first()
    )
    accounting = finished.attempts.get().accounting
    experiment = finished.experiment

    page = persona_page(people["alice"], DEMO_PASSWORD)
    page.goto("/")
    expect(page.locator("main")).to_contain_text(waiting.experiment.name)
    picture(page, "home")
    page.goto("/runs/")
    expect(page.locator(f"a[href='/runs/{waiting.pk}/']").first).to_be_visible()
    expect(page.locator("main")).to_contain_text(waiting.get_wait_reason_display())
    picture(page, "runs")
    page.goto(f"/runs/{waiting.pk}/")
    expect(page.locator(".live .wait")).to_contain_text(waiting.wait_message)
    picture(page, "run-waiting")
    page.goto("/runs/new/")
    expect(page.locator("#id_tenant")).to_have_value("vision")
    page.select_option("#id_project", "detection")
    page.select_option("#id_image", experiment.image_reference)
    page.fill("#id_name", "yolo-xl-sweep")
    page.fill("#id_command", experiment.command)
    page.select_option("#id_flavor", "a100-80gb")
    page.fill("#id_gpus_per_node", "8")
    preview = admission_preview(
        user=people["alice"], tenant="vision", flavor="a100-80gb", nodes=1, gpus_per_node=8
    )
    expect(page.locator("[data-verdict]")).to_have_attribute("data-verdict", preview.verdict)
    expect(page.locator(".preview-message")).to_have_text(preview.message)
    picture(page, "submit")
    page.goto("/quotas/")
    expect(page.locator("tr[data-quota='vision:a100-80gb'] td").nth(1)).to_have_text("16")
    picture(page, "quotas")
    page.goto("/images/")
    for image in Image.objects.filter(status=Image.Status.APPROVED, visible_to_all=True):
        expect(page.locator("main")).to_contain_text(image.repository)
    picture(page, "images")
    page.goto("/experiments/")
    expect(page.locator("main")).to_contain_text(experiment.name)
    picture(page, "experiments")
    page.goto(f"/experiments/{experiment.pk}/")
    expect(page.locator("h1")).to_have_text(experiment.name)
    expect(page.locator("main")).to_contain_text(experiment.code_commit)
    picture(page, "experiment")
    page.goto(f"/runs/{finished.pk}/telemetry/")
    goodput = 100 * accounting.effective_gpu_s / accounting.allocated_gpu_s
    expect(page.locator("[data-kpi=goodput]")).to_have_text(f"{goodput:.1f} %")
    expect(page.locator("#waste-chart")).to_have_attribute("aria-busy", "false")
    picture(page, "run-telemetry")
    # The demo's gang with a clock-capped GPU: its diagnosis names the straggler.
    gang = Run.objects.get(experiment__name=STRAGGLER_RUN)
    page.goto(f"/runs/{gang.pk}/telemetry/")
    expect(page.locator("[data-finding=slow_rank]")).to_contain_text(
        "A slow rank: rank 11 on sim-east-a100-80gb-01, GPU 3"
    )
    picture(page, "run-straggler")
    page.goto("/tenants/vision/goodput/")
    expect(page.locator("h1")).to_have_text("Goodput · Vision Lab (vision)")
    picture(page, "goodput")

    # Finance reviews the last closed month, which always holds the demo's runs of that month;
    # the month to date is one click away, as full as the hour allows.
    page = persona_page(people["fiona"], DEMO_PASSWORD)
    vision = Tenant.objects.get(slug="vision")
    current = timezone.now().date().replace(day=1)
    closed = last_closed_month(current)
    statement = statement_month(tenant=vision, month=closed)
    to_date = statement_month(tenant=vision, month=current)
    assert statement.total.allocated_gpu_s >= 8 * 5 * 3600  # yolo-v0, at least
    if demo_instant == "first-hour-of-a-month":
        assert to_date.total.allocated_gpu_s == 0
    if demo_instant == "last-minute-of-a-month":
        assert to_date.total.allocated_gpu_s > 0
    page.goto("/finance/")
    review = page.locator("tr[data-tenant=vision]")
    expect(page.locator("#review-title")).to_have_text(f"{closed:%B %Y}, the last closed month")
    # The overview reads what is charged: the allocation less its credits (segformer-b5's for
    # the lemon's fault, when the seed's dates put it in the month).
    expect(review.locator("td").nth(1)).to_have_text(f"{statement.total.charged_cost:.2f} EUR")
    # The open month reads accrued: its charged statement plus the attempts still running, to
    # now.
    so_far = review.locator("a[data-statement=to-date]")
    if demo_instant == "now":  # the clock runs: the accrual grows while the page loads
        expect(so_far).to_have_text(re.compile(r"^\d+\.\d{2} EUR$"))
        assert Decimal(so_far.inner_text().split()[0]) >= to_date.total.charged_cost
    else:
        accrued = accrual_month(tenant=vision, month=current, now=timezone.now())
        expect(so_far).to_have_text(f"{to_date.total.charged_cost + accrued.cost:.2f} EUR")
    review.locator("a[data-statement=closed]").click()
    expect(page).to_have_url(re.compile(f"/finance/vision/{closed:%Y-%m}/$"))
    expect(page.locator("[data-kpi=cost]")).to_have_text(f"{statement.total.cost:.2f} EUR")
    picture(page, "finance")
    page.locator("a[rel=next]").click()
    expect(page).to_have_url(re.compile(f"/finance/vision/{current:%Y-%m}/$"))
    expect(page.locator(".page-lead")).to_contain_text("The month so far: it is still open")
    expect(page.locator("[data-kpi=statement-cost]")).to_have_text(
        f"{to_date.total.charged_cost:.2f} EUR"
    )
    if to_date.total.allocated_gpu_s:
        expect(page.locator("[data-kpi=cost]")).to_have_text(f"{to_date.total.cost:.2f} EUR")
    else:
        expect(page.locator("section.empty h2")).to_have_text(f"No GPU time in {current:%B %Y}")
    page.goto("/platform/kpis/")
    expect(page.locator("h1")).to_have_text("Platform KPIs")
    picture(page, "kpis")

    page = persona_page(people["admin"], DEMO_PASSWORD)
    page.goto("/audit/")
    latest = AuditEvent.objects.order_by("-at", "-pk").first()
    expect(page.locator("main")).to_contain_text(latest.action)
    picture(page, "audit")


# --- bad input -------------------------------------------------------------------------------


def fill_submit_form(page: Page, name: str) -> None:
    page.goto("/runs/new/")
    page.select_option("#id_project", "detection")
    page.select_option("#id_image", IMAGE)
    page.fill("#id_name", name)
    page.fill("#id_command", "python train.py --epochs 3")
    page.select_option("#id_flavor", "a100-80gb")
    page.fill("#id_gpus_per_node", "2")
    # The quota check has answered for these values: no request of the page is in flight.
    expect(page.locator("[data-preview-url]")).to_have_attribute("aria-busy", "false")


def test_a_double_click_on_submit_queues_one_run(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "double-click")
    page.get_by_role("button", name="Submit").dblclick()
    page.wait_for_url(RUN_PAGE)
    run = Run.objects.get()
    expect(page.locator("h1")).to_have_text(f"Run #{run.pk} · double-click")
    assert Experiment.objects.count() == 1

    # The server dedupes on its own: the same form sent twice at once, past any script
    # (as a browser without JavaScript, or a retrying proxy, would), still queues one run.
    fill_submit_form(page, "sent-twice")
    key = page.locator("input[name=submission_key]").input_value()
    assert uuid.UUID(key).version == 4
    landed = page.evaluate(
        """async () => {
            const form = document.querySelector("form[data-submit-once]");
            const send = () => fetch(form.action, {method: "POST", body: new FormData(form)});
            const answers = await Promise.all([send(), send()]);
            return answers.map((answer) => [answer.status, new URL(answer.url).pathname]);
        }"""
    )
    twice = Run.objects.get(experiment__name="sent-twice")
    assert landed == [[200, f"/runs/{twice.pk}/"], [200, f"/runs/{twice.pk}/"]]
    assert str(twice.submission_key) == key
    assert (Run.objects.count(), Experiment.objects.count()) == (2, 2)
    screenshot(page, "double-submit", tmp_path)


def test_the_back_button_after_submitting_queues_no_second_run(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "back-button")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    run = Run.objects.get()

    page.go_back()
    expect(page.locator("#id_name")).to_have_value("back-button")
    print(
        "DEBUG",
        run.submission_key,
        page.locator("input[name=submission_key]").input_value(),
        page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()"),
    )
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(f"**/runs/{run.pk}/")
    expect(page.locator(".messages")).to_have_text(
        f"This form was already submitted as run {run.pk}: nothing new was queued. "
        "Open the submit page again to queue another run."
    )
    assert (Run.objects.count(), Experiment.objects.count()) == (1, 1)
    screenshot(page, "back-button-resubmit", tmp_path)

    # A fresh form is a new submission.
    fill_submit_form(page, "on-purpose")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    assert Run.objects.count() == 2


def end_sessions_of(user) -> int:
    """Log ``user`` out on the server side, as an expired or revoked session would."""
    ended = [
        session.pk
        for session in Session.objects.all()
        if session.get_decoded().get("_auth_user_id") == str(user.pk)
    ]
    Session.objects.filter(pk__in=ended).delete()
    return len(ended)


def test_a_session_ending_mid_form_keeps_the_input_through_the_login(world, persona_page, tmp_path):
    page = persona_page(world.researcher_a)
    fill_submit_form(page, "after-login")
    page.locator('[data-field="params"] summary').click()  # Advanced: JSON
    page.fill("#id_params", '{"lr": 0.05}')
    key = page.locator("input[name=submission_key]").input_value()
    assert end_sessions_of(world.researcher_a) == 1

    page.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/accounts/login/?next=/runs/new/")
    expect(page.locator(".messages")).to_have_text(
        "Your session ended before the run was submitted. Log in again: your input is kept "
        "for you to check and submit."
    )
    assert Run.objects.count() == 0
    screenshot(page, "session-ended-login", tmp_path)

    login(page, world.researcher_a.username)
    assert page.url.endswith("/runs/new/")
    expect(page.locator("[data-restored]")).to_have_text(
        "Your input from before the session ended is restored: check it and submit."
    )
    for field, value in (
        ("#id_project", "detection"),
        ("#id_image", IMAGE),
        ("#id_name", "after-login"),
        ("#id_command", "python train.py --epochs 3"),
        ("#id_gpus_per_node", "2"),
        ("#id_params", '{"lr": 0.05}'),
        ("input[name=submission_key]", key),
    ):
        expect(page.locator(field)).to_have_value(value)
    assert Run.objects.count() == 0  # restored to check, not replayed unseen
    screenshot(page, "session-ended-restored", tmp_path)

    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(RUN_PAGE)
    run = Run.objects.get()
    assert (run.experiment.name, run.experiment.params, run.submitted_by) == (
        "after-login",
        {"lr": 0.05},
        world.researcher_a,
    )
    # The draft was used once: the submit page is empty again.
    page.goto("/runs/new/")
    expect(page.locator("[data-restored]")).to_have_count(0)
    expect(page.locator("#id_name")).to_have_value("")


def test_a_multi_megabyte_log_keeps_the_run_page_small_and_downloads_whole(
    world, persona_page, tmp_path
):
    job_dir = tmp_path / "slurm-jobs"
    job_dir.mkdir()
    cluster = Cluster.objects.create(
        name="slurm-logs",
        backend=Cluster.Backend.SLURM,
        settings={"transport": "cli", "job_dir": str(job_dir), "flavors": {"a100-80gb": "a100"}},
    )
    run = submit(world, world.researcher_a, name="chatty")
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)
    attempt = Attempt.objects.create(
        run=run, number=1, cluster=cluster, state=AttemptState.RUNNING, backend_job_id="4242"
    )
    # 8 MiB of 1 KiB lines, the last 200 of them alone 200 KiB.
    line_count = 8 * 1024
    log = job_dir / f"{attempt.name}-4242.out"
    with log.open("w") as handle:
        for step in range(line_count):
            handle.write(f"step {step:06d} loss={1 / (step + 1):.6f} " + "x" * 1000 + "\n")
    size = log.stat().st_size
    assert size > 8 * 1024 * 1024

    page = persona_page(world.researcher_a)
    started = time.perf_counter()
    page.goto(f"/runs/{run.pk}/")
    loaded_s = time.perf_counter() - started
    timing = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
    shown = page.locator("pre.logs").inner_text()
    last_line = f"step {line_count - 1:06d} loss={1 / line_count:.6f} " + "x" * 1000
    assert shown.endswith(last_line)
    assert shown.startswith("step ")  # cut at a line start
    assert len(shown) <= 64 * 1024
    at_the_end = "p => p.scrollTop > 0 && p.scrollTop + p.clientHeight >= p.scrollHeight - 1"
    assert page.locator("pre.logs").evaluate(at_the_end)  # the tail is shown from its end
    expect(page.locator("[data-log-tail]")).to_have_text(
        "The last 64 KiB of the latest attempt's log. Download the whole log"
    )
    # Responsive: the page is still usable right away (the status poll, a click).
    assert timing["loadEventEnd"] < 3000, timing
    assert timing["transferSize"] < 200 * 1024, timing
    screenshot(page, "huge-log", tmp_path)

    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download the whole log").click()
    download = download_info.value
    assert download.suggested_filename == f"run-{run.pk}-attempt-1.log"
    downloaded = Path(download.path())
    assert downloaded.stat().st_size == size
    assert downloaded.read_bytes() == log.read_bytes()
    print(
        f"huge log: {size} B; run page loaded in {loaded_s * 1000:.0f} ms "
        f"(load event {timing['loadEventEnd']:.0f} ms, {timing['transferSize']} B transferred)"
    )


# --- bad input: the server side, without a browser --------------------------------------------


@pytest.mark.django_db
def test_a_replayed_submission_key_returns_the_first_run_even_once_it_would_be_refused(world):
    key = uuid.uuid4()
    first = run_submit(user=world.researcher_a, data=experiment_input(world), submission_key=key)
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).delete()  # now refused

    again = run_submit(
        user=world.researcher_a, data=experiment_input(world, name="changed"), submission_key=key
    )

    assert again == first
    assert (Run.objects.count(), Experiment.objects.count()) == (1, 1)
    assert Experiment.objects.get().name == "resnet-baseline"


@pytest.mark.django_db
def test_submission_keys_are_per_user(world):
    key = uuid.uuid4()
    alices = run_submit(user=world.researcher_a, data=experiment_input(world), submission_key=key)
    arthurs = run_submit(user=world.researcher_a2, data=experiment_input(world), submission_key=key)

    assert alices != arthurs
    assert run_submitted_with(user=world.researcher_a2, submission_key=key) == arthurs
    assert run_submitted_with(user=world.researcher_b, submission_key=key) is None


@pytest.mark.django_db
def test_template_submits_and_reruns_with_one_key_queue_once(world):
    template = make_template(world)
    values = {"tenant": "vision", "project": "detection", "name": "from-template"}
    key = uuid.uuid4()
    first = template_submit(
        user=world.researcher_a, template=template, values=values, submission_key=key
    )
    assert (
        template_submit(
            user=world.researcher_a, template=template, values=values, submission_key=key
        )
        == first
    )
    rerun_key = uuid.uuid4()
    rerun = run_rerun(
        experiment=first.experiment, user=world.researcher_a, submission_key=rerun_key
    )
    again = run_rerun(
        experiment=first.experiment, user=world.researcher_a, submission_key=rerun_key
    )

    assert again == rerun != first
    assert Run.objects.count() == 2
    assert list(rerun.events.values_list("reason", flat=True)) == ["RERUN"]


@pytest.mark.django_db
def test_a_damaged_submission_key_is_a_clear_error_and_queues_nothing(client, world):
    client.force_login(world.researcher_a)
    form = {
        "tenant": "vision",
        "project": "detection",
        "image": IMAGE,
        "command": "python train.py",
        "flavor": "a100-80gb",
        "nodes": "1",
        "gpus_per_node": "2",
        "priority": "50",
        "max_runtime_minutes": "60",
        "max_restarts": "0",
        "params": "{}",
        "env": "{}",
    }

    response = client.post("/runs/new/", form | {"submission_key": "not-a-key"})
    assert response.status_code == 400
    assert "This form is damaged: open the submit page again." in response.content.decode()
    assert Run.objects.count() == 0

    experiment = run_submit(user=world.researcher_a, data=experiment_input(world))
    response = client.post(
        f"/experiments/{experiment.experiment_id}/rerun/", {"submission_key": "not-a-key"}
    )
    assert response.status_code == 302
    assert Run.objects.count() == 1
    response = client.get(response["Location"])
    assert "Not re-run: the form is damaged. Reload the page and try again." in (
        response.content.decode()
    )

    # Without a key (an older page, a script) the form still submits, without the dedupe.
    assert client.post("/runs/new/", form).status_code == 302
    assert Run.objects.count() == 2


@pytest.mark.django_db
def test_a_log_tail_is_cut_at_a_line_start_and_says_so():
    assert text_tail("short\nlog", max_chars=64) == ("short\nlog", False)
    assert text_tail("aaaa\nbbbb\ncccc", max_chars=7) == ("cccc", True)
    # One line longer than the limit keeps its end.
    assert text_tail("x" * 10, max_chars=4) == ("xxxx", True)
