"""Straggler flags from stored rank windows (issue 36, points 2 and 4): the detector's inputs
read for one attempt (windows of the look-back, GPUs, DCGM evidence, placement) in a fixed
number of queries, the scan that upserts flags, the slow-ranks signal to node health and the
counts on the Node health page.

Attempts run on a simulated cluster of 16 nodes × 8 A100 in 2 blocks of 2 leaves; their
windows come from ``stragglers_support.gang`` (lockstep data-parallel training), moved onto
the attempt's nodes and GPUs and stored as the ingest stores them."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils.html import strip_tags

from clusters.health import NodeHealth
from clusters.models import Cluster, ClusterNode, NodeHealthEvent, SimulatedJob
from clusters.services import cluster_refresh_inventory
from clusters.services.health import node_release
from jobs.models import Attempt, AttemptState, Run
from jobs.services.submission import run_submit
from telemetry import tasks
from telemetry.kpis.node_health import SlowRanks, node_overview
from telemetry.models import GpuMinute, RankStepWindow, StragglerFlag, StragglerScan
from telemetry.selectors.stragglers import attempt_straggler_inputs
from telemetry.straggler_flags import (
    ScanSummary,
    slow_ranks_check,
    straggler_flags_scan,
)
from telemetry.stragglers import GpuEvidence, Placement, RankWindow
from tenants.models import Quota
from tests.conftest import experiment_input
from tests.telemetry.stragglers_support import gang, slowed, uniform

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T0 = NOW - timedelta(hours=1)  # the attempts start
DAY = timedelta(days=1)
FLAVOR = "a100-80gb"


def host(index: int) -> str:
    return f"sim-big-{FLAVOR}-{index:02d}"


@pytest.fixture
def big(world) -> Cluster:
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(guaranteed_gpus=128)
    cluster = Cluster.objects.create(
        name="sim-big",
        backend=Cluster.Backend.SIMULATOR,
        settings={
            "speedup": 1000,
            "pools": [{"flavor": FLAVOR, "nodes": 16, "gpus_per_node": 8, "domains": [2, 2]}],
        },
    )
    cluster_refresh_inventory(cluster=cluster)
    return cluster


def attempt_on(world, cluster, *, nodes: int, gpus_per_node: int, first: int = 0) -> Attempt:
    """A running attempt (number 1 of a new run) on nodes ``first``… of the cluster, holding
    GPUs 0… of each, as the simulator allocated them."""
    run = run_submit(
        user=world.researcher_a,
        data=experiment_input(world, nodes=nodes, gpus_per_node=gpus_per_node),
    )
    hosts = [host(first + i) for i in range(nodes)]
    job = SimulatedJob.objects.create(
        cluster=cluster, name=f"job-{run.pk}", flavor=FLAVOR, nodes=nodes,
        gpus_per_node=gpus_per_node, max_runtime_s=86_400, state="RUNNING",
        allocation={h: list(range(gpus_per_node)) for h in hosts}, submitted_at=T0, started_at=T0,
    )  # fmt: skip
    attempt = Attempt.objects.create(
        run=run, number=1, cluster=cluster, state=AttemptState.RUNNING,
        backend_job_id=str(job.pk), started_at=T0, node_list=hosts, placement=hosts,
    )  # fmt: skip
    return Attempt.objects.select_related("run", "cluster").get(pk=attempt.pk)


def windows_of(attempt: Attempt, windows: list[RankWindow]) -> list[RankWindow]:
    """``windows`` moved onto the attempt: rank r drives GPU r % gpus_per_node of its
    (r // gpus_per_node)-th node; times start at the attempt's start."""
    per_node = attempt.run.experiment.gpus_per_node
    shift = T0.timestamp() - 1_700_000_000.0
    return [
        dataclasses.replace(
            w,
            host=attempt.node_list[w.rank // per_node],
            gpu=str(w.rank % per_node),
            start=w.start + shift,
            end=w.end + shift,
        )
        for w in windows
    ]


def moment(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, tz=UTC)


def store(attempt: Attempt, windows: list[RankWindow]) -> None:
    RankStepWindow.objects.bulk_create(
        RankStepWindow(
            attempt=attempt, rank=w.rank, seq=w.seq, world_size=w.world_size, host=w.host,
            gpu=w.gpu, start=moment(w.start), end=moment(w.end), steps=w.steps,
            step_time_s=w.step_time_s, data_wait_s=w.data_wait_s, comm_wait_s=w.comm_wait_s,
        )
        for w in windows
    )  # fmt: skip


def run_gang(attempt: Attempt, windows: int, shape=uniform, first_seq: int = 1) -> list[RankWindow]:
    """The attempt's gang over ``windows`` windows from ``first_seq``, stored."""
    made = windows_of(attempt, gang(attempt.run.gpus, windows, shape, first_seq=first_seq))
    store(attempt, made)
    return made


def health_event(cluster, node, signal, *, gpu="", code="", at=T0, until=None, count=1, **more):
    return NodeHealthEvent.objects.create(
        cluster=cluster, node=node, gpu=gpu, source=more.get("source", "dcgm"), signal=signal,
        code=code, observed_at=at, last_observed_at=until or at, count=count, recorded_at=at,
        action=more.get("action", "observe"),
    )  # fmt: skip


def thermal(cluster, node, gpu, at=T0 + timedelta(minutes=10)):
    return health_event(
        cluster, node, "thermal_throttle", gpu=gpu, code="DCGM_FI_DEV_CLOCKS_EVENT_REASONS", at=at
    )


def flags(attempt: Attempt) -> list[tuple]:
    return list(
        StragglerFlag.objects.filter(attempt=attempt)
        .order_by("rank")
        .values_list(
            "rank", "node", "gpu", "world_size", "cause", "slowdown", "windows", "first_window",
            "detected_at", "updated_at", "run_id", "cluster_id",
        )
    )  # fmt: skip


# --- the detector's inputs ---------------------------------------------------------------------


def test_inputs_of_a_small_attempt_with_health_events_and_topology(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    h0, h1 = host(0), host(1)
    made = run_gang(attempt, 5, slowed(3, 1.5))
    health_event(big, h0, "pcie_replay", gpu="0", code="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                 at=T0 + timedelta(minutes=5), count=3)  # fmt: skip
    health_event(big, h0, "ecc_uncorrectable", gpu="1", code="48", at=T0 + timedelta(minutes=1))
    # An application XID after it is the program's (NVIDIA's catalog): not the GPU's latest.
    health_event(big, h0, "xid_application", gpu="1", code="13", at=T0 + timedelta(minutes=2))
    thermal(big, h1, "1")
    health_event(big, h1, "node_down", code="DOWN", at=T0 + timedelta(minutes=3))  # no GPU
    thermal(big, host(2), "0")  # not the attempt's node
    health_event(
        big,
        h0,
        "thermal_throttle",
        gpu="0",
        at=T0 - 2 * timedelta(hours=1),
        until=T0 - timedelta(seconds=1),
    )  # ended before the attempt started: fmt: skip
    thermal(big, h0, "1", at=NOW + timedelta(seconds=1))  # after now

    inputs = attempt_straggler_inputs(attempt=attempt, now=NOW)

    assert inputs.windows == sorted(made, key=lambda w: (w.rank, w.seq))
    assert len(inputs.windows) == 20
    assert inputs.attempt_gpus == frozenset({(h0, "0"), (h0, "1"), (h1, "0"), (h1, "1")})
    assert inputs.evidence == (
        GpuEvidence(host=h0, gpu="0", pcie_replays=3),
        GpuEvidence(host=h0, gpu="1", xid=48),
        GpuEvidence(host=h1, gpu="1", throttle_reasons=frozenset({"thermal_throttle"})),
    )
    assert inputs.placement == Placement(
        paths={h0: ("block-1", "leaf-1.1"), h1: ("block-1", "leaf-1.1")}
    )
    assert inputs.latest_end == moment(T0.timestamp() + 6 * 30)
    assert inputs.nodes == {h0: h0, h1: h1}


def test_hosts_are_read_by_their_short_name(world, big):
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=4)
    made = gang(4, 3)
    store(attempt, [dataclasses.replace(w, host=f"{host(0).upper()}.cluster.example")
                    for w in windows_of(attempt, made)])  # fmt: skip

    inputs = attempt_straggler_inputs(attempt=attempt, now=NOW)

    assert {w.host for w in inputs.windows} == {host(0)}
    assert inputs.attempt_gpus == frozenset((host(0), str(gpu)) for gpu in range(4))


def test_the_look_back_is_twenty_window_lengths_before_the_latest_window(world, big):
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=4)
    made = run_gang(attempt, 30)  # windows of 30 s: seq 30 ends at T0 + 930 s
    # A short last window (flushed at exit) does not shrink the look-back below 30 s a window.
    last = made[-1]
    store(attempt, [dataclasses.replace(last, seq=31, start=last.end, end=last.end + 2)])

    inputs = attempt_straggler_inputs(attempt=attempt, now=NOW)

    # 600 s before the latest end (T0 + 932 s): windows ending at T0 + 332 s or later.
    assert sorted({w.seq for w in inputs.windows}) == list(range(11, 32))
    assert [w.seq for w in inputs.windows if w.rank == 3] == list(range(11, 32))


def test_an_attempt_without_windows_has_no_inputs(world, big):
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=4)

    inputs = attempt_straggler_inputs(attempt=attempt, now=NOW)

    assert (inputs.windows, inputs.evidence, inputs.latest_end) == ([], (), None)


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 4), (16, 4)])
def test_inputs_take_seven_queries_whatever_the_rank_count(
    world, big, django_assert_num_queries, nodes, per_node
):
    attempt = attempt_on(world, big, nodes=nodes, gpus_per_node=per_node)
    run_gang(attempt, 10, slowed(1, 1.5))
    for index in range(nodes):
        thermal(big, host(index), "1")

    # The latest window, the attempt's GPUs (its flavor's GPUs per node, then the
    # simulator's allocation), its windows, its nodes' health events, its GPUs' SM clocks,
    # their topology.
    with django_assert_num_queries(7):
        inputs = attempt_straggler_inputs(attempt=attempt, now=NOW)

    assert len(inputs.windows) == nodes * per_node * 10
    assert len(inputs.evidence) == nodes
    assert len(inputs.placement.paths) == nodes


