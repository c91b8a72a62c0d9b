"""The run list's rows (jobs/run_rows.py): each row rendered from its view-model alone gives
byte for byte the HTML the list rendered from the run itself, in every state and wait; and
the list's live poll answers 204, swapping nothing, exactly while the results it would send
are the ones the page shows.
"""

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.template import engines
from django.urls import reverse
from django.utils import timezone

from jobs.models import Attempt, AttemptState, Run, RunState, WaitReason
from jobs.run_rows import RUN_ROW_FIELDS, run_row, run_row_html
from jobs.selectors.estimates import shows_full_limits, start_records_shown
from jobs.selectors.runs import run_page_viewable, runs_usage
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)

# The rows as the list rendered them before the view-model, from the run itself.
RUN_ROWS_FROM_RUNS = """{% load estimates %}{% for run in runs %}
      <tr data-run="{{ run.pk }}" data-state="{{ run.state }}">
        <td><a id="run-{{ run.pk }}-link" href="{% url 'jobs:run_detail' run.pk %}">#{{ run.pk }}</a></td>
        <td><a id="run-{{ run.pk }}-experiment" href="{% url 'jobs:experiment_detail' run.experiment_id %}">{{ run.experiment.name }}</a></td>
        <td>{{ run.tenant.slug }} / {{ run.experiment.project.slug }}</td>
        <td>{% include "jobs/_state_badge.html" with state=run.state label=run.get_state_display %}{% include "jobs/_run_tags.html" %}</td>
        <td class="nowrap">{{ run.experiment.nodes }}×{{ run.experiment.gpus_per_node }} {{ run.flavor.slug }}</td>
        <td>{{ run.cluster.name|default:"—" }}</td>
        <td class="wait">
          {% if run.state == RunState.QUEUED %}
            {% if run.wait_reason %}<span class="wait-reason">{{ run.get_wait_reason_display }}</span>{% else %}Waiting for admission{% endif %}{% if run.queue_position %} · #{{ run.queue_position }} in queue{% endif %}
            {% if run.wait_message %}<div class="wait-message">{{ run.wait_message }}</div>{% endif %}
            {% if run.start_full_limits_at %}<div class="start-estimate" data-start-estimate>Starts about {{ run.start_expected_at|default:run.start_full_limits_at|start_time }}{% if run.start_expected_at and run.start_full_limits_at > run.start_expected_at %}; about {{ run.start_full_limits_at|start_time }} if every run ahead uses its full time limit{% endif %} <span class="start-record muted" data-start-record>({{ run.start_record }})</span></div>{% elif run.start_note %}<div class="start-estimate muted" data-start-estimate>No start estimate: {{ run.start_note }}</div>{% endif %}
          {% elif run.wait_message and not run.is_terminal and run.state != RunState.RUNNING and run.state != RunState.PREEMPTED %}
            {% if run.wait_reason %}<span class="wait-reason">{{ run.get_wait_reason_display }}</span>{% endif %}
            <div class="wait-message">{{ run.wait_message }}</div>
          {% else %}—{% endif %}
        </td>
        <td data-duration="{{ run.duration.kind }}"><span class="nowrap">{{ run.duration.text }}</span> <span class="muted">{{ run.duration.label }}</span></td>
        <td class="num" data-gpu-hours>{% if run.gpu_hours %}{{ run.gpu_hours|floatformat:2 }}{% else %}—{% endif %}</td>
        <td><time datetime="{{ run.submitted_at|date:'c' }}" title="{{ run.submitted_at|date:'Y-m-d H:i:s T' }}">{{ run.submitted_at|timesince }} ago</time><div class="muted">by {{ run.submitted_by.get_username }}</div></td>
      </tr>
      {% endfor %}"""  # noqa: E501

