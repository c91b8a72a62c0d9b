"""Background work yields the CPU to requests (issue 39, point 4): a real Celery worker, its
pool processes and beat run at GANTRY_WORKER_NICE, set by themselves at start."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.process_priority import niceness_of
from tests.celery_support import celery_env, start_worker_and_beat, stop_process, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def children_of(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


@pytest.mark.django_db(transaction=True)
def test_the_worker_its_pool_and_beat_run_at_the_niceness_set(tmp_path):
    own = os.getpriority(os.PRIO_PROCESS, 0)
    expected = max(own, 7)  # a niceness can only go up without privileges
    log_path = tmp_path / "celery.log"
    with log_path.open("w") as log:
        worker, beat = start_worker_and_beat(
            celery_env(tmp_path, GANTRY_WORKER_NICE="7"), log, concurrency=2
        )
    try:
        # Given a worker that says it is ready, with both pool processes, and beat ticking
        wait_for(lambda: " ready." in log_path.read_text(), timeout=90, what="worker ready")
        pool = wait_for(
            lambda: children_of(worker.pid) if len(children_of(worker.pid)) == 2 else None,
            timeout=30,
            what="two pool processes",
        )
        wait_for(
            lambda: "beat: Starting..." in log_path.read_text(), timeout=60, what="beat started"
        )

        # Then every one of them runs at the niceness set, and this test process at its own
        nicenesses = [niceness_of(pid) for pid in (worker.pid, *pool)]
        assert nicenesses == [expected, expected, expected]
        assert wait_for(lambda: niceness_of(beat.pid) == expected, timeout=10, what="beat nice")
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    finally:
        for process in (beat, worker):
            stop_process(process)


PRIORITY_OF_THREADS = """
import os, sys, threading
from portal.process_priority import lower_own_priority

started = threading.Event()
stop = threading.Event()

def earlier():
    started.set()
    stop.wait()
    print(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

thread = threading.Thread(target=earlier)
thread.start()
started.wait()
lower_own_priority(int(sys.argv[1]))
stop.set()
thread.join()
print(os.getpriority(os.PRIO_PROCESS, 0))
"""


@pytest.mark.parametrize(("setting", "raised_to"), [("12", 12), ("0", None)])
def test_lowering_reaches_the_threads_already_running_and_zero_leaves_it(setting, raised_to):
    own = os.getpriority(os.PRIO_PROCESS, 0)
    expected = own if raised_to is None else max(own, raised_to)

    result = subprocess.run(
        [sys.executable, "-c", PRIORITY_OF_THREADS, setting],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )

    # an earlier thread, then the main thread
    assert result.stdout.split() == [str(expected), str(expected)]


def test_niceness_of_reads_this_process():
    assert niceness_of(os.getpid()) == os.getpriority(os.PRIO_PROCESS, 0)
