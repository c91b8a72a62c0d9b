"""The simulator backend's faults and fences (clusters/backends/simulator.py): a job on a GPU
that faults fails at that instant with the reason a real job would get; a throttled GPU
slows its job; a fenced node takes no new job, says why in the inventory, and the fence is
the database's, so every process agrees; bad fault settings refuse the cluster, saying why.
And the simulated exporter reports the faults' gauges."""

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.backends import BackendError, JobRef, JobSpec, PermanentBackendError, backend_for
from clusters.health import SignalClass
from clusters.models import Cluster, ClusterNode, SimulatedFence, SimulatedJob
from clusters.services import cluster_refresh_inventory
from clusters.sim_faults import Lemon, lemon_phase_s
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from telemetry.simulator_source import SimulatorSource
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

NODE0, NODE1 = "sim-1-a100-80gb-00", "sim-1-a100-80gb-01"
SAMPLE = re.compile(
    r'(?P<metric>\w+)\{gpu="(?P<gpu>\d+)",UUID="[^"]+",Hostname="(?P<host>[^"]+)"\} '
    r"(?P<value>\S+) (?P<ts>\d+)"
)
LEMON = {"class": "ecc_uncorrectable", "every_s": 7200, "gpu": 1}


def spec(name: str, *, gpus: int = 8, duration_s: int = 2_000_000, **extra) -> JobSpec:
    return JobSpec(
        name=name, attempt_id=1, run_id=1, tenant="vision", project="detection",
        image="registry.example.org/ml/pytorch@sha256:" + "a" * 64, command="python train.py",
        env={"GANTRY_SIM_DURATION_S": str(duration_s)}, flavor="a100-80gb", nodes=1,
        gpus_per_node=gpus, max_runtime_s=86400, **extra,
    )  # fmt: skip


def with_faults(cluster: Cluster, faults: dict) -> Cluster:
    cluster.settings = {**cluster.settings, "faults": faults}
    cluster.save(update_fields=["settings"])
    return cluster


def lemon_fault_at(every_s: int = 7200) -> datetime:
    """The lemon's first fault after 2027-01-01 00:00 UTC (seed 0)."""
    base = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    phase = lemon_phase_s(NODE0, Lemon(SignalClass.ECC_UNCORRECTABLE, every_s, 1), 0)
    return datetime.fromtimestamp(base - base % every_s + phase + every_s, tz=UTC)


def test_a_job_on_a_faulty_gpu_fails_at_the_fault_with_its_xid(world):
    cluster = with_faults(world.cluster, {"lemons": {NODE0: LEMON}})
    fault_at = lemon_fault_at()
    with time_machine.travel(fault_at - timedelta(minutes=10), tick=False) as clock:
        backend = backend_for(cluster)
        backend.submit(spec("gantry-a2", gpus=1, placement=(NODE0,)))  # GPU 0: not hit
        backend.submit(spec("gantry-a3", gpus=2, placement=(NODE0,)))  # GPU 1, the lemon's
        backend.sync([])
        assert [job.allocation for job in SimulatedJob.objects.order_by("name")] == [
            {NODE0: [0]}, {NODE0: [1, 2]},
        ]  # fmt: skip
        clock.move_to(fault_at + timedelta(minutes=1))
        statuses = backend_for(cluster).sync([JobRef("gantry-a2"), JobRef("gantry-a3")])
    hit = statuses["gantry-a3"]
    assert (hit.state, hit.failure_reason, hit.exit_code, hit.finished_at) == (
        "FAILED", "GPU_XID", 1, fault_at,
    )  # fmt: skip
    assert hit.message == (
        f"XID 48 (Double Bit ECC Error) on GPU 1 of {NODE0}: the job's processes exited"
    )
    assert hit.node_list == [NODE0]
    # Its checkpoints stop at the fault: the last is at most 300 simulated seconds before.
    assert hit.checkpoints[-1].saved_at <= fault_at
    assert statuses["gantry-a2"].state == "RUNNING"  # on GPU 0 of the same node


def test_a_lost_gpu_takes_its_node_and_every_job_on_it_down(world):
    cluster = with_faults(world.cluster, {"lemons": {NODE0: {**LEMON, "class": "gpu_lost"}}})
    fault_at = lemon_fault_at()
    with time_machine.travel(fault_at - timedelta(minutes=10), tick=False) as clock:
        backend = backend_for(cluster)
        backend.submit(spec("gantry-a2", gpus=1, placement=(NODE0,)))  # GPU 0
        backend.sync([])
        clock.move_to(fault_at + timedelta(seconds=1))
        [status] = backend_for(cluster).sync([JobRef("gantry-a2")]).values()
    assert (status.state, status.failure_reason, status.exit_code, status.finished_at) == (
        "FAILED", "NODE_FAILURE", 137, fault_at,
    )  # fmt: skip
    assert status.message.startswith("XID 79 (GPU has fallen off the bus) on GPU 1 of")


