"""A reclaim on the real Slurm test cluster is not stolen by a job waiting in Slurm's queue.

The scenario of issue 31: nlp's borrowed 2×8 runs on both nodes, a job from outside Gantry
asking for the same 2×8 waits, and vision (within its guarantee) submits 1×8. Before,
Gantry cancelled nlp's job and Slurm started the outside job on the freed nodes. Now:
through slurmrestd (which cannot put a job first) admission does not preempt and says
why; through the CLI Gantry submits vision's job with top priority before cancelling nlp's,
and Slurm starts it on the freed node while the outside job still waits.

Uses the cluster of ``test_slurm_cluster`` (its fixtures; one cluster per session).
"""

import os
import time

import pytest
from django.conf import settings

from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.submission import run_submit
from tenants.models import Quota
from tests.clusters.backends import test_slurm_cluster as cluster_tests
from tests.clusters.backends.test_slurm_cluster import (
    IDLE_NODES,
    OUTSIDE_JOB,
    cluster,
    refresh_until,
    slurm,
    sync_until,
)
from tests.conftest import experiment_input, reserved_ending

# The session's cluster and the world on it, as test_slurm_cluster sets them up.
slurm_env = cluster_tests.slurm_env
accounts = cluster_tests.accounts
unique_attempt_ids = cluster_tests.unique_attempt_ids
slurm_world = cluster_tests.slurm_world
cluster_restored = cluster_tests.cluster_restored

pytestmark = [pytest.mark.django_db, pytest.mark.xdist_group("slurm-cluster")]


