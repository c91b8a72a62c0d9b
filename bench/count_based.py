"""Today's count-based admission before issue 18, the baseline: a verbatim copy of
``jobs/admission.py`` at commit 46c6112 (``git show 46c6112:jobs/admission.py``), kept
for the placement benchmark (bench/placement.py). It counts GPUs per pool (cluster and
flavor) and never looks at nodes. Only this paragraph is new; the module imported
nothing from the project, so no import needed adapting. Do not fix it: it is the
baseline.

Admission decisions as a pure function over a snapshot. No ORM, no clock, no I/O.

The rules (design §5):

- Gang: a run is admitted only when all ``nodes × gpus_per_node`` GPUs fit in one pool
  (one cluster, one flavor, node shape respected).
- Guarantee: while a tenant stays within ``guaranteed`` GPUs of a flavor, its run is
  admitted into idle GPUs or, failing that, by preempting *borrowed* runs of other tenants
  in one pool: lowest priority first, then newest, trimmed to the smallest set that frees
  enough, in the pool that needs the fewest preempted GPUs.
- Borrowing: beyond the guarantee, up to ``borrow_limit``, only from idle GPUs; such runs
  are marked borrowed (preemptible). Competing borrowers take turns by weighted fair share:
  the tenant with the least decayed usage per weight goes first.
- Budgets: a hard budget that is spent makes the tenant's runs wait (BUDGET_EXHAUSTED); a
  soft one admits them and flags them.
- Order: priority, then FIFO inside a tenant and flavor. A tenant's blocked head holds that
  tenant's later runs of the flavor back (so small runs cannot starve it), never another
  tenant's.
- No starvation: a run that has waited longer than ``starvation_after_s`` and still cannot
  fit reserves the free GPUs of its best pool (one that no run entered since it began
  starving, if any), so runs behind it can neither take them nor reclaim borrowed GPUs
  there; it then starts at the latest when the runs already in that pool end (each is
  bounded by its max runtime). Until then, other tenants' runs may use idle GPUs elsewhere.

The result is deterministic: the same snapshot always gives the same decisions.
"""

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum


class Wait(StrEnum):
    QUOTA = "QUOTA"  # beyond the guarantee and no borrowing allowed
    BORROW_LIMIT = "BORROW_LIMIT"  # beyond guarantee + borrow limit
    NO_IDLE = "NO_IDLE"  # would borrow, but there are no idle GPUs to lend
    CAPACITY = "CAPACITY"  # within the guarantee, but it does not fit even by preemption
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


@dataclass(frozen=True, slots=True)
class Pool:
    """GPUs of one flavor on one cluster."""

    cluster: str
    flavor: str
    nodes: int
    gpus_per_node: int

    @property
    def capacity(self) -> int:
        return self.nodes * self.gpus_per_node


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
    pools: tuple[Pool, ...]
    quotas: dict[tuple[str, str], Quota]  # (tenant, flavor) -> quota
    budget_used: dict[tuple[str, str], float] = field(default_factory=dict)  # GPU-hours
    decayed_usage: dict[tuple[str, str], float] = field(default_factory=dict)  # GPU-seconds
    now: float = 0.0  # epoch seconds
    starvation_after_s: float = float("inf")


@dataclass(frozen=True, slots=True)
class Admit:
    run_id: int
    cluster: str
    borrowed: bool = False
    over_budget: bool = False


@dataclass(frozen=True, slots=True)
class Preempt:
    run_id: int
    by_run_id: int
    message: str


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


