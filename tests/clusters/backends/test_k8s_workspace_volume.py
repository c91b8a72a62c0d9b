"""A workspace's volume on Kubernetes (docs/workspaces.md, "Backends"): one
PersistentVolumeClaim per workspace run, created with its first attempt and adopted by a
retried submit and by every later attempt, kept by a suspend, deleted once the workspace
has ended for good (again and again until the API server has done it); the fake API server
serves claims as the real one does; wrong volume settings are refused and change nothing."""

import json
import logging
import os
from dataclasses import replace

import pytest
import yaml
from django.core.cache import cache
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from clusters.backends.base import JobRef, PermanentBackendError, TransientBackendError
from clusters.backends.k8s_manifest import render, to_yaml
from clusters.backends.k8s_settings import parse_settings
from core.schema import SchemaError
from jobs.models import Attempt, AttemptState, Run, RunState, Workspace
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import SYNC_SLOT_KEY, attempt_cancel
from jobs.services.workspace_lifecycle import workspace_resume, workspace_suspend
from jobs.services.workspace_storage import workspace_storage_release_ended
from jobs.services.workspaces import workspace_stop
from jobs.tasks import sync_all_clusters
from tests.clusters.backends.test_k8s_backend import (
    _sync,
    backend,
    fake,  # noqa: F401 (a fixture)
    k8s_world,  # noqa: F401 (a fixture)
    official_client,
)
from tests.clusters.backends.test_k8s_manifest import BASE_SETTINGS, GOLDEN, K8S_VERSIONS
from tests.clusters.backends.test_workspace_backends import WORKSPACE, spec
from tests.k8s_schemas import validate
from tests.workspace_support import launch_workspace

NAMESPACE = "gantry-vision"
CLAIMS = "persistentvolumeclaims"
RUN_LABELS = {
    "gantry.io/tenant": "vision",
    "gantry.io/project": "detection",
    "gantry.io/run": "3",
    "app.kubernetes.io/managed-by": "gantry",
}


def workspace_spec(attempt_id: int):
    return spec(attempt_id=attempt_id, name=f"gantry-a{attempt_id}", run_id=3)


@pytest.fixture
def core(fake):  # noqa: F811
    """The official client's core API on the fake, closed after the test."""
    api = official_client(fake)
    yield client.CoreV1Api(api)
    api.close()


def claim_uid(fake) -> str:  # noqa: F811 (the fixture's value)
    return fake.store.get(CLAIMS, NAMESPACE, "gantry-ws-3")["metadata"]["uid"]


# --- the manifest ------------------------------------------------------------------------------


def test_a_workspaces_manifest_matches_its_golden_file_and_the_official_schemas():
    """Regenerate with GANTRY_UPDATE_GOLDEN=1 after a reviewed change."""
    settings = parse_settings(
        {**BASE_SETTINGS, "workspace_volume_size": "50Gi", "workspace_storage_class": "fast-rwo"}
    )
    objects = render(spec(attempt_token="", workspace=replace(WORKSPACE, token="")), settings)
    text = to_yaml(objects)
    path = GOLDEN / "workspace.yaml"
    if os.environ.get("GANTRY_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert list(yaml.safe_load_all(text)) == objects
    for version in K8S_VERSIONS:
        for obj in objects:
            validate(obj, version)


# --- the fake API server serves claims ---------------------------------------------------------


def test_the_fake_creates_reads_refuses_twice_and_deletes_claims_over_http(core):
    core.create_namespace({"metadata": {"name": "team-a"}})
    body = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    }
    created = json.loads(
        core.create_namespaced_persistent_volume_claim("team-a", body, _preload_content=False).data
    )
    assert (created["kind"], created["apiVersion"], created["metadata"]["finalizers"]) == (
        "PersistentVolumeClaim",
        "v1",
        ["kubernetes.io/pvc-protection"],
    )
    assert created["status"] == {"phase": "Pending"}
    read = core.read_namespaced_persistent_volume_claim("data", "team-a")
    assert read.spec.resources.requests == {"storage": "5Gi"}

    with pytest.raises(ApiException) as twice:
        core.create_namespaced_persistent_volume_claim("team-a", body)
    assert (twice.value.status, json.loads(twice.value.body)["reason"]) == (409, "AlreadyExists")
    assert json.loads(twice.value.body)["message"] == (
        'persistentvolumeclaims "data" already exists'
    )

    # Answered with the claim, as being deleted (no pod mounts it: gone at once).
    deleted = core.delete_namespaced_persistent_volume_claim("data", "team-a")
    assert (deleted.kind, deleted.metadata.name) == ("PersistentVolumeClaim", "data")
    assert deleted.metadata.deletion_timestamp is not None
    for call in (
        lambda: core.read_namespaced_persistent_volume_claim("data", "team-a"),
        lambda: core.delete_namespaced_persistent_volume_claim("data", "team-a"),
    ):
        with pytest.raises(ApiException) as missing:
            call()
        assert (missing.value.status, json.loads(missing.value.body)["message"]) == (
            404,
            'persistentvolumeclaims "data" not found',
        )


