"""Issue 34, acceptance 8, on the real Slurm 22.05 test cluster (``scripts/slurm-cluster.sh``,
the fixtures of tests/clusters/backends/test_slurm_cluster.py): a DCGM fault sample for a GPU
of gpu-node2 drains gpu-node2 with Gantry's reason within one sync; the attempt running there
is requeued onto gpu-node1 from its checkpoint; no job starts on gpu-node2; a person's return
to service undrains it.

Everything goes through Gantry's tasks and services: the telemetry task scrapes the nodes'
dcgm-exporters (served here on 127.0.0.1, as the cluster's ``telemetry`` settings name
them), the periodic sync task (``jobs.tasks.sync_all_clusters``) acts on the quarantine, and
what Gantry enqueues (the cancel, the admission cycle, the submit) runs as a worker would run
it (``tests.clusters.node_health_support.Worker``). The job reports its checkpoint to the
attempt API with its own token.
"""

import os
import time
from datetime import UTC, datetime

import pytest
from django.conf import settings

from clusters.health import NodeHealth
from clusters.models import ClusterNode, NodeHealthEvent
from clusters.services.health import cluster_health_policy_set, node_release
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunState
from jobs.selectors.logs import run_logs
from jobs.services.submission import run_submit
from jobs.tasks import sync_all_clusters
from telemetry.tasks import telemetry_collect
from tests import prometheus_support
from tests.clusters.backends import test_slurm_cluster as cluster_tests
from tests.clusters.backends.test_slurm_cluster import (
    IDLE_NODES,
    OUTSIDE_JOB,
    cluster_quiet,
    refresh_until,
    slurm,
)
from tests.clusters.node_health_support import Worker, checkpoint_report, exporter_body
from tests.conftest import experiment_input
from tests.prometheus_support import Route

# A database test in the worker that has the cluster (one cluster on the machine).
pytestmark = cluster_tests.pytestmark

# The session's cluster and the Slurm-backed world on it; the fake exporter.
slurm_env = cluster_tests.slurm_env
accounts = cluster_tests.accounts
unique_attempt_ids = cluster_tests.unique_attempt_ids
slurm_world = cluster_tests.slurm_world
cluster_restored = cluster_tests.cluster_restored
exporter = prometheus_support.exporter

CHECKPOINT = "s3://ckpt/vision/e2e/step-500"
# The job keeps its token where the test can post its checkpoint with it (as the SDK
# would, from inside the job); the first attempt runs until it is taken off, the resumed
# one says where it resumed from and ends.
COMMAND = (
    'umask 077; printf %s "$GANTRY_ATTEMPT_TOKEN" > {tokens}/"$SLURM_JOB_NAME"; '
    'echo "on $SLURMD_NODENAME from ${{GANTRY_RESUME_FROM:-the start}}"; '
    'if [ -z "$GANTRY_RESUME_FROM" ]; then sleep 300; else sleep 2; fi'
)


def sinfo(node: str) -> str:
    """State and reason of ``node`` in partition gpu, as ``sinfo -o "%T|%E"`` says them."""
    return slurm("sinfo", "-h", "-N", "-p", "gpu", "-n", node, "-o", "%T|%E").strip()


def poll(what, until, *, timeout: float = 60, every: float = 0.5):
    """``what()`` until ``until(value)``, at most ``timeout`` seconds; the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if until(value) or time.monotonic() > deadline:
            return value
        time.sleep(every)


def syncs_until(worker: Worker, run: Run, states: set[str], *, timeout: float = 60) -> None:
    """Periodic syncs, as beat runs them, until the run is in one of ``states``."""
    deadline = time.monotonic() + timeout
    while Run.objects.get(pk=run.pk).state not in states:
        assert time.monotonic() < deadline, Run.objects.get(pk=run.pk).state
        worker.call(sync_all_clusters)
        time.sleep(0.25)


def gpu_node1_busy_from_outside() -> str:
    """One GPU of gpu-node1 held by a job from outside Gantry: a run of 8 GPUs fits only on
    gpu-node2. Cancelled by ``cluster_restored`` whatever happens."""
    gpu_type = os.environ.get("GANTRY_SLURM_GPU_TYPE", "a100")
    job = slurm(
        "sbatch", "--parsable", f"--job-name={OUTSIDE_JOB}", "--account=research",
        "--nodelist=gpu-node1", f"--gres=gpu:{gpu_type}:1", "--output=/dev/null",
        "--wrap", "sleep 300",
    ).strip()  # fmt: skip
    state = poll(lambda: slurm("squeue", "-h", "-j", job, "-o", "%T").strip(), "RUNNING".__eq__)
    assert state == "RUNNING"
    return job


@pytest.fixture
def jobs_cancelled(slurm_world):
    """The test's Gantry jobs still on the cluster are cancelled, pass or fail."""
    yield
    names = {attempt.name for attempt in Attempt.objects.all()}
    out = slurm("squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%i %j")
    ids = [line.split()[0] for line in out.splitlines() if line.split()[1] in names]
    if ids:
        slurm("scancel", *ids)


