"""Replay of the Alibaba GPU trace (v2023, openb) through Gantry's admission and plain FIFO.

A discrete-event simulation in simulated seconds: arrivals at the task's creation time
(compressed, see ``LOADS``), completions when a run's remaining work is done. After
every batch of simultaneous events the admitter decides: Gantry calls
``jobs.admission.decide`` on a snapshot of the simulated platform, the baseline is global
FIFO by arrival with head-of-line blocking and no quotas, borrowing or preemption. Both
place a run in the pool that leaves the fewest GPUs free (the same best fit), on the
same cluster, with the same tasks. The mapping is in docs/benchmarks-notes.md.
"""

import csv
import hashlib
import heapq
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import Section
from jobs.admission import (
    HeldRun,
    Pool,
    QueuedRun,
    Quota,
    Snapshot,
    decide,
    fair_share_decayed,
)

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba-gpu-v2023"
NODES_CSV = "openb_node_list_gpu_node.csv"
TASKS_CSV = "openb_pod_list_default.csv"
FLAVOR = "gpu"  # the default pod list constrains no GPU model: any GPU will do
TENANTS = 10
NODE_SHARE = 1 / 64  # of each (model, GPUs per node) group's nodes, rounded, at least one
LOADS = {"busy": 5, "overloaded": 10}  # arrival times are divided by this; run times are kept
CHECKPOINT_EVERY_S = 1800  # a preempted run loses the work since its last checkpoint
STARVATION_AFTER_S = 1800.0  # GANTRY_STARVATION_AFTER_S's default
FAIR_SHARE_HALF_LIFE_S = 24 * 3600.0  # GANTRY_FAIR_SHARE_HALF_LIFE_H's default
GUARANTEED_CLASS = ("LS", "Guaranteed", "Burstable")
PRIORITY = {"LS": 50, "Guaranteed": 50, "Burstable": 50, "BE": 10}
QOS_ORDER = ("LS", "Guaranteed", "Burstable", "BE")


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    name: str
    qos: str
    gpus: int
    arrival: float
    runtime: float


def tenant_of(task: Task) -> str:
    """Stable: the same task is always the same tenant; BE tasks borrow under their own."""
    tenant = (
        f"t{int(hashlib.sha1(task.name.encode(), usedforsecurity=False).hexdigest(), 16) % TENANTS}"
    )
    return tenant if task.qos in GUARANTEED_CLASS else f"{tenant}-be"


def load_pools() -> tuple[Pool, ...]:
    """One pool per GPU model and node size (a Gantry pool has one node shape)."""
    nodes: dict[tuple[str, int], int] = defaultdict(int)
    with (TRACE / NODES_CSV).open() as f:
        for row in csv.DictReader(f):
            nodes[(row["model"], int(row["gpu"]))] += 1
    return tuple(
        Pool(
            f"{model.lower()}-x{gpus}",
            FLAVOR,
            nodes=max(1, round(count * NODE_SHARE)),
            gpus_per_node=gpus,
        )
        for (model, gpus), count in sorted(nodes.items())
    )


def load_tasks(*, compression: float) -> list[Task]:
    """GPU tasks that ran in the trace; a fractional GPU is rounded up to a whole one."""
    tasks = []
    with (TRACE / TASKS_CSV).open() as f:
        for row in csv.DictReader(f):
            if int(row["num_gpu"]) < 1 or not row["scheduled_time"]:
                continue
            runtime = int(row["deletion_time"]) - int(row["scheduled_time"])
            tasks.append(
                Task(
                    id=len(tasks) + 1,
                    name=row["name"],
                    qos=row["qos"],
                    gpus=int(row["num_gpu"]),
                    arrival=int(row["creation_time"]) / compression,
                    runtime=float(max(1, runtime)),
                )
            )
    return tasks


def make_quotas(tasks: list[Task], capacity: int) -> dict[tuple[str, str], Quota]:
    """Guaranteed-class tenants split the cluster evenly and may borrow the rest; BE tenants
    have no guarantee and may borrow the whole cluster."""
    quotas = {}
    for tenant in sorted({tenant_of(t) for t in tasks}):
        guaranteed = 0 if tenant.endswith("-be") else capacity // TENANTS
        quotas[(tenant, FLAVOR)] = Quota(guaranteed=guaranteed, borrow_limit=capacity - guaranteed)
    return quotas


