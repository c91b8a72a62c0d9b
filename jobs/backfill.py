"""Backfill inside a tenant and flavor (EASY): what a waiting head reserves and which later
runs of its tenant may start ahead of it (pure: no ORM, no clock, no I/O).

When the first run in a tenant's line for a flavor cannot be placed, ``plan`` finds the
start it is reserved under the ``backfill`` policy: the held runs of each cluster end, at
the latest, at their max runtimes; the first moment the head would have a placement (its
``nodes`` nodes in one domain of its required level each with its GPUs) is its *reserved
start* (Slurm's "shadow time"), and those nodes are its *reserved nodes*. On them, GPUs
beyond what the head will need at that moment are *spare*. A later run of the tenant may
then start now (``fit``) if it fits on GPUs free now and either ends by the reserved start
at its own max runtime, or takes on the reserved nodes only spare GPUs. Either way the
head's reserved nodes are as free at the reserved start as they were without it: backfill
never makes the head start later than its latest start without it (for the runs of one
tenant; another tenant's runs are not held back by the reservation, as under ``strict``:
docs/admission.md, "Backfill").

A head that could not be placed even with every Gantry run gone (load from outside
Gantry, drained nodes, a gang larger than any domain at its required level) reserves
nothing and holds nobody back (``plan`` returns ``NEVER``).

``jobs.admission`` asks; the clusters' state is ``jobs.admission_state``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from jobs import placement
from jobs.admission_pool import PoolState
from jobs.admission_state import CycleState
from jobs.admission_types import QueuedRun, Shadow


@dataclass(slots=True)
class Plan:
    """A head's reservation as a cycle goes: its reserved start and nodes, and what is
    spare on those nodes (less what runs started ahead of it since took there)."""

    head: int
    pool: PoolState
    nodes: tuple[str, ...]
    at: float | None  # None: a run it waits on has no bound
    spare: dict[str, int] = field(default_factory=dict)

    def shadow(self) -> Shadow:
        return Shadow(self.head, self.pool.cluster, self.pool.flavor, self.nodes, self.at)


NEVER = "never"  # the head has no placement even with every Gantry run gone
NOWHERE = "it does not fit the GPUs free now either"


def plan(state: CycleState, head: QueuedRun) -> Plan | str:
    """The head's reserved start: the earliest, over the clusters, at which the held runs'
    latest ends leave it a placement (then the cluster's name); ``NEVER`` if no cluster
    has one even with all of them gone. Heads of one shape asked about while nothing
    changed share the answer (each gets its own copy: what is spare is counted down)."""
    key = ("plan", *state.shape(head))
    if key not in state.answers:
        state.answers[key] = _plan(state, head)
    found = state.answers[key]
    if not isinstance(found, Plan):
        return NEVER
    return Plan(head.id, found.pool, found.nodes, found.at, dict(found.spare))


def _plan(state: CycleState, head: QueuedRun) -> Plan | None:
    best: Plan | None = None
    for pool in state.pools_by_flavor[head.flavor]:
        found = _plan_on(state, pool, head)
        if found is None:
            continue
        if (
            best is None
            or _later(best.at, found.at)
            or (best.at == found.at and found.pool.cluster < best.pool.cluster)
        ):
            best = found
    return best


def _later(a: float | None, b: float | None) -> bool:
    """Is ``a`` later than ``b`` (None is never)?"""
    return (math.inf if a is None else a) > (math.inf if b is None else b)


def _plan_on(state: CycleState, pool: PoolState, head: QueuedRun) -> Plan | None:
    """The head's reserved start on one pool. Remembered until the pool changes (the held
    runs' latest ends do not change within a cycle)."""
    level = pool.required_level(head)
    if level == -1:
        return None
    gang = (head.nodes, head.gpus_per_node, level, head.excluded)
    found = pool.remembered(("plan", gang), lambda: _earliest(state, pool, head))
    if found is None:
        return None
    nodes, at, spare = found
    return Plan(head.id, pool, nodes, at, dict(spare))


def _earliest(
    state: CycleState, pool: PoolState, head: QueuedRun
) -> tuple[tuple[str, ...], float | None, dict[str, int]] | None:
    """When and where the head first has a placement on the pool as the held runs end at
    their latest ends (one overdue ends now, one with no bound never). A node is ready when
    enough of its runs have ended to leave the gang's GPUs per node; a domain of the
    required level (the pool, for none), when its ``nodes``-th node is; the reservation
    takes the first domain ready and its nodes ready first (then by name), each with what
    it will have beyond the gang's need then."""
    level = pool.required_level(head)
    # Only nodes that could ever hold the gang, by domain (remembered per shape).
    domains = [
        [name for name in names if name not in head.excluded]
        for names in pool.capable(head.gpus_per_node, level)
    ]
    if not any(len(names) >= head.nodes for names in domains):
        return None
    ending = pool.remembered(("ending",), lambda: _ending(state, pool))
    need = head.gpus_per_node
    best: tuple[float, list[tuple[float, str]]] | None = None
    for names in domains:
        ready = []
        for name in names:
            room, at = pool.available(name), state.now
            for end, gpus in ending.get(name, ()):
                if room >= need:
                    break
                room, at = room + gpus, end
            if room >= need:
                ready.append((at, name))
        if len(ready) >= head.nodes:
            ready.sort()
            start = ready[head.nodes - 1][0]
            if best is None or start < best[0]:
                best = (start, ready[: head.nodes])
    if best is None:
        return None
    start, chosen = best
    # What is spare on a chosen node at the start: beyond the gang's need, once every run
    # there that ends by then has ended.
    spare = {
        name: pool.available(name)
        + sum(gpus for end, gpus in ending.get(name, ()) if end <= start)
        - need
        for _, name in chosen
    }
    return tuple(sorted(spare)), None if start == math.inf else start, spare


def _ending(state: CycleState, pool: PoolState) -> dict[str, list[tuple[float, int]]]:
    """Per node of the pool, its runs' latest ends and GPUs, soonest first (a run overdue
    ends now; one with no bound, never)."""
    ending: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for run_id in pool.holders:
        end = state.latest_end.get(run_id)
        at = math.inf if end is None else max(end, state.now)
        for name, gpus in state.held_on[run_id].items():
            ending[name].append((at, gpus))
    for runs in ending.values():
        runs.sort()
    return dict(ending)


@dataclass(frozen=True, slots=True)
class Backfill:
    """Where a later run may start now ahead of the head, and why that is allowed."""

    pool: PoolState
    where: placement.Placement
    because: str


def fit(
    state: CycleState,
    run: QueuedRun,
    pools: list[PoolState],
    reserved: Plan | None,
    *,
    others: Sequence[Plan] = (),
    unreserved: str,
) -> Backfill | str:
    """Where ``run`` starts now ahead of its tenant's waiting head, among ``pools`` (those
    whose policy lets it pass), keeping the head's ``reserved`` start and the reserved
    starts of ``others``, the waiting heads of other tenants; or why it may not, phrased to
    follow "waiting behind run N ...; " (naming no other tenant's run). With no
    reservation of its own head to keep, ``unreserved`` says why it may go."""
    if state.best_fit(run) is None:  # the common case on a busy cluster, remembered
        return NOWHERE
    own = [reserved] if reserved is not None else []
    binding = [plan for plan in (*own, *others) if not _ends_first(state, run, plan)]
    best: tuple[tuple[object, ...], PoolState, placement.Placement] | None = None
    crossing: tuple[PoolState, placement.Placement] | None = None  # onto reserved GPUs
    for pool in pools:
        where = pool.place(run)
        if where is None:
            continue
        limits = _only_spare(pool, [plan for plan in binding if plan.pool is pool])
        if limits:
            kept = pool.place(run, limits)
            if kept is None:
                crossing = crossing or (pool, where)
                continue
            where = kept
        rank = (_tightness(where), pool.left_after(run, where), pool.cluster)
        if best is None or rank < best[0]:
            best = (rank, pool, where)
    if best is not None:
        _, pool, where = best
        if reserved is None:
            because = unreserved
        elif pool is reserved.pool and reserved not in binding:
            because = (
                f"it ends by {clock(state.ends_by(run))} at the latest, "
                f"before run {reserved.head}'s reserved start at {clock(reserved.at)}"
            )
        else:
            because = f"it uses GPUs run {reserved.head} does not need"
        return Backfill(pool, where, because)
    if crossing is None:
        return NOWHERE
    pool, where = crossing
    if reserved is not None and reserved in binding and reserved.pool is pool:
        mine = sorted(set(where.nodes) & set(reserved.nodes))
        if mine:
            return _crossing_own(run, reserved, ", ".join(mine))
    blocking = [
        plan for plan in binding if plan.pool is pool and set(plan.nodes) & set(where.nodes)
    ]
    if not blocking:
        return NOWHERE
    first = min(blocking, key=lambda plan: math.inf if plan.at is None else plan.at)
    on = ", ".join(sorted(set(where.nodes) & set(first.nodes)))
    return (
        f"GPUs on {on} are reserved for a run of another tenant waiting first in its line "
        f"from {clock(first.at)}, and it would still run then"
    )


def _crossing_own(run: QueuedRun, reserved: Plan, on: str) -> str:
    head = reserved.head
    if reserved.at is None:
        return (
            f"run {head}'s reserved nodes ({on}) have no known start (a run there has no "
            f"maximum runtime), so it may use only GPUs run {head} does not need there"
        )
    if run.max_runtime_s is None:
        return (
            f"it has no maximum runtime, so it cannot start ahead of run {head}'s reserved "
            f"start at {clock(reserved.at)} on {on}"
        )
    return f"it would end after run {head}'s reserved start at {clock(reserved.at)} on {on}"


def _ends_first(state: CycleState, run: QueuedRun, reserved: Plan | None) -> bool:
    """Does ``run``, admitted now, end by the head's reserved start at its max runtime?"""
    ends = state.ends_by(run)
    if reserved is None or reserved.at is None or ends is None:
        return False
    return ends <= reserved.at


def took(state: CycleState, run: QueuedRun, started: Backfill, reserved: list[Plan]) -> None:
    """A run started ahead of a head: what it took on the nodes reserved for each waiting
    head is no longer spare there, unless it ends by that head's reserved start."""
    for plan in reserved:
        if started.pool is not plan.pool or _ends_first(state, run, plan):
            continue
        for name in started.where.nodes:
            if name in plan.spare:
                plan.spare[name] -= run.gpus_per_node


def _only_spare(pool: PoolState, plans: list[Plan]) -> dict[str, int]:
    """``extra`` for ``PoolState.place``: on every node reserved by one of ``plans``, only
    what is spare for all of them."""
    cap: dict[str, int] = {}
    for plan in plans:
        for name in plan.nodes:
            cap[name] = min(cap.get(name, pool.available(name)), plan.spare[name])
    return {name: min(0, room - pool.available(name)) for name, room in cap.items()}


def _tightness(where: placement.Placement) -> tuple[int, ...]:
    return () if where.single_node else (-len(where.domain),)


def clock(at: float | None) -> str:
    """An instant as the wait messages say it: UTC, as stored messages say every time,
    rounded up to the minute (a reserved start is never said earlier than it is)."""
    if at is None:
        return "an unknown time"
    return datetime.fromtimestamp(math.ceil(at / 60) * 60, UTC).strftime("%Y-%m-%d %H:%M UTC")
