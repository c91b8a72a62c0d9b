"""The Kubernetes backend against the fake API server (tests/k8s_fake), spoken to by the
official client over real HTTP on 127.0.0.1; status mapping and inventory as pure
functions; and one run's whole life through jobs.services."""

import base64
import datetime as dt
import gc
import ipaddress
import json
import ssl
from pathlib import Path

import pytest
import time_machine
import yaml
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import escape
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from rest_framework.test import APIClient

from clusters.backends import backend_for, spec_for_people
from clusters.backends import kubernetes as kubernetes_backend
from clusters.backends.base import (
    Inventory,
    JobRef,
    JobSpec,
    PermanentBackendError,
    TransientBackendError,
)
from clusters.backends.k8s_settings import parse_settings
from clusters.backends.k8s_status import (
    job_status,
    node_inventory,
    pod_failure,
    pod_request,
    root_cause,
)
from clusters.backends.kubernetes import KubernetesBackend
from clusters.models import Cluster, ClusterFlavor, ClusterNode
from clusters.services import cluster_refresh_inventory
from jobs.models import Attempt, AttemptState, AttemptToken, Run, RunState
from jobs.selectors.logs import run_logs
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_cancel, cluster_sync
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tests.conftest import experiment_input
from tests.k8s_fake import ApiError, FakeKubernetes

A100 = "NVIDIA-A100-SXM4-80GB"
DIGEST = "sha256:" + "a" * 64
TOKEN = "fake-bearer-token"
TOKEN_ENV = "GANTRY_TEST_K8S_TOKEN"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FakeKubernetes(token=TOKEN) as fake:
        yield fake


def settings_for(fake: FakeKubernetes, **extra) -> dict:
    return {
        "url": fake.url,
        "token_env": TOKEN_ENV,
        "timeout_s": 5,
        "flavors": {
            "a100-80gb": {"product": A100},
            "a100-1g.10gb": {"product": A100, "resource": "nvidia.com/mig-1g.10gb"},
        },
        **extra,
    }


def backend(fake: FakeKubernetes, **extra) -> KubernetesBackend:
    cluster = Cluster(name="k8s-test", backend=Cluster.Backend.KUBERNETES)
    cluster.settings = settings_for(fake, **extra)
    return KubernetesBackend(cluster)


def spec(attempt_id: int = 7, **overrides) -> JobSpec:
    values = {
        "name": f"gantry-a{attempt_id}",
        "attempt_id": attempt_id,
        "run_id": 3,
        "tenant": "vision",
        "project": "detection",
        "image": f"registry.example.org/ml/pytorch@{DIGEST}",
        "command": "python train.py",
        "env": {"LR": "0.1"},
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
        "max_runtime_s": 3600,
        "attempt_token": f"gat_{attempt_id}.secret",
    }
    values.update(overrides)
    return JobSpec(**values)


def official_client(fake: FakeKubernetes) -> client.ApiClient:
    configuration = client.Configuration(host=fake.url)
    configuration.api_key = {"authorization": TOKEN}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def run_until(fake, k8s, ref, state, *, steps=20, seconds=10.0):
    status = None
    for _ in range(steps):
        fake.controller.advance(seconds)
        status = k8s.sync([ref]).get(ref.name)
        if status is not None and status.state == state:
            return status
    raise AssertionError(f"never reached {state}: last {status}")


# --- the fake speaks Kubernetes to the unmodified official client ---------------------------


def test_official_client_crud_selectors_status_bodies_and_versions(fake):
    core = client.CoreV1Api(official_client(fake))
    core.create_namespace({"metadata": {"name": "team-a"}})
    for name, labels in [
        ("a", {"tier": "gpu", "gantry.io/attempt": "1"}),
        ("b", {"tier": "cpu", "gantry.io/attempt": "2"}),
        ("c", {"tier": "gpu"}),
    ]:
        core.create_namespaced_secret(
            "team-a", client.V1Secret(metadata=client.V1ObjectMeta(name=name, labels=labels))
        )

    def names(selector):
        return sorted(
            s.metadata.name
            for s in core.list_namespaced_secret("team-a", label_selector=selector).items
        )

    assert names("tier=gpu") == ["a", "c"]
    assert names("tier==gpu,gantry.io/attempt") == ["a"]
    assert names("tier!=gpu") == ["b"]
    assert names("tier in (cpu, gpu),!gantry.io/attempt") == ["c"]
    assert names("tier notin (gpu)") == ["b"]
    assert names("gantry.io/attempt in (2,3)") == ["b"]

    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret("nope", "team-a")
    body = json.loads(missing.value.body)
    assert (missing.value.status, body["kind"], body["reason"], body["code"]) == (
        404,
        "Status",
        "NotFound",
        404,
    )
    assert body["message"] == 'secrets "nope" not found'

    with pytest.raises(ApiException) as duplicate:
        core.create_namespaced_secret("team-a", {"metadata": {"name": "a"}})
    assert json.loads(duplicate.value.body)["reason"] == "AlreadyExists"
    assert duplicate.value.status == 409

    current = core.read_namespaced_secret("a", "team-a")
    core.patch_namespaced_secret("a", "team-a", {"metadata": {"labels": {"x": "1"}}})
    stale = {"metadata": {"name": "a", "resourceVersion": current.metadata.resource_version}}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_secret("a", "team-a", stale)
    assert (conflict.value.status, json.loads(conflict.value.body)["reason"]) == (409, "Conflict")

    with pytest.raises(ApiException) as no_namespace:
        core.create_namespaced_secret("team-b", {"metadata": {"name": "a"}})
    assert no_namespace.value.status == 404


