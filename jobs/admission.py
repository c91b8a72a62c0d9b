"""Admission decisions as a pure function over a snapshot. No ORM, no clock, no I/O.

The rules (design §5):

- Gang and placement: a run is admitted only when ``nodes`` distinct schedulable nodes of
  its flavor on one cluster each have ``gpus_per_node`` free GPUs now, after this cycle's
  earlier admissions and preemptions, inside one topology domain at the level it requires
  (``jobs.placement``: the tightest domain, then the least fragmentation). Free means the
  node's GPUs less those held by Gantry's runs placed there and those used by jobs from
  outside Gantry; drained, cordoned or unreachable nodes take nothing. The placement is
  part of the decision: it is what the backend is told.
- Guarantee: while a tenant stays within ``guaranteed`` GPUs of a flavor, its run is
  admitted onto free GPUs or, failing that, by preempting *borrowed* runs of other tenants
  on one cluster: tried lowest priority first, then newest, until their freed GPUs make a
  placement, then trimmed so that every victim left is needed for it; the cluster that
  needs the fewest preempted GPUs wins. A preemption that frees GPUs which do not help is
  never made, nor one whose freed GPUs a job waiting in the cluster's own queue from
  outside Gantry would take first (``jobs.reclaim``; not where the backend starts the
  reclaiming run there first).
- Borrowing: beyond the guarantee, up to ``borrow_limit``, only onto free GPUs; such runs
  are marked borrowed (preemptible). Competing borrowers take turns by weighted fair share:
  the tenant with the least decayed usage per weight goes first.
- Budgets: a hard budget that is spent makes the tenant's runs wait (BUDGET_EXHAUSTED); a
  soft one admits them and flags them.
- Order: priority, then FIFO inside a tenant and flavor. A tenant's blocked head holds that
  tenant's later runs of the flavor back (so small runs cannot starve it), never another
  tenant's.
- No starvation: a run that has waited longer than ``starvation_after_s`` and still cannot
  be placed holds concrete nodes: the ones where it comes closest to fitting (nodes no run
  entered since it began starving first; never one that outside load keeps it off), whose
  free GPUs, up to what it needs on each, no later run may take and whose borrowed runs no
  later run may reclaim. It then starts at the latest when the runs on those nodes end
  (each is bounded by its max runtime). Until then, other runs may use free GPUs
  elsewhere.

The result is deterministic: the same snapshot always gives the same decisions.
"""

import heapq
import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import partial
from typing import TypeVar, cast

from clusters.outside_claims import OutsideQueue
from jobs import placement
from jobs.reclaim import outside_taker, stolen_reason

_T = TypeVar("_T")


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


@dataclass(frozen=True, slots=True)
class Admit:
    run_id: int
    cluster: str
    borrowed: bool = False
    over_budget: bool = False
    nodes: tuple[str, ...] = ()  # where it is placed, sorted


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
class Decisions:
    admitted: tuple[Admit, ...]
    preempted: tuple[Preempt, ...]
    waiting: tuple[Waiting, ...]
    reservations: tuple[Reservation, ...] = ()


def queue_order(run: QueuedRun) -> tuple[int, float, int]:
    return (-run.priority, run.submitted, run.id)


def victim_order(run: HeldRun) -> tuple[int, float, int]:
    """Who is preempted first: lowest priority, then the newest."""
    return (run.priority, -run.admitted, -run.id)


