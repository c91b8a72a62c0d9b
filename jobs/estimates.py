"""When will a queued run start? Admission simulated forward in time (pure: no ORM, no
clock, no I/O).

From a snapshot of the queue and the clusters, ``simulate`` replays the admission cycle
(``jobs.admission.decide``, placement and reservations included) at each instant a held
run ends, admitting what fits then, until every queued run has started, the horizon is
reached or nothing more is known to end. What it assumes:

- each held run frees its GPUs at ``ends[run]`` and each queued run holds its GPUs for
  ``runtimes[run]`` once started: the maximum runtimes give the start **at full time
  limits**, the durations predicted (``jobs.selectors.estimates``) the **expected** one;
  neither is a promise, as other work can go first (docs/admission.md);
- no other work arrives (a run with a higher priority, or one that fits where a waiting
  run does not, can still go first: the figure says so);
- what never ends by what is known (jobs from outside Gantry, a node that takes no work,
  a run with no bound) keeps its GPUs: a run that waits on it gets no number but the reason.

Ends close together are taken together: each step moves to the next end, rounded up to a
clock-aligned grid that widens with the distance (``resolution`` of it, at least
``min_step_s``, in round spacings: a minute, five, a quarter of an hour, …), so a
long queue costs a bounded number of cycles (``max_steps``). Rounding up only makes a
start later as a rule (not always: see docs/admission.md on anomalies).

``steps`` records the clusters after each simulated cycle (free GPUs per node, GPUs in use
per tenant and flavor), so the submit preview can say when a run not yet submitted would
start without simulating again (``first_fit``).
"""

import math
from bisect import insort
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from jobs import admission, admission_types, placement

DAY_S = 86_400.0
_NOTHING = admission_types.Decisions(admitted=(), preempted=(), waiting=())


@dataclass(frozen=True, slots=True)
class Start:
    run_id: int
    at: float | None  # epoch seconds; None when no bound exists
    cluster: str = ""
    nodes: tuple[str, ...] = ()  # where it would be placed
    behind: tuple[int, ...] = ()  # the runs whose end frees those nodes, by id
    why: str = ""  # with no number: why not (phrased to follow "no estimate: ")


@dataclass(frozen=True, slots=True)
class Step:
    """The clusters after the decisions of one simulated cycle: what changed since the
    previous step (the first step carries everything)."""

    at: float
    free: Mapping[str, int]  # "cluster/node" -> GPUs available to a newcomer
    usage: Mapping[str, int]  # "tenant/flavor" -> GPUs held


@dataclass(frozen=True, slots=True)
class Forecast:
    starts: Mapping[int, Start]  # every queued run of the snapshot
    steps: tuple[Step, ...]
    until: float  # how far ahead it looked
    # "tenant/flavor" -> when the last queued run of it starts (a newcomer waits behind it);
    # None if one of them never does.
    ready: Mapping[str, float | None]


