"""What admission reads and what it decides: plain, frozen data (``jobs.admission``).

The snapshot's parts (queued and held runs, the clusters' nodes, the quotas), the
decisions (admissions, preemptions, waits with their reasons, reservations) and the two
orders the rules go by: the queue's and the victims'.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from clusters.outside_claims import OutsideQueue

# The policies are set on clusters and tenants, whose models sit below jobs: defined there.
from tenants.queueing import Queueing as Queueing


class Wait(StrEnum):
    QUOTA = "QUOTA"  # beyond the guarantee and no borrowing allowed
    BORROW_LIMIT = "BORROW_LIMIT"  # beyond guarantee + borrow limit
    NO_IDLE = "NO_IDLE"  # would borrow, but no placement on free GPUs exists
    CAPACITY = "CAPACITY"  # within the guarantee, but no placement even by preemption
    BEHIND_HEAD = "BEHIND_HEAD"  # an earlier run of the same tenant and flavor waits
    NO_QUOTA = "NO_QUOTA"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    TOO_LARGE = "TOO_LARGE"  # more GPUs than the quota allows per run


@dataclass(frozen=True, slots=True)
class QueuedRun:
    id: int
    tenant: str
    flavor: str
    nodes: int
    gpus_per_node: int
    priority: int
    submitted: float  # epoch seconds
    # A level of the clusters' topology all its nodes must share ("leaf"); else as tight
    # as possible (preferred).
    topology_level: str = ""
    topology_required: bool = False
    # Nodes this run is never placed on (a hardware or platform fault ended an attempt of
    # it there), sorted.
    excluded: tuple[str, ...] = ()
    # Its maximum runtime: how long it holds its GPUs at the latest once started. None: no
    # bound (it cannot start ahead of a reserved head by ending first).
    max_runtime_s: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class HeldRun:
    """A run that holds GPUs now (admitted, submitting, pending or running)."""

    id: int
    tenant: str
    flavor: str
    cluster: str
    gpus: int
    priority: int
    admitted: float
    borrowed: bool
    # The nodes it holds GPUs on, each an equal share. Empty when unknown (a run admitted
    # before placement was recorded): it is then assumed on the nodes with the most free
    # GPUs, so the count stays right and nothing is placed on GPUs it may hold.
    nodes: tuple[str, ...] = ()
    # When it frees its GPUs at the latest (its start, or the end of the placement grace,
    # plus its max runtime; epoch seconds). None: no bound is known.
    latest_end: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """A node with GPUs of one flavor, as the cluster's inventory reports it."""

    cluster: str
    flavor: str
    name: str
    gpus: int
    outside: int = 0  # GPUs used by jobs Gantry did not submit
    schedulable: bool = True
    reason: str = ""  # why it takes no work ("drained: bad DIMM")
    path: tuple[str, ...] = ()  # topology domains, widest first


@dataclass(frozen=True, slots=True)
class Pool:
    """Shorthand for ``nodes`` identical nodes of one flavor on one cluster, all free:
    ``Pool(...).expand()`` gives them, named ``<cluster>-<flavor>-00``, ``-01``, …"""

    cluster: str
    flavor: str
    nodes: int
    gpus_per_node: int

    @property
    def capacity(self) -> int:
        return self.nodes * self.gpus_per_node

    def expand(self) -> tuple[ClusterNode, ...]:
        return tuple(
            ClusterNode(self.cluster, self.flavor, f"{self.cluster}-{self.flavor}-{i:02d}",
                        self.gpus_per_node)
            for i in range(self.nodes)
        )  # fmt: skip


def nodes_of(*pools: Pool) -> tuple[ClusterNode, ...]:
    return tuple(node for pool in pools for node in pool.expand())


