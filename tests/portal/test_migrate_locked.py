"""A migration started twice at once (the Kubernetes migration Job's bad input), and a web
replica started before the migrations finished (/readyz says 503 with why, never a 500).

The concurrent migrations run as real ``manage.py migrate_locked`` processes against a new,
empty PostgreSQL database on the test server, created for the test and dropped after it."""

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from portal.management.commands.migrate_locked import MIGRATION_LOCK_KEY
from portal.readiness import readiness_forget
from tests import REPOSITORY


def server_url(database: str) -> str:
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture
def empty_database():
    """The URL of a new database with nothing in it."""
    name = f"gantry_migrate_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server_url(name)
    finally:
        with psycopg.connect(server_url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def migrate_locked(url: str, data_dir) -> subprocess.Popen:
    env = os.environ | {
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "GANTRY_DATA_DIR": str(data_dir),
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "migrate_locked", "-v", "1"],
        cwd=REPOSITORY, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def expected_migrations() -> set[tuple[str, str]]:
    return set(MigrationLoader(None, ignore_no_migrations=True).graph.nodes)


def applied_rows(url: str) -> Counter:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT app, name FROM django_migrations").fetchall()
    return Counter((app, name) for app, name in rows)


def test_two_migrations_at_once_both_succeed_and_apply_each_migration_once(
    empty_database, tmp_path
):
    first, second = (
        migrate_locked(empty_database, tmp_path),
        migrate_locked(empty_database, tmp_path),
    )
    outputs = [process.communicate(timeout=300)[0] for process in (first, second)]

    assert [first.returncode, second.returncode] == [0, 0], outputs
    rows = applied_rows(empty_database)
    assert set(rows) == expected_migrations()
    assert set(rows.values()) == {1}
    # One of them applied everything, the other found nothing left to do.
    assert sorted(output.count("Applying ") for output in outputs) == [0, len(rows)]
    assert all("No migrations to apply." in o or "Applying " in o for o in outputs)


def test_a_migration_waits_while_another_holds_the_lock(empty_database, tmp_path):
    with psycopg.connect(empty_database, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [MIGRATION_LOCK_KEY])
        waiting = migrate_locked(empty_database, tmp_path)
        time.sleep(4)  # long enough to start Django and apply the first migrations
        assert waiting.poll() is None
        with psycopg.connect(empty_database) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchone()
        assert tables == (0,)
        holder.execute("SELECT pg_advisory_unlock(%s)", [MIGRATION_LOCK_KEY])
        output = waiting.communicate(timeout=300)[0]

    assert waiting.returncode == 0, output
    assert set(applied_rows(empty_database)) == expected_migrations()


@pytest.fixture
def fresh_readiness():
    readiness_forget()
    yield
    readiness_forget()


@pytest.mark.django_db
def test_readyz_is_503_while_a_migration_is_not_applied(client, fresh_readiness):
    latest = MigrationRecorder.Migration.objects.filter(app="jobs").order_by("-id").first()
    assert latest is not None
    name = latest.name
    latest.delete()  # as if the release's migration Job had not reached it yet

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json() == {
        "status": "unavailable",
        "reason": f"migrations: 1 not applied yet (first jobs.{name})",
    }

    MigrationRecorder.Migration.objects.create(app="jobs", name=name)
    response = client.get("/readyz")

    assert (response.status_code, response.json()) == (200, {"status": "ok"})


@pytest.mark.django_db
def test_readyz_is_503_on_a_database_without_any_migration(client, fresh_readiness):
    expected = len(expected_migrations())
    MigrationRecorder.Migration.objects.all().delete()

    response = client.get("/readyz")

    assert response.status_code == 503
    reason = response.json()["reason"]
    assert reason.startswith(f"migrations: {expected} not applied yet (first ")


@pytest.mark.django_db
def test_readyz_asks_the_database_about_migrations_until_they_are_all_applied(
    client, fresh_readiness, django_assert_max_num_queries
):
    assert client.get("/readyz").status_code == 200
    # Then only the database's answer: the migrations are not read again.
    with django_assert_max_num_queries(1):
        assert client.get("/readyz").status_code == 200
    assert connection.vendor == "postgresql"
    assert settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
