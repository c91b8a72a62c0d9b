"""Real Celery processes for the tests: a worker and beat on the test's PostgreSQL database.

- ``celery_env(tmp_path, **extra)``: the environment of such a process: the test database
  (whatever pytest-django named it), data in ``tmp_path``, admission and sync every second.
- ``start_worker_and_beat(env, log)``: both processes, each leading its own
  process group, their output appended to ``log``; ``start_worker(env, log)``: the worker
  alone (no periodic work acts on the test's data meanwhile).
- ``stop_process(process)``: SIGTERM to its group, SIGKILL after 15 s.
- ``wait_for(predicate, timeout=…, what=…)``: poll until it holds, or fail saying what.
- ``free_port()``: a loopback port nothing listens on now.

PYTEST_DONT_REWRITE: a helper module; it asserts nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def celery_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    db = connection.settings_dict
    env = os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
        "GANTRY_DATA_DIR": str(tmp_path),
        "GANTRY_ADMISSION_INTERVAL_S": "1",
        "GANTRY_SYNC_INTERVAL_S": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    # The browser tests set it for Playwright's loop in this process; workers need none.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return env | extra


def start_worker(env: dict[str, str], log: IO[str], *, concurrency: int = 2) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "worker", "--loglevel", "INFO",
         "--concurrency", str(concurrency), "--without-mingle", "--without-gossip"],
        env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def start_worker_and_beat(
    env: dict[str, str], log: IO[str], *, concurrency: int = 2
) -> list[subprocess.Popen]:
    common = {"env": env, "cwd": ROOT, "start_new_session": True, "stdout": log,
              "stderr": subprocess.STDOUT}  # fmt: skip
    worker = start_worker(env, log, concurrency=concurrency)
    # Gantry's scheduler keeps the schedule's last runs with its leader lock, not in a file
    # (portal/beat.py): no --schedule.
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO"],
        **common,
    )  # fmt: skip
    return [worker, beat]


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for(predicate, *, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
