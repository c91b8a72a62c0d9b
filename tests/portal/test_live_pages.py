"""The run page follows its run in place, in a real browser (headless Chromium): each live
section (state, placement, attempts, logs, runtime, timeline) is swapped in by htmx as the
run moves, the page is never reloaded, the focus stays where it was, polling stops once the
end is shown, and then every section says what the database says.

The run is moved through the real services from the test (the page polls the live server),
so each step is seen on its own.
"""

import pytest
from django.contrib.sessions.models import Session
from playwright.sync_api import Page, expect

from jobs.models import Attempt, Run, RunEvent, RunState
from jobs.selectors.logs import run_logs
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, attempt_report_runtime, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tests.browser_support import login
from tests.conftest import experiment_input
from tests.jobs.test_lifecycle import age_simulated_jobs, run_to_running

pytest_plugins = ["tests.browser_support"]

POLL_MS = 300
NO_RELOAD = "window.__gantry_no_reload"


@pytest.fixture(autouse=True)
def fast_polls(settings):
    """Short polls; the messages the services send to a broker no worker reads are dropped."""
    settings.GANTRY_LIVE_POLL_MS = POLL_MS
    yield
    celery_app.control.purge()


def mark_page(page: Page) -> None:
    """A mark only this document carries: a reload or another page loses it."""
    page.evaluate(f"{NO_RELOAD} = 1")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate(f"{NO_RELOAD}") == 1, "the page was reloaded instead of updated"


def badge(page: Page):
    return page.locator("#run-status .status-head .badge")


def attempt_states(page: Page):
    return page.locator("#run-attempts tbody tr td:nth-child(4) .badge")


def live_answers(page: Page) -> list[int]:
    """The status of every answer to the page's polls, as they come."""
    statuses: list[int] = []
    page.on(
        "response",
        lambda response: "/live/" in response.url and statuses.append(response.status),
    )
    return statuses


def assert_polling_stopped(page: Page, statuses: list[int]) -> None:
    """The last poll was answered with 286 and no poll follows it."""
    for _ in range(100):
        if statuses and statuses[-1] == 286:
            break
        page.wait_for_timeout(POLL_MS)
    assert statuses[-1] == 286, statuses
    count = len(statuses)
    page.wait_for_timeout(POLL_MS * 5)
    assert statuses[count - 1 :] == [286], statuses


def assert_every_section_agrees_with_the_database(page: Page, run: Run) -> None:
    run.refresh_from_db()
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    latest = attempts[-1]
    expect(badge(page)).to_have_text(run.get_state_display())
    expect(page.locator("#run-placement [data-cluster]")).to_have_text(run.cluster.name)
    expect(page.locator("#run-placement [data-nodes]")).to_have_text(", ".join(latest.node_list))
    expect(attempt_states(page)).to_have_text([a.get_state_display() for a in attempts])
    finished = page.locator("#run-placement time").nth(1)
    expect(finished).to_have_attribute("datetime", run.finished_at.isoformat())
    expect(finished).to_have_attribute("data-localized", "")  # swapped in, then localized
    last_line = page.locator("#run-logs pre.logs").inner_text().splitlines()[-1]
    assert last_line == run_logs(run=run).splitlines()[-1]
    reported = page.locator("#run-runtime dt:text-is('Runtime reported') + dd")
    if latest.runtime_reported_at is None and latest.is_ended:
        expect(reported).to_have_text("never: the attempt ended without reporting it")
    elif latest.runtime_reported_at is None:
        expect(reported).to_have_text("not yet: the job reports it with its attempt token")
    else:
        expect(reported.locator("time")).to_have_attribute(
            "datetime", latest.runtime_reported_at.isoformat()
        )
        expect(page.locator("#run-runtime dt:text-is('Driver') + dd")).to_have_text(
            latest.runtime_env["driver_version"]
        )
    events = RunEvent.objects.filter(run=run).order_by("at", "id")
    expect(page.locator("#run-events .timeline-state")).to_have_text(
        [
            f"{e.from_state} → {e.to_state}"
            if e.from_state and e.from_state != e.to_state
            else e.to_state
            for e in events
        ]
    )