def test_a_job_that_ends_before_the_fault_is_not_hit(world):
    cluster = with_faults(world.cluster, {"lemons": {NODE0: LEMON}})
    fault_at = lemon_fault_at()
    with time_machine.travel(fault_at - timedelta(seconds=10), tick=False) as clock:
        backend = backend_for(cluster)
        # 600 simulated seconds + 30 of start-up at 1000x: 0.63 s of wall time.
        backend.submit(spec("gantry-a1", duration_s=600, placement=(NODE0,)))
        backend.sync([])
        clock.move_to(fault_at + timedelta(minutes=1))
        [status] = backend_for(cluster).sync([JobRef("gantry-a1")]).values()
    assert (status.state, status.exit_code) == ("SUCCEEDED", 0)


def test_a_throttled_gpu_slows_its_job_to_half_speed(world):
    cluster = with_faults(world.cluster, {"throttled": {NODE0: {"gpu": 0, "reasons": 64}}})
    start = datetime(2027, 1, 1, tzinfo=UTC)
    with time_machine.travel(start, tick=False) as clock:
        backend = backend_for(cluster)
        backend.submit(spec("gantry-a1", duration_s=600, placement=(NODE0,)))
        backend.submit(spec("gantry-a2", duration_s=600, placement=(NODE1,)))
        backend.sync([])
        assert SimulatedJob.objects.get(name="gantry-a1").profile["speed"] == 0.5
        clock.move_to(start + timedelta(seconds=1))
        statuses = backend.sync([JobRef("gantry-a1"), JobRef("gantry-a2")])
        assert (statuses["gantry-a1"].state, statuses["gantry-a2"].state) == (
            "RUNNING", "SUCCEEDED",
        )  # fmt: skip
        clock.move_to(start + timedelta(seconds=2))
        statuses = backend.sync([JobRef("gantry-a1")])
    # 630 simulated seconds at 1000x, half speed: 1.26 s instead of 0.63 s.
    assert statuses["gantry-a1"].finished_at == start + timedelta(seconds=1.26)
    assert statuses["gantry-a1"].message == (
        "compute-bound workload ended: 10.5 min of simulated work in 1 s "
        "(500× faster than real time)"
    )


def test_a_fenced_node_takes_no_new_job_and_the_inventory_says_why(world):
    backend = backend_for(world.cluster)
    backend.fence(NODE0, "quarantined: XID 79 (GPU has fallen off the bus) on GPU 3")
    backend.fence(NODE0, "quarantined: XID 79 (GPU has fallen off the bus) on GPU 3")
    [fence] = SimulatedFence.objects.all()
    first_fenced_at = fence.fenced_at
    # Another process (a new backend) sees it: admission's inventory is the database's.
    cluster_refresh_inventory(cluster=world.cluster)
    node = ClusterNode.objects.get(name=NODE0)
    assert (node.schedulable, node.reason) == (
        False, "gantry: quarantined: XID 79 (GPU has fallen off the bus) on GPU 3",
    )  # fmt: skip
    backend = backend_for(world.cluster)
    for index in range(4):  # a whole node each: three other nodes, then a wait
        backend.submit(spec(f"gantry-a{index}"))
    backend.submit(spec("gantry-p", placement=(NODE0,)))
    backend.sync([])
    jobs = {job.name: job for job in SimulatedJob.objects.all()}
    assert sorted(node for job in jobs.values() for node in job.allocation) == [
        "sim-1-a100-80gb-01", "sim-1-a100-80gb-02", "sim-1-a100-80gb-03",
    ]  # fmt: skip
    assert (jobs["gantry-a3"].state, jobs["gantry-a3"].message) == (
        "PENDING", "waiting for free GPUs",
    )  # fmt: skip
    assert jobs["gantry-p"].message == (
        f"waiting for GPUs on its nodes: {NODE0} is drained: gantry: quarantined: XID 79 "
        "(GPU has fallen off the bus) on GPU 3"
    )
    assert SimulatedFence.objects.get().fenced_at == first_fenced_at  # idempotent

    backend.unfence(NODE0)
    backend.unfence(NODE0)
    backend.sync([])
    assert SimulatedJob.objects.get(name="gantry-a3").allocation == {NODE0: list(range(8))}
    assert [n.schedulable for n in ClusterNode.objects.filter(name=NODE0)] == [False]
    cluster_refresh_inventory(cluster=world.cluster)
    node.refresh_from_db()
    assert (node.schedulable, node.reason) == (True, "")
    with pytest.raises(BackendError, match=r"^cluster sim-1 has no node named sim-1-x$"):
        backend.fence("sim-1-x", "nope")
    with pytest.raises(BackendError, match=r"^cluster sim-1 has no node named sim-1-x$"):
        backend.unfence("sim-1-x")