# (state, its fields): every state, every branch of the wait cell, both tags, text that
# must be escaped, runs with and without a cluster, GPU-hours and times to show.
RUNS = [
    (RunState.QUEUED, {}),
    (RunState.QUEUED, {"wait_reason": WaitReason.QUOTA, "wait_message": "Waiting <for> 16 GPUs"}),
    (RunState.QUEUED, {"wait_message": "No reason & a message", "start_note": "no history"}),
    (
        RunState.QUEUED,
        {
            "wait_reason": WaitReason.CAPACITY,
            "start_full_limits_at": NOW + 3 * HOUR,
            "start_expected_at": NOW + HOUR,
        },
    ),
    (RunState.QUEUED, {"start_full_limits_at": NOW + 26 * HOUR}),
    (RunState.QUEUED, {"start_full_limits_at": NOW + 10 * 24 * HOUR, "start_expected_at": NOW}),
    (RunState.QUEUED, {"start_full_limits_at": NOW + HOUR, "start_expected_at": NOW + HOUR}),
    (RunState.QUEUED, {"wait_reason": "RETIRED_REASON", "borrowed": True}),
    (RunState.ADMITTED, {"cluster": True, "borrowed": True, "over_budget": True}),
    (RunState.SUBMITTING, {"cluster": True, "wait_message": "Submitting to the cluster"}),
    (
        RunState.PENDING,
        {"cluster": True, "wait_reason": WaitReason.BACKEND, "wait_message": "Held: <Resources>"},
    ),
    (RunState.PENDING, {"cluster": True, "wait_message": "No reason given"}),
    (RunState.RUNNING, {"cluster": True, "wait_message": "stale message", "attempts": 2}),
    (RunState.PREEMPTED, {"wait_message": "Preempted by vision", "attempts": 1}),
    (RunState.QUEUED, {"wait_reason": WaitReason.QUOTA, "attempts": 1, "start_note": "n/a"}),
    (RunState.SUCCEEDED, {"cluster": True, "attempts": 1, "over_budget": True}),
    (RunState.FAILED, {"cluster": True, "wait_message": "left over", "attempts": 3}),
    (RunState.CANCELLED, {"wait_message": "left over"}),
]


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def runs_in_every_state(world) -> None:
    for index, (state, fields) in enumerate(RUNS):
        minutes = 7 * index + 1
        with time_machine.travel(NOW - timedelta(days=index % 3, minutes=minutes), tick=False):
            run = submit(world, name=f'exp-{index} <&> "quoted"', gpus_per_node=1 + index % 4)
        started = NOW - timedelta(minutes=minutes) / 2
        attempts = fields.get("attempts", 0)
        for number in range(1, attempts + 1):
            Attempt.objects.create(
                run=run,
                number=number,
                cluster=world.cluster,
                state=AttemptState.RUNNING if number == attempts else AttemptState.FAILED,
                started_at=started + timedelta(seconds=number),
                finished_at=None if state == RunState.RUNNING and number == attempts else NOW,
            )
        changes = {
            key: value for key, value in fields.items() if key not in ("attempts", "cluster")
        }
        if fields.get("cluster"):
            changes["cluster"] = world.cluster
        if attempts:
            changes["started_at"] = started
        if state in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED):
            changes["finished_at"] = NOW - timedelta(seconds=17)
        Run.objects.filter(pk=run.pk).update(state=state, **changes)


def rows_both_ways(user) -> tuple[str, str]:
    """The rows of the user's first page: from the runs as loaded before, and from view-models
    of the runs as the list loads them now, both at ``NOW``."""
    page = run_page_viewable(user=user, size=len(RUNS))
    runs_usage(page.runs, now=NOW)
    records = start_records_shown(page.runs, flavor_of=lambda run: run.flavor.slug, now=NOW)
    for run in page.runs:
        if shows_full_limits(run):
            run.start_record = records[run.flavor.slug].summary(now=NOW)
    old = engines["django"].from_string(RUN_ROWS_FROM_RUNS)
    before = old.render({"runs": page.runs, "RunState": RunState})
    page = run_page_viewable(user=user, size=len(RUNS), columns=RUN_ROW_FIELDS)
    runs_usage(page.runs, now=NOW)
    rows = [run_row(run, now=NOW, records=records) for run in page.runs]
    after = "".join(f"\n      {run_row_html(row)}\n      " for row in rows)
    return before, after


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/Los_Angeles"])
def test_a_row_from_its_view_model_is_the_row_rendered_from_the_run(world, zone):
    runs_in_every_state(world)
    Run.objects.filter(state=RunState.QUEUED).update(priority=50)

    with time_machine.travel(NOW, tick=False), timezone.override(zone):
        before, after = rows_both_ways(world.researcher_a)

    assert after == before
    assert before.count("<tr data-run=") == len(RUNS)
    # Every branch of the wait cell was rendered.
    for shown in (
        "Waiting for admission",
        "in queue",
        "full time limit",
        "No start estimate",
        "an estimate, not a promise: no",
    ):
        assert shown in before
    assert "RETIRED_REASON" in before and "&lt;Resources&gt;" in before


