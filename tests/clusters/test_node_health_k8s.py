"""Issue 34, acceptance 8, on Kubernetes: the wire-level fake API server (tests/k8s_fake)
spoken to by the official client. A DCGM fault on node gpu-0 (a double-bit ECC error on the
GPU of the run's pod) cordons gpu-0 with Gantry's NoSchedule taint within one sync; the run
is requeued with gpu-0 excluded, its new pod keeps off gpu-0 (pinned to gpu-1 by Gantry's
placement, or, where Kueue places pods, by node affinity NotIn gpu-0) and runs on gpu-1 from
the checkpoint; a person's return to service uncordons gpu-0 and takes the taint off.

As on Slurm (tests/clusters/test_node_health_slurm.py): the telemetry task scrapes the nodes'
dcgm-exporters (served here on 127.0.0.1), the periodic sync task acts, and what Gantry
enqueues runs as a worker would. Gantry's clock follows the fake cluster's, which moves only
when told.
"""

import base64

import pytest
import time_machine

from clusters.backends.k8s_fence import CORDONED_ANNOTATION, REASON_ANNOTATION
from clusters.backends.k8s_manifest import token_secret_name
from clusters.health import NodeHealth
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from clusters.services import cluster_refresh_inventory
from clusters.services.health import cluster_health_policy_set, node_release
from jobs.models import Attempt, AttemptState, Checkpoint, Run, RunState
from jobs.services.submission import run_submit
from jobs.tasks import sync_all_clusters
from telemetry.tasks import telemetry_collect
from tests import prometheus_support
from tests.clusters.backends.test_k8s_backend import A100, TOKEN, TOKEN_ENV, settings_for
from tests.clusters.node_health_support import Worker, checkpoint_report, exporter_body
from tests.conftest import experiment_input
from tests.k8s_fake import FakeKubernetes
from tests.prometheus_support import Route

pytestmark = pytest.mark.django_db

exporter = prometheus_support.exporter

NAMESPACE = "gantry-vision"
CHECKPOINT = "s3://ckpt/vision/e2e/step-700"
GANTRY_TAINT = {"key": "gantry.io/node-health", "value": "quarantined", "effect": "NoSchedule"}
QUEUEING = {"pinned": {}, "kueue": {"queueing": "kueue", "kueue_queue": "gpu"}}


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeKubernetes(token=TOKEN) as fake:
        yield fake


class K8sWorld:
    """The cluster on the fake, its exporters, and Gantry's clock held to the fake's."""

    def __init__(self, world, fake, exporter, worker, queueing: str) -> None:
        self.world, self.fake, self.exporter, self.worker = world, fake, exporter, worker
        self.kueue = queueing == "kueue"
        Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
        self.nodes = ("gpu-0", "gpu-1")
        for node in self.nodes:
            fake.controller.add_node(node, product=A100, gpus=8)
        targets = [exporter.serve(f"/{node}", Route(exporter_body(node))) for node in self.nodes]
        self.cluster = Cluster.objects.create(
            name="k8s-1",
            backend=Cluster.Backend.KUBERNETES,
            settings=settings_for(
                fake,
                **QUEUEING[queueing],
                telemetry={"source": "dcgm", "targets": targets},
            ),
        )
        with self.now():
            cluster_refresh_inventory(cluster=self.cluster)

    def now(self):
        """Gantry's clock at the fake cluster's time (a backend whose times run ahead of
        Gantry's is not believed)."""
        return time_machine.travel(self.fake.controller.clock.now, tick=True)

    def step(self, seconds: float = 10.0) -> None:
        """The cluster moves on; then one periodic sync, and the worker's tasks."""
        self.fake.controller.advance(seconds)
        with self.now():
            self.worker.call(sync_all_clusters)
            self.worker.run()

    def step_until(self, run: Run, state: str, *, steps: int = 20, seconds: float = 10.0):
        for _ in range(steps):
            self.admit_suspended()
            self.step(seconds)
            run.refresh_from_db()
            if run.state == state:
                return
        raise AssertionError(f"run {run.pk} is {run.state} after {steps} syncs, not {state}")

    def admit_suspended(self) -> None:
        """What Kueue does with a job waiting in its queue: admit it."""
        if not self.kueue:
            return
        for job in self.fake.store.list("jobs", NAMESPACE)[0]:
            if job["spec"].get("suspend"):
                self.fake.controller.admit(NAMESPACE, job["metadata"]["name"])

    def node(self, name: str) -> dict:
        return self.fake.store.get("nodes", "", name)

    def pods(self, attempt: Attempt) -> list[dict]:
        return self.fake.controller.pods_of(NAMESPACE, attempt.name)

    def token(self, attempt: Attempt) -> str:
        """The attempt's token as the job reads it: from its Secret."""
        secret = self.fake.store.get("secrets", NAMESPACE, token_secret_name(attempt.name))
        return base64.b64decode(secret["data"]["GANTRY_ATTEMPT_TOKEN"]).decode()