def test_a_job_is_not_started_on_its_excluded_nodes(world):
    backend = backend_for(world.cluster)
    backend.submit(spec("gantry-a1", excluded_nodes=(NODE0, NODE1)))
    backend.sync([])
    assert SimulatedJob.objects.get().allocation == {"sim-1-a100-80gb-02": list(range(8))}


def test_bad_fault_settings_refuse_the_cluster_saying_which(world):
    cluster = with_faults(world.cluster, {"rates_per_node_day": {"gpu_lots": 1}})
    message = (
        "cluster sim-1: faults.rates_per_node_day.gpu_lots: the simulator cannot inject "
        "'gpu_lots'; it injects gpu_lost, ecc_uncorrectable, nvlink, gpu_reset_needed, "
        "row_remap_failure, ecc_page_retirement, xid_application, xid_unknown"
    )
    with pytest.raises(PermanentBackendError) as error:
        backend_for(cluster).inventory()
    assert str(error.value) == message
    with pytest.raises(PermanentBackendError):
        cluster_refresh_inventory(cluster=cluster)
    cluster.refresh_from_db()
    assert cluster.inventory_error == message
    assert ClusterNode.objects.filter(cluster=cluster).count() == 6  # unchanged


def test_the_simulated_exporter_reports_the_last_xid_and_the_clock_event_reasons(world):
    # Once a day: the XID of the day before is no longer held (6 hours).
    daily = {**LEMON, "every_s": 86400}
    cluster = with_faults(
        world.cluster,
        {"lemons": {NODE0: daily}, "throttled": {NODE1: {"gpu": 2, "reasons": 64}}},
    )
    fault_at = lemon_fault_at(86400)
    start_ms = int(fault_at.timestamp() * 1000) - 30_000
    result = SimulatorSource(cluster).fetch(start_ms=start_ms, end_ms=start_ms + 60_000)
    [scrape] = result
    # Read as text: the clock-event reasons are a metric the parser may not keep yet.
    lines = [SAMPLE.fullmatch(line) for line in scrape.body.decode().splitlines()]
    found = sorted(
        (m["metric"], m["host"], m["gpu"], int(m["ts"]) - start_ms, float(m["value"]))
        for m in lines
        if m is not None
    )
    assert len(found) == len(lines)
    first_tick = -start_ms % 15_000
    assert found == sorted(
        [("DCGM_FI_DEV_XID_ERRORS", NODE0, "1", ms, 48.0)
         for ms in range(first_tick, 60_000, 15_000) if ms >= 30_000]
        + [("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", NODE1, "2", ms, 64.0)
           for ms in range(first_tick, 60_000, 15_000)]
    )  # fmt: skip


def test_the_attempt_of_a_run_on_a_faulty_gpu_ends_with_the_faults_reason_and_time(world):
    cluster = with_faults(world.cluster, {"lemons": {NODE0: {**LEMON, "gpu": 0}}})
    fault_at = lemon_fault_at()
    with time_machine.travel(fault_at - timedelta(minutes=5), tick=False) as clock:
        run = run_submit(
            user=world.researcher_a,
            data=experiment_input(world, env={"GANTRY_SIM_DURATION_S": "2000000"}),
        )
        admission_run_cycle()
        attempt = run.attempts.get()
        attempt_submit(attempt_id=attempt.pk)
        cluster_sync(cluster=cluster)
        attempt.refresh_from_db()
        assert (attempt.state, attempt.node_list) == ("RUNNING", [NODE0])
        clock.move_to(fault_at + timedelta(seconds=30))
        cluster_sync(cluster=cluster)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.failure_reason, attempt.exit_code, attempt.finished_at) == (
        "FAILED", "GPU_XID", 1, fault_at,
    )  # fmt: skip