# --- the scan ----------------------------------------------------------------------------------


def test_the_scan_flags_exactly_the_slow_rank_with_its_node_gpu_cause_and_slowdown(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5, since=2))
    thermal(big, host(1), "1")

    summary = straggler_flags_scan(now=NOW)

    assert summary == ScanSummary(scanned=1, created=1, updated=0, signalled=[])
    assert flags(attempt) == [
        (3, host(1), "1", 4, "slow_gpu", 1.4688, 4, 2, NOW, NOW, attempt.run_id, big.pk)
    ]
    evidence = StragglerFlag.objects.get(attempt=attempt).evidence
    assert (evidence["gpu_signs"], evidence["throttle_reasons"]) == (
        ["thermal throttle"],
        ["thermal_throttle"],
    )
    assert (evidence["compute_s"], evidence["gang_compute_s"]) == (0.45, 0.3)
    scan = StragglerScan.objects.get(attempt=attempt)
    assert (scan.windows_until, scan.scanned_at, scan.final, scan.notes) == (
        moment(T0.timestamp() + 6 * 30),
        NOW,
        False,
        [],
    )


def test_a_capped_sm_clock_alone_names_a_slow_gpu(world, big):
    """No node-health event: the GPU minutes' SM clock (DCGM_FI_DEV_SM_CLOCK against
    DCGM_FI_DEV_MAX_SM_CLOCK) is the evidence."""
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5, since=2))
    for index in range(2):
        for gpu in ("0", "1"):
            capped = (index, gpu) == (1, "1")
            GpuMinute.objects.create(
                attempt=attempt,
                host=host(index),
                gpu=gpu,
                minute=T0 + timedelta(minutes=5),
                sm_clock_mhz=940.0 if capped else 1410.0,
                max_sm_clock_mhz=1410.0,
                samples=4,
            )

    straggler_flags_scan(now=NOW)

    flag = StragglerFlag.objects.get(attempt=attempt)
    assert (flag.rank, flag.node, flag.gpu, flag.cause) == (3, host(1), "1", "slow_gpu")
    assert flag.evidence["gpu_signs"] == ["SM clock at 67% of its maximum"]
    assert flag.evidence["sm_clock_share"] == 0.6667