@dataclass(frozen=True, slots=True)
class Quota:
    guaranteed: int
    borrow_limit: int = 0
    max_gpus_per_run: int | None = None
    budget_gpu_hours: float | None = None
    budget_hard: bool = True
    weight: int = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    queued: tuple[QueuedRun, ...]
    held: tuple[HeldRun, ...]
    nodes: tuple[ClusterNode, ...]
    quotas: dict[tuple[str, str], Quota]  # (tenant, flavor) -> quota
    budget_used: dict[tuple[str, str], float] = field(default_factory=dict)  # GPU-hours
    decayed_usage: dict[tuple[str, str], float] = field(default_factory=dict)  # GPU-seconds
    now: float = 0.0  # epoch seconds
    starvation_after_s: float = float("inf")
    # cluster -> the names of its topology levels, widest first (one per path element)
    levels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # cluster -> the jobs from outside Gantry waiting for its GPUs (``jobs.reclaim``);
    # a cluster not named has none.
    outside: Mapping[str, OutsideQueue] = field(default_factory=dict)
    # cluster -> its queueing policy; a cluster not named is ``strict`` here (the selector
    # names every enabled cluster: their default is ``backfill``).
    queueing: Mapping[str, Queueing] = field(default_factory=dict)
    # tenant -> a policy for its runs that overrides its clusters' policies.
    tenant_queueing: Mapping[str, Queueing] = field(default_factory=dict)
    # A run admitted now starts within this or goes back to the queue: its latest end counts
    # its max runtime from then (as ``HeldRun.latest_end`` does for a run not started).
    start_grace_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Admit:
    run_id: int
    cluster: str
    borrowed: bool = False
    over_budget: bool = False
    nodes: tuple[str, ...] = ()  # where it is placed, sorted
    # Backfilled: the waiting head of its tenant's line it started ahead of, and why that
    # does not delay the head ("it ends before run 11's reserved start at ...").
    ahead_of: int | None = None
    ahead_because: str = ""
    # A gang placed across more than one domain of its cluster's narrowest topology level
    # (two leaf switches, say): how long it would have waited, from now, for a placement
    # inside one such domain, as backfill reserves a start (``jobs.backfill.plan``). None: not
    # spread, no such domain could ever hold it, a run it would wait on has no bound, or the
    # cycle was not asked to explain. 0 only where a tighter placement was free but not
    # taken: GPUs reserved for a waiting head it started ahead of, or a cluster with fewer
    # levels whose domain ranks as tight (docs/admission.md, "Spread placements").
    tighter_wait_s: float | None = None


@dataclass(frozen=True, slots=True)
class Preempt:
    """A borrowed run taken off its GPUs. ``message`` is what the run's own tenant reads: it
    names no other tenant, project, user or run. ``detail`` names the reclaiming tenant and
    run, for platform admins only."""

    run_id: int
    by_run_id: int
    message: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Waiting:
    run_id: int
    reason: Wait
    message: str
    position: int  # 1-based place among the waiting runs of the flavor (priority, then FIFO)


@dataclass(frozen=True, slots=True)
class Reservation:
    run_id: int
    cluster: str
    flavor: str
    gpus: int
    nodes: tuple[str, ...] = ()  # the nodes whose GPUs are held for it


@dataclass(frozen=True, slots=True)
class Shadow:
    """The start reserved for the waiting head of a tenant's line under ``backfill``: the
    nodes it starts on at the latest, and when (EASY backfill's "shadow time": the held runs
    there end by then at their max runtimes). ``at`` None: a run it waits on has no bound."""

    run_id: int
    cluster: str
    flavor: str
    nodes: tuple[str, ...]
    at: float | None


@dataclass(frozen=True, slots=True)
class Decisions:
    admitted: tuple[Admit, ...]
    preempted: tuple[Preempt, ...]
    waiting: tuple[Waiting, ...]
    reservations: tuple[Reservation, ...] = ()
    shadows: tuple[Shadow, ...] = ()


def queue_order(run: QueuedRun) -> tuple[int, float, int]:
    return (-run.priority, run.submitted, run.id)


def victim_order(run: HeldRun) -> tuple[int, float, int]:
    """Who is preempted first: lowest priority, then the newest."""
    return (run.priority, -run.admitted, -run.id)
