"""Replay of the Alibaba GPU trace (v2023, openb) through Gantry's admission and plain FIFO.

A discrete-event simulation in simulated seconds: arrivals at the task's creation time
(compressed, see ``LOADS``), completions when a run's remaining work is done. After
every batch of simultaneous events the admitter decides: Gantry calls
``jobs.admission.decide`` on a snapshot of the simulated platform (its nodes, and the
nodes each run holds), the baseline is global FIFO by arrival with head-of-line blocking
and no quotas, borrowing or preemption. Both place a run on nodes the way
``jobs.placement`` does (the tightest placement, then the one that leaves the fewest GPUs
free on the chosen nodes, then the cluster's name), on the same nodes, with the same tasks.
The mapping is in docs/benchmarks-notes.md.

The simulation (``Simulation``, ``Admitting``, ``Nodes``) is also the engine of
bench/placement.py, which adds a backend queue: a run admitted where no node placement
exists waits there, holding its quota, until one does.
"""

import csv
import hashlib
import heapq
import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import Section, quick
from jobs import placement
from jobs.admission import decide, fair_share_decayed
from jobs.admission_types import (
    ClusterNode,
    Decisions,
    HeldRun,
    Pool,
    QueuedRun,
    Queueing,
    Quota,
    Snapshot,
    nodes_of,
)

# Beside the checkout (``../shared/data``), or where GANTRY_BENCH_TRACE_DIR says: a second
# checkout (a git worktree elsewhere) reads the same copy of the trace.
TRACE = Path(
    os.environ.get("GANTRY_BENCH_TRACE_DIR")
    or Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
)
NODES_CSV = "openb_node_list_gpu_node.csv"
TASKS_CSV = "openb_pod_list_default.csv"
FLAVOR = "gpu"  # the default pod list constrains no GPU model: any GPU will do
TENANTS = 10
NODE_SHARE = 1 / 64  # of each (model, GPUs per node) group's nodes, rounded, at least one
LOADS = {"busy": 5, "overloaded": 10}  # arrival times are divided by this; run times are kept
QUICK_TASKS = 600  # GANTRY_BENCH_QUICK=1: the first tasks only
CHECKPOINT_EVERY_S = 1800  # a preempted run loses the work since its last checkpoint
STARVATION_AFTER_S = 1800.0  # GANTRY_STARVATION_AFTER_S's default
FAIR_SHARE_HALF_LIFE_S = 24 * 3600.0  # GANTRY_FAIR_SHARE_HALF_LIFE_H's default
GUARANTEED_CLASS = ("LS", "Guaranteed", "Burstable")
PRIORITY = {"LS": 50, "Guaranteed": 50, "Burstable": 50, "BE": 10}
QOS_ORDER = ("LS", "Guaranteed", "Burstable", "BE")
MAX_RUNTIME_STEP_S = 3600.0  # a run's max runtime: its run time rounded up to whole hours


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    name: str
    qos: str
    gpus_per_node: int
    arrival: float
    runtime: float
    flavor: str = FLAVOR
    nodes: int = 1
    tenant: str = ""  # empty: by hash of the name (tenant_of)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def max_runtime(task: Task) -> float:
    """The maximum runtime a run is submitted with: its run time rounded up to the next
    whole hour (at least one), what a user who knows the job asks for. It bounds each
    attempt; a requeued run has less work left, so it ends within it too."""
    return math.ceil(task.runtime / MAX_RUNTIME_STEP_S) * MAX_RUNTIME_STEP_S


def tenant_of(task: Task) -> str:
    """Stable: the same task is always the same tenant; BE tasks borrow under their own."""
    if task.tenant:
        return task.tenant
    tenant = (
        f"t{int(hashlib.sha1(task.name.encode(), usedforsecurity=False).hexdigest(), 16) % TENANTS}"
    )
    return tenant if task.qos in GUARANTEED_CLASS else f"{tenant}-be"


