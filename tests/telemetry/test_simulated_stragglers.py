"""The simulator's straggler scenarios as telemetry (issue 36, point 5): every rank's windows
in lockstep, the capped GPU's SM clock, NVLink and the node exporter's InfiniBand counters
(pure); then a simulated run collected like any cluster's, its rows stored and the
straggler found in them."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from clusters.models import ClusterNode, SimulatedJob
from clusters.services import cluster_refresh_inventory
from clusters.simulation import Workload
from jobs.models import Attempt, AttemptState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from telemetry import collection
from telemetry.exposition.node_links import (
    IB_LINK_DOWNED,
    IB_LINK_ERROR_RECOVERIES,
    IB_RECEIVE_ERRORS,
    IB_RECEIVED,
    IB_SYMBOL_ERRORS,
    IB_TRANSMITTED,
    LinkSample,
)
from telemetry.exposition.parsing import (
    GR_ENGINE_ACTIVE,
    MAX_SM_CLOCK,
    NVLINK_RX,
    NVLINK_TX,
    SM_ACTIVE,
    SM_CLOCK,
    TENSOR_ACTIVE,
)
from telemetry.models import NodeLinkMinute, RankStepWindow
from telemetry.selectors.evidence import attempt_clock_evidence, attempt_link_evidence
from telemetry.selectors.rank_windows import attempt_rank_windows
from telemetry.simulated import (
    SimulatedLink,
    SimulatedMinute,
    SimulatedRankWindow,
    SimulatedWindow,
    max_sm_clock_mhz,
    minute_samples,
    node_link_samples,
    simulated_telemetry,
)
from telemetry.stragglers import Cause, GpuEvidence, Placement, RankWindow, detect
from tests.jobs.test_lifecycle import submit

T = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
LEAF_1, LEAF_2 = ("block-1", "leaf-1.1"), ("block-1", "leaf-1.2")
FOUR_GPUS = [("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")]


def approx(value: float):
    return pytest.approx(value, rel=1e-12)


def straggling(kind: str, rank: int, factor: float, *, profile="compute-bound", duration=300):
    return Workload(profile, duration, straggler=kind, straggler_rank=rank, straggler_factor=factor)


def test_a_clock_capped_gpu_is_the_rank_the_others_wait_for():
    telemetry = simulated_telemetry(
        straggling("slow_gpu", 3, 2.0),
        started_at=T,
        until=T + 330 * S,
        finished=True,
        speedup=1,
        gpus=FOUR_GPUS,
        max_clock_mhz=1410.0,
    )

    step = 1.97  # 0.97 x 2 of compute + 0.01 of input + 0.02 of transfer
    assert telemetry.lockstep.step == approx(step)
    # Rank 0's windows, as the SDK's aggregate: it waits for rank 3 at every all-reduce.
    assert telemetry.windows[0] == SimulatedWindow(
        1, T + 30 * S, T + 90 * S, 60, 1.0, approx(60 * 0.01 / step), approx(60 * 0.99 / step), 60
    )
    assert len(telemetry.windows) == 5
    first = [w for w in telemetry.rank_windows if w.seq == 1]
    assert first == [
        SimulatedRankWindow(
            rank, 4, rank % 2, host, gpu, 1, T + 30 * S, T + 90 * S, 60, 1.0,
            approx(60 * 0.01 / step), approx(60 * (0.02 if rank == 3 else 0.99) / step),
        )
        for rank, (host, gpu) in enumerate(FOUR_GPUS)
    ]  # fmt: skip
    assert [w.seq for w in telemetry.rank_windows] == [s for s in range(1, 6) for _ in range(4)]
    # Its GPU is capped at 1410 ÷ 2 MHz from start to end; NVLink moves at the gang's pace.
    assert telemetry.minutes[:4] == [
        SimulatedMinute(
            host, gpu, T, approx(0.51), approx(0.51), approx(0.51 * 0.7), 4,
            705.0 if (host, gpu) == ("b", "1") else 1410.0, 1410.0, approx(100e9 / step / 2),
        )
        for host, gpu in FOUR_GPUS
    ]  # fmt: skip
    last = telemetry.minutes[-1]
    assert (last.minute, last.samples, last.nvlink_bytes_s) == (
        T + 300 * S,
        2,
        approx(100e9 / step),
    )
    assert telemetry.links == [
        SimulatedLink(node, T, T + 30 * S, T + 330 * S, approx(40e9 / step), 0.0)
        for node in ("a", "b")
    ]


def test_slow_input_on_a_node_shows_in_its_ranks_data_wait():
    telemetry = simulated_telemetry(
        straggling("slow_input", 1, 1.5),
        started_at=T,
        until=T + 90 * S,
        finished=True,
        speedup=1,
        gpus=[("a", "0"), ("b", "0"), ("c", "0")],
    )

    step = 0.98 * 1.5 + 0.02
    assert [(w.rank, w.data_wait_s, w.comm_wait_s) for w in telemetry.rank_windows] == [
        (0, approx(60 * 0.01 / step), approx(60 * (step - 0.98) / step)),
        (1, approx(60 * (0.01 + 0.49) / step), approx(60 * 0.02 / step)),
        (2, approx(60 * 0.01 / step), approx(60 * (step - 0.98) / step)),
    ]
    # One GPU per node: no NVLink peer, so no NVLink traffic; every GPU at its clock.
    assert {(m.nvlink_bytes_s, m.sm_clock_mhz) for m in telemetry.minutes} == {(0.0, 1410.0)}


def test_a_degraded_link_apart_from_the_gang_delays_its_node_and_errs():
    telemetry = simulated_telemetry(
        straggling("degraded_link", 2, 1.5),
        started_at=T,
        until=T + 90 * S,
        finished=True,
        speedup=1,
        gpus=[("a", "0"), ("b", "0"), ("c", "0")],
        paths={"a": LEAF_1, "b": LEAF_1, "c": LEAF_2},
    )

    # Across two leaves: the transfer is 0.03; node c reaches the all-reduce 1.5 times later.
    assert telemetry.lockstep.step == approx(1.5)
    assert [(w.rank, w.data_wait_s, w.comm_wait_s) for w in telemetry.rank_windows] == [
        (0, approx(0.4), approx(60 * 0.52 / 1.5)),
        (1, approx(0.4), approx(60 * 0.52 / 1.5)),
        (2, approx(0.4), approx(1.2)),
    ]
    assert telemetry.links == [
        SimulatedLink("a", T, T + 30 * S, T + 90 * S, approx(40e9 / 1.5), 0.0),
        SimulatedLink("b", T, T + 30 * S, T + 90 * S, approx(40e9 / 1.5), 0.0),
        SimulatedLink("c", T, T + 30 * S, T + 90 * S, approx(40e9 / 2.25), approx(0.5)),
    ]


def test_rank_windows_last_at_least_the_sdks_30_s_of_wall_time():
    telemetry = simulated_telemetry(
        Workload("comm-bound", 1800),
        started_at=T,
        until=T + 61 * S,
        finished=True,
        speedup=30,
        gpus=FOUR_GPUS,
    )

    # 30 s of wall time at 30x are 900 simulated seconds: 2 windows per rank, not 30.
    assert len(telemetry.windows) == 30
    assert [(w.seq, w.start, w.end, w.steps) for w in telemetry.rank_windows[::4]] == [
        (1, T + 1 * S, T + 31 * S, 900),
        (2, T + 31 * S, T + 61 * S, 900),
    ]
    # A clean gang on one leaf: the profile's shares, on every rank alike.
    assert {(round(w.data_wait_s, 9), round(w.comm_wait_s, 9)) for w in telemetry.rank_windows} == {
        (0.9, 13.5)
    }


def test_a_single_gpu_job_reports_no_rank_windows_and_no_links():
    telemetry = simulated_telemetry(
        straggling("slow_gpu", 0, 1.5),
        started_at=T,
        until=T + 90 * S,
        finished=True,
        speedup=1,
        gpus=[("a", "0")],
        max_clock_mhz=1980.0,
    )

    assert (len(telemetry.windows), telemetry.rank_windows, telemetry.links) == (1, [], [])
    assert [m.sm_clock_mhz for m in telemetry.minutes] == [1320.0, 1320.0]


def test_minute_samples_carry_the_clocks_and_nvlink_split_into_sent_and_received():
    minute = SimulatedMinute("a", "1", T, 0.5, 0.5, 0.25, 2, 705.0, 1410.0, 8e9)
    telemetry = simulated_telemetry(
        Workload("compute-bound", 30), started_at=T, until=T, finished=True, speedup=1, gpus=[]
    )
    telemetry.minutes.append(minute)

    samples = minute_samples(telemetry, started_at=T, finished_at=None, since=T, until=T + 61 * S)

    assert [(s.metric, s.value, s.ts) for s in samples[:7]] == [
        (GR_ENGINE_ACTIVE, 0.5, 1772366400000),
        (SM_ACTIVE, 0.5, 1772366400000),
        (TENSOR_ACTIVE, 0.25, 1772366400000),
        (SM_CLOCK, 705.0, 1772366400000),
        (MAX_SM_CLOCK, 1410.0, 1772366400000),
        (NVLINK_TX, 4e9, 1772366400000),
        (NVLINK_RX, 4e9, 1772366400000),
    ]
    assert len(samples) == 14


def test_the_node_exporter_counts_each_nodes_traffic_and_errors_so_far():
    links = [
        SimulatedLink("c", T, T + 30 * S, T + 90 * S, 1000.0, 0.5),
        # A second job on node c from 12:01: its traffic adds up in the same counters.
        SimulatedLink("c", T + 60 * S, T + 60 * S, T + 120 * S, 10.0, 0.0),
    ]

    samples = node_link_samples(links, since=T, until=T + 140 * S)

    def at(second: int, metric: str) -> float:
        (sample,) = [
            s for s in samples if s.ts == (T + second * S).timestamp() * 1000 and s.metric == metric
        ]
        return sample.value

    ticks = sorted({s.ts for s in samples})
    assert ticks == [int((T + n * 15 * S).timestamp() * 1000) for n in range(9)]  # to 12:02
    assert [at(n * 15, IB_TRANSMITTED) for n in range(9)] == [
        0, 0, 0, 7_500, 15_000, 22_500 + 75, 30_000 + 150, 30_000 + 225, 30_000 + 300
    ]  # fmt: skip
    assert [at(n * 15, IB_SYMBOL_ERRORS) for n in range(9)] == [0, 0, 0, 7, 15, 22, 30, 30, 30]
    assert {at(90, metric) for metric in (IB_LINK_DOWNED, IB_LINK_ERROR_RECOVERIES)} == {0}
    assert at(90, IB_RECEIVED) == at(90, IB_TRANSMITTED)
    assert samples[0] == LinkSample("c", "mlx5_0", "1", IB_TRANSMITTED, 0.0, ticks[0])
    assert {s.metric for s in samples} >= {IB_RECEIVE_ERRORS}
    # A counter is a function of the time: two reads give what one does.
    halves = node_link_samples(links, since=T, until=T + 50 * S)
    halves += node_link_samples(links, since=T + 50 * S, until=T + 140 * S)
    assert halves == samples


def test_each_flavor_family_has_its_maximum_sm_clock():
    assert [max_sm_clock_mhz(f) for f in ("a100-80gb", "h100-80gb", "l40s-48gb")] == [
        1410.0,
        1980.0,
        1410.0,
    ]


# --- a simulated run, collected ---------------------------------------------------------------


@pytest.fixture
def two_leaves(world):
    """The world's simulator at real-time speed, its A100 nodes in two leaf switches of two
    nodes each."""
    settings = world.cluster.settings
    settings["speedup"] = 1
    settings["topology"] = ["block", "leaf"]
    settings["pools"][0]["domains"] = [1, 2]
    world.cluster.save(update_fields=["settings"])
    cluster_refresh_inventory(cluster=world.cluster)
    return world


def run_and_collect(world, *, nodes: int, gpus_per_node: int, **env: str):
    """A compute-bound run with ``env``, placed by admission, started at a whole minute 3
    hours ago (so its ticks and minutes fall where the test says), run to its end, and its
    telemetry collected. Returns its attempt and its nodes' topology paths."""
    run = submit(
        world,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        env={"GANTRY_SIM_PROFILE": "compute-bound", **env},
    )
    admission_run_cycle()
    attempt = run.attempts.get()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)  # placed: running
    started = timezone.now().replace(second=0, microsecond=0) - timedelta(hours=3)
    SimulatedJob.objects.update(started_at=started)
    Attempt.objects.filter(pk=attempt.pk).update(started_at=started)
    cluster_sync(cluster=world.cluster)  # finished
    collection.telemetry_collect(cluster=world.cluster)
    attempt.refresh_from_db()
    names = sorted(SimulatedJob.objects.get().allocation)
    paths = dict(ClusterNode.objects.filter(name__in=names).values_list("name", "path"))
    return attempt, {name: tuple(paths[name]) for name in names}


