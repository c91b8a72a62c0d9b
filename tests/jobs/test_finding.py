"""Finding things: the experiments list (search, filters, scoping, pages), the compare
picker, and the run list's "Mine" filter, duration and GPU-hour columns, full wait reasons
and the partial its first page polls.

Experiments are submitted through the real service; times of runs and attempts are set
where a test needs known durations, with the clock fixed by time-machine.
"""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils.html import escape

from jobs.durations import RunDuration, run_duration
from jobs.models import (
    Attempt,
    AttemptState,
    Experiment,
    ExperimentTemplate,
    Run,
    RunState,
    TenantMonthUsage,
)
from jobs.selectors.runs import runs_usage
from jobs.services.submission import run_submit
from jobs.services.usage import usage_record_attempt
from tenants.models import Project
from tests.conftest import COMMIT, DIGEST_A, experiment_input

pytestmark = pytest.mark.django_db

OTHER_COMMIT = "f" * 40
NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def listed(client, **query) -> list[str]:
    response = client.get(reverse("jobs:experiment_list"), query)
    assert response.status_code == 200
    return [row.experiment.name for row in response.context["rows"]]


@pytest.fixture
def catalog(world):
    """Five experiments of vision (alice, arthur) and one of nlp (bob), oldest first: each
    differs from the others in the field a filter reads."""
    second_project = Project.objects.create(tenant=world.vision, slug="segmentation", name="Seg")
    template = ExperimentTemplate.objects.create(tenant=world.vision, name="pytorch-1node")
    made = {
        "resnet-baseline": submit(world),
        "resnet-wide": submit(world, name="resnet-wide", code_commit=OTHER_COMMIT),
        "unet-seg": submit(
            world, user=world.researcher_a2, name="unet-seg", project="segmentation"
        ),
        "vit-large": submit(world, user=world.researcher_a2, name="vit-large"),
        "megatron-pretrain": submit(
            world,
            user=world.researcher_b,
            name="megatron-pretrain",
            tenant="nlp",
            project="llm",
            image=world.nlp_only_image.reference,
        ),
    }
    made["from-template"] = submit(world, name="from-template")
    Experiment.objects.filter(pk=made["from-template"].experiment_id).update(template=template)
    return {"runs": made, "project": second_project, "template": template}


# --- the experiments list -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "expected"),
    [
        (
            "researcher_a",
            ["from-template", "vit-large", "unet-seg", "resnet-wide", "resnet-baseline"],
        ),
        ("researcher_b", ["megatron-pretrain"]),
        (
            "platform_admin",
            [
                "from-template",
                "megatron-pretrain",
                "vit-large",
                "unet-seg",
                "resnet-wide",
                "resnet-baseline",
            ],
        ),
    ],
)
def test_the_experiments_list_shows_the_experiments_of_the_users_tenants_newest_first(
    client, world, catalog, persona, expected
):
    client.force_login(getattr(world, persona))

    assert listed(client) == expected


def test_each_filter_narrows_the_list_to_exactly_the_matching_experiments(client, world, catalog):
    client.force_login(world.researcher_a)

    assert listed(client, name="RESNET") == ["resnet-wide", "resnet-baseline"]
    assert listed(client, owner="Arthur") == ["vit-large", "unet-seg"]
    assert listed(client, mine="1") == ["from-template", "resnet-wide", "resnet-baseline"]
    assert listed(client, project=catalog["project"].pk) == ["unet-seg"]
    assert listed(client, commit=OTHER_COMMIT[:7]) == ["resnet-wide"]
    assert listed(client, commit=COMMIT[:12], mine="1") == ["from-template", "resnet-baseline"]
    assert listed(client, template=catalog["template"].pk) == ["from-template"]
    assert listed(client, image=DIGEST_A[7:20]) == [
        "from-template",
        "vit-large",
        "unet-seg",
        "resnet-wide",
        "resnet-baseline",
    ]
    assert listed(client, image="megatron") == []  # nlp's image, nlp's experiment: not alice's
    assert listed(client, name="resnet", owner="arthur") == []


def test_a_filter_that_is_no_id_says_so_and_filters_nothing(client, world, catalog):
    client.force_login(world.researcher_b)

    response = client.get(reverse("jobs:experiment_list"), {"project": "x1", "template": "²"})

    assert [row.experiment.name for row in response.context["rows"]] == ["megatron-pretrain"]
    content = response.content.decode()
    assert "There is no such project; showing every project." in content
    assert "There is no such template; showing every template." in content