@pytest.mark.parametrize("queueing", ["pinned", "kueue"])
def test_a_dcgm_fault_cordons_and_taints_the_node_and_the_pod_moves_to_the_other(
    world, fake, exporter, monkeypatch, django_capture_on_commit_callbacks, queueing
):
    worker = Worker(monkeypatch, django_capture_on_commit_callbacks)
    k8s = K8sWorld(world, fake, exporter, worker, queueing)
    cluster = k8s.cluster
    with k8s.now():
        cluster_health_policy_set(
            cluster=cluster, actor=world.platform_admin, raw={"max_quarantined_share": 0.5}
        )
        telemetry_collect(cluster.pk)  # every GPU healthy: the baseline
        run = worker.call(
            run_submit, user=world.researcher_a, data=experiment_input(world, gpus_per_node=8)
        )
        worker.run()  # the admission cycle, then the submit
    first = Attempt.objects.get(run=run)
    fake.controller.set_runtime(first.name, 3600)  # it would train for an hour
    k8s.step_until(run, RunState.RUNNING, seconds=1)
    first.refresh_from_db()
    assert first.node_list == ["gpu-0"]
    (pod,) = k8s.pods(first)
    assert pod["spec"]["nodeName"] == "gpu-0"
    with k8s.now():
        assert checkpoint_report(
            k8s.token(first), step=700, uri=CHECKPOINT, ts=fake.controller.clock.now.timestamp()
        ) == {"accepted": 1, "duplicates": 0, "rejected": 0, "refused": {}, "messages": []}

    # The fault: a double-bit ECC error on GPU 3 of gpu-0, scraped by the telemetry task.
    fake.controller.clock.advance(5)
    exporter.serve("/gpu-0", Route(exporter_body("gpu-0", dbe={3: 1})))
    with k8s.now():
        telemetry_collect(cluster.pk)
    fault = NodeHealthEvent.objects.get(cluster=cluster, node="gpu-0", signal="ecc_uncorrectable")
    assert (fault.source, fault.gpu, fault.code, fault.detail, fault.action) == (
        "dcgm",
        "3",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "double-bit ECC errors (volatile) grew from 0 to 1",
        "quarantine",
    )
    gpu0 = ClusterNode.objects.get(cluster=cluster, name="gpu-0")
    fault_reason = gpu0.health_reason
    assert (gpu0.health, fault_reason) == (NodeHealth.QUARANTINED, f"GPU 3: {fault.detail}")
    assert k8s.node("gpu-0")["spec"] == {}

    # ONE periodic sync: cordoned with Gantry's taint, the run taken off the node.
    with k8s.now():
        worker.call(sync_all_clusters)
    fenced = k8s.node("gpu-0")
    assert fenced["spec"] == {"unschedulable": True, "taints": [GANTRY_TAINT]}
    assert fenced["metadata"]["annotations"] == {
        REASON_ANNOTATION: f"gantry: {fault_reason}",
        CORDONED_ANNOTATION: "true",
    }
    first.refresh_from_db()
    assert (first.cause_class, first.cause_evidence) == (
        "hardware",
        {
            "node": "gpu-0",
            "gpu": "3",
            "signal": "ecc_uncorrectable",
            "code": fault.code,
            "at": fault.observed_at.isoformat(),
            "detail": fault.detail,
        },
    )
    run.refresh_from_db()
    assert (run.state, run.excluded_nodes) == (RunState.PREEMPTED, ["gpu-0"])
    assert worker.sent == [("jobs.tasks.attempt_cancel", (first.pk,))]

    # The worker deletes the job; the next sync sees it gone and requeues the run, the next
    # admission cycle places it on gpu-1 from the checkpoint, and the new pod runs there.
    with k8s.now():
        worker.run()
    k8s.step_until(run, RunState.RUNNING, seconds=1)
    first.refresh_from_db()
    second = Attempt.objects.get(run=run, number=2)
    assert (first.state, first.cause_class) == (AttemptState.PREEMPTED, "hardware")
    assert second.placement == ["gpu-1"]
    assert second.resumed_from == Checkpoint.objects.get(run=run, step=700, uri=CHECKPOINT)
    (pod,) = k8s.pods(second)
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    if k8s.kueue:  # Kueue places the pod: the exclusion keeps it off gpu-0
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-0"]}]}
        ]
    else:  # pinned to Gantry's placement, which keeps off the quarantined, excluded node
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
        ]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert (env["GANTRY_RESUME_FROM"], env["GANTRY_RESUME_STEP"]) == (CHECKPOINT, "700")
    assert pod["spec"]["nodeName"] == "gpu-1"
    second.refresh_from_db()
    assert second.node_list == ["gpu-1"]
    k8s.step_until(run, RunState.SUCCEEDED)
    run.refresh_from_db()
    assert run.restarts == 0  # not counted against the researcher's max_restarts
    # In the order they were written (the fake cluster's clock and the test's are not one).
    assert list(
        run.events.filter(to_state__in=[RunState.PREEMPTED, RunState.QUEUED])
        .order_by("id")
        .values_list("to_state", "message")
    ) == [
        ("QUEUED", "Submitted"),
        (
            "PREEMPTED",
            f"Taken off its nodes: node gpu-0 was quarantined by Gantry ({fault_reason}); it "
            "resumes from its latest checkpoint on other nodes, not counted against your restarts",
        ),
        ("QUEUED", "Back in the queue after preemption; it will resume from checkpoint step 700"),
    ]
    # No pod of anyone's landed on gpu-0 since the fault.
    assert [
        p["metadata"]["name"]
        for p in fake.store.list("pods")[0]
        if p["spec"].get("nodeName") == "gpu-0"
    ] == []

    # A person returns gpu-0 to service; the next sync uncordons it and takes the taint off.
    with k8s.now():
        node_release(
            cluster=cluster,
            node="gpu-0",
            actor=world.platform_admin,
            note="GPU 3 replaced (RMA 1234); dcgmi diag -r 3 passed",
        )
        worker.call(sync_all_clusters)
    released = k8s.node("gpu-0")
    assert released["spec"] == {"unschedulable": False, "taints": []}
    assert released["metadata"].get("annotations", {}) == {}
    gpu0.refresh_from_db()
    assert (gpu0.health, gpu0.fenced_at, gpu0.fence_error) == (NodeHealth.HEALTHY, None, "")
    assert list(
        NodeHealthEvent.objects.filter(cluster=cluster, node="gpu-0")
        .order_by("recorded_at", "pk")
        .values_list("signal", "action", "actor__username", "detail")
    ) == [
        ("ecc_uncorrectable", "quarantine", None, fault.detail),
        ("fence", "fenced", None, f"gantry: {fault_reason}"),
        ("release", "release", "paul", ""),
        ("unfence", "unfenced", None, ""),
    ]
    with k8s.now():
        cluster_refresh_inventory(cluster=cluster)
    gpu0.refresh_from_db()
    assert (gpu0.schedulable, gpu0.reason) == (True, "")
