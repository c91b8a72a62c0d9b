"""The baseline admitter: the admission rules re-implemented the straightforward way.

It follows the rules of ``jobs.admission`` (design §5) but keeps no derived state. Whenever
it needs a tenant's usage, a pool's used GPUs, the borrowed runs it could preempt or a
quota, it asks a ledger, which works the answer out from scratch: ``MemoryLedger`` by
re-scanning the list of runs that hold GPUs, ``bench.cycle.DbLedger`` by querying the
database. The benchmarks assert that it reaches exactly the decisions of
``jobs.admission.decide``; only the cost differs.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from jobs.admission import (
    Decisions,
    HeldRun,
    Pool,
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

    admitted: tuple[tuple[int, str, bool, bool], ...]  # run, cluster, borrowed, over budget
    preempted: tuple[tuple[int, int], ...]  # victim, for which run
    waiting: tuple[tuple[int, str, int], ...]  # run, reason, position
    reservations: tuple[tuple[int, str, int], ...]  # run, cluster, GPUs


def outcome_of(decisions: Decisions) -> Outcome:
    return Outcome(
        admitted=tuple(
            (a.run_id, a.cluster, a.borrowed, a.over_budget) for a in decisions.admitted
        ),
        preempted=tuple((p.run_id, p.by_run_id) for p in decisions.preempted),
        waiting=tuple((w.run_id, w.reason.value, w.position) for w in decisions.waiting),
        reservations=tuple((r.run_id, r.cluster, r.gpus) for r in decisions.reservations),
    )


class Ledger(Protocol):
    def pools(self, flavor: str) -> list[Pool]: ...  # ordered by cluster name
    def quota(self, key: Key) -> Quota | None: ...
    def budget_used(self, key: Key) -> float: ...
    def usage(self, key: Key) -> int: ...
    def used_by_cluster(self, flavor: str) -> dict[str, int]: ...
    def borrowed(self, pool: Pool) -> list[HeldRun]: ...
    def shares(self) -> dict[Key, tuple[float, int, int]]: ...  # decayed, usage, weight
    def last_admitted(self, pool: Pool) -> float: ...  # latest admission into the pool
    def admit(self, run: QueuedRun, pool: Pool, *, borrowed: bool, over_budget: bool) -> None: ...
    def preempt(self, victim: HeldRun, *, by: QueuedRun) -> None: ...


class MemoryLedger:
    """Answers every question by re-scanning the runs that hold GPUs."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.held = list(snapshot.held)
        self.gone: list[HeldRun] = []  # preempted this cycle: they did enter their pool

    def pools(self, flavor: str) -> list[Pool]:
        return sorted(
            (p for p in self.snapshot.pools if p.flavor == flavor), key=lambda p: p.cluster
        )

    def quota(self, key: Key) -> Quota | None:
        return self.snapshot.quotas.get(key)

    def budget_used(self, key: Key) -> float:
        return self.snapshot.budget_used.get(key, 0.0)

    def usage(self, key: Key) -> int:
        return sum(h.gpus for h in self.held if (h.tenant, h.flavor) == key)

    def used_by_cluster(self, flavor: str) -> dict[str, int]:
        used: dict[str, int] = defaultdict(int)
        for h in self.held:
            if h.flavor == flavor:
                used[h.cluster] += h.gpus
        return used

    def borrowed(self, pool: Pool) -> list[HeldRun]:
        return sorted(
            (
                h
                for h in self.held
                if h.borrowed and h.cluster == pool.cluster and h.flavor == pool.flavor
            ),
            key=victim_order,
        )

    def shares(self) -> dict[Key, tuple[float, int, int]]:
        usage: dict[Key, int] = defaultdict(int)
        for h in self.held:
            usage[(h.tenant, h.flavor)] += h.gpus
        return {
            key: (self.snapshot.decayed_usage.get(key, 0.0), usage[key], quota.weight)
            for key, quota in self.snapshot.quotas.items()
        }

    def admit(self, run: QueuedRun, pool: Pool, *, borrowed: bool, over_budget: bool) -> None:
        self.held.append(
            HeldRun(
                run.id, run.tenant, run.flavor, pool.cluster, run.gpus, run.priority,
                self.snapshot.now, borrowed,
            )
        )  # fmt: skip

    def preempt(self, victim: HeldRun, *, by: QueuedRun) -> None:
        self.held.remove(victim)
        self.gone.append(victim)

    def last_admitted(self, pool: Pool) -> float:
        return max(
            (
                h.admitted
                for h in self.held + self.gone
                if h.cluster == pool.cluster and h.flavor == pool.flavor
            ),
            default=-float("inf"),
        )


