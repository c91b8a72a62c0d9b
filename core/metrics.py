"""Gantry's own counters and histograms, and the small helpers the services record them with.

Served at /metrics by portal/metrics.py, which also computes the gauges (pending runs, the
Celery queue) at scrape time. Values live in files per process (portal/metrics_files.py),
so what a Celery worker records is in the scrape that a gunicorn worker answers.

Labels are bounded and validated: a tenant, flavor or cluster slug, an operation of
BACKEND_OPERATIONS, an error kind of ERROR_KINDS. Never a name, a command or a message:
those are free text, and every distinct label value is a new time series.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.db import transaction
from prometheus_client import Counter, Histogram

BACKEND_OPERATIONS = (
    "submit",
    "sync",
    "cancel",
    "logs",
    "inventory",
    "fence",
    "unfence",
    "health_check",
    "workspace_address",
    "workspace_release",
)
ERROR_KINDS = ("transient", "permanent", "unexpected")
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
# A request no URL pattern matched: a static file WhiteNoise answered, or a 404 of a path
# that does not exist (each such path as a label would be a series per typo).
UNROUTED = "unrouted"
TASK_OUTCOMES = ("success", "failure", "retry")
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0

ADMISSION_CYCLE_SECONDS = Histogram(
    "gantry_admission_cycle_duration_seconds",
    "Time one admission cycle took: snapshot, decision and writing it",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SUBMIT_TO_ADMISSION_SECONDS = Histogram(
    "gantry_run_submit_to_admission_seconds",
    "Time from a run's submission to its admission, per GPU flavor",
    ["flavor"],
    buckets=(1, 10, 30, MINUTE, 5 * MINUTE, 15 * MINUTE, HOUR, 3 * HOUR, 12 * HOUR, DAY, 7 * DAY),
)
ADMISSION_TO_RUNNING_SECONDS = Histogram(
    "gantry_run_admission_to_running_seconds",
    "Time from a run's admission to its start on the cluster, per cluster",
    ["cluster"],
    buckets=(1, 5, 10, 30, MINUTE, 2 * MINUTE, 5 * MINUTE, 15 * MINUTE, HOUR, 3 * HOUR),
)
BACKEND_REQUEST_SECONDS = Histogram(
    "gantry_backend_request_duration_seconds",
    "Time a call to a cluster's backend took, per cluster and operation",
    ["cluster", "operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
BACKEND_ERRORS = Counter(
    "gantry_backend_errors_total",
    "Calls to a cluster's backend that failed, per cluster, operation and kind",
    ["cluster", "operation", "kind"],
)
TELEMETRY_SAMPLES_INGESTED = Counter(
    "gantry_telemetry_samples_ingested_total",
    "GPU metric samples read from a cluster's telemetry source and stored",
    ["cluster"],
)
SDK_RANK_WINDOWS_REFUSED = Counter(
    "gantry_sdk_rank_windows_refused_total",
    "Per-rank step windows the events endpoint refused, per reason (telemetry.rank_windows)",
    ["reason"],
)
TELEMETRY_SAMPLES_UNMAPPED = Counter(
    "gantry_telemetry_samples_unmapped_total",
    "GPU metric samples rolled up that no attempt claims",
    ["cluster"],
)
HTTP_REQUEST_SECONDS = Histogram(
    "gantry_http_request_duration_seconds",
    "Time the portal took to answer a request, per view, method and status class",
    ["view", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
TASK_SECONDS = Histogram(
    "gantry_task_duration_seconds",
    "Time a Celery task took in a worker, per task, queue and outcome",
    ["task", "queue", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)


def http_request_observed(*, view: str, method: str, status: int, seconds: float) -> None:
    """Record one answered request. ``view`` is the URL pattern's name (bounded by the URL
    configuration), never the path; a method outside HTTP_METHODS counts as ``other``."""
    method = method if method in HTTP_METHODS else "other"
    HTTP_REQUEST_SECONDS.labels(view, method, f"{status // 100}xx").observe(seconds)


def task_observed(*, task: str, queue: str, outcome: str, seconds: float) -> None:
    """Record one task run by a worker: ``outcome`` is one of TASK_OUTCOMES."""
    if outcome not in TASK_OUTCOMES:
        raise ValueError(f"unknown task outcome {outcome!r}")
    TASK_SECONDS.labels(task, queue, outcome).observe(seconds)


@contextmanager
def backend_call_timed(*, cluster: str, operation: str) -> Iterator[None]:
    """Time one call to a backend (``clusters.backends.calls.backend_call`` also counts its
    errors, by kind: only the backends know which kind an error is)."""
    if operation not in BACKEND_OPERATIONS:
        raise ValueError(f"unknown backend operation {operation!r}")
    started = time.perf_counter()
    try:
        yield
    finally:
        BACKEND_REQUEST_SECONDS.labels(cluster, operation).observe(time.perf_counter() - started)


def backend_error_count(*, cluster: str, operation: str, kind: str) -> None:
    """Count one failed call to a backend: ``kind`` is one of ERROR_KINDS."""
    if operation not in BACKEND_OPERATIONS:
        raise ValueError(f"unknown backend operation {operation!r}")
    if kind not in ERROR_KINDS:
        raise ValueError(f"unknown backend error kind {kind!r}")
    BACKEND_ERRORS.labels(cluster, operation, kind).inc()


def _seconds_between(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def run_admitted(*, flavor: str, submitted_at: datetime, admitted_at: datetime) -> None:
    """Record a run's wait for admission once the admission commits (a rolled-back cycle
    admitted nothing)."""
    waited = _seconds_between(submitted_at, admitted_at)
    transaction.on_commit(lambda: SUBMIT_TO_ADMISSION_SECONDS.labels(flavor).observe(waited))


def run_started(*, cluster: str, admitted_at: datetime | None, started_at: datetime) -> None:
    """Record how long an admitted run took to start on its cluster, once that commits."""
    if admitted_at is None:
        return
    waited = _seconds_between(admitted_at, started_at)
    transaction.on_commit(lambda: ADMISSION_TO_RUNNING_SECONDS.labels(cluster).observe(waited))


def telemetry_samples_recorded(*, cluster: str, ingested: int = 0, unmapped: int = 0) -> None:
    TELEMETRY_SAMPLES_INGESTED.labels(cluster).inc(ingested)
    TELEMETRY_SAMPLES_UNMAPPED.labels(cluster).inc(unmapped)
