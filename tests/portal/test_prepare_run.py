"""`manage.py prepare_run`, what `make run` does before it starts its processes, in one
process: on an empty embedded data directory it migrates every migration, seeds the demo and
empties the metric files of earlier processes; on the next start it keeps the demo."""

import os
import socket
import sqlite3
import subprocess
import sys

import pytest
from django.db.migrations.loader import MigrationLoader

from portal.demo import DEMO_PASSWORD, LOGINS
from tests import REPOSITORY

pytestmark = pytest.mark.integration


def prepare_run(data_dir) -> str:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"GANTRY_EMBEDDED": "1", "GANTRY_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "manage.py", "prepare_run", "--speedup", "30"],
        cwd=REPOSITORY, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_prepare_run_migrates_seeds_and_empties_the_metric_files_then_keeps_the_demo(tmp_path):
    data_dir = tmp_path / "data"
    # A value file that a process of an earlier start left behind.
    stale = data_dir / "metrics" / socket.gethostname() / "counter_4242.db"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    logins = "\n".join(
        f"  {login.username:<8} {login.persona:<15} {login.where}" for login in LOGINS
    )

    first = prepare_run(data_dir)

    assert first == (
        f"Seeded the demo.\n\nDemo logins (password for all: {DEMO_PASSWORD}):\n{logins}\n"
    )
    assert not stale.exists()
    assert stale.parent.is_dir()
    database = sqlite3.connect(data_dir / "gantry.sqlite3")
    try:
        applied = set(database.execute("SELECT app, name FROM django_migrations"))
        tenants = [row[0] for row in database.execute("SELECT slug FROM tenants_tenant ORDER BY 1")]
        users = [row[0] for row in database.execute("SELECT username FROM auth_user ORDER BY 1")]
    finally:
        database.close()
    assert applied == set(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)
    assert tenants == ["climate", "nlp", "vision"]
    assert users == sorted(login.username for login in LOGINS)

    second = prepare_run(data_dir)

    assert second == (
        f"Demo data already present; keeping it.\n\n"
        f"Demo logins (password for all: {DEMO_PASSWORD}):\n{logins}\n"
    )
