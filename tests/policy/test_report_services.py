"""Asking for a what-if report, and every bad input of issue 38: a clear error and nothing
changed (no report, no audit entry, no quota), or a warning that needs confirming."""

from datetime import timedelta

import pytest
import time_machine
from django.core.exceptions import ValidationError

from policy import selectors
from policy.models import ReplayReport
from policy.services.reports import (
    replay_report_cancel,
    replay_report_create,
    replay_report_rerun,
    replay_report_share,
)
from tenants.models import AuditEvent, GpuFlavor, Quota
from tests.policy.support import NOW, T0, WINDOW, ask, submit

pytestmark = pytest.mark.django_db

VISION_24 = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24}]}
SWAP = {
    "quotas": [
        {"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24},
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ]
}


def state() -> tuple:
    """What a refused request must leave as it was."""
    return (
        list(ReplayReport.objects.values_list("pk", "status", "cancel_requested", "shared")),
        AuditEvent.objects.count(),
        sorted(Quota.objects.values_list("tenant__slug", "flavor__slug", "guaranteed_gpus")),
    )


@pytest.fixture
def queued_runs(world):
    """Two runs submitted in the window, never admitted: history enough to replay."""
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        submit(world, "vision", work_s=300)
        submit(world, "nlp", work_s=300)


def refused(world, proposal, **options) -> dict[str, list[str]]:
    before = state()
    with pytest.raises(ValidationError) as error:
        ask(world, proposal, **options)
    assert state() == before
    return error.value.message_dict


def test_a_report_is_stored_queued_with_who_when_what_and_an_audit_entry(world, queued_runs):
    report = ask(world, SWAP, share=True)

    assert (report.status, report.progress, report.requested_by, report.created_at) == (
        "queued",
        0.0,
        world.platform_admin,
        NOW,
    )
    assert (report.window_start, report.window_end, report.submissions) == (T0, T0 + WINDOW, 2)
    assert report.estimate_s == 2 * 2 / selectors.REPLAY_SUBMISSIONS_PER_S
    assert report.proposal["quotas"][0] == {
        "tenant": "nlp",
        "flavor": "a100-80gb",
        "guaranteed": 8,
        "borrow_limit": 0,
        "max_gpus_per_run": None,
        "budget_gpu_hours": None,
        "budget_hard": True,
        "weight": 1,
    }
    assert sorted(report.tenants.values_list("slug", flat=True)) == ["nlp", "vision"]
    assert report.shared is True
    event = AuditEvent.objects.get(action="replay.request")
    assert (event.actor, event.target, event.after["submissions"], event.after["estimate"]) == (
        world.platform_admin,
        f"replay {report.pk}",
        2,
        "1 s",
    )


def test_a_window_with_no_history_is_refused_and_nothing_is_stored(world):
    errors = refused(world, VISION_24)
    assert errors == {
        "window": [
            "No run was submitted or held GPUs from 2026-05-04 09:00 to 2026-05-04 09:20 UTC: "
            "there is no history to replay."
        ]
    }


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (T0, T0, "The window must end after it starts."),
        (T0, NOW + timedelta(minutes=1), "The window must be in the past: it ends after now."),
        (T0 - timedelta(days=93), T0, "A window of at most 92 days can be replayed."),
    ],
)
def test_a_window_that_cannot_be_replayed_is_refused(world, queued_runs, start, end, message):
    before = state()
    with time_machine.travel(NOW, tick=False), pytest.raises(ValidationError) as error:
        replay_report_create(
            actor=world.platform_admin, window_start=start, window_end=end, proposal=VISION_24
        )
    assert error.value.message_dict == {"window": [message]}
    assert state() == before


def test_a_negative_quota_is_refused(world, queued_runs):
    proposal = {"quotas": [{"tenant": "vision", "flavor": "a100-80gb", "guaranteed": -8}]}
    assert refused(world, proposal) == {
        "proposal": ["vision a100-80gb: the guarantee cannot be -8 GPUs (0 at least)."]
    }