def test_a_second_scan_without_new_windows_changes_nothing(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5, since=2))
    straggler_flags_scan(now=NOW)
    before = flags(attempt)

    again = straggler_flags_scan(now=NOW + timedelta(minutes=1))

    assert again == ScanSummary()
    assert flags(attempt) == before
    assert StragglerFlag.objects.count() == 1


def test_new_windows_update_a_flag_and_a_rank_no_longer_slow_keeps_its_row(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5, since=2))
    straggler_flags_scan(now=NOW)

    later = NOW + timedelta(minutes=1)
    run_gang(attempt, 2, slowed(3, 2.0), first_seq=6)  # slower still
    assert straggler_flags_scan(now=later) == ScanSummary(scanned=1, created=0, updated=1)
    # Slow windows 2 to 7; the slowdown is the median of four 1.4688 and two 1.9375.
    assert flags(attempt) == [
        (3, host(1), "1", 4, "unknown", 1.4688, 6, 2, NOW, later, attempt.run_id, big.pk)
    ]

    latest = NOW + timedelta(minutes=2)
    run_gang(attempt, 25, first_seq=8)  # 25 clean windows: the look-back holds no slow one
    assert straggler_flags_scan(now=latest) == ScanSummary(scanned=1)
    assert flags(attempt)[0][8:10] == (NOW, later)  # kept as it was
    assert StragglerScan.objects.get(attempt=attempt).windows_until == moment(
        T0.timestamp() + 33 * 30
    )