def detected(attempt: Attempt, paths: dict[str, tuple[str, ...]]):
    """What the straggler detector finds in the attempt's stored rows."""
    return detect(
        [RankWindow(**row) for row in attempt_rank_windows(attempt_id=attempt.pk)],
        evidence=[
            GpuEvidence(c.host, c.gpu, c.sm_clock_mhz, c.max_sm_clock_mhz)
            for c in attempt_clock_evidence(attempt_id=attempt.pk)
        ],
        placement=Placement(paths),
    ).stragglers


def test_a_simulated_run_with_a_capped_gpu_stores_what_names_it(two_leaves):
    attempt, paths = run_and_collect(
        two_leaves,
        nodes=2,
        gpus_per_node=8,
        GANTRY_SIM_DURATION_S="600",
        GANTRY_SIM_STRAGGLER="slow_gpu",
        GANTRY_SIM_STRAGGLER_RANK="11",
    )

    nodes = list(paths)
    assert nodes == ["sim-1-a100-80gb-00", "sim-1-a100-80gb-01"]  # one leaf: the tightest
    assert set(paths.values()) == {LEAF_1}
    step = 0.97 * 1.5 + 0.03  # 1.485
    assert SimulatedJob.objects.get().profile["speed"] == approx(1 / step)
    assert attempt.state == AttemptState.SUCCEEDED
    # Its 30 s of start-up and 600 s of work took 1.485 times as long.
    assert (attempt.finished_at - attempt.started_at).total_seconds() == pytest.approx(
        630 * step, abs=1e-6
    )
    windows = list(RankStepWindow.objects.filter(attempt=attempt).order_by("seq", "rank"))
    assert len(windows) == 10 * 16
    assert {(w.world_size, w.steps, round(w.step_time_s, 9)) for w in windows} == {
        (16, 60, round(step, 9))
    }
    assert {(w.host, w.gpu, w.local_rank) for w in windows if w.rank == 11} == {(nodes[1], "3", 3)}
    # Rank 11 waits only for the transfer; every other rank waits for rank 11 too.
    assert {round(w.comm_wait_s, 9) for w in windows if w.rank == 11} == {1.2}
    assert {round(w.comm_wait_s, 9) for w in windows if w.rank != 11} == {30.3}
    assert {round(w.data_wait_s, 9) for w in windows} == {0.6}
    clocks = {(c.host, c.gpu): c for c in attempt_clock_evidence(attempt_id=attempt.pk)}
    assert len(clocks) == 16
    assert clocks[(nodes[1], "3")].sm_clock_mhz == 940.0
    assert {c.sm_clock_mhz for key, c in clocks.items() if key != (nodes[1], "3")} == {1410.0}
    assert {c.max_sm_clock_mhz for c in clocks.values()} == {1410.0}
    links = attempt_link_evidence(attempt_id=attempt.pk)
    assert [(h.host, h.ib_errors) for h in links.hosts] == [(nodes[0], 0), (nodes[1], 0)]
    assert links.erring_hosts() == links.low_infiniband() == links.low_nvlink() == []
    assert [(s.rank, s.host, s.gpu, s.cause) for s in detected(attempt, paths)] == [
        (11, nodes[1], "3", Cause.SLOW_GPU)
    ]