def test_official_client_reads_typed_jobs_pods_and_events_of_the_controller(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.controller.advance(1, steps=3)
    api = official_client(fake)
    job = client.BatchV1Api(api).read_namespaced_job("gantry-a7", "gantry-vision")
    assert isinstance(job, client.V1Job)
    assert job.spec.completion_mode == "Indexed"
    pods = client.CoreV1Api(api).list_namespaced_pod("gantry-vision").items
    assert [p.status.phase for p in pods] == ["Running"]
    events = (
        client.CoreV1Api(api)
        .list_namespaced_event(
            "gantry-vision", field_selector=f"involvedObject.name={pods[0].metadata.name}"
        )
        .items
    )
    assert [e.reason for e in events] == ["Scheduled", "Started"]
    assert k8s.sync([ref])["gantry-a7"].state == "RUNNING"


def test_official_client_lists_pods_of_all_namespaces_by_field_and_in_pages(fake):
    fake.controller.add_node("gpu-0", product=A100, gpus=8)
    fake.controller.add_pod("a", namespace="team-a", node="gpu-0", gpus=1)
    fake.controller.add_pod("b", namespace="team-b", node="gpu-0", gpus=1, phase="Succeeded")
    fake.controller.add_pod("c", namespace="team-b", node=None)
    fake.controller.add_pod("d", namespace="team-c", node="cpu-9")
    core = client.CoreV1Api(official_client(fake))

    def names(**kwargs):
        found = core.list_pod_for_all_namespaces(**kwargs)
        return [f"{p.metadata.namespace}/{p.metadata.name}" for p in found.items], found

    assert names(field_selector="spec.nodeName=gpu-0")[0] == ["team-a/a", "team-b/b"]
    assert names(field_selector="spec.nodeName=")[0] == ["team-b/c"]
    assert names(field_selector="spec.nodeName!=,status.phase!=Succeeded")[0] == [
        "team-a/a",
        "team-c/d",
    ]
    first, page = names(limit=3)
    assert (first, page.metadata.remaining_item_count) == (["team-a/a", "team-b/b", "team-b/c"], 1)
    rest, last = names(limit=3, _continue=page.metadata.var_continue)
    assert (rest, last.metadata.var_continue) == (["team-c/d"], None)
    with pytest.raises(ApiException) as unsupported:
        core.list_pod_for_all_namespaces(field_selector="spec.priority=1")
    assert unsupported.value.status == 400
    assert json.loads(unsupported.value.body)["message"] == (
        'field label not supported: "spec.priority"'
    )


def test_the_fake_serves_an_object_as_its_last_recorded_change_wrote_it(fake):
    backend(fake).submit(spec())
    store = fake.store
    namespace = store.find("namespaces", "", "gantry-vision")
    version = namespace["metadata"]["resourceVersion"]
    namespace["metadata"]["labels"]["team"] = "x"  # in place, not recorded: never served

    def served() -> list[tuple[str, str | None]]:
        read = store.get("namespaces", "", "gantry-vision")
        (listed,) = store.list_page("namespaces", None, as_text=True)[0]
        return [
            (obj["metadata"]["resourceVersion"], obj["metadata"]["labels"].get("team"))
            for obj in (read, json.loads(listed))
        ]

    assert store.unrecorded() == [("namespaces", "", "gantry-vision")]
    assert served() == [(version, None), (version, None)]
    with pytest.raises(AssertionError, match="changed in place, never recorded"):
        fake.controller.step()
    store.touch("namespaces", namespace)
    assert store.unrecorded() == []
    assert served() == [(str(store.rv), "x"), (str(store.rv), "x")]
    assert store.rv > int(version)


def test_a_patch_refused_halfway_changes_nothing(fake):
    k8s = backend(fake)
    k8s.submit(spec())
    before = fake.store.get("jobs", "gantry-vision", "gantry-a7")
    operations = [
        {"op": "replace", "path": "/spec/parallelism", "value": 9},
        {"op": "move", "from": "/spec/parallelism", "path": "/spec/completions"},
    ]
    with pytest.raises(ApiError) as refused:
        fake.store.patch("jobs", "gantry-vision", "gantry-a7", operations, "json-patch+json")
    assert (refused.value.code, refused.value.message) == (422, "unsupported JSON patch op move")
    assert fake.store.get("jobs", "gantry-vision", "gantry-a7") == before
    assert fake.store.unrecorded() == []


def test_watch_streams_changes_and_resumes_from_a_resource_version(fake):
    api = official_client(fake)
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "w"}})
    core.create_namespaced_secret("w", {"metadata": {"name": "one", "labels": {"app": "x"}}})
    stream = watch.Watch().stream(
        core.list_namespaced_secret, "w", label_selector="app=x", timeout_seconds=1
    )
    first = [(e["type"], e["object"].metadata.name) for e in stream]
    assert first == [("ADDED", "one")]
    since = core.list_namespaced_secret("w").metadata.resource_version
    core.patch_namespaced_secret("one", "w", {"metadata": {"labels": {"app": "x", "v": "2"}}})
    core.create_namespaced_secret("w", {"metadata": {"name": "other", "labels": {"app": "y"}}})
    core.delete_namespaced_secret("one", "w")
    resumed = watch.Watch().stream(
        core.list_namespaced_secret,
        "w",
        label_selector="app=x",
        resource_version=since,
        timeout_seconds=1,
    )
    assert [(e["type"], e["object"].metadata.name) for e in resumed] == [
        ("MODIFIED", "one"),
        ("DELETED", "one"),
    ]


def test_watch_from_a_compacted_version_is_gone(fake):
    for name in ("early", "earlier"):
        fake.store.create("namespaces", "", {"metadata": {"name": name}})
    fake.store.events.clear()  # what etcd compaction does to the history
    fake.store.create("namespaces", "", {"metadata": {"name": "late"}})
    core = client.CoreV1Api(official_client(fake))
    response = core.list_namespaced_secret(
        "late", watch=True, resource_version="1", timeout_seconds=1, _preload_content=False
    )
    event = json.loads(response.data.decode().splitlines()[0])
    assert (event["type"], event["object"]["code"], event["object"]["reason"]) == (
        "ERROR",
        410,
        "Expired",
    )


def test_requests_without_the_token_are_unauthorized(fake):
    configuration = client.Configuration(host=fake.url)
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(client.ApiClient(configuration)).list_namespace()
    assert (denied.value.status, json.loads(denied.value.body)["reason"]) == (401, "Unauthorized")


# --- submit: objects, references, idempotence -----------------------------------------------


def test_submit_creates_namespace_secret_service_and_job_owned_together(fake):
    k8s = backend(fake)
    job_id = k8s.submit(spec(nodes=2, gpus_per_node=8))
    assert job_id == "gantry-vision/gantry-a7"
    store = fake.store
    namespace = store.get("namespaces", "", "gantry-vision")
    assert namespace["metadata"]["labels"]["gantry.io/tenant"] == "vision"
    job = store.get("jobs", "gantry-vision", "gantry-a7")
    secret = store.get("secrets", "gantry-vision", "gantry-a7-token")
    service = store.get("services", "gantry-vision", "gantry-a7")
    import base64

    assert base64.b64decode(secret["data"]["GANTRY_ATTEMPT_TOKEN"]).decode() == "gat_7.secret"
    for owned in (secret, service):
        assert owned["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GANTRY_ATTEMPT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "gantry-a7-token"
    assert "gat_7.secret" not in json.dumps(job)
    assert "gat_7.secret" not in k8s.render(spec(nodes=2, gpus_per_node=8))


def test_a_redelivered_submit_adopts_the_job_and_creates_nothing(fake):
    k8s = backend(fake)
    first = k8s.submit(spec())
    posts = fake.server.count("POST")
    assert k8s.submit(spec()) == first
    assert fake.server.count("POST") == posts  # the second submit only looked it up
    assert len(fake.store.list("jobs", "gantry-vision")[0]) == 1


def test_a_409_on_create_adopts_the_job_another_delivery_created(fake, monkeypatch):
    k8s = backend(fake)
    other = backend(fake)
    other.submit(spec())  # the other delivery got there between our lookup and our create
    monkeypatch.setattr(KubernetesBackend, "_read_job", _missing_once(KubernetesBackend._read_job))
    assert k8s.submit(spec()) == "gantry-vision/gantry-a7"
    assert fake.server.count("POST", r"/jobs$") == 2
    assert len(fake.store.list("jobs", "gantry-vision")[0]) == 1


def _missing_once(read):
    calls = []

    def fake_read(self, namespace, name):
        calls.append(name)
        return None if len(calls) == 1 else read(self, namespace, name)

    return fake_read


def test_a_job_of_the_same_name_that_is_not_ours_is_not_adopted(fake):
    k8s = backend(fake)
    fake.store.create("namespaces", "", {"metadata": {"name": "gantry-vision"}})
    foreign = k8s.render(spec(attempt_id=8))  # another attempt's job under our name
    job = json.loads(foreign)[-1]
    job["metadata"]["name"] = "gantry-a7"
    fake.store.create("jobs", "gantry-vision", job)
    with pytest.raises(PermanentBackendError, match="belongs to something else"):
        k8s.submit(spec())


def test_a_missing_namespace_is_permanent_when_gantry_may_not_create_it(fake):
    k8s = backend(fake, create_namespaces=False)
    with pytest.raises(PermanentBackendError, match="namespace gantry-vision does not exist"):
        k8s.submit(spec())


def test_a_manifest_the_server_refuses_is_permanent(fake):
    k8s = backend(fake)
    fake.server.fail_next(1, status=422, path=r"/jobs$")
    with pytest.raises(PermanentBackendError, match="refused it \\(422\\)"):
        k8s.submit(spec())


def test_invalid_env_names_never_reach_the_cluster(fake):
    with pytest.raises(PermanentBackendError, match="not valid"):
        backend(fake).submit(spec(env={"BAD-NAME": "1"}))
    assert fake.server.count("POST") == 0


# --- sync: batched, mapped to the lifecycle and the taxonomy ---------------------------------


def test_a_job_goes_pending_running_succeeded(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=2, gpus_per_node=8)))
    fake.controller.set_runtime("gantry-a7", 300)
    assert k8s.sync([ref])["gantry-a7"].state == "PENDING"
    fake.controller.advance(1)
    assert k8s.sync([ref])["gantry-a7"].message == "0 of 2 pods running"
    running = run_until(fake, k8s, ref, "RUNNING")
    assert running.node_list == ["fake-node-0", "fake-node-1"]
    done = run_until(fake, k8s, ref, "SUCCEEDED", steps=40)
    assert (done.exit_code, done.failure_reason) == (0, "")
    assert (done.finished_at - running.started_at).total_seconds() >= 300


