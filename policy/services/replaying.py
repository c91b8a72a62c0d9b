"""Replaying a what-if report: what its Celery task calls (``policy.tasks``).

The task claims the report with a conditional UPDATE and a fresh token: a queued report, or
a running one whose worker was lost (silent for ``STALE_AFTER``). Only the holder of the
token writes progress and the result, so a redelivered task and the task it replaces never
both write. Reports are replayed one at a time, oldest first: a report whose turn has not
come is left queued, and the task asks again later (``Waiting``).

The replay runs outside any transaction: each progress write commits at once (at most one a
second), and reads the cancel flag in the same statement. A cancelled report ends
``cancelled`` with no result; a proposal the platform no longer allows (a tenant or flavor
deleted since it was asked for) ends ``failed`` with the reason; nothing else is changed.
"""

import logging
import time
import uuid
from dataclasses import dataclass
from enum import StrEnum

from django.db.models import Q
from django.utils import timezone

from jobs.replay import ReplayStopped, observed_outcome, replay
from jobs.replay_report import differences
from jobs.replay_types import Proposal
from jobs.selectors.replay_history import replay_history
from policy.models import ReplayReport
from policy.results import result_to_json
from policy.selectors import STALE_AFTER, report_running_other, report_stale
from tenants.models import Tenant

logger = logging.getLogger(__name__)

# Progress is written (and the cancel flag read) at most this often.
PROGRESS_EVERY_S = 1.0


class Replayed(StrEnum):
    """What a task's call came to."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # another report is being replayed, or this one: ask again later
    NOTHING = "nothing"  # ended, cancelled, or claimed by another task meanwhile


def _claim(report_id: int, now) -> uuid.UUID | None:
    token = uuid.uuid4()
    claimable = Q(status=ReplayReport.Status.QUEUED) | Q(
        status=ReplayReport.Status.RUNNING, heartbeat_at__lt=now - STALE_AFTER
    )
    claimed = ReplayReport.objects.filter(claimable, pk=report_id, cancel_requested=False).update(
        status=ReplayReport.Status.RUNNING,
        run_token=token,
        started_at=now,
        heartbeat_at=now,
        progress=0.0,
    )
    return token if claimed else None


def _end(report_id: int, token: uuid.UUID, **values) -> bool:
    """Write the end of the replay, if the report is still this task's."""
    return bool(
        ReplayReport.objects.filter(pk=report_id, run_token=token).update(
            finished_at=timezone.now(), run_token=None, **values
        )
    )


@dataclass
class _Heartbeat:
    """The replay's progress callback and stop question, in one conditional UPDATE a second
    at most: it writes the progress and the heartbeat, and finds the report cancelled (or no
    longer this task's) when no row matches."""

    report_id: int
    token: uuid.UUID
    share: tuple[float, float] = (0.0, 1.0)  # this replay's part of the report's progress
    fraction: float = 0.0
    written_at: float = float("-inf")
    stop: bool = False

    def progress(self, fraction: float) -> None:
        low, high = self.share
        self.fraction = low + (high - low) * min(1.0, max(0.0, fraction))
        self.beat()

    def should_stop(self) -> bool:
        self.beat()
        return self.stop

    def beat(self, *, force: bool = False) -> None:
        clock = time.monotonic()
        if not force and clock - self.written_at < PROGRESS_EVERY_S:
            return
        self.written_at = clock
        written = ReplayReport.objects.filter(
            pk=self.report_id, run_token=self.token, cancel_requested=False
        ).update(progress=self.fraction, heartbeat_at=timezone.now())
        self.stop = not written


def replay_report_run(*, report_id: int) -> Replayed:
    """Replay the report if it is its turn (see the module's docstring); idempotent: a
    report that has ended, or that a live worker replays, is left as it is."""
    now = timezone.now()
    report = ReplayReport.objects.filter(pk=report_id).first()
    if report is None or report.ended or report.cancel_requested:
        return Replayed.NOTHING
    if report_running_other(report=report, now=now) is not None or (
        report.status == ReplayReport.Status.RUNNING and not report_stale(report=report, now=now)
    ):
        # Another report goes first; or this one's worker is alive (this task is a
        # redelivery), or was lost a moment ago: asked again, it is claimed once stale.
        return Replayed.WAITING
    token = _claim(report_id, now)
    if token is None:
        return Replayed.NOTHING
    try:
        proposal = Proposal.from_json(report.proposal)
        history = replay_history(start=report.window_start, end=report.window_end)
        heartbeat = _Heartbeat(report_id, token, share=(0.0, 0.5))
        # The policy in force first: how closely the replay reproduces what happened.
        baseline = replay(
            history, None, progress=heartbeat.progress, should_stop=heartbeat.should_stop
        )
        heartbeat.share = (0.5, 1.0)
        proposed = replay(
            history, proposal, progress=heartbeat.progress, should_stop=heartbeat.should_stop
        )
    except ReplayStopped:
        cancelled = _end(
            report_id, token, status=ReplayReport.Status.CANCELLED, cancel_requested=True
        )
        return Replayed.CANCELLED if cancelled else Replayed.NOTHING
    except ValueError as exc:
        # The proposal names what no longer exists, or the window holds nothing now.
        _end(report_id, token, status=ReplayReport.Status.FAILED, error=str(exc))
        return Replayed.FAILED
    except Exception:
        logger.exception("what-if report %s: the replay failed", report_id)
        _end(
            report_id,
            token,
            status=ReplayReport.Status.FAILED,
            error="The replay failed on an unexpected error (logged on the worker); nothing "
            "was changed. Run it again, or report the problem.",
        )
        return Replayed.FAILED
    observed = observed_outcome(history)
    result = result_to_json(
        observed=observed, baseline=baseline, proposed=proposed, reasons=differences(history)
    )
    if not _end(report_id, token, status=ReplayReport.Status.DONE, progress=1.0, result=result):
        return Replayed.NOTHING
    with_rows = {t.tenant for t in observed.tenants} | {t.tenant for t in proposed.tenants}
    report.tenants.add(*Tenant.objects.filter(slug__in=with_rows))
    return Replayed.DONE
