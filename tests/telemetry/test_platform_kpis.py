"""The platform KPI page: queue and startup time, success rate, failure reasons,
checkpoint recovery, goodput and cluster allocation over a range of days.

Runs, attempts and accounting are written with the ORM, so every number is known exactly.
The range is a day or a month of 2025, long past, so "now" never clips it.
"""

import json
import re
from datetime import UTC, date, datetime, time, timedelta
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import strip_tags

from clusters.models import Cluster, ClusterFlavor
from jobs.models import Attempt, AttemptState, Checkpoint, Experiment, Run, RunState
from jobs.services.submission import run_submit
from telemetry import diagnosis
from telemetry.accounting import WASTE
from telemetry.kpis import metrics
from telemetry.kpis.forms import EMPTY_RANGE, INVERTED_RANGE, KPI_MAX_RANGE_DAYS
from telemetry.kpis.metrics import Distribution, Ratio
from telemetry.models import AttemptAccounting, GpuMinute, StepWindow
from tests.conftest import experiment_input

MARCH = {"from": "2025-03-01", "to": "2025-03-31"}
T0 = datetime(2025, 3, 10, tzinfo=UTC)  # inside MARCH
BEFORE = datetime(2025, 2, 20, tzinfo=UTC)  # outside MARCH
PLOTLY = "/static/vendor/plotly/plotly-4.1.1.min.js"
KPIS_JS = "/static/gantry/kpis.js"
# Tables that hold KPI data: a page that rejected its range must not have read them.
DATA_TABLES = ("jobs_attempt", "jobs_run", "telemetry_", "jobs_clusterflavor")


# --- building rows -----------------------------------------------------------------------------


@pytest.fixture
def experiments(world) -> dict[str, Experiment]:
    """One experiment per tenant (its submission leaves a queued run that counts nowhere)."""
    vision = run_submit(user=world.researcher_a, data=experiment_input(world))
    nlp = run_submit(
        user=world.researcher_b,
        data=experiment_input(world, tenant="nlp", project="llm", name="llm"),
    )
    return {"vision": vision.experiment, "nlp": nlp.experiment}


def make_run(
    world,
    experiments,
    *,
    tenant: str = "vision",
    flavor: str = "a100",
    gpus: int = 2,
    state: str = RunState.SUCCEEDED,
    submitted_at: datetime = T0,
    finished_at: datetime | None = None,
    cluster: Cluster | None = None,
) -> Run:
    experiment = experiments[tenant]
    run = Run.objects.create(
        experiment=experiment,
        tenant=experiment.tenant,
        flavor=getattr(world, flavor),
        gpus=gpus,
        submitted_by=experiment.owner,
        state=state,
        cluster=cluster or world.cluster,
        finished_at=finished_at,
    )
    Run.objects.filter(pk=run.pk).update(submitted_at=submitted_at)  # auto_now_add
    run.refresh_from_db()
    return run


def make_attempt(
    world,
    run: Run,
    *,
    number: int = 1,
    state: str = AttemptState.SUCCEEDED,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    created_at: datetime | None = None,
    cluster: Cluster | None = None,
    **fields,
) -> Attempt:
    attempt = Attempt.objects.create(
        run=run,
        number=number,
        cluster=cluster or world.cluster,
        state=state,
        started_at=started_at,
        finished_at=finished_at,
        **fields,
    )
    if created_at is not None:
        Attempt.objects.filter(pk=attempt.pk).update(created_at=created_at)  # auto_now_add
    return attempt


def account(attempt: Attempt, *, allocated: int, effective: int, startup: int = 0):
    """Accounting with ``startup`` GPU-seconds of startup and the rest of the waste idle."""
    waste = dict.fromkeys(WASTE, 0)
    waste.update(startup=startup, idle=allocated - effective - startup)
    return AttemptAccounting.objects.create(
        attempt=attempt,
        allocated_gpu_s=allocated,
        effective_gpu_s=effective,
        **{f"{name}_gpu_s": value for name, value in waste.items()},
        activity_weighted_gpu_s=0.0,
        computed_at=attempt.finished_at,
    )


def step_window(attempt: Attempt, *, seq: int = 1, step: int | None = None) -> StepWindow:
    return StepWindow.objects.create(
        attempt=attempt,
        source="rank0",
        seq=seq,
        start=attempt.started_at,
        end=attempt.started_at + timedelta(minutes=1),
        steps=10,
        step_time_s=1.0,
        step=step,
    )