def submitted_in_three_namespaces(fake, k8s) -> list[JobRef]:
    """Twelve attempts, running: gantry-a10 … gantry-a21 in vision, nlp, audio in turn."""
    refs = []
    for attempt_id, tenant in enumerate(["vision", "nlp", "audio"] * 4, start=10):
        refs.append(JobRef(f"gantry-a{attempt_id}", k8s.submit(spec(attempt_id, tenant=tenant))))
    fake.controller.advance(1, steps=3)
    return refs


def test_sync_is_two_cluster_wide_lists_whatever_the_number_of_attempts(fake):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    fake.server.requests.clear()
    statuses = k8s.sync(refs)
    assert set(statuses) == {ref.name for ref in refs}
    assert {s.state for s in statuses.values()} == {"RUNNING"}
    assert [(r.path, r.query) for r in fake.server.requests] == [
        ("/apis/batch/v1/jobs", {"labelSelector": "gantry.io/attempt", "limit": "500"}),
        ("/api/v1/pods", {"labelSelector": "gantry.io/attempt", "limit": "500"}),
    ]


# The 13 Jobs of submitted_in_three_namespaces and gantry-a99 (nlp) in etcd's key order
# (namespace, name), 5 a page.
PAGES_OF_FIVE = [
    [
        "audio/gantry-a12",
        "audio/gantry-a15",
        "audio/gantry-a18",
        "audio/gantry-a21",
        "nlp/gantry-a11",
    ],
    ["nlp/gantry-a14", "nlp/gantry-a17", "nlp/gantry-a20", "nlp/gantry-a99", "vision/gantry-a10"],
    ["vision/gantry-a13", "vision/gantry-a16", "vision/gantry-a19"],
]


def served_pages(fake, monkeypatch, *, compact_once: bool = False) -> dict[str, list[list[str]]]:
    """Record each page the store serves, per resource, as namespace/job (a pod by the Job
    that owns it); with ``compact_once``, compact etcd just before the first continued page."""
    served: dict[str, list[list[str]]] = {"jobs": [], "pods": []}
    list_page = fake.store.list_page

    compacted: list[int] = []

    def recording(plural, *args, **kwargs):
        if compact_once and kwargs.get("continue_token") and not compacted:
            compacted.append(1)
            compact(fake)
        items, rv, token, remaining = list_page(plural, *args, **kwargs)
        names = []
        for item in items:
            meta = json.loads(item)["metadata"]
            owner = meta.get("ownerReferences", [{"name": meta["name"]}])[0]["name"]
            names.append(f"{meta['namespace'].removeprefix('gantry-')}/{owner}")
        served[plural].append(names)
        return items, rv, token, remaining

    monkeypatch.setattr(fake.store, "list_page", recording)
    return served


def test_a_sync_over_many_pages_gives_every_attempt_exactly_once(fake, monkeypatch):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    # Another attempt that is not asked about: listed (same label), left out.
    k8s.submit(spec(99, tenant="nlp"))
    fake.controller.advance(1, steps=3)
    whole = k8s.sync(refs)
    assert sorted(whole) == sorted(ref.name for ref in refs)
    monkeypatch.setattr(kubernetes_backend, "LIST_PAGE", 5)
    served = served_pages(fake, monkeypatch)
    fake.server.requests.clear()
    assert k8s.sync(refs) == whole
    assert [(r.path, "continue" in r.query, r.query["limit"]) for r in fake.server.requests] == [
        ("/apis/batch/v1/jobs", False, "5"),
        ("/apis/batch/v1/jobs", True, "5"),
        ("/apis/batch/v1/jobs", True, "5"),
        ("/api/v1/pods", False, "5"),
        ("/api/v1/pods", True, "5"),
        ("/api/v1/pods", True, "5"),
    ]
    # Each page continues where the last stopped: every Job and pod exactly once.
    assert served == {"jobs": PAGES_OF_FIVE, "pods": PAGES_OF_FIVE}


def test_a_sync_whose_list_expires_between_pages_starts_it_again(fake, monkeypatch):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    k8s.submit(spec(99, tenant="nlp"))
    fake.controller.advance(1, steps=3)
    whole = k8s.sync(refs)
    monkeypatch.setattr(kubernetes_backend, "LIST_PAGE", 5)
    served = served_pages(fake, monkeypatch, compact_once=True)
    fake.server.requests.clear()
    assert k8s.sync(refs) == whole
    # The Jobs' second page is refused (410 Expired, nothing served): the list starts again.
    assert [(r.path, "continue" in r.query) for r in fake.server.requests] == [
        ("/apis/batch/v1/jobs", False),
        ("/apis/batch/v1/jobs", True),
        ("/apis/batch/v1/jobs", False),
        ("/apis/batch/v1/jobs", True),
        ("/apis/batch/v1/jobs", True),
        ("/api/v1/pods", False),
        ("/api/v1/pods", True),
        ("/api/v1/pods", True),
    ]
    assert served == {"jobs": [PAGES_OF_FIVE[0], *PAGES_OF_FIVE], "pods": PAGES_OF_FIVE}


def test_a_sync_where_cluster_wide_lists_are_forbidden_lists_each_namespace(fake, monkeypatch):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    k8s.submit(spec(99, tenant="nlp"))  # not asked about
    k8s.submit(spec(98, tenant="speech"))  # not asked about, nor its namespace
    fake.controller.advance(1, steps=3)
    whole = k8s.sync(refs)
    monkeypatch.setattr(kubernetes_backend, "LIST_PAGE", 3)
    served = served_pages(fake, monkeypatch)
    fake.server.fail_next(1, status=403, path=r"^/apis/batch/v1/jobs$")
    fake.server.fail_next(1, status=403, path=r"^/api/v1/pods$")
    fake.server.requests.clear()
    assert k8s.sync(refs) == whole
    tenants = ("audio", "nlp", "vision")
    assert [(r.path, "continue" in r.query) for r in fake.server.requests] == [
        ("/apis/batch/v1/jobs", False),
        *(
            (f"/apis/batch/v1/namespaces/gantry-{tenant}/jobs", page > 0)
            for tenant in tenants
            for page in range(2)
        ),
        ("/api/v1/pods", False),
        *(
            (f"/api/v1/namespaces/gantry-{tenant}/pods", page > 0)
            for tenant in tenants
            for page in range(2)
        ),
    ]
    # The refused lists served nothing; each namespace in pages of 3 (speech never asked).
    per_namespace = [
        ["audio/gantry-a12", "audio/gantry-a15", "audio/gantry-a18"],
        ["audio/gantry-a21"],
        ["nlp/gantry-a11", "nlp/gantry-a14", "nlp/gantry-a17"],
        ["nlp/gantry-a20", "nlp/gantry-a99"],
        ["vision/gantry-a10", "vision/gantry-a13", "vision/gantry-a16"],
        ["vision/gantry-a19"],
    ]
    assert served == {"jobs": per_namespace, "pods": per_namespace}