def test_an_ended_attempt_is_scanned_once_more_then_never(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 2, slowed(3, 1.5))
    assert straggler_flags_scan(now=NOW).created == 0  # two windows: too few yet
    run_gang(attempt, 2, slowed(3, 1.5), first_seq=3)  # arrived with its end
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.FAILED, finished_at=NOW)

    final = straggler_flags_scan(now=NOW + timedelta(minutes=1))
    assert (final.scanned, final.created) == (1, 1)
    assert StragglerScan.objects.get(attempt=attempt).final is True

    run_gang(attempt, 3, slowed(3, 1.5), first_seq=5)  # late: after the final scan
    assert straggler_flags_scan(now=NOW + timedelta(minutes=2)) == ScanSummary()


def test_an_attempt_that_ended_without_new_windows_is_only_marked_final(world, big):
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5))
    straggler_flags_scan(now=NOW)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUCCEEDED, finished_at=NOW)
    before = flags(attempt)

    assert straggler_flags_scan(now=NOW + timedelta(minutes=1)) == ScanSummary(scanned=1)

    assert StragglerScan.objects.get(attempt=attempt).final is True
    assert flags(attempt) == before


def test_a_gang_of_three_is_scanned_and_a_clean_gang_is_not_flagged(world, big):
    three = attempt_on(world, big, nodes=1, gpus_per_node=3)
    run_gang(three, 4, slowed(0, 1.5))
    clean = attempt_on(world, big, nodes=2, gpus_per_node=4, first=2)
    run_gang(clean, 10)

    summary = straggler_flags_scan(now=NOW)

    assert (summary.scanned, summary.created) == (2, 1)
    # No DCGM evidence for its GPU: the cause is unknown, and says what is missing.
    assert flags(three) == [
        (0, host(0), "0", 3, "unknown", 1.4688, 4, 1, NOW, NOW, three.run_id, big.pk)
    ]
    assert StragglerFlag.objects.get(attempt=three).evidence["missing"] == (
        f"DCGM evidence for GPU 0 on {host(0)}"
    )
    assert flags(clean) == []
    assert StragglerScan.objects.get(attempt=clean).notes == []


def test_too_few_ranks_flag_nothing_and_the_scan_says_why(world, big):
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=2)
    run_gang(attempt, 5, slowed(0, 2.0))

    straggler_flags_scan(now=NOW)

    assert flags(attempt) == []
    assert StragglerScan.objects.get(attempt=attempt).notes == [
        "world size 2: 2 ranks reported; at least 3 are needed to tell a slow rank from the gang"
    ]


