"""Test settings: the project's settings with defaults for the machine's PostgreSQL and Redis.

``make test`` exports the real values (it may start throwaway servers on other ports) and
spreads the suite over pytest-xdist workers. pytest-django gives each worker a database of
its own (``test_gantry_gw0``, …); here each worker also gets a Redis database and a data
directory of its own, so a real Celery worker started by one test process never takes a
task that another one queued. The environment is changed, not only the settings, because
the Celery and web processes the tests start read it.
"""

import os
import re
from pathlib import Path

from portal.metrics_files import host_metrics_reset

os.environ.setdefault("GANTRY_EMBEDDED", "1")  # its key is generated in GANTRY_DATA_DIR
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("GANTRY_DATA_DIR", "/tmp/gantry-test-data")

_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", …, or unset
if _xdist_worker and not os.environ.get("GANTRY_TEST_WORKER_ISOLATED"):
    _index = int(_xdist_worker.removeprefix("gw"))
    _broker = os.environ["CELERY_BROKER_URL"]
    _match = re.fullmatch(r"(redis://[^/]+)/(\d+)", _broker)
    if _match:  # counts down from the given database: 15, 14, 13, …
        _db = int(_match.group(2)) - _index
        if _db < 0:
            raise RuntimeError(f"no Redis database left for xdist worker {_xdist_worker}")
        os.environ["CELERY_BROKER_URL"] = f"{_match.group(1)}/{_db}"
    os.environ["GANTRY_DATA_DIR"] = os.environ["GANTRY_DATA_DIR"].rstrip("/") + f"-{_xdist_worker}"
    # Metric files too (they follow the data directory): the controller process's reset is
    # not the worker's.
    os.environ.pop("GANTRY_TEST_METRICS_FRESH", None)
    os.environ["GANTRY_TEST_WORKER_ISOLATED"] = "1"  # the processes tests start keep it as is

# The first test process empties the metric files of earlier sessions before any process
# records (portal/metrics_files.py); processes started after it inherit the directory.
# They live below the data directory (GANTRY_METRICS_DIR is not exported): a process a test
# starts with a data directory of its own (make run, gunicorn) then has metric files of its
# own too, and cannot empty this process's when it starts.
if not os.environ.get("GANTRY_TEST_METRICS_FRESH"):
    host_metrics_reset(
        Path(
            os.environ.get("GANTRY_METRICS_DIR")
            or os.environ["GANTRY_DATA_DIR"].rstrip("/") + "/metrics"
        )
    )
    os.environ["GANTRY_TEST_METRICS_FRESH"] = "1"

from portal.settings import *  # noqa: E402, F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests

# The beats of each test lead on a lock of their own: a beat that one test killed holds its
# Redis lock for the TTL, which must not delay the next test's beat. Processes that share a
# data directory (a test's several beats) share the lock.
GANTRY_BEAT_LOCK_KEY = f"gantry-test:{DATA_DIR}:beat"  # noqa: F405