def queued_attempt(world, experiments, queue_s: float, *, tenant="vision", flavor="a100"):
    """A run's first attempt that waited ``queue_s`` seconds and started at T0."""
    run = make_run(
        world,
        experiments,
        tenant=tenant,
        flavor=flavor,
        state=RunState.RUNNING,
        submitted_at=T0 - timedelta(seconds=queue_s),
    )
    return make_attempt(world, run, state=AttemptState.RUNNING, started_at=T0)


# --- reading pages -----------------------------------------------------------------------------


def kpis_url(**params) -> str:
    url = reverse("telemetry:platform_kpis")
    return f"{url}?{urlencode(params)}" if params else url


def get(client, user, **params):
    client.force_login(user)
    return client.get(kpis_url(**params))


def page(client, user, **params) -> str:
    response = get(client, user, **params)
    assert response.status_code == 200
    return response.content.decode()


def text(html: str) -> str:
    return " ".join(strip_tags(html).split())


def kpi(content: str, name: str) -> str:
    match = re.search(rf'<(td|dd)[^>]* data-kpi="{name}">(.*?)</\1>', content, re.S)
    assert match, name
    return text(match.group(2))


def definition(content: str, name: str) -> str:
    match = re.search(
        r'<td class="help"><details class="definition"><summary>How is this measured</summary>'
        rf'<p data-definition="{name}">(.*?)</p></details></td>',
        content,
        re.S,
    )
    assert match, name
    return text(match.group(1))


def cells(content: str, opening: str) -> list[str]:
    """The texts of the cells of the table row that starts with ``opening``."""
    match = re.search(re.escape(opening) + r"(.*?)</tr>", content, re.S)
    assert match, opening
    return [text(cell) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", match.group(1), re.S)]


def chart_payload(content: str, element_id: str) -> dict:
    match = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>', content, re.S
    )
    assert match, element_id
    return json.loads(match.group(1))


def errors(content: str) -> list[str]:
    block = re.search(r"<div [^>]*data-errors>(.*?)</div>", content, re.S)
    assert block, "no errors shown"
    return [text(item) for item in re.findall(r"<li>(.*?)</li>", block.group(1), re.S)]


# --- the pure arithmetic -------------------------------------------------------------------------


def test_percentiles_are_by_nearest_rank():
    values = [900, 60, 300, 120]  # any order

    assert metrics.percentile(values, 50) == 120  # rank ⌈0.5 · 4⌉ = 2
    assert metrics.percentile(values, 95) == 900  # rank ⌈0.95 · 4⌉ = 4
    assert metrics.percentile(values, 25) == 60
    assert metrics.percentile(values, 26) == 120
    assert metrics.percentile(values, 100) == 900
    assert metrics.distribution(values) == Distribution(count=4, p50=120, p95=900)


def test_percentile_ranks_are_exact_where_floats_are_not():
    # 0.95 * 20 is 18.999… in binary floating point; the rank must be 19, not 18 or 20.
    values = list(range(1, 21))

    assert metrics.percentile(values, 95) == 19
    assert metrics.percentile(list(range(1, 101)), 95) == 95
    assert metrics.percentile(list(range(1, 101)), 50) == 50


def test_percentiles_of_one_value_and_of_none():
    assert metrics.distribution([42.5]) == Distribution(count=1, p50=42.5, p95=42.5)
    assert metrics.distribution([]) == Distribution(count=0, p50=None, p95=None)
    assert metrics.percentile([], 50) is None


@pytest.mark.parametrize("percent", [0, 101, -5])
def test_percentile_rejects_percents_outside_1_to_100(percent):
    with pytest.raises(ValueError, match="percent must be 1–100"):
        metrics.percentile([1, 2, 3], percent)


def test_ratios_add_and_read_as_percent():
    assert Ratio(part=2, whole=3).percent_text == "66.7 %"
    assert Ratio(part=1, whole=2) + Ratio(part=1, whole=2) == Ratio(part=2, whole=4)
    assert Ratio().percent is None
    assert Ratio().percent_text == "—"


