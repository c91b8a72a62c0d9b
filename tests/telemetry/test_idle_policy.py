"""Idle-GPU policy per tenant (issue 7): the idle streak, the policy page and service, and
its enforcement on running runs of the simulator cluster."""

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from jobs.models import Run, RunEvent, RunKind, RunState
from jobs.services.backend_sync import attempt_cancel
from jobs.services.lifecycle import run_cancel
from telemetry import tasks
from telemetry.accounting import IDLE_THRESHOLD
from telemetry.idle import IdleAction, IdleStreak, idle_action, idle_streak
from telemetry.models import GpuMinute
from telemetry.policy import IdlePolicySummary, idle_policy_enforce, idle_streaks
from tenants.models import AuditEvent, Notification, Tenant
from tenants.services.idle_policy import tenant_idle_policy_update
from tests.jobs.test_lifecycle import run_to_running, submit

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
LONG_JOB = {"GANTRY_SIM_DURATION_S": "100000", "GANTRY_SIM_CHECKPOINT_EVERY_S": "0"}
NOTHING = IdlePolicySummary(checked=1, warned=0, cleared=0, cancelled=0)


# --- the idle streak (pure) -------------------------------------------------------------


def per_minute(*activities) -> list[tuple[int, float | None]]:
    """One sample per minute 0, 1, 2, …; a tuple is several GPUs in the same minute."""
    return [
        (minute, value)
        for minute, values in enumerate(activities)
        for value in (values if isinstance(values, tuple) else (values,))
    ]


def test_streak_counts_idle_minutes_back_to_the_last_active_one():
    samples = per_minute(0.9, 0.01, 0.5, 0.0, 0.02, 0.049)

    assert idle_streak(samples) == IdleStreak(minutes=3, since=3, latest=5)


def test_a_minute_is_idle_only_when_every_gpu_that_reported_it_is_below_the_threshold():
    samples = per_minute((0.01, 0.01), (0.01, 0.06), (0.0, 0.01), (0.04, 0.03))

    assert idle_streak(samples) == IdleStreak(minutes=2, since=2, latest=3)


def test_activity_at_the_threshold_is_not_idle():
    assert idle_streak(per_minute(0.01, IDLE_THRESHOLD, 0.01)).minutes == 1
    assert idle_streak(per_minute(0.5, 0.3), threshold=0.4).minutes == 1


def test_a_minute_without_data_neither_counts_nor_breaks_the_streak():
    samples = [(0, 0.9), (1, 0.01), (5, 0.01), (6, None), (7, float("nan")), (9, 0.0)]

    assert idle_streak(samples) == IdleStreak(minutes=3, since=1, latest=9)


def test_no_data_is_no_streak_and_samples_may_come_in_any_order():
    assert idle_streak([]) == IdleStreak(minutes=0)
    assert idle_streak([(3, None)]) == IdleStreak(minutes=0)
    assert idle_streak([(4, 0.0), (2, 0.0), (3, 0.01), (1, 0.7)]) == IdleStreak(3, 2, 4)
    assert idle_streak([(1, 0.0), (2, 0.8)]) == IdleStreak(minutes=0, since=None, latest=2)


@pytest.mark.parametrize(
    ("streak", "notify", "cancel", "warned", "action"),
    [
        (0, None, None, False, IdleAction.NONE),
        (9, 10, 30, False, IdleAction.NONE),
        (10, 10, 30, False, IdleAction.WARN),
        (10, 10, 30, True, IdleAction.NONE),
        (29, 10, 30, True, IdleAction.NONE),
        (30, 10, 30, True, IdleAction.CANCEL),
        (30, 10, 30, False, IdleAction.CANCEL),
        (3, 10, 30, True, IdleAction.CLEAR),
        (0, 10, None, True, IdleAction.CLEAR),
        (500, 10, None, True, IdleAction.NONE),
        (29, None, 30, False, IdleAction.NONE),
        (30, None, 30, False, IdleAction.CANCEL),
        (5, None, 30, True, IdleAction.NONE),
    ],
)
def test_idle_action(streak, notify, cancel, warned, action):
    assert (
        idle_action(streak=streak, notify_after=notify, cancel_after=cancel, warned=warned)
        == action
    )