def nlp_end(job_id: str) -> int:
    """When Slurm ended the job, in epoch seconds (``slurm`` sets SLURM_TIME_FORMAT=%s)."""
    for _ in range(40):
        end = slurm("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "End").strip()
        if end.isdigit():
            return int(end)
        time.sleep(0.25)
    raise AssertionError(f"sacct has no end for job {job_id}")


def claims_once_planned(world, *, timeout: float = 15) -> dict:
    """The cluster's outside claims once Slurm's backfill gave the waiting job an expected
    start (a second or two after its submission: bf_interval=1)."""
    deadline = time.monotonic() + timeout
    while True:
        cluster_refresh_inventory(cluster=world.slurm)
        claims = Cluster.objects.get(pk=world.slurm.pk).outside_claims
        if all(c["expected_start"] for c in claims["next"]) or time.monotonic() > deadline:
            return claims
        time.sleep(0.5)


def squeue_state(job_id: str) -> str:
    return slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").strip()


def test_a_reclaim_is_not_stolen_by_an_outside_job_waiting_in_slurm(slurm_world, cluster_restored):
    world = slurm_world
    gpu_type = os.environ.get("GANTRY_SLURM_GPU_TYPE", "a100")
    Quota.objects.filter(tenant=world.nlp, flavor=world.a100).update(
        guaranteed_gpus=0, borrow_limit_gpus=16
    )
    refresh_until(world, IDLE_NODES)

    # Given nlp's borrowed 2 x 8 running on both nodes,
    nlp = run_submit(
        user=world.researcher_b,
        data=experiment_input(
            world, tenant="nlp", project="llm", nodes=2, gpus_per_node=8, command="sleep 300"
        ),
    )
    admission_run_cycle()
    nlp.refresh_from_db()
    assert (nlp.state, nlp.borrowed) == (RunState.ADMITTED, True)
    nlp_attempt = Attempt.objects.get(run=nlp)
    attempt_submit(attempt_id=nlp_attempt.pk)
    sync_until(world, [nlp], {RunState.RUNNING})
    # and a job from outside Gantry waiting in Slurm's queue for the same 2 x 8,
    outside = slurm(
        "sbatch", "--parsable", f"--job-name={OUTSIDE_JOB}", "--account=research", "--nodes=2",
        f"--gres=gpu:{gpu_type}:8", "--output=/dev/null", "--wrap", "sleep 30",
    ).strip()  # fmt: skip
    assert squeue_state(outside) == "PENDING"

    # when Gantry reads the cluster through slurmrestd, which cannot put a job first,
    Cluster.objects.filter(pk=world.slurm.pk).update(
        settings=cluster("slurm-test", transport="rest").settings
    )
    world.slurm.refresh_from_db()
    claims = claims_once_planned(world)
    assert {key: claims[key] for key in ("reclaim_first", "error", "claims")} == {
        "reclaim_first": False,
        "error": "",
        "claims": [
            {
                "job": f"Slurm job {outside}",
                "flavor": "a100-80gb",
                "nodes": 2,
                "gpus_per_node": 8,
                "eligible": [],
            }
        ],
    }
    [expected] = claims["next"]
    assert expected["job"] == f"Slurm job {outside}"
    assert expected["priority"] > 0 and expected["expected_start"] is not None

    # then vision's 1 x 8 within its guarantee waits, and nlp keeps its GPUs;
    started = time.monotonic()
    vision = run_submit(
        user=world.researcher_a,
        data=experiment_input(
            world, nodes=1, gpus_per_node=8, command='echo "on $SLURMD_NODENAME"; sleep 5'
        ),
    )
    admission_run_cycle()
    vision.refresh_from_db()
    nlp.refresh_from_db()
    assert (vision.state, vision.wait_reason, nlp.state) == (
        RunState.QUEUED,
        "CAPACITY",
        RunState.RUNNING,
    )
    assert vision.wait_message == (
        "preempting 1 borrowed run on slurm-test would free 16 a100-80gb GPUs, but Slurm job "
        f"{outside} from outside Gantry (2 × 8 a100-80gb GPUs) waits for them and slurm-test "
        "would start it first; this run waits until that job has started elsewhere or GPUs "
        "free up without a preemption" + reserved_ending([nlp], ["gpu-node1"], cluster="slurm-test")
    )

    # but through the CLI, as a Slurm operator, Gantry preempts nlp and puts vision first:
    Cluster.objects.filter(pk=world.slurm.pk).update(
        settings=cluster("slurm-test", transport="cli").settings
    )
    world.slurm.refresh_from_db()
    cluster_refresh_inventory(cluster=world.slurm)
    assert Cluster.objects.get(pk=world.slurm.pk).outside_claims["reclaim_first"] is True
    admission_run_cycle()
    admitted_s = time.monotonic() - started
    nlp.refresh_from_db()
    vision_attempt = Attempt.objects.get(run=vision)
    assert (nlp.state, vision_attempt.placement) == (RunState.PREEMPTED, ["gpu-node1"])
    nlp_attempt.refresh_from_db()
    assert nlp_attempt.preempted_for_id == vision_attempt.pk

    # nlp's cancel, if its task runs first, waits for vision's job to be in Slurm's queue;
    attempt_cancel(attempt_id=nlp_attempt.pk)
    nlp_job = nlp_attempt.backend_job_id
    assert squeue_state(nlp_job) == "RUNNING"
    attempt_submit(attempt_id=vision_attempt.pk)
    submitted_s = time.monotonic() - started
    vision_attempt.refresh_from_db()
    assert "#SBATCH --priority=TOP" in vision_attempt.rendered_spec.splitlines()
    assert squeue_state(vision_attempt.backend_job_id) == "PENDING"
    # then the cancel the submit sends takes nlp's job off both nodes.
    attempt_cancel(attempt_id=nlp_attempt.pk)
    cancelled_s = time.monotonic() - started

    # Within one sync, vision runs on the freed node and the outside job still waits.
    time.sleep(settings.GANTRY_SYNC_INTERVAL_S)
    cluster_sync(cluster=world.slurm)
    vision.refresh_from_db()
    vision_attempt.refresh_from_db()
    synced_s = time.monotonic() - started
    assert (vision.state, vision_attempt.node_list) == (RunState.RUNNING, ["gpu-node1"])
    assert squeue_state(outside) == "PENDING"
    nlp.refresh_from_db()
    assert nlp.state == RunState.QUEUED  # back in line, to resume when GPUs free up
    print(
        f"\nreclaim timeline, seconds after vision's submit: admitted {admitted_s:.2f} (two "
        f"cycles), its job in Slurm {submitted_s:.2f}, nlp's job cancelled {cancelled_s:.2f}, "
        f"vision seen running by the next sync {synced_s:.2f}; Slurm started vision's job "
        f"{vision_attempt.started_at.timestamp() - nlp_end(nlp_job):.0f} s after nlp's ended "
        "(whole seconds)"
    )
    sync_until(world, [vision], {RunState.SUCCEEDED, RunState.FAILED})
    assert Run.objects.get(pk=vision.pk).state == RunState.SUCCEEDED
