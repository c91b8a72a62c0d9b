"""The Kubernetes backend's fence (cordon and Gantry's taint) and unfence, node conditions as
health signals, and excluded nodes as node affinity: through the official client against
the wire-level fake API server (tests/k8s_fake), manifests against the official schemas."""

import kubernetes_validate
import pytest
from kubernetes import client

from clusters.backends.base import JobRef, PermanentBackendError, TransientBackendError
from clusters.backends.k8s_fence import (
    CORDONED_ANNOTATION,
    FENCE_TAINT,
    REASON_ANNOTATION,
    fence_patch,
    unfence_patch,
)
from clusters.backends.k8s_manifest import render
from clusters.backends.k8s_settings import parse_settings
from clusters.health import Signal, SignalClass, Source
from tests.clusters.backends.test_k8s_backend import (
    A100,
    TOKEN,
    TOKEN_ENV,
    backend,
    run_until,
    settings_for,
    spec,
)
from tests.k8s_fake import FakeKubernetes
from tests.k8s_schemas import validate

OUTSIDE_TAINTS = [
    {"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"},
    {
        "key": "example.com/maintenance",
        "effect": "NoExecute",
        "timeAdded": "2026-12-06T10:00:00Z",
    },
]
GANTRY_TAINT = {"key": "gantry.io/node-health", "value": "quarantined", "effect": "NoSchedule"}


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeKubernetes(token=TOKEN) as fake:
        yield fake


def node(fake, name="gpu-1"):
    return fake.store.get("nodes", "", name)


def node_requests(fake, name="gpu-1"):
    return [(r.method, r.path) for r in fake.server.requests if r.path.endswith(f"/{name}")]


@pytest.fixture
def nodes(fake):
    fake.controller.add_node(
        "gpu-1", product=A100, gpus=8, taints=[dict(t) for t in OUTSIDE_TAINTS]
    )
    fake.controller.add_node("gpu-2", product=A100, gpus=8)
    fake.server.requests.clear()
    return fake


# --- fence and unfence ----------------------------------------------------------------------


def test_fence_cordons_and_adds_gantrys_taint_keeping_the_others(nodes):
    fake = nodes
    before = node(fake)["metadata"]["resourceVersion"]
    backend(fake).fence("gpu-1", "XID 79 on GPU 1")
    fenced = node(fake)
    assert fenced["spec"] == {"unschedulable": True, "taints": [*OUTSIDE_TAINTS, GANTRY_TAINT]}
    assert fenced["metadata"]["annotations"] == {
        REASON_ANNOTATION: "XID 79 on GPU 1",
        CORDONED_ANNOTATION: "true",
    }
    assert int(fenced["metadata"]["resourceVersion"]) > int(before)
    assert node_requests(fake) == [("GET", "/api/v1/nodes/gpu-1"), ("PATCH", "/api/v1/nodes/gpu-1")]
    # Idempotent: fenced already, it is read and left alone.
    backend(fake).fence("gpu-1", "XID 48 on GPU 3")
    assert node_requests(fake)[2:] == [("GET", "/api/v1/nodes/gpu-1")]
    assert node(fake)["metadata"]["annotations"][REASON_ANNOTATION] == "XID 79 on GPU 1"


def test_unfence_restores_the_node_as_it_was(nodes):
    fake = nodes
    k8s = backend(fake)
    k8s.fence("gpu-1", "XID 79 on GPU 1")
    k8s.unfence("gpu-1")
    restored = node(fake)
    assert restored["spec"] == {"unschedulable": False, "taints": OUTSIDE_TAINTS}
    assert "annotations" not in restored["metadata"] or restored["metadata"]["annotations"] == {}
    fake.server.requests.clear()
    k8s.unfence("gpu-1")  # nothing of Gantry's left: read, not patched
    assert node_requests(fake) == [("GET", "/api/v1/nodes/gpu-1")]


def test_a_node_someone_else_cordoned_stays_cordoned(nodes):
    fake = nodes
    fake.controller.cordon("gpu-2")
    k8s = backend(fake)
    k8s.fence("gpu-2", "XID 48 on GPU 0")
    assert node(fake, "gpu-2")["metadata"]["annotations"][CORDONED_ANNOTATION] == "false"
    assert node(fake, "gpu-2")["spec"]["taints"] == [GANTRY_TAINT]
    with pytest.raises(PermanentBackendError) as refused:
        k8s.unfence("gpu-2")
    assert str(refused.value) == (
        "node gpu-2 was cordoned by someone else, not by Gantry: Gantry took its own taint "
        "off but leaves the cordon to whoever set it (kubectl uncordon gpu-2)"
    )
    assert node(fake, "gpu-2")["spec"] == {"unschedulable": True, "taints": []}