def test_another_tenants_project_as_a_filter_shows_nothing(client, world, catalog):
    client.force_login(world.researcher_b)

    assert listed(client, project=catalog["project"].pk) == []


def test_a_row_shows_owner_project_image_commit_template_runs_and_the_last_run(
    client, world, catalog
):
    baseline = catalog["runs"]["resnet-baseline"]
    again = Run.objects.create(
        experiment=baseline.experiment,
        tenant=baseline.tenant,
        flavor=baseline.flavor,
        gpus=2,
        submitted_by=world.researcher_a,
        state=RunState.FAILED,
    )
    client.force_login(world.researcher_a)

    response = client.get(reverse("jobs:experiment_list"), {"name": "resnet-baseline"})

    (row,) = response.context["rows"]
    assert (row.run_count, row.last_run_id, row.last_run_state_label) == (2, again.pk, "Failed")
    content = response.content.decode()
    assert f'<td class="mono" title="{world.image.reference}">{world.image.repository}<br>' in (
        content
    )
    assert f'<span class="muted">{DIGEST_A[:19]}…</span>' in content
    assert f'<td class="mono" title="{COMMIT}">{COMMIT[:10]}</td>' in content
    assert f'<a href="/runs/{again.pk}/">#{again.pk}</a> <span class="badge badge-failed">' in (
        content
    )


def test_nothing_to_show_says_why_and_what_next(client, world, catalog):
    client.force_login(world.finance)
    Run.objects.all().delete()
    Experiment.objects.all().delete()
    empty = client.get(reverse("jobs:experiment_list")).content.decode()
    client.force_login(world.researcher_a)
    no_match = client.get(reverse("jobs:experiment_list"), {"name": "nothing"}).content.decode()

    assert "<h2>No experiments yet</h2>" in empty
    assert "<h2>No experiments match this search</h2>" in no_match


def test_the_experiments_list_costs_the_same_queries_for_3_and_40_experiments(
    client, world, django_assert_num_queries
):
    client.force_login(world.researcher_a)
    for _ in range(3):
        submit(world)
    with django_assert_num_queries(EXPERIMENT_LIST_QUERIES):
        assert len(listed(client)) == 3
    for _ in range(37):
        submit(world, user=world.researcher_a2)
    with django_assert_num_queries(EXPERIMENT_LIST_QUERIES):
        assert len(listed(client, commit=COMMIT[:6])) == 25
    oldest = Experiment.objects.order_by("created_at", "id")[3]
    with django_assert_num_queries(EXPERIMENT_LIST_QUERIES):
        assert len(listed(client, before=oldest.pk)) == 3


# The session and its user, the navigation (roles, notifications, finance access), the
# readable tenants, the page with its run counts, the project and template choices.
EXPERIMENT_LIST_QUERIES = 8


# --- comparing by picking -------------------------------------------------------------------


def test_compare_mode_lists_the_tenants_experiments_with_a_link_to_the_diff(client, world, catalog):
    baseline = catalog["runs"]["resnet-baseline"].experiment
    wide = catalog["runs"]["resnet-wide"].experiment
    client.force_login(world.platform_admin)

    response = client.get(reverse("jobs:experiment_list"), {"compare": baseline.pk})

    names = [row.experiment.name for row in response.context["rows"]]
    assert names == ["from-template", "vit-large", "unet-seg", "resnet-wide", "resnet-baseline"]
    content = response.content.decode()
    assert f'href="/experiments/diff/?a={baseline.pk}&amp;b={wide.pk}">Compare' in content
    assert f'href="/experiments/diff/?a={baseline.pk}&amp;b={baseline.pk}"' not in content


def test_compare_mode_with_another_tenants_experiment_is_404(client, world, catalog):
    nlp = catalog["runs"]["megatron-pretrain"].experiment
    client.force_login(world.researcher_a)

    assert client.get(reverse("jobs:experiment_list"), {"compare": nlp.pk}).status_code == 404
    assert client.get(reverse("jobs:experiment_list"), {"compare": "x"}).status_code == 404


