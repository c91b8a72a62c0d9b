"""A what-if report replayed by a real Celery worker (on Redis, against the test's
PostgreSQL): queued by the service on commit, claimed, its progress written as it goes,
done with its result; a long one cancelled while it runs; a report asked for meanwhile
waiting its turn."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from policy.models import ReplayReport
from policy.selectors import window_runs
from policy.services.reports import replay_report_cancel, replay_report_create
from portal.celery import app as celery_app
from tests.celery_support import celery_env, start_worker, stop_process, wait_for
from tests.policy.support import WINDOW, long_queue, record_history

pytestmark = pytest.mark.integration

SWAP = {
    "quotas": [
        {"tenant": "vision", "flavor": "a100-80gb", "guaranteed": 24},
        {"tenant": "nlp", "flavor": "a100-80gb", "guaranteed": 8},
    ]
}


def test_a_worker_replays_reports_one_at_a_time_and_stops_a_cancelled_one(
    transactional_db, world, tmp_path
):
    now = timezone.now().replace(second=0, microsecond=0)
    small, big = now - timedelta(days=3), now - timedelta(days=2)
    record_history(world, start=small)
    long_queue(world, start=big, count=4000)
    long_window = {"start": big, "end": big + timedelta(hours=2)}
    assert window_runs(**long_window) == (4000, ("vision",))
    celery_app.control.purge()  # the admission cycles the submits asked for
    with (tmp_path / "celery.log").open("w") as log:
        worker = start_worker(celery_env(tmp_path), log)
        try:
            ask = {"actor": world.platform_admin, "proposal": SWAP}
            done = replay_report_create(window_start=small, window_end=small + WINDOW, **ask)
            wait_for(
                lambda: ReplayReport.objects.get(pk=done.pk).status == "done",
                timeout=60,
                what="the small report to be replayed",
            )
            done.refresh_from_db()
            [nlp] = [t for t in done.result["proposed"]["tenants"] if t["tenant"] == "nlp"]
            assert (done.progress, nlp["queue_p95_s"], nlp["not_started"]) == (1.0, 1200.0, 1)
            # The worker replayed and changed no run (a CI run once found this window empty).
            assert window_runs(**long_window) == (4000, ("vision",))

            long = replay_report_create(
                window_start=big, window_end=big + timedelta(hours=2), **ask
            )
            running = wait_for(
                lambda: ReplayReport.objects.filter(pk=long.pk, progress__gt=0).first(),
                timeout=60,
                what="the long report to make progress",
            )
            assert (running.status, running.run_token is not None) == ("running", True)
            waiting = replay_report_create(window_start=small, window_end=small + WINDOW, **ask)
            time.sleep(2)  # its task has run by now, and found the long report going first
            assert ReplayReport.objects.get(pk=waiting.pk).status == "queued"

            replay_report_cancel(report=long, actor=world.platform_admin)
            asked = time.monotonic()
            wait_for(
                lambda: ReplayReport.objects.get(pk=long.pk).status == "cancelled",
                timeout=15,
                what="the worker to stop the cancelled report",
            )
            stopped_within_s = time.monotonic() - asked
            long.refresh_from_db()
            assert (long.result, long.run_token, long.cancel_requested) == (None, None, True)
            assert 0 < long.progress < 1
            assert stopped_within_s < 5

            wait_for(
                lambda: ReplayReport.objects.get(pk=waiting.pk).status == "done",
                timeout=60,
                what="the waiting report's turn",
            )
        finally:
            stop_process(worker)
    assert worker.returncode is not None