@pytest.mark.parametrize(
    ("claim_spec", "message"),
    [
        (
            {"resources": {"requests": {"storage": "5Gi"}}},
            "spec.accessModes: Required value: at least 1 access mode is required",
        ),
        ({"accessModes": ["ReadWriteOnce"]}, "spec.resources[storage]: Required value"),
        (
            {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "0Gi"}}},
            'spec.resources[storage]: Invalid value: "0Gi": must be greater than zero',
        ),
    ],
)
def test_the_fake_refuses_a_claim_the_api_server_refuses(fake, core, claim_spec, message):  # noqa: F811
    core.create_namespace({"metadata": {"name": "team-a"}})
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_persistent_volume_claim(
            "team-a", {"metadata": {"name": "data"}, "spec": claim_spec}
        )
    assert (refused.value.status, json.loads(refused.value.body)["message"]) == (422, message)
    assert fake.store.list(CLAIMS)[0] == []


def test_a_claim_a_pod_mounts_stays_until_the_pod_is_gone_and_no_pod_starts_without_it(
    fake,  # noqa: F811
):
    k8s = backend(fake)
    k8s.submit(workspace_spec(7))
    fake.controller.advance(1, steps=3)
    [pod] = fake.controller.pods_of(NAMESPACE, "gantry-a7")
    assert pod["status"]["phase"] == "Running"

    # Deleted while its pod runs: Terminating, as the pvc-protection finalizer keeps it.
    k8s.workspace_release(run_id=3, tenant="vision")
    assert fake.store.get(CLAIMS, NAMESPACE, "gantry-ws-3")["metadata"]["deletionTimestamp"]
    k8s.cancel(JobRef("gantry-a7", "gantry-vision/gantry-a7"))
    fake.controller.advance(1)
    assert fake.store.list(CLAIMS)[0] == []

    # A pod whose claim is missing is not scheduled, and says why.
    k8s.submit(workspace_spec(8))
    fake.store.delete(CLAIMS, NAMESPACE, "gantry-ws-3", None)
    fake.controller.advance(1, steps=2)
    [pending] = fake.controller.pods_of(NAMESPACE, "gantry-a8")
    assert pending["spec"].get("nodeName") is None
    assert pending["status"]["conditions"][0]["message"] == (
        'persistentvolumeclaim "gantry-ws-3" not found'
    )


# --- the backend: create, adopt, keep, delete --------------------------------------------------