def test_a_conflict_reads_the_node_again_and_keeps_the_change_made_in_between(nodes, monkeypatch):
    fake = nodes
    read = client.CoreV1Api.read_node
    changes = iter([True])

    def read_then_someone_writes(self, name, **kwargs):
        response = read(self, name, **kwargs)
        if next(changes, False):  # after Gantry's first read, before its patch
            fake.controller.set_condition(name, "GpuMemWatch", "False", message="healthy")
        return response

    monkeypatch.setattr(client.CoreV1Api, "read_node", read_then_someone_writes)
    backend(fake).fence("gpu-1", "XID 79 on GPU 1")
    assert node_requests(fake) == [
        ("GET", "/api/v1/nodes/gpu-1"),
        ("PATCH", "/api/v1/nodes/gpu-1"),  # 409: the node changed since the read
        ("GET", "/api/v1/nodes/gpu-1"),
        ("PATCH", "/api/v1/nodes/gpu-1"),
    ]
    fenced = node(fake)
    assert fenced["spec"]["taints"] == [*OUTSIDE_TAINTS, GANTRY_TAINT]
    assert [c["type"] for c in fenced["status"]["conditions"]] == ["Ready", "GpuMemWatch"]


def test_a_node_that_keeps_changing_is_left_for_the_next_sync(nodes, monkeypatch):
    fake = nodes
    read = client.CoreV1Api.read_node

    def read_then_someone_writes(self, name, **kwargs):
        response = read(self, name, **kwargs)
        fake.controller.set_condition(name, "GpuMemWatch", "False", message="healthy")
        return response

    monkeypatch.setattr(client.CoreV1Api, "read_node", read_then_someone_writes)
    with pytest.raises(TransientBackendError) as later:
        backend(fake).fence("gpu-1", "XID 79 on GPU 1")
    assert str(later.value) == (
        "fence node gpu-1: the node changed twice while Gantry patched it (409 Conflict); the "
        "next sync tries again"
    )
    assert node(fake)["spec"] == {"taints": OUTSIDE_TAINTS}


def test_a_forbidden_patch_says_what_rbac_gantry_needs(nodes):
    fake = nodes
    fake.server.fail_next(1, status=403, path=r"^/api/v1/nodes/gpu-1$")
    with pytest.raises(PermanentBackendError) as refused:
        backend(fake).fence("gpu-1", "XID 79")
    assert str(refused.value) == (
        "fence node gpu-1: read: forbidden (403): Gantry's Kubernetes identity may not read and "
        "patch nodes; grant it get and patch on nodes (a ClusterRole; docs/kubernetes.md) "
        "(injected fault 403)"
    )
    assert node(fake)["spec"] == {"taints": OUTSIDE_TAINTS}


@pytest.mark.parametrize("bad", ["gpu-1/../gpu-2", "GPU_1", "gpu-1; kubectl drain", "", "-gpu"])
def test_a_bad_node_name_sends_nothing(nodes, bad):
    fake = nodes
    for call in (lambda: backend(fake).fence(bad, "XID 79"), lambda: backend(fake).unfence(bad)):
        with pytest.raises(PermanentBackendError, match="is not a Kubernetes node name"):
            call()
    assert fake.server.requests == []


def test_an_unknown_node_is_refused(nodes):
    with pytest.raises(PermanentBackendError) as refused:
        backend(nodes).fence("gpu-9", "XID 79")
    assert str(refused.value) == "fence node gpu-9: read: k8s-test has no such node (404)"


def test_patches_carry_the_resource_version_and_only_gantrys_changes():
    seen = {
        "metadata": {"name": "gpu-1", "resourceVersion": "41"},
        "spec": {"taints": OUTSIDE_TAINTS},
    }
    assert fence_patch(seen, "XID 79\non GPU 1") == {
        "metadata": {
            "resourceVersion": "41",
            "annotations": {REASON_ANNOTATION: "XID 79 on GPU 1", CORDONED_ANNOTATION: "true"},
        },
        "spec": {"unschedulable": True, "taints": [*OUTSIDE_TAINTS, FENCE_TAINT]},
    }
    assert unfence_patch(seen) is None


# --- a fenced node and excluded nodes in placement --------------------------------------------


def test_a_fenced_node_gets_no_new_pod_and_the_inventory_says_cordoned(nodes):
    fake = nodes
    k8s = backend(fake)
    k8s.fence("gpu-2", "XID 79 on GPU 1")
    by_name = {n.name: n for n in k8s.inventory().nodes}
    assert (by_name["gpu-2"].schedulable, by_name["gpu-2"].reason) == (False, "cordoned")
    # gpu-1's NoExecute taint keeps Gantry's pods off it too: nowhere to go.
    s = spec(41)
    ref = JobRef(s.name, k8s.submit(s))
    for _ in range(3):
        fake.controller.advance(10)
    status = k8s.sync([ref])[s.name]
    assert status.state == "PENDING"
    assert status.message == (
        "0/2 nodes are available: 1 node(s) had untolerated taint {example.com/maintenance: }, "
        "1 node(s) were unschedulable."
    )
    k8s.unfence("gpu-2")
    assert run_until(fake, k8s, ref, "RUNNING").node_list == ["gpu-2"]


