"""The sync re-drives submits whose message may have been lost (jobs.services.backend_submit,
``attempt_redrive_stuck_submits``), each one after a wait that doubles with every re-drive.

Found by the chaos test (tests/portal/test_chaos.py): every sync re-sent every submit older
than 30 s, so a burst that queued hundreds of submits behind each other had them all sent
again every second, faster than the workers could take them: 7,913 messages in the queue
for 522 waiting submits, and the burst never drained.
"""

from datetime import UTC, datetime, timedelta

import time_machine

from jobs.models import Attempt, AttemptState
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_redrive_stuck_submits, attempt_submit
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def _admitted_at_t0(world) -> Attempt:
    """An admitted attempt whose submit message never arrives."""
    with time_machine.travel(T0, tick=False):
        run = run_submit(user=world.researcher_a, data=experiment_input(world))
        admission_run_cycle()
    return run.attempts.get()


def _redriven(capture, seconds: int) -> list[str]:
    """What one sync's re-drive sends ``seconds`` after T0."""
    with time_machine.travel(T0 + timedelta(seconds=seconds), tick=False), capture() as callbacks:
        attempt_redrive_stuck_submits()
    return [callback.__qualname__ for callback in callbacks]


def test_a_lost_submit_is_sent_again_after_30_s_then_after_waits_that_double(
    world, django_capture_on_commit_callbacks
):
    attempt = _admitted_at_t0(world)

    # 30 s after its admission, then 60, 120, 240 s after each re-drive, then every 5 minutes
    # (each wait exceeded, by the second of the next sync): not on every sync as before. A
    # wait runs from the last send, so no sync before its end sends anything.
    sends = [31, 92, 213, 454, 755, 1056, 1357]
    for second in sends:
        assert _redriven(django_capture_on_commit_callbacks, second - 1) == []
        assert _redriven(django_capture_on_commit_callbacks, second) == [
            f"send jobs.tasks.attempt_submit({attempt.pk},)"
        ]
    attempt.refresh_from_db()
    assert attempt.submit_redrives == 7
    assert attempt.submit_redriven_at == T0 + timedelta(seconds=1357)


def test_a_submit_that_reached_its_backend_is_not_sent_again(
    world, django_capture_on_commit_callbacks
):
    attempt = _admitted_at_t0(world)
    with time_machine.travel(T0 + timedelta(seconds=5), tick=False):
        attempt_submit(attempt_id=attempt.pk)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.PENDING

    assert _redriven(django_capture_on_commit_callbacks, 31) == []
    attempt.refresh_from_db()
    assert (attempt.submit_redrives, attempt.submit_redriven_at) == (0, None)
