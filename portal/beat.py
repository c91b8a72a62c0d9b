"""Celery beat's scheduler for Gantry (``CELERY_BEAT_SCHEDULER``): any number of beats may
run, and only the one holding the leader lock (``portal/beat_lock.py``) sends periodic tasks.

The others stand by and try to take the lock every ``GANTRY_BEAT_LOCK_POLL_S``; a killed
leader's Redis lock expires after ``GANTRY_BEAT_LOCK_TTL_S``, so a standby takes over within
TTL + poll (35 s by default; 0 to 5 s after a leader stopped cleanly, which releases it).

The schedule's last runs. Each beat's own schedule file would make a new leader either run
every task at once (an empty file) or wait on stale times (an old one). They are kept with
the lock instead, written under it before each task is sent: a beat that takes over loads
them and continues where the last leader stopped. A task that fell due during the gap is
sent once, at once; the others keep their cadence. An entry with no recorded run (a first
start, a new entry, Redis restarted without its data) first runs one interval after the
beat that leads starts leading, as Celery's own scheduler does at its start; that time is
recorded at once, so a later takeover does not postpone it again.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from django.conf import settings

from portal.beat_lock import Leadership, LockUnreachable, beat_lock, holder_name, lock_where

logger = logging.getLogger(__name__)


class LeaderScheduler(Scheduler):
    _leadership: Leadership | None = None

    def setup_schedule(self) -> None:
        # Not called for the lazy instances beat makes to describe itself: those take no lock.
        super().setup_schedule()
        lock = beat_lock(
            settings.GANTRY_BEAT_LOCK_URL,
            key_prefix=settings.GANTRY_BEAT_LOCK_KEY,
            ttl_s=settings.GANTRY_BEAT_LOCK_TTL_S,
        )
        self._leadership = Leadership(
            lock, ttl_s=settings.GANTRY_BEAT_LOCK_TTL_S, poll_s=settings.GANTRY_BEAT_LOCK_POLL_S
        )
        self._standing_by = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leadership = self._leadership
        assert leadership is not None, "a lazy scheduler does not tick"
        now = time.monotonic()
        change = leadership.check(now)
        if change == "acquired":
            self._take_over(now)
        elif change == "lost":
            self._stop_leading()
        if not leadership.leading:
            if not self._standing_by:
                self._standing_by = True
                logger.info(
                    # Not "another beat leads": with the lock's store unreachable nobody may.
                    "beat: %s stands by: it does not hold the leader lock (%s); trying every %s s",
                    holder_name(), leadership.lock.where, settings.GANTRY_BEAT_LOCK_POLL_S,
                )  # fmt: skip
            return leadership.seconds_to_next_check(now)
        interval: float = super().tick(*args, **kwargs)
        return min(interval, leadership.seconds_to_next_check(time.monotonic()))

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        # The run is recorded under the lock before the task is sent: the record is the last
        # proof that this beat still leads (a Redis lock taken meanwhile refuses it).
        leadership = self._leadership
        assert leadership is not None
        name = str(entry.name)
        ran_at = self.schedule[name].last_run_at
        assert ran_at is not None, "reserve() set it"
        if not leadership.lock.record_runs({name: ran_at.timestamp()}):
            leadership.lose(time.monotonic())
            self._stop_leading()
            return
        super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        super().close()
        if self._leadership is not None and self._leadership.leading:
            self._leadership.lock.release()
            self._leadership.leading = False
            logger.info("beat: %s released the leader lock", holder_name())

    def _take_over(self, now: float) -> None:
        leadership = self._leadership
        assert leadership is not None
        try:
            recorded = leadership.lock.last_runs()
        except LockUnreachable as exc:
            logger.warning("beat: could not read the schedule's last runs: %s", exc)
            leadership.lose(now)
            leadership.lock.release()
            return
        first_runs = {}
        for name, entry in self.schedule.items():
            if name in recorded:
                entry.last_run_at = datetime.fromtimestamp(recorded[name], tz=UTC)
            else:
                entry.last_run_at = entry.default_now()
                first_runs[name] = entry.last_run_at.timestamp()
        if first_runs and not leadership.lock.record_runs(first_runs):
            leadership.lose(now)
            return
        self._heap = None  # rebuilt from the times just loaded at the next tick
        self._standing_by = False
        logger.info(
            "beat: %s leads the schedule now (lock: %s; %d entries continue from recorded "
            "runs, %d start afresh)",
            holder_name(), leadership.lock.where, len(self.schedule) - len(first_runs),
            len(first_runs),
        )  # fmt: skip

    def _stop_leading(self) -> None:
        self._heap = None
        logger.warning(
            "beat: %s lost the leader lock; it sends nothing until it takes the lock again",
            holder_name(),
        )

    @property
    def info(self) -> str:
        where = lock_where(settings.GANTRY_BEAT_LOCK_URL)
        return f"    . leader lock -> {settings.GANTRY_BEAT_LOCK_KEY} on {where}"