def test_a_sync_forbidden_in_a_namespace_too_is_a_transient_error(fake):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    fake.server.fail_next(1, status=403, path=r"^/apis/batch/v1/jobs$")
    fake.server.fail_next(1, status=403, path=r"^/apis/batch/v1/namespaces/gantry-nlp/jobs$")
    with pytest.raises(TransientBackendError) as refused:
        k8s.sync(refs)
    assert str(refused.value) == "list jobs in gantry-nlp: forbidden (403): injected fault 403"


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_sync_maps_with_the_collector_paused_and_leaves_it_as_it_was(
    fake, monkeypatch, enabled_before
):
    k8s = backend(fake)
    refs = submitted_in_three_namespaces(fake, k8s)
    seen = []
    real = kubernetes_backend.job_status
    monkeypatch.setattr(
        kubernetes_backend,
        "job_status",
        lambda job, pods: seen.append(gc.isenabled()) or real(job, pods),
    )
    was = gc.isenabled()
    try:
        gc.enable() if enabled_before else gc.disable()
        statuses = k8s.sync(refs)
        after = gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert len(statuses) == len(refs) == len(seen) == 12
    assert set(seen) == {False}
    assert after is enabled_before


def test_sync_leaves_out_jobs_the_cluster_no_longer_has(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.store.delete("jobs", "gantry-vision", "gantry-a7", "Background")
    assert k8s.sync([ref, JobRef("gantry-a8", "")]) == {}


@pytest.mark.parametrize(
    ("kind", "options", "state", "reason", "exit_code", "in_message"),
    [
        (
            "oom",
            {"message": "Memory cgroup out of memory: Killed process 41 (python)"},
            "FAILED",
            "OOM_HOST",
            137,
            "OOMKilled",
        ),
        (
            "oom",
            {"message": "RuntimeError: CUDA out of memory."},
            "FAILED",
            "OOM_GPU",
            137,
            "CUDA out of memory",
        ),
        ("oom_gpu", {}, "FAILED", "OOM_GPU", 1, "torch.OutOfMemoryError"),
        (
            "exit",
            {"exit_code": 3, "message": "bad config"},
            "FAILED",
            "USER_EXIT",
            3,
            "exit code 3",
        ),
        ("image_pull", {}, "FAILED", "IMAGE_PULL", None, "ErrImagePull"),
        ("preempt", {}, "PREEMPTED", "PREEMPTED", 143, "PreemptionByScheduler"),
        ("evict", {}, "PREEMPTED", "PREEMPTED", 143, "EvictionByEvictionAPI"),
        ("node_loss", {}, "FAILED", "NODE_FAILURE", 137, "DeletionByTaintManager"),
        ("deadline", {}, "FAILED", "TIMEOUT", None, "deadline"),
    ],
)
def test_injected_failures_map_to_the_taxonomy(
    fake, kind, options, state, reason, exit_code, in_message
):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.controller.advance(1, steps=2)  # created, scheduled: the pull comes next
    fake.controller.inject("gantry-a7", kind, **options)
    status = run_until(fake, k8s, ref, state, seconds=1)
    assert (status.failure_reason, status.exit_code) == (reason, exit_code)
    assert in_message in status.message
    if kind == "image_pull":
        # Kubernetes would retry the pull forever, holding the GPU: the backend deletes it.
        fake.controller.advance(1)
        assert fake.store.list("jobs", "gantry-vision")[0] == []


def test_a_lost_rank_explains_the_failure_of_the_whole_gang(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=4, gpus_per_node=8)))
    run_until(fake, k8s, ref, "RUNNING", seconds=1)
    fake.controller.inject("gantry-a7", "node_loss", rank=2)
    status = run_until(fake, k8s, ref, "FAILED", seconds=1)
    assert status.failure_reason == "NODE_FAILURE"
    assert status.message.startswith("rank 2 ")


def test_with_disruption_left_to_kubernetes_a_preempted_pod_is_replaced(fake):
    k8s = backend(fake, disruption_action="Ignore")
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    run_until(fake, k8s, ref, "RUNNING", seconds=1)
    fake.controller.inject("gantry-a7", "preempt")
    fake.controller.advance(1, steps=4)
    assert k8s.sync([ref])["gantry-a7"].state == "RUNNING"
    assert len(fake.controller.pods_of("gantry-vision", "gantry-a7")) == 2
    assert run_until(fake, k8s, ref, "SUCCEEDED").exit_code == 0


def test_kueue_jobs_wait_suspended_until_admitted(fake):
    k8s = backend(fake, queueing="kueue", kueue_queue="gpu")
    # Kueue places the job itself: a long wait there is its own, never a lapsed placement.
    assert (k8s.honours_placement, backend(fake).honours_placement) == (False, True)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.controller.advance(30, steps=3)
    status = k8s.sync([ref])["gantry-a7"]
    assert (status.state, status.message) == ("PENDING", "Suspended: waiting for Kueue to admit it")
    assert fake.store.list("pods", "gantry-vision")[0] == []
    fake.controller.admit("gantry-vision", "gantry-a7")
    assert run_until(fake, k8s, ref, "SUCCEEDED").exit_code == 0


def test_volcano_pods_are_scheduled_through_their_pod_group(fake):
    k8s = backend(fake, queueing="volcano")
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=2)))
    group = fake.store.get("podgroups", "gantry-vision", "gantry-a7")
    assert group["spec"]["minMember"] == 2
    assert group["metadata"]["ownerReferences"][0]["kind"] == "Job"
    run_until(fake, k8s, ref, "RUNNING", seconds=1)
    k8s.cancel(ref)
    with pytest.raises(Exception, match="not found"):
        fake.store.get("podgroups", "gantry-vision", "gantry-a7")


def test_without_its_pod_group_a_volcano_pod_is_never_scheduled(fake):
    k8s = backend(fake, queueing="volcano")
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=2)))
    fake.store.delete("podgroups", "gantry-vision", "gantry-a7", "Background")
    fake.controller.advance(1, steps=3)
    status = k8s.sync([ref])["gantry-a7"]
    assert (status.state, status.message, status.node_list) == (
        "PENDING",
        "pod group 'gantry-a7' not found",
        [],
    )


# --- cancel and logs -------------------------------------------------------------------------


def test_cancel_deletes_in_the_foreground_with_everything_beside_the_job(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=2)))
    run_until(fake, k8s, ref, "RUNNING", seconds=1)
    fake.server.requests.clear()
    k8s.cancel(ref)
    deletes = [(r.path, r.query.get("propagationPolicy")) for r in fake.server.requests]
    assert deletes[0] == ("/apis/batch/v1/namespaces/gantry-vision/jobs/gantry-a7", "Foreground")
    assert {path for path, _ in deletes[1:]} == {
        "/api/v1/namespaces/gantry-vision/services/gantry-a7",
        "/api/v1/namespaces/gantry-vision/secrets/gantry-a7-token",
    }
    status = k8s.sync([ref])["gantry-a7"]
    assert (status.state, status.failure_reason) == ("CANCELLED", "CANCELLED")
    fake.controller.advance(1)
    assert k8s.sync([ref]) == {}
    k8s.cancel(ref)  # again: already gone is fine


def test_logs_of_rank_zero_by_default_and_of_any_rank_on_request(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec(nodes=2)))
    assert k8s.logs(ref, tail=10) == "(no pod of rank 0)"
    fake.controller.advance(1, steps=2)
    assert "waiting to start: ContainerCreating" in k8s.logs(ref, tail=10)
    for _ in range(3):
        fake.controller.advance(1)
    assert k8s.logs(ref, tail=10).splitlines() == [
        "rank 0 of 2 starting on fake-node-0",
        "step 1",
        "step 2",
    ]
    assert k8s.logs(ref, tail=1, rank=1) == "step 2\n"


# --- inventory -------------------------------------------------------------------------------


