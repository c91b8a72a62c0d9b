"""The metrics exporter beside each Celery worker (``python -m portal.metrics_exporter``, the
sidecar of deploy/kubernetes/base/workers.yaml): a real worker runs real tasks with its
metric files in a directory, and the exporter, a process of its own on 127.0.0.1, serves
what the worker recorded, with the bearer token only."""

import subprocess
import sys

import pytest
import requests
from prometheus_client import CONTENT_TYPE_LATEST

from jobs import tasks
from tests.celery_support import (
    ROOT,
    celery_env,
    free_port,
    start_worker,
    stop_process,
    wait_for,
)

TOKEN = "exporter-token-0123456789abcdef0123456789"
TASKS = 3
COUNT = (
    "gantry_task_duration_seconds_count"
    '{outcome="success",queue="background",task="jobs.tasks.budget_alerts"}'
)


def _get(url: str, **headers: str) -> requests.Response:
    with requests.Session() as session:
        session.trust_env = False  # no proxy between us and 127.0.0.1
        return session.get(url, headers=headers, timeout=5)


def _count(body: str) -> float | None:
    for line in body.splitlines():
        name, _, value = line.rpartition(" ")
        if name == COUNT:
            return float(value)
    return None


def _exporter(env: dict[str, str], port: int, metrics_root, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "portal.metrics_exporter", "--host", "127.0.0.1",
         "--port", str(port), "--dir", str(metrics_root)],
        env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_exporter_serves_what_a_real_worker_recorded(transactional_db, tmp_path):
    # Given: a Celery worker whose processes keep their metric files below its data
    # directory, and the exporter serving that directory on 127.0.0.1.
    env = celery_env(tmp_path)
    metrics_root = tmp_path / "metrics"
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with (tmp_path / "processes.log").open("a") as log:
        worker = start_worker(env, log)
        exporter = _exporter(env | {"GANTRY_METRICS_TOKEN": TOKEN}, port, metrics_root, log)
        try:
            wait_for(lambda: _answers(url), timeout=60, what="the exporter to answer on 127.0.0.1")
            # When the worker runs three tasks.
            for _ in range(TASKS):
                tasks.budget_alerts.delay()
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            wait_for(
                lambda: _count(_get(url, **bearer).text) == TASKS,
                timeout=90, interval=0.5, what=f"{TASKS} tasks counted by the exporter",
            )  # fmt: skip
            # Then a scrape with the token counts each, by task, queue and outcome; without
            # the token, or elsewhere, nothing.
            scraped = _get(url, **bearer)
            refused = _get(url, Authorization="Bearer not-the-token")
            elsewhere = _get(f"http://127.0.0.1:{port}/", **bearer)
        finally:
            stop_process(exporter)
            stop_process(worker)

    assert scraped.status_code == 200
    assert scraped.headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert f"{COUNT} {float(TASKS)}" in scraped.text.splitlines()
    assert "# TYPE gantry_task_duration_seconds histogram" in scraped.text.splitlines()
    assert (refused.status_code, refused.headers["WWW-Authenticate"]) == (
        401,
        'Bearer realm="gantry-metrics"',
    )
    assert "gantry_" not in refused.text
    assert elsewhere.status_code == 404


def test_the_exporter_does_not_start_without_the_token(tmp_path):
    env = celery_env(tmp_path)
    env.pop("GANTRY_METRICS_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "portal.metrics_exporter", "--port", str(free_port()),
         "--dir", str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "python -m portal.metrics_exporter: error: GANTRY_METRICS_TOKEN is not set: "
        "the metrics are served with its bearer token only"
    )


def _answers(url: str) -> bool:
    try:
        return _get(url).status_code == 401
    except requests.ConnectionError:
        return False