class _State:
    """The cluster as the cycle goes: idle GPUs, usage, borrowed runs, reservations."""

    def __init__(self, snapshot: Snapshot):
        self.pools_by_flavor: dict[str, list[Pool]] = defaultdict(list)
        for pool in sorted(snapshot.pools, key=lambda p: p.cluster):
            self.pools_by_flavor[pool.flavor].append(pool)
        self.idle = {(p.cluster, p.flavor): p.capacity for p in snapshot.pools}
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        self.borrowed: dict[tuple[str, str], list[HeldRun]] = defaultdict(list)
        self.last_admitted: dict[tuple[str, str], float] = {}
        for run in snapshot.held:
            self.usage[(run.tenant, run.flavor)] += run.gpus
            pool_key = (run.cluster, run.flavor)
            if pool_key in self.idle:
                self.idle[pool_key] -= run.gpus
                self.last_admitted[pool_key] = max(
                    run.admitted, self.last_admitted.get(pool_key, run.admitted)
                )
                if run.borrowed:
                    self.borrowed[pool_key].append(run)
        for runs in self.borrowed.values():
            runs.sort(key=victim_order)
        self.reserved: dict[tuple[str, str], int] = defaultdict(int)
        self.fenced: set[tuple[str, str]] = set()  # pools a starving run waits for
        self.now = snapshot.now
        self.starvation_after_s = snapshot.starvation_after_s

    def free(self, pool: Pool) -> int:
        key = (pool.cluster, pool.flavor)
        return self.idle[key] - self.reserved[key]

    def fits_shape(self, run: QueuedRun, pool: Pool) -> bool:
        return run.gpus_per_node <= pool.gpus_per_node and run.nodes <= pool.nodes

    def best_fit(self, run: QueuedRun) -> Pool | None:
        """The pool that fits the whole gang in free GPUs and leaves the least behind."""
        best, best_left = None, 0
        for pool in self.pools_by_flavor[run.flavor]:
            if not self.fits_shape(run, pool):
                continue
            left = self.free(pool) - run.gpus
            if left >= 0 and (best is None or left < best_left):
                best, best_left = pool, left
        return best

    def victims(self, run: QueuedRun, pool: Pool) -> list[HeldRun] | None:
        """The smallest set of other tenants' borrowed runs whose preemption fits ``run``."""
        if (pool.cluster, pool.flavor) in self.fenced:
            return None  # a starving run ahead of it waits for this pool
        need = run.gpus - self.free(pool)
        candidates = [
            v for v in self.borrowed[(pool.cluster, pool.flavor)] if v.tenant != run.tenant
        ]
        chosen, freed = [], 0
        for victim in candidates:
            if freed >= need:
                break
            chosen.append(victim)
            freed += victim.gpus
        if freed < need:
            return None
        for victim in reversed(chosen[:]):  # drop any victim that is not needed after all
            if freed - victim.gpus >= need:
                chosen.remove(victim)
                freed -= victim.gpus
        return chosen

    def admit(self, run: QueuedRun, pool: Pool) -> None:
        self.idle[(pool.cluster, pool.flavor)] -= run.gpus
        self.last_admitted[(pool.cluster, pool.flavor)] = self.now
        self.usage[(run.tenant, run.flavor)] += run.gpus

    def preempt(self, victim: HeldRun) -> None:
        self.borrowed[(victim.cluster, victim.flavor)].remove(victim)
        self.idle[(victim.cluster, victim.flavor)] += victim.gpus
        self.usage[(victim.tenant, victim.flavor)] -= victim.gpus

    def reserve(self, run: QueuedRun, reservations: list[Reservation]) -> None:
        """Hold the free GPUs of the pool where a starving ``run`` comes closest to fitting,
        and keep later runs from reclaiming borrowed GPUs there.

        A pool that no run entered since ``run`` began starving holds only runs that were
        there before, which end within their max runtime; preferring such a pool keeps the
        choice the same from one cycle to the next."""
        starving_since = run.submitted + self.starvation_after_s
        if self.now < starving_since:
            return
        best, best_rank = None, None
        for pool in self.pools_by_flavor[run.flavor]:
            if self.fits_shape(run, pool) and run.gpus <= pool.capacity:
                key = (pool.cluster, pool.flavor)
                untouched = self.last_admitted.get(key, -float("inf")) < starving_since
                rank = (untouched, self.free(pool))
                if best_rank is None or rank > best_rank:
                    best, best_rank = pool, rank
        if best is None:
            return
        key = (best.cluster, best.flavor)
        self.fenced.add(key)
        free = self.free(best)
        if free > 0:
            held = min(free, run.gpus)
            self.reserved[key] += held
            reservations.append(Reservation(run.id, best.cluster, best.flavor, held))

    def most_free(self, flavor: str) -> int:
        return max((self.free(p) for p in self.pools_by_flavor[flavor]), default=0)

    def most_reclaimable(self, run: QueuedRun) -> int:
        return max(
            (
                self.free(p)
                + sum(
                    v.gpus
                    for v in self.borrowed[(p.cluster, p.flavor)]
                    if v.tenant != run.tenant and (p.cluster, p.flavor) not in self.fenced
                )
                for p in self.pools_by_flavor[run.flavor]
                if self.fits_shape(run, p)
            ),
            default=0,
        )


