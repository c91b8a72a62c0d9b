"""The baseline admitter: the admission rules re-implemented the straightforward way.

It follows the rules of ``jobs.admission`` (design §5), nodes included, but keeps no derived
state. Whenever it needs a tenant's usage, the free GPUs on a pool's nodes, the borrowed
runs it could preempt or a quota, it asks a ledger, which works the answer out from
scratch: ``MemoryLedger`` by re-scanning the list of runs that hold GPUs,
``bench.cycle.DbLedger`` by querying the database. Only the node inventory is read once,
as capacity was before nodes. Where a gang fits on given free GPUs is ``jobs.placement``'s
answer for both admitters: it is the placement rule itself, not admission's bookkeeping.
The benchmarks assert that it reaches exactly the decisions of ``jobs.admission.decide``,
placements and reservations included; only the cost differs.
"""

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from jobs import placement
from jobs.admission_types import (
    ClusterNode,
    Decisions,
    HeldRun,
    QueuedRun,
    Quota,
    Snapshot,
    Wait,
    queue_order,
    victim_order,
)

Key = tuple[str, str]  # (tenant, flavor)


@dataclass(frozen=True)
class Outcome:
    """Decisions in a form both admitters produce, for an equality check."""

    # run, cluster, nodes, borrowed, over budget
    admitted: tuple[tuple[int, str, tuple[str, ...], bool, bool], ...]
    preempted: tuple[tuple[int, int], ...]  # victim, for which run
    waiting: tuple[tuple[int, str, int], ...]  # run, reason, position
    reservations: tuple[tuple[int, str, int, tuple[str, ...]], ...]  # run, cluster, GPUs, nodes


def outcome_of(decisions: Decisions) -> Outcome:
    return Outcome(
        admitted=tuple(
            (a.run_id, a.cluster, a.nodes, a.borrowed, a.over_budget) for a in decisions.admitted
        ),
        preempted=tuple((p.run_id, p.by_run_id) for p in decisions.preempted),
        waiting=tuple((w.run_id, w.reason.value, w.position) for w in decisions.waiting),
        reservations=tuple((r.run_id, r.cluster, r.gpus, r.nodes) for r in decisions.reservations),
    )


@dataclass(frozen=True)
class NodePool:
    """One cluster's nodes of one flavor (by name) and the cluster's topology levels."""

    cluster: str
    flavor: str
    nodes: tuple[ClusterNode, ...]
    levels: tuple[str, ...]


@dataclass(frozen=True)
class Holding:
    """A run that holds GPUs, and how many on each node."""

    run: HeldRun
    on: Mapping[str, int]


def node_pools(nodes: Iterable[ClusterNode], levels: Mapping[str, tuple[str, ...]]):
    """flavor -> its pools, by cluster name."""
    members: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
    for node in nodes:
        members[(node.cluster, node.flavor)].append(node)
    pools: dict[str, list[NodePool]] = defaultdict(list)
    for (cluster, flavor), found in sorted(members.items()):
        pools[flavor].append(
            NodePool(
                cluster,
                flavor,
                tuple(sorted(found, key=lambda n: n.name)),
                tuple(levels.get(cluster, ())),
            )
        )
    return pools


def equal_shares(run: HeldRun) -> dict[str, int]:
    """A run's GPUs over its nodes, each an equal share (the remainder to the first names)."""
    share, extra = divmod(run.gpus, len(run.nodes))
    return {name: share + (index < extra) for index, name in enumerate(sorted(run.nodes))}


