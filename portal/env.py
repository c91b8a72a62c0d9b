"""Strict parsing of environment variables: a malformed value stops start-up."""

import os
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_MISSING = object()


def env_str(name: str, *, default: object = _MISSING) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is _MISSING:
            raise ImproperlyConfigured(f"environment variable {name} is required")
        return str(default)
    return value


def env_bool(name: str, *, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0/true/false), got {value!r}")


def env_int(name: str, *, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from None


def env_list(name: str, *, default: list[str]) -> list[str]:
    value = os.environ.get(name, "").strip()
    if value == "":
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_database_url(url: str) -> dict:
    """Turn ``postgres://user:pass@host:port/name`` or ``sqlite:///path`` into a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if path.startswith("//"):  # sqlite:////abs/path: four slashes spell an absolute path
            path = path[1:]
        if not path or path == "/":
            raise ImproperlyConfigured("DATABASE_URL sqlite:/// needs a file path")
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            # WAL and IMMEDIATE transactions let web, worker and beat share one file safely.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
    if parts.scheme in {"postgres", "postgresql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured("DATABASE_URL needs a database name")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    raise ImproperlyConfigured(f"DATABASE_URL scheme {parts.scheme!r} is not supported")


# The table of the database cache (``db://``); created by the migration portal.0001.
CACHE_TABLE = "gantry_cache"
# Seconds a Redis cache may take to connect or answer before the request fails.
CACHE_REDIS_TIMEOUT_S = 5


def parse_cache_url(url: str) -> dict:
    """Turn ``redis://host:port/db`` (or ``rediss://``) or ``db://`` into a CACHES entry.

    Both are shared by every web worker and host: what the API's throttles count there holds
    across processes. ``db://`` keeps the cache in Gantry's own database (the embedded
    default); production uses Redis."""
    parts = urlsplit(url)
    if parts.scheme in {"redis", "rediss"}:
        return {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": "gantry",
            "OPTIONS": {
                "socket_connect_timeout": CACHE_REDIS_TIMEOUT_S,
                "socket_timeout": CACHE_REDIS_TIMEOUT_S,
            },
        }
    if url == "db://":
        return {
            "BACKEND": "portal.cache.DatabaseCache",
            "LOCATION": CACHE_TABLE,
            # Django culls a third of the entries past MAX_ENTRIES, live ones included: a
            # throttle's claims must not vanish early. Expired entries are culled first.
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    raise ImproperlyConfigured(
        f"GANTRY_CACHE_URL must be redis://HOST:PORT/DB, rediss://… or db://, got {url!r}"
    )
