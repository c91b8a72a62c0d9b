"""Reclaiming on Kubernetes, against the fake API server: pods not owned by Gantry that
wait for GPUs are in the inventory, and admission does not preempt a borrowed run for GPUs
such a pod would be bound to first (issue 31, point 4; docs/kubernetes.md, "Reclaiming")."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from clusters.backends import PendingClaim
from clusters.models import Cluster
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, Run, RunState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_submit
from tenants.models import Quota
from tests.clusters.backends import test_k8s_backend as k8s_tests
from tests.clusters.backends.test_k8s_backend import A100, TOKEN_ENV, backend
from tests.conftest import experiment_input, reserved_ending

fake = k8s_tests.fake


def test_the_inventory_reads_the_pods_from_outside_gantry_waiting_for_gpus(fake):
    fake.controller.add_node("a100-0", product=A100, gpus=8)
    fake.controller.add_node("a100-1", product=A100, gpus=8)
    pod = fake.controller.add_pod
    pod("train-0", namespace="research", node=None, gpus=8, phase="Pending")
    pod("slice", namespace="notebooks", node=None, gpus=2, resource="nvidia.com/mig-1g.10gb",
        phase="Pending")  # fmt: skip
    pod("cpu-only", namespace="research", node=None, phase="Pending")
    pod("ours", namespace="gantry-nlp", node=None, gpus=8, phase="Pending",
        labels={"gantry.io/attempt": "9"})  # fmt: skip
    pod("running", namespace="research", node="a100-0", gpus=4)
    gated = pod("gated", namespace="research", node=None, gpus=8, phase="Pending")
    gated["spec"]["schedulingGates"] = [{"name": "example.org/quota"}]
    fake.store.replace("pods", "research", "gated", gated)
    pinned = pod("pinned", namespace="research", node=None, gpus=4, phase="Pending")
    pinned["spec"] |= {"nodeSelector": {"kubernetes.io/hostname": "a100-1"}, "priority": 100}
    fake.store.replace("pods", "research", "pinned", pinned)
    fake.server.requests.clear()

    inventory = backend(fake).inventory()

    assert inventory.claims == (
        PendingClaim("pod research/pinned", "a100-80gb", 1, 4, 100, eligible=("a100-1",)),
        PendingClaim("pod notebooks/slice", "a100-1g.10gb", 1, 2, 0),
        PendingClaim("pod research/train-0", "a100-80gb", 1, 8, 0),
    )
    assert [(r.path, r.query.get("fieldSelector")) for r in fake.server.requests] == [
        ("/api/v1/nodes", None),
        ("/api/v1/pods", "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
        ("/api/v1/pods", "spec.nodeName=,status.phase=Pending"),
    ]


@pytest.fixture
def k8s_world(world, fake):
    """The world of tests/conftest.py on a Kubernetes cluster of two A100 nodes of 8 GPUs
    instead of the simulator; nlp may only borrow A100s."""
    Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
    fake.controller.add_node("a100-0", product=A100, gpus=8)
    fake.controller.add_node("a100-1", product=A100, gpus=8)
    world.k8s = Cluster.objects.create(
        name="k8s-1",
        backend=Cluster.Backend.KUBERNETES,
        settings={
            "url": fake.url,
            "token_env": TOKEN_ENV,
            "timeout_s": 5,
            "flavors": {"a100-80gb": {"product": A100}},
        },
    )
    cluster_refresh_inventory(cluster=world.k8s)
    Quota.objects.filter(tenant=world.nlp, flavor=world.a100).update(
        guaranteed_gpus=0, borrow_limit_gpus=16
    )
    return world


def test_no_preemption_for_gpus_an_outside_pod_would_be_bound_to_first(k8s_world, fake):
    world = k8s_world
    # Given nlp's borrowed 2 x 8 running on both nodes,
    nlp = run_submit(
        user=world.researcher_b,
        data=experiment_input(world, tenant="nlp", project="llm", nodes=2, gpus_per_node=8),
    )
    admission_run_cycle()
    attempt_submit(attempt_id=Attempt.objects.get(run=nlp).pk)
    for _ in range(10):
        fake.controller.advance(1)
        cluster_sync(cluster=world.k8s)
    nlp.refresh_from_db()
    assert (nlp.state, nlp.borrowed) == (RunState.RUNNING, True)
    # and a pod of another team waiting for 8 GPUs,
    fake.controller.add_pod("train-0", namespace="research", node=None, gpus=8, phase="Pending")
    cluster_refresh_inventory(cluster=world.k8s)
    assert Cluster.objects.get(pk=world.k8s.pk).outside_claims["claims"] == [
        {"job": "pod research/train-0", "flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 8,
         "eligible": []}
    ]  # fmt: skip
    # (which a platform admin reads on the cluster's admin page)
    admin = Client()
    admin.force_login(User.objects.create_superuser("root", "root@gantry.example", "x" * 16))
    page = admin.get(reverse("admin:clusters_cluster_change", args=[world.k8s.pk]))
    assert "pod research/train-0" in page.content.decode()

    # when vision asks for 1 x 8 within its guarantee, nlp keeps its GPUs and vision waits,
    vision = run_submit(user=world.researcher_a, data=experiment_input(world, gpus_per_node=8))
    admission_run_cycle()
    vision.refresh_from_db()
    assert (vision.state, vision.wait_reason, Run.objects.get(pk=nlp.pk).state) == (
        RunState.QUEUED,
        "CAPACITY",
        RunState.RUNNING,
    )
    assert vision.wait_message == (
        "preempting 1 borrowed run on k8s-1 would free 16 a100-80gb GPUs, but pod "
        "research/train-0 from outside Gantry (1 × 8 a100-80gb GPUs) waits for them and k8s-1 "
        "would start it first; this run waits until that job has started elsewhere or GPUs "
        "free up without a preemption" + reserved_ending([nlp], ["a100-0"], cluster="k8s-1")
    )

    # until the pod is gone: then the guarantee is reclaimed.
    fake.store.delete("pods", "research", "train-0", None)
    cluster_refresh_inventory(cluster=world.k8s)
    admission_run_cycle()
    assert (Run.objects.get(pk=nlp.pk).state, Run.objects.get(pk=vision.pk).state) == (
        RunState.PREEMPTED,
        RunState.ADMITTED,
    )
