"""Logs as JSON (GANTRY_LOG_FORMAT=json) with the run, attempt and cluster each line concerns.

The proof is a real Celery worker logging as it would in production while it admits and
submits a run; the format and the context are also checked in this process, exactly.
"""

import io
import json
import logging
import os
import subprocess
import sys

import pytest

from core.log_context import LogContextFilter, log_context
from jobs.models import Attempt, AttemptState
from portal.log_format import JsonFormatter
from tests import REPOSITORY
from tests.celery_support import celery_env, stop_process, wait_for
from tests.jobs.test_lifecycle import submit


@pytest.fixture
def json_lines():
    """A logger writing JSON lines through the filter, as the settings configure it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(LogContextFilter())
    logger = logging.getLogger("tests.json_lines")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)

    def lines() -> list[dict]:
        return [json.loads(line) for line in stream.getvalue().splitlines()]

    yield logger, lines
    logger.removeHandler(handler)


def without_time(line: dict) -> dict:
    return {name: value for name, value in line.items() if name != "time"}


def test_lines_carry_the_ids_of_their_context_and_only_there(json_lines):
    logger, lines = json_lines
    logger.info("before")
    with log_context(cluster="sim-1"):
        logger.info("syncing %s", "sim-1")
        with log_context(run_id=7, attempt_id=11):
            logger.warning("attempt %d: lost", 11)
        logger.info("synced")
    logger.info("after", extra={"request": "an object that may hold a secret"})
    assert [without_time(line) for line in lines()] == [
        {"level": "INFO", "logger": "tests.json_lines", "message": "before"},
        {
            "level": "INFO",
            "logger": "tests.json_lines",
            "message": "syncing sim-1",
            "cluster": "sim-1",
        },
        {
            "level": "WARNING",
            "logger": "tests.json_lines",
            "message": "attempt 11: lost",
            "run_id": 7,
            "attempt_id": 11,
            "cluster": "sim-1",
        },
        {"level": "INFO", "logger": "tests.json_lines", "message": "synced", "cluster": "sim-1"},
        {"level": "INFO", "logger": "tests.json_lines", "message": "after"},
    ]
    assert lines()[0]["time"].endswith("+00:00")


def test_an_exception_is_one_json_line_with_its_traceback(json_lines):
    logger, lines = json_lines
    try:
        raise RuntimeError("backend said no\nsecond line")
    except RuntimeError:
        logger.exception("submit failed")
    (line,) = lines()
    assert line["message"] == "submit failed"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("RuntimeError: backend said no\nsecond line")


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("GANTRY_LOG_FORMAT", "yaml", "GANTRY_LOG_FORMAT must be text or json, got 'yaml'"),
        ("GANTRY_METRICS_TOKEN", "short", "GANTRY_METRICS_TOKEN must be at least 32 characters"),
    ],
)
def test_settings_refuse_a_bad_log_format_or_a_short_metrics_token(
    tmp_path, variable, value, error
):
    env = os.environ | {
        "GANTRY_EMBEDDED": "1",
        "GANTRY_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        variable: value,
    }
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"django.core.exceptions.ImproperlyConfigured: {error}"
    )


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_worker_logs_a_submit_as_json_with_run_attempt_and_cluster(world, tmp_path, settings):
    # Given: a real Celery worker logging JSON.
    log_path = tmp_path / "worker.log"
    env = celery_env(tmp_path, GANTRY_LOG_FORMAT="json")
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "worker", "--loglevel", "INFO",
             "--concurrency", "1", "--without-mingle", "--without-gossip"],
            env=env, cwd=REPOSITORY, start_new_session=True, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # When: a run is submitted; the worker admits it and submits its attempt.
        run = submit(world)
        attempt = wait_for(
            lambda: Attempt.objects.filter(
                run=run,
                state__in=[AttemptState.PENDING, AttemptState.RUNNING, AttemptState.SUCCEEDED],
            ).first(),
            timeout=60,
            what="the worker to submit the attempt",
        )

        def submitted_line() -> dict | None:
            for line in log_path.read_text().splitlines():
                if line.startswith("{") and '"submitted: ' in line:
                    return json.loads(line)
            return None

        line = wait_for(submitted_line, timeout=10, what="the submit's log line")
    finally:
        stop_process(worker)

    # Then: the line is JSON and says which run, attempt and cluster it concerns.
    assert without_time(line) == {
        "level": "INFO",
        "logger": "jobs.services.backend_submit",
        "message": f"submitted: sim-1 holds it as job {attempt.backend_job_id}",
        "run_id": run.pk,
        "attempt_id": attempt.pk,
        "cluster": "sim-1",
    }
    # Every line the worker logged is JSON (its start-up banner is printed, not logged),
    # and the attempt's token, a secret the job gets, is in none of them.
    text = log_path.read_text()
    logged = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert {"celery.worker.consumer.connection", "celery.app.trace"} <= {
        entry["logger"] for entry in logged
    }
    assert f"gat_{attempt.pk}." not in text
