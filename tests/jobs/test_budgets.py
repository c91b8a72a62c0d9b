"""Budget alerts at 80 % and 100 % of a monthly GPU-hour budget, in-app and by e-mail,
and the notifications page."""

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.template.loader import render_to_string
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from jobs import tasks
from jobs.models import Attempt, BudgetAlert
from jobs.services import budgets
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.submission import run_submit
from jobs.services.usage import usage_record_attempt
from tenants.models import Notification, Quota
from tenants.selectors import notification_unread_count
from tests import REPOSITORY
from tests.conftest import experiment_input

ROOT = REPOSITORY
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
NEXT_MONTH = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
VISION_MEMBERS = ["alice", "arthur", "tara"]


def message_80(percent: int, hours: str, month: str = "November 2026") -> str:
    return (
        f"Tenant vision has used {percent} % of its 10 a100-80gb GPU-hour budget for {month} "
        f"({hours} GPU-hours). Hard budget: new runs will wait when it is spent."
    )


@pytest.fixture(autouse=True)
def locmem_mail(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "gantry@example.org"


@pytest.fixture
def budget(world):
    """vision: a hard budget of 10 a100 GPU-hours; its members have e-mail addresses."""
    Quota.objects.filter(tenant=world.vision, flavor=world.a100).update(
        monthly_gpu_hour_budget=10, budget_mode=Quota.BudgetMode.HARD
    )
    for user in (world.researcher_a, world.researcher_a2, world.tenant_admin_a):
        user.email = f"{user.username}@vision.example.org"
        user.save(update_fields=["email"])
    return world


def attempt_for(world, user=None, **overrides) -> Attempt:
    """An attempt made the way every attempt is: submitted, then admitted (2 GPUs)."""
    run = run_submit(user=user or world.researcher_a, data=experiment_input(world, **overrides))
    admission_run_cycle()
    return run.attempts.get()


def use(attempt: Attempt, gpu_hours: float, *, now: datetime = NOW) -> None:
    """Record ``gpu_hours`` of finished work of the attempt's run, ending an hour before now."""
    finished = now - timedelta(hours=1)
    started = finished - timedelta(hours=gpu_hours / attempt.run.gpus)
    usage_record_attempt(attempt=attempt, started=started, finished=finished)


def check(callbacks_fixture, now: datetime = NOW) -> int:
    with callbacks_fixture(execute=True):
        return budgets.budget_alerts_check(now=now)


def alerts() -> list[tuple]:
    return list(
        BudgetAlert.objects.order_by("month", "threshold").values_list(
            "tenant__slug", "flavor__slug", "month", "threshold", "budget_gpu_hours"
        )
    )


def notifications() -> list[tuple[str, str, str, str]]:
    return list(
        Notification.objects.order_by("id").values_list(
            "user__username", "tenant__slug", "kind", "message"
        )
    )


# --- the check --------------------------------------------------------------------------------


def test_below_80_percent_nothing_fires(budget, mailoutbox, django_capture_on_commit_callbacks):
    use(attempt_for(budget), 7.9)
    assert check(django_capture_on_commit_callbacks) == 0
    assert (alerts(), notifications(), mailoutbox) == ([], [], [])


def test_80_percent_notifies_every_member_once_in_app_and_by_mail(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    use(attempt_for(budget), 8.5)

    assert check(django_capture_on_commit_callbacks) == 1

    assert alerts() == [("vision", "a100-80gb", NOW.date().replace(day=1), 80, 10)]
    alert = BudgetAlert.objects.get()
    assert (alert.used_gpu_hours, alert.sent_at) == (pytest.approx(8.5), NOW)
    message = message_80(85, "8.5")
    assert notifications() == [(name, "vision", "budget_80", message) for name in VISION_MEMBERS]
    assert set(Notification.objects.values_list("created_at", "read_at")) == {(NOW, None)}
    assert [(m.subject, m.to, m.from_email) for m in mailoutbox] == [
        (
            "[Gantry] vision has used 85 % of its a100-80gb budget for November 2026",
            [f"{name}@vision.example.org"],
            "gantry@example.org",
        )
        for name in VISION_MEMBERS
    ]
    assert mailoutbox[0].body == (
        f"{message}\n\nYou receive this as a member of tenant vision (Vision Lab). "
        "The portal lists it under Notifications: http://127.0.0.1:8000/notifications/\n"
    )

    assert check(django_capture_on_commit_callbacks) == 0
    assert (BudgetAlert.objects.count(), Notification.objects.count(), len(mailoutbox)) == (1, 3, 3)


def test_100_percent_fires_the_spent_alert_after_the_80_percent_one(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    attempt = attempt_for(budget)
    use(attempt, 8.5)
    assert check(django_capture_on_commit_callbacks) == 1
    use(attempt, 1.5, now=NOW - timedelta(hours=5))

    assert check(django_capture_on_commit_callbacks) == 1

    month = NOW.date().replace(day=1)
    assert [(a[2], a[3]) for a in alerts()] == [(month, 80), (month, 100)]
    spent = list(Notification.objects.filter(kind="budget_100").values_list("user__username"))
    assert spent == [(name,) for name in reversed(VISION_MEMBERS)]  # newest first
    assert Notification.objects.filter(kind="budget_100").first().message == (
        "Tenant vision has used 100 % of its 10 a100-80gb GPU-hour budget for November 2026 "
        "(10.0 GPU-hours). Hard budget: new runs wait until the budget is raised or the month "
        "ends."
    )
    assert [m.subject for m in mailoutbox[3:]] == [
        "[Gantry] vision has spent its a100-80gb GPU-hour budget for November 2026"
    ] * 3
    assert check(django_capture_on_commit_callbacks) == 0
    assert len(mailoutbox) == 6


def test_usage_that_jumps_past_100_percent_gets_only_the_spent_alert(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    attempt = attempt_for(budget)
    use(attempt, 12)
    assert check(django_capture_on_commit_callbacks) == 1
    assert [a[3] for a in alerts()] == [100]
    assert {kind for _, _, kind, _ in notifications()} == {"budget_100"}
    assert "has used 120 % of its 10 a100-80gb" in Notification.objects.first().message
    assert check(django_capture_on_commit_callbacks) == 0
    assert len(mailoutbox) == 3


def test_soft_budget_says_runs_still_start(budget, mailoutbox, django_capture_on_commit_callbacks):
    Quota.objects.filter(tenant=budget.vision, flavor=budget.a100).update(
        budget_mode=Quota.BudgetMode.SOFT
    )
    attempt = attempt_for(budget)
    use(attempt, 8)
    check(django_capture_on_commit_callbacks)
    use(attempt, 2, now=NOW - timedelta(hours=5))
    check(django_capture_on_commit_callbacks)
    assert list(Notification.objects.filter(user=budget.researcher_a).values_list("message")) == [
        (
            "Tenant vision has used 100 % of its 10 a100-80gb GPU-hour budget for November 2026 "
            "(10.0 GPU-hours). Soft budget: new runs still start, flagged as over budget.",
        ),
        (
            "Tenant vision has used 80 % of its 10 a100-80gb GPU-hour budget for November 2026 "
            "(8.0 GPU-hours). Soft budget: runs will still start when it is spent, flagged as "
            "over budget.",
        ),
    ]


def test_running_attempts_count_prorated(budget, mailoutbox, django_capture_on_commit_callbacks):
    attempt = attempt_for(budget)
    # 2 GPUs running for the last 4.5 hours: 9 GPU-hours, nothing finished yet.
    Attempt.objects.filter(pk=attempt.pk).update(
        state="RUNNING", started_at=NOW - timedelta(hours=4.5)
    )
    assert check(django_capture_on_commit_callbacks) == 1
    assert Notification.objects.first().message == message_80(90, "9.0")


def test_a_new_month_fires_again(budget, mailoutbox, django_capture_on_commit_callbacks):
    attempt = attempt_for(budget)
    use(attempt, 8.5)
    assert check(django_capture_on_commit_callbacks) == 1

    assert check(django_capture_on_commit_callbacks, now=NEXT_MONTH) == 0  # December: unused
    use(attempt, 8.2, now=NEXT_MONTH)
    assert check(django_capture_on_commit_callbacks, now=NEXT_MONTH) == 1

    assert [(a[2], a[3]) for a in alerts()] == [
        (NOW.date().replace(day=1), 80),
        (NEXT_MONTH.date().replace(day=1), 80),
    ]
    assert Notification.objects.filter(user=budget.researcher_a).first().message == message_80(
        82, "8.2", month="December 2026"
    )
    assert len(mailoutbox) == 6


def test_tenants_without_a_budget_are_never_alerted(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    # nlp has no budget at all; vision's h100 budget is 0 (admission explains that itself).
    nlp = attempt_for(budget, user=budget.researcher_b, tenant="nlp", project="llm")
    use(nlp, 500)
    use(attempt_for(budget, flavor="h100-80gb"), 3)
    Quota.objects.filter(tenant=budget.vision, flavor=budget.h100).update(monthly_gpu_hour_budget=0)
    assert check(django_capture_on_commit_callbacks) == 0
    assert (alerts(), notifications(), mailoutbox) == ([], [], [])


def test_members_without_mail_or_inactive_are_handled(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    budget.researcher_a2.email = ""
    budget.researcher_a2.save(update_fields=["email"])
    budget.tenant_admin_a.is_active = False
    budget.tenant_admin_a.save(update_fields=["is_active"])
    use(attempt_for(budget), 9)
    assert check(django_capture_on_commit_callbacks) == 1
    assert [name for name, *_ in notifications()] == ["alice", "arthur"]
    assert [m.to for m in mailoutbox] == [["alice@vision.example.org"]]


def test_a_rolled_back_check_records_and_sends_nothing(
    budget, mailoutbox, django_capture_on_commit_callbacks
):
    use(attempt_for(budget), 9)
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        assert budgets.budget_alerts_check(now=NOW) == 1
        raise RuntimeError("the worker died")
    assert (callbacks, alerts(), notifications(), mailoutbox) == ([], [], [], [])


def test_the_thresholds():
    crossed = [
        budgets.budget_crossed(used_gpu_hours=hours, budget_gpu_hours=10)
        for hours in (0, 7.99, 8, 9.99, 10, 25)
    ]
    assert crossed == [None, None, 80, 80, 100, 100]
    # 0.1 + 0.7 is 0.7999999999999999 in binary floating point: still 80 % of 1.
    assert budgets.budget_crossed(used_gpu_hours=0.1 + 0.7, budget_gpu_hours=1) == 80


@pytest.mark.django_db(transaction=True)
def test_two_checks_racing_notify_once(budget, mailoutbox, monkeypatch):
    use(attempt_for(budget), 9)
    # Both checks have read "nothing notified yet" before either inserts its alert.
    both_have_read = threading.Barrier(2, timeout=10)
    members_by_tenant = budgets._members_by_tenant

    def after_the_reads(**kwargs):
        both_have_read.wait()
        return members_by_tenant(**kwargs)

    monkeypatch.setattr(budgets, "_members_by_tenant", after_the_reads)
    fired, errors = [], []

    def worker():
        try:
            fired.append(budgets.budget_alerts_check(now=NOW))
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert sorted(fired) == [0, 1]
    assert (BudgetAlert.objects.count(), Notification.objects.count(), len(mailoutbox)) == (1, 3, 3)


# --- the task and its schedule ------------------------------------------------------------------


def test_the_task_checks_now_and_beat_runs_it_every_minute(budget, mailoutbox):
    use(attempt_for(budget), 8.5)
    with time_machine.travel(NOW, tick=False):
        tasks.budget_alerts()
    assert [a[3] for a in alerts()] == [80]
    assert django_settings.CELERY_BEAT_SCHEDULE["budget-alerts"] == {
        "task": "jobs.tasks.budget_alerts",
        "schedule": 60.0,
    }


# --- mail settings --------------------------------------------------------------------------------

MAIL_SUMMARY = (
    "import json\n"
    "from django.conf import settings as s\n"
    "print(json.dumps([s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.DEFAULT_FROM_EMAIL,\n"
    "  s.EMAIL_TIMEOUT, s.CELERY_BEAT_SCHEDULE['budget-alerts']['schedule']]))\n"
)


def load_mail_settings(tmp_path, **env: str) -> subprocess.CompletedProcess:
    clean = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "GANTRY_DATA_DIR": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-c", MAIL_SUMMARY],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_embedded_mode_prints_mail_to_the_console(tmp_path):
    result = load_mail_settings(tmp_path, GANTRY_EMBEDDED="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        "django.core.mail.backends.console.EmailBackend",
        "localhost",
        25,
        "gantry@localhost",
        10,
        60.0,
    ]


def test_production_mode_sends_mail_through_the_configured_relay(tmp_path):
    result = load_mail_settings(
        tmp_path,
        GANTRY_EMBEDDED="0",
        DJANGO_SECRET_KEY="a-real-secret-from-the-environment",
        GANTRY_EMAIL_HOST="mail.internal",
        GANTRY_EMAIL_PORT="2525",
        GANTRY_EMAIL_FROM="gantry@example.org",
        GANTRY_BUDGET_CHECK_INTERVAL_S="300",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [
        "django.core.mail.backends.smtp.EmailBackend",
        "mail.internal",
        2525,
        "gantry@example.org",
        10,
        300.0,
    ]


@pytest.mark.parametrize(
    ("variable", "value", "error"),
    [
        ("GANTRY_EMAIL_BACKEND", "sendmail", "GANTRY_EMAIL_BACKEND must be one of smtp, console"),
        ("GANTRY_EMAIL_PORT", "smtp", "GANTRY_EMAIL_PORT must be an integer"),
        ("GANTRY_BUDGET_CHECK_INTERVAL_S", "1m", "GANTRY_BUDGET_CHECK_INTERVAL_S must be an"),
    ],
)
def test_malformed_mail_settings_stop_start_up(tmp_path, variable, value, error):
    result = load_mail_settings(tmp_path, GANTRY_EMBEDDED="1", **{variable: value})
    assert result.returncode != 0
    assert error in result.stderr


# --- the notifications page -----------------------------------------------------------------------


def notify(user, message: str, *, tenant=None, minutes_ago: int = 0, read: bool = False):
    at = timezone.now() - timedelta(minutes=minutes_ago)
    return Notification.objects.create(
        user=user,
        tenant=tenant,
        kind=Notification.Kind.BUDGET_80,
        message=message,
        created_at=at,
        read_at=at if read else None,
    )


def test_the_page_lists_only_the_users_own_notifications(world, client):
    notify(
        world.researcher_a, "alice: older and read", tenant=world.vision, minutes_ago=9, read=True
    )
    notify(world.researcher_a, "alice: newest", tenant=world.vision, minutes_ago=1)
    notify(world.tenant_admin_a, "tara: same tenant, other user", tenant=world.vision)
    notify(world.researcher_b, "bob: other tenant", tenant=world.nlp)
    client.force_login(world.researcher_a)

    response = client.get(reverse("notifications:list"))

    assert response.status_code == 200
    assert [n.message for n in response.context["notifications"]] == [
        "alice: newest",
        "alice: older and read",
    ]
    content = response.content.decode()
    assert "tara:" not in content and "bob:" not in content
    assert content.count("data-unread") == 1
    assert "Mark all 1 as read" in content


def test_the_page_needs_a_login(world, client):
    notify(world.researcher_a, "alice: hidden")
    response = client.get(reverse("notifications:list"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    response = client.post(reverse("notifications:read_all"))
    assert response.status_code == 302
    assert Notification.objects.get().read_at is None


def test_an_empty_page_explains_what_will_appear(world, client):
    client.force_login(world.researcher_b)
    response = client.get(reverse("notifications:list"))
    content = response.content.decode()
    assert "No notifications" in content
    assert "Mark all" not in content


def test_the_page_is_paginated_with_a_fixed_number_of_queries(
    world, client, django_assert_max_num_queries
):
    for number in range(30):
        notify(world.researcher_a, f"alice #{number}", tenant=world.vision, minutes_ago=number)
    client.force_login(world.researcher_a)
    # Session, user, roles (2), page count, page, unread count; the nav badge adds one more.
    with django_assert_max_num_queries(8):
        first = client.get(reverse("notifications:list"))
    second = client.get(reverse("notifications:list"), {"page": 2})
    assert len(first.context["notifications"]) == 25
    assert [n.message for n in second.context["notifications"]] == [
        f"alice #{number}" for number in range(25, 30)
    ]
    assert "Page 2 of 2 · 30 notifications" in second.content.decode()


def test_mark_all_read_changes_only_the_users_own(world, client):
    mine = [notify(world.researcher_a, f"alice #{n}") for n in range(2)]
    theirs = notify(world.researcher_b, "bob")
    client.force_login(world.researcher_a)

    response = client.post(reverse("notifications:read_all"), follow=True)

    assert response.redirect_chain == [(reverse("notifications:list"), 302)]
    assert "Marked 2 notifications as read." in response.content.decode()
    assert all(Notification.objects.get(pk=n.pk).read_at is not None for n in mine)
    assert Notification.objects.get(pk=theirs.pk).read_at is None
    assert notification_unread_count(user=world.researcher_a) == 0
    assert notification_unread_count(user=world.researcher_b) == 1


def test_mark_all_read_requires_post_and_csrf(world):
    notify(world.researcher_a, "alice")
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.researcher_a)

    assert client.get(reverse("notifications:read_all")).status_code == 405
    assert client.post(reverse("notifications:read_all")).status_code == 403
    assert Notification.objects.get().read_at is None

    page = client.get(reverse("notifications:list"))
    token = page.context["csrf_token"]
    response = client.post(reverse("notifications:read_all"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert Notification.objects.get().read_at is not None


def test_the_nav_badge_shows_the_unread_count(world):
    notify(world.researcher_a, "unread 1")
    notify(world.researcher_a, "unread 2")
    notify(world.researcher_a, "read", read=True)
    notify(world.researcher_b, "bob's")
    request = RequestFactory().get("/")
    count = notification_unread_count(user=world.researcher_a)
    badge = render_to_string(
        "_notifications_badge.html", {"nav_unread_notifications": count}, request=request
    )
    assert count == 2
    assert '<span class="badge badge-queued" aria-label="2 unread">2</span>' in badge
    assert 'href="/notifications/"' in badge
    quiet = render_to_string(
        "_notifications_badge.html", {"nav_unread_notifications": 0}, request=request
    )
    assert "badge" not in quiet and ">Notifications</a>" in quiet
