"""A workspace's time limit: its hours and extensions, per session. Gantry ends a session
at it; admission and backfill count the extensions; the backend holds the tenant's
ceiling, so an Extend needs no change to the running job."""

from datetime import timedelta

import pytest

from jobs.models import RunEvent, RunState
from jobs.selectors.queue import held_runs
from jobs.services.backend_submit import _backend_time_limit_s
from jobs.services.submission import run_submit
from jobs.services.workspaces import workspace_extend
from telemetry.workspace_policy import workspace_idle_scan
from tests.conftest import experiment_input
from tests.workspace_support import workspace_running

pytestmark = pytest.mark.django_db


def test_a_session_is_stopped_at_its_hours_and_extensions(
    world, django_capture_on_commit_callbacks
):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=1)
    started = run.attempts.get().started_at
    assert run.experiment.max_runtime_minutes == 4 * 60
    workspace_extend(run=run, actor=world.researcher_a, hours=1)

    assert workspace_idle_scan(now=started + timedelta(hours=4, minutes=59)).ended == 0
    with django_capture_on_commit_callbacks(execute=False) as sent:
        assert workspace_idle_scan(now=started + timedelta(hours=5)).ended == 1
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at is not None) == (RunState.RUNNING, True)
    assert RunEvent.objects.filter(run=run).latest("id").message == (
        "Stopped: its session reached its time limit of 5 h (its hours and extensions)"
    )
    assert len(sent) == 1  # the attempt's cancel, after commit
    # Being stopped, it is judged no more.
    assert workspace_idle_scan(now=started + timedelta(hours=6)).ended == 0


def test_admission_counts_the_extensions_and_the_backend_holds_the_ceiling(world):
    run = workspace_running(world, user=world.researcher_a, host="127.0.0.1", port=1)
    started = run.attempts.get().started_at
    workspace_extend(run=run, actor=world.researcher_a, hours=2)
    (held,) = held_runs(now=started)
    assert held.latest_end == started.timestamp() + 6 * 3600
    world.vision.workspace_max_hours = 10
    world.vision.save(update_fields=["workspace_max_hours"])
    run.refresh_from_db()
    assert _backend_time_limit_s(run, run.experiment) == 10 * 3600
    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    assert _backend_time_limit_s(batch, batch.experiment) == 24 * 3600