def test_spans_across_a_dst_change_count_real_seconds():
    berlin = ZoneInfo("Europe/Berlin")
    since = datetime(2025, 3, 30, tzinfo=berlin)  # clocks go forward at 02:00
    until = datetime(2025, 3, 31, tzinfo=berlin)

    assert metrics.span_seconds(since, until) == 23 * 3600
    assert metrics.span_seconds(since, datetime(2025, 3, 30, 1, tzinfo=UTC)) == 2 * 3600
    assert metrics.span_seconds(until, since) == 0


def test_the_definitions_fold_away_behind_how_is_this_measured(client, world):
    content = page(client, world.platform_admin, **MARCH)

    folded = re.findall(
        r'<details class="definition"( open)?><summary>How is this measured</summary>'
        r'<p data-definition="([a-z]+)">',
        content,
    )
    assert folded == [
        ("", name)
        for name in ("queue", "startup", "success", "failures", "recovery", "goodput", "allocation")
    ]


# --- the KPIs, exactly ---------------------------------------------------------------------------


def test_queue_time_p50_and_p95_by_nearest_rank(client, world, experiments):
    for seconds in (60, 120, 900):
        queued_attempt(world, experiments, seconds)
    # A later attempt waited from its creation at requeue, not from the run's submission.
    requeued = make_run(world, experiments, state=RunState.RUNNING, submitted_at=BEFORE)
    make_attempt(
        world,
        requeued,
        number=2,
        state=AttemptState.RUNNING,
        created_at=T0 - timedelta(seconds=300),
        started_at=T0,
    )
    # Not counted: an attempt that started before the range, one still waiting.
    make_attempt(
        world,
        make_run(world, experiments, submitted_at=BEFORE - timedelta(hours=1)),
        started_at=BEFORE,
        finished_at=BEFORE + timedelta(hours=1),
    )
    make_attempt(world, make_run(world, experiments, state=RunState.PENDING))

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "queue") == "p50 2 min 00 s · p95 15 min 00 s (4 attempts)"
    assert cells(content, '<tr data-tenant="vision">')[:4] == [
        "vision",
        "4",
        "2 min 00 s",
        "15 min 00 s",
    ]
    assert definition(content, "queue") == (
        "Wall time from submission to start of the attempts that started in the range. A run's "
        "first attempt waits from the run's submission, a later attempt (after a preemption, or "
        "a failure with restarts left) from its creation at requeue. Attempts still waiting are "
        "not counted until they start. p50 and p95 by nearest rank: the ⌈p × n⌉-th smallest of "
        "the n times, always a time some attempt really waited."
    )
    chart = chart_payload(content, "queue-chart-data")
    assert chart["categories"] == ["vision"]
    assert [(trace["name"], trace["values"]) for trace in chart["traces"]] == [
        ("p50 (median)", [2.0]),
        ("p95", [15.0]),
    ]
    assert PLOTLY in content and KPIS_JS in content


def test_startup_time_is_startup_gpu_seconds_per_gpu(client, world, experiments):
    def ended(gpus: int, startup: int):
        run = make_run(world, experiments, gpus=gpus, finished_at=T0 + timedelta(hours=1))
        attempt = make_attempt(world, run, started_at=T0, finished_at=T0 + timedelta(hours=1))
        account(attempt, allocated=gpus * 3600, effective=gpus * 3000, startup=startup)
        return attempt

    step_window(ended(2, 240))  # 120 s
    GpuMinute.objects.create(attempt=ended(4, 2400), host="n1", gpu="0", minute=T0, activity=0.5)
    # No step window and no active minute: no measurable startup, left out.
    idle = ended(8, 0)
    GpuMinute.objects.create(attempt=idle, host="n1", gpu="0", minute=T0, activity=0.01)

    content = page(client, world.finance, **MARCH)

    assert kpi(content, "startup") == "p50 2 min 00 s · p95 10 min 00 s (2 attempts)"
    assert definition(content, "startup").startswith(
        "Wall time from GPU allocation to the first training step window the SDK reported, or "
        "else the first GPU minute at or above 5 % activity: the attempt's startup GPU-seconds "
        "÷ its GPUs."
    )


