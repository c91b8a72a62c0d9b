"""Two real ``celery beat`` processes on 127.0.0.1 and the real Redis (portal/beat.py): only
the leader sends, and when it is killed (-9) the other continues its schedule within 60 s.

What the beats sent is read from the broker itself: the test takes every message off the
queue as it arrives (no worker), with the beat that sent it (the message's ``origin``). The
lock's TTL and poll are the production defaults, so the takeover time measured is the one an
operator gets.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from django.conf import settings

from portal import task_queues
from tests.celery_support import ROOT, stop_process, wait_for

pytestmark = pytest.mark.integration

QUEUES = list(task_queues.QUEUES)  # every queue beat may send to
WINDOW_S = 6.0  # both beats up, the leader sending
AFTER_TAKEOVER_S = 4.0
# Entries sent every few seconds (GANTRY_ADMISSION_INTERVAL_S=1, the sync's default of 3 s)
# whose every gap is checked, and entries due only after the test (first runs one interval
# after the first leader started), which a takeover must not send at once.
FREQUENT_S = {"jobs.tasks.admission_cycle": 1.0, "jobs.tasks.sync_all_clusters": 3.0}
NOT_DUE_IN_THE_TEST = {
    "jobs.tasks.estimate_starts",
    "jobs.tasks.budget_alerts",
    "finance.tasks.daily_usage_update",
    "telemetry.tasks.idle_policy_enforce",
    "telemetry.tasks.straggler_scan",
    "telemetry.tasks.workspace_idle_scan",
}
ACCOUNTING = "telemetry.tasks.accounting_compute_pending"


@dataclass(frozen=True)
class Sent:
    at: float  # time.monotonic() when it reached the queue
    pid: int  # of the beat that sent it
    task: str


class QueueReader(threading.Thread):
    """Takes every message off the broker queue as it arrives, with when and from whom."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.sent: list[Sent] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            popped = self.client.brpop(QUEUES, timeout=0.2)
            if popped:
                headers = json.loads(popped[1])["headers"]
                pid = int(headers["origin"].removeprefix("gen").split("@")[0])
                self.sent.append(Sent(time.monotonic(), pid, headers["task"]))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=5)


def beat(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "a") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", "beat", "--loglevel", "INFO"],
            env=env, cwd=ROOT, start_new_session=True, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip


def gaps(times: list[float]) -> list[float]:
    return [round(later - earlier, 2) for earlier, later in pairwise(times)]


def test_two_beats_send_each_periodic_task_once_and_the_standby_takes_over(tmp_path):
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    # tests/settings.py names the lock after the data directory the two beats share.
    key = f"gantry-test:{tmp_path.resolve()}:beat"
    client.delete(*QUEUES, f"{key}:leader", f"{key}:last-run")
    # Accounting last ran 55 s ago: due 5 s from now, so the first leader sends it, once; a
    # takeover that forgot the last runs would send it again.
    client.hset(f"{key}:last-run", "attempt-accounting", repr(time.time() - 55))
    env = os.environ | {
        "GANTRY_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "GANTRY_ADMISSION_INTERVAL_S": "1",
        "GANTRY_SYNC_INTERVAL_S": "3",
    }
    reader = QueueReader(settings.CELERY_BROKER_URL)
    reader.start()
    logs = {name: tmp_path / f"beat-{name}.log" for name in ("a", "b")}
    processes = {name: beat(env, log) for name, log in logs.items()}
    try:
        leader, standby = wait_for(
            lambda: roles(logs), timeout=60, what="one beat leading, the other standing by"
        )
        time.sleep(WINDOW_S)
        killed_at = time.monotonic()
        processes[leader].send_signal(signal.SIGKILL)
        processes[leader].wait()
        standby_pid = processes[standby].pid
        wait_for(
            lambda: any(sent.pid == standby_pid for sent in reader.sent),
            timeout=90,
            what="the standby to send its first task",
        )
        time.sleep(AFTER_TAKEOVER_S)
        stop_process(processes[standby])
        released = client.get(f"{key}:leader") is None
    finally:
        reader.stop()
        for process in processes.values():
            stop_process(process)
        client.delete(*QUEUES, f"{key}:leader", f"{key}:last-run")
        client.close()

    sent = reader.sent
    leader_pid = processes[leader].pid
    assert {s.pid for s in sent} == {leader_pid, standby_pid}
    first_by_standby = min(s.at for s in sent if s.pid == standby_pid)
    takeover_s = first_by_standby - killed_at
    print(f"takeover after kill -9: {takeover_s:.1f} s", file=sys.stderr)
    # The standby waited for the lock to expire (the leader renewed it at most a third of the
    # TTL before the kill) and took it at its next poll.
    ttl, poll = settings.GANTRY_BEAT_LOCK_TTL_S, settings.GANTRY_BEAT_LOCK_POLL_S
    assert ttl * 2 / 3 - 1 <= takeover_s <= min(60, ttl + poll + 2), takeover_s
    assert all(s.at <= killed_at for s in sent if s.pid == leader_pid)

    by_task = defaultdict(list)
    for s in sent:
        by_task[s.task].append(s)
    for task, interval in FREQUENT_S.items():
        times = [s.at for s in by_task[task]]
        # Each slot once: no two sends closer than half the interval (a second beat would
        # send in the same slot), none further apart than one and a half, but the takeover.
        takeover_gap = [g for g in gaps(times) if g > interval * 1.5]
        assert all(interval * 0.5 <= g for g in gaps(times)), (task, gaps(times))
        assert len(takeover_gap) == 1 and takeover_gap[0] >= takeover_s - 0.5, (task, gaps(times))
        assert sum(s.pid == leader_pid for s in by_task[task]) >= WINDOW_S / interval - 1
        assert sum(s.pid == standby_pid for s in by_task[task]) >= AFTER_TAKEOVER_S / interval - 1
    assert [s.pid for s in by_task[ACCOUNTING]] == [leader_pid]
    assert {s.task for s in sent} & NOT_DUE_IN_THE_TEST == set()
    # Stopped cleanly, a leader releases the lock: the next beat leads at its next poll.
    assert released
    assert "released the leader lock" in logs[standby].read_text()


def roles(logs: dict[str, Path]) -> tuple[str, str] | None:
    """(leader, standby) once one beat's log says it leads and the other's that it waits."""
    text = {name: log.read_text() for name, log in logs.items()}
    for leader, standby in (("a", "b"), ("b", "a")):
        if "leads the schedule now" in text[leader] and "stands by" in text[standby]:
            return leader, standby
    return None