# --- enforcement on running runs ---------------------------------------------------------


def running(world, **overrides) -> Run:
    run = submit(world, env=LONG_JOB, **overrides)
    run_to_running(world, run)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING
    return run


def record(run: Run, *minutes, end: datetime = NOW) -> None:
    """GPU minutes of the run's attempt, the last one just before ``end``: each a tuple of
    the activities of GPUs 0, 1, … (None: no value)."""
    attempt = run.attempts.get()
    first = end - timedelta(minutes=len(minutes))
    GpuMinute.objects.bulk_create(
        GpuMinute(
            attempt=attempt,
            host="sim-1-a100-80gb-00",
            gpu=str(gpu),
            minute=first + timedelta(minutes=index),
            activity=activity,
            samples=0 if activity is None else 4,
        )
        for index, activities in enumerate(minutes)
        for gpu, activity in enumerate(activities)
    )


IDLE = (0.01, 0.0)
BUSY = (0.85, 0.9)


def policy(tenant: Tenant, *, notify: int | None, cancel: int | None) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(
        idle_notify_after_min=notify, idle_cancel_after_min=cancel
    )


def policy_events(run: Run) -> list[tuple[str, str, str]]:
    return list(
        RunEvent.objects.filter(
            run=run, reason__in=("IDLE_WARNING", "IDLE_CLEARED", "CANCEL_REQUESTED")
        )
        .order_by("id")
        .values_list("reason", "to_state", "message")
    )


def test_policy_off_by_default_leaves_idle_runs_alone(world):
    run = running(world)
    other = running(world, user=world.researcher_b, tenant="nlp", project="llm")
    record(run, *[IDLE] * 120)
    record(other, *[IDLE] * 120)
    policy(world.nlp, notify=10, cancel=30)  # only the other tenant has a policy
    events = RunEvent.objects.filter(run=run).count()

    summary = idle_policy_enforce(now=NOW)

    assert summary.checked == 1
    assert Tenant.objects.get(pk=world.vision.pk).idle_notify_after_min is None
    assert RunEvent.objects.filter(run=run).count() == events
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at) == (RunState.RUNNING, None)
    assert not Notification.objects.filter(user=world.researcher_a).exists()


def test_idle_run_is_warned_once_with_an_event_and_a_notification(world):
    policy(world.vision, notify=10, cancel=30)
    run = running(world)
    record(run, BUSY, *[IDLE] * 12)

    first = idle_policy_enforce(now=NOW)
    second = idle_policy_enforce(now=NOW)

    assert first == IdlePolicySummary(checked=1, warned=1, cleared=0, cancelled=0)
    assert second == NOTHING
    assert policy_events(run) == [
        (
            "IDLE_WARNING",
            "RUNNING",
            "Idle GPUs: 12 idle minutes (threshold 5 % activity). The idle-GPU policy of "
            "tenant vision warned alice; it cancels the run after 30 idle minutes.",
        )
    ]
    assert RunEvent.objects.get(run=run, reason="IDLE_WARNING").attempt == run.attempts.get()
    assert list(Notification.objects.values_list("user__username", "tenant__slug", "kind")) == [
        ("alice", "vision", "idle_warning")
    ]
    assert Notification.objects.get().message == (
        f"Run {run.pk} (resnet-baseline) has had idle GPUs for 12 minutes (below 5 % "
        "activity). The idle-GPU policy of tenant vision cancels it after 30 idle minutes; "
        "cancel it yourself if it is done."
    )
    assert Notification.objects.get().created_at == NOW
    run.refresh_from_db()
    assert (run.state, run.cancel_requested_at) == (RunState.RUNNING, None)