def test_equal_rows_are_rendered_once_and_any_difference_is_a_new_row(world):
    with time_machine.travel(NOW - HOUR, tick=False):
        submit(world)
    page = run_page_viewable(user=world.researcher_a, size=1, columns=RUN_ROW_FIELDS)
    (run,) = page.runs

    def row_at(moment):
        runs_usage([run], now=moment)
        return run_row(run, now=moment, records={})

    row = row_at(NOW)
    same = row_at(NOW + timedelta(seconds=1))  # "1 h 00 min" queued, "1 hour" ago: as shown
    later = row_at(NOW + timedelta(seconds=60))

    assert same == row and run_row_html(same) is run_row_html(row)
    assert later.duration_text == "1 h 01 min" and later.submitted_ago == "1\xa0hour, 1\xa0minute"
    assert run_row_html(later) == run_row_html(row).replace("1 h 00 min", "1 h 01 min").replace(
        "1\xa0hour ago", "1\xa0hour, 1\xa0minute ago"
    )


# --- the live poll -------------------------------------------------------------------------

VERSION = re.compile(
    r'<input type="hidden" name="shown" value="([0-9a-f]+)" data-live-list-version>'
)


def shown_version(response) -> str:
    found = VERSION.findall(response.content.decode())
    assert len(found) == 1
    return found[0]


def poll(client, version: str, **filters):
    return client.get(reverse("jobs:run_list"), {**filters, "partial": "rows", "shown": version})


def test_the_poll_answers_204_while_nothing_shown_changed_and_the_new_rows_when_a_run_did(
    client, world
):
    first = submit(world)
    client.force_login(world.researcher_a)
    with time_machine.travel(NOW, tick=False):
        Run.objects.update(submitted_at=NOW - HOUR)
        page = client.get(reverse("jobs:run_list"))
        content = page.content.decode()
        version = shown_version(page)

        unchanged = poll(client, version)

        run_cancel(run=first, actor=world.researcher_a)
        changed = poll(client, version)
        again = poll(client, shown_version(changed))
        without_version = client.get(reverse("jobs:run_list"), {"partial": "rows"})

    assert '<div hx-include="#run-results > [data-live-list-version]">' in content
    assert unchanged.status_code == 204 and unchanged.content == b""
    assert "no-store" in unchanged["Cache-Control"]
    assert changed.status_code == 200
    assert f'<tr data-run="{first.pk}" data-state="CANCELLED">' in changed.content.decode()
    assert shown_version(changed) != version
    assert again.status_code == 204
    assert without_version.status_code == 200
    assert shown_version(without_version) == shown_version(changed)


def test_a_new_run_and_time_passing_are_changes_to_the_list(client, world):
    with time_machine.travel(NOW - timedelta(seconds=30), tick=False):
        submit(world)
    client.force_login(world.researcher_a)
    with time_machine.travel(NOW, tick=False):
        version = shown_version(client.get(reverse("jobs:run_list")))
    with time_machine.travel(NOW + timedelta(seconds=1), tick=False):
        ticked = poll(client, version)  # queued for 31 s, no longer 30 s
        version = shown_version(ticked)
        newer = submit(world, name="arrives-later")
        arrived = poll(client, version)

    assert ticked.status_code == 200 and "31 s" in ticked.content.decode()
    assert arrived.status_code == 200 and "arrives-later" in arrived.content.decode()
    assert f'data-run="{newer.pk}"' in arrived.content.decode()


def test_the_poll_keeps_the_filters_and_its_links_carry_no_version(client, world):
    runs = [submit(world) for _ in range(27)]
    client.force_login(world.researcher_a)
    url = reverse("jobs:run_list")
    filters = {"state": "QUEUED", "mine": "1"}
    with time_machine.travel(NOW, tick=False):
        version = shown_version(client.get(url, filters))

        same = poll(client, version, **filters)
        Run.objects.filter(pk=runs[0].pk).update(state=RunState.CANCELLED)
        fewer = poll(client, version, **filters)

    assert same.status_code == 204
    content = fewer.content.decode()
    assert fewer.status_code == 200
    assert (
        '<div id="run-results" hx-get="?state=QUEUED&amp;mine=1&amp;partial=rows" '
        'hx-trigger="every 5s" hx-swap="outerHTML" data-live-list>'
    ) in content
    assert "26 runs" in content
    older = re.search(r'<a href="([^"]*)" rel="next">', content).group(1)
    assert older == f"?state=QUEUED&amp;mine=1&amp;before={runs[2].pk}"
    assert "shown" not in older and "partial" not in older


def test_a_deeper_page_neither_polls_nor_carries_a_version(client, world):
    runs = [submit(world) for _ in range(27)]
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_list"), {"before": runs[5].pk}).content.decode()

    assert '<div id="run-results">\n' in content
    assert 'name="shown"' not in content