BLOCK = "network.example.org/block"
RACK = "network.example.org/topology-rack"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def inventory_world(fake: FakeKubernetes) -> None:
    """GPU nodes in two blocks of racks, some taking no work, and pods of every kind: an
    ETL job of another team, a Gantry attempt, a pod bound but still Pending, finished and
    unscheduled pods (which hold nothing), MIG slices in use, pods on nodes Gantry does not
    count."""
    add = fake.controller.add_node
    add("a100-0", product=A100, gpus=8, labels={BLOCK: "b1", RACK: "r1"})
    add("a100-1", product=A100, gpus=8, labels={BLOCK: "b1", RACK: "r2"}, unschedulable=True)
    add("a100-2", product=A100, gpus=8, labels={BLOCK: "b2", RACK: "r3"}, ready=False)
    inference = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
    add("a100-3", product=A100, gpus=8, labels={BLOCK: "b2", RACK: "r3"}, taints=[inference])
    tolerated = [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {"key": "spot", "value": "true", "effect": "PreferNoSchedule"},
    ]
    add("a100-4", product=A100, gpus=8, labels={BLOCK: "b2", RACK: "r4"}, taints=tolerated)
    add("a100-5", product=A100, gpus=8, labels={BLOCK: "b2"})  # its rack label is missing
    add(
        "mig-0",
        product=A100,
        gpus=0,
        labels={BLOCK: "b1", RACK: "r1"},
        extra_allocatable={"nvidia.com/mig-1g.10gb": "7"},
    )
    add("h100-0", product="NVIDIA-H100-80GB-HBM3", gpus=8)  # no flavor maps to it
    fake.store.create("nodes", "", {"metadata": {"name": "cpu-0"}, "status": {}})
    pod = fake.controller.add_pod
    pod("etl-1", namespace="data-eng", node="a100-0", gpus=2)
    gantry = {"gantry.io/attempt": "9", "gantry.io/tenant": "nlp"}
    pod("gantry-a9-0-x", namespace="gantry-nlp", node="a100-0", gpus=4, labels=gantry)
    pod("etl-2", namespace="data-eng", node="a100-0", gpus=1, phase="Pending")
    pod("etl-done", namespace="data-eng", node="a100-0", gpus=8, phase="Succeeded")
    pod("etl-failed", namespace="data-eng", node="a100-4", gpus=8, phase="Failed")
    pod("etl-waiting", namespace="data-eng", node=None, gpus=8, phase="Pending")
    pod("infer-0", namespace="serving", node="a100-3", gpus=8)
    pod("slices", namespace="notebooks", node="mig-0", gpus=3, resource="nvidia.com/mig-1g.10gb")
    pod("h100-job", namespace="data-eng", node="h100-0", gpus=8)
    pod("coredns", namespace="kube-system", node="cpu-0")


INVENTORY_SETTINGS = {
    "tolerations": [GPU_TOLERATION],
    "topology_labels": [{"name": "block", "label": BLOCK}, RACK],
}


def test_inventory_counts_every_pod_on_a_node_and_says_which_nodes_take_no_work(fake):
    inventory_world(fake)
    inventory = backend(fake, **INVENTORY_SETTINGS).inventory()
    assert [
        (n.name, n.flavor, n.gpus, n.gpus_used, n.gpus_used_by_gantry, n.schedulable, n.reason)
        for n in inventory.nodes
    ] == [
        ("a100-0", "a100-80gb", 8, 7, 4, True, ""),
        ("a100-1", "a100-80gb", 8, 0, 0, False, "cordoned"),
        ("a100-2", "a100-80gb", 8, 0, 0, False, "NotReady"),
        ("a100-3", "a100-80gb", 8, 8, 0, False, "taint dedicated=inference:NoSchedule"),
        ("a100-4", "a100-80gb", 8, 0, 0, True, ""),
        ("a100-5", "a100-80gb", 8, 0, 0, True, ""),
        ("mig-0", "a100-1g.10gb", 7, 3, 0, True, ""),
    ]


def test_inventory_reads_the_topology_and_names_the_nodes_that_lack_a_label(fake):
    inventory_world(fake)
    inventory = backend(fake, **INVENTORY_SETTINGS).inventory()
    assert [(n.name, n.path) for n in inventory.nodes] == [
        ("a100-0", ("b1", "r1")),
        ("a100-1", ("b1", "r2")),
        ("a100-2", ("b2", "r3")),
        ("a100-3", ("b2", "r3")),
        ("a100-4", ("b2", "r4")),
        ("a100-5", ("b2",)),
        ("mig-0", ("b1", "r1")),
    ]
    assert inventory.levels == ("block", "rack")
    assert inventory.problems == (
        "1 of 7 GPU nodes lack the topology label network.example.org/topology-rack "
        "(level rack), so their topology stops above it: a100-5",
    )


def test_inventory_is_three_cluster_wide_lists_of_gpu_nodes_bound_pods_and_waiting_pods(fake):
    inventory_world(fake)
    fake.server.requests.clear()
    backend(fake, **INVENTORY_SETTINGS).inventory()
    assert [(r.path, r.query) for r in fake.server.requests] == [
        ("/api/v1/nodes", {"labelSelector": "nvidia.com/gpu.product", "limit": "500"}),
        (
            "/api/v1/pods",
            {
                "fieldSelector": "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
                "limit": "500",
            },
        ),
        (
            "/api/v1/pods",
            {"fieldSelector": "spec.nodeName=,status.phase=Pending", "limit": "500"},
        ),
    ]


def compact(fake: FakeKubernetes) -> None:
    """What etcd compaction does: the history before the newest change is gone, and with
    it every continue token handed out before."""
    fake.store.create("namespaces", "", {"metadata": {"name": f"ns-{fake.store.rv}"}})
    fake.store.events.clear()
    fake.store.create("namespaces", "", {"metadata": {"name": f"ns-{fake.store.rv}"}})


@time_machine.travel(dt.datetime(2026, 12, 6, 12, tzinfo=dt.UTC), tick=False)
def test_big_lists_are_paged_and_an_expired_page_restarts_the_list(fake, monkeypatch):
    # The clock stands still: a NotReady node's signal without a time is stamped now.
    inventory_world(fake)
    whole = backend(fake, **INVENTORY_SETTINGS).inventory()
    monkeypatch.setattr(kubernetes_backend, "LIST_PAGE", 2)
    list_page = fake.store.list_page
    compactions = []

    def compacted_once(*args, **kwargs):
        if kwargs.get("continue_token") and not compactions:
            compactions.append(1)
            compact(fake)
        return list_page(*args, **kwargs)

    monkeypatch.setattr(fake.store, "list_page", compacted_once)
    fake.server.requests.clear()
    assert backend(fake, **INVENTORY_SETTINGS).inventory() == whole
    pages = [(r.path, "continue" in r.query) for r in fake.server.requests]
    # Nodes: 8 GPU-labelled, 2 a page; the second page expires, the list starts again.
    # Pods: 7 bound and live (the Succeeded, Failed and unbound ones are left out); then
    # the one waiting for a node.
    assert pages == [
        ("/api/v1/nodes", False),
        ("/api/v1/nodes", True),
        ("/api/v1/nodes", False),
        *[("/api/v1/nodes", True)] * 3,
        ("/api/v1/pods", False),
        *[("/api/v1/pods", True)] * 3,
        ("/api/v1/pods", False),
    ]


def test_a_list_that_expires_again_and_again_is_a_transient_error(fake, monkeypatch):
    inventory_world(fake)
    monkeypatch.setattr(kubernetes_backend, "LIST_PAGE", 2)
    list_page = fake.store.list_page

    def always_compacted(*args, **kwargs):
        if kwargs.get("continue_token"):
            compact(fake)
        return list_page(*args, **kwargs)

    monkeypatch.setattr(fake.store, "list_page", always_compacted)
    with pytest.raises(TransientBackendError, match="list nodes: the list expired twice"):
        backend(fake, **INVENTORY_SETTINGS).inventory()


