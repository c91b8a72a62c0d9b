"""Accessibility and usability of the interface.

In headless Chromium: axe-core on the main pages of the demo world that ``make run`` seeds;
the keyboard's first stop skips to the content; times shown in the reader's time zone; a
sent form and an export show that their answer is coming. Without a browser: the
navigation by role, no script, style or font from another host, form errors tied to their
fields.

axe-core comes bundled in the axe-playwright-python package (axe.min.js, MPL-2.0): nothing is
fetched at test time. A page passes when axe finds no violation of impact "serious" or
"critical"; a failure lists each one with the elements it found.
"""

import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from jobs.forms import RunSubmitForm
from jobs.models import Run, RunEvent
from jobs.services.submission import run_submit
from jobs.services.workspaces import WorkspaceInput, workspace_launch
from policy.services.replaying import replay_report_run
from policy.services.reports import replay_report_create
from portal.demo import DEMO_PASSWORD, demo_seed
from tenants.models import Membership, Notification, Tenant
from tests import REPOSITORY
from tests.browser_support import VIEWPORT, login
from tests.conftest import PASSWORD, experiment_input

pytest_plugins = ["tests.browser_support"]

ROOT = REPOSITORY
SEVERE_IMPACTS = ("serious", "critical")
AXE = Axe()


def severe_violations(page) -> list[str]:
    """axe-core's serious and critical violations on the page, one readable line per element."""
    results = AXE.run(page, options={"resultTypes": ["violations"]})
    return [
        f"{violation['id']} ({violation['impact']}): {violation['help']} — "
        f"{' '.join(map(str, node['target']))}: {node['html'][:200]}"
        for violation in results.response["violations"]
        if violation["impact"] in SEVERE_IMPACTS
        for node in violation["nodes"]
    ]


def settled(page) -> None:
    """Wait until the page is drawn: scripts ran and no chart is still loading."""
    page.wait_for_load_state("load")
    page.wait_for_function("!document.querySelector('.chart[aria-busy=\"true\"]')")


def run_id(name: str) -> int:
    return Run.objects.filter(experiment__name=name).values_list("pk", flat=True).get()


def last_month() -> date:
    return (datetime.now(UTC).date().replace(day=1) - timedelta(days=1)).replace(day=1)


@pytest.fixture
def demo_world(transactional_db):
    """The demo of `make run` (runs placed by its first admission cycle, one waiting), and
    an unread notification, so the navigation shows its badge."""
    demo_seed(speedup=30)
    Notification.objects.create(
        user=User.objects.get(username="alice"),
        tenant=Tenant.objects.get(slug="vision"),
        kind=Notification.Kind.BUDGET_80,
        message="Tenant vision has used 80 % of its a100-80gb budget for this month.",
    )


def submit_empty_form(page) -> None:
    """The submit form sent without the browser's own checks: the server's inline errors."""
    page.eval_on_selector("form.form", "form => { form.noValidate = true; }")
    page.fill("#id_command", "")
    with page.expect_navigation():
        page.click("form.form button[type=submit]")
    assert page.locator(".field-invalid").count() >= 1


def submit_form_with_editor_rows(page) -> None:
    """The submit form's params and env as rows (static/gantry/editors.js), one of them
    hinted as a bad name, and their JSON view open."""
    page.get_by_role("button", name="Add parameter").click()
    page.get_by_label("Parameter 1 name").fill("lr")
    page.get_by_label("Parameter 1 type").select_option("number")
    page.get_by_label("Parameter 1 value").fill("0.1")
    page.get_by_role("button", name="Add variable").click()
    page.get_by_label("Variable 1 name").fill("BAD NAME")
    page.locator('[data-field="params"] summary').click()
    assert page.locator('[data-field="env"] .kv-hints li').count() == 1


def template_form_with_editor_rows(page) -> None:
    """The template form's defaults, locks and ranges as rows and checkboxes."""
    page.get_by_role("button", name="Add default").click()
    page.get_by_label("Default 1 field").select_option("resources.gpus_per_node")
    page.get_by_label("Default 1 value").fill("2")
    page.get_by_role("checkbox", name="resources.gpus_per_node").check()
    page.get_by_role("button", name="Add range").click()
    page.get_by_label("Range 1 field").select_option("resources.gpus_per_node")
    page.get_by_label("Range 1 min").fill("1")
    page.get_by_label("Range 1 max").fill("4")
    page.locator('[data-field="values"] summary').click()


def wrong_password(page) -> None:
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "not-the-password")
    with page.expect_navigation():
        page.click("form button[type=submit]")


def create_token(page) -> None:
    """The account page's token form sent: the answer that shows the new token once."""
    page.fill("#id_name", "laptop")
    with page.expect_navigation():
        page.click("form[data-token-create] button[type=submit]")
    assert page.locator("#new-token").count() == 1