def assumed_nodes(held: Iterable[HeldRun], nodes: Iterable[ClusterNode]) -> dict[int, dict]:
    """Where the held runs whose nodes are unknown hold their GPUs, as admission assumes it
    when it reads the snapshot: on the nodes with the most free GPUs once the runs with
    known nodes are counted, the oldest such run first. Fixed for the cycle."""
    free: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for node in nodes:
        free[(node.cluster, node.flavor)][node.name] = node.gpus - node.outside
    unknown = []
    for run in held:
        pool = free.get((run.cluster, run.flavor))
        if pool is None:
            continue
        if not run.nodes:
            unknown.append(run)
            continue
        for name, gpus in equal_shares(run).items():
            if name in pool:
                pool[name] -= gpus
    assumed = {}
    for run in sorted(unknown, key=lambda r: (r.admitted, r.id)):
        pool = free[(run.cluster, run.flavor)]
        on, left = {}, run.gpus
        for name in sorted(pool, key=lambda n: (-pool[n], n)):
            if left <= 0:
                break
            taken = min(left, max(0, pool[name]))
            if taken:
                on[name] = taken
                left -= taken
        for name, gpus in on.items():
            pool[name] -= gpus
        assumed[run.id] = on
    return assumed


class Ledger(Protocol):
    def pools(self, flavor: str) -> list[NodePool]: ...  # ordered by cluster name
    def quota(self, key: Key) -> Quota | None: ...
    def budget_used(self, key: Key) -> float: ...
    def usage(self, key: Key) -> int: ...
    def holdings(self, flavor: str) -> dict[str, list[Holding]]: ...  # by cluster
    def preempted(self) -> list[Holding]: ...  # this cycle's victims: they did enter nodes
    def shares(self) -> dict[Key, tuple[float, int, int]]: ...  # decayed, usage, weight
    def admit(
        self, run: QueuedRun, pool: NodePool, nodes: tuple[str, ...], *, borrowed: bool,
        over_budget: bool,
    ) -> None: ...  # fmt: skip
    def preempt(self, victim: Holding, *, by: QueuedRun) -> None: ...


