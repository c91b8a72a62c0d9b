import os
import time

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
)
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

# filesystem:// (the embedded default's broker) is kombu's transport with its files written
# atomically: kombu's own lets a worker read a message half-written and stop.
TRANSPORT_ALIASES["filesystem"] = "portal.filesystem_broker:Transport"

app = Celery("gantry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@after_setup_logger.connect
@after_setup_task_logger.connect
def _log_as_configured(logger, **kwargs):
    """Celery sets up its own log handlers in workers and beat: give them Gantry's JSON
    format when it is asked for (GANTRY_LOG_FORMAT), with the run, attempt and cluster ids."""
    from django.conf import settings

    from core.log_context import LogContextFilter
    from portal.log_format import JsonFormatter

    if settings.GANTRY_LOG_FORMAT != "json":
        return
    for handler in logger.handlers:
        handler.setFormatter(JsonFormatter())
        handler.addFilter(LogContextFilter())


@worker_init.connect
@worker_process_init.connect
@beat_init.connect
def _yield_cpu_to_requests(**kwargs):
    """The worker (before its pool forks, and each pool process again) and beat lower their
    CPU priority to GANTRY_WORKER_NICE: background work waits for requests on a shared
    machine (portal/process_priority.py)."""
    from django.conf import settings

    from portal.process_priority import lower_own_priority

    lower_own_priority(settings.GANTRY_WORKER_NICE)


# task id -> when it started in this process (perf_counter): a task runs in one process.
_task_started: dict[str, float] = {}
_OUTCOME_OF_STATE = {"SUCCESS": "success", "RETRY": "retry"}


@task_prerun.connect
def _task_started_at(task_id=None, **kwargs):
    _task_started[task_id] = time.perf_counter()


@task_postrun.connect
def _task_timed(task_id=None, task=None, state=None, **kwargs):
    """Each task's time, per task, queue and outcome (gantry_task_duration_seconds): the
    workers' saturation seen on /metrics (docs/operations.md). Imported here, not above:
    prometheus_client must first be imported after the settings chose its files."""
    started = _task_started.pop(task_id, None)
    if started is None or task is None:
        return
    from core import metrics
    from portal.task_queues import queue_of

    metrics.task_observed(
        task=task.name,
        queue=queue_of(task.name),
        outcome=_OUTCOME_OF_STATE.get(state, "failure"),
        seconds=time.perf_counter() - started,
    )