def add_unknown_member(page) -> None:
    """The members page after a refused invitation: the error next to its field."""
    page.fill("#id_user", "alice")
    with page.expect_navigation():
        page.click("form[data-member-add] button[type=submit]")
    assert page.locator("[data-field=user] .errorlist").count() == 1


def audit_pages(browser, live_server, username: str, steps: list) -> dict[str, list[str]]:
    """Each step is a path to open or a (name, action) pair run on the page; the violations
    axe finds after each, by step."""
    context = browser.new_context(base_url=live_server.url, viewport=VIEWPORT)
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        if username:
            login(page, username, DEMO_PASSWORD)
        found = {}
        for step in steps:
            if isinstance(step, str):
                response = page.goto(step)
                assert response is not None and response.status == 200, (step, response.status)
                name = step
            else:
                name, action = step
                action(page)
            settled(page)
            found[name] = severe_violations(page)
        return found
    finally:
        context.close()


def test_main_pages_have_no_serious_or_critical_violations(browser, live_server, demo_world):
    waiting, input_bound = run_id("yolo-xl"), run_id("unet-sweep-1")
    resumed, borrowed = run_id("colbert-distill"), run_id("dpr-sweep")
    experiment = Run.objects.get(pk=input_bound).experiment_id
    alice = User.objects.get(username="alice")
    workspace = workspace_launch(
        user=alice,
        data=WorkspaceInput(
            tenant="vision",
            project=Run.objects.get(pk=input_bound).experiment.project.slug,
            image=Run.objects.get(pk=input_bound).experiment.image_reference,
            flavor="a100-80gb",
            gpus=1,
        ),
    )
    admin = User.objects.get(username="admin")
    replayed = replay_report_create(
        actor=admin,
        window_start=timezone.now() - timedelta(days=7),
        window_end=timezone.now(),
        proposal={"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 8}]},
        confirm_warnings=True,
        share=True,
    )
    replay_report_run(report_id=replayed.pk)
    steps = {
        "": ["/accounts/login/", ("login with a wrong password", wrong_password)],
        "alice": [
            "/",
            "/runs/",
            f"/runs/{waiting}/",
            "/runs/new/",
            ("submit form with editor rows", submit_form_with_editor_rows),
            ("submit form with errors", submit_empty_form),
            f"/experiments/{experiment}/",
            "/experiments/",
            f"/experiments/?compare={experiment}",
            "/runs/?mine=1",
            "/workspaces/",
            "/workspaces/new/",
            f"/workspaces/{workspace.pk}/",
            "/quotas/",
            "/images/",
            f"/runs/{input_bound}/telemetry/",
            "/tenants/vision/goodput/?days=30&by=day",
            "/notifications/",
            "/clusters/nodes/",
            "/accounts/",
            ("account page showing a new token", create_token),
            "/accounts/invitations/",
        ],
        "tara": [
            "/",
            "/tenants/vision/members/",
            ("members page with a refused addition", add_unknown_member),
            f"/what-if/{replayed.pk}/",
        ],
        "bob": [f"/runs/{borrowed}/", f"/runs/{resumed}/telemetry/"],
        "fiona": [
            "/",
            "/finance/",
            f"/finance/vision/{last_month():%Y-%m}/",
            "/platform/kpis/",
        ],
        "admin": [
            "/",
            "/audit/",
            "/images/",
            "/templates/",
            "/templates/new/",
            ("template form with editor rows", template_form_with_editor_rows),
            "/clusters/",
            "/clusters/nodes/",
            "/what-if/",
            "/what-if/new/",
            f"/what-if/{replayed.pk}/",
            f"/what-if/{replayed.pk}/apply/",
        ],
    }
    found = {}
    for username, pages in steps.items():
        for name, lines in audit_pages(browser, live_server, username, pages).items():
            if lines:
                found[f"{username or 'anonymous'}: {name}"] = lines
    report = "\n".join(f"{where}\n  " + "\n  ".join(lines) for where, lines in found.items())
    assert found == {}, "serious or critical accessibility violations:\n" + report


def test_keyboard_skips_to_the_content_and_times_show_in_the_readers_zone(
    browser, live_server, world
):
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    RunEvent.objects.filter(run=run).update(at=datetime(2025, 1, 15, 12, 0, tzinfo=UTC))
    context = browser.new_context(
        base_url=live_server.url, viewport=VIEWPORT, timezone_id="Europe/Berlin"
    )
    try:
        page = context.new_page()
        login(page, world.researcher_a.username, PASSWORD)
        page.goto(f"/runs/{run.pk}/")
        settled(page)

        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to content"
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "main"

        queued = page.locator(".timeline-item time").first
        assert queued.text_content() == "2025-01-15 13:00:00 CET"
        assert queued.get_attribute("title") == "2025-01-15 12:00:00 UTC"
        assert queued.get_attribute("datetime") == "2025-01-15T12:00:00+00:00"
    finally:
        context.close()


def hold(page, pattern: str) -> list:
    """Requests matching ``pattern`` wait until the test continues their routes."""
    held = []
    page.route(pattern, lambda route: held.append(route))
    return held


def wait_for_requests(page, held: list, count: int) -> None:
    for _ in range(400):  # polled: Playwright hands routes over while the page waits
        if len(held) >= count:
            return
        page.wait_for_timeout(25)
    raise AssertionError(f"{len(held)} requests instead of {count}")


def test_a_sent_form_and_an_export_show_that_their_answer_is_coming(browser, live_server, world):
    month = datetime.now(UTC).date().replace(day=1)
    context = browser.new_context(
        base_url=live_server.url, viewport=VIEWPORT, accept_downloads=True
    )
    try:
        page = context.new_page()
        login(page, world.finance.username, PASSWORD)
        page.goto("/finance/")
        settled(page)
        # Answered "204 No Content": the browser stays on the page, as while a slow answer
        # is on its way.
        choose = []
        page.route(
            "**/finance/?tenant=*",
            lambda route: (choose.append(route.request.url), route.fulfill(status=204)),
        )
        page.select_option("#statement-tenant", "vision")
        show = page.locator("#statement-title + form button[type=submit]")

        show.click()
        wait_for_requests(page, choose, 1)
        assert show.get_attribute("aria-busy") == "true"
        assert page.get_attribute("#statement-title + form", "aria-busy") == "true"
        show.click(force=True)  # clicked again (aria-disabled), it sends nothing
        page.wait_for_timeout(300)
        assert len(choose) == 1

        page.goto(f"/finance/vision/{month:%Y-%m}/")
        settled(page)
        export = hold(page, "**/finance/export.csv?*")
        page.click("a[data-export=csv]")
        wait_for_requests(page, export, 1)
        assert page.get_attribute("a[data-export=csv]", "aria-busy") == "true"
        assert page.text_content("#export-status") == "Preparing the file…"
        with page.expect_download() as download:
            export[0].continue_()
        name = download.value.suggested_filename
        assert name.startswith(f"gantry-usage-vision-{month:%Y%m%d}-") and name.endswith(".csv")
        page.wait_for_function("!document.querySelector('a[data-export=csv]').ariaBusy")
        assert page.text_content("#export-status") == f"Downloaded {name}."
    finally:
        context.close()


# --- without a browser ---------------------------------------------------------------------

NAVIGATION = {
    "researcher_a": {
        "Work": ["Runs", "Experiments", "Submit", "Workspaces", "Images", "Quotas", "Nodes"],
        "Reports": ["Goodput"],
    },
    "tenant_admin_a": {
        "Work": [
            "Runs",
            "Experiments",
            "Submit",
            "Workspaces",
            "Templates",
            "Images",
            "Quotas",
            "Members",
            "Nodes",
        ],
        "Reports": ["Goodput", "Finance", "What-if"],
        "Platform": ["Audit"],
    },
    "finance": {
        "Work": ["Runs", "Experiments", "Images", "Quotas", "Nodes"],
        "Reports": ["Goodput", "Finance", "KPIs", "What-if"],
    },
    "platform_admin": {
        "Work": [
            "Runs",
            "Experiments",
            "Workspaces",
            "Templates",
            "Images",
            "Quotas",
            "Nodes",
        ],
        "Reports": ["Goodput", "Finance", "KPIs", "What-if"],
        "Platform": [
            "Clusters",
            "Node health",
            "Flavors",
            "Registries",
            "Unmapped",
            "Audit",
            "Admin",
        ],
    },
}


@pytest.mark.parametrize("persona", NAVIGATION)
def test_the_navigation_shows_each_role_its_pages_and_marks_the_current_one(client, world, persona):
    client.force_login(getattr(world, persona))

    response = client.get(reverse("jobs:quota_list"))

    groups = response.context["nav_groups"]
    assert {group.label: [link.label for link in group.links] for group in groups} == (
        NAVIGATION[persona]
    )
    assert [link.label for group in groups for link in group.links if link.current] == ["Quotas"]
    assert '<a href="/quotas/" aria-current="page">Quotas</a>' in response.content.decode()
    answers = {link.label: client.get(link.url).status_code for g in groups for link in g.links}
    assert set(answers.values()) <= {200, 302}, answers  # no link leads to a 404


def test_members_leads_a_tenant_admin_to_the_members_of_each_tenant_they_administer(client, world):
    client.force_login(world.tenant_admin_a)
    response = client.get(reverse("members"))
    assert response.status_code == 302
    assert response["Location"] == reverse("jobs:tenant_members", args=["vision"])

    members = client.get(response["Location"])
    groups = members.context["nav_groups"]
    current = [link.label for group in groups for link in group.links if link.current]
    assert current == ["Members"]

    # Admin of two tenants: a list of both.
    Membership.objects.create(user=world.tenant_admin_a, tenant=world.nlp, role="tenant_admin")
    listing = client.get(reverse("members")).content.decode()
    assert 'href="/tenants/nlp/members/"' in listing
    assert 'href="/tenants/vision/members/"' in listing


@pytest.mark.parametrize("persona", ["researcher_a", "finance", "platform_admin"])
def test_members_is_404_for_who_administers_no_tenant(client, world, persona):
    client.force_login(getattr(world, persona))
    assert client.get(reverse("members")).status_code == 404


# Where a page or stylesheet names another resource: src/href attributes, CSS url() and
# @import. An XML namespace (xmlns="http://www.w3.org/2000/svg") fetches nothing.
RESOURCE_REFERENCE = re.compile(
    r"""(?:\b(?:src|href)\s*=\s*["']?|url\(\s*["']?|@import\s+["']?)\s*((?:https?:)?//[^"')\s>]+)""",
    re.IGNORECASE,
)
SCRIPT_OR_STYLE_TAG = re.compile(r"<(?:script|link)\b[^>]*>", re.IGNORECASE)


def asset_files() -> list[Path]:
    return sorted(
        path
        for folder in ("templates", "static")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".html", ".css", ".js", ".svg"} and "vendor" not in path.parts
    )


