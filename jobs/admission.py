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
  tenant's; except that where the queueing policy allows (``backfill``, ``best-effort``),
  a head waiting for a placement may be passed, in a third phase after every run in its
  turn, by runs that keep the reserved start of every waiting head (``jobs.backfill``).
- No starvation: a run that has waited longer than ``starvation_after_s`` and still cannot
  be placed holds concrete nodes: the ones where it comes closest to fitting (nodes no run
  entered since it began starving first; never one that outside load keeps it off), whose
  free GPUs, up to what it needs on each, no later run may take and whose borrowed runs no
  later run may reclaim. It then starts at the latest when the runs on those nodes end
  (each is bounded by its max runtime). Until then, other runs may use free GPUs
  elsewhere.

The result is deterministic: the same snapshot always gives the same decisions.

Here: ``decide`` and the cycle's phases, in the order above. The data it reads and returns
is in ``jobs.admission_types``; the clusters' state as the cycle goes, in
``jobs.admission_state`` (every cluster) and ``jobs.admission_pool`` (one cluster's nodes of
one flavor).
"""

import heapq
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property, partial

from jobs import backfill, placement
from jobs.admission_pool import PoolState
from jobs.admission_state import CycleState
from jobs.admission_types import (
    Admit,
    Decisions,
    HeldRun,
    Preempt,
    QueuedRun,
    Queueing,
    Quota,
    Reservation,
    Shadow,
    Snapshot,
    Wait,
    Waiting,
    queue_order,
)

Key = tuple[str, str]  # (tenant, flavor)
UNPLANNED = "unplanned"  # a head's reservation, not planned yet
NOWHERE = backfill.NOWHERE


def decide(snapshot: Snapshot, *, explain: bool = True) -> Decisions:
    """The cycle's decisions. ``explain=False`` leaves the waiting runs' messages empty and
    no admitted run's ``tighter_wait_s``: what a forward simulation (``jobs.estimates``)
    asks, many times over."""
    cycle = _Cycle(snapshot, explain=explain)
    cycle.within_guarantees()
    cycle.borrowers_take_turns()
    cycle.pass_waiting_heads()
    if explain:
        cycle.plan_the_rest()
    return Decisions(
        admitted=tuple(cycle.admitted),
        preempted=tuple(cycle.preempted),
        waiting=cycle.waiting(explain=explain),
        reservations=tuple(cycle.reservations),
        shadows=tuple(sorted(cycle.shadows, key=lambda shadow: shadow.run_id)),
    )


class _Cycle:
    """One call of ``decide``: the queue in order, the clusters as the cycle changes them,
    and the decisions so far."""

    def __init__(
        self, snapshot: Snapshot, *, explain: bool = True, state: CycleState | None = None
    ):
        self.snapshot = snapshot
        self.explain = explain
        # ``state``: the clusters' state of ``snapshot`` built already (the forward
        # simulation keeps it from one simulated cycle to the next, ``jobs.estimates_state``).
        self.state = CycleState(snapshot) if state is None else state
        self.order = sorted(snapshot.queued, key=queue_order)
        self.queues: dict[Key, list[QueuedRun]] = defaultdict(list)
        for run in self.order:
            self.queues[(run.tenant, run.flavor)].append(run)
        self.admitted: list[Admit] = []
        self.preempted: list[Preempt] = []
        # A placement reason is written once the cycle is decided (``waiting``): it tells
        # what is free after this cycle's admissions, and runs of one shape share it.
        self.waits: dict[int, tuple[Wait, str | Callable[[], str]]] = {}
        self.reservations: list[Reservation] = []
        self.blocked: dict[Key, int] = {}  # (tenant, flavor) -> the head run that waits
        # Heads a later run of their tenant may pass (backfill, best-effort), and what each
        # reserves: a Plan, ``backfill.NEVER`` (it holds nothing), or None (best-effort).
        self.heads: dict[Key, QueuedRun] = {}
        self.plans: dict[Key, backfill.Plan | str | None] = {}
        self.shadows: list[Shadow] = []
        self.passing: dict[Key, list[PoolState]] = {}
        self.borrowers: dict[Key, int] = {}  # (tenant, flavor) -> index of its first borrower

    @cached_property
    def capacity(self) -> dict[str, int]:
        """flavor -> GPUs of the clusters (read only to explain a wait)."""
        capacity: dict[str, int] = defaultdict(int)
        for node in self.snapshot.nodes:
            capacity[node.flavor] += node.gpus
        return capacity

    @cached_property
    def guaranteed(self) -> dict[str, int]:
        """flavor -> the tenants' guarantees, added up (read only to explain a wait)."""
        guaranteed: dict[str, int] = defaultdict(int)
        for (_, flavor), tenant_quota in self.snapshot.quotas.items():
            guaranteed[flavor] += tenant_quota.guaranteed
        return guaranteed

    def block(
        self, key: Key, run: QueuedRun, reason: Wait, message: str | Callable[[], str]
    ) -> None:
        """``run`` waits for ``reason``; the first to wait is its tenant's head for the
        flavor. A head waiting for a placement (not for quota or budget, which a later run
        would take from it) may be passed where the queueing policy allows it."""
        self.waits[run.id] = (reason, message)
        if key in self.blocked:
            return
        self.blocked[key] = run.id
        if reason not in (Wait.CAPACITY, Wait.NO_IDLE, Wait.TOO_LARGE):
            return
        pools = self.passing_pools(run)
        if not pools:
            return
        self.heads[key] = run
        if reason is Wait.TOO_LARGE:
            self.plans[key] = backfill.NEVER
        elif any(self.policy(run.tenant, pool) is Queueing.BACKFILL for pool in pools):
            self.plans[key] = UNPLANNED  # planned when a later run could pass, or at the end
        else:
            self.plans[key] = None

    def reservation(self, key: Key) -> backfill.Plan | str | None:
        """The head's reservation, planned on the state of the cycle when first asked."""
        if self.plans[key] == UNPLANNED:
            reserved = backfill.plan(self.state, self.heads[key])
            self.plans[key] = reserved
            if isinstance(reserved, backfill.Plan):
                self.shadows.append(reserved.shadow())
        return self.plans[key]

    def reservations_kept(self, run: QueuedRun) -> list[backfill.Plan]:
        """The reserved starts of the other tenants' heads of ``run``'s flavor, where their
        policy is ``backfill``: a run passing its own head keeps those too."""
        kept = []
        for key, head in self.heads.items():
            if head.flavor != run.flavor or head.tenant == run.tenant:
                continue
            if self.plans[key] is None:
                continue
            plan = self.reservation(key)
            if isinstance(plan, backfill.Plan) and self.policy(head.tenant, plan.pool) is (
                Queueing.BACKFILL
            ):
                kept.append(plan)
        return kept

    def plan_the_rest(self) -> None:
        """Heads no later run asked to pass still say where and when they start."""
        for key in self.heads:
            self.reservation(key)

    def policy(self, tenant: str, pool: PoolState) -> Queueing:
        return self.snapshot.tenant_queueing.get(tenant) or self.snapshot.queueing.get(
            pool.cluster, Queueing.STRICT
        )

    def passing_pools(self, run: QueuedRun) -> list[PoolState]:
        """The pools where a later run of ``run``'s tenant may pass it."""
        key = (run.tenant, run.flavor)
        if key not in self.passing:
            self.passing[key] = [
                pool
                for pool in self.state.pools_by_flavor[run.flavor]
                if self.policy(run.tenant, pool) is not Queueing.STRICT
            ]
        return self.passing[key]

    def start_ahead(self, key: Key, run: QueuedRun, over_budget: bool, borrowed: bool) -> None:
        """Onto free GPUs now, ahead of the tenant's waiting head, where that keeps the
        head's reserved start (``jobs.backfill``); else ``run`` waits behind it, saying
        why it may not pass."""
        head = self.heads[key]
        if self.state.best_fit(run) is None:
            # It fits nowhere (so there is no need to plan the head's reservation for it).
            self.waits[run.id] = (Wait.BEHIND_HEAD, partial(self.behind_reason, run, NOWHERE))
            return
        reserved = self.reservation(key)
        if isinstance(reserved, backfill.Plan):
            if self.policy(run.tenant, reserved.pool) is not Queueing.BACKFILL:
                reserved = None  # it reserves on a pool where runs pass at will
            unreserved = f"the queueing policy lets runs pass run {head.id}"
        elif reserved == backfill.NEVER:
            unreserved = (
                f"run {head.id} could not be placed even with every Gantry run gone, so it "
                "holds nothing back"
            )
        else:
            unreserved = f"the queueing policy is best-effort: run {head.id} holds nothing back"
        own = reserved if isinstance(reserved, backfill.Plan) else None
        others = self.reservations_kept(run)
        found = backfill.fit(
            self.state, run, self.passing_pools(run), own, others=others, unreserved=unreserved
        )
        if isinstance(found, str):
            self.waits[run.id] = (Wait.BEHIND_HEAD, partial(self.behind_reason, run, found))
            return
        backfill.took(self.state, run, found, [*([own] if own else []), *others])
        tighter = self.tighter_wait(run, found.pool, found.where)
        self.state.admit(run, found.pool, found.where)
        self.admitted.append(
            Admit(run.id, found.pool.cluster, borrowed=borrowed, over_budget=over_budget,
                  nodes=found.where.nodes, ahead_of=head.id, ahead_because=found.because,
                  tighter_wait_s=tighter)
        )  # fmt: skip

    def precheck(self, key: Key, run: QueuedRun) -> tuple[Quota | None, bool]:
        """Quota and budget gates common to both phases; returns (quota, over_budget)."""
        quota = self.snapshot.quotas.get(key)
        tenant, flavor = key
        if quota is None or quota.guaranteed + quota.borrow_limit == 0:
            self.block(key, run, Wait.NO_QUOTA, f"tenant {tenant} has no quota for {flavor}")
            return None, False
        if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
            self.block(
                key, run, Wait.TOO_LARGE,
                f"asks for {run.gpus} {flavor} GPUs; tenant {tenant} may use at most "
                f"{quota.max_gpus_per_run} per run",
            )  # fmt: skip
            return None, False
        over_budget = False
        if quota.budget_gpu_hours is not None:
            used = self.snapshot.budget_used.get(key, 0.0)
            if used >= quota.budget_gpu_hours:
                if quota.budget_hard:
                    self.block(
                        key, run, Wait.BUDGET_EXHAUSTED,
                        f"tenant {tenant} has used {used:,.0f} of its {quota.budget_gpu_hours:,.0f}"
                        f" {flavor} GPU-hour budget this month (hard limit)",
                    )  # fmt: skip
                    return None, False
                over_budget = True
        return quota, over_budget

    def within_guarantees(self) -> None:
        """Phase 1: runs within their tenant's guarantee, in priority then FIFO order.

        Preemptions can bring a tenant that was beyond its guarantee back within it: its
        queue gets another pass, so it reclaims now rather than waiting as a borrower and
        reclaiming next cycle. This ends: each pass after the first follows a preemption,
        and a run is preempted once."""
        state, borrowers, queues = self.state, self.borrowers, self.queues
        pending = self.order
        while pending:
            for run in pending:
                key = (run.tenant, run.flavor)
                if key in self.blocked or key in borrowers:
                    continue
                quota, over_budget = self.precheck(key, run)
                if quota is None:
                    continue
                if state.usage[key] + run.gpus > quota.guaranteed:
                    borrowers[key] = queues[key].index(run)
                    continue
                self.admit_within_guarantee(key, run, over_budget)
            returned = {
                key: index
                for key, index in borrowers.items()
                if state.usage[key] + queues[key][index].gpus
                <= self.snapshot.quotas[key].guaranteed
            }
            for key in returned:
                del borrowers[key]
            pending = sorted(
                (run for key, index in returned.items() for run in queues[key][index:]),
                key=queue_order,
            )

    def admit_within_guarantee(self, key: Key, run: QueuedRun, over_budget: bool) -> None:
        """Onto free GPUs, else by reclaiming borrowed ones; else the run waits (CAPACITY)
        and, if it starves, holds the nodes where it comes closest to fitting."""
        state = self.state
        fit = state.best_fit(run)
        victims: list[HeldRun] = []
        stolen = ""  # why a preemption that would make room is not made
        if fit is None:
            stolen, reclaim = self.cheapest_reclaim(run)
            if reclaim is not None:
                pool, victims, where = reclaim
                fit = (pool, where)
        if fit is None:
            self.block(key, run, Wait.CAPACITY, stolen or partial(self.capacity_reason, run))
            state.reserve(run, self.reservations)
            return
        pool, where = fit
        for victim in victims:
            state.preempt(victim)
            self.preempted.append(
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
        tighter = self.tighter_wait(run, pool, where)
        state.admit(run, pool, where)
        self.admitted.append(
            Admit(run.id, pool.cluster, borrowed=False, over_budget=over_budget,
                  nodes=where.nodes, tighter_wait_s=tighter)
        )  # fmt: skip

    def cheapest_reclaim(
        self, run: QueuedRun
    ) -> tuple[str, tuple[PoolState, list[HeldRun], placement.Placement] | None]:
        """The cluster whose borrowed runs make room for ``run`` at the least cost (fewest
        GPUs, then fewest runs, then the cluster's name), with the victims and the
        placement; and why a reclaim that would make room is not made, if one is not."""
        state = self.state
        stolen = ""
        options = []
        for candidate in state.pools_by_flavor[run.flavor]:
            found = state.victims(run, candidate)
            if found is not None:
                chosen, where = found
                why = state.stolen(candidate, chosen, self.snapshot.outside)
                if why:
                    stolen = stolen or why
                    continue
                cost = (sum(v.gpus for v in chosen), len(chosen), candidate.cluster)
                options.append((cost, candidate, chosen, where))
        if not options:
            return stolen, None
        _, pool, victims, where = min(options, key=lambda option: option[0])
        return stolen, (pool, victims, where)

    def tighter_wait(
        self, run: QueuedRun, pool: PoolState, where: placement.Placement
    ) -> float | None:
        """For a gang about to be admitted onto ``where``: if its nodes span more than one
        domain of ``pool``'s narrowest topology level, how long it would have waited, from
        now, for its nodes inside one such domain: the start backfill would reserve for it
        as a head that requires that level (``backfill.plan``: the held runs ending at their
        latest ends), before this admission takes its GPUs. None when the placement is not
        spread, no such domain could ever hold it, a run it would wait on has no bound, or
        the cycle does not explain (a gang inside one domain costs one look at its nodes)."""
        if not self.explain:
            return None
        depth = len(pool.levels)
        domains = {pool.nodes[name].path[:depth] for name in where.nodes}
        if len(domains) == 1 or any(len(domain) < depth for domain in domains):
            # One node, one domain (the whole cluster, with no levels), or a node whose
            # domain at that level is not known.
            return None
        tight = replace(run, topology_level=pool.levels[-1], topology_required=True)
        reserved = backfill.plan(self.state, tight)
        if not isinstance(reserved, backfill.Plan) or reserved.at is None:
            return None
        return reserved.at - self.state.now

    def capacity_reason(self, run: QueuedRun) -> str:
        state = self.state
        message = state.explain(run)
        if state.reclaimable(run):
            message += "; reclaiming the GPUs other tenants borrowed would not make room"
        held = sum(gpus for (_, flavor), gpus in state.usage.items() if flavor == run.flavor)
        borrowed = sum(
            victim.gpus for pool in state.pools_by_flavor[run.flavor] for victim in pool.borrowed
        )
        capacity = self.capacity[run.flavor]
        if self.guaranteed[run.flavor] > capacity and held - borrowed + run.gpus > capacity:
            # Runs within their guarantees leave no room for this one, also within its
            # guarantee: the guarantees were promised beyond the clusters (docs/admission.md,
            # "Overcommitted guarantees"). Said so the wait does not read as a broken promise.
            message += (
                f"; the {run.flavor} guarantees of all tenants add up to more than the "
                f"{capacity} GPUs the clusters have, so not all can be kept at once"
            )
        return message

    def borrow_reason(self, run: QueuedRun, usage: str) -> str:
        return f"{usage}; to borrow idle ones, this run {self.state.explain(run)}"

    def share_key(self, key: Key) -> tuple[float, float, tuple[int, float, int]]:
        """Who borrows first: the least decayed usage per weight, then the least held per
        weight, then the queue's order."""
        weight = self.snapshot.quotas[key].weight or 1
        return (
            self.snapshot.decayed_usage.get(key, 0.0) / weight,
            self.state.usage[key] / weight,
            queue_order(self.queues[key][self.borrowers[key]]),
        )

    def pass_waiting_heads(self) -> None:
        """Phase 3 (backfill): the runs behind a head that may be passed, in priority then
        FIFO order, onto the free GPUs every run in its turn left, each within its tenant's
        guarantee and borrow limit; where the policy is ``backfill``, only where that keeps
        the head's reserved start (``jobs.backfill``). As Slurm's backfill pass, after the
        runs in order: passing a head never takes GPUs another tenant's run in its turn
        would have had in the same cycle."""
        behind = []
        for key, head in self.heads.items():
            queue = self.queues[key]
            behind.extend(queue[queue.index(head) + 1 :])
        stopped: set[Key] = set()
        for run in sorted(behind, key=queue_order):
            key = (run.tenant, run.flavor)
            if key in stopped:
                continue
            quota, over_budget = self.precheck(key, run)
            if quota is None:
                if self.waits[run.id][0] is not Wait.TOO_LARGE:
                    stopped.add(key)  # budget: every later run of the line waits for it too
                continue
            in_use = self.state.usage[key]
            if in_use + run.gpus > quota.guaranteed + quota.borrow_limit:
                stopped.add(key)  # beyond the quota: it waits behind the head, as the rest
                continue
            self.start_ahead(key, run, over_budget, borrowed=in_use + run.gpus > quota.guaranteed)

    def borrowers_take_turns(self) -> None:
        """Phase 2: borrowers take turns by weighted fair share, free GPUs only."""
        borrowers, queues = self.borrowers, self.queues
        heap = [(self.share_key(key), key) for key in sorted(borrowers)]
        heapq.heapify(heap)
        while heap:
            _, key = heapq.heappop(heap)
            if self.borrow(key, queues[key][borrowers[key]]):
                borrowers[key] += 1
                if borrowers[key] < len(queues[key]):
                    heapq.heappush(heap, (self.share_key(key), key))

    def borrow(self, key: Key, run: QueuedRun) -> bool:
        """Admit ``run`` onto free GPUs within the tenant's guarantee and borrow limit, or
        block its tenant's queue with the reason it waits. True if admitted."""
        quota, over_budget = self.precheck(key, run)
        if quota is None:
            return False
        tenant, flavor = key
        in_use = self.state.usage[key]
        if in_use + run.gpus > quota.guaranteed + quota.borrow_limit:
            usage = _usage_words(tenant, flavor, in_use, quota.guaranteed)
            if quota.borrow_limit == 0:
                self.block(
                    key, run, Wait.QUOTA,
                    f"{usage} and may not borrow; this run needs {run.gpus}",
                )  # fmt: skip
            else:
                self.block(
                    key, run, Wait.BORROW_LIMIT,
                    f"tenant {tenant} uses {in_use} of {quota.guaranteed} guaranteed + "
                    f"{quota.borrow_limit} borrowable {flavor} GPUs; this run needs {run.gpus}",
                )  # fmt: skip
            return False
        fit = self.state.best_fit(run)
        if fit is None:
            usage = _usage_words(tenant, flavor, in_use, quota.guaranteed)
            self.block(key, run, Wait.NO_IDLE, partial(self.borrow_reason, run, usage))
            self.state.reserve(run, self.reservations)  # binds the borrowers after it
            return False
        pool, where = fit
        tighter = self.tighter_wait(run, pool, where)
        self.state.admit(run, pool, where)
        self.admitted.append(
            Admit(run.id, pool.cluster, borrowed=in_use + run.gpus > quota.guaranteed,
                  over_budget=over_budget, nodes=where.nodes, tighter_wait_s=tighter)
        )  # fmt: skip
        return True

    def waiting(self, *, explain: bool) -> tuple[Waiting, ...]:
        """Everything not admitted waits: behind its head, or for the head's own reason."""
        admitted_ids = {a.run_id for a in self.admitted}
        positions: dict[str, int] = defaultdict(int)
        waiting = []
        for run in self.order:
            if run.id in admitted_ids:
                continue
            positions[run.flavor] += 1
            reason, message = self.waits.get(run.id) or (
                Wait.BEHIND_HEAD,
                partial(self.behind_reason, run, ""),
            )
            if not explain:
                message = ""
            elif callable(message):
                message = message()
            waiting.append(Waiting(run.id, reason, message, positions[run.flavor]))
        return tuple(waiting)

    def behind_reason(self, run: QueuedRun, why_not_ahead: str) -> str:
        message = (
            f"waiting behind run {self.blocked.get((run.tenant, run.flavor), '?')} of "
            f"tenant {run.tenant}, which is first in line for {run.flavor} (priority, "
            "then submission order)"
        )
        return f"{message}; {why_not_ahead}" if why_not_ahead else message


def _usage_words(tenant: str, flavor: str, in_use: int, guarantee: int) -> str:
    if in_use > guarantee:  # runs admitted before the guarantee was lowered, or borrowed
        return (
            f"tenant {tenant} uses {in_use} {flavor} GPUs, {in_use - guarantee} beyond its "
            f"guarantee of {guarantee}"
        )
    return f"tenant {tenant} uses {in_use} of {guarantee} guaranteed {flavor} GPUs"


def held_placements(snapshot: Snapshot) -> dict[int, dict[str, int]]:
    """run id -> node -> GPUs, for every held run on a known cluster: where it holds GPUs,
    as admission counts it (a run with unknown nodes where ``HeldRun`` says it is assumed)."""
    return CycleState(snapshot).held_on


def free_gpus(snapshot: Snapshot) -> dict[str, int]:
    """Free GPUs per flavor, as admission counts them: on nodes that take work, less what
    Gantry's held runs hold there and what jobs from outside Gantry use."""
    state = CycleState(snapshot)
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
