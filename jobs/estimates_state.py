"""The clusters as the start-estimate simulation (``jobs.estimates``) moves them forward, and
its admission cycle: the decisions ``jobs.admission.decide`` would take there, at a
fraction of the cost (pure: no ORM, no clock, no I/O).

``decide`` builds the clusters' state from every held run, walks every queued run it is
given and reserves nodes for every starving head it meets. The simulation asks for a cycle
up to a few hundred times per refresh, on clusters that change little from one simulated
cycle to the next, with most heads starving and most lines held back by their tenant's
quota. Here the cycle is ``jobs.admission``'s own (its phases and rules, run on the state
given: ``_LazyCycle``), with differences that change no decision (tests/jobs/
test_estimates_incremental.py checks the forecasts against the simulation before them,
bench/estimates_reference.py, on random snapshots):

- The state after the held runs is kept (``Clusters``): a run that starts or ends changes
  it on its own nodes only. Each cycle works on a copy of the pools of its flavor
  (``Clusters.cycle_state``, ``jobs.estimates_pool.SimPool``), and on the kept usage,
  placements and latest ends themselves, what it changes there undone after it, as
  ``decide`` works on a snapshot of the flavors whose GPUs changed hands: flavors share
  nothing in admission, so each is decided on its own (``decide_flavor``).
- A line whose first run waits whatever the clusters do and changes nothing in the cycle
  (no quota, a spent hard budget, too large with no later run allowed to pass it, the
  tenant at its guarantee plus borrow limit) is not walked
  (``jobs.estimates_lines.held_back``), and a line whose first run borrows is known to
  before phase 1 comes to it. Only a preemption in the cycle could lower such a tenant's
  usage: then the cycle is decided again with every line as it is (rare). What is found
  of a line is kept until its first run or its tenant's usage changes.
- A line is walked only as far as the cycle gets (a blocked run holds its tenant's later
  ones back), not sorted from a queue again. Where a head may be passed (a line whose
  tenant's policy is not ``strict``) admission goes on behind it: there each line is
  given as before, its first runs (``jobs.estimates_lines.Lines.front``), more when they
  were all admitted (``Lines.deepen``), and the cycle decided again.
- A starving head's reservation is made only once something asks about its flavor's nodes
  that it could change (``LazyState``): a placement or a reclaim that exists without it,
  an admission, a preemption, a backfill plan. A reservation only takes (it holds free GPUs
  back and fences nodes against reclaims), so a gang with no placement, or no reclaim,
  while the pending reservations are left out has none with them either: that answer
  stands. Other questions are answered once they are made, in their order, on the state
  they would have been made on (nothing of the flavor changed meanwhile); a placement
  question, once enough of them are made for it to have no answer (the best fit found
  again only when one held back GPUs of the placement found, and once at the end).
  Reservations still pending when the cycle ends change nothing the simulation reads:
  never made. A starving run's closest nodes are looked for first in the cluster it
  reserved on last, so that fewer others need be asked (the best of all is taken).
- Only what the simulation reads is returned: the admissions and preemptions, and why the
  first run of each line waits.
"""

import heapq
from bisect import insort
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import replace
from typing import Any, cast

from jobs import placement
from jobs.admission import _Cycle
from jobs.admission_pool import PoolState
from jobs.admission_state import CycleState
from jobs.admission_types import (
    Admit,
    Decisions,
    HeldRun,
    QueuedRun,
    Quota,
    Reservation,
    Snapshot,
    Wait,
    queue_order,
    victim_order,
)
from jobs.backfill import Plan
from jobs.estimates_lines import Lines, held_back, index_of
from jobs.estimates_pool import SimPool

Key = tuple[str, str]  # (tenant, flavor)
_ABSENT = object()  # no entry at that key (``LazyState.restore``)