class _Pool:
    """One cluster's nodes of one flavor as the cycle goes: what is free on each node, what
    is held for starving runs, which borrowed runs could be reclaimed there."""

    def __init__(
        self, cluster: str, flavor: str, nodes: list[ClusterNode], levels: tuple[str, ...]
    ):
        self.cluster = cluster
        self.flavor = flavor
        self.levels = levels
        self.nodes = {node.name: node for node in sorted(nodes, key=lambda n: n.name)}
        self.free = {node.name: node.gpus - node.outside for node in nodes}
        self.reserved: dict[str, int] = defaultdict(int)
        self.fenced: set[str] = set()  # nodes a starving run waits on: no reclaims there
        self.borrowed: list[HeldRun] = []  # in victim order
        self.entered: dict[str, float] = {}  # node -> when the latest run on it was admitted
        # Every change bumps the version; placements, views and reasons computed at a
        # version are reused until the next change (many queued runs share a shape).
        self.version = 0
        # Shared by the pools of one flavor: bumped with any of their versions, it says
        # whether anything that answers a question about the flavor changed.
        self.flavor_version = [0]
        self._memo: dict[tuple[object, ...], tuple[int, object]] = {}
        # How many schedulable nodes have each number of available GPUs (a gang that needs
        # more such nodes than there are is refused without looking at the nodes), and the
        # nodes as placement sees them: built by ``settle`` once the held runs are in, then
        # kept up to date node by node.
        self.tally: Counter[int] = Counter()
        self._placeable: dict[str, placement.Node] = {}
        self._settled = False
        self._capable_by_shape: dict[tuple[int, int | None], list[list[str]]] = {}

    def settle(self) -> None:
        self.tally = Counter(
            self.available(name) for name, node in self.nodes.items() if node.schedulable
        )
        self._placeable = {
            name: placement.Node(
                name,
                node.gpus,
                self.available(name),
                node.schedulable,
                node.path,
                node.reason,
                outside=node.outside,
                held=self.held(name),
            )
            for name, node in self.nodes.items()
        }
        self._settled = True

    def available(self, name: str) -> int:
        return max(0, self.free[name] - self.reserved[name])

    def held(self, name: str) -> int:
        """GPUs of the node that are free but held back for a starving run."""
        return min(self.reserved[name], max(0, self.free[name]))

    def _remembered(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, or what it gave for ``key`` at this version."""
        hit = self._memo.get(key)
        if hit is not None and hit[0] == self.version:
            return cast(_T, hit[1])
        value = compute()
        self._memo[key] = (self.version, value)
        return value

    def _change(self, name: str, *, free: int = 0, reserved: int = 0) -> None:
        self.version += 1
        self.flavor_version[0] += 1
        if not self._settled:
            self.free[name] += free
            self.reserved[name] += reserved
            return
        schedulable = self.nodes[name].schedulable
        if schedulable:
            self.tally[self.available(name)] -= 1
        self.free[name] += free
        self.reserved[name] += reserved
        if schedulable:
            self.tally[self.available(name)] += 1
        self._placeable[name] = replace(
            self._placeable[name], free=self.available(name), held=self.held(name)
        )

    def take(self, name: str, gpus: int) -> None:
        if name in self.nodes:
            self._change(name, free=-gpus)

    def give(self, name: str, gpus: int) -> None:
        if name in self.nodes:
            self._change(name, free=gpus)

    def hold(self, name: str, gpus: int) -> None:
        self._change(name, reserved=gpus)

    def fence(self, name: str) -> None:
        self.version += 1
        self.flavor_version[0] += 1
        self.fenced.add(name)

    def closest(
        self, run: QueuedRun, since: float
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        """The ``nodes`` nodes that could ever hold the gang (inside one domain at its
        required level, with its GPUs besides those used from outside Gantry, not waited on
        by another run): the fewest that a run entered ``since``, then the most of what it
        needs available now. With their rank: (how many were entered, minus what they have);
        None if there are not that many."""
        level = self.required_level(run)
        if level == -1:
            return None
        # Only which nodes were entered since ``since`` matters: the memo is keyed on where
        # ``since`` falls among the times nodes were entered, not on the time itself.
        times = self._remembered(("entered",), lambda: sorted(set(self.entered.values())))
        return self._remembered(
            ("closest", run.nodes, run.gpus_per_node, level, bisect_left(times, since)),
            lambda: self._closest(run.nodes, run.gpus_per_node, level, since),
        )

    def _closest(
        self, count: int, gpus_per_node: int, level: int | None, since: float
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        best: tuple[tuple[str, ...], tuple[int, int]] | None = None
        entered, free, reserved, fenced = self.entered, self.free, self.reserved, self.fenced
        for names in self._capable(gpus_per_node, level):
            ranked = sorted(
                [
                    (
                        entered.get(name, -math.inf) >= since,
                        -min(max(0, free[name] - reserved[name]), gpus_per_node),
                        name,
                    )
                    for name in names
                    if name not in fenced
                ]
            )[:count]
            if len(ranked) < count:
                continue
            rank = (sum(e for e, _, _ in ranked), sum(minus for _, minus, _ in ranked))
            if best is None or rank < best[1]:
                best = (tuple(sorted(name for _, _, name in ranked)), rank)
        return best

    def _capable(self, gpus_per_node: int, level: int | None) -> list[list[str]]:
        """The nodes that could ever hold ``gpus_per_node`` (taking work, with that many
        GPUs besides the outside load), grouped by their domain at ``level``, domains in
        order. It depends on nothing the cycle changes: computed once per shape."""
        key = (gpus_per_node, level)
        if key not in self._capable_by_shape:
            domains: dict[tuple[str, ...], list[str]] = defaultdict(list)
            for name, node in self.nodes.items():
                if not node.schedulable or node.gpus - node.outside < gpus_per_node:
                    continue
                if level is None or len(node.path) >= level:
                    domains[node.path[:level] if level else ()].append(name)
            self._capable_by_shape[key] = [domains[domain] for domain in sorted(domains)]
        return self._capable_by_shape[key]

    def could_fit(self, nodes: int, gpus_per_node: int) -> bool:
        fitting = 0
        for free, count in self.tally.items():
            if free >= gpus_per_node:
                fitting += count
                if fitting >= nodes:
                    return True
        return False

    def required_level(self, run: QueuedRun) -> int | None:
        """The depth the run's gang must share, None for any; -1: this cluster has no such
        level, so the run cannot go here."""
        if not run.topology_required or not run.topology_level:
            return None
        if run.topology_level not in self.levels:
            return -1
        return self.levels.index(run.topology_level) + 1

    def view(self, extra: Mapping[str, int] | None = None) -> list[placement.Node]:
        """The nodes as ``jobs.placement`` takes them, with ``extra`` GPUs free on some."""
        nodes = list(self._placeable.values())
        if extra:
            nodes = [
                replace(
                    node,
                    free=max(0, self.free[node.name] + extra[node.name] - self.reserved[node.name]),
                )
                if extra.get(node.name)
                else node
                for node in nodes
            ]
        return nodes

    def place(
        self, run: QueuedRun, extra: Mapping[str, int] | None = None
    ) -> placement.Placement | None:
        if not extra and not self.could_fit(run.nodes, run.gpus_per_node):
            return None  # the common case on a busy cluster: no look at the nodes
        level = self.required_level(run)
        if level == -1:
            return None
        gang = placement.Gang(run.nodes, run.gpus_per_node, required_level=level)
        if extra:
            return placement.place(self.view(extra), gang)
        return self._remembered(("place", gang), lambda: placement.place(self.view(), gang))

    def left_after(self, run: QueuedRun, where: placement.Placement) -> int:
        return sum(self.available(name) - run.gpus_per_node for name in where.nodes)

    def explain(self, run: QueuedRun) -> str:
        level = self.required_level(run)
        if level == -1:
            return (
                f"needs its {run.nodes} nodes in one {run.topology_level}, a level {self.cluster}"
                f" does not have (its levels: {', '.join(self.levels) or 'none'})"
            )
        gang = placement.Gang(run.nodes, run.gpus_per_node, required_level=level)
        return self._remembered(
            ("explain", gang),
            lambda: placement.explain(self.view(), gang, flavor=self.flavor, levels=self.levels),
        )


def _tightness(where: placement.Placement) -> tuple[int, int]:
    """Smaller is tighter: one node, then the deepest shared domain."""
    return (0, 0) if where.single_node else (1, -len(where.domain))


class _State:
    """The clusters as the cycle goes: placements, usage, borrowed runs, reservations."""

    def __init__(self, snapshot: Snapshot):
        by_pool: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
        for node in snapshot.nodes:
            by_pool[(node.cluster, node.flavor)].append(node)
        self.pools = {
            key: _Pool(*key, nodes, tuple(snapshot.levels.get(key[0], ())))
            for key, nodes in sorted(by_pool.items())
        }
        self.pools_by_flavor: dict[str, list[_Pool]] = defaultdict(list)
        self.flavor_versions: dict[str, list[int]] = defaultdict(lambda: [0])
        for (_, flavor), flavor_pool in self.pools.items():
            self.pools_by_flavor[flavor].append(flavor_pool)
            flavor_pool.flavor_version = self.flavor_versions[flavor]
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.held_on: dict[int, dict[str, int]] = {}  # run id -> node -> GPUs
        unplaced: list[tuple[_Pool, HeldRun]] = []
        for run in sorted(snapshot.held, key=lambda r: (r.admitted, r.id)):
            self.usage[(run.tenant, run.flavor)] += run.gpus
            pool = self.pools.get((run.cluster, run.flavor))
            if pool is None:
                continue
            if run.borrowed:
                pool.borrowed.append(run)
            if run.nodes:
                share, extra = divmod(run.gpus, len(run.nodes))
                on = {
                    name: share + (1 if index < extra else 0)
                    for index, name in enumerate(sorted(run.nodes))
                }
                self._hold(pool, run.id, on, run.admitted)
            else:
                unplaced.append((pool, run))
        for held_pool, run in unplaced:
            # Where it most likely is: the nodes with the most free GPUs, as a backend that
            # spreads nothing thin would have put it. Counted either way, never placed on.
            on, left = {}, run.gpus
            for name in sorted(held_pool.nodes, key=lambda n: (-held_pool.free[n], n)):
                if left <= 0:
                    break
                taken = min(left, max(0, held_pool.free[name]))
                if taken:
                    on[name] = taken
                    left -= taken
            self._hold(held_pool, run.id, on, run.admitted)
        for each in self.pools.values():
            each.borrowed.sort(key=victim_order)
            each.settle()
        self.now = snapshot.now
        self.starvation_after_s = snapshot.starvation_after_s
        # Answers by the shape asked about and the pools' versions (``_shape``).
        self._answers: dict[tuple[object, ...], object] = {}

    def _hold(self, pool: _Pool, run_id: int, on: dict[str, int], admitted: float) -> None:
        self.held_on[run_id] = on
        for name, gpus in on.items():
            pool.take(name, gpus)
            if name in pool.nodes:
                pool.entered[name] = max(pool.entered.get(name, -math.inf), admitted)

    def _shape(self, run: QueuedRun) -> tuple[object, ...]:
        """What a placement question about ``run`` depends on: its shape and the state of
        the clusters with its flavor (every pool's version)."""
        return (
            run.flavor,
            run.nodes,
            run.gpus_per_node,
            run.topology_level if run.topology_required else "",
            self.flavor_versions[run.flavor][0],
        )

    def best_fit(self, run: QueuedRun) -> tuple[_Pool, placement.Placement] | None:
        """Where the gang fits on available GPUs: the tightest placement, then the one that
        leaves the least behind, then the cluster's name. Runs of one shape asked about
        while nothing changed share the answer."""
        key = ("best_fit", *self._shape(run))
        if key not in self._answers:
            self._answers[key] = self._best_fit(run)
        return cast(tuple[_Pool, placement.Placement] | None, self._answers[key])

    def _best_fit(self, run: QueuedRun) -> tuple[_Pool, placement.Placement] | None:
        best, best_rank = None, None
        for pool in self.pools_by_flavor[run.flavor]:
            where = pool.place(run)
            if where is None:
                continue
            rank = (_tightness(where), pool.left_after(run, where), pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, where), rank
        return best

    def victims(
        self, run: QueuedRun, pool: _Pool
    ) -> tuple[list[HeldRun], placement.Placement] | None:
        """The fewest other tenants' borrowed runs on ``pool`` whose preemption makes a
        placement for ``run``: taken in victim order until one exists, then each dropped
        again (newest choice first) if the placement survives without it. Runs on nodes a
        starving run waits on are not taken."""
        if pool.required_level(run) == -1:
            return None
        candidates = [
            victim
            for victim in pool.borrowed
            if victim.tenant != run.tenant and not pool.fenced.intersection(self.held_on[victim.id])
        ]
        freed: dict[str, int] = defaultdict(int)
        chosen: list[HeldRun] = []
        where = None
        for victim in candidates:
            chosen.append(victim)
            for name, gpus in self.held_on[victim.id].items():
                freed[name] += gpus
            where = pool.place(run, freed)
            if where is not None:
                break
        if where is None:
            return None
        for victim in reversed(chosen[:-1]):  # the last one was needed: without it, none
            without = dict(freed)
            for name, gpus in self.held_on[victim.id].items():
                without[name] -= gpus
            trimmed = pool.place(run, without)
            if trimmed is not None:
                chosen.remove(victim)
                freed, where = without, trimmed
        return chosen, where

    def admit(self, run: QueuedRun, pool: _Pool, where: placement.Placement) -> None:
        self._hold(pool, run.id, dict.fromkeys(where.nodes, run.gpus_per_node), self.now)
        self.usage[(run.tenant, run.flavor)] += run.gpus

    def stolen(
        self, pool: _Pool, victims: list[HeldRun], outside: Mapping[str, OutsideQueue]
    ) -> str:
        """Why preempting ``victims`` on ``pool`` would not reach the reclaiming run: an
        outside job the cluster would start on the freed GPUs first (``jobs.reclaim``)."""
        queue = outside.get(pool.cluster)
        if queue is None:
            return ""
        freed: dict[str, int] = defaultdict(int)
        for victim in victims:
            for name, gpus in self.held_on[victim.id].items():
                freed[name] += gpus
        free = {name: pool.free[name] for name, node in pool.nodes.items() if node.schedulable}
        taker = outside_taker(queue, flavor=pool.flavor, free=free, freed=freed)
        if taker is None:
            return ""
        return stolen_reason(
            taker, cluster=pool.cluster, flavor=pool.flavor,
            gpus=sum(v.gpus for v in victims), victims=len(victims),
        )  # fmt: skip

    def preempt(self, victim: HeldRun) -> None:
        pool = self.pools[(victim.cluster, victim.flavor)]
        pool.borrowed.remove(victim)
        for name, gpus in self.held_on.pop(victim.id).items():
            pool.give(name, gpus)
        self.usage[(victim.tenant, victim.flavor)] -= victim.gpus

    def reserve(self, run: QueuedRun, reservations: list[Reservation]) -> None:
        """Hold, for a starving ``run``, the nodes where it comes closest to fitting: up to
        ``gpus_per_node`` of each one's available GPUs, and keep later runs from reclaiming
        borrowed GPUs there.

        A node that no run entered since ``run`` began starving holds only runs that were
        there before, which end within their max runtime; preferring such nodes keeps the
        choice the same from one cycle to the next (no run enters the nodes held, beyond what
        the run needs there), so it starts when those runs end. A node whose outside load
        leaves it fewer GPUs than the run needs is never held."""
        starving_since = run.submitted + self.starvation_after_s
        if self.now < starving_since:
            return
        best, best_rank = None, None
        for pool in self.pools_by_flavor[run.flavor]:
            found = pool.closest(run, starving_since)
            if found is None:
                continue
            target, (entered, short) = found
            rank = (entered, short, pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, target), rank
        if best is None:
            return
        pool, target = best
        held = 0
        for name in target:
            pool.fence(name)
            gpus = min(pool.available(name), run.gpus_per_node)
            if gpus:
                pool.hold(name, gpus)
                held += gpus
        if held:
            reservations.append(Reservation(run.id, pool.cluster, pool.flavor, held, target))

    def explain(self, run: QueuedRun) -> str:
        """Why ``run`` has no placement now, cluster by cluster."""
        key = ("explain", *self._shape(run))
        if key not in self._answers:
            self._answers[key] = self._explain(run)
        return cast(str, self._answers[key])

    def _explain(self, run: QueuedRun) -> str:
        pools = self.pools_by_flavor[run.flavor]
        if not pools:
            return f"needs {run.gpus} {run.flavor} GPUs; no enabled cluster has {run.flavor} GPUs"
        if len(pools) == 1:
            return pools[0].explain(run)
        return "; ".join(f"on {pool.cluster}: {pool.explain(run)}" for pool in pools)

    def reclaimable(self, run: QueuedRun) -> int:
        """Borrowed GPUs of other tenants ``run`` could reclaim, on any cluster."""
        return sum(
            victim.gpus
            for pool in self.pools_by_flavor[run.flavor]
            for victim in pool.borrowed
            if victim.tenant != run.tenant and not pool.fenced.intersection(self.held_on[victim.id])
        )


def decide(snapshot: Snapshot, *, explain: bool = True) -> Decisions:
    """The cycle's decisions. ``explain=False`` leaves the waiting runs' messages empty:
    what a forward simulation (``jobs.estimates``) asks, many times over."""
    state = _State(snapshot)
    order = sorted(snapshot.queued, key=queue_order)
    queues: dict[tuple[str, str], list[QueuedRun]] = defaultdict(list)
    for run in order:
        queues[(run.tenant, run.flavor)].append(run)

    admitted: list[Admit] = []
    preempted: list[Preempt] = []
    # A placement reason is written once the cycle is decided (``later``): it tells what is
    # free after this cycle's admissions, and runs of one shape share it.
    waits: dict[int, tuple[Wait, str | Callable[[], str]]] = {}
    reservations: list[Reservation] = []
    blocked: dict[tuple[str, str], int] = {}  # (tenant, flavor) -> the head run that waits
    borrowers: dict[tuple[str, str], int] = {}  # (tenant, flavor) -> index of its first borrower

    def block(
        key: tuple[str, str], run: QueuedRun, reason: Wait, message: str | Callable[[], str]
    ) -> None:
        blocked[key] = run.id
        waits[run.id] = (reason, message)

    capacity: dict[str, int] = defaultdict(int)
    for node in snapshot.nodes:
        capacity[node.flavor] += node.gpus
    guaranteed: dict[str, int] = defaultdict(int)
    for (_, flavor), tenant_quota in snapshot.quotas.items():
        guaranteed[flavor] += tenant_quota.guaranteed

    def capacity_reason(run: QueuedRun) -> str:
        message = state.explain(run)
        if state.reclaimable(run):
            message += "; reclaiming the GPUs other tenants borrowed would not make room"
        held = sum(gpus for (_, flavor), gpus in state.usage.items() if flavor == run.flavor)
        borrowed = sum(
            victim.gpus for pool in state.pools_by_flavor[run.flavor] for victim in pool.borrowed
        )
        if (
            guaranteed[run.flavor] > capacity[run.flavor]
            and held - borrowed + run.gpus > capacity[run.flavor]
        ):
            # Runs within their guarantees leave no room for this one, also within its
            # guarantee: the guarantees were promised beyond the clusters (docs/admission.md,
            # "Overcommitted guarantees"). Said so the wait does not read as a broken promise.
            message += (
                f"; the {run.flavor} guarantees of all tenants add up to more than the "
                f"{capacity[run.flavor]} GPUs the clusters have, so not all can be kept at once"
            )
        return message

    def usage_of(tenant: str, flavor: str, in_use: int, guarantee: int) -> str:
        if in_use > guarantee:  # runs admitted before the guarantee was lowered, or borrowed
            return (
                f"tenant {tenant} uses {in_use} {flavor} GPUs, {in_use - guarantee} beyond its "
                f"guarantee of {guarantee}"
            )
        return f"tenant {tenant} uses {in_use} of {guarantee} guaranteed {flavor} GPUs"

    def borrow_reason(run: QueuedRun, usage: str) -> str:
        return f"{usage}; to borrow idle ones, this run {state.explain(run)}"

    def precheck(key: tuple[str, str], run: QueuedRun) -> tuple[Quota | None, bool]:
        """Quota and budget gates common to both phases; returns (quota, over_budget)."""
        quota = snapshot.quotas.get(key)
        tenant, flavor = key
        if quota is None or quota.guaranteed + quota.borrow_limit == 0:
            block(key, run, Wait.NO_QUOTA, f"tenant {tenant} has no quota for {flavor}")
            return None, False
        if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
            block(
                key, run, Wait.TOO_LARGE,
                f"asks for {run.gpus} {flavor} GPUs; tenant {tenant} may use at most "
                f"{quota.max_gpus_per_run} per run",
            )  # fmt: skip
            return None, False
        over_budget = False
        if quota.budget_gpu_hours is not None:
            used = snapshot.budget_used.get(key, 0.0)
            if used >= quota.budget_gpu_hours:
                if quota.budget_hard:
                    block(
                        key, run, Wait.BUDGET_EXHAUSTED,
                        f"tenant {tenant} has used {used:,.0f} of its {quota.budget_gpu_hours:,.0f}"
                        f" {flavor} GPU-hour budget this month (hard limit)",
                    )  # fmt: skip
                    return None, False
                over_budget = True
        return quota, over_budget

    # Phase 1: runs within their tenant's guarantee, in priority then FIFO order. Preemptions
    # can bring a tenant that was beyond its guarantee back within it: its queue gets another
    # pass, so it reclaims now rather than waiting as a borrower and reclaiming next cycle.
    # This ends: each pass after the first follows a preemption, and a run is preempted once.
    pending = order
    while pending:
        for run in pending:
            key = (run.tenant, run.flavor)
            if key in blocked or key in borrowers:
                continue
            quota, over_budget = precheck(key, run)
            if quota is None:
                continue
            if state.usage[key] + run.gpus > quota.guaranteed:
                borrowers[key] = queues[key].index(run)
                continue
            fit = state.best_fit(run)
            victims: list[HeldRun] = []
            stolen = ""  # why a preemption that would make room is not made
            if fit is None:
                options = []
                for candidate in state.pools_by_flavor[run.flavor]:
                    found = state.victims(run, candidate)
                    if found is not None:
                        chosen, where = found
                        why = state.stolen(candidate, chosen, snapshot.outside)
                        if why:
                            stolen = stolen or why
                            continue
                        cost = (sum(v.gpus for v in chosen), len(chosen), candidate.cluster)
                        options.append((cost, candidate, chosen, where))
                if options:
                    _, pool, victims, where = min(options, key=lambda option: option[0])
                    fit = (pool, where)
            if fit is None:
                block(key, run, Wait.CAPACITY, stolen or partial(capacity_reason, run))
                state.reserve(run, reservations)
                continue
            pool, where = fit
            for victim in victims:
                state.preempt(victim)
                preempted.append(
                    Preempt(
                        run_id=victim.id,
                        by_run_id=run.id,
                        message=(
                            f"a tenant within its guarantee reclaimed {run.gpus} {run.flavor} "
                            f"GPUs on {pool.cluster}; this run had borrowed {victim.gpus}"
                        ),
                        detail=(
                            f"tenant {run.tenant} reclaimed {run.gpus} {run.flavor} GPUs of its "
                            f"guarantee on {pool.cluster} for run {run.id}; this run had borrowed "
                            f"{victim.gpus}"
                        ),
                    )
                )
            state.admit(run, pool, where)
            admitted.append(
                Admit(run.id, pool.cluster, borrowed=False, over_budget=over_budget,
                      nodes=where.nodes)
            )  # fmt: skip
        returned = {
            key: index
            for key, index in borrowers.items()
            if state.usage[key] + queues[key][index].gpus <= snapshot.quotas[key].guaranteed
        }
        for key in returned:
            del borrowers[key]
        pending = sorted(
            (run for key, index in returned.items() for run in queues[key][index:]),
            key=queue_order,
        )

    # Phase 2: borrowers take turns by weighted fair share, free GPUs only.
    def share_key(key: tuple[str, str]) -> tuple[float, float, tuple[int, float, int]]:
        weight = snapshot.quotas[key].weight or 1
        return (
            snapshot.decayed_usage.get(key, 0.0) / weight,
            state.usage[key] / weight,
            queue_order(queues[key][borrowers[key]]),
        )

    heap = [(share_key(key), key) for key in sorted(borrowers)]
    heapq.heapify(heap)
    while heap:
        _, key = heapq.heappop(heap)
        run = queues[key][borrowers[key]]
        quota, over_budget = precheck(key, run)
        if quota is None:
            continue
        tenant, flavor = key
        in_use = state.usage[key]
        if in_use + run.gpus > quota.guaranteed + quota.borrow_limit:
            usage = usage_of(tenant, flavor, in_use, quota.guaranteed)
            if quota.borrow_limit == 0:
                block(
                    key, run, Wait.QUOTA,
                    f"{usage} and may not borrow; this run needs {run.gpus}",
                )  # fmt: skip
            else:
                block(
                    key, run, Wait.BORROW_LIMIT,
                    f"tenant {tenant} uses {in_use} of {quota.guaranteed} guaranteed + "
                    f"{quota.borrow_limit} borrowable {flavor} GPUs; this run needs {run.gpus}",
                )  # fmt: skip
            continue
        fit = state.best_fit(run)
        if fit is None:
            usage = usage_of(tenant, flavor, in_use, quota.guaranteed)
            block(key, run, Wait.NO_IDLE, partial(borrow_reason, run, usage))
            state.reserve(run, reservations)  # binds the borrowers after it
            continue
        pool, where = fit
        state.admit(run, pool, where)
        admitted.append(
            Admit(run.id, pool.cluster, borrowed=in_use + run.gpus > quota.guaranteed,
                  over_budget=over_budget, nodes=where.nodes)
        )  # fmt: skip
        borrowers[key] += 1
        if borrowers[key] < len(queues[key]):
            heapq.heappush(heap, (share_key(key), key))

    # Everything not admitted waits: behind its head, or for the head's own reason.
    admitted_ids = {a.run_id for a in admitted}
    positions: dict[str, int] = defaultdict(int)
    waiting = []
    for run in order:
        if run.id in admitted_ids:
            continue
        positions[run.flavor] += 1
        reason, message = waits.get(run.id) or (
            Wait.BEHIND_HEAD,
            f"waiting behind run {blocked.get((run.tenant, run.flavor), '?')} of tenant "
            f"{run.tenant}, which is first in line for {run.flavor} (priority, then "
            "submission order)",
        )
        if not explain:
            message = ""
        elif callable(message):
            message = message()
        waiting.append(Waiting(run.id, reason, message, positions[run.flavor]))
    return Decisions(
        admitted=tuple(admitted),
        preempted=tuple(preempted),
        waiting=tuple(waiting),
        reservations=tuple(reservations),
    )


def held_placements(snapshot: Snapshot) -> dict[int, dict[str, int]]:
    """run id -> node -> GPUs, for every held run on a known cluster: where it holds GPUs,
    as admission counts it (a run with unknown nodes where ``HeldRun`` says it is assumed)."""
    return _State(snapshot).held_on


def free_gpus(snapshot: Snapshot) -> dict[str, int]:
    """Free GPUs per flavor, as admission counts them: on nodes that take work, less what
    Gantry's held runs hold there and what jobs from outside Gantry use."""
    state = _State(snapshot)
    free: dict[str, int] = defaultdict(int)
    for (_, flavor), pool in state.pools.items():
        for name, node in pool.nodes.items():
            if node.schedulable:
                free[flavor] += pool.available(name)
    return dict(free)


def fair_share_decayed(
    usage: float, *, gpus_held: int, elapsed_s: float, half_life_s: float
) -> float:
    """Usage ``elapsed_s`` later: the old usage decayed, plus the GPUs held meanwhile, each
    second of it decayed by its own age (the integral, not a sum over cycles). So one update
    over an interval equals any number of updates over its parts: the value does not depend
    on how often admission runs, nor on a midnight or a month end between two cycles."""
    time_constant = half_life_s / math.log(2)
    kept = math.exp(-elapsed_s / time_constant)
    return usage * kept + gpus_held * time_constant * -math.expm1(-elapsed_s / time_constant)