# --- the slow-ranks signal ---------------------------------------------------------------------


def flag(attempt: Attempt, node: str, cause: str, *, at=NOW, rank=0) -> StragglerFlag:
    return StragglerFlag.objects.create(
        attempt=attempt, run_id=attempt.run_id, cluster_id=attempt.cluster_id, node=node,
        gpu=str(rank), rank=rank, world_size=8, cause=cause, slowdown=1.5, windows=3,
        first_window=1, evidence={}, detected_at=at, updated_at=at,
    )  # fmt: skip


def slow_ranks_events(cluster) -> list[tuple]:
    return list(
        NodeHealthEvent.objects.filter(cluster=cluster, signal="slow_ranks")
        .order_by("id")
        .values_list("node", "source", "action", "observed_at", "detail")
    )


def node_health(cluster, name: str) -> tuple[str, str]:
    return ClusterNode.objects.values_list("health", "health_reason").get(
        cluster=cluster, name=name
    )


DETAIL = (
    "ranks on it were slower than their gang in {runs} runs within 7 days (a slow GPU, or no "
    "other cause found; GPU {gpus})"
)


def test_a_node_slow_in_two_runs_becomes_suspect_once(world, big):
    node = host(5)
    first = attempt_on(world, big, nodes=1, gpus_per_node=8, first=5)
    flag(first, node, "slow_gpu", at=NOW - 3 * DAY)

    assert slow_ranks_check(cluster=big, nodes=[node], now=NOW) == []
    assert slow_ranks_events(big) == []
    assert node_health(big, node) == ("healthy", "")

    second = attempt_on(world, big, nodes=1, gpus_per_node=8, first=5)
    flag(second, node, "unknown", rank=3)
    sent = slow_ranks_check(cluster=big, nodes=[node], now=NOW)

    detail = DETAIL.format(runs=2, gpus="0, 3")
    assert [(s.node, s.signal, s.source, s.detail) for s in sent] == [
        (node, "slow_ranks", "attempts", detail)
    ]
    assert slow_ranks_events(big) == [(node, "attempts", "warn", NOW, detail)]
    assert node_health(big, node) == ("suspect", detail)

    third = attempt_on(world, big, nodes=1, gpus_per_node=8, first=5)
    flag(third, node, "slow_gpu")
    later = NOW + timedelta(hours=1)
    assert slow_ranks_check(cluster=big, nodes=[node], now=later) == []
    assert len(slow_ranks_events(big)) == 1  # one event per node and window


def test_slow_input_network_and_old_flags_do_not_count(world, big):
    node = host(6)
    for cause in ("slow_input", "network", "slow_input"):
        flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=6), node, cause)
    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=6), node, "slow_gpu",
         at=NOW - 7 * DAY - timedelta(seconds=1))  # fmt: skip
    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=6), node, "slow_gpu")

    assert slow_ranks_check(cluster=big, nodes=[node], now=NOW) == []
    assert slow_ranks_events(big) == []
    assert node_health(big, node) == ("healthy", "")


def test_two_ranks_of_one_run_are_one_run(world, big):
    node = host(7)
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=8, first=7)
    flag(attempt, node, "slow_gpu", rank=0)
    flag(attempt, node, "slow_gpu", rank=1)

    assert slow_ranks_check(cluster=big, nodes=[node], now=NOW) == []


def test_the_policy_sets_how_many_runs_and_how_long(world, big):
    big.health_policy = {"straggler_runs": 3, "straggler_window_s": 86_400}
    big.save(update_fields=["health_policy"])
    node = host(8)
    for days in (2, 0.5, 0.25):  # the first is older than the day
        attempt = attempt_on(world, big, nodes=1, gpus_per_node=8, first=8)
        flag(attempt, node, "slow_gpu", at=NOW - days * DAY)
    assert slow_ranks_check(cluster=big, nodes=[node], now=NOW) == []

    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=8), node, "unknown")
    [sent] = slow_ranks_check(cluster=big, nodes=[node], now=NOW)

    assert sent.detail == (
        "ranks on it were slower than their gang in 3 runs within 1 day (a slow GPU, or no "
        "other cause found; GPU 0)"
    )


