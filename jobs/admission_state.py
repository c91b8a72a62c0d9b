"""The clusters as an admission cycle goes (``jobs.admission``): every pool's state, each
tenant's usage, where held runs hold GPUs; the best fit, the victims of a reclaim, the
reservation of a starving run, and why a run has no placement."""

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import cast

from clusters.outside_claims import OutsideQueue
from jobs import placement
from jobs.admission_pool import PoolState
from jobs.admission_types import (
    ClusterNode,
    HeldRun,
    QueuedRun,
    Reservation,
    Snapshot,
    victim_order,
)
from jobs.reclaim import outside_taker, stolen_reason


def _tightness(where: placement.Placement) -> tuple[int, ...]:
    """Smaller is tighter: the deepest shared domain. The placements of one run are all on
    one node or all on several (``jobs.placement``: one node exactly when the gang has one),
    and one node is as tight as can be: those have nothing to compare."""
    return () if where.single_node else (-len(where.domain),)


class CycleState:
    """The clusters as the cycle goes: placements, usage, borrowed runs, reservations."""

    def __init__(self, snapshot: Snapshot):
        by_pool: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
        for node in snapshot.nodes:
            by_pool[(node.cluster, node.flavor)].append(node)
        self.pools = {
            key: PoolState(*key, nodes, tuple(snapshot.levels.get(key[0], ())))
            for key, nodes in sorted(by_pool.items())
        }
        self.pools_by_flavor: dict[str, list[PoolState]] = defaultdict(list)
        self.flavor_versions: dict[str, list[int]] = defaultdict(lambda: [0])
        self.flavor_gives: dict[str, list[int]] = defaultdict(lambda: [0])
        for (_, flavor), flavor_pool in self.pools.items():
            self.pools_by_flavor[flavor].append(flavor_pool)
            flavor_pool.flavor_version = self.flavor_versions[flavor]
            flavor_pool.flavor_gives = self.flavor_gives[flavor]
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.held_on: dict[int, dict[str, int]] = {}  # run id -> node -> GPUs
        self.pool_of: dict[int, PoolState] = {}  # run id -> the pool it holds GPUs in
        # run id -> when it frees its GPUs at the latest (None: no bound), for backfill.
        self.latest_end: dict[int, float | None] = {}
        unplaced: list[tuple[PoolState, HeldRun]] = []
        for run in sorted(snapshot.held, key=lambda r: (r.admitted, r.id)):
            self.usage[(run.tenant, run.flavor)] += run.gpus
            self.latest_end[run.id] = run.latest_end
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
        self.start_grace_s = snapshot.start_grace_s
        self.starvation_after_s = snapshot.starvation_after_s
        # Answers by the shape asked about and the pools' versions (``shape``).
        self.answers: dict[tuple[object, ...], object] = {}

    def _hold(self, pool: PoolState, run_id: int, on: dict[str, int], admitted: float) -> None:
        self.held_on[run_id] = on
        self.pool_of[run_id] = pool
        pool.holders.add(run_id)
        for name, gpus in on.items():
            pool.take(name, gpus)
            if name in pool.nodes:
                pool.entered[name] = max(pool.entered.get(name, -math.inf), admitted)

    def shape(self, run: QueuedRun) -> tuple[object, ...]:
        """What a placement question about ``run`` depends on: its shape and the state of
        the clusters with its flavor (every pool's version)."""
        return (
            run.flavor,
            run.nodes,
            run.gpus_per_node,
            run.topology_level if run.topology_required else None,
            run.excluded,
            self.flavor_versions[run.flavor][0],
        )

    def best_fit(self, run: QueuedRun) -> tuple[PoolState, placement.Placement] | None:
        """Where the gang fits on available GPUs: the tightest placement, then the one that
        leaves the least behind, then the cluster's name. Runs of one shape asked about
        while nothing changed share the answer."""
        shape = self.shape(run)
        key = ("best_fit", *shape)
        if key not in self.answers:
            # A shape that fitted nowhere fits nowhere until GPUs become available again.
            nowhere = ("nowhere", *shape[:-1], self.flavor_gives[run.flavor][0])
            if nowhere in self.answers:
                return None
            self.answers[key] = self._best_fit(run)
            if self.answers[key] is None:
                self.answers[nowhere] = True
        return cast(tuple[PoolState, placement.Placement] | None, self.answers[key])

    def _best_fit(self, run: QueuedRun) -> tuple[PoolState, placement.Placement] | None:
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
        self, run: QueuedRun, pool: PoolState
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

    def admit(self, run: QueuedRun, pool: PoolState, where: placement.Placement) -> None:
        self._hold(pool, run.id, dict.fromkeys(where.nodes, run.gpus_per_node), self.now)
        self.usage[(run.tenant, run.flavor)] += run.gpus
        self.latest_end[run.id] = self.ends_by(run)

    def ends_by(self, run: QueuedRun) -> float | None:
        """When ``run``, admitted now, frees its GPUs at the latest (None: no bound)."""
        if run.max_runtime_s is None:
            return None
        return self.now + self.start_grace_s + run.max_runtime_s

    def stolen(
        self, pool: PoolState, victims: list[HeldRun], outside: Mapping[str, OutsideQueue]
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
        del self.pool_of[victim.id]
        pool.holders.discard(victim.id)
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
        key = ("explain", *self.shape(run))
        if key not in self.answers:
            self.answers[key] = self._explain(run)
        return cast(str, self.answers[key])

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