def test_success_rate_leaves_out_cancelled_runs(client, world, experiments):
    inside = T0 + timedelta(hours=2)
    make_run(world, experiments, state=RunState.SUCCEEDED, finished_at=inside)
    make_run(world, experiments, tenant="nlp", state=RunState.SUCCEEDED, finished_at=inside)
    make_run(world, experiments, state=RunState.FAILED, finished_at=inside)
    make_run(world, experiments, state=RunState.CANCELLED, finished_at=inside)
    make_run(world, experiments, state=RunState.FAILED, finished_at=BEFORE)  # outside
    make_run(world, experiments, state=RunState.PREEMPTED)  # not ended

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "success") == "66.7 % (2 of 3 runs) 1 cancelled, not rated"
    assert cells(content, '<tr data-tenant="vision">')[6:9] == ["1 of 2", "50.0 %", "1"]
    assert cells(content, '<tr data-tenant="nlp">')[6:9] == ["1 of 1", "100.0 %", "0"]
    assert definition(content, "success") == (
        "Runs that ended in the range: succeeded ÷ (succeeded + failed). A run fails when its "
        "last attempt fails or is lost with no restarts left; a preempted or requeued run has "
        "not ended. Cancelled runs are left out — a person or the idle-GPU policy stopped them, "
        "the platform did not fail them — and are counted beside the rate."
    )


def test_a_tie_of_failure_reasons_names_both_never_mostly_one(client, world, experiments):
    run = make_run(world, experiments, state=RunState.FAILED, finished_at=T0)
    for number, (state, reason) in enumerate(
        [(AttemptState.FAILED, "OOM_GPU"), (AttemptState.PREEMPTED, "PREEMPTED")], start=1
    ):
        make_attempt(
            world,
            run,
            number=number,
            state=state,
            started_at=T0 - timedelta(hours=1),
            finished_at=T0,
            failure_reason=reason,
        )

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "failures") == "2 attempts GPU out of memory and Preempted equally"


def test_failure_reasons_count_unsuccessful_attempts_with_the_taxonomy(client, world, experiments):
    run = make_run(world, experiments, state=RunState.FAILED, finished_at=T0)

    def ended(state: str, reason: str, finished_at=T0):
        make_attempt(
            world,
            run,
            number=Attempt.objects.filter(run=run).count() + 1,
            state=state,
            started_at=T0 - timedelta(hours=1),
            finished_at=finished_at,
            failure_reason=reason,
        )

    ended(AttemptState.FAILED, "OOM_GPU")
    ended(AttemptState.FAILED, "OOM_GPU")
    ended(AttemptState.PREEMPTED, "PREEMPTED")
    ended(AttemptState.FAILED, "")  # no reason recorded: Unknown
    ended(AttemptState.SUCCEEDED, "")  # not a failure
    ended(AttemptState.FAILED, "NCCL", finished_at=BEFORE)  # outside

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "failures") == "4 attempts mostly GPU out of memory"
    assert cells(content, '<tr data-reason="OOM_GPU">') == [
        "GPU out of memory OOM_GPU",
        "2",
        "50.0 %",
        diagnosis.NEXT_STEP[diagnosis.FailureReason.OOM_GPU],
    ]
    assert cells(content, '<tr data-reason="PREEMPTED">')[:3] == [
        "Preempted PREEMPTED",
        "1",
        "25.0 %",
    ]
    assert cells(content, '<tr data-reason="UNKNOWN">')[:3] == ["Unknown UNKNOWN", "1", "25.0 %"]
    assert 'data-reason="NCCL"' not in content
    order = re.findall(r'<tr data-reason="(\w+)">', content)
    assert order == ["OOM_GPU", "PREEMPTED", "UNKNOWN"]  # most first, then taxonomy order