def test_warning_without_a_cancel_threshold_says_nothing_will_be_cancelled(world):
    policy(world.vision, notify=1, cancel=None)
    run = running(world)
    record(run, IDLE)

    idle_policy_enforce(now=NOW)

    assert policy_events(run)[0][2] == (
        "Idle GPUs: 1 idle minute (threshold 5 % activity). The idle-GPU policy of tenant "
        "vision warned alice."
    )
    assert Notification.objects.get().message == (
        f"Run {run.pk} (resnet-baseline) has had idle GPUs for 1 minute (below 5 % activity). "
        "Cancel it if it is done, so that others can use the GPUs."
    )


def test_one_gpu_at_6_percent_breaks_the_streak(world):
    policy(world.vision, notify=10, cancel=30)
    run = running(world)
    record(run, *[IDLE] * 6, (0.01, 0.06), *[IDLE] * 9)

    summary = idle_policy_enforce(now=NOW)

    assert summary == NOTHING
    assert idle_streaks(attempt_ids=[run.attempts.get().pk], now=NOW, limit=30) == {
        run.attempts.get().pk: IdleStreak(
            minutes=9, since=NOW - timedelta(minutes=9), latest=NOW - timedelta(minutes=1)
        )
    }
    assert policy_events(run) == []
    assert not Notification.objects.exists()


def test_minutes_without_values_and_minutes_after_now_do_not_count(world):
    policy(world.vision, notify=10, cancel=None)
    run = running(world)
    record(run, *[IDLE] * 9, (None, None), end=NOW)
    record(run, BUSY, end=NOW + timedelta(minutes=2))  # a clock ahead: not seen yet

    assert idle_policy_enforce(now=NOW) == NOTHING

    record(run, IDLE, end=NOW - timedelta(minutes=10))  # a late minute: now 10 idle minutes
    assert idle_policy_enforce(now=NOW).warned == 1


def test_active_again_clears_the_warning_and_a_new_streak_is_warned_again(world):
    policy(world.vision, notify=10, cancel=30)
    run = running(world)
    record(run, *[IDLE] * 10)
    assert idle_policy_enforce(now=NOW).warned == 1

    later = NOW + timedelta(minutes=1)
    record(run, BUSY, end=later)
    assert idle_policy_enforce(now=later) == IdlePolicySummary(
        checked=1, warned=0, cleared=1, cancelled=0
    )
    assert idle_policy_enforce(now=later) == NOTHING

    latest = later + timedelta(minutes=10)
    record(run, *[IDLE] * 10, end=latest)
    assert idle_policy_enforce(now=latest).warned == 1
    assert idle_policy_enforce(now=latest) == NOTHING

    warning = (
        "Idle GPUs: 10 idle minutes (threshold 5 % activity). The idle-GPU policy of tenant "
        "vision warned alice; it cancels the run after 30 idle minutes."
    )
    assert [(reason, message) for reason, _, message in policy_events(run)] == [
        ("IDLE_WARNING", warning),
        (
            "IDLE_CLEARED",
            "Idle warning cleared: 0 idle minutes now, below the warning threshold of 10 of "
            "the idle-GPU policy of tenant vision.",
        ),
        ("IDLE_WARNING", warning),
    ]
    assert Notification.objects.filter(kind="idle_warning").count() == 2


