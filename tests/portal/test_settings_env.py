"""Settings come from the environment, parsed strictly and failing closed (portal/env.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_int, env_list, env_str, parse_database_url
from tests import REPOSITORY

ROOT = REPOSITORY


# --- env_bool / env_int / env_str / env_list ------------------------------------------------


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on", " True "])
def test_env_bool_reads_true(monkeypatch, raw):
    monkeypatch.setenv("GANTRY_FLAG", raw)
    assert env_bool("GANTRY_FLAG", default=False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "off"])
def test_env_bool_reads_false(monkeypatch, raw):
    monkeypatch.setenv("GANTRY_FLAG", raw)
    assert env_bool("GANTRY_FLAG", default=True) is False


@pytest.mark.parametrize("raw", [None, "", "  "])
def test_env_bool_unset_or_empty_gives_the_default(monkeypatch, raw):
    if raw is None:
        monkeypatch.delenv("GANTRY_FLAG", raising=False)
    else:
        monkeypatch.setenv("GANTRY_FLAG", raw)
    assert env_bool("GANTRY_FLAG", default=True) is True
    assert env_bool("GANTRY_FLAG", default=False) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "enabled", "y"])
def test_env_bool_rejects_anything_else_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("GANTRY_FLAG", raw)
    with pytest.raises(ImproperlyConfigured, match=r"GANTRY_FLAG must be a boolean"):
        env_bool("GANTRY_FLAG", default=False)


def test_env_int_reads_integers(monkeypatch):
    monkeypatch.setenv("GANTRY_COUNT", " 42 ")
    assert env_int("GANTRY_COUNT", default=1) == 42
    monkeypatch.setenv("GANTRY_COUNT", "-3")
    assert env_int("GANTRY_COUNT", default=1) == -3
    monkeypatch.setenv("GANTRY_COUNT", "")
    assert env_int("GANTRY_COUNT", default=7) == 7


@pytest.mark.parametrize("raw", ["five", "1.5", "10s", "0x10"])
def test_env_int_rejects_non_integers_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("GANTRY_COUNT", raw)
    with pytest.raises(ImproperlyConfigured, match=r"GANTRY_COUNT must be an integer"):
        env_int("GANTRY_COUNT", default=1)


def test_env_str_without_default_is_required(monkeypatch):
    monkeypatch.delenv("GANTRY_NEEDED", raising=False)
    with pytest.raises(ImproperlyConfigured, match=r"GANTRY_NEEDED is required"):
        env_str("GANTRY_NEEDED")
    monkeypatch.setenv("GANTRY_NEEDED", "")
    with pytest.raises(ImproperlyConfigured, match=r"GANTRY_NEEDED is required"):
        env_str("GANTRY_NEEDED")


def test_env_str_returns_the_value_or_the_default(monkeypatch):
    monkeypatch.delenv("GANTRY_NEEDED", raising=False)
    assert env_str("GANTRY_NEEDED", default="fallback") == "fallback"
    monkeypatch.setenv("GANTRY_NEEDED", "given")
    assert env_str("GANTRY_NEEDED", default="fallback") == "given"


def test_env_list_splits_on_commas_and_drops_blanks(monkeypatch):
    monkeypatch.setenv("GANTRY_HOSTS", " a.example.org, b.example.org,,c ")
    assert env_list("GANTRY_HOSTS", default=[]) == ["a.example.org", "b.example.org", "c"]
    monkeypatch.setenv("GANTRY_HOSTS", "")
    assert env_list("GANTRY_HOSTS", default=["localhost"]) == ["localhost"]


# --- DATABASE_URL ---------------------------------------------------------------------------


def test_postgres_url_gives_every_connection_field():
    database = parse_database_url("postgres://gantry:s3cr%40t%2Fx@db.internal:6543/gantry_prod")
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert database["NAME"] == "gantry_prod"
    assert database["USER"] == "gantry"
    assert database["PASSWORD"] == "s3cr@t/x"
    assert database["HOST"] == "db.internal"
    assert database["PORT"] == "6543"


def test_postgresql_scheme_and_defaults_for_missing_parts():
    database = parse_database_url("postgresql://127.0.0.1/gantry")
    assert database["ENGINE"] == "django.db.backends.postgresql"
    assert (database["NAME"], database["USER"], database["PASSWORD"]) == ("gantry", "", "")
    assert (database["HOST"], database["PORT"]) == ("127.0.0.1", "")


def test_postgres_url_without_database_name_is_rejected():
    with pytest.raises(ImproperlyConfigured, match="database name"):
        parse_database_url("postgres://postgres@127.0.0.1:5432/")


def test_sqlite_url_points_at_the_file(tmp_path):
    database_file = tmp_path / "gantry.sqlite3"
    database_file.touch()
    database = parse_database_url(f"sqlite:///{database_file}")
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert os.path.samefile(database["NAME"], database_file)


def test_sqlite_url_without_path_is_rejected():
    with pytest.raises(ImproperlyConfigured, match="needs a file path"):
        parse_database_url("sqlite:///")


@pytest.mark.parametrize("url", ["mysql://root@127.0.0.1/gantry", "gantry", ""])
def test_unsupported_database_urls_are_rejected(url):
    with pytest.raises(ImproperlyConfigured, match="not supported"):
        parse_database_url(url)


# --- importing the settings in a clean environment ------------------------------------------

SUMMARY = (
    "import json\n"
    "from django.conf import settings\n"
    "database = settings.DATABASES['default']\n"
    "print(json.dumps({'embedded': settings.EMBEDDED, 'debug': settings.DEBUG,\n"
    "  'secret_key': settings.SECRET_KEY, 'engine': database['ENGINE'],\n"
    "  'name': str(database['NAME']), 'broker': settings.CELERY_BROKER_URL,\n"
    "  'admission_interval': settings.GANTRY_ADMISSION_INTERVAL_S,\n"
    "  'options': database.get('OPTIONS', {})}))\n"
)


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Import portal.settings in a fresh interpreter that sees only ``env`` (and PATH)."""
    clean = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GANTRY_DATA_DIR": str(tmp_path / "data"),
    }
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-c", SUMMARY],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_production_mode_without_secret_key_refuses_to_start(tmp_path):
    result = load_settings(tmp_path, GANTRY_EMBEDDED="0")
    assert result.returncode != 0
    assert "ImproperlyConfigured: environment variable DJANGO_SECRET_KEY is required" in (
        result.stderr
    )


