"""The run page's live sections: versioned by what they show, sent back only when they
changed, and the end of polling once a finished run is shown whole (jobs.live,
jobs.views.runs.run_live)."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from clusters.models import SimulatedJob
from jobs.live import section_version, sections_changed, sections_render, sections_versions
from jobs.models import Attempt, Run, RunState, WaitReason
from jobs.selectors.logs import run_logs
from jobs.selectors.runs import run_get_viewable
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_report_runtime, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.views.runs import RUN_LIVE_SECTIONS, _run_live_context
from tests.jobs.test_lifecycle import age_simulated_jobs, submit

SECTION = re.compile(
    r'<div id="(run-[a-z]+)" class="live-section"( hx-swap-oob="true")?>'
    r'<input type="hidden" name="\1" value="([0-9a-f]{16})" data-live-version>'
)
ALL_SECTIONS = [
    "run-status",
    "run-placement",
    "run-events",
    "run-attempts",
    "run-logs",
    "run-runtime",
]
NEVER_CACHED = "max-age=0, no-cache, no-store, must-revalidate, private"


def sections_in(html: str) -> dict[str, tuple[bool, str]]:
    """Each live section of an answer, in order: (swapped out of band, version)."""
    return {id_: (bool(oob), version) for id_, oob, version in SECTION.findall(html)}


def versions_of(html: str) -> dict[str, str]:
    return {id_: version for id_, (_, version) in sections_in(html).items()}


def section_html(html: str, section_id: str) -> str:
    """The content of one section of an answer, up to the next section."""
    start = html.index(f'<div id="{section_id}" ')
    end = html.find('<div id="run-', start + 1)
    return html[start : end if end != -1 else len(html)]


def live(client, run, shown: dict[str, str] | None = None):
    return client.get(reverse("jobs:run_live", args=[run.pk]), shown or {})


# --- jobs.live -------------------------------------------------------------------------------


def test_a_section_version_follows_its_inputs_and_the_time_zone_they_are_shown_in():
    inputs = ("RUNNING", datetime(2025, 3, 1, 12, 0, tzinfo=UTC), ["node-1", "node-2"], None)

    first = section_version("run-status", inputs)
    same = section_version("run-status", (*inputs[:2], ["node-1", "node-2"], None))
    other = section_version("run-status", ("SUCCEEDED", *inputs[1:]))
    other_section = section_version("run-placement", inputs)
    with timezone.override("Europe/Berlin"):
        elsewhere = section_version("run-status", inputs)

    assert first == same
    assert len({first, other, other_section, elsewhere}) == 4
    assert re.fullmatch(r"[0-9a-f]{16}", first)


def test_a_section_input_must_be_plain_data(world):
    with pytest.raises(TypeError, match="plain data, not Tenant"):
        section_version("run-status", (world.vision,))


def test_changed_sections_are_those_the_page_does_not_show_in_this_version():
    versions = {
        "run-status": "1111111111111111",
        "run-logs": "2222222222222222",
        "run-events": "3333333333333333",
    }
    shown = {"run-status": "1111111111111111", "run-logs": "0000000000000000"}

    assert sections_changed(versions, shown) == ["run-logs", "run-events"]


# --- versions from inputs against versions of the HTML ----------------------------------------

_CSRF_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="[^"]*"')


def rendered_sections(run, user) -> dict[str, tuple[str, str]]:
    """Each live section of the run page as ``user`` sees it now: (HTML without its CSRF
    token, version)."""
    request = RequestFactory().get("/")
    request.user = User.objects.get(pk=user.pk)  # roles cached afresh, as per request
    run = run_get_viewable(user=request.user, run_id=run.pk)
    context = _run_live_context(request, run)
    versions = sections_versions(specs=RUN_LIVE_SECTIONS, context=context)
    sections = sections_render(
        request=request, specs=RUN_LIVE_SECTIONS, context=context, versions=versions
    )
    return {
        section.id: (_CSRF_TOKEN.sub("", section.html), section.version) for section in sections
    }


def assert_versions_follow_html(snapshots: list[dict[str, tuple[str, str]]]) -> None:
    """Across every pair of snapshots, a section has the same version exactly when it has
    the same HTML: never a stale section, never a needless swap."""
    for section_id in ALL_SECTIONS:
        seen = [snapshot[section_id] for snapshot in snapshots]
        for html_a, version_a in seen:
            for html_b, version_b in seen:
                assert (html_a == html_b) == (version_a == version_b), (section_id, html_a, html_b)


def test_section_versions_change_exactly_when_their_html_does_through_a_run_life(world):
    viewers = (world.researcher_a, world.researcher_a2, world.tenant_admin_a, world.platform_admin)
    snapshots = []

    def snapshot():
        for viewer in viewers:
            snapshots.append(rendered_sections(run, viewer))

    ahead = submit(world, priority=90)
    run = submit(world)
    snapshot()
    Run.objects.filter(pk=run.pk).update(
        wait_reason=WaitReason.QUOTA, wait_message="tenant vision uses its 16 GPUs"
    )
    snapshot()
    estimated_at = timezone.now() - timedelta(minutes=3)
    Run.objects.filter(pk=run.pk).update(
        start_estimated_at=estimated_at,
        start_full_limits_at=estimated_at + timedelta(hours=2),
        start_expected_at=estimated_at + timedelta(hours=1),
    )
    snapshot()
    Run.objects.filter(pk=run.pk).update(start_estimated_at=estimated_at - timedelta(hours=1))
    snapshot()
    run_cancel(run=ahead, actor=world.researcher_a)  # one place up in line
    snapshot()
    Run.objects.filter(pk=run.pk).update(wait_reason="", wait_message="")
    admission_run_cycle()
    snapshot()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    snapshot()
    cluster_sync(cluster=world.cluster)
    snapshot()
    Attempt.objects.filter(pk=attempt.pk).update(last_seen_at=timezone.now())  # not shown
    snapshot()
    attempt_report_runtime(attempt=attempt, report={"driver_version": "550.54.15"})
    snapshot()
    age_simulated_jobs(300)
    snapshot()
    Run.objects.filter(pk=run.pk).update(borrowed=True, over_budget=True)
    snapshot()
    age_simulated_jobs(400)
    cluster_sync(cluster=world.cluster)
    snapshot()

    assert Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED
    assert_versions_follow_html(snapshots)
    # Not shown, so no change: the sync's last_seen_at moved no version.
    assert snapshots[7 * len(viewers)] == snapshots[8 * len(viewers)]


def test_section_versions_change_exactly_when_their_html_does_through_a_cancel(world):
    run = submit(world)
    snapshots = [rendered_sections(run, world.researcher_a)]
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
    cluster_sync(cluster=world.cluster)
    snapshots.append(rendered_sections(run, world.researcher_a))
    run_cancel(run=run, actor=world.researcher_a)
    snapshots.append(rendered_sections(run, world.researcher_a))
    cluster_sync(cluster=world.cluster)
    snapshots.append(rendered_sections(run, world.researcher_a))

    assert_versions_follow_html(snapshots)


# --- the run page and its live answer ----------------------------------------------------------


def test_the_run_page_shows_every_live_section_in_the_version_the_live_answer_has(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)

    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()
    answer = live(client, run)

    assert answer.status_code == 200
    assert "<html" not in answer.content.decode()
    assert list(sections_in(page)) == ALL_SECTIONS
    assert [oob for oob, _ in sections_in(page).values()] == [False] * 6
    assert list(sections_in(answer.content.decode())) == ALL_SECTIONS
    assert [oob for oob, _ in sections_in(answer.content.decode()).values()] == [True] * 6
    # The cancel form's token differs between the two renders: the versions do not.
    assert 'id="run-cancel-button"' in section_html(page, "run-status")
    assert versions_of(answer.content.decode()) == versions_of(page)


def test_only_changed_sections_come_back_and_polling_stops_once_the_end_is_shown(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)
    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()

    unchanged = live(client, run, versions_of(page))
    run_cancel(run=run, actor=world.researcher_a)
    after_cancel = live(client, run, versions_of(page))
    html = after_cancel.content.decode()
    shown_to_the_end = live(client, run, versions_of(page) | versions_of(html))

    assert (unchanged.status_code, unchanged.content) == (204, b"")
    assert after_cancel.status_code == 200
    # Every section whose text depended on the run still going comes back: none says
    # "not yet" or "yet" of what will now never happen.
    assert list(sections_in(html)) == [
        "run-status", "run-placement", "run-events", "run-attempts", "run-logs",
    ]  # fmt: skip
    assert '<span class="badge badge-cancelled">Cancelled</span>' in section_html(
        html, "run-status"
    )
    assert "Cancel run" not in html
    assert "<dd data-cluster>never admitted</dd>" in section_html(html, "run-placement")
    assert '<span class="muted">never</span>' in section_html(html, "run-placement")
    assert "No attempt: the run ended before it was admitted" in section_html(html, "run-attempts")
    assert "No logs: the run ended without a log of its job." in section_html(html, "run-logs")
    assert "not yet" not in html and "No attempt yet" not in html and "No logs yet" not in html
    assert '<span class="timeline-state">QUEUED → CANCELLED</span>' in section_html(
        html, "run-events"
    )
    assert (shown_to_the_end.status_code, shown_to_the_end.content) == (286, b"")
    for answer in (unchanged, after_cancel, shown_to_the_end):
        assert answer["Cache-Control"] == NEVER_CACHED


def test_a_finished_run_that_the_page_does_not_show_whole_yet_is_sent_before_polling_stops(
    client, world
):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)
    client.force_login(world.researcher_a)

    stale = live(client, run, {"run-status": "0" * 16})

    assert stale.status_code == 200
    assert list(sections_in(stale.content.decode())) == ALL_SECTIONS


def test_each_section_follows_the_run_from_queued_to_succeeded(client, world):
    run = submit(world)
    client.force_login(world.researcher_a)
    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()
    assert "<dd data-cluster>not admitted yet</dd>" in section_html(page, "run-placement")
    assert "No logs yet" in section_html(page, "run-logs")
    shown = versions_of(page)

    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)  # placed and started on a virtual node
    running = live(client, run, shown).content.decode()
    shown |= versions_of(running)

    assert list(sections_in(running)) == ALL_SECTIONS
    assert '<span class="badge badge-running">Running</span>' in section_html(running, "run-status")
    placement = section_html(running, "run-placement")
    assert "<dd data-cluster>sim-1</dd>" in placement
    assert '<dd class="mono" data-nodes>sim-1-a100-80gb-00</dd>' in placement
    assert "<dd>0 of 0</dd>" in placement
    assert "<td>1</td>\n        <td>sim-1</td>" in section_html(running, "run-attempts")
    assert '<span class="badge badge-running">Running</span>' in section_html(
        running, "run-attempts"
    )
    logs = section_html(running, "run-logs")
    assert "[simulator] started on sim-1-a100-80gb-00" in logs
    assert "The last 200 lines of the latest attempt's log." in logs
    assert '<h3>Attempt 1 <span class="muted">on sim-1</span>' in section_html(
        running, "run-runtime"
    )

    attempt_report_runtime(attempt=attempt, report={"driver_version": "550.54.15"})
    reported = live(client, run, shown).content.decode()
    shown |= versions_of(reported)

    assert list(sections_in(reported)) == ["run-events", "run-runtime"]
    assert '<dt>Driver</dt><dd class="mono">550.54.15</dd>' in section_html(reported, "run-runtime")

    age_simulated_jobs(1)  # past the simulated job's 630 s
    cluster_sync(cluster=world.cluster)
    finished = live(client, run, shown).content.decode()
    shown |= versions_of(finished)
    run.refresh_from_db()

    assert run.state == RunState.SUCCEEDED
    assert set(sections_in(finished)) == {
        "run-status",
        "run-placement",
        "run-events",
        "run-attempts",
        "run-logs",
        "run-runtime",
    }
    assert '<span class="badge badge-succeeded">Succeeded</span>' in section_html(
        finished, "run-status"
    )
    assert f'<time datetime="{run.finished_at.isoformat()}">' in section_html(
        finished, "run-placement"
    )
    last_line = run_logs(run=run).splitlines()[-1]
    assert last_line.startswith("[simulator] finished SUCCEEDED exit=0")
    assert last_line in section_html(finished, "run-logs")
    assert SimulatedJob.objects.get().state == "SUCCEEDED"
    assert live(client, run, shown).status_code == 286


def test_an_attempt_that_never_reported_its_runtime_stops_saying_not_yet_when_it_ends(
    client, world
):
    run = submit(world)
    client.force_login(world.researcher_a)
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=run).pk)
    cluster_sync(cluster=world.cluster)
    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()
    assert "not yet: the job reports it with its attempt token" in section_html(page, "run-runtime")

    age_simulated_jobs(1)
    cluster_sync(cluster=world.cluster)
    finished = live(client, run, versions_of(page)).content.decode()

    runtime = section_html(finished, "run-runtime")
    assert "never: the attempt ended without reporting it" in runtime
    assert "not yet" not in finished


def test_a_finished_run_page_is_not_polled(client, world):
    run = submit(world)
    run_cancel(run=run, actor=world.researcher_a)
    client.force_login(world.researcher_a)

    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()

    assert '<div class="live" id="run-live" data-live-poll-ms="3000">' in page
    assert "hx-get" not in page


def test_the_poll_interval_is_a_setting(client, world, settings):
    settings.GANTRY_LIVE_POLL_MS = 250
    run = submit(world)
    client.force_login(world.researcher_a)

    page = client.get(reverse("jobs:run_detail", args=[run.pk])).content.decode()

    assert 'hx-trigger="every 250ms"' in page
    assert 'data-live-poll-ms="250"' in page


# --- who may read it -------------------------------------------------------------------------


def test_the_live_answer_needs_a_login(client, world):
    run = submit(world)
    url = reverse("jobs:run_live", args=[run.pk])

    response = client.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next=/runs/{run.pk}/live/"


@pytest.mark.parametrize("persona", ["researcher_b", "researcher_a"])
def test_the_live_answer_is_404_for_other_tenants_exactly_as_for_a_missing_run(
    client, world, persona
):
    run = submit(world, user=world.researcher_b, tenant="nlp", project="llm")
    client.force_login(getattr(world, persona))
    outsider = persona == "researcher_a"

    response = live(client, run)
    missing = client.get(reverse("jobs:run_live", args=[run.pk + 1000]))

    assert response.status_code == (404 if outsider else 200)
    assert missing.status_code == 404
    if outsider:
        assert b"resnet-baseline" not in response.content
    else:
        assert response["Cache-Control"] == NEVER_CACHED
