"""gunicorn's settings for the portal: ``gunicorn -c python:portal.gunicorn_conf portal.wsgi``.

One process per core, plus one, each serving one request at a time (sync workers): a
request of the portal computes longer than it waits on PostgreSQL (~11 ms of CPU for ~3 ms
of database under the load benchmark's flood), so threads in a process mostly queue on
Python's lock; on 2 cores, 5 processes served 0.85× the requests of 3. Measured on 2
cores with 100 people (docs/benchmarks-notes.md, *Load: the worker model*), 4 threads a
worker gave no more throughput (1.01× in two runs) and no steadier p95 (390 vs 430 ms, 250
vs 200 ms): the simpler model stays the default. ``GANTRY_WEB_THREADS`` above 1 runs threaded
workers (gthread) for hosts whose requests wait more than they compute. Both numbers can be
set (docs/operations.md).
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
workers = _count(
    "GANTRY_WEB_WORKERS", os.environ.get("GANTRY_WEB_WORKERS"), (os.cpu_count() or 1) + 1
)
threads = _count("GANTRY_WEB_THREADS", os.environ.get("GANTRY_WEB_THREADS"), 1)
worker_class = "gthread" if threads > 1 else "sync"
timeout = 60
accesslog = os.environ.get("GANTRY_WEB_ACCESS_LOG") or "-"
