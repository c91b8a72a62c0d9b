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