def test_run_idle_for_the_cancel_threshold_is_cancelled_once_through_the_backend(
    world, django_capture_on_commit_callbacks
):
    policy(world.vision, notify=10, cancel=30)
    run = running(world)
    busy = running(world, name="busy-run")
    record(run, *[IDLE] * 29)
    record(busy, *[BUSY] * 40)
    assert idle_policy_enforce(now=NOW).warned == 1

    later = NOW + timedelta(minutes=1)
    record(run, IDLE, end=later)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        summary = idle_policy_enforce(now=later)
        again = idle_policy_enforce(now=later)

    assert summary == IdlePolicySummary(checked=2, warned=0, cleared=0, cancelled=1)
    assert again == IdlePolicySummary(checked=1, warned=0, cleared=0, cancelled=0)
    assert len(callbacks) == 1  # one cancel sent to the backend
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.cancel_requested_at is not None
    cancel = RunEvent.objects.get(run=run, reason="CANCEL_REQUESTED")
    assert (cancel.actor, cancel.message) == (
        None,
        "Cancelled by the idle-GPU policy of tenant vision: 30 idle minutes (threshold 5 % "
        "activity)",
    )
    assert list(Notification.objects.order_by("id").values_list("kind", flat=True)) == [
        "idle_warning",
        "idle_cancelled",
    ]
    assert Notification.objects.get(kind="idle_cancelled").message == (
        f"Run {run.pk} (resnet-baseline) was cancelled by the idle-GPU policy of tenant "
        "vision: its GPUs were idle for 30 minutes (below 5 % activity)."
    )

    attempt_cancel(attempt_id=run.attempts.get().pk)  # what the task does
    run.refresh_from_db()
    busy.refresh_from_db()
    assert (run.state, run.failure_reason) == (RunState.CANCELLED, "CANCELLED")
    assert busy.state == RunState.RUNNING
    assert run.events.order_by("id").last().message == "Cancelled as requested"
    assert idle_policy_enforce(now=later).checked == 1
    assert RunEvent.objects.filter(run=run, reason="CANCEL_REQUESTED").count() == 1
    assert Notification.objects.count() == 2


def test_cancel_only_policy_cancels_at_the_threshold_without_a_warning(
    world, django_capture_on_commit_callbacks
):
    policy(world.vision, notify=None, cancel=30)
    run = running(world)
    record(run, *[IDLE] * 29)
    assert idle_policy_enforce(now=NOW) == NOTHING

    later = NOW + timedelta(minutes=1)
    record(run, IDLE, end=later)
    with django_capture_on_commit_callbacks(execute=False):
        assert idle_policy_enforce(now=later).cancelled == 1

    assert [reason for reason, _, _ in policy_events(run)] == ["CANCEL_REQUESTED"]
    assert list(Notification.objects.values_list("kind", flat=True)) == ["idle_cancelled"]


def test_nothing_to_do_costs_three_queries_however_many_runs(world, django_assert_num_queries):
    policy(world.vision, notify=10, cancel=30)
    runs = [running(world, name=f"run-{n}") for n in range(3)]
    for run in runs:
        record(run, BUSY, *[IDLE] * 5)

    with django_assert_num_queries(3):  # running attempts, their minutes, their warnings
        summary = idle_policy_enforce(now=NOW)

    assert summary == IdlePolicySummary(checked=3, warned=0, cleared=0, cancelled=0)


def test_the_task_calls_the_service(world, django_capture_on_commit_callbacks):
    policy(world.vision, notify=None, cancel=5)
    run = running(world)
    record(run, *[IDLE] * 5, end=datetime.now(tz=UTC).replace(second=0, microsecond=0))

    with django_capture_on_commit_callbacks(execute=False):
        tasks.idle_policy_enforce.apply()

    run.refresh_from_db()
    assert run.cancel_requested_at is not None


def test_gantry_cancels_without_an_actor_only_with_a_reason(world):
    run = submit(world)

    with pytest.raises(ValueError):
        run_cancel(run=run, actor=None)
    with pytest.raises(ValueError):
        run_cancel(run=run, actor=world.researcher_a, system_reason="because")
    run_cancel(run=run, actor=None, system_reason="Cancelled by a policy")

    run.refresh_from_db()
    event = RunEvent.objects.get(run=run, to_state="CANCELLED")
    assert (run.state, event.actor, event.message) == (
        RunState.CANCELLED,
        None,
        "Cancelled by a policy",
    )


# --- the policy service -----------------------------------------------------------------


def idle_values(tenant: Tenant) -> tuple:
    return Tenant.objects.filter(pk=tenant.pk).values_list(
        "idle_notify_after_min", "idle_cancel_after_min"
    )[0]