def test_a_topology_label_no_gpu_node_carries_is_a_problem_and_paths_stay_empty():
    settings_ = parse_settings(
        {
            "url": "https://x",
            "flavors": {"a": {"product": A100}},
            "topology_labels": ["topology.kubernetes.io/zone", "example.org/rack"],
        }
    )
    node = {
        "metadata": {
            "name": "n1",
            "labels": {"nvidia.com/gpu.product": A100, "example.org/rack": "r1"},
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    inventory = node_inventory([node], [], settings_)
    assert [(n.name, n.path) for n in inventory.nodes] == [("n1", ())]
    assert inventory.levels == ("zone", "rack")
    assert inventory.problems == (
        "no GPU node carries the topology label topology.kubernetes.io/zone (level zone)",
    )


def test_a_sidecar_adds_to_a_pods_request_and_an_init_step_may_exceed_it():
    def pod(containers, init=()):
        def container(gpus, **extra):
            return {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}, **extra}

        return {
            "spec": {
                "containers": [container(g) for g in containers],
                "initContainers": [container(g, **extra) for g, extra in init],
            }
        }

    assert pod_request(pod([2, 1]), "nvidia.com/gpu") == 3
    assert pod_request(pod([2], init=[(1, {"restartPolicy": "Always"})]), "nvidia.com/gpu") == 3
    assert pod_request(pod([1], init=[(4, {})]), "nvidia.com/gpu") == 4
    assert pod_request(pod([1]), "nvidia.com/mig-1g.10gb") == 0


# --- placement on the cluster ------------------------------------------------------------------


def test_a_placed_gang_runs_on_its_nodes_one_rank_on_each(fake):
    for i in range(4):
        fake.controller.add_node(f"gpu-{i}", product=A100, gpus=8)
    k8s = backend(fake)
    placed = spec(nodes=2, gpus_per_node=4, placement=("gpu-1", "gpu-3"))
    ref = JobRef("gantry-a7", k8s.submit(placed))
    status = run_until(fake, k8s, ref, "RUNNING", seconds=1)
    # Left to itself, the scheduler would have put both ranks on gpu-0.
    assert status.node_list == ["gpu-1", "gpu-3"]


def test_a_placed_job_whose_nodes_were_taken_stays_pending_with_the_schedulers_words(fake):
    for i in range(3):
        fake.controller.add_node(f"gpu-{i}", product=A100, gpus=8)
    # Between the inventory and the submit, jobs of another team took the chosen nodes.
    fake.controller.add_pod("etl-1", namespace="data-eng", node="gpu-0", gpus=8)
    fake.controller.add_pod("etl-2", namespace="data-eng", node="gpu-1", gpus=4)
    k8s = backend(fake)
    ref = JobRef(
        "gantry-a7", k8s.submit(spec(nodes=2, gpus_per_node=8, placement=("gpu-0", "gpu-1")))
    )
    fake.controller.advance(1, steps=3)
    status = k8s.sync([ref])["gantry-a7"]
    assert (status.state, status.message, status.node_list) == (
        "PENDING",
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "2 Insufficient nvidia.com/gpu.",
        [],
    )
    pods = fake.controller.pods_of("gantry-vision", "gantry-a7")
    assert [p["status"]["conditions"][0]["reason"] for p in pods] == ["Unschedulable"] * 2
    fake.controller.finish_pod("data-eng", "etl-1")
    fake.controller.finish_pod("data-eng", "etl-2")
    assert run_until(fake, k8s, ref, "RUNNING", seconds=1).node_list == ["gpu-0", "gpu-1"]


def test_with_kueue_a_placed_job_is_not_pinned_kueue_places_it(fake):
    for i in range(2):
        fake.controller.add_node(f"gpu-{i}", product=A100, gpus=8)
    k8s = backend(
        fake,
        queueing="kueue",
        kueue_queue="gpu",
        topology_labels=[{"name": "block", "label": BLOCK}],
    )
    placed = spec(placement=("gpu-1",), topology_level="block")
    ref = JobRef("gantry-a7", k8s.submit(placed))
    template = fake.store.get("jobs", "gantry-vision", "gantry-a7")["spec"]["template"]
    assert "affinity" not in template["spec"]
    assert template["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] == BLOCK
    fake.controller.admit("gantry-vision", "gantry-a7")
    # Where Kueue (here the fake's scheduler) puts it, not where Gantry's admission would.
    assert run_until(fake, k8s, ref, "RUNNING", seconds=1).node_list == ["gpu-0"]


# --- outage and connection errors ------------------------------------------------------------


def test_an_outage_is_transient_and_sync_converges_when_the_server_is_back(fake):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.controller.advance(1, steps=3)
    port = fake.server.port
    fake.stop()
    with pytest.raises(TransientBackendError, match="connection refused"):
        k8s.sync([ref])
    with pytest.raises(TransientBackendError, match="connection refused"):
        k8s.submit(spec(8))
    fake.controller.advance(120)  # the cluster goes on without us
    fake.start()
    assert fake.server.port == port
    assert k8s.sync([ref])["gantry-a7"].state == "SUCCEEDED"


@pytest.mark.parametrize(("status", "words"), [(503, "answered 503"), (429, "answered 429")])
def test_5xx_and_429_are_transient(fake, status, words):
    k8s = backend(fake)
    ref = JobRef("gantry-a7", k8s.submit(spec()))
    fake.server.fail_next(1, status=status, retry_after=7)
    with pytest.raises(TransientBackendError, match=f"{words}, retry after 7 s"):
        k8s.sync([ref])
    assert k8s.sync([ref])["gantry-a7"].state == "PENDING"


def test_test_connection_says_who_we_are(fake):
    message = backend(fake).test_connection()
    assert message == (
        f"Connected to k8s-test: Kubernetes v1.37.0 at {fake.url} as "
        "system:serviceaccount:gantry:gantry."
    )


def test_test_connection_explains_a_wrong_url_token_or_missing_token(fake, monkeypatch):
    closed = backend(fake)
    closed.cluster.settings = {**closed.cluster.settings, "url": "http://127.0.0.1:9"}
    with pytest.raises(TransientBackendError, match=r"http://127\.0\.0\.1:9: connection refused"):
        KubernetesBackend(closed.cluster).test_connection()
    monkeypatch.setenv(TOKEN_ENV, "wrong")
    with pytest.raises(TransientBackendError, match=f"401 Unauthorized.*{TOKEN_ENV}"):
        backend(fake).test_connection()
    monkeypatch.delenv(TOKEN_ENV)
    with pytest.raises(TransientBackendError, match=f"{TOKEN_ENV} .* is not set on this host"):
        backend(fake).test_connection()


def _certificate(common_name, key, issuer=None, issuer_key=None, *, ca=False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def pem(cert):
        return cert.public_bytes(serialization.Encoding.PEM)

    ca_key, other_key, server_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("gantry-test-ca", ca_key, ca=True)
    other_ca = _certificate("someone-else-ca", other_key, ca=True)
    server = _certificate("127.0.0.1", server_key, ca.subject, ca_key)
    files = {
        "ca": tmp_path / "ca.crt",
        "other_ca": tmp_path / "other-ca.crt",
        "cert": tmp_path / "server.crt",
        "key": tmp_path / "server.key",
    }
    files["ca"].write_bytes(pem(ca))
    files["other_ca"].write_bytes(pem(other_ca))
    files["cert"].write_bytes(pem(server))
    files["key"].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def test_tls_with_the_right_ca_connects_and_a_wrong_or_missing_ca_is_explained(
    tls_files, monkeypatch
):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files["cert"], tls_files["key"])
    with FakeKubernetes(token=TOKEN, ssl_context=context) as tls_fake:
        good = backend(tls_fake, ca_file=str(tls_files["ca"]))
        assert good.test_connection().startswith("Connected to k8s-test")
        wrong = backend(tls_fake, ca_file=str(tls_files["other_ca"]))
        with pytest.raises(TransientBackendError, match="TLS certificate verification failed"):
            wrong.test_connection()
        missing = backend(tls_fake, ca_file=str(tls_files["ca"]) + ".gone")
        with pytest.raises(TransientBackendError, match=r"CA file .* does not exist"):
            missing.test_connection()


def test_a_kubeconfig_works_and_leaves_the_global_client_configuration_alone(fake, tmp_path):
    before = client.Configuration.get_default_copy().host
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
                "users": [{"name": "gantry", "user": {"token": TOKEN}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "fake", "user": "gantry"}}],
                "current-context": "ctx",
            }
        )
    )
    cluster = Cluster(
        name="k8s-kubeconfig",
        backend=Cluster.Backend.KUBERNETES,
        settings={"kubeconfig": str(kubeconfig), "context": "ctx", "flavors": {}},
    )
    assert KubernetesBackend(cluster).test_connection().startswith("Connected to k8s-kubeconfig")
    assert client.Configuration.get_default_copy().host == before


