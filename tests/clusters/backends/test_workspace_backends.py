"""A workspace's job on every backend (docs/workspaces.md, "Backends"): what each renders,
that the server's secret reaches the job apart from every stored spec, and where each
backend says the server answers. The simulator's real process is in
tests/jobs/test_workspace_simulator.py, the real Slurm cluster's in
tests/clusters/backends/test_slurm_workspace.py."""

import base64
import json
from dataclasses import replace

import pytest

from clusters.backends.base import (
    JobRef,
    JobSpec,
    PermanentBackendError,
    WorkspaceSpec,
    job_env,
)
from clusters.backends.k8s_manifest import render
from clusters.backends.k8s_settings import parse_settings
from clusters.backends.simulator import SimulatorBackend
from clusters.backends.slurm_batch import batch_job
from clusters.backends.slurm_nodes import parse_rest_nodes, parse_scontrol_nodes
from clusters.backends.slurm_settings import SlurmSettings
from clusters.env_names import env_name_refusal
from clusters.models import Cluster
from core.schema import SchemaError
from jobs.models import Attempt
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import job_spec_for, job_spec_with_secrets
from jobs.services.workspaces import workspace_server_token
from tests.clusters.backends.test_k8s_backend import backend as k8s_backend
from tests.clusters.backends.test_k8s_backend import fake  # noqa: F401 (a fixture)
from tests.clusters.backends.test_k8s_manifest import BASE_SETTINGS, K8S_VERSIONS
from tests.k8s_fake import ApiError
from tests.k8s_schemas import validate
from tests.workspace_support import launch_workspace

ATTEMPT_TOKEN = "gat_41.attempt-secret"
SERVER_TOKEN = "f" * 64
WORKSPACE = WorkspaceSpec(server="jupyter", base_url="/w/17/", token=SERVER_TOKEN)


def spec(**overrides) -> JobSpec:
    values = {
        "name": "gantry-a41",
        "attempt_id": 41,
        "run_id": 17,
        "tenant": "vision",
        "project": "detection",
        "image": "registry.example.org/ml/pytorch@sha256:" + "a" * 64,
        "command": "gantry-workspace jupyter",
        "env": {},
        "api_url": "https://gantry.example.org/api/v1",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
        "max_runtime_s": 14400,
        "attempt_token": ATTEMPT_TOKEN,
        "workspace": WORKSPACE,
    }
    values.update(overrides)
    return JobSpec(**values)


def test_the_job_learns_its_server_and_base_url_and_no_job_may_set_them():
    env = job_env(spec())
    assert {k: v for k, v in env.items() if k.startswith("GANTRY_WORKSPACE")} == {
        "GANTRY_WORKSPACE_BASE_URL": "/w/17/",
        "GANTRY_WORKSPACE_SERVER": "jupyter",
    }
    assert "GANTRY_WORKSPACE_SERVER" not in job_env(spec(workspace=None))
    assert SERVER_TOKEN not in repr(spec())
    for name in (
        "GANTRY_WORKSPACE_TOKEN",
        "GANTRY_WORKSPACE_BIND",
        "GANTRY_WORKSPACE_PORT",
        "GANTRY_WORKSPACE_HOME",
    ):
        assert env_name_refusal(name) is not None


def test_the_submit_adds_the_secret_derived_from_the_attempt_and_the_stored_spec_has_none(
    world, settings
):
    settings.SECRET_KEY = "s" * 50
    run = launch_workspace(world, server="jupyter")
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    rendered = job_spec_for(attempt)
    assert rendered.workspace == WorkspaceSpec(server="jupyter", base_url=f"/w/{run.pk}/")
    submitted = job_spec_with_secrets(rendered, attempt_token="gat_x")
    assert (submitted.attempt_token, submitted.workspace) == (
        "gat_x",
        WorkspaceSpec("jupyter", f"/w/{run.pk}/", workspace_server_token(attempt.pk)),
    )
    stored = SimulatorBackend(world.cluster).render(rendered)
    assert json.loads(stored)["env"]["GANTRY_WORKSPACE_TOKEN"] == "<redacted>"
    assert workspace_server_token(attempt.pk) not in stored


# --- Slurm -----------------------------------------------------------------------------------


