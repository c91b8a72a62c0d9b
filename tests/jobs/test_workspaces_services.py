"""Workspaces' services and reads: Extend (bounds, who, audit), Stop, the scoped list, the
card's phase, steps and time left, and re-runs refused."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import PermissionDenied, ValidationError

from jobs.access import workspace_list_viewable
from jobs.models import Attempt, Run, RunEvent, RunState, Workspace
from jobs.selectors.workspaces import workspace_card_of, workspace_get_viewable
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import cluster_sync
from jobs.services.submission import run_rerun
from jobs.services.workspaces import (
    WorkspaceInput,
    workspace_extend,
    workspace_launch,
    workspace_stop,
)
from jobs.workspace_card import (
    Phase,
    WorkspaceTimes,
    duration_words,
    workspace_phase,
    workspace_steps,
    workspace_time_left,
)
from tenants.models import AuditEvent

pytestmark = pytest.mark.django_db

T0 = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)


def launch(world, user=None, **overrides) -> Run:
    values = {
        "tenant": "vision",
        "project": "detection",
        "image": world.image.reference,
        "flavor": "a100-80gb",
        "gpus": 1,
        "name": "debug-loader",
        "hours": 4,
    }
    values.update(overrides)
    return workspace_launch(user=user or world.researcher_a, data=WorkspaceInput(**values))


def running(world, run: Run) -> Run:
    admission_run_cycle()
    attempt = Attempt.objects.get(run=run)
    attempt_submit(attempt_id=attempt.pk)
    cluster_sync(cluster=world.cluster)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    return run


# --- Extend ----------------------------------------------------------------------------------


def test_the_owner_extends_within_the_tenant_maximum_audited_and_in_the_timeline(world):
    run = launch(world, hours=4)  # the tenant allows 12 h (the default)

    workspace = workspace_extend(run=run, actor=world.researcher_a, hours=3)

    assert workspace.extended_minutes == 180
    assert Workspace.objects.get(run=run).extended_minutes == 180
    event = AuditEvent.objects.get(action="workspace.extend")
    assert (event.actor, event.tenant, event.target, event.before, event.after) == (
        world.researcher_a,
        world.vision,
        f"run {run.pk}",
        {"extended_minutes": 0},
        {"extended_minutes": 180},
    )
    timeline = RunEvent.objects.get(run=run, reason="EXTENDED")
    assert (timeline.message, timeline.from_state, timeline.to_state, timeline.actor) == (
        "Extended by 3 h by alice: 7 h in all",
        RunState.QUEUED,
        RunState.QUEUED,
        world.researcher_a,
    )


def test_a_tenant_admin_extends_up_to_the_maximum_exactly_and_not_one_hour_more(world):
    run = launch(world, hours=4)
    workspace_extend(run=run, actor=world.tenant_admin_a, hours=8)  # 4 + 8 = 12: the maximum

    with pytest.raises(ValidationError) as refused:
        workspace_extend(run=run, actor=world.tenant_admin_a, hours=1)

    assert refused.value.message_dict == {
        "hours": [
            "Tenant vision allows a workspace at most 12 hours (extensions included): it has "
            "12 h already, it cannot be extended further."
        ]
    }
    assert Workspace.objects.get(run=run).extended_minutes == 480
    assert AuditEvent.objects.filter(action="workspace.extend").count() == 1


def test_past_the_maximum_says_how_much_is_left_and_changes_nothing(world):
    world.vision.workspace_max_hours = 8
    world.vision.save(update_fields=["workspace_max_hours"])
    run = launch(world, hours=3)

    with pytest.raises(ValidationError) as refused:
        workspace_extend(run=run, actor=world.researcher_a, hours=6)

    assert refused.value.message_dict == {
        "hours": [
            "Tenant vision allows a workspace at most 8 hours (extensions included): it has "
            "3 h already, it may get 5 more hours."
        ]
    }
    assert Workspace.objects.get(run=run).extended_minutes == 0
    assert not AuditEvent.objects.filter(action="workspace.extend").exists()
    assert not RunEvent.objects.filter(run=run, reason="EXTENDED").exists()


@pytest.mark.parametrize("hours", [0, -2, True, 1.5])
def test_extending_by_less_than_an_hour_or_not_a_whole_number_is_refused(world, hours):
    run = launch(world)
    with pytest.raises(ValidationError) as refused:
        workspace_extend(run=run, actor=world.researcher_a, hours=hours)
    assert refused.value.message_dict == {"hours": ["Extend by at least 1 hour."]}
    assert Workspace.objects.get(run=run).extended_minutes == 0


@pytest.mark.parametrize("persona", ["researcher_a2", "researcher_b", "finance", "platform_admin"])
def test_only_the_owner_or_a_tenant_admin_extends(world, persona):
    run = launch(world)
    with pytest.raises(PermissionDenied) as refused:
        workspace_extend(run=run, actor=getattr(world, persona), hours=1)
    assert str(refused.value) == (
        "Only the owner of the workspace or a tenant admin of vision can extend it."
    )
    assert Workspace.objects.get(run=run).extended_minutes == 0
    assert not AuditEvent.objects.filter(action="workspace.extend").exists()


def test_an_ended_workspace_is_not_extended(world):
    run = launch(world)
    workspace_stop(run=run, actor=world.researcher_a)
    with pytest.raises(ValidationError) as refused:
        workspace_extend(run=run, actor=world.researcher_a, hours=1)
    assert refused.value.message_dict == {"state": ["The workspace has ended: launch a new one."]}
    assert Workspace.objects.get(run=run).extended_minutes == 0


# --- Stop ------------------------------------------------------------------------------------


def test_stopping_a_queued_workspace_cancels_it_at_once_audited_as_a_cancel(world):
    run = launch(world)
    stopped = workspace_stop(run=run, actor=world.researcher_a)
    assert (stopped.state, stopped.failure_reason) == (RunState.CANCELLED, "CANCELLED")
    event = AuditEvent.objects.get(action="run.cancel")
    assert (event.target, event.after) == (
        f"run {run.pk}",
        {"state": "CANCELLED", "cancel_requested": True},
    )


def test_stopping_a_suspended_workspace_ends_it_at_once(world):
    run = launch(world)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUSPENDED)
    run.refresh_from_db()

    stopped = workspace_stop(run=run, actor=world.tenant_admin_a)

    stopped.refresh_from_db()
    assert (stopped.state, stopped.failure_reason) == (RunState.CANCELLED, "CANCELLED")
    event = RunEvent.objects.get(run=run, to_state=RunState.CANCELLED)
    assert (event.from_state, event.message) == (
        RunState.SUSPENDED,
        "Stopped by tara while suspended",
    )
    audit = AuditEvent.objects.get(action="run.cancel")
    assert (audit.actor, audit.before) == (
        world.tenant_admin_a,
        {"state": "SUSPENDED", "cancel_requested": False},
    )


def test_another_member_cannot_stop_a_suspended_workspace(world):
    run = launch(world)
    Run.objects.filter(pk=run.pk).update(state=RunState.SUSPENDED)
    run.refresh_from_db()
    with pytest.raises(PermissionDenied):
        workspace_stop(run=run, actor=world.researcher_a2)
    assert Run.objects.get(pk=run.pk).state == RunState.SUSPENDED
    assert not AuditEvent.objects.exists()


# --- who sees which ----------------------------------------------------------------------------


def test_the_list_is_mine_my_tenants_for_tenant_admins_and_all_for_platform_admins(world):
    alices = launch(world)
    others = launch(world, user=world.researcher_a2, name="a2-notebook")
    bobs = launch(world, user=world.researcher_b, tenant="nlp", project="llm")

    def seen(persona: str) -> set[int]:
        return set(
            workspace_list_viewable(user=getattr(world, persona)).values_list("pk", flat=True)
        )

    assert seen("researcher_a") == {alices.pk}
    assert seen("researcher_a2") == {others.pk}
    assert seen("researcher_b") == {bobs.pk}
    assert seen("tenant_admin_a") == {alices.pk, others.pk}
    assert seen("platform_admin") == {alices.pk, others.pk, bobs.pk}
    assert seen("finance") == set()
    with pytest.raises(Run.DoesNotExist):
        workspace_get_viewable(user=world.researcher_a2, run_id=alices.pk)


def test_a_batch_run_is_no_workspace(world):
    from jobs.services.submission import run_submit
    from tests.conftest import experiment_input

    batch = run_submit(user=world.researcher_a, data=experiment_input(world))
    with pytest.raises(Run.DoesNotExist):
        workspace_get_viewable(user=world.researcher_a, run_id=batch.pk)


def test_a_workspace_experiment_is_not_re_run(world):
    run = launch(world)
    with pytest.raises(ValidationError) as refused:
        run_rerun(experiment=run.experiment, user=world.researcher_a)
    assert refused.value.message_dict == {
        "kind": [
            f"Experiment {run.experiment_id} is a workspace's: launch a new workspace instead."
        ]
    }
    assert Run.objects.filter(experiment=run.experiment).count() == 1


# --- the card -----------------------------------------------------------------------------------


def times(**overrides) -> WorkspaceTimes:
    values = {
        "state": RunState.QUEUED,
        "submitted_at": T0,
        "admitted_at": None,
        "attempt_submitted_at": None,
        "attempt_started_at": None,
        "ready_at": None,
        "warned_at": None,
        "suspended_at": None,
        "finished_at": None,
        "started_at": None,
        "max_runtime_minutes": 240,
        "extended_minutes": 0,
    }
    values.update(overrides)
    return WorkspaceTimes(**values)


@pytest.mark.parametrize(
    ("overrides", "phase"),
    [
        ({}, Phase.QUEUED),
        ({"state": RunState.PREEMPTED}, Phase.QUEUED),
        ({"state": RunState.ADMITTED}, Phase.STARTING),
        ({"state": RunState.PENDING}, Phase.STARTING),
        ({"state": RunState.RUNNING}, Phase.STARTING),  # the job runs, its server not yet
        ({"state": RunState.RUNNING, "ready_at": T0}, Phase.RUNNING),
        ({"state": RunState.RUNNING, "ready_at": T0, "warned_at": T0}, Phase.IDLE_WARNING),
        ({"state": RunState.SUSPENDED, "suspended_at": T0}, Phase.SUSPENDED),
        ({"state": RunState.CANCELLED, "ready_at": T0}, Phase.ENDED),
        ({"state": RunState.FAILED}, Phase.ENDED),
    ],
)
def test_the_phase_of_each_state(overrides, phase):
    assert workspace_phase(times(**overrides)) == phase


def test_the_steps_with_their_times_and_the_idle_ones_only_once_they_happened():
    minute = timedelta(minutes=1)
    started = times(
        state=RunState.RUNNING,
        admitted_at=T0 + minute,
        attempt_submitted_at=T0 + 2 * minute,
        attempt_started_at=T0 + 3 * minute,
        ready_at=T0 + 4 * minute,
    )
    assert [(step.key, step.label, step.at) for step in workspace_steps(started)] == [
        ("queued", "Queued", T0),
        ("admitted", "Admitted", T0 + minute),
        ("submitted", "Submitted to the cluster", T0 + 2 * minute),
        ("job_running", "Job running", T0 + 3 * minute),
        ("server_ready", "Server ready", T0 + 4 * minute),
        ("ended", "Ended", None),
    ]
    idle = times(warned_at=T0 + 5 * minute, suspended_at=T0 + 6 * minute)
    assert [step.key for step in workspace_steps(idle)][-3:] == [
        "idle_warning",
        "suspended",
        "ended",
    ]


def test_time_left_is_start_plus_limit_plus_extensions_minus_now_never_below_zero():
    def left(now, extended=0):
        return workspace_time_left(
            started_at=T0, max_runtime_minutes=240, extended_minutes=extended, now=now
        )

    assert left(T0) == timedelta(hours=4)
    assert left(T0 + timedelta(hours=1, minutes=55)) == timedelta(hours=2, minutes=5)
    assert left(T0 + timedelta(hours=5), extended=120) == timedelta(hours=1)
    assert left(T0 + timedelta(hours=9)) == timedelta(0)
    assert (
        workspace_time_left(started_at=None, max_runtime_minutes=240, extended_minutes=0, now=T0)
        is None
    )
    assert duration_words(timedelta(hours=2, minutes=5, seconds=59)) == "2 h 05 min"
    assert duration_words(timedelta(minutes=45)) == "45 min"
    assert duration_words(timedelta(0)) == "0 min"


def test_the_card_of_a_running_workspace_opens_only_for_its_owner_once_its_server_answers(
    world, settings
):
    settings.GANTRY_WORKSPACE_URL = "https://ws.gantry.example.org"
    run = running(world, launch(world, hours=2))
    started = run.started_at
    with time_machine.travel(started + timedelta(minutes=30), tick=False):
        before_ready = workspace_card_of(user=world.researcher_a, run=run)
        attempt = Attempt.objects.get(run=run)
        Workspace.objects.filter(run=run).update(
            attempt=attempt, host="127.0.0.1", port=8888, ready_at=started
        )
        run = workspace_get_viewable(user=world.researcher_a, run_id=run.pk)
        owner = workspace_card_of(user=world.researcher_a, run=run)
        admin = workspace_card_of(
            user=world.tenant_admin_a,
            run=workspace_get_viewable(user=world.tenant_admin_a, run_id=run.pk),
        )

    assert (before_ready.phase, before_ready.url, before_ready.can_open) == (
        Phase.STARTING,
        "",
        True,
    )
    assert owner.phase == Phase.RUNNING
    assert owner.url == f"https://ws.gantry.example.org/w/{run.pk}/lab"
    assert (owner.time_left, owner.time_left_words) == (
        timedelta(hours=1, minutes=30),
        "1 h 30 min",
    )
    assert (owner.can_extend, owner.can_stop) == (True, True)
    assert (admin.url, admin.can_open, admin.can_extend, admin.can_stop) == ("", False, True, True)