def test_a_pod_excluding_a_node_runs_on_another(fake):
    fake.controller.add_node("gpu-1", product=A100, gpus=8)
    fake.controller.add_node("gpu-2", product=A100, gpus=8)
    k8s = backend(fake)
    s = spec(42, excluded_nodes=("gpu-1",))
    ref = JobRef(s.name, k8s.submit(s))
    job = fake.store.get("jobs", "gantry-vision", s.name)
    assert job["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}
                        ]
                    }
                ]
            }
        }
    }
    # Without the exclusion the scheduler takes the first node by name.
    assert run_until(fake, k8s, ref, "RUNNING").node_list == ["gpu-2"]


@pytest.mark.parametrize("version", ("1.31", kubernetes_validate.utils.latest_version()))
def test_excluding_manifests_pass_the_official_schemas(fake, version):
    settings = parse_settings(settings_for(fake))
    objects = render(spec(43, nodes=2, excluded_nodes=("gpu-3", "gpu-1", "gpu-3")), settings)
    for obj in objects:
        validate(obj, version)
    terms = objects[-1]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # One value per requirement (the API server's rule for node field selectors), ANDed.
    assert terms == [
        {
            "matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]},
                {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-3"]},
            ]
        }
    ]


def test_excluded_node_names_are_checked(fake):
    settings = parse_settings(settings_for(fake))
    with pytest.raises(PermanentBackendError, match=r"^excluded node: 'gpu-1; rm' is not a"):
        render(spec(44, excluded_nodes=("gpu-1; rm",)), settings)
    with pytest.raises(
        PermanentBackendError, match=r"^node gpu-1 is both in the placement and excluded$"
    ):
        render(spec(44, placement=("gpu-1",), excluded_nodes=("gpu-1",)), settings)


def test_the_fake_refuses_a_node_field_selector_with_two_values(fake):
    """What a real API server answers; the fake says it too, so no manifest slips by."""
    k8s = backend(fake)
    job = render(spec(45), parse_settings(settings_for(fake)))[-1]
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["a", "b"]}
                        ]
                    }
                ]
            }
        }
    }
    api = client.BatchV1Api(k8s.api())
    fake.store.create("namespaces", "", {"metadata": {"name": "gantry-vision"}})
    with pytest.raises(client.exceptions.ApiException) as refused:
        api.create_namespaced_job("gantry-vision", job)
    assert refused.value.status == 422
    assert "must be only one value when `operator` is 'In' or 'NotIn'" in refused.value.body


# --- signals --------------------------------------------------------------------------------


def test_conditions_become_signals_and_taints_do_not(fake):
    fake.controller.add_node("gpu-1", product=A100, gpus=8)
    fake.controller.add_node("gpu-2", product=A100, gpus=8, ready=False)
    fake.controller.add_node(
        "gpu-3",
        product=A100,
        gpus=8,
        taints=[{"key": "nvidia.com/gpu-error", "value": "fatal", "effect": "NoSchedule"}],
    )
    fake.controller.advance(30)
    message = (
        "[DCGM_FR_NVLINK_DOWN] GPU 1's NvLink link 3 is currently down - RecommendedAction: "
        "RESTART_VM"
    )
    fake.controller.set_condition(
        "gpu-1", "GpuNvlinkWatch", "True", reason="Fatal", message=message
    )
    fake.controller.set_condition("gpu-1", "GpuThermalWatch", "False", message="healthy")
    fake.controller.set_condition("gpu-1", "MemoryPressure", "True", message="low memory")
    at = fake.store.clock.now.timestamp()
    by_name = {n.name: n for n in backend(fake).inventory().nodes}
    assert by_name["gpu-1"].signals == (
        Signal(
            node="gpu-1",
            signal=SignalClass.NODE_CONDITION,
            source=Source.BACKEND,
            at=at,
            code="GpuNvlinkWatch",
            detail=message,
        ),
    )
    (down,) = by_name["gpu-2"].signals
    assert (down.signal, down.code, down.detail) == (
        SignalClass.NODE_DOWN,
        "Ready=Unknown",
        "NodeStatusUnknown",
    )
    assert by_name["gpu-3"].signals == ()
    assert by_name["gpu-3"].reason == "taint nvidia.com/gpu-error=fatal:NoSchedule"