def slurm_settings(**overrides) -> SlurmSettings:
    raw = {
        "transport": "cli",
        "job_dir": "/shared/jobs",
        "flavors": {"a100-80gb": "a100"},
        "container_runtime": "none",
    }
    return SlurmSettings.parse(raw | overrides)


def test_slurm_passes_the_secret_with_the_submit_environment_never_in_the_script():
    job = batch_job(spec(), slurm_settings(workspace_bind="127.0.0.1"))
    assert job.environment["GANTRY_WORKSPACE_TOKEN"] == SERVER_TOKEN
    assert job.environment["GANTRY_ATTEMPT_TOKEN"] == ATTEMPT_TOKEN
    assert SERVER_TOKEN not in job.script and ATTEMPT_TOKEN not in job.script
    assert (
        "# A workspace: gantry-workspace starts its server on this node on a free port and\n"
        "# reports the port; GANTRY_WORKSPACE_TOKEN=<redacted> comes like the attempt token.\n"
    ) in job.script
    assert "export GANTRY_WORKSPACE_BIND=127.0.0.1; " in job.script
    assert "export GANTRY_WORKSPACE_BASE_URL=/w/17/; " in job.script
    # Its own files, the same directory for each of its attempts.
    assert "export GANTRY_WORKSPACE_HOME=/shared/jobs/workspaces/17; " in job.script
    assert "; gantry-workspace jupyter' &" in job.script
    # Every address of the node unless the site says otherwise; a batch job gets none.
    assert "export GANTRY_WORKSPACE_BIND=0.0.0.0; " in batch_job(spec(), slurm_settings()).script
    batch = batch_job(spec(workspace=None, command="python train.py"), slurm_settings())
    assert "WORKSPACE" not in batch.script and "GANTRY_WORKSPACE_TOKEN" not in batch.environment


@pytest.mark.parametrize("bind", ["0.0.0.0; rm -rf /", "node1", "$(id)", "1"])
def test_slurm_refuses_a_bind_address_that_is_not_one(bind):
    with pytest.raises(SchemaError, match="workspace_bind"):
        slurm_settings(workspace_bind=bind)
    assert slurm_settings(workspace_bind="").workspace_bind == "0.0.0.0"  # noqa: S104


def test_slurm_nodes_carry_their_node_addr():
    text = (
        "NodeName=gpu-node1 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=gpu-node1 "
        "State=MIXED Partitions=gpu Gres=gpu:a100:8\n"
    )
    assert [n.address for n in parse_scontrol_nodes(text)] == ["10.1.2.3"]
    payload = {"nodes": [{"name": "gpu-node2", "address": "10.1.2.4", "state": "idle"}]}
    assert [n.address for n in parse_rest_nodes(payload)] == ["10.1.2.4"]


# --- Kubernetes ------------------------------------------------------------------------------


def test_kubernetes_renders_a_volume_a_service_and_a_fixed_port_and_validates():
    settings = parse_settings(BASE_SETTINGS)
    stored = render(spec(attempt_token="", workspace=replace(WORKSPACE, token="")), settings)
    assert [o["kind"] for o in stored] == ["PersistentVolumeClaim", "Secret", "Service", "Job"]
    claim, secret, service, job = stored
    # The run's volume: named after the run, labelled like the attempt's objects but for
    # the attempt (it outlives each one).
    assert claim == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "gantry-ws-17",
            "namespace": "gantry-vision",
            "labels": {
                "gantry.io/tenant": "vision",
                "gantry.io/project": "detection",
                "gantry.io/run": "17",
                "app.kubernetes.io/managed-by": "gantry",
            },
            "annotations": {"gantry.io/tenant": "vision", "gantry.io/project": "detection"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}},
    }
    assert secret["stringData"] == {
        "GANTRY_ATTEMPT_TOKEN": "<redacted>",
        "GANTRY_WORKSPACE_TOKEN": "<redacted>",
    }
    assert service["metadata"]["name"] == "gantry-a41"
    assert service["spec"] == {
        "type": "ClusterIP",
        "selector": {"gantry.io/attempt": "41"},
        "ports": [
            {"name": "workspace", "port": 8888, "targetPort": "workspace", "protocol": "TCP"}
        ],
    }
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "workspace", "persistentVolumeClaim": {"claimName": "gantry-ws-17"}},
    ]
    container = pod["containers"][0]
    assert container["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "workspace", "mountPath": "/home/gantry/workspace"},
    ]
    assert container["ports"] == [{"name": "workspace", "containerPort": 8888, "protocol": "TCP"}]
    assert [e for e in container["env"] if e["name"].startswith("GANTRY_WORKSPACE")] == [
        {"name": "GANTRY_WORKSPACE_BASE_URL", "value": "/w/17/"},
        {"name": "GANTRY_WORKSPACE_SERVER", "value": "jupyter"},
        {"name": "GANTRY_WORKSPACE_BIND", "value": "0.0.0.0"},  # noqa: S104
        {"name": "GANTRY_WORKSPACE_HOME", "value": "/home/gantry/workspace"},
        {"name": "GANTRY_WORKSPACE_PORT", "value": "8888"},
        {
            "name": "GANTRY_WORKSPACE_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": "gantry-a41-token", "key": "GANTRY_WORKSPACE_TOKEN"}
            },
        },
    ]
    for version in K8S_VERSIONS:
        for obj in stored:
            validate(obj, version)
    with_secrets = render(spec(), settings)
    assert with_secrets[1]["stringData"]["GANTRY_WORKSPACE_TOKEN"] == SERVER_TOKEN
    assert SERVER_TOKEN not in json.dumps([with_secrets[0], *with_secrets[2:]])