def test_after_a_release_only_runs_flagged_since_count(world, big):
    node = host(9)
    for _ in range(2):
        flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=9), node, "slow_gpu",
             at=NOW - DAY)  # fmt: skip
    assert len(slow_ranks_check(cluster=big, nodes=[node], now=NOW - DAY)) == 1
    node_release(cluster=big, node=node, actor=world.platform_admin, note="reseated the GPU",
                 now=NOW - timedelta(hours=12))  # fmt: skip

    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=9), node, "slow_gpu")
    assert slow_ranks_check(cluster=big, nodes=[node], now=NOW) == []
    assert node_health(big, node) == ("healthy", "")

    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=9), node, "slow_gpu")
    assert len(slow_ranks_check(cluster=big, nodes=[node], now=NOW)) == 1
    assert [event[3] for event in slow_ranks_events(big)] == [NOW - DAY, NOW]
    assert node_health(big, node)[0] == NodeHealth.SUSPECT


def test_the_scan_makes_a_node_slow_in_two_runs_suspect(world, big):
    for _ in range(2):
        attempt = attempt_on(world, big, nodes=2, gpus_per_node=2, first=10)
        run_gang(attempt, 5, slowed(3, 1.5))
    thermal(big, host(11), "1")

    summary = straggler_flags_scan(now=NOW)

    assert (summary.scanned, summary.created, summary.signalled) == (2, 2, [host(11)])
    assert node_health(big, host(11)) == (
        "suspect",
        DETAIL.format(runs=2, gpus="1"),
    )
    assert straggler_flags_scan(now=NOW + timedelta(minutes=1)) == ScanSummary()
    assert len(slow_ranks_events(big)) == 1


# --- the Node health page ----------------------------------------------------------------------


def test_platform_admins_see_straggler_counts_per_node(client, world, big):
    node = host(12)
    first = attempt_on(world, big, nodes=1, gpus_per_node=8, first=12)
    flag(first, node, "slow_input", at=NOW - 2 * DAY)
    flag(first, node, "slow_gpu", at=NOW - DAY, rank=1)
    flag(attempt_on(world, big, nodes=1, gpus_per_node=8, first=12), node, "slow_input")
    flag(
        attempt_on(world, big, nodes=1, gpus_per_node=8, first=12),
        node,
        "slow_gpu",
        at=NOW - 31 * DAY,
    )  # outside the page's 30 days: fmt: skip

    rows = {(row.cluster, row.name): row for row in node_overview(now=NOW).nodes}

    assert rows["sim-big", node].slow == SlowRanks(runs=2, counted=1, last_at=NOW)
    assert rows["sim-big", host(13)].slow is None
    client.force_login(world.platform_admin)
    with time_machine.travel(NOW, tick=False):
        page = client.get(reverse("telemetry:node_health")).content.decode()
    row = page.split(f'data-node="sim-big/{node}"')[1].split("</tr>")[0]
    cell = row.split("data-slow-ranks>")[1].split("</td>")[0]
    assert " ".join(strip_tags(cell).split()) == "2 runs (1 counted) · last 2026-06-01 12:00 UTC"


def test_flags_are_reached_from_their_run_and_attempt(world, big):
    attempt = attempt_on(world, big, nodes=1, gpus_per_node=8)
    flag(attempt, host(0), "slow_gpu")
    assert list(Run.objects.get(pk=attempt.run_id).straggler_flags.values_list("rank")) == [(0,)]
    assert list(attempt.straggler_flags.values_list("node", flat=True)) == [host(0)]


def test_beat_runs_the_scan_every_minute(settings, world, big):
    assert settings.CELERY_BEAT_SCHEDULE["straggler-scan"] == {
        "task": "telemetry.tasks.straggler_scan",
        "schedule": 60.0,
    }
    attempt = attempt_on(world, big, nodes=2, gpus_per_node=2)
    run_gang(attempt, 5, slowed(3, 1.5))

    tasks.straggler_scan()

    assert list(StragglerFlag.objects.values_list("rank", "node", "cause")) == [
        (3, host(1), "unknown")
    ]
