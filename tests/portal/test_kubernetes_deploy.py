"""deploy/kubernetes renders, by the real kustomize of kubectl, into manifests the official
Kubernetes schemas accept (kubernetes-validate, strict: unknown fields fail), wired the way
the code expects. The ServiceMonitor is a prometheus-operator CRD, absent from the official
schemas: its shape is checked field by field here instead.

kubectl must be installed (CI has it): without it these tests fail, they do not skip."""

import re
import shutil
import subprocess

import pytest
import yaml

from portal import task_queues
from tests import REPOSITORY
from tests.k8s_schemas import validate

KUBERNETES = REPOSITORY / "deploy" / "kubernetes"
OVERLAYS = ["production", "minimal"]
SCHEMA_VERSION = "1.32.0"
IMAGE = re.compile(r"^registry\.example\.org/gantry/gantry@sha256:[0-9a-f]{64}$")
WORKLOADS = {"Deployment", "Job"}
REPLICAS = {
    "production": {"gantry-web": 3, "gantry-proxy": 2, "gantry-worker-admission": 2,
                   "gantry-worker-backend": 3, "gantry-worker-telemetry": 2,
                   "gantry-worker-background": 2, "gantry-beat": 2},
    "minimal": {"gantry-web": 1, "gantry-proxy": 1, "gantry-worker-admission": 1,
                "gantry-worker-backend": 1, "gantry-worker-telemetry": 1,
                "gantry-worker-background": 1, "gantry-beat": 1},
}  # fmt: skip
SECRET_ENV = {
    "DJANGO_SECRET_KEY": ("gantry-secrets", "secret-key"),
    "DATABASE_URL": ("gantry-db-app", "uri"),
    "CELERY_BROKER_URL": ("gantry-redis", "broker-url"),
    "GANTRY_CACHE_URL": ("gantry-redis", "cache-url"),
}


