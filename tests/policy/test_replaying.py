"""Replaying a report (what its task calls): the result on a history recorded through the
product, one report at a time, redelivery and lost workers, and a proposal the platform no
longer allows by the time the report is replayed."""

from datetime import timedelta

import pytest
import time_machine

from policy.models import ReplayReport
from policy.selectors import STALE_AFTER
from policy.services.replaying import Replayed, replay_report_run
from tenants.models import AuditEvent, Quota
from tests.policy.support import NOW, T0, ask, record_history, submit

pytestmark = pytest.mark.django_db

SWAP = {
    "quotas": [
        {"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24},
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ]
}


def run(report: ReplayReport, *, at=NOW) -> Replayed:
    with time_machine.travel(at, tick=False):
        return replay_report_run(report_id=report.pk)


@pytest.fixture
def queued_runs(world):
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        submit(world, "vision", work_s=300)
        submit(world, "nlp", work_s=300)


def test_a_recorded_window_replayed_under_a_proposal_side_by_side(world):
    record_history(world)
    report = ask(world, SWAP)

    assert run(report) == Replayed.DONE

    report.refresh_from_db()
    assert (report.status, report.progress, report.started_at, report.finished_at) == (
        "done",
        1.0,
        NOW,
        NOW,
    )
    assert (report.run_token, report.error) == (None, "")
    observed, baseline, proposed = (report.result[k] for k in ("observed", "baseline", "proposed"))
    by_tenant = {
        side: {
            t["tenant"]: (
                t["queue_p50_s"],
                t["queue_p95_s"],
                round(t["gpu_hours"], 4),
                t["not_started"],
            )
            for t in outcome["tenants"]
        }
        for side, outcome in (
            ("observed", observed),
            ("baseline", baseline),
            ("proposed", proposed),
        )
    }
    # Each tenant's third run waited for one of its first two (1x8 GPUs of 16 guaranteed):
    # nlp's runs held 720 s, vision's 420 s. Under the proposal vision's 24 GPUs start its
    # three at once, and nlp's 8 run its three one after the other: the third never starts.
    assert by_tenant == {
        "observed": {"nlp": (0, 720.0, 4.2667, 0), "vision": (0, 420.0, 2.8, 0)},
        "baseline": {"nlp": (0.0, 720.0, 4.2667, 0), "vision": (0.0, 420.0, 2.8, 0)},
        "proposed": {"nlp": (720.0, 1200.0, 2.6667, 1), "vision": (0.0, 0.0, 2.8, 0)},
    }
    assert (observed["capacity_gpu_hours"], round(proposed["gpu_hours"], 4)) == (16.0, 5.4667)
    assert report.result["reasons"] == [
        "Nodes: the 6 nodes of the enabled clusters as they are now; the inventory keeps no "
        "history, so nodes added, removed or drained during the window are taken as they are "
        "now."
    ]
    assert sorted(report.tenants.values_list("slug", flat=True)) == ["nlp", "vision"]
    # Nothing of the platform changed: the quotas are as they were.
    assert sorted(Quota.objects.values_list("tenant__slug", "flavor__slug", "guaranteed_gpus")) == [
        ("nlp", "a100-80gb", 16),
        ("nlp", "h100-80gb", 8),
        ("vision", "a100-80gb", 16),
        ("vision", "h100-80gb", 8),
    ]


def test_a_redelivered_task_of_a_done_report_changes_nothing(world, queued_runs):
    report = ask(world, SWAP)
    assert run(report) == Replayed.DONE
    report.refresh_from_db()
    done = (report.status, report.result, report.finished_at)

    assert run(report, at=NOW + timedelta(minutes=5)) == Replayed.NOTHING
    report.refresh_from_db()
    assert (report.status, report.result, report.finished_at) == done


def test_reports_are_replayed_one_at_a_time_oldest_first(world, queued_runs):
    first, second = ask(world, SWAP), ask(world, SWAP)
    ReplayReport.objects.filter(pk=first.pk).update(status="running", heartbeat_at=NOW)

    assert run(second) == Replayed.WAITING
    second.refresh_from_db()
    assert (second.status, second.started_at) == ("queued", None)

    ReplayReport.objects.filter(pk=first.pk).update(status="done")
    assert run(second) == Replayed.DONE


def test_a_report_whose_worker_was_lost_is_claimed_again_once_silent(world, queued_runs):
    report = ask(world, SWAP)
    ReplayReport.objects.filter(pk=report.pk).update(
        status="running", heartbeat_at=NOW, progress=0.3
    )
    # Redelivered while its worker may still be replaying it: asked again later.
    assert run(report, at=NOW + timedelta(seconds=5)) == Replayed.WAITING
    assert ReplayReport.objects.get(pk=report.pk).progress == 0.3

    later = NOW + STALE_AFTER + timedelta(seconds=1)
    assert run(report, at=later) == Replayed.DONE
    report.refresh_from_db()
    assert (report.status, report.started_at, report.finished_at) == ("done", later, later)


def test_a_cancelled_report_is_not_replayed(world, queued_runs):
    report = ask(world, SWAP)
    ReplayReport.objects.filter(pk=report.pk).update(status="cancelled", cancel_requested=True)
    assert run(report) == Replayed.NOTHING
    assert ReplayReport.objects.get(pk=report.pk).result is None


def test_a_tenant_deactivated_before_the_replay_fails_it_with_the_reason(world, queued_runs):
    report = ask(world, SWAP)
    world.nlp.active = False
    world.nlp.save(update_fields=["active"])
    events = AuditEvent.objects.count()

    assert run(report) == Replayed.FAILED

    report.refresh_from_db()
    assert (report.status, report.error, report.result, report.run_token) == (
        "failed",
        "There is no tenant nlp (deleted since?).",
        None,
        None,
    )
    assert AuditEvent.objects.count() == events