def test_a_degraded_link_apart_from_the_gang_shows_in_the_node_exporters_counters(two_leaves):
    attempt, paths = run_and_collect(
        two_leaves,
        nodes=3,
        gpus_per_node=2,
        GANTRY_SIM_DURATION_S="300",
        GANTRY_SIM_STRAGGLER="degraded_link",
        GANTRY_SIM_STRAGGLER_RANK="4",
        GANTRY_SIM_STRAGGLER_FACTOR="2.0",
    )

    nodes = list(paths)
    # Three nodes cannot share a leaf of two: the third sits apart, under the other leaf.
    assert list(paths.values()) == [LEAF_1, LEAF_1, LEAF_2]
    step = 0.98 * 2 + 0.02 * 1.5  # 1.99: the apart node reaches the all-reduce twice as late
    assert (attempt.finished_at - attempt.started_at).total_seconds() == pytest.approx(
        330 * step, abs=1e-6
    )
    links = attempt_link_evidence(attempt_id=attempt.pk)
    degraded = links.hosts[2]
    # Work from 59.7 s to 656.7 s, a symbol error a second; the counter is read every 15 s,
    # and the attempt's last minute (10:00 to its end) holds the reads up to 10:45: 585.
    assert (degraded.host, degraded.ib_errors) == (nodes[2], 585)
    assert links.erring_hosts() == [degraded]
    assert links.low_infiniband() == [degraded]
    assert [h.ib_errors for h in links.hosts[:2]] == [0, 0]
    total = NodeLinkMinute.objects.filter(host=nodes[2]).aggregate(total=Sum("ib_errors"))
    assert total["total"] == 597  # the counter's last read, at 11:00, after the work's end
    assert {g.nvlink_bytes_s > 0 for g in links.gpus} == {True}
    assert sorted((s.rank, s.host, s.cause) for s in detected(attempt, paths)) == [
        (4, nodes[2], Cause.NETWORK),
        (5, nodes[2], Cause.NETWORK),
    ]


def test_a_straggler_rank_outside_the_run_fails_its_submit_with_why(world):
    run = submit(
        world,
        gpus_per_node=2,
        env={"GANTRY_SIM_STRAGGLER": "slow_gpu", "GANTRY_SIM_STRAGGLER_RANK": "2"},
    )
    admission_run_cycle()
    attempt = run.attempts.get()

    attempt_submit(attempt_id=attempt.pk)

    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FAILED
    assert attempt.failure_message == (
        "GANTRY_SIM_STRAGGLER_RANK 2 is not a rank of the run's 2 GPUs (ranks 0 to 1)"
    )
    assert not SimulatedJob.objects.exists()