def test_checkpoint_recovery_counts_resumed_attempts_that_progressed(client, world, experiments):
    def resumed(last_step: int | None, finished_at=T0, state=AttemptState.FAILED, saved=None):
        run = make_run(world, experiments, finished_at=finished_at)
        first = make_attempt(
            world,
            run,
            state=AttemptState.PREEMPTED,
            started_at=finished_at - timedelta(hours=3),
            finished_at=finished_at - timedelta(hours=2),
        )
        checkpoint = Checkpoint.objects.create(
            run=run, attempt=first, step=1000, uri="s3://ckpt/1000", saved_at=first.finished_at
        )
        second = make_attempt(
            world,
            run,
            number=2,
            started_at=finished_at - timedelta(hours=1),
            finished_at=finished_at,
            resumed_from=checkpoint,
            state=state,
        )
        if last_step is not None:
            step_window(second, seq=1, step=last_step - 10)
            step_window(second, seq=2, step=last_step)
        if saved is not None:
            Checkpoint.objects.create(
                run=run, attempt=second, step=saved, uri=f"s3://ckpt/{saved}", saved_at=finished_at
            )

    resumed(1500)  # failed again, but only after getting past step 1000: recovered
    resumed(1000)  # failed again at the restored step: not recovered
    resumed(None, state=AttemptState.PREEMPTED)  # preempted before any step: not recovered
    resumed(None, state=AttemptState.SUCCEEDED)  # succeeded, no step reported: recovered
    resumed(None, saved=1300)  # reported no step window, saved a checkpoint past it: recovered
    resumed(5000, finished_at=BEFORE)  # outside

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "recovery") == "60.0 % (3 of 5 resumed attempts)"
    assert (kpi(content, "resumed"), kpi(content, "recovered")) == ("5", "3")
    assert kpi(content, "recovery-rate") == "60.0 %"


def test_a_resumed_attempt_that_failed_without_a_step_did_not_recover(client, world, experiments):
    run = make_run(world, experiments, finished_at=T0)
    first = make_attempt(
        world, run, state=AttemptState.FAILED, started_at=T0 - timedelta(hours=2), finished_at=T0
    )
    checkpoint = Checkpoint.objects.create(
        run=run, attempt=first, step=10, uri="s3://c", saved_at=T0 - timedelta(hours=1)
    )
    make_attempt(
        world,
        run,
        number=2,
        state=AttemptState.FAILED,
        started_at=T0,
        finished_at=T0,
        resumed_from=checkpoint,
    )

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "recovery") == "0.0 % (0 of 1 resumed attempt)"


def test_goodput_is_effective_over_allocated(client, world, experiments):
    def ended(tenant: str, allocated: int, effective: int, finished_at=T0):
        run = make_run(world, experiments, tenant=tenant, finished_at=finished_at)
        attempt = make_attempt(
            world, run, started_at=finished_at - timedelta(hours=1), finished_at=finished_at
        )
        account(attempt, allocated=allocated, effective=effective)

    ended("vision", 7200, 5400)
    ended("nlp", 3600, 2700)
    ended("nlp", 3600, 0, finished_at=BEFORE)  # outside

    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "goodput") == "75.0 % (2.25 of 3.00 GPU-hours)"
    assert cells(content, '<tr data-tenant="nlp">')[9] == "75.0 %"
    assert cells(content, '<tr data-flavor="a100-80gb">')[9] == "75.0 %"


def test_cluster_allocation_clips_attempts_to_the_range(client, world, experiments):
    day = T0  # 2025-03-10, 24 hours; on sim-1 a100: 32 GPUs, h100: 16 GPUs

    def ran(gpus: int, start_h: float, end_h: float, flavor="a100"):
        run = make_run(world, experiments, gpus=gpus, flavor=flavor)
        make_attempt(
            world,
            run,
            started_at=day + timedelta(hours=start_h),
            finished_at=day + timedelta(hours=end_h),
        )

    ran(8, -4, 8)  # 8 GPUs for 8 h inside
    ran(16, 10, 22)  # 16 GPUs for 12 h
    ran(16, -30, -2)  # the day before: nothing

    content = page(client, world.platform_admin, **{"from": "2025-03-10", "to": "2025-03-10"})

    assert cells(content, '<tr data-allocation="sim-1/a100-80gb">') == [
        "sim-1",
        "a100-80gb",
        "32",
        "256.00",
        "768.00",
        "33.3 %",
    ]
    assert cells(content, '<tr data-allocation="sim-1/h100-80gb">') == [
        "sim-1",
        "h100-80gb",
        "16",
        "0.00",
        "384.00",
        "0.0 %",
    ]
    assert kpi(content, "allocation") == "22.2 % (256.00 of 1152.00 GPU-hours)"
    chart = chart_payload(content, "allocation-chart-data")
    assert chart["categories"] == ["sim-1 · a100-80gb", "sim-1 · h100-80gb"]
    assert chart["traces"] == [{"name": "Allocated", "values": [33.3, 0.0]}]
    # A share's axis is 0 to 100 % whatever the bars: 33 % is a third of the width.
    assert chart["value_range"] == [0, 100]