def test_no_template_or_asset_of_ours_loads_anything_from_another_host():
    files = asset_files()
    offenders = {
        str(path.relative_to(ROOT)): RESOURCE_REFERENCE.findall(path.read_text())
        for path in files
        if RESOURCE_REFERENCE.findall(path.read_text())
    }
    # Nor any <script> or <link> tag that names a host some other way (protocol-relative).
    tags = {
        str(path.relative_to(ROOT)): [
            tag for tag in SCRIPT_OR_STYLE_TAG.findall(path.read_text()) if "//" in tag
        ]
        for path in files
        if path.suffix == ".html"
    }
    # The scan sees every template and our own CSS and JS, and not the vendored libraries.
    names = {str(path.relative_to(ROOT)) for path in files}
    assert {"templates/base.html", "static/gantry/gantry.js", "static/gantry/gantry.css"} <= names
    assert len(names) == len(list((ROOT / "templates").rglob("*.html"))) + len(
        [path for path in (ROOT / "static" / "gantry").rglob("*") if path.is_file()]
    )
    assert offenders == {}
    assert {name: found for name, found in tags.items() if found} == {}


def test_vendored_libraries_are_served_from_static_with_their_licence():
    plotly = ROOT / "static" / "vendor" / "plotly"
    assert sorted(path.name for path in plotly.iterdir()) == ["LICENSE.txt", "plotly-4.1.1.min.js"]
    templates = [path.read_text() for path in (ROOT / "templates").rglob("*.html")]
    loads = [line for text in templates for line in text.splitlines() if "plotly" in line]
    assert loads and all(
        "{% static 'vendor/plotly/plotly-4.1.1.min.js' %}" in line for line in loads
    )
    htmx = ROOT / "static" / "vendor" / "htmx"
    assert sorted(path.name for path in htmx.iterdir()) == ["LICENSE.txt", "htmx-2.0.11.min.js"]
    base = (ROOT / "templates" / "base.html").read_text()
    assert "{% static 'vendor/htmx/htmx-2.0.11.min.js' %}" in base
    assert '"allowEval": false' in base


def test_a_field_error_sits_next_to_its_field_and_describes_it(world, rf):
    request = rf.post(reverse("jobs:run_submit"))
    request.user = world.researcher_a
    form = RunSubmitForm(
        {"tenant": "vision", "nodes": "two"},
        tenants=[world.vision],
        projects=[world.vision_project],
        images=[world.image],
        flavor_limits={},
    )
    assert not form.is_valid()

    html = render_to_string("jobs/_field.html", {"field": form["nodes"]}, request=request)

    widget = re.search(r"<input[^>]*>", html).group(0)
    assert 'aria-invalid="true"' in widget
    described_by = re.search(r'aria-describedby="([^"]+)"', widget).group(1).split()
    assert "id_nodes_error" in described_by
    error_list = re.search(r'<ul class="errorlist" id="id_nodes_error">(.*?)</ul>', html).group(1)
    assert error_list == "<li>Enter a whole number.</li>"
    assert html.index("<input") < html.index('id="id_nodes_error"')
    assert '<label for="id_nodes">' in html