def node_groups() -> Counter[tuple[str, int]]:
    """(GPU model, GPUs per node) -> nodes, from the trace's node list."""
    groups: Counter[tuple[str, int]] = Counter()
    if not (TRACE / NODES_CSV).is_file():
        raise SystemExit(
            f"bench: the Alibaba GPU trace is not in {TRACE} (docs/benchmarks-notes.md, "
            "*Data*): set GANTRY_BENCH_TRACE_DIR to the folder that holds it"
        )
    with (TRACE / NODES_CSV).open() as f:
        for row in csv.DictReader(f):
            groups[(row["model"], int(row["gpu"]))] += 1
    return groups


def load_pools() -> tuple[Pool, ...]:
    """One cluster per GPU model and node size (the model is no flavor here: ``FLAVOR``)."""
    return tuple(
        Pool(
            f"{model.lower()}-x{gpus}",
            FLAVOR,
            nodes=max(1, round(count * NODE_SHARE)),
            gpus_per_node=gpus,
        )
        for (model, gpus), count in sorted(node_groups().items())
    )


def read_pods(name: str) -> list[dict[str, str]]:
    with (TRACE / name).open() as f:
        return list(csv.DictReader(f))


def ran(row: dict[str, str]) -> bool:
    """A GPU task that ran: it has GPUs and a scheduled time."""
    return int(row["num_gpu"]) >= 1 and bool(row.get("scheduled_time"))


def load_tasks(
    *,
    compression: float,
    rows: Iterable[dict[str, str]] | None = None,
    flavor_of: Callable[[dict[str, str]], str] = lambda row: FLAVOR,
) -> list[Task]:
    """GPU tasks that ran in the trace (``rows``: of ``TASKS_CSV`` unless given), each one
    run on one node; a fractional GPU is rounded up to a whole one."""
    tasks: list[Task] = []
    for row in read_pods(TASKS_CSV) if rows is None else rows:
        if not ran(row):
            continue
        runtime = int(row["deletion_time"]) - int(row["scheduled_time"])
        tasks.append(
            Task(
                id=len(tasks) + 1,
                name=row["name"],
                qos=row["qos"],
                gpus_per_node=int(row["num_gpu"]),
                arrival=int(row["creation_time"]) / compression,
                runtime=float(max(1, runtime)),
                flavor=flavor_of(row),
            )
        )
    return tasks


def make_quotas(tasks: list[Task], capacity: dict[str, int]) -> dict[tuple[str, str], Quota]:
    """Per flavor (``capacity``: its GPUs), guaranteed-class tenants split the GPUs evenly
    and may borrow the rest; BE tenants have no guarantee and may borrow them all."""
    quotas = {}
    tenants = sorted({tenant_of(t) for t in tasks})
    sharing = sum(1 for tenant in tenants if not tenant.endswith("-be"))
    for tenant in tenants:
        for flavor, gpus in capacity.items():
            guaranteed = 0 if tenant.endswith("-be") else gpus // sharing
            quotas[(tenant, flavor)] = Quota(guaranteed=guaranteed, borrow_limit=gpus - guaranteed)
    return quotas


def tightness(where: placement.Placement) -> tuple[int, int]:
    """Smaller is tighter: one node, then the deepest shared domain (as jobs.admission)."""
    return (0, 0) if where.single_node else (1, -len(where.domain))


