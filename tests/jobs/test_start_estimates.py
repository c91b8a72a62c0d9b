"""Start estimates end to end on PostgreSQL: the refresh task's service writes each queued
run's latest and expected start from the held runs' max runtimes and from history; the run
page, run list, submit preview, API and CLI show them; bad inputs give a reason, not a
number (issue 19)."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client
from django.urls import reverse

from clusters.models import Cluster, ClusterNode
from gantry_cli.run_status import run_status, start_estimate
from jobs.estimates import Start
from jobs.models import Attempt, AttemptState, Run, RunState, StartForecast
from jobs.selectors.estimates import StartPreview, estimate_inputs, run_start_estimate
from jobs.selectors.preview import admission_preview
from jobs.selectors.queue import admission_snapshot
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.estimates import estimates_refresh
from jobs.services.submission import run_submit
from jobs.services.templates import template_submit
from tenants.models import Quota
from tests.conftest import experiment_input
from tests.jobs.test_templates import make_template

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


# Runs that declare no simulated work: history predicts how long they take, as on a real
# cluster (one that declares it is predicted by its work: tests/portal/test_demo_clock.py).
NO_DECLARED_WORK: dict[str, str] = {}


def submit(world, *, user=None, minutes=120, **overrides) -> Run:
    user = user or world.researcher_a
    overrides.setdefault("env", NO_DECLARED_WORK)
    return run_submit(
        user=user,
        data=experiment_input(world, gpus_per_node=8, max_runtime_minutes=minutes, **overrides),
    )


def running(run: Run, *, since: datetime) -> None:
    """As the backend reports it: the run and its attempt run since ``since``."""
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING, started_at=since)
    Attempt.objects.filter(run=run).update(state=AttemptState.RUNNING, started_at=since)


def succeeded(run: Run, *, started: datetime, minutes: float) -> None:
    Run.objects.filter(pk=run.pk).update(
        state=RunState.SUCCEEDED,
        started_at=started,
        finished_at=started + timedelta(minutes=minutes),
    )


@pytest.fixture
def full_cluster(world):
    """sim-1's four A100 nodes, each held by a running 1x8 run since T0: vision's two of
    experiment "resnet-baseline" (max 120 min; two earlier runs of it took 40 and 44 min),
    nlp's two of "llm-pretrain" (max 60 min, no history). Both tenants use all 16 GPUs they
    are guaranteed."""
    with time_machine.travel(T0 - timedelta(days=1), tick=False):
        earlier = submit(world)
        succeeded(earlier, started=T0 - timedelta(days=1), minutes=40)
        again = run_submit(
            user=world.researcher_a,
            data=experiment_input(
                world, gpus_per_node=8, max_runtime_minutes=120, env=NO_DECLARED_WORK
            ),
        )
        succeeded(again, started=T0 - timedelta(hours=20), minutes=44)
    with time_machine.travel(T0, tick=False):
        vision = [submit(world) for _ in range(2)]
        nlp = [
            submit(
                world, user=world.researcher_b, minutes=60, tenant="nlp", project="llm",
                name="llm-pretrain",
            )
            for _ in range(2)
        ]  # fmt: skip
        admission_run_cycle(now=T0)
    for run in (*vision, *nlp):
        running(run, since=T0)
    return vision, nlp


def node_of(run: Run) -> str:
    return Attempt.objects.get(run=run).placement[0]


@pytest.mark.django_db
def test_refresh_writes_latest_and_expected_starts(world, full_cluster):
    vision, nlp = full_cluster
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        mine = submit(world)  # vision's third: waits for one of vision's two
        pair = submit(
            world, user=world.researcher_b, minutes=60, tenant="nlp", project="llm",
            name="llm-pretrain", nodes=2,
        )  # fmt: skip
        admission_run_cycle()
        summary = estimates_refresh()
    assert summary is not None
    assert (summary.queued, summary.with_bound, summary.changed) == (2, 2, 2)

    mine.refresh_from_db()
    # At the latest when vision's runs use their 120 minutes; as expected, when they take
    # what this experiment took before: the median of 40 and 44 minutes.
    assert mine.start_full_limits_at == T0 + timedelta(minutes=120)
    assert mine.start_expected_at == T0 + timedelta(minutes=42)
    assert mine.start_note == ""
    assert mine.start_estimated_at == T0 + timedelta(minutes=1)
    first = min(vision, key=lambda run: node_of(run))
    assert mine.start_nodes == ["sim-1", node_of(first)]
    assert mine.start_behind == [first.pk]

    pair.refresh_from_db()
    # nlp's gang needs 16 GPUs, all nlp is guaranteed: it waits for nlp's runs, which have
    # no history (expected = latest). By then vision's second run should have left its node
    # too, so the gang takes the first two of those three nodes by name.
    assert pair.start_full_limits_at == pair.start_expected_at == T0 + timedelta(minutes=60)
    second = max(vision, key=lambda run: node_of(run))
    by_node = {node_of(run): run.pk for run in (second, *nlp)}
    chosen = sorted(by_node)[:2]
    assert pair.start_nodes == ["sim-1", *chosen]
    assert sorted(pair.start_behind) == sorted(by_node[name] for name in chosen)

    # Nothing changed: nothing is written again.
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        assert estimates_refresh(force=True).changed == 0
    assert StartForecast.objects.count() == 2  # one per flavor


@pytest.mark.django_db
def test_pages_api_and_cli_show_the_estimate_and_name_only_the_viewers_runs(world, full_cluster):
    vision, nlp = full_cluster
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        mine = submit(world)
        admission_run_cycle()
        estimates_refresh()
        first = min(vision, key=lambda run: node_of(run))
        client = Client()
        client.force_login(world.researcher_a)
        page = client.get(reverse("jobs:run_detail", args=[mine.pk])).content.decode()
        assert (
            "Should start at about 12:42; about 14:00 if every run ahead uses its full time "
            "limit (estimates of 12:01; a run let in first can move them); behind run "
            f"{first.pk}; {node_of(first)} on sim-1 should free up then"
        ) in page
        assert (
            "The start time if every run ahead uses its full time limit is an estimate, not a "
            "promise: no a100-80gb run has started with one in the last 7 days."
        ) in page
        listing = client.get(reverse("jobs:run_list")).content.decode()
        assert "Starts about 12:42; about 14:00 if every run ahead uses its full time limit" in (
            listing
        )

        api = client.get(reverse("api:run-detail", args=[mine.pk])).json()
        assert api["start_full_limits_at"] == "2026-03-10T14:00:00Z"
        assert api["start_expected_at"] == "2026-03-10T12:42:00Z"
        assert api["start_note"] == ""
        assert api["start_record"] == {
            "flavor": "a100-80gb",
            "days": 7,
            "started": 0,
            "met": 0,
            "worst_miss_s": None,
            "last_met_at": None,
        }
        schema = client.get(reverse("api-schema")).content.decode()
        assert "start_expected_at" in schema and "start_full_limits_at" in schema

        # The CLI prints times in the local zone of the machine it runs on.
        local = datetime.fromisoformat(api["start_expected_at"]).astimezone()
        latest = datetime.fromisoformat(api["start_full_limits_at"]).astimezone()
        expected_text = (
            f"starts about {local:%Y-%m-%d %H:%M:%S}; about {latest:%Y-%m-%d %H:%M:%S} if every "
            "run ahead uses its full time limit (an estimate, not a promise: no a100-80gb run "
            "has started with one in the last 7 days)"
        )
        assert start_estimate(api) == expected_text
        assert run_status(api).endswith(f"; {expected_text})")

    # Runs of other tenants it waits behind are counted, never named (issue 21.3).
    mine.refresh_from_db()
    estimate = run_start_estimate(run=mine)
    assert estimate is not None and estimate.behind == (first.pk,)
    Run.objects.filter(pk=mine.pk).update(start_behind=[first.pk, nlp[0].pk])
    mine.refresh_from_db()
    estimate = run_start_estimate(run=mine)
    assert (estimate.behind, estimate.behind_elsewhere) == ((first.pk,), 1)


@pytest.mark.django_db
def test_submit_preview_says_when_a_run_would_start(world, full_cluster):
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        estimates_refresh()
        preview = admission_preview(
            user=world.researcher_a, tenant="vision", flavor="a100-80gb", nodes=1, gpus_per_node=8
        )
        assert preview.verdict == "wait"
        assert preview.start == (
            "would start at about 12:42; about 14:00 if every run ahead uses its full time limit "
            "(estimates of 12:01)"
        )
        client = Client()
        client.force_login(world.researcher_a)
        panel = client.get(
            reverse("jobs:run_preview"),
            {
                "tenant": "vision", "project": "detection", "image": world.image.reference,
                "command": "python train.py", "flavor": "a100-80gb", "nodes": 1,
                "gpus_per_node": 8, "priority": 50, "max_runtime_minutes": 60,
                "max_restarts": 0,
            },
        ).content.decode()  # fmt: skip
        assert (
            "Would start at about 12:42; about 14:00 if every run ahead uses its full time limit "
            "(estimates of 12:01)."
        ) in panel


@pytest.mark.django_db
def test_a_stale_inventory_gives_a_reason_not_a_number(world, full_cluster):
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        mine = submit(world)
        Cluster.objects.filter(pk=world.cluster.pk).update(
            inventory_at=T0 - timedelta(minutes=5), inventory_valid_until=T0 - timedelta(minutes=4)
        )
        estimates_refresh()
    mine.refresh_from_db()
    nodes = sorted(ClusterNode.objects.filter(flavor=world.a100).values_list("name", flat=True))
    assert (mine.start_full_limits_at, mine.start_expected_at) == (None, None)
    assert (
        mine.start_note
        == (
            f"no bound: {nodes[0]} (not seen by sim-1's inventory since 2026-03-10 11:55:00 UTC), "
            f"{nodes[1]} (not seen by sim-1's inventory since 2026-03-10 11:55:00 UTC), "
            f"{nodes[2]} (not seen by sim-1's inventory since 2026-03-10 11:55:00 UTC) and 1 more "
            "take no work"
        )[:300]
    )


@pytest.mark.django_db
def test_a_vanished_cluster_and_a_hard_budget_give_reasons(world, full_cluster):
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        mine = submit(world)
        h100 = submit(world, flavor="h100-80gb")  # starts: the H100 nodes are free
        Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
        estimates_refresh()
    mine.refresh_from_db()
    h100.refresh_from_db()
    assert mine.start_full_limits_at is None
    assert mine.start_note == "no enabled cluster has a100-80gb GPUs"
    assert h100.start_note == "no enabled cluster has h100-80gb GPUs"

    client = Client()
    client.force_login(world.researcher_a)
    page = client.get(reverse("jobs:run_detail", args=[mine.pk]))
    assert page.status_code == 200
    assert "No start estimate: no enabled cluster has a100-80gb GPUs" in page.content.decode()


@pytest.mark.django_db
def test_an_admitted_run_drops_its_estimate(world, full_cluster):
    vision, _ = full_cluster
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        mine = submit(world)
        estimates_refresh()
    Run.objects.filter(pk=vision[0].pk).update(state=RunState.SUCCEEDED)
    with time_machine.travel(T0 + timedelta(minutes=2), tick=False):
        admission_run_cycle()
    mine.refresh_from_db()
    assert mine.state == RunState.ADMITTED
    assert (mine.start_full_limits_at, mine.start_expected_at, mine.start_behind) == (
        None,
        None,
        [],
    )


@pytest.mark.django_db
def test_a_templates_runs_predict_a_new_experiment_of_it(world):
    template = make_template(world)
    values = {"tenant": "vision", "project": "detection", "max_runtime_minutes": 120}
    with time_machine.travel(T0 - timedelta(hours=2), tick=False):
        done = template_submit(
            user=world.researcher_a, template=template, values={**values, "name": "sweep-1"}
        )
        succeeded(done, started=T0 - timedelta(hours=2), minutes=10)
    with time_machine.travel(T0, tick=False):
        waiting = template_submit(
            user=world.researcher_a, template=template, values={**values, "name": "sweep-2"}
        )
        plain = submit(world, name="sweep-3")
        snapshot, _ = admission_snapshot(now=T0)
        inputs = estimate_inputs(snapshot=snapshot, now=T0)
    assert waiting.experiment.template == template
    assert plain.experiment.template is None
    # sweep-2 has no runs of its own: its template's one run (10 minutes) predicts it;
    # sweep-3 has no template and its tenant fewer than three runs of its size: max runtime.
    assert inputs.expected_runtimes[waiting.pk] == 600.0
    assert inputs.expected_runtimes[plain.pk] == inputs.max_runtimes[plain.pk] == 7200.0


@pytest.mark.django_db
def test_refreshes_are_spaced_by_what_the_last_one_cost(world, settings):
    settings.GANTRY_ESTIMATE_COST_FACTOR = 20
    with time_machine.travel(T0, tick=False):
        assert estimates_refresh() is not None
    StartForecast.objects.update(duration_s=3.0)  # as if it had taken 3 s: next after 60 s
    with time_machine.travel(T0 + timedelta(seconds=59), tick=False):
        assert estimates_refresh() is None
        assert estimates_refresh(force=True) is not None
    StartForecast.objects.update(computed_at=T0, duration_s=3.0)
    with time_machine.travel(T0 + timedelta(seconds=60), tick=False):
        assert estimates_refresh() is not None


@pytest.mark.django_db
def test_a_run_that_declares_its_simulated_work_is_expected_to_take_its_wall_time(world):
    # Given sim-1 at 1000x and a history that says runs of this shape take 40 minutes.
    with time_machine.travel(T0 - timedelta(days=1), tick=False):
        for _ in range(3):
            succeeded(submit(world), started=T0 - timedelta(days=1), minutes=40)
    with time_machine.travel(T0, tick=False):
        # When one run declares 2 simulated hours of work and another declares none.
        declared = submit(world, env={"GANTRY_SIM_DURATION_S": "7200"}, name="declared")
        undeclared = submit(world, name="undeclared")
        snapshot, _ = admission_snapshot(now=T0)
        inputs = estimate_inputs(snapshot=snapshot, now=T0)
    # Then the declared one is expected to take its work's wall time, start-up included
    # ((30 + 7200) / 1000 s), never more than its limit; the other what history says.
    assert inputs.expected_runtimes[declared.pk] == 7.23
    assert inputs.expected_runtimes[undeclared.pk] == 40 * 60.0
    assert inputs.max_runtimes[declared.pk] == 120 * 60.0


@pytest.mark.django_db
def test_the_submit_preview_never_shows_a_start_in_the_past(world):
    # Given vision's hard H100 budget of 1 GPU-hour (it may borrow 8 more), one of its H100
    # runs running since T0, and the forecast of T0 + 1 min, when the other H100 node was free
    # for a second run of vision's.
    Quota.objects.filter(tenant=world.vision, flavor=world.h100).update(
        monthly_gpu_hour_budget=1, budget_mode=Quota.BudgetMode.HARD, borrow_limit_gpus=8
    )
    with time_machine.travel(T0, tick=False):
        first = submit(world, flavor="h100-80gb")
        admission_run_cycle(now=T0)
    running(first, since=T0)
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        estimates_refresh()

    def preview():
        return admission_preview(
            user=world.researcher_a, tenant="vision", flavor="h100-80gb", nodes=1, gpus_per_node=8
        )

    # When the budget runs out (8 GPUs for 7.5 minutes) before the next refresh, the preview
    # says why the run would wait, not the forecast's start of T0 + 1 min, now past.
    with time_machine.travel(T0 + timedelta(minutes=8), tick=False):
        shown = preview()
    assert (shown.verdict, shown.start) == (
        "wait",
        "no start estimate: the tenant's hard GPU-hour budget for the month is spent; it "
        "starts when the budget resets or is raised",
    )

    # And a start that a stored estimate put before now reads as now.
    StartForecast.objects.update(computed_at=T0 - timedelta(minutes=5))
    estimate = StartPreview(
        expected=Start(run_id=-1, at=(T0 - timedelta(minutes=3)).timestamp()),
        full_limits=Start(run_id=-1, at=(T0 - timedelta(minutes=2)).timestamp()),
        computed_at=T0 - timedelta(minutes=5),
    )
    assert estimate.summary(now=T0) == "would start at about 12:00 (estimates of 11:55)"
