"""Real processes: a Celery worker and beat on Redis against PostgreSQL, and the embedded
default exactly as ``make run`` starts it (SQLite, filesystem broker, gunicorn)."""

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from clusters.models import SimulatedJob
from jobs.models import RunState
from jobs.services.submission import run_submit
from portal.celery import app as celery_app
from tests import REPOSITORY
from tests.celery_support import (
    celery_env,
    free_port,
    start_worker_and_beat,
    stop_process,
    wait_for,
)
from tests.conftest import experiment_input

ROOT = REPOSITORY
pytestmark = pytest.mark.integration


@pytest.fixture
def celery_processes(transactional_db, tmp_path):
    """A real worker and beat, on the test's Redis database and the test PostgreSQL database."""
    celery_app.control.purge()
    log = (tmp_path / "celery.log").open("w")
    worker, beat = start_worker_and_beat(celery_env(tmp_path), log)
    yield worker, beat
    stop_process(beat)
    stop_process(worker)
    log.close()


def test_worker_and_beat_take_a_run_from_queued_to_succeeded(world, celery_processes):
    worker, beat = celery_processes
    # run_submit commits, and its on_commit hook puts the admission task on Redis.
    run = run_submit(
        user=world.researcher_a,
        data=experiment_input(world, env={"GANTRY_SIM_DURATION_S": "60"}),
    )

    def finished():
        run.refresh_from_db()
        return run.state in (RunState.SUCCEEDED, RunState.FAILED)

    wait_for(finished, timeout=60, what="the run to finish")
    assert worker.poll() is None and beat.poll() is None
    assert run.state == RunState.SUCCEEDED
    states = list(run.events.values_list("to_state", flat=True))
    assert states == ["QUEUED", "ADMITTED", "SUBMITTING", "PENDING", "RUNNING", "SUCCEEDED"]
    attempt = run.attempts.get()
    assert (attempt.state, attempt.exit_code) == ("SUCCEEDED", 0)
    assert SimulatedJob.objects.filter(name=attempt.name).count() == 1


# --- the embedded default ---------------------------------------------------------------


def http(method: str, url: str, *, token: str | None = None, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def processes_using(marker: str) -> list[int]:
    """PIDs whose environment mentions ``marker`` (our private data directory)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def start_embedded(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {
        "GANTRY_DATA_DIR": str(data_dir),
        "GANTRY_PORT": str(port),
        "GANTRY_SIM_SPEEDUP": "1000",
        "GANTRY_ADMISSION_INTERVAL_S": "1",
        "GANTRY_SYNC_INTERVAL_S": "1",
    }
    log = log_path.open("a")
    return subprocess.Popen(
        [sys.executable, "-m", "portal.embedded"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def test_embedded_default_serves_runs_and_stops_everything(tmp_path):
    data_dir = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "embedded.log"
    process = start_embedded(data_dir, port, log_path)
    try:
        wait_for(lambda: _ready(base), timeout=120, what="the embedded server")
        assert (data_dir / "gantry.sqlite3").exists()
        # Its processes made one secret key on first start, readable by its owner only.
        key = (data_dir / "secret_key").read_text()
        assert stat.S_IMODE((data_dir / "secret_key").stat().st_mode) == 0o600
        assert not list(data_dir.glob(".secret_key.*"))
        status, body = http(
            "POST", f"{base}/api/v1/tokens/", body={"username": "alice", "password": "gantry-demo"}
        )
        assert status == 201, body
        token = body["token"]
        status, run = http(
            "POST",
            f"{base}/api/v1/runs/",
            token=token,
            body={
                "tenant": "vision",
                "project": "detection",
                # By tag: the demo's registry resolves it as a registry would.
                "image": "registry.gantry.example/ml/pytorch:2.4-cuda12.4",
                "command": "python train.py",
                "flavor": "h100-80gb",
                "nodes": 1,
                "gpus_per_node": 1,
                "env": {"GANTRY_SIM_DURATION_S": "30"},
            },
        )
        assert status == 201, run
        run_url = f"{base}/api/v1/runs/{run['id']}/"
        wait_for(
            lambda: http("GET", run_url, token=token)[1]["state"] == "SUCCEEDED",
            timeout=90,
            what="the run to succeed on the simulator",
        )
    finally:
        process.send_signal(signal.SIGINT)
        exit_code = process.wait(timeout=30)
    assert exit_code == 0, log_path.read_text()[-3000:]
    assert processes_using(str(data_dir)) == []

    # A second start keeps the data.
    process = start_embedded(data_dir, port, log_path)
    try:
        wait_for(lambda: _ready(base), timeout=120, what="the second start")
        status, again = http("GET", run_url, token=token)
        assert (status, again["state"]) == (200, "SUCCEEDED")
        assert (data_dir / "secret_key").read_text() == key  # the same key again
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert log_path.read_text().count("Demo data already present; keeping it.") == 1


def raw_http(method: str, url: str, *, headers: dict, body: bytes | None = None):
    """(status, headers, body text) of one request, whatever its status."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def test_embedded_default_shows_no_debug_pages_and_serves_static_files(tmp_path):
    """Issue 21.8: ``make run`` without GANTRY_DEBUG: an error page shows no request body
    (a password in it) and a 404 lists no URL patterns; static files are still served."""
    data_dir = tmp_path / "data"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "embedded.log"
    process = start_embedded(data_dir, port, log_path)
    try:
        wait_for(lambda: _ready(base), timeout=120, what="the embedded server")

        status, _, page = raw_http("GET", f"{base}/no-such-page/", headers={})
        assert status == 404
        assert "There is nothing here" in page
        assert "URLconf" not in page and "runs/&lt;int:run_id&gt;/" not in page

        # A host Gantry does not answer to fails before any view: with debug pages on,
        # Django's error page would print the POST body, password included.
        status, _, page = raw_http(
            "POST",
            f"{base}/accounts/login/",
            headers={"Host": "evil.example", "Content-Type": "application/x-www-form-urlencoded"},
            body=b"username=alice&password=hunter2-secret",
        )
        assert (status, page) == (
            400,
            '\n<!doctype html>\n<html lang="en">\n<head>\n  <title>Bad Request (400)</title>\n'
            "</head>\n<body>\n  <h1>Bad Request (400)</h1><p></p>\n</body>\n</html>\n",
        )

        status, headers, css = raw_http("GET", f"{base}/static/gantry/gantry.css", headers={})
        assert (status, headers["Content-Type"]) == (200, 'text/css; charset="utf-8"')
        assert css == (ROOT / "static" / "gantry" / "gantry.css").read_text()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    assert "Django debug pages: off" in log_path.read_text()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