def simulate(
    snapshot: admission_types.Snapshot,
    *,
    ends: Mapping[int, float | None],
    runtimes: Mapping[int, float | None],
    horizon_s: float = 7 * DAY_S,
    max_steps: int = 200,
    resolution: float = 0.05,
    min_step_s: float = 60.0,
) -> Forecast:
    """Starts for every queued run of ``snapshot``. ``ends``: held run id -> when it frees
    its GPUs (None: not known to end); ``runtimes``: queued run id -> seconds it holds them
    once started (None: no bound). Missing ids count as None."""
    now = snapshot.now
    until = now + horizon_s
    queued = {run.id: run for run in snapshot.queued}
    originals = set(queued)
    held = {run.id: run for run in snapshot.held}
    end_at = {run.id: ends.get(run.id) for run in snapshot.held}
    on_nodes = {
        run_id: dict(nodes) for run_id, nodes in admission.held_placements(snapshot).items()
    }
    clusters_of = {run.id: run.cluster for run in snapshot.held}
    free = {
        f"{node.cluster}/{node.name}": max(0, node.gpus - node.outside) if node.schedulable else 0
        for node in snapshot.nodes
    }
    for run_id, nodes in on_nodes.items():
        for name, gpus in nodes.items():
            key = f"{clusters_of[run_id]}/{name}"
            if key in free:
                free[key] = max(0, free[key] - gpus)
    usage: dict[str, int] = defaultdict(int)
    for run in snapshot.held:
        usage[f"{run.tenant}/{run.flavor}"] += run.gpus

    starts: dict[int, Start] = {}
    steps: list[Step] = []
    left_by: dict[str, int] = {}  # "cluster/node" -> the run that last left it
    last_free: dict[str, int] = {}
    last_usage: dict[str, int] = {}
    at = now
    # Why the simulation ended: "steps", "horizon" or "stuck" (nothing more is known to end).
    # Read only for the runs left without a start, so a queue emptied early needs no state.
    stopped = "steps"
    waits: dict[tuple[str, str], admission_types.Wait] = {}  # (tenant, flavor) -> its head's wait
    lines = _Lines(queued.values())
    resumed: dict[int, float | None] = {}  # preempted run -> the time it had left
    # Flavors whose GPUs changed hands since the last simulated cycle. Flavors share nothing
    # in admission, and a cycle over a flavor where nothing changed decides nothing new (what
    # could start started the cycle before; a run that began starving since only holds
    # nodes back), so only these are decided again.
    changed = {run.flavor for run in snapshot.queued}
    for _ in range(max_steps):
        # Once the queue is empty the steps go on, without decisions, as the held runs end:
        # the preview places a newcomer on them (``first_fit``).
        decisions = _NOTHING
        while lines and changed:
            decisions = admission.decide(
                replace(
                    snapshot,
                    queued=lines.front(changed),
                    held=tuple(run for run in held.values() if run.flavor in changed),
                    nodes=tuple(node for node in snapshot.nodes if node.flavor in changed),
                    now=at,
                ),
                explain=False,
            )
            if not lines.deepen({admit.run_id for admit in decisions.admitted}):
                break
        for wait in decisions.waiting:
            blocked = queued[wait.run_id]
            if lines.is_head(blocked):
                waits[(blocked.tenant, blocked.flavor)] = wait.reason
        for preempt in decisions.preempted:
            victim = held.pop(preempt.run_id)
            end = end_at.pop(victim.id, None)
            # Back in the queue with the work it had left (``runtimes`` knows queued runs
            # only); it holds its GPUs for that long once it starts again.
            resumed[victim.id] = None if end is None else max(0.0, end - at)
            _leave(victim, on_nodes.pop(victim.id, {}), free, usage, left_by, record=False)
            # It goes back to the queue, as the real cycle sends it, and competes again.
            count = max(1, len(victim.nodes))
            queued[victim.id] = admission_types.QueuedRun(
                id=victim.id, tenant=victim.tenant, flavor=victim.flavor, nodes=count,
                gpus_per_node=max(1, victim.gpus // count), priority=victim.priority,
                submitted=victim.admitted,
            )  # fmt: skip
            lines.add(queued[victim.id])
        for admit in decisions.admitted:
            entering = queued.pop(admit.run_id)
            lines.remove(entering)
            if entering.id in originals and entering.id not in starts:
                keys = [f"{admit.cluster}/{name}" for name in admit.nodes]
                behind = tuple(sorted({left_by[key] for key in keys if key in left_by}))
                starts[entering.id] = Start(entering.id, at, admit.cluster, admit.nodes, behind)
            held[entering.id] = admission_types.HeldRun(
                id=entering.id,
                tenant=entering.tenant,
                flavor=entering.flavor,
                cluster=admit.cluster,
                gpus=entering.gpus,
                priority=entering.priority,
                admitted=at,
                borrowed=admit.borrowed,
                nodes=admit.nodes,
            )
            on_nodes[entering.id] = dict.fromkeys(admit.nodes, entering.gpus_per_node)
            runtime = (
                resumed.pop(entering.id) if entering.id in resumed else runtimes.get(entering.id)
            )
            end_at[entering.id] = at + runtime if runtime is not None else None
            usage[f"{entering.tenant}/{entering.flavor}"] += entering.gpus
            for name in admit.nodes:
                key = f"{admit.cluster}/{name}"
                free[key] = max(0, free[key] - entering.gpus_per_node)
        steps.append(
            Step(
                at=at,
                free={k: v for k, v in free.items() if last_free.get(k) != v},
                usage={k: v for k, v in usage.items() if last_usage.get(k) != v},
            )
        )
        last_free, last_usage = dict(free), dict(usage)
        future = [end for end in end_at.values() if end is not None]
        if not future:
            stopped = "stuck"
            break
        following = _on_grid(min(future), now=now, at=at, resolution=resolution,
                             min_step_s=min_step_s)  # fmt: skip
        if following > until:
            stopped = "horizon"
            break
        ending = [run_id for run_id, end in end_at.items() if end is not None and end <= following]
        changed = {queued[preempt.run_id].flavor for preempt in decisions.preempted}
        for run_id in ending:
            changed.add(held[run_id].flavor)
            del end_at[run_id]
            _leave(held.pop(run_id), on_nodes.pop(run_id, {}), free, usage, left_by, record=True)
        at = following

    unbounded = _no_bound_reasons(snapshot, end_at=end_at, held=held)
    flavors = {node.flavor for node in snapshot.nodes}
    for run_id in sorted(originals - starts.keys()):
        left = queued[run_id]
        if left.flavor not in flavors:
            why = f"no enabled cluster has {left.flavor} GPUs"
        elif (left.tenant, left.flavor) in waits and waits[(left.tenant, left.flavor)] in STUCK:
            why = STUCK[waits[(left.tenant, left.flavor)]]
        elif stopped == "horizon":
            why = f"it does not start within the {horizon_s / 3600:,.0f} hours looked ahead"
        elif stopped == "steps":
            why = f"it does not start within the {(at - now) / 3600:,.0f} hours simulated"
        else:
            why = (
                unbounded.get(left.flavor) or "it cannot start while the clusters stay as they are"
            )
        starts[run_id] = Start(run_id, None, why=why)

    ready: dict[str, float | None] = {}
    for waiting in snapshot.queued:
        key = f"{waiting.tenant}/{waiting.flavor}"
        start = starts[waiting.id].at
        if key in ready and ready[key] is None:
            continue
        ready[key] = None if start is None else max(start, ready.get(key) or start)
    return Forecast(starts=starts, steps=tuple(steps), until=until, ready=ready)


# Waits that no run ending can lift: said as they are rather than as a start time (the
# forward simulation and the submit preview alike).
STUCK: dict[admission_types.Wait, str] = {
    admission_types.Wait.NO_QUOTA: "the tenant has no quota for this flavor",
    admission_types.Wait.TOO_LARGE: "it is larger than the tenant's quota allows per run",
    admission_types.Wait.BUDGET_EXHAUSTED: (
        "the tenant's hard GPU-hour budget for the month is spent; it starts when the budget "
        "resets or is raised"
    ),
}


class _Lines:
    """The queued runs of each tenant and flavor, in line (priority, then FIFO). A cycle
    admits a prefix of each line at most (a tenant's blocked run holds back its later ones),
    so ``decide`` is given only each line's first few runs (``front``): the same decisions
    as on the whole queue unless a whole front was admitted, in which case that line is
    given more (``deepen``) and the cycle decided again. With a long queue it is what keeps
    each simulated cycle cheap."""

    FRONT = 2

    def __init__(self, runs: Iterable[admission_types.QueuedRun]):
        self.lines: dict[tuple[str, str], list[admission_types.QueuedRun]] = defaultdict(list)
        for run in sorted(runs, key=admission_types.queue_order):
            self.lines[(run.tenant, run.flavor)].append(run)
        self.depth: dict[tuple[str, str], int] = {}

    def __bool__(self) -> bool:
        return bool(self.lines)

    def add(self, run: admission_types.QueuedRun) -> None:
        insort(self.lines[(run.tenant, run.flavor)], run, key=admission_types.queue_order)

    def remove(self, run: admission_types.QueuedRun) -> None:
        line = self.lines[(run.tenant, run.flavor)]
        line.remove(run)
        if not line:
            del self.lines[(run.tenant, run.flavor)]

    def is_head(self, run: admission_types.QueuedRun) -> bool:
        return self.lines[(run.tenant, run.flavor)][0] is run

    def front(self, flavors: set[str]) -> tuple[admission_types.QueuedRun, ...]:
        return tuple(
            run
            for key, line in self.lines.items()
            if key[1] in flavors
            for run in line[: self.depth.get(key, self.FRONT)]
        )

    def deepen(self, admitted: set[int]) -> bool:
        """Give more runs to each line whose whole front was admitted; whether any was."""
        deeper = False
        for key, line in self.lines.items():
            depth = self.depth.get(key, self.FRONT)
            if len(line) > depth and all(run.id in admitted for run in line[:depth]):
                self.depth[key] = depth * 4
                deeper = True
        return deeper


# Grid spacings, seconds: what the spacing at a distance is rounded down to, so steps fall
# on times people read easily (14:00, 14:30) and ends in one cell share a step.
_SPACINGS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10_800, 21_600, 43_200, 86_400)