# --- pure status mapping: cases the fake does not produce ------------------------------------


def _pod(rank, *, terminated=None, conditions=(), reason="", phase="Failed", node="n"):
    status = {"phase": phase, "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
    if terminated is not None:
        status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
    return {
        "metadata": {
            "name": f"j-{rank}-x",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"nodeName": node},
        "status": status,
    }


def _exit(code, message="", at="2026-01-01T00:10:00Z", reason="Error"):
    return {
        "exitCode": code,
        "reason": reason,
        "message": message,
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": at,
    }


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        (_pod(0, terminated=_exit(1, "Xid 79: GPU has fallen off the bus")), "GPU_XID"),
        (_pod(0, terminated=_exit(1, "ncclSystemError: System call failed")), "NCCL"),
        (_pod(0, terminated=_exit(1, "CUDA error: out of memory")), "OOM_GPU"),
        (_pod(0, terminated=_exit(137, reason="OOMKilled")), "OOM_HOST"),
        (_pod(0, terminated=_exit(2)), "USER_EXIT"),
        (_pod(0, reason="NodeLost"), "NODE_FAILURE"),
        (_pod(0, reason="Evicted"), "PREEMPTED"),
        (
            _pod(
                0,
                conditions=[
                    {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}
                ],
            ),
            "NODE_FAILURE",
        ),
        (
            _pod(
                0,
                conditions=[
                    {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}
                ],
                reason="Evicted",
            ),
            "PREEMPTED",
        ),
    ],
)
def test_pod_failures_map_to_the_taxonomy(pod, reason):
    assert pod_failure(pod).reason == reason


def test_a_gpu_failure_of_one_rank_outranks_the_nccl_errors_of_its_peers():
    pods = [
        _pod(0, terminated=_exit(1, "NCCL error: unhandled system error", "2026-01-01T00:09:00Z")),
        _pod(1, terminated=_exit(1, "CUDA out of memory", "2026-01-01T00:10:00Z")),
        _pod(2, terminated=_exit(1, "NCCL WARN timeout", "2026-01-01T00:08:00Z")),
    ]
    cause = root_cause(pod_failure(p) for p in pods)
    assert (cause.reason, cause.rank) == ("OOM_GPU", 1)


def test_a_failed_job_whose_pods_are_gone_is_explained_by_its_condition():
    job = {
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"completions": 1},
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "Container trainer for pod ns/j-0-x failed with exit code 42 "
                    "matching FailJob rule at index 1",
                    "lastTransitionTime": "2026-01-01T00:10:00Z",
                }
            ]
        },
    }
    status = job_status(job, [])
    assert (status.state, status.failure_reason, status.exit_code) == ("FAILED", "USER_EXIT", 42)


def test_inventory_of_no_nodes_is_empty():
    settings_ = parse_settings({"url": "https://x", "flavors": {"a": {"product": A100}}})
    assert node_inventory([], [], settings_) == Inventory(nodes=())


# --- through the services ----------------------------------------------------------------------


@pytest.fixture
def k8s_world(world, fake):
    """The world with its simulator switched off and a Kubernetes cluster on the fake."""
    Cluster.objects.filter(pk=world.cluster.pk).update(enabled=False)
    for i in range(2):
        fake.controller.add_node(f"gpu-{i}", product=A100, gpus=8)
    cluster = Cluster.objects.create(
        name="k8s-1", backend=Cluster.Backend.KUBERNETES, settings=settings_for(fake)
    )
    cluster_refresh_inventory(cluster=cluster)
    assert list(
        ClusterFlavor.objects.filter(cluster=cluster).values_list(
            "flavor__slug", "nodes", "gpus_per_node"
        )
    ) == [("a100-80gb", 2, 8)]
    world.k8s = cluster
    world.fake = fake
    return world


def _submitted_run(world, **overrides):
    run = run_submit(user=world.researcher_a, data=experiment_input(world, **overrides))
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    assert attempt.cluster_id == world.k8s.pk
    attempt_submit(attempt_id=attempt.pk)
    world.fake.controller.clock.catch_up()  # the run's events so far come before the pod's
    return run, attempt


def _sync(world, seconds=10.0):
    world.fake.controller.advance(seconds)
    _sync_now(world)


def _sync_now(world):
    """Sync at the fake cluster's time: its clock moves when told, Gantry's with it (a
    backend whose clock runs ahead of Gantry's is not believed: tests/jobs/test_clock_skew)."""
    with time_machine.travel(world.fake.controller.clock.now, tick=True):
        cluster_sync(cluster=world.k8s)


def test_a_job_that_ran_between_two_syncs_still_ran_in_its_runs_timeline(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    # Scheduled, started and finished while no sync looked (an outage held the syncs up).
    world.fake.controller.advance(1, steps=3)
    world.fake.controller.advance(120, steps=3)
    _sync_now(world)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.SUCCEEDED, AttemptState.SUCCEEDED)
    assert list(run.events.values_list("to_state", "reason")) == [
        ("QUEUED", "SUBMITTED"),
        ("ADMITTED", "ADMITTED"),
        ("SUBMITTING", "SUBMITTING"),
        ("PENDING", "SUBMITTED"),
        ("RUNNING", "STARTED"),
        ("SUCCEEDED", "SUCCEEDED"),
    ]
    # When the cluster says it started, not when Gantry saw it.
    assert run.started_at == attempt.started_at
    assert attempt.started_at < attempt.finished_at == run.finished_at


def test_a_run_goes_from_queued_to_succeeded_on_kubernetes(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    attempt.refresh_from_db()
    run.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.PENDING, AttemptState.PENDING)
    assert attempt.backend_job_id == f"gantry-vision/gantry-a{attempt.pk}"
    # Stored as the JSON the API server receives (the token redacted), shown as YAML.
    stored = json.loads(attempt.rendered_spec)
    assert [obj["kind"] for obj in stored] == ["Secret", "Job"]
    assert stored[-1]["metadata"]["name"] == f"gantry-a{attempt.pk}"
    assert "<redacted>" in attempt.rendered_spec
    shown = spec_for_people("kubernetes", attempt.rendered_spec)
    assert list(yaml.safe_load_all(shown)) == stored
    assert shown.startswith("apiVersion: v1\nkind: Secret\n")
    page = render_to_string("jobs/_attempt_record.html", {"attempt": attempt, "runtime": []})
    assert f'<pre class="code">{escape(shown)}</pre>' in page
    job_head = f"---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: gantry-a{attempt.pk}\n"
    assert job_head in shown
    for _ in range(3):
        _sync(world, 1)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert run.state == RunState.RUNNING
    assert attempt.node_list == ["gpu-0"]
    for _ in range(8):
        _sync(world)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state, attempt.exit_code) == ("SUCCEEDED", "SUCCEEDED", 0)
    assert list(run.events.values_list("to_state", flat=True)) == [
        "QUEUED",
        "ADMITTED",
        "SUBMITTING",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
    ]
    assert "rank 0 of 1 starting on gpu-0" in run_logs(run=run)