@dataclass
class Result:
    policy: str
    waited: dict[int, float] = field(default_factory=dict)  # task id -> total queued time
    first_arrival: float = 0.0
    last_end: float = 0.0
    busy_gpu_s: float = 0.0
    waiting_s: float = 0.0  # time during which some run waited
    used_while_waiting_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    preemptions: int = 0
    decision_s: list[float] = field(default_factory=list)


ARRIVAL, COMPLETION = 0, 1


class Simulation:
    """The platform in simulated time; subclasses are the admission policies."""

    policy = ""

    def __init__(self, tasks: list[Task], pools: tuple[Pool, ...]):
        self.tasks = {t.id: t for t in tasks}
        self.pools = sorted(pools, key=lambda p: p.cluster)
        self.capacity = sum(p.capacity for p in pools)
        self.capacity_of = {p.cluster: p.capacity for p in pools}
        self.result = Result(self.policy, first_arrival=min(t.arrival for t in tasks))
        self.events = [(t.arrival, ARRIVAL, t.id, 0) for t in tasks]
        heapq.heapify(self.events)
        self.queued: dict[int, QueuedRun] = {}  # in arrival order, requeued runs last
        self.queued_since: dict[int, float] = {}
        self.remaining = {t.id: t.runtime for t in tasks}  # work left, in seconds
        self.held: dict[int, HeldRun] = {}
        self.attempts: dict[int, int] = defaultdict(int)
        self.used: dict[str, int] = defaultdict(int)  # cluster -> GPUs held
        self.now = 0.0

    def run(self) -> Result:
        while self.events:
            now = self.events[0][0]
            if self.queued:
                self.result.waiting_s += now - self.now
                self.result.used_while_waiting_gpu_s += sum(self.used.values()) * (now - self.now)
            self.advance(now)
            while self.events and self.events[0][0] == now:
                _, kind, task_id, attempt = heapq.heappop(self.events)
                if kind == ARRIVAL:
                    self.enqueue(task_id)
                elif self.attempts[task_id] == attempt and task_id in self.held:
                    self.release(task_id, done=self.remaining[task_id])
            if self.queued:
                started = time.perf_counter()
                self.admit()
                self.result.decision_s.append(time.perf_counter() - started)
        return self.result

    def advance(self, now: float) -> None:
        self.now = now

    def enqueue(self, task_id: int) -> None:
        task = self.tasks[task_id]
        self.queued[task_id] = QueuedRun(
            id=task_id, tenant=tenant_of(task), flavor=FLAVOR, nodes=1, gpus_per_node=task.gpus,
            priority=PRIORITY[task.qos], submitted=task.arrival,
        )  # fmt: skip
        self.queued_since[task_id] = self.now

    def best_fit(self, run: QueuedRun) -> Pool | None:
        """The pool that leaves the fewest GPUs free, as jobs.admission places runs."""
        best, best_left = None, 0
        for pool in self.pools:
            left = pool.capacity - self.used[pool.cluster] - run.gpus
            fits = run.gpus_per_node <= pool.gpus_per_node and left >= 0
            if fits and (best is None or left < best_left):
                best, best_left = pool, left
        return best

    def start(self, task_id: int, cluster: str, *, borrowed: bool) -> None:
        run = self.queued.pop(task_id)
        waited = self.now - self.queued_since.pop(task_id)
        self.result.waited[task_id] = self.result.waited.get(task_id, 0.0) + waited
        self.held[task_id] = HeldRun(
            id=task_id, tenant=run.tenant, flavor=FLAVOR, cluster=cluster, gpus=run.gpus,
            priority=run.priority, admitted=self.now, borrowed=borrowed,
        )  # fmt: skip
        self.used[cluster] += run.gpus
        assert self.used[cluster] <= self.capacity_of[cluster], f"{cluster} over capacity"
        self.attempts[task_id] += 1
        completion = (self.now + self.remaining[task_id], COMPLETION, task_id)
        heapq.heappush(self.events, (*completion, self.attempts[task_id]))

    def release(self, task_id: int, *, done: float) -> HeldRun:
        held = self.held.pop(task_id)
        self.used[held.cluster] -= held.gpus
        self.result.busy_gpu_s += held.gpus * (self.now - held.admitted)
        self.result.last_end = max(self.result.last_end, self.now)
        self.remaining[task_id] -= done
        return held

    def admit(self) -> None:
        raise NotImplementedError


class Fifo(Simulation):
    """Global FIFO by arrival; the first run that does not fit blocks everyone behind it."""

    policy = "FIFO"

    def admit(self) -> None:
        for task_id, run in list(self.queued.items()):
            pool = self.best_fit(run)
            if pool is None:
                return
            self.start(task_id, pool.cluster, borrowed=False)