def _on_grid(end: float, *, now: float, at: float, resolution: float, min_step_s: float) -> float:
    """``end`` rounded up to the grid at its distance from ``now``: a spacing of about
    ``resolution`` of the distance (at least ``min_step_s``), taken from ``_SPACINGS`` and
    aligned to the clock. Steps stay few however long the queue (the spacing grows with the
    distance) and rounding up never makes a start earlier. Always after ``at``."""
    if resolution <= 0 or min_step_s <= 0:  # no grid: every end is a step of its own
        return max(end, at)
    wanted = max(min_step_s, (end - now) * resolution)
    spacing = max([each for each in _SPACINGS if each <= wanted], default=min_step_s)
    return max(math.ceil(end / spacing) * spacing, at)


def _leave(
    run: admission_types.HeldRun,
    nodes: Mapping[str, int],
    free: dict[str, int],
    usage: dict[str, int],
    left_by: dict[str, int],
    *,
    record: bool,
) -> None:
    usage[f"{run.tenant}/{run.flavor}"] -= run.gpus
    for name, gpus in nodes.items():
        key = f"{run.cluster}/{name}"
        if key in free:
            free[key] += gpus
            if record:
                left_by[key] = run.id


def _no_bound_reasons(
    snapshot: admission_types.Snapshot,
    *,
    end_at: Mapping[int, float | None],
    held: Mapping[int, admission_types.HeldRun],
) -> dict[str, str]:
    """flavor -> what keeps GPUs of it without a known end, in words."""
    parts: dict[str, list[str]] = defaultdict(list)
    outside: dict[str, list[str]] = defaultdict(list)
    closed: dict[str, list[str]] = defaultdict(list)
    for node in snapshot.nodes:
        if not node.schedulable:
            closed[node.flavor].append(f"{node.name} ({node.reason or 'takes no work'})")
        elif node.outside:
            outside[node.flavor].append(node.name)
    for flavor, names in outside.items():
        parts[flavor].append(
            f"{_names(names)} {'is' if len(names) == 1 else 'are'} busy with jobs from outside "
            "Gantry, whose end is unknown"
        )
    for flavor, names in closed.items():
        parts[flavor].append(f"{_names(names)} take{'s' if len(names) == 1 else ''} no work")
    unbounded: dict[str, int] = defaultdict(int)
    for run_id, end in end_at.items():
        if end is None and run_id in held:
            unbounded[held[run_id].flavor] += 1
    for flavor, count in unbounded.items():
        parts[flavor].append(
            f"{count} run{'s' if count > 1 else ''} ahead {'have' if count > 1 else 'has'} "
            "no maximum runtime"
        )
    return {flavor: "no bound: " + "; ".join(texts) for flavor, texts in parts.items()}