class Nodes:
    """The clusters' GPU nodes as their backend sees them: the GPUs free on each, less the
    load from outside Gantry and Gantry's runs placed there. A gang goes where
    ``jobs.placement`` puts it; of several clusters, where admission would (the tightest
    placement, then the fewest GPUs left on the chosen nodes, then the name)."""

    def __init__(self, nodes: Iterable[ClusterNode]):
        self.node = {(n.cluster, n.name): n for n in nodes}
        self.free = {key: n.gpus - n.outside for key, n in self.node.items()}
        self.pools: dict[tuple[str, str], list[ClusterNode]] = defaultdict(list)
        for key in sorted(self.node):
            node = self.node[key]
            self.pools[(node.cluster, node.flavor)].append(node)
        self.clusters: dict[str, list[str]] = defaultdict(list)
        for cluster, flavor in sorted(self.pools):
            self.clusters[flavor].append(cluster)
        self.version: Counter[str] = Counter()  # per cluster: bumped by every change
        # Schedulable nodes with every GPU free, per flavor: where a full-node gang can start.
        self.whole: Counter[str] = Counter(
            n.flavor for key, n in self.node.items() if self.is_whole(key)
        )

    def is_whole(self, key: tuple[str, str]) -> bool:
        node = self.node[key]
        return node.schedulable and self.free[key] == node.gpus

    def capacity(self) -> dict[str, int]:
        """GPUs per flavor, the nodes' GPUs (what an operator sets quotas against)."""
        gpus: dict[str, int] = defaultdict(int)
        for n in self.node.values():
            gpus[n.flavor] += n.gpus
        return dict(gpus)

    def change(self, cluster: str, names: Iterable[str], gpus: int) -> None:
        """``gpus`` more free on each of ``names`` (fewer when negative)."""
        self.version[cluster] += 1
        for name in names:
            key = (cluster, name)
            before = self.is_whole(key)
            self.free[key] += gpus
            assert 0 <= self.free[key] <= self.node[key].gpus - self.node[key].outside, key
            self.whole[self.node[key].flavor] += self.is_whole(key) - before

    def place(self, run: QueuedRun, clusters: Iterable[str]) -> tuple[str, tuple[str, ...]] | None:
        best, best_rank = None, None
        for cluster in clusters:
            pool = self.pools.get((cluster, run.flavor), [])
            view = [
                placement.Node(n.name, n.gpus, self.free[(cluster, n.name)], n.schedulable, n.path)
                for n in pool
            ]
            where = placement.place(view, placement.Gang(run.nodes, run.gpus_per_node))
            if where is None:
                continue
            left = sum(self.free[(cluster, name)] - run.gpus_per_node for name in where.nodes)
            rank = (tightness(where), left, cluster)
            if best_rank is None or rank < best_rank:
                best, best_rank = (cluster, where.nodes), rank
        return best


@dataclass
class Result:
    policy: str
    waited: dict[int, float] = field(default_factory=dict)  # task id -> total queue time
    never_started: int = 0  # runs still waiting when the simulation ended
    first_arrival: float = 0.0
    last_arrival: float = 0.0
    last_end: float = 0.0
    busy_gpu_s: float = 0.0  # GPU-seconds of runs placed on nodes
    window_busy_gpu_s: float = 0.0  # the same, from the first arrival to the last
    unplaced_gpu_s: float = 0.0  # GPU-seconds admitted, waiting at the backend for nodes
    whole_node_s: dict[str, float] = field(default_factory=dict)  # flavor -> seconds
    waiting_s: float = 0.0  # time during which some run waited
    used_while_waiting_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    decision_s: list[float] = field(default_factory=list)


ARRIVAL, COMPLETION = 0, 1


@dataclass
class Held:
    """An admitted run: on its nodes once placed (``started`` set), else at the backend."""

    run: QueuedRun
    cluster: str
    borrowed: bool
    admitted: float
    nodes: tuple[str, ...] = ()
    started: float | None = None


