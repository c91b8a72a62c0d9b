"""deploy/kubernetes renders, by the real kustomize of kubectl, into manifests the official
Kubernetes schemas accept (kubernetes-validate, strict: unknown fields fail), wired the way
the code expects. The ServiceMonitor and the PodMonitor are prometheus-operator CRDs, absent
from the official schemas: their shapes are checked field by field here instead.

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
MONITORS = {"ServiceMonitor", "PodMonitor"}
WORKERS = ["gantry-worker-admission", "gantry-worker-backend", "gantry-worker-telemetry",
           "gantry-worker-background"]  # fmt: skip
EXPORTER_PORT = 9102
METRICS_DIR = "/var/lib/gantry/metrics"
METRICS_TOKEN = {"secretKeyRef": {"name": "gantry-secrets", "key": "metrics-token"}}
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


def container_named(doc: dict, name: str) -> dict:
    (found,) = [c for c in containers(doc) if c["name"] == name]
    return found


def main_container(doc: dict) -> dict:
    """The container of the process itself (a worker's pod also runs its metrics exporter)."""
    return next(c for c in containers(doc) if c["name"] != "metrics-exporter")


def selected_pods(docs: list[dict], selector: dict) -> set[str]:
    """The Deployments whose pods a label selector selects (matchLabels, matchExpressions In)."""
    found = set()
    for name, deployment in by_kind(docs, "Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if not selector.get("matchLabels", {}).items() <= labels.items():
            continue
        expressions = selector.get("matchExpressions", [])
        assert {e["operator"] for e in expressions} <= {"In"}, expressions
        if all(labels.get(e["key"]) in e["values"] for e in expressions):
            found.add(name)
    return found


def env_of(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def test_every_manifest_passes_the_official_schema_or_the_monitors_shape(rendered):
    _, docs = rendered
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "Job", "Service", "Service", "ServiceMonitor",
         "PodMonitor"]
        + ["Deployment"] * 7 + ["PodDisruptionBudget"] * 7 + ["NetworkPolicy"] * 7
    )  # fmt: skip
    for doc in docs:
        assert doc["metadata"]["namespace"] == "gantry"
        if doc["kind"] not in MONITORS:
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
    assert env_of(web)["GANTRY_METRICS_TOKEN"]["valueFrom"] == METRICS_TOKEN


def test_each_worker_pod_runs_the_metrics_exporter_the_podmonitor_scrapes(rendered):
    _, docs = rendered
    deployments = by_kind(docs, "Deployment")
    for name in WORKERS:
        pod = deployments[name]["spec"]["template"]
        exporter = container_named(deployments[name], "metrics-exporter")
        assert exporter["image"] == container_named(deployments[name], "worker")["image"]
        listen = "0.0.0.0"  # noqa: S104 (the pod's address: Prometheus reaches it there)
        assert exporter["command"] == [
            "python", "-m", "portal.metrics_exporter", "--host", listen, "--port",
            str(EXPORTER_PORT),
        ]  # fmt: skip
        assert exporter["ports"] == [{"name": "metrics", "containerPort": EXPORTER_PORT}]
        # The metrics directory of the worker's processes, shared, read-only here; the
        # exporter finds it by GANTRY_METRICS_DIR of the ConfigMap.
        assert exporter["volumeMounts"] == [
            {"name": "metrics", "mountPath": METRICS_DIR, "readOnly": True}
        ]
        assert {"name": "metrics", "mountPath": METRICS_DIR} in container_named(
            deployments[name], "worker"
        )["volumeMounts"]
        assert {"name": "metrics", "emptyDir": {}} in pod["spec"]["volumes"]
        assert exporter["envFrom"] == [{"configMapRef": {"name": "gantry-config"}}]
        assert env_of(exporter) == {
            "GANTRY_METRICS_TOKEN": {"name": "GANTRY_METRICS_TOKEN", "valueFrom": METRICS_TOKEN}
        }
        assert exporter["resources"] == {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        }
        assert pod["metadata"]["annotations"] == {
            "kubectl.kubernetes.io/default-container": "worker"
        }
    config = by_kind(docs, "ConfigMap")["gantry-config"]["data"]
    assert config["GANTRY_METRICS_DIR"] == METRICS_DIR
    # No other pod runs it: the web serves its own /metrics, beat records nothing.
    assert {
        name for name, d in deployments.items()
        if any(c["name"] == "metrics-exporter" for c in containers(d))
    } == set(WORKERS)  # fmt: skip

    monitor = by_kind(docs, "PodMonitor")["gantry-workers"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    assert monitor["spec"]["podMetricsEndpoints"] == [{
        "port": "metrics", "path": "/metrics", "interval": "30s", "scheme": "http",
        "authorization": {"type": "Bearer",
                          "credentials": {"name": "gantry-secrets", "key": "metrics-token"}},
    }]  # fmt: skip
    assert selected_pods(docs, monitor["spec"]["selector"]) == set(WORKERS)


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
        command = main_container(deployment)["command"][-1]
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
            if container["name"] == "metrics-exporter":
                continue  # its one secret: test_each_worker_pod_runs_the_metrics_exporter…
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
        return selected_pods(docs, selector)

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
        "gantry-worker-metrics-ingress": set(WORKERS),
    }
    ingress_ports = {
        name: [port["port"] for rule in p["spec"].get("ingress", []) for port in rule["ports"]]
        for name, p in policies.items()
    }
    assert ingress_ports["gantry-web-ingress"] == [8000]
    assert ingress_ports["gantry-proxy-ingress"] == [8001]
    # The exporters' port, from Prometheus's namespace only.
    assert ingress_ports["gantry-worker-metrics-ingress"] == [EXPORTER_PORT]
    assert policies["gantry-worker-metrics-ingress"]["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert policies["gantry-base"]["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policies["gantry-base"]["spec"]