def test_a_dcgm_fault_drains_gpu_node2_and_its_run_resumes_on_gpu_node1(
    slurm_world,
    cluster_restored,
    jobs_cancelled,
    exporter,
    tmp_path,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    cluster_quiet()  # the run is placed by what is free: nothing of an earlier test is
    world = slurm_world
    worker = Worker(monkeypatch, django_capture_on_commit_callbacks)
    # Each node's dcgm-exporter, named in the cluster's telemetry settings.
    nodes = ("gpu-node1", "gpu-node2")
    targets = [exporter.serve(f"/{node}", Route(exporter_body(node))) for node in nodes]
    cluster = world.slurm
    cluster.settings = {**cluster.settings, "telemetry": {"source": "dcgm", "targets": targets}}
    cluster.save(update_fields=["settings"])
    # Two nodes: the default share (0.25) lets the policy quarantine none on its own.
    cluster_health_policy_set(
        cluster=cluster, actor=world.platform_admin, raw={"max_quarantined_share": 0.5}
    )
    telemetry_collect(cluster.pk)  # every GPU healthy: the baseline
    refresh_until(world, IDLE_NODES)  # after a restart, until both slurmd answer again

    outside = gpu_node1_busy_from_outside()
    refresh_until(world, {**IDLE_NODES, "gpu-node1": (8, 1, 0, True, "", ["spine", "leaf1"])})
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    run = worker.call(
        run_submit,
        user=world.researcher_a,
        data=experiment_input(world, gpus_per_node=8, command=COMMAND.format(tokens=tokens)),
    )
    worker.run()  # the admission cycle, then the submit
    first = Attempt.objects.get(run=run)
    assert (first.placement, first.state) == (["gpu-node2"], AttemptState.PENDING)
    # Running on gpu-node2; gpu-node1 is free again for the requeue.
    syncs_until(worker, run, {RunState.RUNNING})
    first.refresh_from_db()
    assert (first.state, first.node_list) == (AttemptState.RUNNING, ["gpu-node2"])
    slurm("scancel", outside)
    token_file = tokens / first.name
    assert poll(token_file.exists, bool), "the job never wrote its token"
    reported = checkpoint_report(token_file.read_text(), step=500, uri=CHECKPOINT, ts=time.time())
    assert reported == {
        "accepted": 1,
        "duplicates": 0,
        "rejected": 0,
        "refused": {},
        "messages": [],
    }

    # The fault: GPU 1 of gpu-node2 falls off the bus (XID 79), scraped by the telemetry task.
    exporter.serve("/gpu-node2", Route(exporter_body("gpu-node2", xid={1: 79})))
    telemetry_collect(cluster.pk)
    fault = NodeHealthEvent.objects.get(cluster=cluster, node="gpu-node2", signal="gpu_lost")
    assert (fault.source, fault.gpu, fault.code, fault.detail, fault.action) == (
        "dcgm",
        "1",
        "79",
        "XID 79 GPU has fallen off the bus",
        "quarantine",
    )
    node2 = ClusterNode.objects.get(cluster=cluster, name="gpu-node2")
    assert (node2.health, node2.fenced_at) == (NodeHealth.QUARANTINED, None)
    assert sinfo("gpu-node2") == "mixed|none"  # Gantry decided; the backend is told next

    # ONE periodic sync: drained on Slurm, and the run taken off the node.
    started = time.monotonic()
    worker.call(sync_all_clusters)
    synced_s = time.monotonic() - started
    drained = sinfo("gpu-node2")
    drain_seen = time.time()
    latency_s = drain_seen - fault.observed_at.timestamp()
    state, reason = drained.split("|")
    # Draining while the job Gantry is taking off still runs there, drained once it is gone.
    assert state in ("draining", "drained")
    assert reason == f"gantry: {node2.health_reason}"  # once: the push says "gantry:" too
    assert latency_s < settings.GANTRY_SYNC_INTERVAL_S + synced_s
    first.refresh_from_db()
    assert first.cause_class == "hardware"
    assert first.cause_evidence == {
        "node": "gpu-node2",
        "gpu": "1",
        "signal": "gpu_lost",
        "code": "79",
        "at": fault.observed_at.isoformat(),
        "detail": "XID 79 GPU has fallen off the bus",
    }
    run.refresh_from_db()
    assert (run.state, run.excluded_nodes) == (RunState.PREEMPTED, ["gpu-node2"])
    assert worker.sent == [("jobs.tasks.attempt_cancel", (first.pk,))]

    # The worker cancels the job; the sync that sees it gone puts the run back in the queue.
    assert worker.run_next() == ("jobs.tasks.attempt_cancel", (first.pk,))
    syncs_until(worker, run, {RunState.QUEUED})
    run.refresh_from_db()
    first.refresh_from_db()
    assert (run.state, run.excluded_nodes, first.state) == (
        RunState.QUEUED,
        ["gpu-node2"],
        AttemptState.PREEMPTED,
    )
    assert first.cause_class == "hardware"
    assert poll(lambda: sinfo("gpu-node2"), lambda s: s.startswith("drained|")) == (
        f"drained|{reason}"
    )

    # The next admission cycle places it on gpu-node1, resuming from the checkpoint.
    ran = worker.run()
    second = Attempt.objects.get(run=run, number=2)
    assert ran == [("jobs.tasks.admission_cycle", ()), ("jobs.tasks.attempt_submit", (second.pk,))]
    assert second.placement == ["gpu-node1"]
    assert second.resumed_from == Checkpoint.objects.get(run=run, step=500, uri=CHECKPOINT)
    lines = second.rendered_spec.splitlines()
    assert "#SBATCH --nodelist=gpu-node1" in lines
    assert "#SBATCH --exclude=gpu-node2" in lines
    syncs_until(worker, run, {RunState.SUCCEEDED, RunState.FAILED})
    run.refresh_from_db()
    second.refresh_from_db()
    assert (run.state, second.node_list) == (RunState.SUCCEEDED, ["gpu-node1"])
    assert f"on gpu-node1 from {CHECKPOINT}" in run_logs(run=run).splitlines()
    assert run.restarts == 0  # not counted against the researcher's max_restarts
    assert list(
        run.events.filter(to_state__in=[RunState.PREEMPTED, RunState.QUEUED]).values_list(
            "to_state", "message"
        )
    ) == [
        ("QUEUED", "Submitted"),
        (
            "PREEMPTED",
            "Taken off its nodes: node gpu-node2 was quarantined by Gantry (GPU 1: XID 79 GPU has "
            "fallen off the bus); it resumes from its latest checkpoint on other nodes, not "
            "counted against your restarts",
        ),
        ("QUEUED", "Back in the queue after preemption; it will resume from checkpoint step 500"),
    ]
    job = second.backend_job_id
    record = cluster_tests.sacct_row(job)
    assert (record["JobName"], record["NodeList"]) == (second.name, "gpu-node1")
    # No job started on gpu-node2 since the fault, Gantry's or anyone's. sacct says starts
    # to the second, so the first attempt, started before the fault, can share its second.
    since = int(fault.observed_at.timestamp())
    monkeypatch.setenv("TZ", "UTC")  # sacct reads -S in local time
    on_node2 = slurm(
        "sacct", "-X", "-n", "-P", "-a", "-N", "gpu-node2", "-S",
        f"{datetime.fromtimestamp(since, UTC):%Y-%m-%dT%H:%M:%S}", "-E", "now",
        "-o", "JobIDRaw,JobName,Start",
    )  # fmt: skip
    started_there = [
        line
        for line in on_node2.splitlines()
        if int(line.split("|")[2]) >= since and line.split("|")[0] != first.backend_job_id
    ]
    assert started_there == []
    assert sinfo("gpu-node2").startswith("drained|gantry: ")

    # A person returns it to service; the next sync undrains it.
    node_release(
        cluster=cluster,
        node="gpu-node2",
        actor=world.platform_admin,
        note="GPU 1 reseated; dcgmi diag -r 3 passed",
    )
    worker.call(sync_all_clusters)
    assert poll(lambda: sinfo("gpu-node2"), "idle|none".__eq__) == "idle|none"
    node2.refresh_from_db()
    assert (node2.health, node2.fenced_at, node2.fence_error) == (NodeHealth.HEALTHY, None, "")
    assert list(
        NodeHealthEvent.objects.filter(cluster=cluster, node="gpu-node2")
        .order_by("recorded_at", "pk")
        .values_list("signal", "action", "actor__username", "note", "detail")
    ) == [
        ("gpu_lost", "quarantine", None, "", "XID 79 GPU has fallen off the bus"),
        ("fence", "fenced", None, "", reason),
        ("release", "release", "paul", "GPU 1 reseated; dcgmi diag -r 3 passed", ""),
        ("unfence", "unfenced", None, "", ""),
    ]
    print(
        f"\nfault-to-drain: {latency_s:.2f} s from the sample ({fault.observed_at:%H:%M:%S.%f} "
        f"UTC) to sinfo showing gpu-node2 {state}; the sync took {synced_s:.2f} s (every "
        f"{settings.GANTRY_SYNC_INTERVAL_S} s); {datetime.now(UTC):%H:%M:%S}"
    )
