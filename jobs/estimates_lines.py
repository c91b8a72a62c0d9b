"""The queued runs of the start-estimate simulation (``jobs.estimates``), line by line, and
which lines a simulated cycle need not walk (pure: no ORM, no clock, no I/O).

``Lines``: each tenant's runs of each flavor in the order admission takes them, kept as runs
start and are preempted back into the queue. ``held_back``: why a line's first run waits
when no decision of the cycle can change it (``jobs.estimates_state.decide_flavor`` leaves
such lines out of the cycle).
"""

from bisect import insort
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TypeVar

from jobs.admission_types import HeldRun, QueuedRun, Snapshot, Wait, queue_order

Key = tuple[str, str]  # (tenant, flavor)
_Run = TypeVar("_Run", QueuedRun, HeldRun)


class Lines:
    """The queued runs of each tenant and flavor, in line (priority, then FIFO), by flavor.

    A cycle admits a prefix of each line at most (a tenant's blocked run holds back its
    later ones), and walks each line only as far as that (``jobs.estimates_state.decide``):
    a long queue costs nothing beyond. Except in a flavor where a head may be passed (a
    line of a tenant whose queueing policy is not ``strict``): there admission goes on
    behind a blocked head, and the simulation before issue 38 gave ``decide`` only each
    line's first few runs (``front``), more when a whole front was admitted (``deepen``),
    and decided the cycle again. So does this one there
    (``jobs.estimates_state.decide_flavor``), for the same decisions: those are not quite
    the cycle's on the whole queue, as the runs of a line beyond its front do not start
    ahead of its head in that cycle (left as it was)."""

    FRONT = 2

    def __init__(self, runs: Iterable[QueuedRun]):
        # flavor -> (tenant, flavor) -> its line
        self.lines: dict[str, dict[Key, list[QueuedRun]]] = defaultdict(dict)
        for run in sorted(runs, key=queue_order):
            self.lines[run.flavor].setdefault((run.tenant, run.flavor), []).append(run)
        self.depth: dict[Key, int] = {}

    def __bool__(self) -> bool:
        return bool(self.lines)

    def add(self, run: QueuedRun) -> None:
        line = self.lines[run.flavor].setdefault((run.tenant, run.flavor), [])
        insort(line, run, key=queue_order)

    def remove(self, run: QueuedRun) -> None:
        lines = self.lines[run.flavor]
        line = lines[(run.tenant, run.flavor)]
        del line[index_of(line, run)]
        if not line:
            del lines[(run.tenant, run.flavor)]
            if not lines:
                del self.lines[run.flavor]

    def of(self, flavor: str) -> dict[Key, list[QueuedRun]]:
        return self.lines.get(flavor, {})

    def front(self, flavor: str) -> dict[Key, list[QueuedRun]]:
        return {
            key: line[: self.depth.get(key, self.FRONT)] for key, line in self.of(flavor).items()
        }

    def deepen(self, flavor: str, admitted: set[int]) -> bool:
        """Give more runs to each line of ``flavor`` whose whole front was admitted;
        whether any was."""
        deeper = False
        for key, line in self.of(flavor).items():
            depth = self.depth.get(key, self.FRONT)
            if len(line) > depth and all(run.id in admitted for run in line[:depth]):
                self.depth[key] = depth * 4
                deeper = True
        return deeper


def held_back(
    snapshot: Snapshot, usage: Mapping[Key, int], key: Key, head: QueuedRun, passable: set[Key]
) -> Wait | None:
    """Why the first run of a line waits, when it is for a reason no cycle's decisions can
    change and changes nothing else in the cycle (the line's later runs wait behind it):
    no quota, a run larger than the quota allows (where no later run may pass it), a spent
    hard budget, or a tenant at its guarantee plus borrow limit (``usage``: before the
    cycle; only its own runs ending, or preempted, lower it). As ``_Cycle.precheck`` and
    ``_Cycle.borrow`` find it; None where the line must be decided."""
    quota = snapshot.quotas.get(key)
    if quota is None or quota.guaranteed + quota.borrow_limit == 0:
        return Wait.NO_QUOTA
    if quota.max_gpus_per_run is not None and head.gpus > quota.max_gpus_per_run:
        return None if key in passable else Wait.TOO_LARGE
    budget = quota.budget_gpu_hours
    if budget is not None and quota.budget_hard and snapshot.budget_used.get(key, 0.0) >= budget:
        return Wait.BUDGET_EXHAUSTED
    if usage[key] + head.gpus > quota.guaranteed + quota.borrow_limit:
        return Wait.QUOTA if quota.borrow_limit == 0 else Wait.BORROW_LIMIT
    return None


def index_of(runs: list[_Run], run: _Run) -> int:
    """Where ``run`` itself is in ``runs``: ``list.index`` without comparing every run
    before it field by field (runs are dataclasses; each id is in a list once)."""
    for index, each in enumerate(runs):
        if each is run:
            return index
    raise ValueError(f"run {run.id} is not in the list")