def decide(snapshot: Snapshot) -> Decisions:
    state = _State(snapshot)
    order = sorted(snapshot.queued, key=queue_order)
    queues: dict[tuple[str, str], list[QueuedRun]] = defaultdict(list)
    for run in order:
        queues[(run.tenant, run.flavor)].append(run)

    admitted: list[Admit] = []
    preempted: list[Preempt] = []
    waits: dict[int, tuple[Wait, str]] = {}
    reservations: list[Reservation] = []
    blocked: dict[tuple[str, str], int] = {}  # (tenant, flavor) -> the head run that waits
    borrowers: dict[tuple[str, str], int] = {}  # (tenant, flavor) -> index of its first borrower

    def block(key: tuple[str, str], run: QueuedRun, reason: Wait, message: str) -> None:
        blocked[key] = run.id
        waits[run.id] = (reason, message)

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
            pool = state.best_fit(run)
            victims: list[HeldRun] = []
            if pool is None:
                options = []
                for candidate in state.pools_by_flavor[run.flavor]:
                    if not state.fits_shape(run, candidate):
                        continue
                    chosen = state.victims(run, candidate)
                    if chosen is not None:
                        cost = (sum(v.gpus for v in chosen), len(chosen), candidate.cluster)
                        options.append((cost, candidate, chosen))
                if options:
                    _, pool, victims = min(options, key=lambda option: option[0])
            if pool is None:
                block(
                    key, run, Wait.CAPACITY,
                    f"needs {run.gpus} {run.flavor} GPUs ({run.nodes}×{run.gpus_per_node}) on one "
                    f"cluster within the tenant's guarantee; at most {state.most_reclaimable(run)} "
                    "can be freed on any cluster, counting borrowed GPUs it may reclaim",
                )  # fmt: skip
                state.reserve(run, reservations)
                continue
            for victim in victims:
                state.preempt(victim)
                preempted.append(
                    Preempt(
                        run_id=victim.id,
                        by_run_id=run.id,
                        message=(
                            f"tenant {run.tenant} reclaimed {run.gpus} {run.flavor} GPUs of its "
                            f"guarantee on {pool.cluster} for run {run.id}; this run had borrowed "
                            f"{victim.gpus}"
                        ),
                    )
                )
            state.admit(run, pool)
            admitted.append(Admit(run.id, pool.cluster, borrowed=False, over_budget=over_budget))
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

    # Phase 2: borrowers take turns by weighted fair share, idle GPUs only.
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
            if quota.borrow_limit == 0:
                block(
                    key, run, Wait.QUOTA,
                    f"tenant {tenant} uses {in_use} of {quota.guaranteed} guaranteed {flavor} "
                    f"GPUs and may not borrow; this run needs {run.gpus}",
                )  # fmt: skip
            else:
                block(
                    key, run, Wait.BORROW_LIMIT,
                    f"tenant {tenant} uses {in_use} of {quota.guaranteed} guaranteed + "
                    f"{quota.borrow_limit} borrowable {flavor} GPUs; this run needs {run.gpus}",
                )  # fmt: skip
            continue
        pool = state.best_fit(run)
        if pool is None:
            block(
                key, run, Wait.NO_IDLE,
                f"tenant {tenant} uses {in_use} of {quota.guaranteed} guaranteed {flavor} GPUs; "
                f"this run would borrow {run.gpus} and the clusters have "
                f"{state.most_free(flavor)} idle GPUs to lend",
            )  # fmt: skip
            state.reserve(run, reservations)  # binds the borrowers after it
            continue
        state.admit(run, pool)
        admitted.append(
            Admit(run.id, pool.cluster, borrowed=in_use + run.gpus > quota.guaranteed,
                  over_budget=over_budget)
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
        waiting.append(Waiting(run.id, reason, message, positions[run.flavor]))
    return Decisions(
        admitted=tuple(admitted),
        preempted=tuple(preempted),
        waiting=tuple(waiting),
        reservations=tuple(reservations),
    )


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
