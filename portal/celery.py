import os

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    beat_init,
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
