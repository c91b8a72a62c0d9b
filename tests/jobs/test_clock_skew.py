"""Bad input: a backend whose clock is skewed from Gantry's (issue 31, "Bad input"). Times
that cannot be true by Gantry's clock give a clear reason and change nothing else: no start,
no end, no charge on a guess. Once the backend's times can be true, they apply as ever."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from clusters.backends.base import JobStatus
from jobs.models import Attempt, Run, RunState, TenantMonthUsage
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_apply_status
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 31, 23, 58, tzinfo=UTC)


def pending_attempt(world) -> Attempt:
    with time_machine.travel(T0, tick=False):
        run = run_submit(user=world.researcher_a, data=experiment_input(world))
        admission_run_cycle(now=T0)
        attempt_submit(attempt_id=run.attempts.get().pk)
    return Attempt.objects.select_related("run", "cluster").get(run=run)


def apply(attempt_id: int, status: JobStatus, *, now: datetime) -> int:
    attempt = Attempt.objects.select_related("run", "cluster").get(pk=attempt_id)
    with time_machine.travel(now, tick=False):
        return attempt_apply_status(attempt=attempt, status=status, now=now)


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (
            JobStatus(state="RUNNING", started_at=T0 + timedelta(minutes=10)),
            "sim-1 says the job started at 2026-06-01 00:08:00 UTC, 540 s after Gantry's clock "
            "(23:59:00 UTC): the clocks disagree",
        ),
        (
            JobStatus(state="SUCCEEDED", started_at=T0, finished_at=T0 + timedelta(minutes=3)),
            "sim-1 says the job ended at 2026-06-01 00:01:00 UTC, 120 s after Gantry's clock "
            "(23:59:00 UTC): the clocks disagree",
        ),
        (
            JobStatus(
                state="SUCCEEDED",
                started_at=T0 + timedelta(seconds=50),
                finished_at=T0 + timedelta(seconds=20),
            ),
            "sim-1 says the job ended before it started: its clock is not to be trusted",
        ),
    ],
)
def test_times_that_cannot_be_true_change_nothing_but_the_reason(world, status, says):
    # Given a run placed and pending at the simulator since T0.
    attempt = pending_attempt(world)
    assert attempt.run.state == RunState.PENDING

    # When the backend reports times that cannot be true by Gantry's clock (at T0 + 1 min).
    assert apply(attempt.pk, status, now=T0 + timedelta(minutes=1)) == 0

    # Then the run still waits, saying why; the attempt shows the same; nothing is charged.
    run = Run.objects.get(pk=attempt.run_id)
    reason = f"{says}; nothing is recorded or charged until they agree"
    assert (run.state, run.wait_reason, run.wait_message) == (RunState.PENDING, "BACKEND", reason)
    assert (run.started_at, run.finished_at) == (None, None)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.started_at, attempt.backend_error) == (
        "PENDING",
        None,
        reason,
    )
    assert not TenantMonthUsage.objects.exists()


def test_times_that_agree_again_apply_as_ever(world):
    attempt = pending_attempt(world)
    started = T0 + timedelta(minutes=10)
    apply(attempt.pk, JobStatus(state="RUNNING", started_at=started), now=T0 + timedelta(minutes=1))

    # When Gantry's clock reaches the reported start, the same report is true and applies.
    assert apply(attempt.pk, JobStatus(state="RUNNING", started_at=started), now=started) == 1
    run = Run.objects.get(pk=attempt.run_id)
    attempt.refresh_from_db()
    assert (run.state, run.started_at, attempt.started_at) == (RunState.RUNNING, started, started)
    assert attempt.backend_error == ""