def test_the_first_submit_creates_the_claim_a_retry_and_the_next_attempt_adopt_it(
    fake,  # noqa: F811
):
    k8s = backend(fake, workspace_volume_size="50Gi", workspace_storage_class="fast-rwo")
    assert k8s.submit(workspace_spec(7), may_exist=False) == "gantry-vision/gantry-a7"
    claim = fake.store.get(CLAIMS, NAMESPACE, "gantry-ws-3")
    assert claim["metadata"]["labels"] == RUN_LABELS
    assert claim["metadata"]["annotations"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
    }
    assert "ownerReferences" not in claim["metadata"]  # the Job's deletion leaves it
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "fast-rwo",
    }
    uid = claim["metadata"]["uid"]
    pod_spec = fake.store.get("jobs", NAMESPACE, "gantry-a7")["spec"]["template"]["spec"]
    assert pod_spec["volumes"][1] == {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": "gantry-ws-3"},
    }

    # The same submit again, its look-up skipped (a retry after a timeout): both adopted.
    assert k8s.submit(workspace_spec(7), may_exist=False) == "gantry-vision/gantry-a7"
    assert fake.server.count("POST", f"/namespaces/{NAMESPACE}/{CLAIMS}$") == 2
    assert (len(fake.store.list(CLAIMS)[0]), claim_uid(fake)) == (1, uid)

    # A suspend cancels the attempt: its Job, Service and Secret go, the claim stays.
    k8s.cancel(JobRef("gantry-a7", "gantry-vision/gantry-a7"))
    fake.controller.advance(1)
    assert fake.store.list("jobs")[0] == []
    assert fake.store.list("services")[0] == []
    assert claim_uid(fake) == uid

    # Resumed: the next attempt mounts the same claim, and its pod starts.
    k8s.submit(workspace_spec(8))
    assert claim_uid(fake) == uid
    fake.controller.advance(1, steps=3)
    [pod] = fake.controller.pods_of(NAMESPACE, "gantry-a8")
    assert (pod["status"]["phase"], pod["spec"]["volumes"][1]["persistentVolumeClaim"]) == (
        "Running",
        {"claimName": "gantry-ws-3"},
    )