def test_a_running_attempt_counts_up_to_now_and_the_range_ends_now(client, world, experiments):
    now = timezone.now()
    today = timezone.localdate(now)
    yesterday = today - timedelta(days=1)
    since = datetime.combine(yesterday, time.min, tzinfo=timezone.get_current_timezone())
    run = make_run(world, experiments, gpus=4, state=RunState.RUNNING, submitted_at=now)
    make_attempt(world, run, state=AttemptState.RUNNING, started_at=now - timedelta(hours=2))

    response = get(client, world.platform_admin, **{"from": str(yesterday), "to": str(today)})

    a100 = next(row for row in response.context["kpis"].allocation if row.flavor == "a100-80gb")
    assert a100.allocated_gpu_s == pytest.approx(4 * 2 * 3600, abs=4 * 60)
    assert a100.capacity_gpu_hours / 32 == pytest.approx(
        (now - since) / timedelta(hours=1), abs=0.1
    )
    assert "the range up to now" in response.content.decode()


def test_definitions_of_goodput_recovery_failures_and_allocation(client, world, experiments):
    content = page(client, world.platform_admin, **MARCH)

    assert definition(content, "failures") == (
        "Attempts that ended unsuccessfully in the range (failed, preempted, lost or cancelled), "
        "counted by the normalized reason of the failure taxonomy; the share is of those "
        "attempts. Per attempt, not per run: a run preempted twice and then successful counts "
        "two preemptions. An attempt without a known reason counts as Unknown."
    )
    assert definition(content, "recovery") == (
        "Attempts that resumed from a checkpoint and ended in the range: recovered when it got "
        "past the step of the checkpoint it restored (a step its SDK step windows reported, or "
        "a checkpoint it saved, beyond that step) or succeeded; not recovered when it failed, "
        "was preempted, lost or cancelled before getting past it. Rate = recovered ÷ resumed "
        "attempts."
    )
    assert definition(content, "goodput").startswith(
        "Σ effective ÷ Σ allocated GPU-seconds of the attempts that ended in the range with "
        "their accounting computed"
    )
    assert definition(content, "allocation").startswith(
        "Per cluster and flavor: allocated GPU-hours inside the range ÷ (capacity GPUs × the "
        "range's hours)"
    )
    assert "Capacity is the cluster's current inventory" in definition(content, "allocation")


def test_empty_range_explains_each_kpi(client, world, experiments):
    content = page(client, world.platform_admin, **MARCH)

    assert kpi(content, "queue") == "no attempt started in this range"
    assert kpi(content, "success") == "no finished runs in this range"
    assert kpi(content, "failures") == "no unsuccessful attempts in this range"
    assert kpi(content, "recovery") == "no resumed attempt ended in this range"
    assert kpi(content, "goodput") == "no accounted attempt ended in this range"
    assert "No attempt started and no run or accounted attempt ended in this range." in content
    assert "No attempt ended unsuccessfully in this range" in content
    # Capacity is there even when nothing ran.
    assert kpi(content, "allocation") == "0.0 % (0.00 of 35712.00 GPU-hours)"
    assert PLOTLY not in content  # no chart, no Plotly


# --- filters -----------------------------------------------------------------------------------


@pytest.fixture
def two_clusters(world, experiments):
    """On sim-1: a vision a100 run and an nlp h100 run; on slurm-1 (4 a100 GPUs): an nlp
    a100 run. Each waited differently and ran 6 hours on 2025-03-10."""
    slurm = Cluster.objects.create(name="slurm-1", backend=Cluster.Backend.SLURM)
    ClusterFlavor.objects.create(cluster=slurm, flavor=world.a100, nodes=1, gpus_per_node=4, gpus=4)
    finished = T0 + timedelta(hours=6)
    for tenant, flavor, cluster, queue_s, gpus in (
        ("vision", "a100", world.cluster, 60, 8),
        ("nlp", "h100", world.cluster, 600, 4),
        ("nlp", "a100", slurm, 1800, 2),
    ):
        run = make_run(
            world,
            experiments,
            tenant=tenant,
            flavor=flavor,
            gpus=gpus,
            submitted_at=T0 - timedelta(seconds=queue_s),
            finished_at=finished,
            cluster=cluster,
        )
        attempt = make_attempt(world, run, started_at=T0, finished_at=finished, cluster=cluster)
        account(attempt, allocated=gpus * 6 * 3600, effective=gpus * 3 * 3600)
    return slurm


