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

from collections.abc import Iterable

from celery import current_app
from django.db import transaction

ADMISSION_CYCLE = "jobs.tasks.admission_cycle"
ATTEMPT_SUBMIT = "jobs.tasks.attempt_submit"
ATTEMPT_CANCEL = "jobs.tasks.attempt_cancel"


def _send(task: str, *args: int) -> None:
    current_app.tasks[task].apply_async(args=args)


def after_commit(task: str, *args: int) -> None:
    """Send ``task`` with ``args`` when the current transaction commits (at once outside
    one); a failed send is logged, never raised."""

    # A function, not a functools.partial: Django names the callback in the log line of a
    # robust failure (``__qualname__``), and a partial has no name, so the log itself fails.
    def send() -> None:
        _send(task, *args)

    send.__qualname__ = f"send {task}{args}"
    transaction.on_commit(send, robust=True)


def admission_cycle_enqueue() -> None:
    after_commit(ADMISSION_CYCLE)


def attempt_submit_enqueue(attempt_ids: Iterable[int]) -> None:
    for attempt_id in attempt_ids:
        after_commit(ATTEMPT_SUBMIT, attempt_id)


def attempt_cancel_enqueue(attempt_id: int) -> None:
    after_commit(ATTEMPT_CANCEL, attempt_id)