def test_admission_places_a_gang_on_free_gpus_only_and_kubernetes_runs_it_there(k8s_world):
    world, fake = k8s_world, k8s_world.fake
    # gpu-0 and gpu-1 (of the fixture) and gpu-2 share rack r1; gpu-3 and gpu-4 rack r2.
    # Another team's job holds half of gpu-0, and gpu-1 is cordoned for maintenance.
    for name in ("gpu-0", "gpu-1"):
        fake.store.patch("nodes", "", name, {"metadata": {"labels": {RACK: "r1"}}}, "merge")
    fake.controller.add_node("gpu-2", product=A100, gpus=8, labels={RACK: "r1"})
    for name in ("gpu-3", "gpu-4"):
        fake.controller.add_node(name, product=A100, gpus=8, labels={RACK: "r2"})
    fake.controller.cordon("gpu-1")
    fake.controller.add_pod("etl-1", namespace="data-eng", node="gpu-0", gpus=4)
    Cluster.objects.filter(pk=world.k8s.pk).update(
        settings={**world.k8s.settings, "topology_labels": [RACK]}
    )
    world.k8s.refresh_from_db()
    cluster_refresh_inventory(cluster=world.k8s)
    world.k8s.refresh_from_db()
    assert (world.k8s.topology_levels, world.k8s.inventory_problems) == (["rack"], [])
    nodes = ClusterNode.objects.filter(cluster=world.k8s).order_by("name")
    assert [
        (n.name, n.gpus, n.gpus_used, n.gpus_used_by_gantry, n.schedulable, n.reason, n.path)
        for n in nodes
    ] == [
        ("gpu-0", 8, 4, 0, True, "", ["r1"]),
        ("gpu-1", 8, 0, 0, False, "cordoned", ["r1"]),
        ("gpu-2", 8, 0, 0, True, "", ["r1"]),
        ("gpu-3", 8, 0, 0, True, "", ["r2"]),
        ("gpu-4", 8, 0, 0, True, "", ["r2"]),
    ]

    run, attempt = _submitted_run(world, nodes=2, gpus_per_node=8)
    attempt.refresh_from_db()
    # Only r2 has two nodes with 8 free GPUs; the scheduler alone would take gpu-2 first.
    assert attempt.placement == ["gpu-3", "gpu-4"]
    job = fake.store.get("jobs", "gantry-vision", attempt.name)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-3"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-4"]}]},
    ]
    for _ in range(3):
        _sync(world, 1)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.RUNNING, AttemptState.RUNNING)
    assert attempt.node_list == attempt.placement == ["gpu-3", "gpu-4"]
    cluster_refresh_inventory(cluster=world.k8s)
    assert list(
        ClusterNode.objects.filter(cluster=world.k8s, gpus_used__gt=0)
        .order_by("name")
        .values_list("name", "gpus_used", "gpus_used_by_gantry")
    ) == [("gpu-0", 4, 0), ("gpu-3", 8, 8), ("gpu-4", 8, 8)]


def test_a_gpu_oom_on_kubernetes_fails_the_run_with_its_reason(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    for _ in range(3):
        _sync(world, 1)
    world.fake.controller.inject(attempt.name, "oom_gpu")
    _sync(world, 1)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, run.failure_reason) == ("FAILED", "OOM_GPU")
    assert (attempt.state, attempt.failure_reason, attempt.exit_code) == ("FAILED", "OOM_GPU", 1)
    assert "CUDA out of memory" in attempt.failure_message


def test_a_redelivered_submit_task_never_creates_a_second_job(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    attempt_submit(attempt_id=attempt.pk)
    # A worker that died after the Job was created but before recording it.
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUBMITTING)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUBMITTING)
    attempt_submit(attempt_id=attempt.pk)
    jobs, _ = world.fake.store.list("jobs")
    assert [j["metadata"]["name"] for j in jobs] == [f"gantry-a{attempt.pk}"]
    assert world.fake.server.count("POST", r"/jobs$") == 1
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.PENDING


def _token_in_secret(world, attempt) -> str:
    """The token the job's pods read: what the attempt's Secret holds on the cluster."""
    secret = world.fake.store.get("secrets", "gantry-vision", f"gantry-a{attempt.pk}-token")
    return base64.b64decode(secret["data"]["GANTRY_ATTEMPT_TOKEN"]).decode()


def _reports_with(token: str) -> int:
    job = APIClient()
    job.credentials(HTTP_AUTHORIZATION="Attempt " + token)
    return job.post(
        reverse("api:attempt-report"), {"cuda_version": "12.4"}, format="json"
    ).status_code


def test_a_submit_retried_after_its_secret_was_created_leaves_the_job_a_valid_token(k8s_world):
    # Given a first try that created the token's Secret, then failed to create the Job
    world = k8s_world
    run = run_submit(user=world.researcher_a, data=experiment_input(world))
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    world.fake.server.fail_next(1, status=503, path=r"/jobs$")
    with pytest.raises(TransientBackendError):
        attempt_submit(attempt_id=attempt.pk)
    first_token = _token_in_secret(world, attempt)

    # When the submit is retried (a new token is issued, the Secret already exists)
    attempt_submit(attempt_id=attempt.pk)

    # Then the Job runs with the first try's token, and it reports; the stored spec holds
    # no token, and the cluster holds one Job
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.PENDING
    assert _token_in_secret(world, attempt) == first_token
    assert AttemptToken.objects.filter(attempt=attempt).count() == 2
    assert _reports_with(first_token) == 200
    assert first_token not in attempt.rendered_spec
    assert len(world.fake.store.list("jobs", "gantry-vision")[0]) == 1


def test_a_job_adopted_after_a_worker_died_keeps_a_token_that_reports(k8s_world):
    # Given a job created on the cluster by a submit whose worker died before recording it
    world = k8s_world
    run, attempt = _submitted_run(world)
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.SUBMITTING)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUBMITTING)
    token = _token_in_secret(world, attempt)

    # When the redelivered submit adopts it
    attempt_submit(attempt_id=attempt.pk)

    # Then the job's token still reports, and no second Job was created
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.PENDING
    assert _reports_with(token) == 200
    assert world.fake.server.count("POST", r"/jobs$") == 1


def test_the_token_of_a_job_dies_when_its_attempt_ends_on_kubernetes(k8s_world):
    world = k8s_world
    _, attempt = _submitted_run(world)
    token = _token_in_secret(world, attempt)
    assert _reports_with(token) == 200

    world.fake.controller.advance(1, steps=3)
    world.fake.controller.advance(120, steps=3)
    _sync_now(world)

    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.SUCCEEDED
    assert _reports_with(token) == 401


def test_an_outage_leaves_runs_unchanged_and_visible_then_converges(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    _sync(world, 1)
    world.fake.stop()
    world.fake.controller.advance(1, steps=3)
    with pytest.raises(TransientBackendError):
        cluster_sync(cluster=world.k8s)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.state) == (RunState.PENDING, AttemptState.PENDING)
    assert attempt.backend_error.startswith("backend unreachable: cannot reach the Kubernetes")
    world.fake.start()
    cluster_sync(cluster=world.k8s)
    run.refresh_from_db()
    attempt.refresh_from_db()
    assert (run.state, attempt.backend_error) == (RunState.RUNNING, "")


def test_cancelling_a_running_run_deletes_its_job(k8s_world):
    world = k8s_world
    run, attempt = _submitted_run(world)
    for _ in range(3):
        _sync(world, 1)
    run_cancel(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=attempt.pk)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    world.fake.controller.advance(1)
    assert world.fake.store.list("jobs")[0] == []


def test_the_registry_finds_the_backend(k8s_world):
    assert isinstance(backend_for(k8s_world.k8s), KubernetesBackend)


def test_wrong_cluster_settings_fail_no_run_and_say_what_is_wrong():
    cluster = Cluster(
        name="k8s-typo",
        backend=Cluster.Backend.KUBERNETES,
        settings={"url": "https://k8s.example.org", "tokn_env": "X", "flavors": {}},
    )
    k8s = KubernetesBackend(cluster)
    for call in (
        k8s.test_connection,
        k8s.inventory,
        lambda: k8s.sync([]),
        lambda: k8s.submit(spec()),
    ):
        with pytest.raises(TransientBackendError, match=r"k8s-typo: .*unknown key\(s\) tokn_env"):
            call()
