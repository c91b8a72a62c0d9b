"""Finding things in a real browser (headless Debian Chromium through Playwright, see
tests/browser_support.py): searching and filtering the experiments list, picking the other
side of a comparison, the run list's "Mine" toggle, and the run list refreshing itself in
place while the runs change through the real services, its polls answered "no change"
while they hold.
"""

import re
from datetime import timedelta

from django.db.models import F
from playwright.sync_api import Page, expect

from jobs.models import Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tenants.access import tenant_list_viewable
from tests.browser_support import screenshot
from tests.conftest import experiment_input

pytest_plugins = ["tests.browser_support"]

OTHER_COMMIT = "f" * 40


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def listed_names(page: Page) -> list[str]:
    return page.locator("tr[data-experiment] td:first-child a").all_text_contents()


def test_search_and_filter_the_experiments_list_then_open_one(world, persona_page, tmp_path):
    submit(world)  # resnet-baseline, alice
    wide = submit(world, name="resnet-wide", code_commit=OTHER_COMMIT)
    submit(world, user=world.researcher_a2, name="resnet-arthur")
    submit(world, user=world.researcher_b, name="resnet-nlp", tenant="nlp", project="llm")
    page = persona_page(world.researcher_a)

    page.get_by_role("link", name="Experiments", exact=True).click()
    expect(page.get_by_role("heading", name="Experiments", exact=True)).to_be_visible()
    assert listed_names(page) == ["resnet-arthur", "resnet-wide", "resnet-baseline"]

    page.get_by_label("Name").fill("resnet")
    page.get_by_label("Commit").fill(OTHER_COMMIT[:8])
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"/experiments/\?.*commit=ffffffff"))
    assert listed_names(page) == ["resnet-wide"]
    expect(page.get_by_label("Commit")).to_have_value(OTHER_COMMIT[:8])  # kept in the form

    page.get_by_label("Commit").fill("")
    page.get_by_label("Only mine").check()
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"mine=1"))
    assert listed_names(page) == ["resnet-wide", "resnet-baseline"]
    screenshot(page, "experiments-list", tmp_path)

    page.get_by_role("link", name="resnet-wide").click()
    page.wait_for_url(f"**/experiments/{wide.experiment_id}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("resnet-wide")


def test_pick_an_experiment_to_compare_and_see_the_diff(world, persona_page):
    baseline = submit(world).experiment
    wide = submit(world, name="resnet-wide", code_commit=OTHER_COMMIT).experiment
    submit(world, user=world.researcher_b, name="resnet-nlp", tenant="nlp", project="llm")
    page = persona_page(world.researcher_a)

    page.goto(f"/experiments/{wide.pk}/")
    picker = page.get_by_label(f"Another experiment of {world.vision.slug}")
    # Only the tenant's other experiments: nlp's is not offered, nor the experiment itself.
    assert picker.locator("option").all_text_contents() == [
        f"#{baseline.pk} resnet-baseline · 1 run, latest #{baseline.runs.get().pk} · "
        f"{baseline.created_at:%Y-%m-%d}"
    ]
    picker.select_option(str(baseline.pk))
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url(f"**/experiments/diff/?a={wide.pk}&b={baseline.pk}")
    expect(page.get_by_role("heading", level=1)).to_have_text(
        f"Experiment {wide.pk} vs {baseline.pk}"
    )
    expect(page.locator("tr.diff-differs")).to_have_count(1)
    expect(page.locator("tr.diff-differs th")).to_contain_text("Code commit")

    # The same from the experiments list, for an experiment the picker does not show first.
    page.get_by_role("link", name=f"Compare #{wide.pk} with another").click()
    page.wait_for_url(f"**/experiments/?compare={wide.pk}")
    assert listed_names(page) == ["resnet-wide", "resnet-baseline"]
    page.get_by_role("link", name=f"Compare #{wide.pk} with #{baseline.pk}").click()
    page.wait_for_url(f"**/experiments/diff/?a={wide.pk}&b={baseline.pk}")
    expect(page.locator("tr.diff-differs")).to_have_count(1)


def row_ids(page: Page) -> list[int]:
    return [
        int(value)
        for value in page.locator("tr[data-run]").evaluate_all(
            "rows => rows.map(row => row.dataset.run)"
        )
    ]


def test_the_mine_toggle_of_the_run_list(world, persona_page):
    alice = submit(world)
    arthur = submit(world, user=world.researcher_a2)
    page = persona_page(world.researcher_a)

    page.goto("/runs/")
    assert row_ids(page) == [arthur.pk, alice.pk]
    page.get_by_role("link", name="Mine", exact=True).click()
    page.wait_for_url(re.compile(r"/\?mine=1$"))
    assert row_ids(page) == [alice.pk]
    expect(page.get_by_role("link", name="Mine", exact=True)).to_have_attribute(
        "aria-current", "true"
    )
    page.select_option("#filter-state", "QUEUED")  # submits itself, Mine kept
    page.wait_for_url(re.compile(r"mine=1.*state=QUEUED|state=QUEUED.*mine=1"))
    assert row_ids(page) == [alice.pk]
    page.get_by_role("link", name="Everyone's").click()
    page.wait_for_url(lambda url: "state=QUEUED" in url and "mine" not in url)
    assert row_ids(page) == [arthur.pk, alice.pk]


def rows_in_page(page: Page) -> list[tuple[int, str]]:
    return [
        (int(run), state)
        for run, state in page.locator("tr[data-run]").evaluate_all(
            "rows => rows.map(row => [row.dataset.run, row.dataset.state])"
        )
    ]


def rows_in_database(user) -> list[tuple[int, str]]:
    runs = Run.objects.filter(tenant__in=tenant_list_viewable(user=user))
    return list(runs.order_by("-submitted_at", "-id").values_list("pk", "state")[:25])


def test_the_run_list_updates_in_place_as_runs_change(world, persona_page, tmp_path):
    first = submit(world)
    second = submit(world, user=world.researcher_a2)
    page = persona_page(world.researcher_a)
    page.goto("/runs/")
    page.evaluate("window.__marker = 1")
    assert rows_in_page(page) == [(second.pk, "QUEUED"), (first.pk, "QUEUED")]

    run_cancel(run=first, actor=world.researcher_a)
    admission_run_cycle()  # second is admitted
    third = submit(world, name="arrives-later")

    cancelled = page.locator(f'tr[data-run="{first.pk}"]')
    expect(cancelled).to_have_attribute("data-state", RunState.CANCELLED)
    expect(cancelled.locator(".badge")).to_have_text("Cancelled")
    expect(page.locator(f'tr[data-run="{third.pk}"]')).to_contain_text("arrives-later")
    expect(page.locator(f'tr[data-run="{second.pk}"]')).not_to_have_attribute(
        "data-state", RunState.QUEUED
    )
    assert page.evaluate("window.__marker") == 1  # the same document: nothing reloaded
    assert rows_in_page(page) == rows_in_database(world.researcher_a)
    assert len(rows_in_page(page)) == 3
    screenshot(page, "run-list-live", tmp_path)


def test_the_run_list_poll_sends_the_version_shown_and_swaps_nothing_while_it_holds(
    world, persona_page
):
    ended = [submit(world), submit(world, user=world.researcher_a2)]
    for run in ended:
        run_cancel(run=run, actor=run.submitted_by)
    # Submitted days ago and ended: nothing the rows show changes while the test runs.
    Run.objects.update(submitted_at=F("submitted_at") - timedelta(days=3))
    page = persona_page(world.researcher_a)
    page.goto("/runs/")
    shown = page.locator("[data-live-list-version]").get_attribute("value")
    rows = page.locator("#run-results").inner_html()

    with page.expect_response(lambda response: "partial=rows" in response.url) as polled:
        pass

    assert polled.value.status == 204
    assert f"shown={shown}" in polled.value.url
    assert page.locator("#run-results").inner_html() == rows
    assert rows_in_page(page) == rows_in_database(world.researcher_a)
