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

The engine (``Simulation``, ``Admitting``, ``Gantry``, ``Nodes``) is the product's what-if
replay engine, ``jobs.replay_engine``; here it replays the trace's tasks and adds up what
the platform did (``Recording``). It is also the engine of bench/placement.py, which adds a
backend queue (a run admitted where no node placement exists waits there, holding its
quota, until one does), and of bench/backfill.py, bench/estimates.py, bench/node_health.py
and bench/replay.py.
"""

import csv
import hashlib
import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import Section, quick
from jobs import replay_engine as engine
from jobs.admission_types import (
    ClusterNode,
    Pool,
    QueuedRun,
    Queueing,
    Quota,
    nodes_of,
)

# The engine's names the benchmarks built on this one use.
from jobs.replay_engine import ARRIVAL as ARRIVAL
from jobs.replay_engine import COMPLETION as COMPLETION
from jobs.replay_engine import Held as Held
from jobs.replay_engine import Nodes as Nodes
from jobs.replay_report import duration as report_duration

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


class Recording:
    """The trace's tasks in the engine of ``jobs.replay_engine`` (a ``Simulation``,
    ``Admitting`` or ``Gantry`` after this in the bases): each task arrives at its arrival
    and needs its run time; what the platform did is added up in ``result``."""

    policy = ""

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        self.tasks = {t.id: t for t in tasks}
        super().__init__(  # type: ignore[call-arg]
            [(t.arrival, t.id) for t in tasks], {t.id: t.runtime for t in tasks}, nodes,
            until=until,
        )  # fmt: skip
        self.result = Result(
            self.policy,
            first_arrival=min(t.arrival for t in tasks),
            last_arrival=max(t.arrival for t in tasks),
            whole_node_s=dict.fromkeys(self.nodes.clusters, 0.0),
        )
        self.waited = self.result.waited

    def queued_run(self, task_id: int) -> QueuedRun:
        task = self.tasks[task_id]
        return QueuedRun(
            id=task_id, tenant=tenant_of(task), flavor=task.flavor, nodes=task.nodes,
            gpus_per_node=task.gpus_per_node, priority=PRIORITY[task.qos], submitted=task.arrival,
            max_runtime_s=max_runtime(task),
        )  # fmt: skip

    def run(self) -> Result:
        super().run()
        self.result.never_started = len(self.waiting_since)
        for task_id in self.waiting_since:
            self.result.waited[task_id] = math.inf
        return self.result

    def cycle(self) -> None:
        started = time.perf_counter()
        super().cycle()
        self.result.decision_s.append(time.perf_counter() - started)

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
        super().advance(now)

    def finish(self, task_id: int) -> None:
        super().finish(task_id)
        self.result.last_end = max(self.result.last_end, self.now)

    def preempted(self, task_id: int, held: Held, *, lost_gpu_s: float) -> None:
        self.result.preemptions += 1
        self.result.lost_gpu_s += lost_gpu_s


class Simulation(Recording, engine.Simulation):
    """The platform in simulated time; subclasses are the admission policies. ``until``:
    stop then (simulated seconds) even if runs are left."""


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


class Admitting(Recording, engine.Admitting):
    """An admitter with quotas (``make_quotas``), fair share and preemption (a preempted run
    loses the work since its last checkpoint, every ``CHECKPOINT_EVERY_S``)."""

    half_life_s = FAIR_SHARE_HALF_LIFE_S
    checkpoint_every_s = CHECKPOINT_EVERY_S

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.quotas = make_quotas(tasks, self.nodes.capacity())


class Gantry(Recording, engine.Gantry):
    """``jobs.admission.decide`` on a snapshot of the simulated platform; the backend starts
    each run at once on the nodes admission placed it on. Every cluster has the queueing
    policy ``queueing``."""

    policy = "Gantry"
    queueing = Queueing.STRICT
    half_life_s = FAIR_SHARE_HALF_LIFE_S
    checkpoint_every_s = CHECKPOINT_EVERY_S
    starvation_after_s = STARVATION_AFTER_S

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.quotas = make_quotas(tasks, self.nodes.capacity())


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
    """As the what-if report words a queue time; "never" for a run that never started."""
    return "never" if seconds == math.inf else report_duration(seconds)


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
