"""The benchmarks' own PostgreSQL database, next to the one the tests use.

Runs before Django is set up: it only rewrites the URL and creates the database.
"""

from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

BENCH_DATABASE = "gantry_bench"


def bench_database_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise SystemExit(f"bench: the admission cycle needs PostgreSQL, DATABASE_URL is {url!r}")
    return urlunsplit(parts._replace(path=f"/{BENCH_DATABASE}"))


def own_database_url(url: str, suffix: str) -> str:
    """The database named after ``url``'s with ``suffix``: ``gantry`` -> ``gantry_load``."""
    parts = urlsplit(bench_database_url(url))  # checks it is PostgreSQL
    name = urlsplit(url).path.lstrip("/") or "gantry"
    return urlunsplit(parts._replace(path=f"/{name}{suffix}"))


def ensure_database(url: str) -> None:
    """Create the database named in ``url`` unless it exists."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(maintenance, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