class MemoryLedger:
    """Answers every question by re-scanning the runs that hold GPUs."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.node_pools = node_pools(snapshot.nodes, snapshot.levels)
        assumed = assumed_nodes(snapshot.held, snapshot.nodes)
        self.held = [
            Holding(run, equal_shares(run) if run.nodes else assumed.get(run.id, {}))
            for run in snapshot.held
        ]
        self.gone: list[Holding] = []  # preempted this cycle: they did enter their nodes

    def pools(self, flavor: str) -> list[NodePool]:
        return self.node_pools.get(flavor, [])

    def quota(self, key: Key) -> Quota | None:
        return self.snapshot.quotas.get(key)

    def budget_used(self, key: Key) -> float:
        return self.snapshot.budget_used.get(key, 0.0)

    def usage(self, key: Key) -> int:
        return sum(h.run.gpus for h in self.held if (h.run.tenant, h.run.flavor) == key)

    def holdings(self, flavor: str) -> dict[str, list[Holding]]:
        found: dict[str, list[Holding]] = defaultdict(list)
        for h in self.held:
            if h.run.flavor == flavor:
                found[h.run.cluster].append(h)
        return found

    def shares(self) -> dict[Key, tuple[float, int, int]]:
        usage: dict[Key, int] = defaultdict(int)
        for h in self.held:
            usage[(h.run.tenant, h.run.flavor)] += h.run.gpus
        return {
            key: (self.snapshot.decayed_usage.get(key, 0.0), usage[key], quota.weight)
            for key, quota in self.snapshot.quotas.items()
        }

    def admit(
        self, run: QueuedRun, pool: NodePool, nodes: tuple[str, ...], *, borrowed: bool,
        over_budget: bool,
    ) -> None:  # fmt: skip
        held = HeldRun(
            run.id, run.tenant, run.flavor, pool.cluster, run.gpus, run.priority,
            self.snapshot.now, borrowed, nodes,
        )  # fmt: skip
        self.held.append(Holding(held, dict.fromkeys(nodes, run.gpus_per_node)))

    def preempt(self, victim: Holding, *, by: QueuedRun) -> None:
        self.held = [h for h in self.held if h.run.id != victim.run.id]
        self.gone.append(victim)

    def preempted(self) -> list[Holding]:
        return list(self.gone)


def tightness(where: placement.Placement) -> tuple[int, int]:
    """Smaller is tighter: one node, then the deepest shared domain."""
    return (0, 0) if where.single_node else (1, -len(where.domain))


def required_level(run: QueuedRun, pool: NodePool) -> int | None:
    """The depth the gang must share (None: anywhere); -1: the cluster lacks the level."""
    if not run.topology_required or not run.topology_level:
        return None
    if run.topology_level not in pool.levels:
        return -1
    return pool.levels.index(run.topology_level) + 1


def naive_decide(
    queued: tuple[QueuedRun, ...], ledger: Ledger, *, now: float, starvation_after_s: float
) -> Outcome:
    order = sorted(queued, key=queue_order)
    queues: dict[Key, list[QueuedRun]] = defaultdict(list)
    for run in order:
        queues[(run.tenant, run.flavor)].append(run)
    blocked: set[Key] = set()
    waits: dict[int, str] = {}
    borrowers: dict[Key, int] = {}  # key -> index of the run it borrows for next
    admitted: list[tuple[int, str, tuple[str, ...], bool, bool]] = []
    preempted: list[tuple[int, int]] = []
    reservations: list[tuple[int, str, int, tuple[str, ...]]] = []
    reserved: dict[tuple[str, str], int] = defaultdict(int)  # (cluster, node) -> GPUs held
    fenced: set[tuple[str, str]] = set()  # nodes a starving run waits on: no reclaiming there

    def block(key: Key, run: QueuedRun, reason: Wait) -> None:
        blocked.add(key)
        waits[run.id] = reason.value

    def precheck(key: Key, run: QueuedRun) -> tuple[Quota | None, bool]:
        quota = ledger.quota(key)
        if quota is None or quota.guaranteed + quota.borrow_limit == 0:
            block(key, run, Wait.NO_QUOTA)
            return None, False
        if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
            block(key, run, Wait.TOO_LARGE)
            return None, False
        budget = quota.budget_gpu_hours
        if budget is not None and ledger.budget_used(key) >= budget:
            if quota.budget_hard:
                block(key, run, Wait.BUDGET_EXHAUSTED)
                return None, False
            return quota, True
        return quota, False

    def unheld(pool: NodePool, holdings: dict[str, list[Holding]]) -> dict[str, int]:
        """Per node: its GPUs less outside load and Gantry's runs there (below 0 when
        over-committed)."""
        used: dict[str, int] = defaultdict(int)
        for h in holdings.get(pool.cluster, []):
            for name, gpus in h.on.items():
                used[name] += gpus
        return {n.name: n.gpus - n.outside - used[n.name] for n in pool.nodes}

    def available(pool: NodePool, holdings: dict[str, list[Holding]]) -> dict[str, int]:
        """Per node: the GPUs a run may take, reservations for starving runs taken off."""
        free = unheld(pool, holdings)
        return {name: max(0, gpus - reserved[(pool.cluster, name)]) for name, gpus in free.items()}

    def place(
        run: QueuedRun, pool: NodePool, free: dict[str, int], freed: Mapping[str, int] | None = None
    ) -> placement.Placement | None:
        """``free``: what ``unheld`` says; ``freed``: GPUs its preempted runs would give back."""
        level = required_level(run, pool)
        if level == -1:
            return None
        freed = freed or {}
        view = [
            placement.Node(
                n.name, n.gpus,
                max(0, free[n.name] + freed.get(n.name, 0) - reserved[(pool.cluster, n.name)]),
                n.schedulable, n.path,
            )
            for n in pool.nodes
        ]  # fmt: skip
        return placement.place(view, placement.Gang(run.nodes, run.gpus_per_node, level))

    def best_fit(run: QueuedRun) -> tuple[NodePool, placement.Placement] | None:
        holdings = ledger.holdings(run.flavor)
        best, best_rank = None, None
        for pool in ledger.pools(run.flavor):
            where = place(run, pool, unheld(pool, holdings))
            if where is None:
                continue
            free = available(pool, holdings)
            left = sum(free[name] - run.gpus_per_node for name in where.nodes)
            rank = (tightness(where), left, pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, where), rank
        return best

    def victims(
        run: QueuedRun, pool: NodePool, holdings: list[Holding]
    ) -> tuple[list[Holding], placement.Placement] | None:
        """Borrowed runs of others on ``pool`` (``holdings``: the runs holding GPUs there)
        whose preemption places ``run``."""
        if required_level(run, pool) == -1:
            return None
        free = unheld(pool, {pool.cluster: holdings})
        candidates = sorted(
            (
                h
                for h in holdings
                if h.run.borrowed
                and h.run.tenant != run.tenant
                and not any((pool.cluster, name) in fenced for name in h.on)
            ),
            key=lambda h: victim_order(h.run),
        )
        chosen: list[Holding] = []
        freed: dict[str, int] = defaultdict(int)
        where = None
        for h in candidates:
            chosen.append(h)
            for name, gpus in h.on.items():
                freed[name] += gpus
            where = place(run, pool, free, freed)
            if where is not None:
                break
        if where is None:
            return None
        for h in reversed(chosen[:-1]):
            without = dict(freed)
            for name, gpus in h.on.items():
                without[name] -= gpus
            trimmed = place(run, pool, free, without)
            if trimmed is not None:
                chosen.remove(h)
                freed, where = without, trimmed
        return chosen, where

    def entered(pool: NodePool, holdings: dict[str, list[Holding]]) -> dict[str, float]:
        """Per node of ``pool``: when the latest run that holds or held GPUs on it this
        cycle was admitted."""
        latest: dict[str, float] = {}
        names = {n.name for n in pool.nodes}
        for h in holdings.get(pool.cluster, []) + [
            h
            for h in ledger.preempted()
            if (h.run.cluster, h.run.flavor) == (pool.cluster, pool.flavor)
        ]:
            for name in h.on:
                if name in names:
                    latest[name] = max(latest.get(name, -math.inf), h.run.admitted)
        return latest

    def closest_nodes(
        run: QueuedRun, pool: NodePool, free: dict[str, int], since: float, latest: dict
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        """The nodes that could ever hold the gang (GPUs besides the outside load), in one
        domain of its level, not fenced: the fewest entered ``since``, then the most of
        what it needs available now; with that rank."""
        level = required_level(run, pool)
        if level == -1:
            return None
        domains: dict[tuple[str, ...], list[tuple[bool, int, str]]] = defaultdict(list)
        for node in pool.nodes:
            if (
                not node.schedulable
                or node.gpus - node.outside < run.gpus_per_node
                or (pool.cluster, node.name) in fenced
            ):
                continue
            if level is not None and len(node.path) < level:
                continue
            domain = node.path[:level] if level else ()
            touched = latest.get(node.name, -math.inf) >= since
            domains[domain].append((touched, -min(free[node.name], run.gpus_per_node), node.name))
        best = None
        for domain in sorted(domains):
            ranked = sorted(domains[domain])[: run.nodes]
            if len(ranked) < run.nodes:
                continue
            rank = (sum(t for t, _, _ in ranked), sum(minus for _, minus, _ in ranked))
            if best is None or rank < best[1]:
                best = (tuple(sorted(name for _, _, name in ranked)), rank)
        return best

    def reserve(run: QueuedRun) -> None:
        starving_since = run.submitted + starvation_after_s
        if now < starving_since:
            return
        holdings = ledger.holdings(run.flavor)
        best, best_rank = None, None
        for pool in ledger.pools(run.flavor):
            free = available(pool, holdings)
            found = closest_nodes(run, pool, free, starving_since, entered(pool, holdings))
            if found is None:
                continue
            target, (touched, short) = found
            rank = (touched, short, pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, target, free), rank
        if best is None:
            return
        pool, target, free = best
        held = 0
        for name in target:
            fenced.add((pool.cluster, name))
            gpus = min(free[name], run.gpus_per_node)
            if gpus:
                reserved[(pool.cluster, name)] += gpus
                held += gpus
        if held:
            reservations.append((run.id, pool.cluster, held, target))

    def admit(run: QueuedRun, pool: NodePool, where: placement.Placement, borrowed, over_budget):
        ledger.admit(run, pool, where.nodes, borrowed=borrowed, over_budget=over_budget)
        admitted.append((run.id, pool.cluster, where.nodes, borrowed, over_budget))

    # Phase 1: runs within their tenant's guarantee, preempting borrowed runs if need be;
    # again for tenants that preemptions brought back within their guarantee.
    pending = order
    while pending:
        for run in pending:
            key = (run.tenant, run.flavor)
            if key in blocked or key in borrowers:
                continue
            quota, over_budget = precheck(key, run)
            if quota is None:
                continue
            if ledger.usage(key) + run.gpus > quota.guaranteed:
                borrowers[key] = queues[key].index(run)
                continue
            fit = best_fit(run)
            chosen: list[Holding] = []
            if fit is None:
                options = []
                holdings = ledger.holdings(run.flavor)
                for candidate in ledger.pools(run.flavor):
                    found = victims(run, candidate, holdings.get(candidate.cluster, []))
                    if found is not None:
                        gpus = sum(h.run.gpus for h in found[0])
                        cost = (gpus, len(found[0]), candidate.cluster)
                        options.append((cost, candidate, found))
                if options:
                    _, pool, (chosen, where) = min(options, key=lambda option: option[0])
                    fit = (pool, where)
            if fit is None:
                block(key, run, Wait.CAPACITY)
                reserve(run)
                continue
            for victim in chosen:
                ledger.preempt(victim, by=run)
                preempted.append((victim.run.id, run.id))
            admit(run, *fit, borrowed=False, over_budget=over_budget)
        returned = {}
        for key, index in borrowers.items():
            quota = ledger.quota(key)
            head = queues[key][index]
            if quota is not None and ledger.usage(key) + head.gpus <= quota.guaranteed:
                returned[key] = index
        for key in returned:
            del borrowers[key]
        pending = sorted(
            (run for key, index in returned.items() for run in queues[key][index:]),
            key=queue_order,
        )

    # Phase 2: borrowers in turn, least weighted fair-share usage first, free GPUs only.
    active = set(borrowers)
    while active:
        shares = ledger.shares()

        def share(key: Key, shares=shares) -> tuple:
            decayed, usage, weight = shares[key]
            head = queues[key][borrowers[key]]
            return (decayed / (weight or 1), usage / (weight or 1), queue_order(head), key)

        key = min(active, key=share)
        run = queues[key][borrowers[key]]
        quota, over_budget = precheck(key, run)
        if quota is None:
            active.discard(key)
            continue
        in_use = shares[key][1]
        if in_use + run.gpus > quota.guaranteed + quota.borrow_limit:
            block(key, run, Wait.QUOTA if quota.borrow_limit == 0 else Wait.BORROW_LIMIT)
            active.discard(key)
            continue
        fit = best_fit(run)
        if fit is None:
            block(key, run, Wait.NO_IDLE)
            reserve(run)
            active.discard(key)
            continue
        admit(run, *fit, borrowed=in_use + run.gpus > quota.guaranteed, over_budget=over_budget)
        borrowers[key] += 1
        if borrowers[key] == len(queues[key]):
            active.discard(key)

    admitted_ids = {run_id for run_id, *_ in admitted}
    positions: dict[str, int] = defaultdict(int)
    waiting = []
    for run in order:
        if run.id not in admitted_ids:
            positions[run.flavor] += 1
            reason = waits.get(run.id, Wait.BEHIND_HEAD.value)
            waiting.append((run.id, reason, positions[run.flavor]))
    return Outcome(tuple(admitted), tuple(preempted), tuple(waiting), tuple(reservations))