def test_the_picker_offers_the_tenants_other_experiments_most_recent_first(client, world, catalog):
    runs = catalog["runs"]
    client.force_login(world.researcher_a)

    response = client.get(
        reverse("jobs:experiment_detail", args=[runs["resnet-wide"].experiment_id])
    )

    choices = [
        (row.experiment.name, row.run_count, row.last_run_id)
        for row in response.context["compare_choices"]
    ]
    assert choices == [
        ("from-template", 1, runs["from-template"].pk),
        ("vit-large", 1, runs["vit-large"].pk),
        ("unet-seg", 1, runs["unet-seg"].pk),
        ("resnet-baseline", 1, runs["resnet-baseline"].pk),
    ]


def test_the_diff_of_two_picked_experiments_keeps_working_with_ids_and_404s_outsiders(
    client, world, catalog
):
    runs = catalog["runs"]
    a, b = runs["resnet-baseline"].experiment_id, runs["resnet-wide"].experiment_id
    diff = reverse("jobs:experiment_diff")
    client.force_login(world.researcher_a)
    assert client.get(diff, {"a": a, "b": b}).context["differing"] == 1
    client.force_login(world.researcher_b)
    assert client.get(diff, {"a": a, "b": b}).status_code == 404


# --- the run list ---------------------------------------------------------------------------


def run_ids(response) -> list[int]:
    return [run.pk for run in response.context["runs"]]


def test_mine_shows_only_the_users_own_runs_and_keeps_the_other_filters(client, world):
    alice_first = submit(world)
    arthur = submit(world, user=world.researcher_a2)
    alice_second = submit(world)
    Run.objects.filter(pk=alice_first.pk).update(state=RunState.CANCELLED)
    client.force_login(world.researcher_a)
    url = reverse("jobs:run_list")

    everyone = client.get(url)
    mine = client.get(url, {"mine": "1"})
    mine_queued = client.get(url, {"mine": "1", "state": "QUEUED"})

    assert run_ids(everyone) == [alice_second.pk, arthur.pk, alice_first.pk]
    assert run_ids(mine) == [alice_second.pk, alice_first.pk]
    assert run_ids(mine_queued) == [alice_second.pk]
    content = mine_queued.content.decode()
    assert '<a href="?mine=1&amp;state=QUEUED" aria-current="true">Mine</a>' in content
    assert '<a href="?state=QUEUED">Everyone\'s</a>' in content
    assert '<input type="hidden" name="mine" value="1">' in content


def test_mine_with_no_runs_says_so(client, world):
    submit(world, user=world.researcher_a2)
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_list"), {"mine": "1"}).content.decode()

    assert "<h2>You have no runs yet</h2>" in content


def with_attempts(world, run: Run, spans: list[tuple[datetime, datetime | None]]) -> None:
    """Attempts of ``run`` that held its GPUs over ``spans`` (None: still running)."""
    for number, (started, finished) in enumerate(spans, start=1):
        Attempt.objects.create(
            run=run,
            number=number,
            cluster=world.cluster,
            state=AttemptState.RUNNING if finished is None else AttemptState.FAILED,
            started_at=started,
            finished_at=finished,
        )


def test_duration_and_gpu_hours_of_known_runs(client, world):
    hour = timedelta(hours=1)
    with time_machine.travel(NOW - 5 * hour, tick=False):
        queued = submit(world)  # 2 GPUs
        running = submit(world, gpus_per_node=4)
        finished = submit(world, nodes=2, gpus_per_node=8)
        cancelled = submit(world)
    Run.objects.filter(pk=running.pk).update(state=RunState.RUNNING, started_at=NOW - 3 * hour)
    with_attempts(
        world, running, [(NOW - 3 * hour, NOW - 2 * hour), (NOW - timedelta(minutes=90), None)]
    )
    Run.objects.filter(pk=finished.pk).update(
        state=RunState.SUCCEEDED, started_at=NOW - 4 * hour, finished_at=NOW - hour
    )
    with_attempts(world, finished, [(NOW - 4 * hour, NOW - hour)])
    Run.objects.filter(pk=cancelled.pk).update(state=RunState.CANCELLED, finished_at=NOW - 4 * hour)
    client.force_login(world.researcher_a)

    with time_machine.travel(NOW, tick=False):
        response = client.get(reverse("jobs:run_list"))

    shown = {
        run.pk: (run.duration.kind, run.duration.text, run.gpu_hours)
        for run in response.context["runs"]
    }
    assert shown == {
        queued.pk: ("queued", "5 h 00 min", 0.0),
        running.pk: ("running", "3 h 00 min", 4 * 2.5),  # 4 GPUs, 1 h + 1.5 h
        finished.pk: ("ran", "3 h 00 min", 16 * 3.0),
        cancelled.pk: ("never ran", "1 h 00 min", 0.0),
    }
    content = response.content.decode()
    assert (
        f'<tr data-run="{running.pk}" data-state="RUNNING">' in content
        and '<td data-duration="running"><span class="nowrap">3 h 00 min</span> '
        '<span class="muted">running'
        in content
    )
    assert '<td class="num" data-gpu-hours>10.00</td>' in content
    assert '<td class="num" data-gpu-hours>48.00</td>' in content