def test_the_run_page_follows_a_run_from_queued_to_succeeded_without_reloading(world, persona_page):
    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="live-run"))
    page = persona_page(world.researcher_a)
    statuses = live_answers(page)
    page.goto(f"/runs/{run.pk}/")
    assert page.locator("#run-live").get_attribute("data-live-poll-ms") == str(POLL_MS)
    expect(badge(page)).to_have_text("Queued")
    expect(page.locator("#run-placement [data-cluster]")).to_have_text("not admitted yet")
    expect(page.locator("#run-logs")).to_contain_text("No logs yet")
    expect(page.locator("#run-attempts")).to_contain_text("No attempt yet")
    mark_page(page)
    page.locator("#run-cancel-button").focus()

    admission_run_cycle()
    expect(badge(page)).to_have_text("Admitted")
    expect(page.locator("#run-placement [data-cluster]")).to_have_text("sim-1")
    expect(attempt_states(page)).to_have_text(["Created"])
    # The status section was swapped; the keyboard focus is still on its cancel button.
    assert page.evaluate("document.activeElement.id") == "run-cancel-button"

    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    expect(badge(page)).to_have_text("Pending on cluster")
    cluster_sync(cluster=world.cluster)  # placed on a virtual node, started
    expect(badge(page)).to_have_text("Running")
    expect(page.locator("#run-placement [data-nodes]")).to_have_text("sim-1-a100-80gb-00")
    expect(attempt_states(page)).to_have_text(["Running"])
    expect(page.locator("#run-logs pre.logs")).to_contain_text(
        "[simulator] started on sim-1-a100-80gb-00"
    )
    assert page.evaluate("document.activeElement.id") == "run-cancel-button"

    spec = page.locator(f"#attempt-{attempt.pk}-spec")
    spec.locator("summary").click()
    expect(spec).to_have_attribute("open", "")

    attempt_report_runtime(attempt=attempt, report={"driver_version": "550.54.15"})
    expect(page.locator("#run-runtime dt:text-is('Driver') + dd")).to_have_text("550.54.15")
    expect(spec).to_have_attribute("open", "")  # the section was redrawn, the spec kept open

    age_simulated_jobs(1)  # 1000 simulated seconds: past the job's 630
    cluster_sync(cluster=world.cluster)
    expect(badge(page)).to_have_text("Succeeded")
    expect(attempt_states(page)).to_have_text(["Succeeded"])
    expect(page.locator("#run-cancel-button")).to_have_count(0)
    expect(page.locator("#run-logs pre.logs")).to_contain_text("[simulator] finished SUCCEEDED")

    assert_polling_stopped(page, statuses)
    assert_not_reloaded(page)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert_every_section_agrees_with_the_database(page, run)


def test_a_cancelled_run_page_shows_its_attempt_cancelled_without_reloading(world, persona_page):
    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="to-cancel"))
    run_to_running(world, run)
    page = persona_page(world.researcher_a)
    statuses = live_answers(page)
    page.goto(f"/runs/{run.pk}/")
    expect(badge(page)).to_have_text("Running")
    expect(attempt_states(page)).to_have_text(["Running"])
    mark_page(page)

    run_cancel(run=run, actor=world.researcher_a)  # as from the CLI, or another tab
    expect(page.locator("#run-status .wait")).to_have_text(
        "Cancel requested; waiting for the cluster to stop the job."
    )
    expect(badge(page)).to_have_text("Running")

    attempt_cancel(attempt_id=run.attempts.get().pk)  # what the queued cancel task does
    expect(badge(page)).to_have_text("Cancelled")
    expect(attempt_states(page)).to_have_text(["Cancelled"])
    expect(page.locator("#run-cancel-button")).to_have_count(0)

    assert_polling_stopped(page, statuses)
    assert_not_reloaded(page)
    run.refresh_from_db()
    assert (run.state, run.attempts.get().state) == (RunState.CANCELLED, "CANCELLED")
    assert_every_section_agrees_with_the_database(page, run)


def test_a_run_page_whose_session_ended_goes_to_the_login_and_back(world, persona_page):
    run = run_submit(user=world.researcher_a, data=experiment_input(world, name="logged-out"))
    page = persona_page(world.researcher_a)
    page.goto(f"/runs/{run.pk}/")
    expect(badge(page)).to_have_text("Queued")

    Session.objects.all().delete()  # the session ends (expired, or logged out elsewhere)

    page.wait_for_url(f"**/accounts/login/?next=/runs/{run.pk}/")
    login(page, world.researcher_a.username)
    page.wait_for_url(f"**/runs/{run.pk}/")
    expect(badge(page)).to_have_text("Queued")