class LazyState(CycleState):
    """The state of one simulated cycle, whose starving heads' reservations wait until
    something they could change is asked (see the module's docstring)."""

    pending: dict[str, list[QueuedRun]]  # flavor -> starving heads, in the cycle's order
    # ``_fit``'s answers: shape -> (the flavor's version, the best fit then); and shape ->
    # the flavor's count of GPUs made available when it last fitted nowhere.
    fits: dict[tuple[object, ...], tuple[int, tuple[PoolState, placement.Placement] | None]]
    nowhere: dict[tuple[object, ...], int]
    sim_pools: dict[str, list[SimPool]]  # ``pools_by_flavor`` (every pool is a ``SimPool``)
    # run id -> the cluster of its latest reservation: kept from cycle to cycle (``Clusters``)
    reserved_on: dict[int, str]
    # The usage, placements and latest ends are the kept ones (``Clusters.base``'s): each
    # change the cycle makes to them (table, key, what it held), undone after it.
    undo: list[tuple[dict[Any, Any], object, object]]

    def _best_fit(self, run: QueuedRun) -> tuple[PoolState, placement.Placement] | None:
        """``CycleState._best_fit``; for a one-node gang, the pools' best nodes compared as
        it compares them (all as tight: the fewest GPUs left, then the cluster)."""
        if run.nodes != 1 or run.gpus_per_node < 1:
            return super()._best_fit(run)
        if not run.excluded and not (run.topology_required and run.topology_level):
            return self._best_node(run.flavor, run.gpus_per_node)
        best, best_rank = None, None
        for pool in self.pools_by_flavor[run.flavor]:
            where = pool.place(run)
            if where is None:
                continue
            rank = (pool.available(where.nodes[0]) - run.gpus_per_node, pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, where), rank
        return best

    def _best_node(self, flavor: str, need: int) -> tuple[PoolState, placement.Placement] | None:
        """The best fit of a one-node gang of ``need`` GPUs that may go on any node: of all
        the pools' nodes, the fewest GPUs available that are enough, then the cluster, then
        the node's name (``SimPool.place``'s order within a pool)."""
        found: tuple[tuple[int, str, str], SimPool] | None = None
        for pool in self.sim_pools[flavor]:  # in the clusters' order
            nodes = pool.nodes
            for name, room in pool.opened.items():
                if room >= need and nodes[name].gpus >= need:
                    rank = (room, pool.cluster, name)
                    if found is None or rank < found[0]:
                        found = (rank, pool)
            if found is not None and found[0][0] == need:
                break  # no fit is tighter, and the pools after rank after this one
        if found is None:
            return None
        (_, _, name), pool = found
        return pool, placement.Placement(
            nodes=(name,), domain=pool.nodes[name].path, single_node=True
        )

    def reserve(self, run: QueuedRun, reservations: list[Reservation]) -> None:
        if self.now < run.submitted + self.starvation_after_s:
            return  # not starving: ``CycleState.reserve`` holds nothing for it either
        self.pending[run.flavor].append(run)

    def settle(self, flavor: str) -> None:
        """Make the reservations pending on ``flavor``, in their order."""
        waiting = self.pending.pop(flavor, None)
        for run in waiting or ():
            self._reserve_now(run)

    def _reserve_now(self, run: QueuedRun) -> tuple[PoolState, list[str]] | None:
        """``CycleState.reserve`` for a starving run, the same nodes held: a pool is asked
        for its closest nodes only if it could rank before the best found so far. The pool
        and the nodes whose GPUs it held back, if any (a fence changes no placement)."""
        since = run.submitted + self.starvation_after_s
        best: tuple[SimPool, tuple[str, ...]] | None = None
        best_rank: tuple[int, int, str] | None = None
        # The best rank of all (the cluster breaks ties), whatever order the pools are
        # asked in: first the cluster the run reserved on last (in an earlier cycle), most
        # often the best again, so that fewer others are asked; one that could not rank
        # before the best found is not.
        pools = self.sim_pools[run.flavor]
        last = self.reserved_on.get(run.id)
        if last is not None:
            pools = sorted(pools, key=lambda pool: pool.cluster != last)
        for pool in pools:
            if best_rank is not None:
                if not pool.opened:
                    if best_rank <= (0, 0, pool.cluster):
                        continue  # it ranks (0, 0, its cluster) at best
                elif not pool.could_beat(run.nodes, run.gpus_per_node, since, best_rank):
                    continue
            found = pool.closest(run, since)
            if found is None:
                continue
            target, (entered, short) = found
            rank = (entered, short, pool.cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (pool, target), rank
        if best is None:
            return None
        pool, target = best
        self.reserved_on[run.id] = pool.cluster
        held = []
        for name in target:
            pool.fence(name)
            gpus = min(pool.available(name), run.gpus_per_node)
            if gpus:
                pool.hold(name, gpus)
                held.append(name)
        return (pool, held) if held else None

    def best_fit(self, run: QueuedRun) -> tuple[PoolState, placement.Placement] | None:
        """``CycleState.best_fit`` once the reservations pending before ``run`` are made:
        one by one, as long as it still has a placement (once it has none, the others
        cannot give it one, and stay pending). A reservation that holds no GPU of the
        placement found leaves it there: the run still has one, and the best is found
        again only once they are all made (a reservation elsewhere can change which is)."""
        found = self._fit(run)
        waiting = self.pending.get(run.flavor)
        stale = False
        while found is not None and waiting:
            held = self._reserve_now(waiting.pop(0))
            if held is None:
                continue
            pool, names = held
            if pool is found[0] and not set(names).isdisjoint(found[1].nodes):
                found, stale = self._fit(run), False
            else:
                stale = True
        return self._fit(run) if stale else found

    def _fit(self, run: QueuedRun) -> tuple[PoolState, placement.Placement] | None:
        """``CycleState.best_fit``, its answers remembered the same way (by shape, until the
        flavor's pools change; and none until GPUs become available again) in tables of
        their own, with fewer keys made per question."""
        flavor = run.flavor
        level = run.topology_level if run.topology_required else None
        shape = (flavor, run.nodes, run.gpus_per_node, level, run.excluded)
        version = self.flavor_versions[flavor][0]
        hit = self.fits.get(shape)
        if hit is not None and hit[0] == version:
            return hit[1]
        if self.nowhere.get(shape) == self.flavor_gives[flavor][0]:
            return None
        found = self._best_fit(run)
        self.fits[shape] = (version, found)
        if found is None:
            self.nowhere[shape] = self.flavor_gives[flavor][0]
        return found

    def victims(
        self, run: QueuedRun, pool: PoolState
    ) -> tuple[list[HeldRun], placement.Placement] | None:
        found = super().victims(run, pool)
        if found is None or not self.pending.get(run.flavor):
            return found
        self.settle(run.flavor)
        return super().victims(run, pool)

    def admit(self, run: QueuedRun, pool: PoolState, where: placement.Placement) -> None:
        self.settle(run.flavor)
        self._keep(self.latest_end, run.id)
        self._keep(self.usage, (run.tenant, run.flavor))
        super().admit(run, pool, where)

    def preempt(self, victim: HeldRun) -> None:
        self.settle(victim.flavor)
        self._keep(self.held_on, victim.id)
        self._keep(self.pool_of, victim.id)
        self._keep(self.usage, (victim.tenant, victim.flavor))
        super().preempt(victim)

    def _hold(self, pool: PoolState, run_id: int, on: dict[str, int], admitted: float) -> None:
        self._keep(self.held_on, run_id)
        self._keep(self.pool_of, run_id)
        super()._hold(pool, run_id, on, admitted)

    def _keep(self, table: dict[Any, Any], key: object) -> None:
        """Note what ``table`` holds at ``key`` before the cycle changes it."""
        self.undo.append((table, key, table.get(key, _ABSENT)))

    def restore(self) -> None:
        """Undo what the cycle changed of the tables it shares with ``Clusters``."""
        for table, key, before in reversed(self.undo):
            if before is _ABSENT:
                table.pop(key, None)
            else:
                table[key] = before
        self.undo.clear()

    def explain(self, run: QueuedRun) -> str:
        self.settle(run.flavor)
        return super().explain(run)

    def reclaimable(self, run: QueuedRun) -> int:
        self.settle(run.flavor)
        return super().reclaimable(run)


class _LazyCycle(_Cycle):
    """``jobs.admission``'s cycle on a ``LazyState``, over lines given as they are (not
    sorted again from a snapshot's queue, and walked only as far as a cycle gets: a
    blocked run holds its tenant's later ones back). A head's backfill reservation is
    planned on its flavor's state with the pending reservations made."""

    state: LazyState

    def __init__(
        self,
        snapshot: Snapshot,
        state: LazyState,
        lines: dict[Key, list[QueuedRun]],
        passable: set[Key],
        borrowing: AbstractSet[Key],
    ):
        super().__init__(replace(snapshot, queued=()), explain=False, state=state)
        self.queues = defaultdict(list, lines)
        self.passable = passable
        # Lines whose first run would borrow (beyond the guarantee, within the quota) as
        # phase 1 comes to it: it only takes note of them (``decide``).
        self.borrowing = borrowing

    def reservation(self, key: Key) -> Plan | str | None:
        self.state.settle(key[1])
        return super().reservation(key)

    # What follows is ``_Cycle``'s, without the messages, which a simulated cycle never
    # reads (``explain=False``), and with the pools where a run may pass its head known
    # to be none for a line that is not ``passable``.

    def passing_pools(self, run: QueuedRun) -> list[PoolState]:
        if (run.tenant, run.flavor) not in self.passable:
            return []
        return super().passing_pools(run)

    def precheck(self, key: Key, run: QueuedRun) -> tuple[Quota | None, bool]:
        quota = self.snapshot.quotas.get(key)
        if quota is None or quota.guaranteed + quota.borrow_limit == 0:
            self.block(key, run, Wait.NO_QUOTA, "")
            return None, False
        if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
            self.block(key, run, Wait.TOO_LARGE, "")
            return None, False
        budget, over_budget = quota.budget_gpu_hours, False
        if budget is not None and self.snapshot.budget_used.get(key, 0.0) >= budget:
            if quota.budget_hard:
                self.block(key, run, Wait.BUDGET_EXHAUSTED, "")
                return None, False
            over_budget = True
        return quota, over_budget

    def borrow(self, key: Key, run: QueuedRun) -> bool:
        quota, over_budget = self.precheck(key, run)
        if quota is None:
            return False
        in_use = self.state.usage[key]
        if in_use + run.gpus > quota.guaranteed + quota.borrow_limit:
            self.block(key, run, Wait.QUOTA if quota.borrow_limit == 0 else Wait.BORROW_LIMIT, "")
            return False
        fit = self.state.best_fit(run)
        if fit is None:
            self.block(key, run, Wait.NO_IDLE, "")
            self.state.reserve(run, self.reservations)
            return False
        pool, where = fit
        self.state.admit(run, pool, where)
        self.admitted.append(
            Admit(run.id, pool.cluster, borrowed=in_use + run.gpus > quota.guaranteed,
                  over_budget=over_budget, nodes=where.nodes)
        )  # fmt: skip
        return True

    def within_guarantees(self) -> None:
        """Phase 1 as ``jobs.admission`` takes it, every run in priority then FIFO order
        skipping the lines blocked or borrowing; here each line's runs are visited only
        while the one before was admitted (a heap of the lines' next runs)."""
        state, borrowers, queues = self.state, self.borrowers, self.queues
        borrowers.update(dict.fromkeys(self.borrowing, 0))
        following = [
            (queue_order(line[0]), key, 0)
            for key, line in queues.items()
            if line and key not in self.borrowing
        ]
        while following:
            heapq.heapify(following)
            while following:
                _, key, index = heapq.heappop(following)
                run = queues[key][index]
                quota, over_budget = self.precheck(key, run)
                if quota is None:
                    continue
                if state.usage[key] + run.gpus > quota.guaranteed:
                    borrowers[key] = index
                    continue
                self.admit_within_guarantee(key, run, over_budget)
                if key not in self.blocked and index + 1 < len(queues[key]):
                    heapq.heappush(following, (queue_order(queues[key][index + 1]), key, index + 1))
            returned = {
                key: index
                for key, index in borrowers.items()
                if state.usage[key] + queues[key][index].gpus
                <= self.snapshot.quotas[key].guaranteed
            }
            for key, index in returned.items():
                del borrowers[key]
                following.append((queue_order(queues[key][index]), key, index))


def decide(
    snapshot: Snapshot,
    state: LazyState,
    lines: dict[Key, list[QueuedRun]],
    passable: set[Key],
    borrowing: AbstractSet[Key] = frozenset(),
) -> tuple[Decisions, dict[Key, Wait]]:
    """What ``jobs.admission.decide(explain=False)`` decides on ``snapshot`` with ``lines``
    queued (the tenants' lines of the flavors of ``state``, in order): its admissions and
    preemptions, in its order, on ``state`` (the clusters of those flavors with the held
    runs in; it is changed), and why the first run of each line waits, by line. No
    reservations, no other waits. ``borrowing``: lines whose first run borrows, as phase 1
    would find unless a preemption lowered their tenant's usage before (then decide again
    without)."""
    cycle = _LazyCycle(snapshot, state, lines, passable, borrowing)
    cycle.within_guarantees()
    cycle.borrowers_take_turns()
    cycle.pass_waiting_heads()
    admitted = {admit.run_id for admit in cycle.admitted}
    waits = {}
    for key, line in lines.items():
        head = line[0]
        if head.id not in admitted:
            waits[key] = cycle.waits[head.id][0] if head.id in cycle.waits else Wait.BEHIND_HEAD
    decisions = Decisions(
        admitted=tuple(cycle.admitted), preempted=tuple(cycle.preempted), waiting=()
    )
    return decisions, waits


def decide_flavor(
    snapshot: Snapshot, clusters: "Clusters", lines: Lines, flavor: str, *, passable: set[Key]
) -> tuple[Decisions, dict[Key, Wait]]:
    """The decisions of one simulated cycle (at ``snapshot.now``) for ``flavor``, and why the
    first run of each of its lines that waits does: ``decide`` on the lines not held back
    (``held_back``), with the lines whose first run borrows known before. Decided again
    with every line as it is if a preemption lowered the usage of one of those (rare).
    Where a line of the flavor may pass its head, on the lines' fronts, deepened as
    needed."""
    wide = any(key[1] == flavor for key in passable)
    usage, quotas, known = clusters.base.usage, snapshot.quotas, clusters.line_states
    while True:
        given = lines.front(flavor) if wide else lines.of(flavor)
        active: dict[Key, list[QueuedRun]] = {}
        borrowing: set[Key] = set()
        waits: dict[Key, Wait] = {}
        for key, line in given.items():
            head = line[0]
            # What is found of a line depends on its first run and its tenant's usage only
            # (the quotas, budgets and policies do not change): found again when they do.
            used = usage[key]
            seen = known.get(key)
            if seen is None or seen[0] is not head or seen[1] != used:
                why = held_back(snapshot, usage, key, head, passable)
                borrows = False
                if why is None:
                    quota = quotas[key]
                    fits = quota.max_gpus_per_run is None or head.gpus <= quota.max_gpus_per_run
                    borrows = fits and used + head.gpus > quota.guaranteed
                known[key] = seen = (head, used, why, borrows)
            if seen[2] is not None:
                waits[key] = seen[2]
                continue
            active[key] = line
            if seen[3]:
                borrowing.add(key)
        state = clusters.cycle_state((flavor,), snapshot.now)
        decisions, found = decide(snapshot, state, active, passable, borrowing)
        state.restore()
        lowered = {(clusters.held[victim.run_id].tenant, flavor) for victim in decisions.preempted}
        if any(key in borrowing or (key in given and key not in active) for key in lowered):
            state = clusters.cycle_state((flavor,), snapshot.now)
            decisions, found = decide(snapshot, state, given, passable)
            state.restore()
            waits = {}
        admitted = {admit.run_id for admit in decisions.admitted}
        if not wide or not lines.deepen(flavor, admitted):
            break
    return decisions, {**waits, **found}


class Clusters:
    """The clusters of a snapshot with the runs that hold GPUs now, changed as runs start
    (``add``) and end or are preempted (``remove``): what ``CycleState`` builds from the
    held runs, kept up to date instead of built again for every cycle."""

    def __init__(self, snapshot: Snapshot):
        # Every pool, settled with no run in it; the held runs go in one by one.
        self.base = CycleState(replace(snapshot, queued=(), held=()))
        self.base.pools = {key: SimPool.of(pool) for key, pool in self.base.pools.items()}
        self.snapshot = snapshot
        self.held: dict[int, HeldRun] = {}
        # flavor -> held runs on nodes not known: placed anew in every cycle, as
        # ``CycleState`` assumes them, on the nodes with the most GPUs free then.
        self.unplaced: dict[str, dict[int, HeldRun]] = defaultdict(dict)
        # (cluster, flavor, node) -> run id -> when it was admitted: a node's ``entered``
        # is the latest of them.
        self.admitted_on: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
        # run id -> the cluster a starving run of it last reserved nodes on, in any cycle:
        # where ``LazyState`` looks first (only an order: the reservation is the same).
        self.reserved_on: dict[int, str] = {}
        # (tenant, flavor) -> (its first run, the tenant's usage, why it is held back or
        # None, whether that run borrows) when ``decide_flavor`` last looked at the line.
        self.line_states: dict[Key, tuple[QueuedRun, int, Wait | None, bool]] = {}
        for run in snapshot.held:
            self.add(run)

    def add(self, run: HeldRun) -> None:
        """``run`` holds its GPUs, counted as ``CycleState`` counts a held run."""
        base = self.base
        self.held[run.id] = run
        base.usage[(run.tenant, run.flavor)] += run.gpus
        base.latest_end[run.id] = run.latest_end
        pool = base.pools.get((run.cluster, run.flavor))
        if pool is None:
            return
        if run.borrowed:
            insort(pool.borrowed, run, key=victim_order)
        if not run.nodes:
            self.unplaced[run.flavor][run.id] = run
            return
        share, extra = divmod(run.gpus, len(run.nodes))
        on = {
            name: share + (1 if index < extra else 0)
            for index, name in enumerate(sorted(run.nodes))
        }
        base._hold(pool, run.id, on, run.admitted)
        for name in on:
            if name in pool.nodes:
                self.admitted_on[(run.cluster, run.flavor, name)][run.id] = run.admitted

    def remove(self, run_id: int) -> None:
        """The run no longer holds GPUs (it ended, or was preempted)."""
        base = self.base
        run = self.held.pop(run_id)
        base.usage[(run.tenant, run.flavor)] -= run.gpus
        del base.latest_end[run_id]
        pool = base.pools.get((run.cluster, run.flavor))
        if pool is None:
            return
        if run.borrowed:
            del pool.borrowed[index_of(pool.borrowed, run)]
        if not run.nodes:
            del self.unplaced[run.flavor][run_id]
            return
        pool.holders.discard(run_id)
        del base.pool_of[run_id]
        for name, gpus in base.held_on.pop(run_id).items():
            pool.give(name, gpus)
            if name in pool.nodes:
                entered = self.admitted_on[(run.cluster, run.flavor, name)]
                del entered[run_id]
                if entered:
                    pool.entered[name] = max(entered.values())
                else:
                    del pool.entered[name]

    def cycle_state(self, flavors: Iterable[str], now: float) -> LazyState:
        """The state ``CycleState`` would build at ``now`` from a snapshot of ``flavors``:
        their pools copied, to be changed by one cycle."""
        base, wanted = self.base, set(flavors)
        state = LazyState.__new__(LazyState)
        state.pools = {
            key: SimPool.of(pool) for key, pool in base.pools.items() if key[1] in wanted
        }
        state.pools_by_flavor = defaultdict(list)
        state.sim_pools = cast(dict[str, list[SimPool]], state.pools_by_flavor)
        state.flavor_versions = defaultdict(lambda: [0])
        state.flavor_gives = defaultdict(lambda: [0])
        for (_, flavor), pool in state.pools.items():
            state.pools_by_flavor[flavor].append(pool)
            pool.flavor_version = state.flavor_versions[flavor]
            pool.flavor_gives = state.flavor_gives[flavor]
        # The kept tables themselves, not copies: what the cycle changes in them is undone
        # after it (``LazyState.restore``).
        state.usage, state.held_on = base.usage, base.held_on
        state.pool_of, state.latest_end = base.pool_of, base.latest_end
        state.undo = []
        unplaced = [run for flavor in wanted for run in self.unplaced.get(flavor, {}).values()]
        for run in sorted(unplaced, key=lambda r: (r.admitted, r.id)):
            # As ``CycleState`` places it: on the nodes with the most free GPUs.
            held_pool = state.pools[(run.cluster, run.flavor)]
            on, left = {}, run.gpus
            for name in sorted(held_pool.nodes, key=lambda n: (-held_pool.free[n], n)):
                if left <= 0:
                    break
                taken = min(left, max(0, held_pool.free[name]))
                if taken:
                    on[name] = taken
                    left -= taken
            state._hold(held_pool, run.id, on, run.admitted)
        state.now = now
        state.start_grace_s = self.snapshot.start_grace_s
        state.starvation_after_s = self.snapshot.starvation_after_s
        state.answers, state.fits, state.nowhere = {}, {}, {}
        state.pending = defaultdict(list)
        state.reserved_on = self.reserved_on
        return state