def _names(names: Sequence[str], shown: int = 3) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def first_fit(
    forecast: Forecast,
    *,
    run: admission_types.QueuedRun,
    quota: admission_types.Quota | None,
    nodes: Sequence[admission_types.ClusterNode],
    levels: Mapping[str, tuple[str, ...]],
) -> Start:
    """When a run submitted now, behind every run already queued, would start: the first
    simulated cycle at which its tenant's earlier runs of the flavor have started, its
    quota has room and a placement exists on what the runs ahead left free."""
    if quota is None or quota.guaranteed + quota.borrow_limit == 0:
        return Start(run.id, None, why=f"tenant {run.tenant} has no quota for {run.flavor}")
    key = f"{run.tenant}/{run.flavor}"
    if key in forecast.ready and forecast.ready[key] is None:
        return Start(run.id, None, why="an earlier run of the tenant has no estimate")
    not_before = forecast.ready.get(key) or -math.inf
    pools: dict[str, list[admission_types.ClusterNode]] = defaultdict(list)
    for node in nodes:
        if node.flavor == run.flavor:
            pools[node.cluster].append(node)
    if not pools:
        return Start(run.id, None, why=f"no enabled cluster has {run.flavor} GPUs")
    free: dict[str, int] = {}
    usage: dict[str, int] = {}
    limit = quota.guaranteed + quota.borrow_limit
    for step in forecast.steps:
        free.update(step.free)
        usage.update(step.usage)
        if step.at < not_before or usage.get(key, 0) + run.gpus > limit:
            continue
        for cluster in sorted(pools):
            cluster_levels = levels.get(cluster, ())
            level = None
            if run.topology_required and run.topology_level:
                if run.topology_level not in cluster_levels:
                    continue
                level = cluster_levels.index(run.topology_level) + 1
            view = [
                placement.Node(node.name, node.gpus, free.get(f"{cluster}/{node.name}", 0),
                               node.schedulable, node.path, node.reason)
                for node in pools[cluster]
            ]  # fmt: skip
            where = placement.place(view, placement.Gang(run.nodes, run.gpus_per_node, level))
            if where is not None:
                return Start(run.id, step.at, cluster, where.nodes)
    looked = (forecast.until - forecast.steps[0].at) / 3600 if forecast.steps else 0
    return Start(run.id, None, why=f"it does not start within the {looked:,.0f} hours looked ahead")