DAY_10 = {"from": "2025-03-10", "to": "2025-03-10"}


def test_unfiltered_the_page_covers_every_tenant_flavor_and_cluster(client, world, two_clusters):
    content = page(client, world.platform_admin, **DAY_10)

    assert kpi(content, "queue") == "p50 10 min 00 s · p95 30 min 00 s (3 attempts)"
    assert kpi(content, "success") == "100.0 % (3 of 3 runs)"
    assert re.findall(r'<tr data-tenant="([\w-]+)">', content) == ["nlp", "vision"]
    assert re.findall(r'<tr data-flavor="([\w-]+)">', content) == ["a100-80gb", "h100-80gb"]
    assert re.findall(r'<tr data-allocation="([\w/-]+)">', content) == [
        "sim-1/a100-80gb",
        "sim-1/h100-80gb",
        "slurm-1/a100-80gb",
    ]
    # (8 + 4 + 2) GPUs for 6 h = 84 of (32 + 16 + 4) GPUs for 24 h = 1248 GPU-hours.
    assert kpi(content, "allocation") == "6.7 % (84.00 of 1248.00 GPU-hours)"


def test_the_tenant_filter_narrows_every_kpi_but_not_the_capacity(client, world, two_clusters):
    content = page(client, world.platform_admin, tenant="nlp", **DAY_10)

    assert kpi(content, "queue") == "p50 10 min 00 s · p95 30 min 00 s (2 attempts)"
    assert kpi(content, "success") == "100.0 % (2 of 2 runs)"
    assert kpi(content, "goodput") == "50.0 % (18.00 of 36.00 GPU-hours)"
    assert re.findall(r'<tr data-tenant="([\w-]+)">', content) == ["nlp"]
    assert kpi(content, "allocation") == "2.9 % (36.00 of 1248.00 GPU-hours)"
    assert '<option value="nlp" selected>' in content


def test_the_flavor_filter_narrows_runs_and_capacity(client, world, two_clusters):
    content = page(client, world.platform_admin, flavor="h100-80gb", **DAY_10)

    assert kpi(content, "queue") == "p50 10 min 00 s · p95 10 min 00 s (1 attempt)"
    assert re.findall(r'<tr data-flavor="([\w-]+)">', content) == ["h100-80gb"]
    assert re.findall(r'<tr data-allocation="([\w/-]+)">', content) == ["sim-1/h100-80gb"]
    assert kpi(content, "allocation") == "6.2 % (24.00 of 384.00 GPU-hours)"


def test_the_cluster_filter_narrows_attempts_runs_and_capacity(client, world, two_clusters):
    content = page(client, world.platform_admin, cluster="slurm-1", **DAY_10)

    assert kpi(content, "queue") == "p50 30 min 00 s · p95 30 min 00 s (1 attempt)"
    assert kpi(content, "success") == "100.0 % (1 of 1 run)"
    assert re.findall(r'<tr data-allocation="([\w/-]+)">', content) == ["slurm-1/a100-80gb"]
    assert kpi(content, "allocation") == "12.5 % (12.00 of 96.00 GPU-hours)"


def test_an_unknown_filter_value_is_a_400(client, world):
    response = get(client, world.platform_admin, tenant="nobody", **MARCH)

    assert response.status_code == 400
    assert errors(response.content.decode()) == [
        "Tenant: Select a valid choice. That choice is not one of the available choices."
    ]


