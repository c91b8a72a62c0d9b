"""Admission by node, through the services and the simulator: a gang is admitted only where
its GPUs are free together, the placement reaches the backend, and every run that is not
running says why (issue 18)."""

from datetime import timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster, ClusterNode, SimulatedJob
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, AttemptState, Run, RunState, WaitReason
from jobs.selectors.capacity import quota_usage_list
from jobs.selectors.preview import admission_preview
from jobs.selectors.runs import runs_place_in_line
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from tenants.models import Quota
from tests.conftest import experiment_input, reserved_ending

A100 = "a100-80gb"


def submit(world, user=None, **overrides) -> Run:
    return run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))


def set_pool(world, flavor: str = A100, **fields) -> None:
    """Change the simulator's pool of ``flavor`` and read its inventory again."""
    cluster = Cluster.objects.get(pk=world.cluster.pk)
    pools = [dict(pool) for pool in cluster.settings["pools"]]
    for pool in pools:
        if pool["flavor"] == flavor:
            pool.update(fields)
    cluster.settings = {**cluster.settings, "pools": pools, "topology": ["block", "leaf"]}
    cluster.save(update_fields=["settings"])
    world.cluster = cluster
    cluster_refresh_inventory(cluster=cluster)


def node(index: int, flavor: str = A100) -> str:
    return f"sim-1-{flavor}-{index:02d}"


def waiting(run: Run) -> tuple[str, str, int | None]:
    run.refresh_from_db()
    runs_place_in_line([run])
    return run.wait_reason, run.wait_message, run.queue_position


def place_and_start(world, run: Run) -> Attempt:
    attempt = run.attempts.order_by("-number").first()
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    attempt.refresh_from_db()
    return attempt


# --- the fragmented pool of the issue ---------------------------------------------------------


@pytest.fixture
def fragmented(world):
    """4 A100 nodes of 8 GPUs, 2 of each used by jobs from outside Gantry: 24 free, 6 a node."""
    set_pool(world, outside={node(i): 2 for i in range(4)})
    Quota.objects.filter(flavor=world.a100).update(guaranteed_gpus=32)
    return world


def test_free_gpus_scattered_over_nodes_admit_no_full_node_gang_and_say_why(fragmented):
    world = fragmented
    one_node = submit(world, gpus_per_node=8)
    two_nodes = submit(world, user=world.researcher_b, tenant="nlp", project="llm", nodes=2,
                       gpus_per_node=8)  # fmt: skip

    summary = admission_run_cycle()

    assert (summary.admitted, summary.waiting) == (0, 2)
    # Each node with its own figure, and why the GPUs no run of Gantry's uses are not free.
    spread = "(" + ", ".join(f"{node(i)}: 6 (2 used from outside Gantry)" for i in range(4)) + ")"
    assert waiting(one_node) == (
        WaitReason.CAPACITY,
        f"needs 8 {A100} GPUs on one node; 24 {A100} GPUs are free, at most 6 on any node {spread}",
        1,
    )
    assert waiting(two_nodes) == (
        WaitReason.CAPACITY,
        f"needs 2 nodes × 8 {A100} GPUs; 24 {A100} GPUs are free, at most 6 on any node {spread}",
        2,
    )
    assert Attempt.objects.count() == 0


def test_small_runs_fit_between_the_outside_load_and_pack_onto_one_node(fragmented):
    world = fragmented
    runs = [submit(world, user=world.researcher_b, tenant="nlp", project="llm", gpus_per_node=2)
            for _ in range(3)]  # fmt: skip

    assert admission_run_cycle().admitted == 3

    placements = [Attempt.objects.get(run=run).placement for run in runs]
    assert placements == [[node(0)], [node(0)], [node(0)]]  # 6 free there: filled first
    nodes = {n.name: n.gpus_outside for n in ClusterNode.objects.filter(flavor=world.a100)}
    assert nodes == {node(i): 2 for i in range(4)}


def test_the_preview_never_says_start_for_a_run_that_cannot_be_placed(fragmented):
    world = fragmented
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor=A100, nodes=1, gpus_per_node=8
    )
    assert (preview.verdict, preview.idle, preview.in_use) == ("wait", 24, 0)
    assert preview.message == (
        f"Would wait: needs 8 {A100} GPUs on one node; 24 {A100} GPUs are free, at most 6 on "
        "any node ("
        + ", ".join(f"{node(i)}: 6 (2 used from outside Gantry)" for i in range(4))
        + ") (position 1)"
    )
    preview = admission_preview(
        user=world.researcher_a, tenant="vision", flavor=A100, nodes=2, gpus_per_node=6
    )
    assert (preview.verdict, preview.message) == (
        "start",
        f"Would start now on sim-1 ({node(0)}, {node(1)}), within the tenant's guarantee",
    )