def test_tenant_admin_sets_the_policy_and_it_is_audited(world):
    tenant_idle_policy_update(
        tenant=world.vision,
        idle_notify_after_min=15,
        idle_cancel_after_min=60,
        actor=world.tenant_admin_a,
    )
    tenant_idle_policy_update(
        tenant=world.vision,
        idle_notify_after_min=15,
        idle_cancel_after_min=60,
        actor=world.platform_admin,
    )  # unchanged: no second audit row
    tenant_idle_policy_update(
        tenant=world.vision,
        idle_notify_after_min=15,
        idle_cancel_after_min=None,
        actor=world.platform_admin,
    )

    assert idle_values(world.vision) == (15, None)
    assert list(
        AuditEvent.objects.order_by("id").values_list(
            "actor__username", "tenant__slug", "action", "target", "before", "after"
        )
    ) == [
        (
            "tara",
            "vision",
            "tenant.idle_policy",
            "vision",
            {"idle_notify_after_min": None, "idle_cancel_after_min": None},
            {"idle_notify_after_min": 15, "idle_cancel_after_min": 60},
        ),
        (
            "paul",
            "vision",
            "tenant.idle_policy",
            "vision",
            {"idle_notify_after_min": 15, "idle_cancel_after_min": 60},
            {"idle_notify_after_min": 15, "idle_cancel_after_min": None},
        ),
    ]


RANGE = ["Between 1 and 10080 minutes (a week), or empty for off."]
NOT_A_NUMBER = ["Enter a whole number of minutes, or leave it empty for off."]
NOT_AFTER_30 = [
    "Cancel after more idle minutes than the warning (30), so the submitter is warned first."
]


@pytest.mark.parametrize(
    ("notify", "cancel", "errors"),
    [
        (0, None, {"idle_notify_after_min": RANGE}),
        (None, 10081, {"idle_cancel_after_min": RANGE}),
        (-5, 0, {"idle_notify_after_min": RANGE, "idle_cancel_after_min": RANGE}),
        (30, 30, {"idle_cancel_after_min": NOT_AFTER_30}),
        (30, 10, {"idle_cancel_after_min": NOT_AFTER_30}),
        ("10", None, {"idle_notify_after_min": NOT_A_NUMBER}),
        (True, None, {"idle_notify_after_min": NOT_A_NUMBER}),
    ],
)
def test_invalid_policy_names_the_field_and_changes_nothing(world, notify, cancel, errors):
    policy(world.vision, notify=5, cancel=20)

    with pytest.raises(ValidationError) as excinfo:
        tenant_idle_policy_update(
            tenant=world.vision,
            idle_notify_after_min=notify,
            idle_cancel_after_min=cancel,
            actor=world.tenant_admin_a,
        )

    assert excinfo.value.message_dict == errors
    assert idle_values(world.vision) == (5, 20)
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize("persona", ["researcher_a", "researcher_b", "finance"])
def test_only_tenant_and_platform_admins_may_change_the_policy(world, persona):
    with pytest.raises(PermissionDenied):
        tenant_idle_policy_update(
            tenant=world.vision,
            idle_notify_after_min=10,
            idle_cancel_after_min=None,
            actor=getattr(world, persona),
        )

    assert idle_values(world.vision) == (None, None)
    assert not AuditEvent.objects.exists()


def test_admin_of_another_tenant_may_not_change_the_policy(world):
    with pytest.raises(PermissionDenied):
        tenant_idle_policy_update(
            tenant=world.nlp,
            idle_notify_after_min=10,
            idle_cancel_after_min=None,
            actor=world.tenant_admin_a,
        )
    assert idle_values(world.nlp) == (None, None)


# --- the policy page --------------------------------------------------------------------


def policy_url(slug: str = "vision") -> str:
    return reverse("tenants:idle_policy", args=[slug])