def test_gpu_hours_of_a_run_are_what_the_monthly_ledger_counts(world):
    run = submit(world, gpus_per_node=4)
    started, finished = NOW - timedelta(minutes=100), NOW - timedelta(minutes=10)
    with_attempts(world, run, [(started, finished)])
    usage_record_attempt(attempt=run.attempts.get(), started=started, finished=finished)

    runs_usage([run], now=NOW)

    ledger = TenantMonthUsage.objects.get(tenant=world.vision, flavor=world.a100)
    assert run.gpu_hours == ledger.gpu_seconds / 3600 == 6.0


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ({"running": False, "terminal": False}, RunDuration("queued", 7200)),
        (
            {"running": False, "terminal": False, "started": -3600},
            RunDuration("queued again", 7200),
        ),
        ({"running": True, "terminal": False, "started": -3600}, RunDuration("running", 3600)),
        (
            {"running": False, "terminal": True, "started": -5400, "finished": -1800},
            RunDuration("ran", 3600),
        ),
        ({"running": False, "terminal": True, "finished": -3600}, RunDuration("never ran", 3600)),
        # A clock that went backwards shows no negative time.
        ({"running": True, "terminal": False, "started": 60}, RunDuration("running", 0)),
    ],
)
def test_run_duration(times, expected):
    def at(key):
        return None if key not in times else NOW + timedelta(seconds=times[key])

    assert (
        run_duration(
            submitted_at=NOW - timedelta(hours=2),
            started_at=at("started"),
            finished_at=at("finished"),
            running=times["running"],
            terminal=times["terminal"],
            now=NOW,
        )
        == expected
    )


def test_a_long_wait_reason_is_shown_whole(client, world):
    run = submit(world)
    message = ("Waiting for 16 GPUs of a100-80gb: " + "the tenant's guarantee is in use; " * 12)[
        :-1
    ]
    Run.objects.filter(pk=run.pk).update(wait_reason="QUOTA", wait_message=message)
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:run_list")).content.decode()

    assert f'<div class="wait-message">{escape(message)}</div>' in content


# --- the run list refreshing itself ---------------------------------------------------------


def test_the_first_page_polls_its_results_with_the_filters_and_deeper_pages_do_not(client, world):
    runs = [submit(world) for _ in range(27)]
    client.force_login(world.researcher_a)
    url = reverse("jobs:run_list")

    first = client.get(url, {"state": "QUEUED", "mine": "1"}).content.decode()
    deeper = client.get(url, {"before": runs[5].pk}).content.decode()

    assert (
        '<div id="run-results" hx-get="?state=QUEUED&amp;mine=1&amp;partial=rows" '
        'hx-trigger="every 5s" hx-swap="outerHTML" data-live-list>'
    ) in first
    assert '<div id="run-results">' in deeper


def test_the_partial_is_the_results_alone_never_cached_and_scoped(client, world):
    vision = submit(world)
    nlp = submit(world, user=world.researcher_b, tenant="nlp", project="llm")
    client.force_login(world.researcher_b)

    response = client.get(reverse("jobs:run_list"), {"partial": "rows", "state": "QUEUED"})

    content = response.content.decode()
    assert content.lstrip().startswith('<div id="run-results"')
    assert "<html" not in content
    assert run_ids(response) == [nlp.pk]
    assert f'data-run="{vision.pk}"' not in content
    assert "no-cache" in response["Cache-Control"] and "no-store" in response["Cache-Control"]
    client.logout()
    assert client.get(reverse("jobs:run_list"), {"partial": "rows"}).status_code == 302