def test_the_quota_page_counts_idle_gpus_as_admission_does(fragmented):
    world = fragmented
    submit(world, gpus_per_node=4)
    admission_run_cycle()

    quota = Quota.objects.select_related("tenant", "flavor").get(
        tenant=world.vision, flavor=world.a100
    )
    [usage] = quota_usage_list(quotas=[quota])

    assert (usage.in_use, usage.idle) == (4, 20)


# --- drained nodes, and the placement reaching the backend ------------------------------------


def test_a_drained_node_takes_nothing_and_is_named_in_the_reason(world):
    set_pool(world, drained={node(1): "bad DIMM", node(2): "bad DIMM", node(3): "bad DIMM"})
    first = submit(world, gpus_per_node=8)
    second = submit(world, gpus_per_node=8)

    admission_run_cycle()

    assert Attempt.objects.get(run=first).placement == [node(0)]
    assert waiting(second) == (
        WaitReason.CAPACITY,
        f"needs 8 {A100} GPUs on one node; 0 {A100} GPUs are free, at most 0 on any node "
        f"({node(0)}: 0, {node(1)}: takes no work (drained: bad DIMM), {node(2)}: takes no "
        f"work (drained: bad DIMM), {node(3)}: takes no work (drained: bad DIMM))"
        + reserved_ending([first], [node(0)]),
        1,
    )
    rows = ClusterNode.objects.filter(flavor=world.a100).order_by("name")
    assert [(n.name, n.schedulable, n.reason) for n in rows] == [
        (node(0), True, ""),
        (node(1), False, "drained: bad DIMM"),
        (node(2), False, "drained: bad DIMM"),
        (node(3), False, "drained: bad DIMM"),
    ]


def test_a_gang_starts_on_exactly_the_nodes_admission_chose(world):
    set_pool(world, outside={node(0): 8, node(2): 3})
    run = submit(world, nodes=2, gpus_per_node=4)

    admission_run_cycle()
    attempt = place_and_start(world, run)

    # 00 is full; 02 has 5 free, the best fit for 4 (1 left); then 01 or 03 (4 left): 01.
    assert attempt.placement == [node(1), node(2)]
    assert (attempt.state, attempt.node_list) == (AttemptState.RUNNING, [node(1), node(2)])
    assert '"nodes": 2' in attempt.rendered_spec
    job = SimulatedJob.objects.get(name=attempt.name)
    assert (sorted(job.allocation), job.placement) == ([node(1), node(2)], [node(1), node(2)])
    assert run.events.get(to_state=RunState.ADMITTED).message == (
        f"Admitted to sim-1 on {node(1)}, {node(2)}: 8 {A100} GPUs within its guarantee"
    )


def test_a_required_topology_level_holds_the_gang_to_one_domain(world):
    # Two blocks of two leaves, one node a leaf.
    set_pool(world, domains=[2, 2])
    with pytest.raises(ValidationError) as refused:
        submit(world, nodes=2, gpus_per_node=8, topology_level="leaf", topology_mode="required")
    assert refused.value.message_dict == {
        "nodes": [f"No single cluster has 2 nodes with 8 {A100} GPUs each in one leaf."]
    }
    with pytest.raises(ValidationError) as unknown:
        submit(world, topology_level="rack")
    assert unknown.value.message_dict == {
        "topology_level": [f"No cluster with {A100} GPUs has a 'rack' level (levels: block, leaf)."]
    }
    with pytest.raises(ValidationError) as no_level:
        submit(world, topology_mode="required")
    assert no_level.value.message_dict == {
        "topology_mode": ["Name the topology level that is required."]
    }

    set_pool(world, outside={node(1): 8})  # block 1 has one free node left
    run = submit(world, nodes=2, gpus_per_node=8, topology_level="block",
                 topology_mode="required")  # fmt: skip
    admission_run_cycle()

    assert Attempt.objects.get(run=run).placement == [node(2), node(3)]
    assert run.experiment.topology_required
    assert place_and_start(world, run).node_list == [node(2), node(3)]


