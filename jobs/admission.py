"""Admission decisions as a pure function over a snapshot. No ORM, no clock, no I/O.

Rules (design §5, v1): a run is admitted only when all its GPUs fit on one cluster
offering its flavor (gang), and its tenant stays within the guaranteed GPUs of that
flavor. Runs are considered by priority, then FIFO. When a tenant's head run for a
flavor cannot start, that tenant's later runs of the flavor wait behind it, so a stream
of small runs cannot starve it; other tenants are never blocked by it.
"""

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum


class Wait(StrEnum):
    QUOTA = "QUOTA"
    CAPACITY = "CAPACITY"
    BEHIND_HEAD = "BEHIND_HEAD"
    NO_QUOTA = "NO_QUOTA"


@dataclass(frozen=True, slots=True)
class QueuedRun:
    id: int
    tenant: str
    flavor: str
    nodes: int
    gpus_per_node: int
    priority: int
    # Anything totally ordered by submission (epoch seconds, a sequence number).
    submitted: float

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Pool:
    """GPUs of one flavor on one cluster."""

    cluster: str
    flavor: str
    nodes: int
    gpus_per_node: int
    used_gpus: int

    @property
    def capacity(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Snapshot:
    queued: tuple[QueuedRun, ...]
    pools: tuple[Pool, ...]
    guaranteed: dict[tuple[str, str], int]  # (tenant, flavor) -> GPUs
    tenant_usage: dict[tuple[str, str], int]  # (tenant, flavor) -> GPUs held now


@dataclass(frozen=True, slots=True)
class Admit:
    run_id: int
    cluster: str


@dataclass(frozen=True, slots=True)
class Waiting:
    run_id: int
    reason: Wait
    message: str
    position: int  # 1-based place among the waiting runs of the same flavor


@dataclass(frozen=True, slots=True)
class Decisions:
    admitted: tuple[Admit, ...]
    waiting: tuple[Waiting, ...]


def queue_order(run: QueuedRun) -> tuple:
    return (-run.priority, run.submitted, run.id)


def decide(snapshot: Snapshot) -> Decisions:
    idle: dict[tuple[str, str], int] = {
        (p.cluster, p.flavor): p.capacity - p.used_gpus for p in snapshot.pools
    }
    pools_by_flavor: dict[str, list[Pool]] = defaultdict(list)
    for pool in sorted(snapshot.pools, key=lambda p: p.cluster):
        pools_by_flavor[pool.flavor].append(pool)
    usage = dict(snapshot.tenant_usage)
    blocked_heads: dict[tuple[str, str], int] = {}
    admitted: list[Admit] = []
    waiting: list[tuple[QueuedRun, Wait, str]] = []

    for run in sorted(snapshot.queued, key=queue_order):
        key = (run.tenant, run.flavor)
        if key in blocked_heads:
            waiting.append(
                (
                    run,
                    Wait.BEHIND_HEAD,
                    f"waiting behind run {blocked_heads[key]} of tenant {run.tenant}, "
                    "which is first in line for this flavor (priority, then submission order)",
                )
            )
            continue
        guaranteed = snapshot.guaranteed.get(key, 0)
        in_use = usage.get(key, 0)
        if guaranteed == 0:
            reason, message = Wait.NO_QUOTA, f"tenant {run.tenant} has no quota for {run.flavor}"
        elif in_use + run.gpus > guaranteed:
            reason = Wait.QUOTA
            message = (
                f"tenant {run.tenant} uses {in_use} of {guaranteed} guaranteed {run.flavor} "
                f"GPUs; this run needs {run.gpus}"
            )
        else:
            pool = _best_fit(run, pools_by_flavor[run.flavor], idle)
            if pool is not None:
                idle[(pool.cluster, pool.flavor)] -= run.gpus
                usage[key] = in_use + run.gpus
                admitted.append(Admit(run_id=run.id, cluster=pool.cluster))
                continue
            most_idle = max(
                (idle[(p.cluster, p.flavor)] for p in pools_by_flavor[run.flavor]), default=0
            )
            reason = Wait.CAPACITY
            message = (
                f"needs {run.gpus} {run.flavor} GPUs ({run.nodes}×{run.gpus_per_node}) on one "
                f"cluster; the most idle cluster has {most_idle}"
            )
        blocked_heads[key] = run.id
        waiting.append((run, reason, message))

    positions: dict[str, int] = defaultdict(int)
    waiting_decisions = []
    for run, reason, message in waiting:
        positions[run.flavor] += 1
        waiting_decisions.append(
            Waiting(run_id=run.id, reason=reason, message=message, position=positions[run.flavor])
        )
    return Decisions(admitted=tuple(admitted), waiting=tuple(waiting_decisions))


def _best_fit(run: QueuedRun, pools: list[Pool], idle: dict[tuple[str, str], int]) -> Pool | None:
    """The pool that fits the whole gang and leaves the least idle behind (ties: by name)."""
    best: Pool | None = None
    best_left = 0
    for pool in pools:
        if run.gpus_per_node > pool.gpus_per_node or run.nodes > pool.nodes:
            continue
        left = idle[(pool.cluster, pool.flavor)] - run.gpus
        if left < 0:
            continue
        if best is None or left < best_left:
            best, best_left = pool, left
    return best