def _fits_shape(run: QueuedRun, pool: Pool) -> bool:
    return run.gpus_per_node <= pool.gpus_per_node and run.nodes <= pool.nodes


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
    admitted: list[tuple[int, str, bool, bool]] = []
    preempted: list[tuple[int, int]] = []
    reservations: list[tuple[int, str, int]] = []
    reserved: dict[tuple[str, str], int] = defaultdict(int)  # binds every run
    reserved_by_borrowers: dict[tuple[str, str], int] = defaultdict(int)  # binds borrowers
    fenced: set[tuple[str, str]] = set()  # pools a starving run waits for: no reclaiming there

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

    def free_gpus(run: QueuedRun, *, for_borrower: bool) -> list[tuple[Pool, int]]:
        used = ledger.used_by_cluster(run.flavor)
        result = []
        for pool in ledger.pools(run.flavor):
            pool_key = (pool.cluster, pool.flavor)
            free = pool.capacity - used.get(pool.cluster, 0) - reserved[pool_key]
            if for_borrower:
                free -= reserved_by_borrowers[pool_key]
            result.append((pool, free))
        return result

    def best_fit(run: QueuedRun, *, for_borrower: bool) -> Pool | None:
        best, best_left = None, 0
        for pool, free in free_gpus(run, for_borrower=for_borrower):
            left = free - run.gpus
            if _fits_shape(run, pool) and left >= 0 and (best is None or left < best_left):
                best, best_left = pool, left
        return best

    def victims(run: QueuedRun, pool: Pool, free: int) -> list[HeldRun] | None:
        if (pool.cluster, pool.flavor) in fenced:
            return None
        need = run.gpus - free
        chosen, freed = [], 0
        for victim in ledger.borrowed(pool):
            if freed >= need:
                break
            if victim.tenant != run.tenant:
                chosen.append(victim)
                freed += victim.gpus
        if freed < need:
            return None
        for victim in reversed(list(chosen)):
            if freed - victim.gpus >= need:
                chosen.remove(victim)
                freed -= victim.gpus
        return chosen

    def reserve(run: QueuedRun, *, for_borrower: bool) -> tuple[str, int] | None:
        starving_since = run.submitted + starvation_after_s
        if now < starving_since:
            return None
        best, best_rank, best_free = None, None, 0
        for pool, free in free_gpus(run, for_borrower=for_borrower):
            if _fits_shape(run, pool) and run.gpus <= pool.capacity:
                rank = (ledger.last_admitted(pool) < starving_since, free)
                if best_rank is None or rank > best_rank:
                    best, best_rank, best_free = pool, rank, free
        if best is None:
            return None
        fenced.add((best.cluster, best.flavor))
        if best_free <= 0:
            return None
        held = min(best_free, run.gpus)
        reservations.append((run.id, best.cluster, held))
        return best.cluster, held

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
            pool = best_fit(run, for_borrower=False)
            chosen: list[HeldRun] = []
            if pool is None:
                options = []
                for candidate, free in free_gpus(run, for_borrower=False):
                    if _fits_shape(run, candidate):
                        found = victims(run, candidate, free)
                        if found is not None:
                            cost = (sum(v.gpus for v in found), len(found), candidate.cluster)
                            options.append((cost, candidate, found))
                if options:
                    _, pool, chosen = min(options, key=lambda option: option[0])
            if pool is None:
                block(key, run, Wait.CAPACITY)
                held = reserve(run, for_borrower=False)
                if held is not None:
                    reserved[(held[0], run.flavor)] += held[1]
                continue
            for victim in chosen:
                ledger.preempt(victim, by=run)
                preempted.append((victim.id, run.id))
            ledger.admit(run, pool, borrowed=False, over_budget=over_budget)
            admitted.append((run.id, pool.cluster, False, over_budget))
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

    # Phase 2: borrowers in turn, least weighted fair-share usage first, idle GPUs only.
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
        pool = best_fit(run, for_borrower=True)
        if pool is None:
            block(key, run, Wait.NO_IDLE)
            held = reserve(run, for_borrower=True)
            if held is not None:
                reserved_by_borrowers[(held[0], run.flavor)] += held[1]
            active.discard(key)
            continue
        borrowed = in_use + run.gpus > quota.guaranteed
        ledger.admit(run, pool, borrowed=borrowed, over_budget=over_budget)
        admitted.append((run.id, pool.cluster, borrowed, over_budget))
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