def test_a_required_level_waits_for_room_in_one_domain_and_says_so(world):
    set_pool(world, domains=[2, 2], outside={node(1): 8, node(3): 8})  # one free node a block
    run = submit(world, nodes=2, gpus_per_node=8, topology_level="block",
                 topology_mode="required")  # fmt: skip

    admission_run_cycle()

    assert waiting(run) == (
        WaitReason.CAPACITY,
        f"needs 2 nodes × 8 {A100} GPUs in one block; 16 {A100} GPUs are free, at most 8 on any "
        f"node ({node(0)}: 8, {node(1)}: 0 (8 used from outside Gantry), {node(2)}: 8, "
        f"{node(3)}: 0 (8 used from outside Gantry))",
        1,
    )


# --- a placement the backend cannot honour ----------------------------------------------------


def test_a_run_the_backend_holds_says_so_and_is_placed_anew_after_the_grace(world, settings):
    settings.GANTRY_PLACEMENT_GRACE_S = 300
    run = submit(world, gpus_per_node=8)
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    assert attempt.placement == [node(0)]
    # Before the job reaches the simulator, jobs from outside Gantry take 4 GPUs of the node.
    set_pool(world, outside={node(0): 4})
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)

    run.refresh_from_db()
    attempt.refresh_from_db()
    pending = (
        f"Pending at Simulator (sim-1): waiting for GPUs on its nodes: {node(0)} has 4 of 8 "
        f"free; placed on {node(0)}"
    )
    assert (run.state, run.wait_reason, run.wait_message) == (
        RunState.PENDING,
        WaitReason.BACKEND,
        pending,
    )
    assert (attempt.state, attempt.node_list) == (AttemptState.PENDING, [])
    api = run_api(world, run)
    assert (api["wait_reason"], api["wait_message"]) == ("BACKEND", pending)

    with time_machine.travel(timezone.now() + timedelta(seconds=301), tick=False):
        cluster_sync(cluster=world.cluster)
        run.refresh_from_db()
        attempt.refresh_from_db()
        assert (run.state, run.cluster_id, attempt.state) == (
            RunState.QUEUED,
            None,
            AttemptState.CANCELLED,
        )
        assert run.events.last().reason == "REPLACED"
        assert run.events.last().message == (
            f"sim-1 had not started it on {node(0)} after 300 s (waiting for GPUs on its nodes: "
            f"{node(0)} has 4 of 8 free): back in the queue for a new placement"
        )
        assert SimulatedJob.objects.get(name=attempt.name).state == "CANCELLED"

        admission_run_cycle()
        second = run.attempts.get(number=2)
        assert second.placement == [node(1)]
        assert place_and_start(world, run).node_list == [node(1)]
    run.refresh_from_db()
    assert (run.state, run.wait_reason, run.wait_message) == (RunState.RUNNING, "", "")


def run_api(world, run: Run) -> dict:
    from django.test import Client

    client = Client()
    client.force_login(world.researcher_a)
    response = client.get(reverse("api:run-detail", args=[run.pk]))
    assert response.status_code == 200
    return response.json()


# --- inventory that cannot be trusted ---------------------------------------------------------


def test_a_stale_inventory_places_nothing_on_its_nodes(world):
    slurm = Cluster.objects.create(name="hpc-1", backend=Cluster.Backend.SLURM)
    seen = timezone.now() - timedelta(minutes=5)
    Cluster.objects.filter(pk=slurm.pk).update(
        inventory_at=seen, inventory_valid_until=seen + timedelta(seconds=60)
    )
    ClusterNode.objects.create(
        cluster=slurm, name="gpu-1", flavor=world.h100, gpus=8, updated_at=seen
    )
    run = submit(world, flavor="h100-80gb", gpus_per_node=8)
    Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)

    admission_run_cycle()

    assert waiting(run) == (
        WaitReason.CAPACITY,
        "needs 8 h100-80gb GPUs on one node; no h100-80gb node takes work now; node gpu-1 "
        f"takes no work (not seen by hpc-1's inventory since {seen:%Y-%m-%d %H:%M:%S} UTC)",
        1,
    )


def test_a_node_reporting_more_gpus_than_its_flavor_allows_is_left_out_and_named(world):
    set_pool(world, flavor="h100-80gb", gpus_per_node=40)

    cluster = Cluster.objects.get(pk=world.cluster.pk)
    assert cluster.inventory_problems == [
        "node sim-1-h100-80gb-00 reports 40 h100-80gb GPUs; a node has 1 to 16: left out",
        "node sim-1-h100-80gb-01 reports 40 h100-80gb GPUs; a node has 1 to 16: left out",
    ]
    assert not ClusterNode.objects.filter(flavor=world.h100).exists()
    with pytest.raises(ValidationError) as refused:
        submit(world, flavor="h100-80gb")
    assert refused.value.message_dict == {"flavor": ["No enabled cluster offers this GPU flavor."]}