def test_production_mode_is_the_default(tmp_path):
    result = load_settings(tmp_path)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY is required" in result.stderr


def test_production_mode_with_secret_key_starts_strict(tmp_path):
    result = load_settings(
        tmp_path,
        GANTRY_EMBEDDED="0",
        DJANGO_SECRET_KEY="a-real-secret-from-the-environment",
        DATABASE_URL="postgres://gantry:pw@db:5432/gantry",
        CELERY_BROKER_URL="redis://redis:6379/0",
        GANTRY_ADMISSION_INTERVAL_S="9",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "embedded": False,
        "debug": False,
        "secret_key": "a-real-secret-from-the-environment",
        "engine": "django.db.backends.postgresql",
        "name": "gantry",
        "broker": "redis://redis:6379/0",
        "admission_interval": 9,
        "options": {"connect_timeout": 10, "server_side_binding": True, "prepare_threshold": 2},
    }


def test_prepared_statements_can_be_turned_off_for_a_pooler(tmp_path):
    result = load_settings(
        tmp_path,
        GANTRY_EMBEDDED="0",
        DJANGO_SECRET_KEY="a-real-secret-from-the-environment",
        DATABASE_URL="postgres://gantry:pw@db:5432/gantry",
        GANTRY_DB_PREPARED_STATEMENTS="0",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["options"] == {"connect_timeout": 10}


@pytest.mark.django_db
def test_a_query_sent_twice_is_prepared_by_postgresql():
    """What the setting buys: once a connection has sent a query twice, PostgreSQL keeps its
    plan (a prepared statement) instead of planning it again."""
    from django.contrib.auth.models import User
    from django.db import connection

    def prepared() -> int:
        """This connection's prepared statements of the lookup below."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ['%FROM "auth_user" WHERE "auth_user"."username" = $2 LIMIT 1'],
            )
            return cursor.fetchone()[0]

    assert prepared() == 0
    for _ in range(2):
        User.objects.filter(username="nobody-here").exists()
        assert prepared() == 0
    User.objects.filter(username="nobody-here").exists()
    assert prepared() == 1


def test_embedded_mode_needs_no_configuration(tmp_path):
    result = load_settings(tmp_path, GANTRY_EMBEDDED="1")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["embedded"] is True
    assert summary["debug"] is False  # debug pages only when asked for (issue 21.8)
    assert summary["secret_key"] != ""
    assert summary["engine"] == "django.db.backends.sqlite3"
    assert summary["broker"] == "filesystem://"
    assert (tmp_path / "data").is_dir()
    (tmp_path / "data" / "gantry.sqlite3").touch()
    assert os.path.samefile(summary["name"], tmp_path / "data" / "gantry.sqlite3")


@pytest.mark.parametrize(("raw", "debug"), [("1", True), ("true", True), ("0", False)])
def test_embedded_debug_is_on_only_when_asked_for(tmp_path, raw, debug):
    result = load_settings(tmp_path, GANTRY_EMBEDDED="1", GANTRY_DEBUG=raw)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["debug"] is debug


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("GANTRY_EMBEDDED", "sometimes", "GANTRY_EMBEDDED must be a boolean"),
        ("GANTRY_DEBUG", "verbose", "GANTRY_DEBUG must be a boolean"),
        ("GANTRY_CELERY_EAGER", "2", "GANTRY_CELERY_EAGER must be a boolean"),
        ("GANTRY_ADMISSION_INTERVAL_S", "5s", "GANTRY_ADMISSION_INTERVAL_S must be an integer"),
        ("GANTRY_LOST_GRACE_S", "two minutes", "GANTRY_LOST_GRACE_S must be an integer"),
        ("GANTRY_ADMISSION_BATCH_MS", "-1", "GANTRY_ADMISSION_BATCH_MS must be 0 or more"),
        ("GANTRY_WORKER_NICE", "low", "GANTRY_WORKER_NICE must be an integer, got 'low'"),
        (
            "GANTRY_WORKER_NICE",
            "20",
            "GANTRY_WORKER_NICE must be a niceness from 0 (unchanged) to 19, got 20",
        ),
        (
            "GANTRY_WORKER_NICE",
            "-5",
            "GANTRY_WORKER_NICE must be a niceness from 0 (unchanged) to 19, got -5",
        ),
        ("DATABASE_URL", "mysql://db/gantry", "DATABASE_URL scheme 'mysql' is not supported"),
        ("GANTRY_PORT", "http", "GANTRY_PORT must be an integer"),
        ("GANTRY_PORT", "70000", "GANTRY_PORT must be a TCP port (1 to 65535), got 70000"),
    ],
)
def test_malformed_values_stop_start_up_naming_the_variable(tmp_path, variable, value, message):
    result = load_settings(tmp_path, **{"GANTRY_EMBEDDED": "1", variable: value})
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {message}" in result.stderr


PUBLIC_URL = "from django.conf import settings; print(settings.GANTRY_PUBLIC_URL)"


@pytest.mark.parametrize(
    ("env", "public_url"),
    [
        ({}, "http://127.0.0.1:8000"),
        # `GANTRY_PORT=8123 make run` serves on 8123: jobs and links are told so.
        ({"GANTRY_PORT": "8123"}, "http://127.0.0.1:8123"),
        # A public URL that is set wins: behind a proxy the port is not the public one.
        (
            {"GANTRY_PORT": "8123", "GANTRY_PUBLIC_URL": "https://gantry.example.org/"},
            "https://gantry.example.org",
        ),
    ],
)
def test_the_public_url_follows_gantry_port_unless_it_is_set(tmp_path, env, public_url):
    clean = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GANTRY_DATA_DIR": str(tmp_path / "data"),
        "GANTRY_EMBEDDED": "1",
        **env,
    }
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {PUBLIC_URL}"],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == public_url