class Simulation:
    """The platform in simulated time; subclasses are the admission policies. ``until``:
    stop then (simulated seconds) even if runs are left."""

    policy = ""

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        self.tasks = {t.id: t for t in tasks}
        self.nodes = Nodes(nodes)
        self.until = until
        self.result = Result(
            self.policy,
            first_arrival=min(t.arrival for t in tasks),
            last_arrival=max(t.arrival for t in tasks),
            whole_node_s=dict.fromkeys(self.nodes.clusters, 0.0),
        )
        self.events = [(t.arrival, ARRIVAL, t.id, 0) for t in tasks]
        heapq.heapify(self.events)
        self.queued: dict[int, QueuedRun] = {}  # in arrival order, requeued runs last
        self.waiting_since: dict[int, float] = {}  # until it starts on nodes
        self.remaining = {t.id: t.runtime for t in tasks}  # work left, in seconds
        self.held: dict[int, Held] = {}
        self.backend: dict[int, Held] = {}  # admitted, no nodes yet: in admission order
        self.attempts: dict[int, int] = defaultdict(int)
        self.placed_gpus = 0
        self.now = 0.0

    def run(self) -> Result:
        while self.events and self.events[0][0] <= self.until:
            now = self.events[0][0]
            self.advance(now)
            while self.events and self.events[0][0] == now:
                _, kind, task_id, attempt = heapq.heappop(self.events)
                if kind == ARRIVAL:
                    self.enqueue(task_id)
                elif self.attempts[task_id] == attempt and self.running(task_id):
                    self.finish(task_id)
            if self.queued:
                started = time.perf_counter()
                self.admit()
                self.result.decision_s.append(time.perf_counter() - started)
            self.backend_start()
        if self.until < math.inf:
            self.advance(self.until)
        assert all(
            left == 0 or task_id in self.waiting_since or self.running(task_id)
            for task_id, left in self.remaining.items()
        ), "a run ended without doing its work"
        self.result.never_started = len(self.waiting_since)
        for task_id in self.waiting_since:
            self.result.waited[task_id] = math.inf
        return self.result

    def advance(self, now: float) -> None:
        """Time passes: what the platform did meanwhile is added up."""
        elapsed = now - self.now
        result = self.result
        if self.queued:
            result.waiting_s += elapsed
            result.used_while_waiting_gpu_s += self.placed_gpus * elapsed
        result.busy_gpu_s += self.placed_gpus * elapsed
        window = max(0.0, min(now, result.last_arrival) - max(self.now, result.first_arrival))
        result.window_busy_gpu_s += self.placed_gpus * window
        result.unplaced_gpu_s += sum(h.run.gpus for h in self.backend.values()) * elapsed
        for flavor, count in self.nodes.whole.items():
            if count:
                result.whole_node_s[flavor] += window
        self.now = now

    def enqueue(self, task_id: int) -> None:
        task = self.tasks[task_id]
        self.queued[task_id] = QueuedRun(
            id=task_id, tenant=tenant_of(task), flavor=task.flavor, nodes=task.nodes,
            gpus_per_node=task.gpus_per_node, priority=PRIORITY[task.qos], submitted=task.arrival,
            max_runtime_s=max_runtime(task),
        )  # fmt: skip
        self.waiting_since.setdefault(task_id, self.now)

    def running(self, task_id: int) -> bool:
        held = self.held.get(task_id)
        return held is not None and held.started is not None

    def admitted(self, task_id: int, cluster: str, *, borrowed: bool) -> Held:
        """Out of the queue, holding its GPUs (and quota) from now; at the backend."""
        held = Held(self.queued.pop(task_id), cluster, borrowed, self.now)
        self.held[task_id] = self.backend[task_id] = held
        return held

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        """The backend starts the admitted run on ``nodes``."""
        held = self.backend.pop(task_id)
        self.nodes.change(held.cluster, nodes, -held.run.gpus_per_node)
        held.nodes, held.started = nodes, self.now
        self.placed_gpus += held.run.gpus
        waited = self.now - self.waiting_since.pop(task_id)
        self.result.waited[task_id] = self.result.waited.get(task_id, 0.0) + waited
        self.attempts[task_id] += 1
        completion = (self.now + self.remaining[task_id], COMPLETION, task_id)
        heapq.heappush(self.events, (*completion, self.attempts[task_id]))

    def backend_start(self) -> None:
        """Runs admitted without nodes start where the backend finds room (none here)."""

    def release(self, task_id: int) -> Held:
        held = self.held.pop(task_id)
        if held.started is None:
            del self.backend[task_id]
        else:
            self.nodes.change(held.cluster, held.nodes, held.run.gpus_per_node)
            self.placed_gpus -= held.run.gpus
        return held

    def finish(self, task_id: int) -> None:
        self.release(task_id)
        self.remaining[task_id] = 0.0
        self.result.last_end = max(self.result.last_end, self.now)

    def admit(self) -> None:
        raise NotImplementedError


class Fifo(Simulation):
    """Global FIFO by arrival; the first run that does not fit blocks everyone behind it."""

    policy = "FIFO"

    def admit(self) -> None:
        for task_id, run in list(self.queued.items()):
            where = self.nodes.place(run, self.nodes.clusters[run.flavor])
            if where is None:
                return
            self.admitted(task_id, where[0], borrowed=False)
            self.start(task_id, where[1])