@pytest.mark.parametrize(
    ("persona", "editable"),
    [
        ("researcher_a", False),
        ("researcher_a2", False),
        ("finance", False),
        ("tenant_admin_a", True),
        ("platform_admin", True),
    ],
)
def test_policy_page_shows_the_policy_and_the_form_only_to_admins(client, world, persona, editable):
    policy(world.vision, notify=10, cancel=None)
    client.force_login(getattr(world, persona))

    response = client.get(policy_url())

    content = response.content.decode()
    assert response.status_code == 200
    assert "<dt>Warn the submitter</dt><dd>after 10 idle minutes</dd>" in content
    assert "<dt>Cancel the run</dt><dd>off</dd>" in content
    assert f"below {IDLE_THRESHOLD * 100:g} % activity" in content
    assert ('name="idle_notify_after_min"' in content) is editable


def test_policy_page_is_404_for_outsiders_and_unknown_tenants(client, world):
    client.force_login(world.researcher_b)
    assert client.get(policy_url()).status_code == 404
    assert client.post(policy_url(), {"idle_notify_after_min": "5"}).status_code == 404
    client.force_login(world.platform_admin)
    assert client.get(policy_url("nope")).status_code == 404
    assert idle_values(world.vision) == (None, None)


def test_policy_page_needs_a_login(client, world):
    response = client.get(policy_url())
    assert (response.status_code, response.url) == (302, f"{reverse('login')}?next={policy_url()}")


@pytest.mark.parametrize("persona", ["researcher_a", "finance"])
def test_members_who_may_not_edit_get_403_and_nothing_changes(client, world, persona):
    client.force_login(getattr(world, persona))

    response = client.post(
        policy_url(), {"idle_notify_after_min": "5", "idle_cancel_after_min": "nonsense"}
    )

    assert response.status_code == 403
    assert idle_values(world.vision) == (None, None)
    assert not AuditEvent.objects.exists()


def test_tenant_admin_saves_the_policy_from_the_page(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(
        policy_url(), {"idle_notify_after_min": "20", "idle_cancel_after_min": "90"}
    )

    assert (response.status_code, response.url) == (302, policy_url())
    assert idle_values(world.vision) == (20, 90)
    assert AuditEvent.objects.get().action == "tenant.idle_policy"
    page = client.get(policy_url()).content.decode()
    assert "Saved the idle-GPU policy of vision." in page
    assert "<dt>Cancel the run</dt><dd>after 90 idle minutes</dd>" in page


def test_empty_fields_turn_the_policy_off(client, world):
    policy(world.vision, notify=20, cancel=90)
    client.force_login(world.platform_admin)

    response = client.post(policy_url(), {"idle_notify_after_min": "", "idle_cancel_after_min": ""})

    assert response.status_code == 302
    assert idle_values(world.vision) == (None, None)


def test_invalid_post_shows_the_error_next_to_the_field_and_changes_nothing(client, world):
    client.force_login(world.tenant_admin_a)

    response = client.post(
        policy_url(), {"idle_notify_after_min": "60", "idle_cancel_after_min": "30"}
    )

    content = response.content.decode()
    assert response.status_code == 400
    assert (
        "Cancel after more idle minutes than the warning (60), so the submitter is warned "
        "first." in content
    )
    assert idle_values(world.vision) == (None, None)
    assert not AuditEvent.objects.exists()


def test_the_quota_page_links_each_tenant_to_its_idle_policy(client, world):
    client.force_login(world.researcher_a)

    content = client.get(reverse("jobs:quota_list")).content.decode()

    assert f'<a href="{policy_url()}">Vision Lab</a>' in content
    assert policy_url("nlp") not in content


def test_a_workspace_is_left_to_the_workspace_policy(world, django_capture_on_commit_callbacks):
    policy(world.vision, notify=None, cancel=30)
    run = running(world)
    Run.objects.filter(pk=run.pk).update(kind=RunKind.INTERACTIVE)
    record(run, *[IDLE] * 30)
    assert idle_policy_enforce(now=NOW) == IdlePolicySummary(0, 0, 0, 0)
    Run.objects.filter(pk=run.pk).update(kind=RunKind.BATCH)
    with django_capture_on_commit_callbacks(execute=False):
        assert idle_policy_enforce(now=NOW).cancelled == 1