class Gantry(Simulation):
    """``jobs.admission.decide`` on a snapshot of the simulated platform."""

    policy = "Gantry"

    def __init__(self, tasks: list[Task], pools: tuple[Pool, ...]):
        super().__init__(tasks, pools)
        self.quotas = make_quotas(tasks, self.capacity)
        self.holding: dict[tuple[str, str], int] = defaultdict(int)
        self.decayed: dict[tuple[str, str], float] = defaultdict(float)

    def advance(self, now: float) -> None:
        """Fair-share usage decays and grows as jobs.services.usage.fair_share_update has it."""
        elapsed = now - self.now
        if elapsed > 0:
            for key in self.quotas:
                self.decayed[key] = fair_share_decayed(
                    self.decayed[key],
                    gpus_held=self.holding[key],
                    elapsed_s=elapsed,
                    half_life_s=FAIR_SHARE_HALF_LIFE_S,
                )
        self.now = now

    def start(self, task_id: int, cluster: str, *, borrowed: bool) -> None:
        super().start(task_id, cluster, borrowed=borrowed)
        held = self.held[task_id]
        self.holding[(held.tenant, FLAVOR)] += held.gpus

    def release(self, task_id: int, *, done: float) -> HeldRun:
        held = super().release(task_id, done=done)
        self.holding[(held.tenant, FLAVOR)] -= held.gpus
        return held

    def preempt(self, task_id: int) -> None:
        """Back to the queue; the work since the last checkpoint is lost."""
        ran = self.now - self.held[task_id].admitted
        kept = math.floor(ran / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        held = self.release(task_id, done=kept)
        self.result.lost_gpu_s += held.gpus * (ran - kept)
        self.result.preemptions += 1
        self.enqueue(task_id)

    def admit(self) -> None:
        decisions = decide(
            Snapshot(
                queued=tuple(self.queued.values()),
                held=tuple(self.held.values()),
                pools=tuple(self.pools),
                quotas=self.quotas,
                decayed_usage=dict(self.decayed),
                now=self.now,
                starvation_after_s=STARVATION_AFTER_S,
            )
        )
        for preempted in decisions.preempted:
            self.preempt(preempted.run_id)
        for admitted in decisions.admitted:
            self.start(admitted.run_id, admitted.cluster, borrowed=admitted.borrowed)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def run() -> list[Section]:
    pools = load_pools()
    capacity = sum(p.capacity for p in pools)
    replays = {load: load_tasks(compression=c) for load, c in LOADS.items()}
    count = len(next(iter(replays.values())))
    waits = Section(
        title="Alibaba GPU trace replay: queue time (issue 3, point 9)",
        intro=(
            f"`{TASKS_CSV}`: the {count:,} GPU tasks that ran, on 1/64 of the trace's nodes "
            f"({capacity} GPUs in {len(pools)} pools, every GPU model and node size kept), "
            f"arrivals {' and '.join(f'{f}×' for f in LOADS.values())} faster than in the "
            "trace (run times unchanged). Gantry: `jobs.admission.decide` after every event, "
            f"{TENANTS} tenants by hash of the task name, each guaranteed 1/{TENANTS} of the "
            "GPUs; LS, Guaranteed and Burstable tasks run under the tenant's guarantee, BE "
            "tasks borrow only (preemptible). Baseline: plain FIFO (global, head-of-line "
            "blocking, no quotas or preemption). Queue time counts every wait, including "
            "after a preemption."
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
            result = policy(tasks, pools).run()
            assert len(result.waited) == len(tasks), "a task never ran"
            classes = [(q, [t for t in tasks if t.qos == q]) for q in QOS_ORDER]
            for qos, chosen in [*classes, ("all", tasks)]:
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
                    f"{result.used_while_waiting_gpu_s / (capacity * result.waiting_s):.0%} / "
                    f"{result.busy_gpu_s / (capacity * makespan):.0%}",
                    f"{result.preemptions:,}",
                    f"{result.lost_gpu_s / 3600:,.0f}",
                    f"{duration(min(means))} – {duration(max(means))}",
                    f"{statistics.mean(decisions) * 1000:.2f} ms",
                    f"{percentile(decisions, 0.99) * 1000:.1f} ms",
                    f"{max(decisions) * 1000:.1f} ms",
                ]
            )
    return [waits, platform]
