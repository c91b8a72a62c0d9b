"""gunicorn's settings for the portal: ``gunicorn -c python:portal.gunicorn_conf portal.wsgi``.

Threaded workers (gthread): a request spends much of its time waiting on PostgreSQL, and
a thread of the same process serves another meanwhile; one process per core (plus one) runs
Python, whose lock lets one thread at a time compute. Sized for the machine by default,
both numbers can be set (docs/operations.md). Measured in docs/benchmarks.md (*Load*).
"""

import os


def _count(name: str, value: str | None, default: int) -> int:
    if not value:
        return default
    number = int(value)
    if number < 1:
        raise ValueError(f"{name} must be at least 1, not {value!r}")
    return number


# docker-compose.yml passes --bind 0.0.0.0:8000 (inside the container, published on the host's
# loopback only).
bind = os.environ.get("GANTRY_WEB_BIND") or "127.0.0.1:8000"
worker_class = "gthread"
workers = _count(
    "GANTRY_WEB_WORKERS", os.environ.get("GANTRY_WEB_WORKERS"), (os.cpu_count() or 1) + 1
)
threads = _count("GANTRY_WEB_THREADS", os.environ.get("GANTRY_WEB_THREADS"), 4)
timeout = 60
# Connections of a browser that keeps them open are held for this long between requests,
# without a thread waiting on them (gthread parks them).
keepalive = 5
accesslog = os.environ.get("GANTRY_WEB_ACCESS_LOG") or "-"
