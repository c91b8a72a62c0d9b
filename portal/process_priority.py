"""Background work yields the CPU to requests: Celery's worker and beat lower their own CPU
priority at start (``GANTRY_WORKER_NICE``, portal/celery.py), so that on a machine they share
with gunicorn an admission cycle or a burst of syncs waits for the requests in flight instead
of taking the cores from them (issue 39, point 4). On Kubernetes each kind has pods of its
own, and their CPU requests and limits do this; the niceness then changes nothing."""

import os


def lower_own_priority(niceness: int) -> None:
    """Every thread of this process at ``niceness`` at least; threads and processes it starts
    later inherit it (a prefork pool's children too). 0 leaves it as it is. A process already
    nicer keeps its own: only a privileged process may raise its priority back."""
    if niceness <= 0:
        return
    try:
        # Linux keeps a niceness per thread: a thread started before this call keeps its own.
        threads = [int(thread) for thread in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # not Linux: the process as a whole
    for thread in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, thread) < niceness:
                os.setpriority(os.PRIO_PROCESS, thread, niceness)
        except ProcessLookupError:
            pass  # the thread ended meanwhile


def niceness_of(pid: int) -> int:
    """The niceness of a process (its main thread) on this machine, from /proc: field 19 of
    its stat line."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[16])
