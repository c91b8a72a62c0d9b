"""CPU time of processes on this machine, from /proc: what a request costs in CPU when the
machine's other work makes wall-clock times noisy."""

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and of its living children; 0 for one that has
    ended. Also for a PostgreSQL backend, when the server runs on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += cpu_seconds(int(child))
    except (OSError, IndexError):
        pass  # it ended meanwhile
    return total


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent on anything but idling and waiting for I/O since
    boot, all cores together (/proc/stat): what a benchmark's own processes used is a part
    of it, and the rest is other work on the machine."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in fields[:8]]  # user nice system idle iowait irq softirq steal
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks) - idle - iowait) / os.sysconf("SC_CLK_TCK")
