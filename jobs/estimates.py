"""When will a queued run start? Admission simulated forward in time (pure: no ORM, no
clock, no I/O).

From a snapshot of the queue and the clusters, ``simulate`` replays the admission cycle
(``jobs.admission.decide``'s decisions, placement and reservations included) at each
instant a held run ends, admitting what fits then, until every queued run has started, the
horizon is reached or nothing more is known to end. Each simulated cycle decides only the
flavors whose GPUs changed hands, on the clusters' state kept from the cycle before
(``jobs.estimates_state``: the same decisions as ``decide`` at a fraction of the cost;
bench/estimates_reference.py keeps the simulation that called ``decide`` itself, which
tests/jobs/test_estimates_incremental.py holds this one to). What it assumes:

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

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from jobs import admission, admission_types, estimates_lines, estimates_state, placement

DAY_S = 86_400.0
Key = tuple[str, str]  # (tenant, flavor)
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
    run = _Simulation(snapshot, ends=ends, runtimes=runtimes)
    # Why the simulation ended: "steps", "horizon" or "stuck" (nothing more is known to end).
    # Read only for the runs left without a start, so a queue emptied early needs no state.
    stopped = "steps"
    for _ in range(max_steps):
        decisions = run.cycle()
        run.record_step()
        soonest = run.next_end()
        if soonest is None:
            stopped = "stuck"
            break
        following = _on_grid(soonest, now=now, at=run.at, resolution=resolution,
                             min_step_s=min_step_s)  # fmt: skip
        if following > until:
            stopped = "horizon"
            break
        run.advance(following, requeued=decisions.preempted)

    starts = {**run.starts, **run.no_starts(stopped=stopped, horizon_s=horizon_s)}
    return Forecast(
        starts=starts, steps=tuple(run.steps), until=until, ready=_ready(snapshot.queued, starts)
    )


class _Simulation:
    """The clusters and the queue as the simulation moves them forward, one admission cycle
    at a time (``cycle``, then ``advance`` to the next end), and the starts found so far."""

    def __init__(
        self,
        snapshot: admission_types.Snapshot,
        *,
        ends: Mapping[int, float | None],
        runtimes: Mapping[int, float | None],
    ):
        self.snapshot = snapshot
        self.runtimes = runtimes
        self.at = snapshot.now
        self.queued = {run.id: run for run in snapshot.queued}
        self.originals = set(self.queued)
        # A run preempted in the simulation starts again with its whole max runtime, as a
        # new attempt does; known for the queued runs of the snapshot (None: no bound).
        self.max_runtimes = {run.id: run.max_runtime_s for run in snapshot.queued}
        self.held = {run.id: run for run in snapshot.held}
        self.clusters = estimates_state.Clusters(snapshot)
        self.end_at = {run.id: ends.get(run.id) for run in snapshot.held}
        # The known ends as a heap of (end, when it came into ``end_at``, run id): an entry
        # whose run no longer ends then (preempted) is dropped as it comes up.
        self.arrival = {run_id: index for index, run_id in enumerate(self.end_at)}
        self.ends_heap = [
            (end, self.arrival[run_id], run_id)
            for run_id, end in self.end_at.items()
            if end is not None
        ]
        heapq.heapify(self.ends_heap)
        self.on_nodes = {
            run_id: dict(nodes) for run_id, nodes in admission.held_placements(snapshot).items()
        }
        self.free = _free_at_start(snapshot, self.on_nodes)
        self.usage: dict[str, int] = defaultdict(int)
        for run in snapshot.held:
            self.usage[f"{run.tenant}/{run.flavor}"] += run.gpus
        self.starts: dict[int, Start] = {}
        self.steps: list[Step] = []
        self.left_by: dict[str, int] = {}  # "cluster/node" -> the run that last left it
        self.last_free: dict[str, int] = {}
        self.last_usage: dict[str, int] = {}
        # The keys of ``free`` and ``usage`` written since the last step (all, before the
        # first): only those can differ from it.
        self.touched_free: set[str] = set(self.free)
        self.touched_usage: set[str] = set(self.usage)
        # Where each key stands in ``free`` and ``usage`` (a dict keeps its keys in the
        # order they came in): a step lists its keys in that order.
        self.order_free = {key: index for index, key in enumerate(self.free)}
        self.order_usage = {key: index for index, key in enumerate(self.usage)}
        self.waits: dict[
            tuple[str, str], admission_types.Wait
        ] = {}  # (tenant, flavor) -> head's wait
        self.lines = estimates_lines.Lines(self.queued.values())
        self.resumed: dict[int, float | None] = {}  # preempted run -> the time it had left
        # Flavors whose GPUs changed hands since the last simulated cycle. Flavors share
        # nothing in admission, and a cycle over a flavor where nothing changed decides
        # nothing new (what could start started the cycle before; a run that began starving
        # since only holds nodes back), so only these are decided again.
        self.changed = {run.flavor for run in snapshot.queued}
        # Lines whose blocked head may be passed (``estimates_lines.Lines``).
        self.passable = _passable(snapshot)

    def cycle(self) -> admission_types.Decisions:
        """The admission cycle at ``at``, its decisions applied: the heads' waits noted,
        the preempted runs back in the queue, the admitted ones holding their nodes."""
        decisions = self._decide()
        for preempt in decisions.preempted:
            self._requeue(self.held.pop(preempt.run_id))
        for admit in decisions.admitted:
            self._admit(admit)
        return decisions

    def _decide(self) -> admission_types.Decisions:
        """The cycle's decisions, flavor by flavor (flavors share nothing in admission)."""
        # Once the queue is empty the steps go on, without decisions, as the held runs end:
        # the preview places a newcomer on them (``first_fit``).
        if not self.lines:
            return _NOTHING
        snapshot = replace(self.snapshot, now=self.at)
        admitted: list[admission_types.Admit] = []
        preempted: list[admission_types.Preempt] = []
        for flavor in sorted(self.changed):
            decisions, waits = estimates_state.decide_flavor(
                snapshot, self.clusters, self.lines, flavor, passable=self.passable
            )
            admitted += decisions.admitted
            preempted += decisions.preempted
            self.waits.update(waits)  # why the first run of each line decided waits
        return admission_types.Decisions(tuple(admitted), tuple(preempted), ())

    def _requeue(self, victim: admission_types.HeldRun) -> None:
        end = self.end_at.pop(victim.id, None)
        self.clusters.remove(victim.id)
        # Back in the queue with the work it had left (``runtimes`` knows queued runs only);
        # it holds its GPUs for that long once it starts again.
        self.resumed[victim.id] = None if end is None else max(0.0, end - self.at)
        self._leave(victim, record=False)
        # It goes back to the queue, as the real cycle sends it, and competes again.
        count = max(1, len(victim.nodes))
        self.queued[victim.id] = admission_types.QueuedRun(
            id=victim.id, tenant=victim.tenant, flavor=victim.flavor, nodes=count,
            gpus_per_node=max(1, victim.gpus // count), priority=victim.priority,
            submitted=victim.admitted, max_runtime_s=self.max_runtimes.get(victim.id),
        )  # fmt: skip
        self.lines.add(self.queued[victim.id])

    def _admit(self, admit: admission_types.Admit) -> None:
        entering = self.queued.pop(admit.run_id)
        self.lines.remove(entering)
        if entering.id in self.originals and entering.id not in self.starts:
            keys = [f"{admit.cluster}/{name}" for name in admit.nodes]
            behind = tuple(sorted({self.left_by[key] for key in keys if key in self.left_by}))
            self.starts[entering.id] = Start(
                entering.id, self.at, admit.cluster, admit.nodes, behind
            )
        # Bounded by its max runtime, whatever ``runtimes`` says it takes: the bound the real
        # cycle's backfill reads of a held run (``HeldRun.latest_end``).
        bound = entering.max_runtime_s
        self.held[entering.id] = held = admission_types.HeldRun(
            id=entering.id,
            tenant=entering.tenant,
            flavor=entering.flavor,
            cluster=admit.cluster,
            gpus=entering.gpus,
            priority=entering.priority,
            admitted=self.at,
            borrowed=admit.borrowed,
            nodes=admit.nodes,
            latest_end=None if bound is None else self.at + bound,
        )
        self.clusters.add(held)
        self.on_nodes[entering.id] = dict.fromkeys(admit.nodes, entering.gpus_per_node)
        runtime = (
            self.resumed.pop(entering.id)
            if entering.id in self.resumed
            else self.runtimes.get(entering.id)
        )
        self.end_at[entering.id] = end = self.at + runtime if runtime is not None else None
        self.arrival[entering.id] = arrival = len(self.arrival)
        if end is not None:
            heapq.heappush(self.ends_heap, (end, arrival, entering.id))
        usage_key = f"{entering.tenant}/{entering.flavor}"
        self.order_usage.setdefault(usage_key, len(self.order_usage))
        self.usage[usage_key] += entering.gpus
        self.touched_usage.add(usage_key)
        for name in admit.nodes:
            key = f"{admit.cluster}/{name}"
            self.free[key] = max(0, self.free[key] - entering.gpus_per_node)
            self.touched_free.add(key)

    def record_step(self) -> None:
        """The clusters after this cycle, as what changed since the previous step (in the
        order of ``free`` and ``usage``)."""
        free, usage, last_free, last_usage = self.free, self.usage, self.last_free, self.last_usage
        changed_free = [key for key in self.touched_free if last_free.get(key) != free[key]]
        changed_usage = [key for key in self.touched_usage if last_usage.get(key) != usage[key]]
        order_free, order_usage = self.order_free, self.order_usage
        self.steps.append(
            Step(
                at=self.at,
                free={key: free[key] for key in sorted(changed_free, key=order_free.__getitem__)},
                usage={
                    key: usage[key] for key in sorted(changed_usage, key=order_usage.__getitem__)
                },
            )
        )
        for key in changed_free:
            last_free[key] = free[key]
        for key in changed_usage:
            last_usage[key] = usage[key]
        self.touched_free, self.touched_usage = set(), set()

    def advance(self, following: float, *, requeued: Sequence[admission_types.Preempt]) -> None:
        """To ``following``: every run ending by then leaves its nodes, and the flavors of
        those runs and of the runs ``requeued`` this cycle are decided again."""
        heap, arrived = self.ends_heap, []
        while heap and heap[0][0] <= following:
            end, arrival, run_id = heapq.heappop(heap)
            if self.arrival.get(run_id) == arrival and self.end_at.get(run_id) == end:
                arrived.append((arrival, run_id))
        # In the order they came into ``end_at`` (the last to leave a node is behind it).
        ending = [run_id for _, run_id in sorted(arrived)]
        self.changed = {self.queued[preempt.run_id].flavor for preempt in requeued}
        for run_id in ending:
            self.changed.add(self.held[run_id].flavor)
            del self.end_at[run_id]
            self.clusters.remove(run_id)
            self._leave(self.held.pop(run_id), record=True)
        self.at = following

    def next_end(self) -> float | None:
        """The soonest a held run is known to end; None if none is."""
        heap = self.ends_heap
        while heap:
            end, arrival, run_id = heap[0]
            if self.arrival.get(run_id) == arrival and self.end_at.get(run_id) == end:
                return end
            heapq.heappop(heap)
        return None

    def _leave(self, run: admission_types.HeldRun, *, record: bool) -> None:
        """``run`` frees its GPUs (``_leave``), the keys it changes noted for the step."""
        nodes = self.on_nodes.pop(run.id, {})
        _leave(run, nodes, self.free, self.usage, self.left_by, record=record)
        self.touched_usage.add(f"{run.tenant}/{run.flavor}")
        self.touched_free.update(
            key for name in nodes if (key := f"{run.cluster}/{name}") in self.free
        )

    def no_starts(self, *, stopped: str, horizon_s: float) -> dict[int, Start]:
        """A start without a number for every queued run of the snapshot that did not
        start, with the reason, by what ended the simulation (``stopped``)."""
        unbounded = _no_bound_reasons(self.snapshot, end_at=self.end_at, held=self.held)
        flavors = {node.flavor for node in self.snapshot.nodes}
        starts = {}
        for run_id in sorted(self.originals - self.starts.keys()):
            left = self.queued[run_id]
            wait = self.waits.get((left.tenant, left.flavor))
            if left.flavor not in flavors:
                why = f"no enabled cluster has {left.flavor} GPUs"
            elif wait in STUCK:
                why = STUCK[wait]
            elif stopped == "horizon":
                why = f"it does not start within the {horizon_s / 3600:,.0f} hours looked ahead"
            elif stopped == "steps":
                simulated = (self.at - self.snapshot.now) / 3600
                why = f"it does not start within the {simulated:,.0f} hours simulated"
            else:
                why = (
                    unbounded.get(left.flavor)
                    or "it cannot start while the clusters stay as they are"
                )
            starts[run_id] = Start(run_id, None, why=why)
        return starts


def _passable(snapshot: admission_types.Snapshot) -> set[Key]:
    """The lines (tenant, flavor) whose blocked head a later run may pass: their tenant's
    queueing policy is not ``strict`` on a cluster with nodes of the flavor. Of the tenants
    with runs of the flavor, queued or held (and so queued again if preempted)."""
    clusters: dict[str, set[str]] = defaultdict(set)
    for node in snapshot.nodes:
        clusters[node.flavor].add(node.cluster)
    strict = admission_types.Queueing.STRICT
    lines = {(run.tenant, run.flavor) for run in snapshot.queued}
    lines |= {(run.tenant, run.flavor) for run in snapshot.held}
    return {
        (tenant, flavor)
        for tenant, flavor in lines
        if any(
            (snapshot.tenant_queueing.get(tenant) or snapshot.queueing.get(cluster, strict))
            is not strict
            for cluster in clusters[flavor]
        )
    }


def _free_at_start(
    snapshot: admission_types.Snapshot, on_nodes: Mapping[int, Mapping[str, int]]
) -> dict[str, int]:
    """ "cluster/node" -> GPUs free for Gantry's runs: none on a node that takes no work, less
    what jobs from outside Gantry and the held runs use."""
    free = {
        f"{node.cluster}/{node.name}": max(0, node.gpus - node.outside) if node.schedulable else 0
        for node in snapshot.nodes
    }
    clusters_of = {run.id: run.cluster for run in snapshot.held}
    for run_id, nodes in on_nodes.items():
        for name, gpus in nodes.items():
            key = f"{clusters_of[run_id]}/{name}"
            if key in free:
                free[key] = max(0, free[key] - gpus)
    return free


def _ready(
    queued: Iterable[admission_types.QueuedRun], starts: Mapping[int, Start]
) -> dict[str, float | None]:
    """ "tenant/flavor" -> when the last of its queued runs starts; None if one never does."""
    ready: dict[str, float | None] = {}
    for waiting in queued:
        key = f"{waiting.tenant}/{waiting.flavor}"
        start = starts[waiting.id].at
        if key in ready and ready[key] is None:
            continue
        ready[key] = None if start is None else max(start, ready.get(key) or start)
    return ready


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
        if end is None:  # every run in end_at is held
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


# The lines of the queue, by flavor: ``estimates_lines.Lines`` (its ``FRONT`` is read there).
_Lines = estimates_lines.Lines
