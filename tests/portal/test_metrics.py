"""/metrics: Gantry's own metrics, for Prometheus with the bearer token only.

The proof is a real Prometheus (Debian's, tests/prometheus_support.py) scraping the live
server with the token and answering queries about what Gantry did; and the documentation
and the Grafana dashboard naming only metrics that exist.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from celery import Celery
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST

from clusters.backends.base import PermanentBackendError, TransientBackendError
from clusters.backends.calls import backend_call
from clusters.models import Cluster, ClusterNode, NodeHealthEvent
from core import metrics
from jobs.models import RunState
from jobs.services.admission_cycle import admission_run_cycle
from portal.metrics_files import metric_files
from telemetry import collection
from telemetry.exposition.parsing import GPU_UTIL, GpuSample, render
from telemetry.sources import Scrape
from tests import REPOSITORY
from tests.jobs.test_lifecycle import submit
from tests.prometheus_support import launch_prometheus, ready_prometheus, wait_for_series

pytest_plugins = ["tests.prometheus_support"]


# An app of its own: a task of Gantry's app would be one more task to route
# (test_task_queues); Celery's signals, which time tasks, are every app's.
_test_app = Celery("gantry-metrics-test", set_as_current=False)


@_test_app.task(name="tests.portal.failing_task", shared=False)
def failing_task() -> None:
    raise RuntimeError("a task that fails, to be timed as a failure")


TOKEN = "metrics-token-0123456789abcdef0123456789"
OPERATIONS_DOC = REPOSITORY / "docs" / "operations.md"
DASHBOARD = REPOSITORY / "docs" / "grafana-gantry.json"


class FixedSource:
    """A telemetry source returning one prepared scrape."""

    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def fetch(self, *, start_ms: int, end_ms: int) -> list[Scrape]:
        return [self.scrape]


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


# --- closed to the public -----------------------------------------------------------------


def test_without_a_configured_token_metrics_does_not_exist(client, settings):
    settings.GANTRY_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", **bearer("")).status_code == 404


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN],
)
def test_a_scrape_without_the_token_is_refused(client, settings, db, authorization):
    settings.GANTRY_METRICS_TOKEN = TOKEN
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    response = client.get("/metrics", **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="gantry-metrics"'
    assert b"gantry_" not in response.content


def test_a_scrape_with_the_token_gets_the_exposition(client, settings, world):
    settings.GANTRY_METRICS_TOKEN = TOKEN
    submit(world, name="a-name-that-is-no-label")
    response = client.get("/metrics", **bearer(TOKEN))
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    body = response.content.decode()
    assert 'gantry_runs_pending{flavor="a100-80gb",reason="NEW",tenant="vision"} 1.0' in body
    assert "a-name-that-is-no-label" not in body
    assert "python train.py" not in body
    assert client.post("/metrics", **bearer(TOKEN)).status_code == 405


def test_node_health_series(client, settings, world):
    settings.GANTRY_METRICS_TOKEN = TOKEN
    nodes = ClusterNode.objects.filter(cluster=world.cluster).order_by("name")
    first, second = (node.name for node in nodes[:2])
    nodes.filter(name=first).update(health="quarantined")
    nodes.filter(name=second).update(health="suspect")
    now = timezone.now()
    for node, signal, source in (
        (first, "ecc_uncorrectable", "dcgm"),
        (first, "ecc_uncorrectable", "dcgm"),
        (first, "quarantine", "person"),
        (second, "thermal_throttle", "dcgm"),
    ):
        NodeHealthEvent.objects.create(
            cluster=world.cluster,
            node=node,
            source=source,
            signal=signal,
            observed_at=now,
            last_observed_at=now,
            recorded_at=now,
            count=5,
        )
    body = client.get("/metrics", **bearer(TOKEN)).content.decode()
    events = 'gantry_node_health_events_total{cluster="sim-1",'
    node_metrics = ("gantry_cluster_nodes{", "gantry_nodes_quarantined{", events)
    # By name: the request histogram is process-wide and may hold node pages' views.
    series = {line for line in body.splitlines() if line.startswith(node_metrics)}
    assert series == {
        'gantry_cluster_nodes{cluster="sim-1",health="healthy"} 4.0',
        'gantry_cluster_nodes{cluster="sim-1",health="suspect"} 1.0',
        'gantry_cluster_nodes{cluster="sim-1",health="quarantined"} 1.0',
        'gantry_nodes_quarantined{cluster="sim-1"} 1.0',
        events + 'signal="ecc_uncorrectable",source="dcgm"} 2.0',
        events + 'signal="quarantine",source="person"} 1.0',
        events + 'signal="thermal_throttle",source="dcgm"} 1.0',
    }
    assert "# TYPE gantry_node_health_events_total counter" in body
    assert "# TYPE gantry_nodes_quarantined gauge" in body


def test_unknown_backend_operations_are_refused_as_labels():
    with (
        pytest.raises(ValueError, match="unknown backend operation 'submit-experiment-x'"),
        backend_call(cluster="sim-1", operation="submit-experiment-x"),
    ):
        pass


def test_unknown_error_kinds_are_refused_as_labels():
    with pytest.raises(ValueError, match="unknown backend error kind 'Timeout'"):
        metrics.backend_error_count(cluster="sim-1", operation="sync", kind="Timeout")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (TransientBackendError("API server unreachable"), "transient"),
        (PermanentBackendError("no such partition"), "permanent"),
        (KeyError("status"), "unexpected"),
    ],
)
def test_a_failed_backend_call_is_counted_by_the_kind_of_its_error(error, kind):
    before = metrics.BACKEND_ERRORS.labels("kinds-1", "sync", kind)._value.get()
    with pytest.raises(type(error)), backend_call(cluster="kinds-1", operation="sync"):
        raise error
    assert metrics.BACKEND_ERRORS.labels("kinds-1", "sync", kind)._value.get() == before + 1


# --- a real Prometheus scrapes it -----------------------------------------------------------


def unmapped_scrape(now_ms: int, samples: int) -> Scrape:
    """GPU utilization of a node no attempt ran on, once a second for ``samples`` seconds
    ending two minutes before ``now_ms``: every sample is stored and none maps."""
    start_ms = (now_ms // 60_000 - 3) * 60_000
    body = render(
        [
            GpuSample("nowhere-1", "0", "GPU-nowhere", GPU_UTIL, 50.0, start_ms + i * 1000)
            for i in range(samples)
        ]
    )
    return Scrape(body=body.encode(), at_ms=start_ms + samples * 1000, origin="dcgm:nowhere-1")


@pytest.fixture
def scraping_prometheus(live_server):
    """``start()``: a real Prometheus scraping the live server's /metrics every 5 s with the
    bearer token (a scrape's timeout is its interval: on a loaded 2-core machine a
    request to the live server can take more than one second)."""
    workdir = Path(tempfile.mkdtemp(prefix="gantry-metrics-prometheus-"))
    started = []

    def start():
        config = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "scrape_configs": [
                {
                    "job_name": "gantry",
                    "metrics_path": "/metrics",
                    "authorization": {"type": "Bearer", "credentials": TOKEN},
                    "static_configs": [{"targets": [urlsplit(live_server.url).netloc]}],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))
        started.append(ready_prometheus(launch_prometheus(workdir)))
        return started[-1]

    yield start
    for prometheus in started:
        prometheus.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def query(prometheus, promql: str) -> list[tuple[dict, str]]:
    answer = prometheus.api("/api/v1/query", query=promql)
    assert answer["status"] == "success", answer
    return [(series["metric"], series["value"][1]) for series in answer["data"]["result"]]


def test_prometheus_scrapes_pending_runs_and_telemetry_samples(
    world, settings, scraping_prometheus
):
    # Given: vision holds its 16 guaranteed A100 GPUs and queues two more 8-GPU runs (the
    # first waits for quota, the second behind it); nlp has a run no admission cycle has
    # seen yet; a collector read 90 samples that no attempt claims.
    settings.GANTRY_METRICS_TOKEN = TOKEN
    submit(world, gpus_per_node=8, nodes=2, name="holds-the-guarantee")
    submit(world, gpus_per_node=8, name="waits-1")
    submit(world, gpus_per_node=8, name="waits-2")
    assert admission_run_cycle().admitted == 1
    submit(world, user=world.researcher_b, tenant="nlp", project="llm", flavor="h100-80gb")
    observer = Cluster.objects.create(name="metrics-observer", backend=Cluster.Backend.SIMULATOR)
    now = timezone.now()
    fetched = collection.telemetry_fetch(
        cluster=observer,
        source=FixedSource(unmapped_scrape(int(now.timestamp() * 1000), 90)),
        now=now,
    )
    rolled = collection.telemetry_roll_up(cluster=observer)
    assert (fetched.samples, rolled.unmapped) == (90, 90)

    # When: Prometheus scrapes /metrics with the token.
    prometheus = scraping_prometheus()
    wait_for_series(prometheus, '{job="gantry",__name__="gantry_runs_pending"}', 3, timeout_s=60)

    # Then it knows why the runs wait, and what the collector of that cluster read.
    assert sorted(
        (s["tenant"], s["flavor"], s["reason"], value)
        for s, value in query(prometheus, 'gantry_runs_pending{job="gantry"}')
    ) == [
        ("nlp", "h100-80gb", "NEW", "1"),
        ("vision", "a100-80gb", "BEHIND_HEAD", "1"),
        ("vision", "a100-80gb", "QUOTA", "1"),
    ]
    for counter in ("ingested", "unmapped"):
        promql = f'gantry_telemetry_samples_{counter}_total{{cluster="metrics-observer"}}'
        assert [(s["cluster"], value) for s, value in query(prometheus, promql)] == [
            ("metrics-observer", "90")
        ]
    up = query(prometheus, 'up{job="gantry"}')
    assert [value for _, value in up] == ["1"]


# --- documented and charted -----------------------------------------------------------------


def exposed_metric_names() -> set[str]:
    """The families Gantry exposes: its counters and histograms and the scrape-time gauges."""
    names = {
        "gantry_runs_pending",
        "gantry_celery_queue_length",
        "gantry_cluster_nodes",
        "gantry_nodes_quarantined",
        "gantry_node_health_events_total",
    }
    for value in vars(metrics).values():
        if hasattr(value, "_name") and hasattr(value, "_type"):
            names.add(value._name + ("_total" if value._type == "counter" else ""))
    return names


def documented_metrics() -> dict[str, str]:
    """The metric table of docs/operations.md: name -> type."""
    rows = re.findall(r"^\| `(gantry_\w+)` \| (\w+) \|", OPERATIONS_DOC.read_text(), re.MULTILINE)
    return dict(rows)


def test_every_metric_is_documented_with_its_type():
    documented = documented_metrics()
    assert set(documented) == exposed_metric_names()
    assert documented["gantry_runs_pending"] == "gauge"
    assert documented["gantry_backend_errors_total"] == "counter"
    assert documented["gantry_admission_cycle_duration_seconds"] == "histogram"


def test_the_grafana_dashboard_charts_only_documented_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    documented = set(documented_metrics())
    charted = set()
    for expr in exprs:
        names = set(re.findall(r"\bgantry_\w+", expr))
        assert names, f"a panel queries no Gantry metric: {expr}"
        for name in names:
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            assert family in documented, f"{expr} charts {name}, which is not documented"
            charted.add(family)
    assert charted == documented


def test_metric_files_of_this_process_are_found(settings):
    metrics.BACKEND_ERRORS.labels("files-check", "sync", "transient").inc()
    assert any(
        path.name.startswith("counter_") for path in metric_files(settings.GANTRY_METRICS_DIR)
    )


def test_a_waiting_run_is_not_pending_once_it_runs(world, settings, client):
    # Pending means waiting to start: a running run is not counted.
    settings.GANTRY_METRICS_TOKEN = TOKEN
    run = submit(world)
    run.state = RunState.RUNNING
    run.save(update_fields=["state"])
    body = client.get("/metrics", **bearer(TOKEN)).content.decode()
    assert "gantry_runs_pending{" not in body


def test_a_scrape_sums_what_other_processes_recorded(client, settings, db):
    # Given: two other processes of the deployment (as gunicorn or Celery workers would)
    # each count errors of a cluster's sync; both have exited.
    settings.GANTRY_METRICS_TOKEN = TOKEN
    record = (
        "import django; django.setup(); from core import metrics; "
        "metrics.BACKEND_ERRORS.labels('elsewhere-1', 'sync', 'transient').inc({})"
    )
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings"}
    for count in (2, 3):
        subprocess.run(
            [sys.executable, "-c", record.format(count)],
            env=env, cwd=REPOSITORY, check=True, timeout=60,
        )  # fmt: skip
    # When this process answers a scrape, then it counts both.
    body = client.get("/metrics", **bearer(TOKEN)).content.decode()
    expected = (
        'gantry_backend_errors_total{cluster="elsewhere-1",kind="transient",operation="sync"} 5.0'
    )
    assert expected in body.splitlines()


def test_backend_operations_name_node_healths_calls_once_each():
    from core.metrics import BACKEND_OPERATIONS

    assert len(BACKEND_OPERATIONS) == len(set(BACKEND_OPERATIONS))
    assert [op for op in BACKEND_OPERATIONS if op in ("fence", "unfence", "health_check")] == [
        "fence",
        "unfence",
        "health_check",
    ]


# --- the web's and the workers' own time --------------------------------------------------


def observed_count(histogram, **labels: str) -> float:
    """How many observations this process made of ``histogram`` with exactly ``labels``
    (its own values: other test workers write files of their own)."""
    return sum(
        sample.value
        for family in histogram.collect()
        for sample in family.samples
        if sample.name.endswith("_count") and sample.labels == labels
    )


def test_each_request_is_timed_by_its_view_never_by_its_path(client, settings, db):
    settings.GANTRY_METRICS_TOKEN = TOKEN
    histogram = metrics.HTTP_REQUEST_SECONDS
    before = {
        "healthz": observed_count(histogram, view="healthz", method="GET", status="2xx"),
        "refused": observed_count(histogram, view="metrics", method="POST", status="4xx"),
        "unrouted": observed_count(histogram, view="unrouted", method="GET", status="4xx"),
        "other": observed_count(histogram, view="healthz", method="other", status="4xx"),
    }
    assert client.get("/healthz").status_code == 200
    assert client.post("/metrics", **bearer(TOKEN)).status_code == 405
    assert client.get("/no-such-page-7f3a/").status_code == 404
    assert client.generic("BREW", "/healthz").status_code == 405
    assert observed_count(histogram, view="healthz", method="GET", status="2xx") == (
        before["healthz"] + 1
    )
    assert observed_count(histogram, view="metrics", method="POST", status="4xx") == (
        before["refused"] + 1
    )
    assert observed_count(histogram, view="unrouted", method="GET", status="4xx") == (
        before["unrouted"] + 1
    )
    assert observed_count(histogram, view="healthz", method="other", status="4xx") == (
        before["other"] + 1
    )
    body = client.get("/metrics", **bearer(TOKEN)).content.decode()
    assert (
        'gantry_http_request_duration_seconds_count{method="GET",status="2xx",view="healthz"}'
        in (body)
    )
    assert "no-such-page" not in body and "BREW" not in body


def test_each_task_is_timed_by_its_name_queue_and_outcome(db):
    from jobs import tasks

    histogram = metrics.TASK_SECONDS
    labels = {"task": "jobs.tasks.budget_alerts", "queue": "background", "outcome": "success"}
    failed = {"task": "tests.portal.failing_task", "queue": "background", "outcome": "failure"}
    before = observed_count(histogram, **labels), observed_count(histogram, **failed)
    tasks.budget_alerts.apply()
    assert failing_task.apply().failed()
    assert observed_count(histogram, **labels) == before[0] + 1
    assert observed_count(histogram, **failed) == before[1] + 1


def test_a_task_outcome_outside_the_set_is_refused_as_a_label():
    with pytest.raises(ValueError, match="unknown task outcome 'lost'"):
        metrics.task_observed(task="jobs.tasks.budget_alerts", queue="background",
                              outcome="lost", seconds=1.0)  # fmt: skip