def render(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed: it renders deploy/kubernetes (kubectl kustomize)"
    result = subprocess.run(
        [kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def containers(doc: dict) -> list[dict]:
    return doc["spec"]["template"]["spec"]["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def test_every_manifest_passes_the_official_schema_or_the_servicemonitor_shape(rendered):
    _, docs = rendered
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "Job", "Service", "Service", "ServiceMonitor"]
        + ["Deployment"] * 7 + ["PodDisruptionBudget"] * 7 + ["NetworkPolicy"] * 6
    )  # fmt: skip
    for doc in docs:
        assert doc["metadata"]["namespace"] == "gantry"
        if doc["kind"] != "ServiceMonitor":
            validate(doc, SCHEMA_VERSION)


def test_the_servicemonitor_scrapes_the_web_service_with_the_metrics_token(rendered):
    _, docs = rendered
    monitor = by_kind(docs, "ServiceMonitor")["gantry-web"]
    service = by_kind(docs, "Service")["gantry-web"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    assert monitor["spec"]["selector"] == {"matchLabels": service["spec"]["selector"]}
    assert service["metadata"]["labels"].items() >= service["spec"]["selector"].items()
    assert monitor["spec"]["endpoints"] == [{
        "port": "http", "path": "/metrics", "interval": "30s", "scheme": "http",
        "authorization": {"type": "Bearer",
                          "credentials": {"name": "gantry-secrets", "key": "metrics-token"}},
    }]  # fmt: skip
    assert [port["name"] for port in service["spec"]["ports"]] == ["http"]
    web = containers(by_kind(docs, "Deployment")["gantry-web"])[0]
    assert env_of(web)["GANTRY_METRICS_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "gantry-secrets", "key": "metrics-token"}
    }


def test_web_runs_gunicorn_ready_on_readyz_and_alive_on_healthz(rendered):
    _, docs = rendered
    web = by_kind(docs, "Deployment")["gantry-web"]
    (container,) = containers(web)
    assert container["command"][-1] == (
        "python manage.py metrics_reset -v 0 && exec gunicorn --config python:portal.gunicorn_conf"
        " --bind 0.0.0.0:8000 portal.wsgi:application"
    )
    assert container["ports"] == [{"name": "http", "containerPort": 8000}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # The probes and the scrapes ask for the pod's address: it must be an allowed host.
    assert env_of(container)["GANTRY_ALLOWED_HOSTS"]["value"] == "gantry.example.org,$(POD_IP)"
    names = list(env_of(container))
    assert names.index("POD_IP") < names.index("GANTRY_ALLOWED_HOSTS")
    assert web["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_the_migration_job_migrates_under_the_lock_once(rendered):
    _, docs = rendered
    (job,) = by_kind(docs, "Job").values()
    assert job["metadata"]["name"] == "gantry-migrate"
    (container,) = containers(job)
    assert container["command"] == ["python", "manage.py", "migrate_locked"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert job["spec"]["backoffLimit"] == 6


def test_workers_consume_every_queue_once_and_beat_runs_the_leader_scheduler(rendered):
    overlay, docs = rendered
    deployments = by_kind(docs, "Deployment")
    consumed: dict[str, str] = {}
    for name, deployment in deployments.items():
        command = containers(deployment)[0]["command"][-1]
        if " worker " in command:
            queues = re.search(r" -Q (\S+) ", command).group(1).split(",")
            for queue in queues:
                assert queue not in consumed, (
                    f"{queue} consumed by {consumed.get(queue)} and {name}"
                )
                consumed[queue] = name
    assert consumed == {
        "admission": "gantry-worker-admission", "backend": "gantry-worker-backend",
        "telemetry": "gantry-worker-telemetry", "background": "gantry-worker-background",
    }  # fmt: skip
    assert set(consumed) == set(task_queues.QUEUES)
    assert containers(deployments["gantry-beat"])[0]["command"][-1] == (
        "python manage.py metrics_reset -v 0 && exec celery -A portal beat -l info"
    )
    listen = "0.0.0.0"  # noqa: S104 (the pod's address: the Service reaches it there)
    assert containers(deployments["gantry-proxy"])[0]["command"] == [
        "python", "-m", "portal.workspace_proxy", "--host", listen, "--port", "8001"
    ]  # fmt: skip
    replicas = {name: d["spec"]["replicas"] for name, d in deployments.items()}
    assert replicas == REPLICAS[overlay]


def test_every_container_is_limited_locked_down_and_pinned_by_digest(rendered):
    _, docs = rendered
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            where = f"{doc['metadata']['name']}/{container['name']}"
            assert IMAGE.match(container["image"]), where
            assert set(container["resources"]) == {"requests", "limits"}, where
            for part in ("requests", "limits"):
                assert set(container["resources"][part]) == {"cpu", "memory"}, where
            assert container["securityContext"] == {
                "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            }, where  # fmt: skip


def test_secrets_come_by_reference_and_none_is_written_down(rendered):
    _, docs = rendered
    assert by_kind(docs, "Secret") == {}
    for doc in docs:
        if doc["kind"] not in WORKLOADS:
            continue
        for container in containers(doc):
            env = env_of(container)
            for name, (secret, key) in SECRET_ENV.items():
                assert env[name] == {
                    "name": name,
                    "valueFrom": {"secretKeyRef": {"name": secret, "key": key}},
                }
    config = by_kind(docs, "ConfigMap")["gantry-config"]["data"]
    assert not {"DJANGO_SECRET_KEY", "DATABASE_URL", "GANTRY_METRICS_TOKEN"} & set(config)
    assert not any("://" in value and "@" in value for value in config.values())


def test_selectors_match_between_deployments_services_pdbs_and_policies(rendered):
    _, docs = rendered
    pods = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for name, d in by_kind(docs, "Deployment").items()
    }
    for name, deployment in by_kind(docs, "Deployment").items():
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pods[name].items()
    components = {labels["app.kubernetes.io/component"] for labels in pods.values()}

    def selected(selector: dict) -> set[str]:
        found = set()
        for name, labels in pods.items():
            if not selector.get("matchLabels", {}).items() <= labels.items():
                continue
            if all(
                labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])
            ):
                found.add(name)
        return found

    services = by_kind(docs, "Service")
    assert selected({"matchLabels": services["gantry-web"]["spec"]["selector"]}) == {"gantry-web"}
    assert selected({"matchLabels": services["gantry-proxy"]["spec"]["selector"]}) == {
        "gantry-proxy"
    }
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert {name: selected(pdb["spec"]["selector"]) for name, pdb in pdbs.items()} == {
        f"gantry-{component}": {f"gantry-{component}"} for component in components
    }
    policies = by_kind(docs, "NetworkPolicy")
    assert {name: selected(p["spec"]["podSelector"]) for name, p in policies.items()} == {
        "gantry-base": set(pods),
        "gantry-web-ingress": {"gantry-web"},
        "gantry-proxy-ingress": {"gantry-proxy"},
        "gantry-cluster-apis": {"gantry-web", "gantry-worker-backend", "gantry-worker-telemetry"},
        "gantry-proxy-workspaces": {"gantry-proxy"},
        "gantry-mail": {"gantry-worker-background"},
    }
    ingress_ports = {
        name: [port["port"] for rule in p["spec"].get("ingress", []) for port in rule["ports"]]
        for name, p in policies.items()
    }
    assert ingress_ports["gantry-web-ingress"] == [8000]
    assert ingress_ports["gantry-proxy-ingress"] == [8001]
    assert policies["gantry-base"]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policies["gantry-base"]["spec"]