def test_a_claim_of_the_name_that_is_not_the_workspaces_is_not_adopted(fake, core):  # noqa: F811
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    core.create_namespaced_persistent_volume_claim(
        NAMESPACE,
        {
            "metadata": {"name": "gantry-ws-3", "labels": {"gantry.io/run": "4"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    with pytest.raises(
        PermanentBackendError,
        match=r"^persistentvolumeclaim gantry-vision/gantry-ws-3 exists but is not this "
        r"workspace's$",
    ):
        backend(fake).submit(workspace_spec(7))
    assert fake.store.list("jobs")[0] == []


def test_release_deletes_the_claim_once_and_a_failing_api_server_is_a_transient_error(
    fake,  # noqa: F811
):
    k8s = backend(fake)
    k8s.submit(workspace_spec(7))
    k8s.cancel(JobRef("gantry-a7", "gantry-vision/gantry-a7"))
    fake.controller.advance(1)

    fake.server.fail_next(1, status=503, path=f"/{CLAIMS}/gantry-ws-3$")
    with pytest.raises(
        TransientBackendError,
        match=r"^delete persistentvolumeclaim gantry-vision/gantry-ws-3: API server answered "
        r"503: injected fault 503$",
    ):
        k8s.workspace_release(run_id=3, tenant="vision")
    assert fake.store.get(CLAIMS, NAMESPACE, "gantry-ws-3")["metadata"]["name"] == "gantry-ws-3"

    k8s.workspace_release(run_id=3, tenant="vision")
    assert fake.store.list(CLAIMS)[0] == []
    k8s.workspace_release(run_id=3, tenant="vision")  # gone already: done
    assert fake.server.count("DELETE", f"/{CLAIMS}/gantry-ws-3$") == 3


# --- wrong volume settings -----------------------------------------------------------------------

SIZE_MESSAGE = (
    "workspace_volume_size must be a size above zero such as 20Gi (a number and one of Ki, Mi, "
    "Gi, Ti, Pi, k, M, G, T, P), not {}"
)
CLASS_MESSAGE = (
    "workspace_storage_class must be the name of a StorageClass (lower-case letters, digits, - "
    "and .), not {}"
)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("workspace_volume_size", "20 GB", SIZE_MESSAGE.format("'20 GB'")),
        ("workspace_volume_size", "0Gi", SIZE_MESSAGE.format("'0Gi'")),
        ("workspace_volume_size", "-5Gi", SIZE_MESSAGE.format("'-5Gi'")),
        ("workspace_volume_size", "20Gi\n", SIZE_MESSAGE.format("'20Gi\\n'")),
        ("workspace_volume_size", "", SIZE_MESSAGE.format("''")),
        ("workspace_volume_size", 20, "workspace_volume_size must be str, not 20"),
        ("workspace_storage_class", "Fast_SSD", CLASS_MESSAGE.format("'Fast_SSD'")),
        ("workspace_storage_class", "fast;rm", CLASS_MESSAGE.format("'fast;rm'")),
        (
            "workspace_fs_group",
            -1,
            "workspace_fs_group must be a group id from 0 to 2147483647, not -1",
        ),
        ("workspace_fs_group", "100", "workspace_fs_group must be int, not '100'"),
        ("workspace_fs_group", True, "workspace_fs_group must be int, not True"),
    ],
)
def test_wrong_volume_settings_say_what_is_wrong(setting, value, message):
    with pytest.raises(SchemaError) as refused:
        parse_settings({**BASE_SETTINGS, setting: value})
    assert str(refused.value) == f"Kubernetes cluster settings: {message}"


def test_the_volume_settings_default_to_20gi_of_the_clusters_default_class_and_group():
    settings = parse_settings(BASE_SETTINGS)
    assert (
        settings.workspace_volume_size,
        settings.workspace_storage_class,
        settings.workspace_fs_group,
    ) == ("20Gi", "", None)
    given = parse_settings({**BASE_SETTINGS, "workspace_volume_size": "1.5Ti"})
    assert given.workspace_volume_size == "1.5Ti"


def test_a_cluster_with_a_wrong_size_creates_and_deletes_nothing(fake):  # noqa: F811
    k8s = backend(fake, workspace_volume_size="20 GB")
    message = (
        "k8s-test: Kubernetes cluster settings: workspace_volume_size must be a size above zero "
        "such as 20Gi (a number and one of Ki, Mi, Gi, Ti, Pi, k, M, G, T, P), not '20 GB'"
    )
    for call in (
        lambda: k8s.submit(workspace_spec(7)),
        lambda: k8s.workspace_release(run_id=3, tenant="vision"),
    ):
        with pytest.raises(TransientBackendError) as refused:
            call()
        assert str(refused.value) == message
    assert fake.server.requests == []
    assert all(fake.store.list(plural)[0] == [] for plural in ("namespaces", CLAIMS, "jobs"))


# --- through the services: suspend keeps it, resume mounts it, stop deletes it -----------------


def _launch(world) -> Run:
    run = launch_workspace(world, name="notebook", hours=2)
    return run


def _start(world, run: Run) -> Attempt:
    admission_run_cycle()
    attempt = run.attempts.get(state=AttemptState.CREATED)
    assert attempt.cluster_id == world.k8s.pk
    attempt_submit(attempt_id=attempt.pk)
    for _ in range(3):
        _sync(world, 1)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    return attempt


def _claims(world) -> list[str]:
    return [claim["metadata"]["uid"] for claim in world.fake.store.list(CLAIMS)[0]]


def test_a_suspended_workspace_keeps_its_volume_a_resumed_one_mounts_it_a_stopped_one_loses_it(
    k8s_world,  # noqa: F811
):
    world = k8s_world
    run = _launch(world)
    first = _start(world, run)
    claim = world.fake.store.get(CLAIMS, NAMESPACE, f"gantry-ws-{run.pk}")
    assert claim["spec"]["resources"] == {"requests": {"storage": "20Gi"}}
    uid = claim["metadata"]["uid"]
    stored = json.loads(Attempt.objects.get(pk=first.pk).rendered_spec)
    assert [obj["kind"] for obj in stored] == ["PersistentVolumeClaim", "Secret", "Service", "Job"]

    workspace_suspend(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=first.pk)
    _sync(world, 1)
    run.refresh_from_db()
    assert run.state == RunState.SUSPENDED
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 0
    assert _claims(world) == [uid]

    workspace_resume(run=run, actor=world.researcher_a)
    second = _start(world, run)
    assert second.number == 2
    assert _claims(world) == [uid]
    job = world.fake.store.get("jobs", NAMESPACE, second.name)
    assert job["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"] == {
        "claimName": f"gantry-ws-{run.pk}"
    }

    workspace_stop(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=second.pk)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    assert Workspace.objects.get(run=run).storage_released_at is None
    # Not asked while its cluster has not answered this cycle.
    assert workspace_storage_release_ended(reachable=[]) == 0
    assert _claims(world) == [uid]
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 1
    world.fake.controller.advance(1)  # its pod was still going: the claim went after it
    assert _claims(world) == []
    assert Workspace.objects.get(run=run).storage_released_at is not None
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 0
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/") == 1


def test_a_workspace_stopped_while_suspended_loses_its_volume_and_a_failed_delete_is_retried(
    k8s_world,  # noqa: F811
):
    world = k8s_world
    run = _launch(world)
    first = _start(world, run)
    workspace_suspend(run=run, actor=world.researcher_a)
    attempt_cancel(attempt_id=first.pk)
    _sync(world, 1)
    workspace_stop(run=Run.objects.get(pk=run.pk), actor=world.researcher_a)
    assert Run.objects.get(pk=run.pk).state == RunState.CANCELLED

    world.fake.server.fail_next(1, status=503, path=f"/{CLAIMS}/")
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 0
    assert Workspace.objects.get(run=run).storage_released_at is None
    assert len(_claims(world)) == 1
    # The next cycle asks again: done.
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 1
    assert _claims(world) == []
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/") == 2


def test_a_workspace_whose_server_exited_loses_its_volume(k8s_world):  # noqa: F811
    world = k8s_world
    run = _launch(world)
    _start(world, run)
    for _ in range(8):  # the fake's pods end, status 0, after a minute
        _sync(world)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 1
    assert _claims(world) == []


def test_an_ended_workspace_on_the_simulator_is_released_with_nothing_to_delete(world):
    run = _launch(world)
    admission_run_cycle()
    assert run.attempts.get().cluster_id == world.cluster.pk
    run.attempts.update(state=AttemptState.CANCELLED)
    Run.objects.filter(pk=run.pk).update(state=RunState.CANCELLED)
    assert workspace_storage_release_ended(reachable=[]) == 0
    assert workspace_storage_release_ended(reachable=[world.cluster.pk]) == 1
    assert Workspace.objects.get(run=run).storage_released_at is not None


def _ended_on_its_cluster(world) -> Run:
    """A workspace admitted to its cluster that ended before its job got there."""
    run = _launch(world)
    admission_run_cycle()
    run.attempts.update(state=AttemptState.CANCELLED)
    Run.objects.filter(pk=run.pk).update(state=RunState.CANCELLED)
    return run


def test_a_cluster_that_fails_is_asked_once_a_cycle_and_a_run_with_a_job_left_waits(
    k8s_world,  # noqa: F811
):
    world = k8s_world
    first, second = _ended_on_its_cluster(world), _ended_on_its_cluster(world)
    world.fake.server.fail_next(1, status=503, path=f"/{CLAIMS}/")
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 0
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/") == 1  # not again for the second
    # A run whose job is still on its cluster (its end not seen yet) waits for it.
    second.attempts.update(state=AttemptState.RUNNING)
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 1
    assert [w.run_id for w in Workspace.objects.filter(storage_released_at__isnull=False)] == [
        first.pk
    ]
    second.attempts.update(state=AttemptState.CANCELLED)
    assert workspace_storage_release_ended(reachable=[world.k8s.pk]) == 1
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/") == 3


def test_the_sync_cycle_releases_after_its_cluster_answered_and_not_while_it_is_down(
    k8s_world,  # noqa: F811
    caplog,
):
    world = k8s_world
    run = _ended_on_its_cluster(world)
    world.fake.stop()
    with caplog.at_level(logging.INFO, logger="jobs.services.workspace_storage"):
        sync_all_clusters()
    assert Workspace.objects.get(run=run).storage_released_at is None
    assert [r.message for r in caplog.records if r.name == "jobs.services.workspace_storage"] == []
    world.fake.start()
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/") == 0
    cache.delete(SYNC_SLOT_KEY)  # beat's next sync, an interval later
    sync_all_clusters()
    assert Workspace.objects.get(run=run).storage_released_at is not None
    assert world.fake.server.count("DELETE", f"/{CLAIMS}/gantry-ws-{run.pk}$") == 1