def test_a_tenant_or_flavor_deleted_since_is_refused(world, queued_runs):
    GpuFlavor.objects.create(slug="v100-32gb", name="V100", memory_gb=32).delete()
    world.nlp.active = False
    world.nlp.save(update_fields=["active"])
    proposal = {
        "quotas": [
            {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
            {"tenant": "vision", "flavor": "v100-32gb", "guaranteed": 8},
        ],
        "nodes": [{"cluster": "sim-9", "flavor": "a100-80gb", "count": 1}],
    }
    assert refused(world, proposal) == {
        "proposal": [
            "There is no tenant nlp (deleted since?).",
            "There is no GPU flavor v100-32gb (deleted since?).",
            "There is no cluster sim-9 (deleted since?).",
        ]
    }


def test_more_nodes_removed_than_there_are_is_refused(world, queued_runs):
    proposal = {"nodes": [{"cluster": "sim-1", "flavor": "h100-80gb", "count": -3}]}
    assert refused(world, proposal) == {
        "proposal": ["sim-1 h100-80gb: cannot remove 3 nodes; it has 2."]
    }


def test_a_proposal_of_the_wrong_shape_is_refused(world, queued_runs):
    assert refused(world, {"quotas": [{"tenant": "vision"}]}) == {
        "proposal": ["quotas[0] needs flavor, guaranteed."]
    }


def test_an_overcommit_is_shown_and_needs_confirming(world, queued_runs):
    warning = (
        "The a100-80gb guarantees of all tenants add up to 40 GPUs, 8 more than the 32 the "
        "clusters would have: not all can be kept at once. Confirm to replay or apply it anyway."
    )
    assert refused(world, VISION_24) == {
        "confirm_warnings": [warning, "Nothing was replayed: confirm to go on."]
    }

    report = ask(world, VISION_24, confirm_warnings=True)

    assert report.confirmed_warnings == [warning]
    assert AuditEvent.objects.get(action="replay.request").after["confirmed_warnings"] == [warning]
    assert Quota.objects.get(tenant=world.vision, flavor=world.a100).guaranteed_gpus == 16


def test_removing_nodes_overcommits_the_guarantees_left(world, queued_runs):
    proposal = {"nodes": [{"cluster": "sim-1", "flavor": "h100-80gb", "count": -1}]}
    assert refused(world, proposal)["confirm_warnings"][0] == (
        "The h100-80gb guarantees of all tenants add up to 16 GPUs, 8 more than the 8 the "
        "clusters would have: not all can be kept at once. Confirm to replay or apply it anyway."
    )


def test_a_replay_estimated_too_long_is_refused_with_the_estimate(world, queued_runs, monkeypatch):
    # Two runs at 200 a second, twice: 0.02 s; the limit lowered below it.
    monkeypatch.setattr(selectors, "MAX_REPLAY_ESTIMATE_S", 0.01)
    assert refused(world, SWAP) == {
        "window": [
            "Replaying 2 runs would take about 1 s, longer than the 1 s a report may take: "
            "choose a shorter window."
        ]
    }


def test_the_estimate_follows_the_rate_of_the_reports_done_here(world, queued_runs):
    done = ask(world, SWAP)
    ReplayReport.objects.filter(pk=done.pk).update(
        status="done", started_at=NOW, finished_at=NOW + timedelta(seconds=4), submissions=400
    )
    # 400 runs replayed twice in 4 s: 200 a second. Another 2 runs: 2 * 2 / 200 s.
    assert ask(world, SWAP).estimate_s == 0.02
    ReplayReport.objects.filter(pk=done.pk).update(finished_at=NOW + timedelta(seconds=1))
    assert ask(world, SWAP).estimate_s == 0.005


def test_two_admins_asking_at_once_get_a_report_each(world, queued_runs):
    first = ask(world, SWAP)
    with time_machine.travel(NOW, tick=False):
        second = replay_report_create(
            actor=world.platform_admin,
            window_start=T0,
            window_end=T0 + WINDOW,
            proposal=SWAP,
        )
    assert (first.status, second.status) == ("queued", "queued")
    assert selectors.queued_ahead(report=second) == 1
    assert selectors.queued_ahead(report=first) == 0


def test_cancelling_a_queued_report_ends_it_at_once_and_an_ended_one_is_refused(world, queued_runs):
    report = ask(world, SWAP)
    with time_machine.travel(NOW + timedelta(seconds=5), tick=False):
        replay_report_cancel(report=report, actor=world.platform_admin)
    report.refresh_from_db()
    assert (report.status, report.cancel_requested, report.finished_at) == (
        "cancelled",
        True,
        NOW + timedelta(seconds=5),
    )
    before = state()
    with pytest.raises(ValidationError) as error:
        replay_report_cancel(report=report, actor=world.platform_admin)
    assert error.value.messages == [f"Report {report.pk} is cancelled: there is nothing to cancel."]
    assert state() == before
    assert AuditEvent.objects.filter(action="replay.cancel").count() == 1


def test_cancelling_a_running_report_flags_it_for_its_worker(world, queued_runs):
    report = ask(world, SWAP)
    ReplayReport.objects.filter(pk=report.pk).update(status="running", heartbeat_at=NOW)
    with time_machine.travel(NOW + timedelta(seconds=5), tick=False):
        replay_report_cancel(report=report, actor=world.platform_admin)
    report.refresh_from_db()
    assert (report.status, report.cancel_requested) == ("running", True)


def test_sharing_is_audited_once_per_change(world, queued_runs):
    report = ask(world, SWAP)
    replay_report_share(report=report, shared=True, actor=world.platform_admin)
    replay_report_share(report=report, shared=True, actor=world.platform_admin)
    replay_report_share(report=report, shared=False, actor=world.platform_admin)
    assert list(
        AuditEvent.objects.filter(action="replay.share")
        .order_by("id")
        .values_list("before", "after")
    ) == [({"shared": False}, {"shared": True}), ({"shared": True}, {"shared": False})]


def test_only_a_failed_cancelled_or_stopped_report_runs_again(world, queued_runs):
    report = ask(world, SWAP)
    before = state()
    with pytest.raises(ValidationError) as error:
        replay_report_rerun(report=report, actor=world.platform_admin)
    assert error.value.messages == [
        f"Report {report.pk} is queued: only a failed, cancelled or stopped report is run again."
    ]
    assert state() == before

    ReplayReport.objects.filter(pk=report.pk).update(
        status="running", heartbeat_at=NOW, progress=0.4
    )
    with time_machine.travel(NOW + selectors.STALE_AFTER + timedelta(seconds=1), tick=False):
        replay_report_rerun(report=report, actor=world.platform_admin)
    report.refresh_from_db()
    assert (report.status, report.progress, report.heartbeat_at) == ("queued", 0.0, None)
    assert AuditEvent.objects.get(action="replay.rerun").before == {
        "status": "running",
        "progress": 0.4,
    }