class Admitting(Simulation):
    """An admitter with quotas (``make_quotas``), fair share and preemption."""

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.quotas = make_quotas(tasks, self.nodes.capacity())
        self.holding: dict[tuple[str, str], int] = defaultdict(int)
        self.decayed: dict[tuple[str, str], float] = defaultdict(float)
        self.used: set[tuple[str, str]] = set()  # keys that ever held GPUs: the rest stay 0

    def advance(self, now: float) -> None:
        """Fair-share usage decays and grows as jobs.services.usage.fair_share_update has it."""
        elapsed = now - self.now
        if elapsed > 0:
            # fair_share_decayed is linear in the usage and the GPUs held: two factors do.
            kept, per_gpu = (
                fair_share_decayed(
                    usage, gpus_held=gpus, elapsed_s=elapsed, half_life_s=FAIR_SHARE_HALF_LIFE_S
                )
                for usage, gpus in ((1.0, 0), (0.0, 1))
            )
            for key in self.used:
                self.decayed[key] = self.decayed[key] * kept + self.holding[key] * per_gpu
        super().advance(now)

    def admitted(self, task_id: int, cluster: str, *, borrowed: bool) -> Held:
        held = super().admitted(task_id, cluster, borrowed=borrowed)
        key = (held.run.tenant, held.run.flavor)
        self.holding[key] += held.run.gpus
        self.used.add(key)
        return held

    def release(self, task_id: int) -> Held:
        held = super().release(task_id)
        self.holding[(held.run.tenant, held.run.flavor)] -= held.run.gpus
        return held

    def preempt(self, task_id: int) -> None:
        """Back to the queue; a run that had started loses the work since its last
        checkpoint, one still waiting at the backend loses nothing."""
        held = self.release(task_id)
        self.result.preemptions += 1
        if held.started is not None:
            ran = self.now - held.started
            kept = math.floor(ran / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
            self.remaining[task_id] -= kept
            self.result.lost_gpu_s += held.run.gpus * (ran - kept)
        self.enqueue(task_id)


class Gantry(Admitting):
    """``jobs.admission.decide`` on a snapshot of the simulated platform; the backend starts
    each run at once on the nodes admission placed it on. Every cluster has the queueing
    policy ``queueing``."""

    policy = "Gantry"
    queueing = Queueing.STRICT

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.as_held: dict[int, HeldRun] = {}  # the held runs as the snapshot has them
        self.queueing_of = dict.fromkeys(sorted({n.cluster for n in nodes}), self.queueing)

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        super().start(task_id, nodes)
        h = self.held[task_id]
        run = h.run
        self.as_held[task_id] = HeldRun(
            id=task_id, tenant=run.tenant, flavor=run.flavor, cluster=h.cluster, gpus=run.gpus,
            priority=run.priority, admitted=h.admitted, borrowed=h.borrowed, nodes=nodes,
            latest_end=None if run.max_runtime_s is None else self.now + run.max_runtime_s,
        )  # fmt: skip

    def release(self, task_id: int) -> Held:
        self.as_held.pop(task_id, None)
        return super().release(task_id)

    def admit(self) -> None:
        decisions = decide(
            Snapshot(
                queued=tuple(self.queued.values()),
                held=tuple(self.as_held.values()),
                nodes=tuple(self.nodes.node.values()),
                quotas=self.quotas,
                decayed_usage=dict(self.decayed),
                now=self.now,
                starvation_after_s=STARVATION_AFTER_S,
                queueing=self.queueing_of,
            )
        )
        for preempted in decisions.preempted:
            self.preempt(preempted.run_id)
        for admit in decisions.admitted:
            self.admitted(admit.run_id, admit.cluster, borrowed=admit.borrowed)
            self.start(admit.run_id, admit.nodes)
        self.decided(decisions)

    def decided(self, decisions: Decisions) -> None:
        """What a benchmark reads of each cycle's decisions, once they are carried out."""


def check_work(result: Result, tasks: list[Task]) -> None:
    """Every run did its work once, plus what preemption threw away: no GPU-second lost."""
    work = sum(t.gpus * t.runtime for t in tasks) + result.lost_gpu_s
    assert math.isclose(result.busy_gpu_s, work, rel_tol=1e-6), "GPU-seconds went missing"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole else "—"


def duration(seconds: float) -> str:
    if seconds == math.inf:
        return "never"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def run() -> list[Section]:
    pools = load_pools()
    nodes = nodes_of(*pools)
    capacity = sum(p.capacity for p in pools)
    replays = {load: load_tasks(compression=c) for load, c in LOADS.items()}
    if quick():
        replays = {load: tasks[:QUICK_TASKS] for load, tasks in replays.items()}
    count = len(next(iter(replays.values())))
    waits = Section(
        title="Alibaba GPU trace replay: queue time (issue 3, point 9)",
        intro=(
            f"`{TASKS_CSV}`: the {count:,} GPU tasks that ran, on 1/64 of the trace's nodes "
            f"({capacity} GPUs on {len(nodes)} nodes in {len(pools)} clusters, every GPU model "
            f"and node size kept), arrivals {' and '.join(f'{f}×' for f in LOADS.values())} "
            "faster than in the trace (run times unchanged). Gantry: `jobs.admission.decide` "
            f"after every event, {TENANTS} tenants by hash of the task name, each guaranteed "
            f"1/{TENANTS} of the GPUs; LS, Guaranteed and Burstable tasks run under the "
            "tenant's guarantee, BE tasks borrow only (preemptible). Baseline: plain FIFO "
            "(global, head-of-line blocking, no quotas or preemption). Both place runs on "
            "nodes as `jobs.placement` does. Queue time counts every wait, including after a "
            "preemption."
        ),
        columns=["load", "policy", "QoS", "tasks", "p50", "p95", "p99", "mean"],
    )
    platform = Section(
        title="Alibaba GPU trace replay: platform",
        intro=(
            "Same replays. Utilization: allocated GPUs over capacity, averaged over the time "
            "when some run waits (what head-of-line blocking wastes) and over the makespan "
            "(a handful of months-long tasks set the makespan). Lost: "
            f"GPU-hours of work since the last checkpoint (every {CHECKPOINT_EVERY_S // 60} "
            "min) thrown away by preemption. Tenants: the lowest and highest mean queue time "
            "of a tenant's LS, Guaranteed and Burstable tasks. Decision: wall time of the "
            "admitter per batch of simultaneous events, snapshot included."
        ),
        columns=[
            "load", "policy", "makespan", "utilization (while runs wait / makespan)", "preemptions",
            "lost GPU-h", "tenants' mean queue time", "decision mean", "decision p99",
            "decision max",
        ],
    )  # fmt: skip
    for load, tasks in replays.items():
        compression = LOADS[load]
        for policy in (Fifo, Gantry):
            result = policy(tasks, nodes).run()
            assert result.never_started == 0, "a task never ran"
            check_work(result, tasks)
            classes = [(q, [t for t in tasks if t.qos == q]) for q in QOS_ORDER]
            for qos, chosen in [*classes, ("all", tasks)]:
                if not chosen:
                    continue
                waited = [result.waited[t.id] for t in chosen]
                waits.rows.append(
                    [
                        f"{load} ({compression}×)", result.policy, qos, f"{len(chosen):,}",
                        *(duration(percentile(waited, q)) for q in (0.5, 0.95, 0.99)),
                        duration(statistics.mean(waited)),
                    ]
                )  # fmt: skip
            makespan = result.last_end - result.first_arrival
            by_tenant: dict[str, list[float]] = defaultdict(list)
            for t in tasks:
                if t.qos in GUARANTEED_CLASS:
                    by_tenant[tenant_of(t)].append(result.waited[t.id])
            means = [statistics.mean(v) for v in by_tenant.values()]
            decisions = result.decision_s
            platform.rows.append(
                [
                    f"{load} ({compression}×)",
                    result.policy,
                    duration(makespan),
                    f"{share(result.used_while_waiting_gpu_s, capacity * result.waiting_s)} / "
                    f"{share(result.busy_gpu_s, capacity * makespan)}",
                    f"{result.preemptions:,}",
                    f"{result.lost_gpu_s / 3600:,.0f}",
                    f"{duration(min(means))} – {duration(max(means))}",
                    f"{statistics.mean(decisions) * 1000:.2f} ms",
                    f"{percentile(decisions, 0.99) * 1000:.1f} ms",
                    f"{max(decisions) * 1000:.1f} ms",
                ]
            )
    return [waits, platform]