# How many finished runs a history needs before it predicts: one earlier run of the same
# experiment or template says a lot; a tenant's runs of a size say less, so it takes three.
HISTORY_MINIMUM = (1, 1, 3)


def expected_runtime(histories: Sequence[Sequence[float]], *, max_runtime_s: float) -> float:
    """How long a run should take: the median of the first history, most specific first
    (the experiment's earlier runs, its template's, the tenant's of that flavor and size),
    that has enough runs; else its max runtime. Never more than the max runtime, so an
    outlier (a run that ran for 30 days) moves the median by one place, not the estimate."""
    for minimum, durations in zip(HISTORY_MINIMUM, histories, strict=False):
        if len(durations) >= minimum:
            ordered = sorted(durations)
            middle = len(ordered) // 2
            median = (
                ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
            )
            return min(max_runtime_s, median)
    return max_runtime_s


def expected_end(
    *, started: float | None, now: float, expected_s: float, latest_end: float
) -> float:
    """When a held run should free its GPUs: after its expected duration from its start
    (from now if it has not started). One already past that is expected to end within a
    tenth of the time it has left, never after its latest end."""
    if started is None:
        return min(latest_end, now + expected_s)
    end = started + expected_s
    if end <= now:
        end = now + (latest_end - now) / 10
    return min(latest_end, end)