# --- the range ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "2025-03-31", "to": "2025-03-01"}, INVERTED_RANGE),
        ({"from": "", "to": ""}, EMPTY_RANGE),
        ({"from": "2025-03-01", "to": ""}, EMPTY_RANGE),
        ({"to": "2025-03-01"}, EMPTY_RANGE),
        (
            {"from": "2024-01-01", "to": "2025-03-01"},
            "The range spans 426 days; a report covers at most 400 days. Choose a shorter range.",
        ),
        (
            {"from": "2024-02-25", "to": "2025-03-31"},
            "The range spans 401 days; a report covers at most 400 days. Choose a shorter range.",
        ),
        ({"from": "2025-02-30", "to": "2025-03-01"}, "From: Enter a valid date."),
    ],
)
def test_a_bad_range_is_a_400_that_computes_nothing(
    client, world, experiments, django_assert_max_num_queries, params, message
):
    make_attempt(world, make_run(world, experiments, finished_at=T0), started_at=T0, finished_at=T0)
    client.force_login(world.platform_admin)

    with django_assert_max_num_queries(8), CaptureQueriesContext(connection) as queries:
        response = client.get(kpis_url(**params))

    assert response.status_code == 400
    content = response.content.decode()
    assert errors(content) == [message]
    assert "Nothing was computed" in content
    assert 'data-kpi="' not in content
    read = [query["sql"] for query in queries if any(t in query["sql"] for t in DATA_TABLES)]
    assert read == []


def test_the_longest_range_is_accepted_and_one_day_is_a_range(client, world):
    last = date(2025, 3, 31)
    first = last - timedelta(days=KPI_MAX_RANGE_DAYS - 1)

    longest = page(client, world.platform_admin, **{"from": str(first), "to": str(last)})
    one_day = page(client, world.platform_admin, **{"from": "2025-03-10", "to": "2025-03-10"})

    assert f"{KPI_MAX_RANGE_DAYS} days, both included" in longest
    assert "From 2025-03-10 through 2025-03-10: 1 day, both included, in UTC." in one_day


def test_without_a_range_the_page_shows_the_last_30_days(client, world):
    today = timezone.localdate()

    content = page(client, world.finance)

    first = today - timedelta(days=29)
    assert f"From {first:%Y-%m-%d} through {today:%Y-%m-%d}: 30 days, both included" in content
    assert f'name="from" value="{first:%Y-%m-%d}"' in content
    assert f'name="to" value="{today:%Y-%m-%d}"' in content


# --- access ------------------------------------------------------------------------------------


@pytest.mark.parametrize("persona", ["researcher_a", "researcher_b", "tenant_admin_a"])
def test_the_page_is_404_for_tenant_members(client, world, persona):
    assert get(client, getattr(world, persona), **MARCH).status_code == 404


@pytest.mark.parametrize("persona", ["platform_admin", "finance"])
def test_platform_admins_and_finance_see_the_page_and_its_nav_link(client, world, persona):
    content = page(client, getattr(world, persona), **MARCH)

    assert f'<a href="{kpis_url()}" aria-current="page">KPIs</a>' in content


def test_tenant_members_have_no_kpi_link(client, world):
    client.force_login(world.tenant_admin_a)

    content = client.get(reverse("jobs:run_list")).content.decode()

    assert kpis_url() not in content


def test_anonymous_users_are_sent_to_log_in(client, world):
    response = client.get(kpis_url())

    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next={kpis_url()}"


# --- queries -----------------------------------------------------------------------------------


def test_the_page_reads_a_fixed_number_of_queries(
    client, world, experiments, django_assert_max_num_queries
):
    def add(count: int) -> None:
        for index in range(count):
            tenant = ("vision", "nlp")[index % 2]
            run = make_run(world, experiments, tenant=tenant, finished_at=T0)
            first = make_attempt(
                world,
                run,
                state=AttemptState.PREEMPTED,
                started_at=T0 - timedelta(hours=2),
                finished_at=T0 - timedelta(hours=1),
                failure_reason="PREEMPTED",
            )
            checkpoint = Checkpoint.objects.create(
                run=run, attempt=first, step=10, uri="s3://c", saved_at=first.finished_at
            )
            second = make_attempt(
                world,
                run,
                number=2,
                started_at=T0 - timedelta(minutes=30),
                finished_at=T0,
                resumed_from=checkpoint,
            )
            step_window(second, step=20)
            for attempt in (first, second):
                account(attempt, allocated=3600, effective=1800, startup=60)

    add(1)
    client.force_login(world.platform_admin)
    with CaptureQueriesContext(connection) as few:
        client.get(kpis_url(**MARCH))
    add(30)

    with django_assert_max_num_queries(15), CaptureQueriesContext(connection) as many:
        response = client.get(kpis_url(**MARCH))

    assert response.context["kpis"].total.queue.count == 62
    assert response.context["kpis"].recovery == Ratio(part=31, whole=31)
    assert len(many) == len(few)