def test_kubernetes_sizes_the_volume_names_its_class_and_group_as_the_cluster_says():
    settings = parse_settings(
        {
            **BASE_SETTINGS,
            "workspace_volume_size": "100Gi",
            "workspace_storage_class": "ceph-rbd",
            "workspace_fs_group": 100,
        }
    )
    objects = render(spec(), settings)
    claim, job = objects[0], objects[-1]
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "100Gi"}},
        "storageClassName": "ceph-rbd",
    }
    assert job["spec"]["template"]["spec"]["securityContext"] == {
        "fsGroup": 100,
        "fsGroupChangePolicy": "OnRootMismatch",
    }
    for version in K8S_VERSIONS:
        validate(claim, version)
        validate(job, version)
    # By default the files' group is the StorageClass's business.
    default = render(spec(), parse_settings(BASE_SETTINGS))[-1]["spec"]["template"]["spec"]
    assert "securityContext" not in default
    # A batch job gets no volume, no home of its own and no group.
    batch = render(spec(workspace=None, command="python train.py"), settings)
    assert [o["kind"] for o in batch] == ["Secret", "Job"]
    pod = batch[-1]["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    assert "securityContext" not in pod
    assert "GANTRY_WORKSPACE_HOME" not in json.dumps(pod)


def test_kubernetes_workspace_on_the_fake_api_server_is_reached_at_its_service(fake):  # noqa: F811
    k8s = k8s_backend(fake)
    job_id = k8s.submit(spec(attempt_id=7, name="gantry-a7", run_id=3))
    assert job_id == "gantry-vision/gantry-a7"
    store = fake.store
    job = store.get("jobs", "gantry-vision", "gantry-a7")
    service = store.get("services", "gantry-vision", "gantry-a7")
    secret = store.get("secrets", "gantry-vision", "gantry-a7-token")
    assert service["spec"]["selector"] == {"gantry.io/attempt": "7"}
    assert service["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert base64.b64decode(secret["data"]["GANTRY_WORKSPACE_TOKEN"]).decode() == SERVER_TOKEN
    assert SERVER_TOKEN not in json.dumps(job)

    ref = JobRef("gantry-a7", job_id)
    assert k8s.workspace_address(ref, port=8888) == ("gantry-a7.gantry-vision.svc", 8888)
    with pytest.raises(PermanentBackendError, match="its Service routes port 8888, not 9999"):
        k8s.workspace_address(ref, port=9999)

    k8s.cancel(ref)
    with pytest.raises(ApiError):
        store.get("services", "gantry-vision", "gantry-a7")


def test_the_simulator_says_127_0_0_1_only_for_its_running_workspace_jobs(world):
    backend = SimulatorBackend(Cluster.objects.get(pk=world.cluster.pk))
    with pytest.raises(PermanentBackendError, match="the simulator has no workspace job x"):
        backend.workspace_address(JobRef("x", "1"), port=8888)
