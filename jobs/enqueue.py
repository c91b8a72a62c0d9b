"""Background work is enqueued one way: by task name, once the transaction has committed,
robustly.

The row that calls for the work is written first and the broker is only a trigger (design
§2), so a broker that is down must not fail a write that has committed: ``robust=True``
logs a failed send instead of raising it into the request. The work is not lost with the
message: beat runs the admission cycle every ``GANTRY_ADMISSION_INTERVAL_S``, and the sync
cycle re-drives submits stuck for ``STUCK_SUBMIT_AFTER`` and the cancels of runs still
cancelling.

Tasks are named, not imported: ``jobs.tasks`` imports the services, so the services
importing it back would make a cycle. ``JobsConfig.ready`` registers the tasks in every
process, so a named task runs inline where ``GANTRY_CELERY_EAGER`` asks for it.
"""

import logging
from collections.abc import Iterable

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

logger = logging.getLogger(__name__)

ADMISSION_CYCLE = "jobs.tasks.admission_cycle"
ATTEMPT_SUBMIT = "jobs.tasks.attempt_submit"
ATTEMPT_CANCEL = "jobs.tasks.attempt_cancel"


def _send(task: str, *args: int, countdown: float = 0) -> None:
    """Send ``task`` now, or to start ``countdown`` seconds from now (Celery gives a task
    an ETA only for a countdown above 0)."""
    current_app.tasks[task].apply_async(args=args, countdown=countdown)


def after_commit(task: str, *args: int) -> None:
    """Send ``task`` with ``args`` when the current transaction commits (at once outside
    one); a failed send is logged, never raised."""

    # A function, not a functools.partial: Django names the callback in the log line of a
    # robust failure (``__qualname__``), and a partial has no name, so the log itself fails.
    def send() -> None:
        _send(task, *args)

    send.__qualname__ = f"send {task}{args}"
    transaction.on_commit(send, robust=True)


# A burst of changes (a sweep of submits, a sync that finishes many attempts) needs one
# admission cycle after it, not one per change: a change sends the cycle, to start
# GANTRY_ADMISSION_BATCH_MS later, only while none is waiting to start, marked by this cache
# key. Each cycle removes the mark before it reads anything (``admission_kick_clear``), so a
# change that commits later sends a new one, and a change that finds the mark is read by
# the cycle that set it. The mark expires by itself after an admission interval, when
# beat's own cycle runs anyway.
ADMISSION_KICK_KEY = "gantry:admission-kick"


def admission_cycle_enqueue() -> None:
    def send() -> None:
        if not _admission_kick_claim():
            return  # a cycle that has not started yet will read this change
        try:
            _send(ADMISSION_CYCLE, countdown=settings.GANTRY_ADMISSION_BATCH_MS / 1000)
        except Exception:
            admission_kick_clear()  # not sent: the next change tries again
            raise

    send.__qualname__ = f"send {ADMISSION_CYCLE}()"
    transaction.on_commit(send, robust=True)


def _admission_kick_claim() -> bool:
    """Mark a cycle as waiting; False if one already is. Without a cache, every change
    sends its own cycle, as it would without the mark."""
    try:
        return cache.add(ADMISSION_KICK_KEY, 1, timeout=settings.GANTRY_ADMISSION_INTERVAL_S)
    except Exception:
        logger.warning("admission: the cache did not answer; sending the cycle anyway")
        return True


def admission_kick_clear() -> None:
    try:
        cache.delete(ADMISSION_KICK_KEY)
    except Exception:
        logger.warning("admission: the cache did not answer; its kick mark stays until it expires")


def attempt_submit_enqueue(attempt_ids: Iterable[int]) -> None:
    for attempt_id in attempt_ids:
        after_commit(ATTEMPT_SUBMIT, attempt_id)


def attempt_cancel_enqueue(attempt_id: int) -> None:
    after_commit(ATTEMPT_CANCEL, attempt_id)
