"""Node health measured (issue 34, point 9): a month of the Alibaba trace with hardware faults
injected at published rates, with Gantry's node-health policy against without it.

The engine is the trace replay's (``bench/trace.py``: ``Gantry``, admission by
``jobs.admission.decide``), on the trace's whole node list, with arrivals 5× faster (the
trace's 149 days of arrivals in 30 simulated days) and the replay cut at 30 days. Faults
come from the project's own fault model, ``clusters.sim_faults`` (seeded hash, per node,
hour and class), at rates derived from the Llama 3 paper's 54-day run (``RATES``), plus
three lemon nodes. Three replays on the same tasks:

- *with the policy*: each fault's DCGM signal reaches ``clusters.health_policy.decide`` at
  the next sync (every ``SYNC_S``, the collector's fetch period); a quarantined node leaves
  placement (``ClusterNode.schedulable``), its runs are requeued from their last checkpoint
  with the node excluded (``on_quarantine`` requeue); every ended attempt is classed by
  ``jobs.attribution.attribute`` on the events recorded by then; a hardware or platform end
  is requeued with its node excluded (``QueuedRun.excluded``), at most
  ``max_platform_retries`` times per run;
- *without*: the same faults end the same kind of runs, which requeue from their checkpoint,
  but nodes stay in service and a lemon keeps failing what lands on it;
- *fault-free, with the policy*: no fault at all (false quarantines: goal 0).

Method and caveats: docs/benchmarks-notes.md, *Node health*.
"""

import heapq
import math
import multiprocessing
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from bench.report import Section, quick
from bench.trace import (
    ARRIVAL,
    CHECKPOINT_EVERY_S,
    COMPLETION,
    TASKS_CSV,
    Gantry,
    Held,
    Task,
    load_tasks,
    node_groups,
    read_pods,
)
from clusters.health import HARDWARE_CLASSES, NodeHealth, Signal, SignalClass, Source
from clusters.health_policy import HealthPolicy, NodeView, decide, policy_from
from clusters.sim_faults import Fault, FaultSettings, Lemon, faults_between
from jobs.admission_types import ClusterNode, Pool, nodes_of
from jobs.attribution import HARDWARE, PLATFORM, EndedAttempt, HealthEvent, attribute
from telemetry.kpis import reliability
from telemetry.kpis.metrics import Ratio

DAY_S = 86400
DAYS = 30
COMPRESSION = 5  # the trace's 149 days of arrivals in 30 simulated days ("busy" in trace.py)
SYNC_S = 60  # the DCGM collector's fetch period: a fault's signal is seen at the next one
SEED = 34
NODE_SHARE = 1.0  # the whole node list
QUICK_NODE_SHARE = 1 / 16
QUICK_STRIDE = 10  # GANTRY_BENCH_QUICK=1: every tenth task on 1/16 of the nodes

# Llama 3 (Dubey et al., arXiv 2407.21783, Table 5): 419 unexpected interruptions in a 54-day
# snapshot of pre-training on 16,384 H100 GPUs (2,048 nodes of 8). The rows whose cause a
# node's GPU signals show, by count (not the printed share: "Faulty GPU" is printed 30.1 %,
# 148 / 419 is 35.3 %; /work/shared/reference/node-health.md §6.2):
LLAMA_GPU_DAYS = 54 * 16_384
LLAMA_COUNTS = {
    SignalClass.GPU_LOST: 148,  # faulty GPU: XID 79, fallen off the bus
    SignalClass.ECC_UNCORRECTABLE: 72 + 19,  # GPU HBM3 memory + GPU SRAM memory: XID 48
    SignalClass.GPU_RESET_NEEDED: 17,  # GPU system processor (GSP): XID 119
    SignalClass.XID_APPLICATION: 54,  # software bug: the program dies (XID 13), the user's
}
RATES = {signal: count / LLAMA_GPU_DAYS for signal, count in LLAMA_COUNTS.items()}  # per GPU-day
LEMON_EVERY_S = 12 * 3600
# One lemon in each of the three largest clusters: its busiest node in the fault-free replay.
LEMON_CLASSES = (
    SignalClass.GPU_LOST,
    SignalClass.ECC_UNCORRECTABLE,
    SignalClass.GPU_RESET_NEEDED,
)
# The default policy but for the blast radius: the trace's clusters are its node shapes, some
# of 2 or 3 nodes, where the default 0.25 quarantines none (docs/node-health.md: a two-node
# cluster needs 0.5).
POLICY = policy_from({"max_quarantined_share": 0.5})
MAX_LATENCY_S = 120.0
PRECISION_GOAL = RECALL_GOAL = 0.95

FAULT, SYNC = 2, 3  # event kinds after trace.py's ARRIVAL (0) and COMPLETION (1): at one
# instant arrivals and ends come first, then faults, then the sync that sees them


def trace_nodes(share: float) -> tuple[ClusterNode, ...]:
    """The trace's node list as the trace replay loads it (one cluster per GPU model and node
    size, one flavor), ``share`` of each group's nodes (at least one)."""
    return nodes_of(
        *(
            Pool(f"{model.lower()}-x{gpus}", "gpu", max(1, round(count * share)), gpus)
            for (model, gpus), count in sorted(node_groups().items())
        )
    )


def inject(
    nodes: Sequence[ClusterNode], lemons: dict[str, Lemon], *, seed: int, until: float
) -> list[Fault]:
    """``clusters.sim_faults`` faults on ``nodes`` in [0, until): its rates are per node-day,
    so each node size gets ``RATES`` (per GPU-day) × its GPUs."""
    faults: list[Fault] = []
    for size in sorted({n.gpus for n in nodes}):
        group = {n.name: n.gpus for n in nodes if n.gpus == size}
        settings = FaultSettings(
            seed=seed,
            rates={signal: rate * size for signal, rate in RATES.items()},
            lemons={name: lemon for name, lemon in lemons.items() if name in group},
        )
        faults += faults_between(group, settings, start=0.0, end=until)
    return sorted(faults)


@dataclass
class Ended:
    """An ended attempt waiting for the sync that attributes it."""

    task_id: int
    attempt: EndedAttempt
    by_fault: (
        bool  # ended by an injected hardware fault, or requeued off a node quarantined for one
    )
    requeue: bool  # requeued by the sync (not already back in the queue, as a preemption is)


@dataclass
class Figures:
    label: str
    faults: int = 0  # fatal faults injected
    lemon_faults: int = 0
    hit_attempts: int = 0  # attempts ended by an injected hardware fault
    lost_fault_gpu_s: float = 0.0
    lost_requeue_gpu_s: float = 0.0  # thrown away by requeues off quarantined nodes
    requeued_off_quarantine: int = 0
    failed_again_same_node: int = 0
    placements_on_quarantined: int = 0
    quarantines: int = 0
    refused: int = 0
    latencies: list[float] = field(default_factory=list)
    true_pos: int = 0
    false_pos: int = 0
    false_neg: int = 0
    negatives: int = 0  # ended attempts not ended by an injected fault
    given_up: int = 0
    ettr: Ratio = field(default_factory=Ratio)
    runs_ended: int = 0
    seconds: float = 0.0

    @property
    def precision(self) -> float | None:
        flagged = self.true_pos + self.false_pos
        return self.true_pos / flagged if flagged else None

    @property
    def recall(self) -> float | None:
        truth = self.true_pos + self.false_neg
        return self.true_pos / truth if truth else None


class HealthReplay(Gantry):
    """The trace replay with faults, GPU indices per run, and (``guard``) the node-health
    policy, attribution and retries of issue 34."""

    def __init__(
        self,
        tasks: list[Task],
        nodes: tuple[ClusterNode, ...],
        *,
        until: float,
        faults: Sequence[Fault],
        guard: bool,
        label: str,
        health_policy: HealthPolicy = POLICY,
        failing: frozenset[str] = frozenset(),
    ):
        super().__init__(tasks, nodes, until=until)
        self.guard = guard
        self.failing = failing  # the names of the tasks the trace says failed (pod_phase)
        self.rules = health_policy
        self.figures = Figures(label)
        self.faults = list(faults)
        for index, fault in enumerate(self.faults):
            self.events.append((fault.at, FAULT, index, 0))
        self.events.sort()
        self.key_of = {n.name: (n.cluster, n.name) for n in nodes}
        self.cluster_nodes: dict[str, list[str]] = defaultdict(list)
        for n in nodes:
            self.cluster_nodes[n.cluster].append(n.name)
        self.free_gpus = {n.name: list(range(n.gpus)) for n in nodes}
        self.gpus_of: dict[int, dict[str, tuple[int, ...]]] = {}
        self.health = dict.fromkeys(self.key_of.values(), NodeHealth.HEALTHY)
        self.signals: list[Signal] = []  # seen by the next sync
        self.recorded: dict[str, list[HealthEvent]] = defaultdict(list)
        self.history: dict[str, list[reliability.NodeEvent]] = defaultdict(list)
        self.pending: list[Ended] = []
        self.sync_at: float | None = None
        self.excluded: dict[int, set[str]] = defaultdict(set)
        self.retries: Counter[int] = Counter()
        self.failed_on: dict[int, Counter[str]] = defaultdict(Counter)
        self.first_start: dict[int, float] = {}
        self.ended_at: dict[int, float] = {}
        self.done_work: dict[int, float] = {}

    # --- the engine ----------------------------------------------------------------------

    def run(self) -> Figures:  # type: ignore[override]
        """trace.Simulation.run with two more kinds of event: a fault, and a sync."""
        while self.events and self.events[0][0] <= self.until:
            now = self.events[0][0]
            self.advance(now)
            while self.events and self.events[0][0] == now:
                _, kind, ident, attempt = heapq.heappop(self.events)
                if kind == ARRIVAL:
                    self.enqueue(ident)
                elif kind == COMPLETION:
                    if self.attempts[ident] == attempt and self.running(ident):
                        self.finish(ident)
                elif kind == FAULT:
                    self.fault(self.faults[ident])
                else:
                    self.sync()
            if self.queued:
                self.admit()
        self.advance(self.until)
        return self.figures

    def schedule_sync(self) -> None:
        tick = math.ceil(self.now / SYNC_S) * SYNC_S
        if self.sync_at != tick:
            self.sync_at = tick
            heapq.heappush(self.events, (float(tick), SYNC, 0, 0))

    def enqueue(self, task_id: int) -> None:
        super().enqueue(task_id)
        if self.excluded[task_id]:
            self.queued[task_id] = replace(
                self.queued[task_id], excluded=tuple(sorted(self.excluded[task_id]))
            )

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        super().start(task_id, nodes)
        self.first_start.setdefault(task_id, self.now)
        per_node = self.held[task_id].run.gpus_per_node
        taken = {}
        for name in nodes:
            if self.health[self.key_of[name]] == NodeHealth.QUARANTINED:
                self.figures.placements_on_quarantined += 1
            free = self.free_gpus[name]
            taken[name], self.free_gpus[name] = tuple(free[:per_node]), free[per_node:]
        self.gpus_of[task_id] = taken

    def release(self, task_id: int) -> Held:
        held = super().release(task_id)
        for name, gpus in self.gpus_of.pop(task_id, {}).items():
            self.free_gpus[name] = sorted(self.free_gpus[name] + list(gpus))
        return held

    def finish(self, task_id: int) -> None:
        if self.tasks[task_id].name in self.failing:
            # The trace's failed pods end as the program's failure: negatives for attribution.
            facts = self.attempt_facts(task_id, "FAILED", "USER_EXIT", exit_code=1)
            self.pending.append(Ended(task_id, facts, False, False))
            self.schedule_sync()
        super().finish(task_id)
        self.ended_at[task_id] = self.now
        self.done_work[task_id] = self.tasks[task_id].runtime

    def preempt(self, task_id: int) -> None:
        """Admission's preemption (a borrowed run makes room): a platform end, back in the
        queue at once; attributed like any end (a fault nearby may be blamed for it)."""
        held = self.held[task_id]
        if held.started is not None:
            self.pending.append(
                Ended(task_id, self.attempt_facts(task_id, "PREEMPTED", "PREEMPTED"), False, False)
            )
            self.schedule_sync()
        super().preempt(task_id)

    def attempt_facts(
        self, task_id: int, state: str, reason: str, *, exit_code: int | None = None, message=""
    ) -> EndedAttempt:
        held = self.held[task_id]
        gpus = self.gpus_of[task_id]
        return EndedAttempt(
            state=state, ended=self.now, failure_reason=reason, exit_code=exit_code,
            message=message, nodes=held.nodes, started=held.started,
            # The UUIDs the job reports; DCGM names GPUs by index, so any event on its
            # nodes counts (jobs.attribution: named otherwise, nobody can tell).
            gpus=tuple(f"GPU-{name}-{gpu}" for name, ids in gpus.items() for gpu in ids),
        )  # fmt: skip

    def stop(self, task_id: int) -> float:
        """The attempt ends now: its work since the last checkpoint is lost (GPU-seconds)."""
        held = self.held[task_id]
        assert held.started is not None
        ran = self.now - held.started
        kept = math.floor(ran / CHECKPOINT_EVERY_S) * CHECKPOINT_EVERY_S
        self.release(task_id)
        self.remaining[task_id] -= kept
        lost = held.run.gpus * (ran - kept)
        self.result.lost_gpu_s += lost
        return lost

    # --- faults, syncs ---------------------------------------------------------------------

    def fault(self, fault: Fault) -> None:
        hardware = fault.signal in HARDWARE_CLASSES
        if hardware:
            self.figures.faults += 1
            self.figures.lemon_faults += fault.lemon
        for task_id, gpus in list(self.gpus_of.items()):
            held_gpus = gpus.get(fault.node)
            if held_gpus is None or not (fault.node_wide or fault.gpu in held_gpus):
                continue
            facts = self.attempt_facts(
                task_id, "FAILED", fault.failure_reason, exit_code=fault.exit_code,
                message=fault.message(),
            )  # fmt: skip
            if self.failed_on[task_id][fault.node]:
                self.figures.failed_again_same_node += 1
            self.failed_on[task_id][fault.node] += 1
            lost = self.stop(task_id)
            if hardware:
                self.figures.hit_attempts += 1
                self.figures.lost_fault_gpu_s += lost
            self.pending.append(Ended(task_id, facts, hardware, True))
        # Recorded in both replays (attribution is measured in both); only the policy acts.
        self.signals.append(
            Signal(
                node=fault.node, signal=fault.signal, source=Source.DCGM, at=fault.at,
                gpu=str(fault.gpu), code=str(fault.xid), detail=fault.description,
            )
        )  # fmt: skip
        self.schedule_sync()

    def sync(self) -> None:
        self.sync_at = None
        self.record_signals()
        pending, self.pending = self.pending, []
        for ended in pending:
            self.settle(ended)

    def record_signals(self) -> None:
        signals, self.signals = self.signals, []
        by_cluster: dict[str, list[Signal]] = defaultdict(list)
        for signal in signals:
            by_cluster[self.key_of[signal.node][0]].append(signal)
            self.recorded[signal.node].append(
                HealthEvent(
                    node=signal.node, signal=signal.signal, at=signal.at, gpu=signal.gpu,
                    code=signal.code, detail=signal.detail, source=signal.source,
                )
            )  # fmt: skip
            fault = signal.signal in HARDWARE_CLASSES
            kind = reliability.EventKind.FAULT if fault else reliability.EventKind.OTHER
            self.history[signal.node].append(
                reliability.NodeEvent(signal.at, self.now, kind, fault)
            )
        for cluster, batch in sorted(by_cluster.items()) if self.guard else ():
            views = {
                name: NodeView(self.health[(cluster, name)]) for name in self.cluster_nodes[cluster]
            }
            for name, decision in sorted(
                decide(self.rules, nodes=views, signals=batch).nodes.items()
            ):
                key = (cluster, name)
                self.health[key] = decision.health
                self.figures.refused += decision.refused
                if decision.health == NodeHealth.QUARANTINED:
                    self.quarantine(key, decision.reason)

    def quarantine(self, key: tuple[str, str], reason: str) -> None:
        self.figures.quarantines += 1
        cluster, name = key
        self.history[name].append(
            reliability.NodeEvent(self.now, self.now, reliability.EventKind.QUARANTINE, False)
        )
        nodes = self.nodes
        whole_before = nodes.is_whole(key)
        nodes.node[key] = replace(
            nodes.node[key], schedulable=False, reason=f"quarantined: {reason}"
        )
        nodes.whole[nodes.node[key].flavor] += nodes.is_whole(key) - whole_before
        nodes.version[cluster] += 1
        # on_quarantine "requeue": its runs leave from their last checkpoint, the node excluded.
        for task_id, gpus in list(self.gpus_of.items()):
            if name in gpus:
                facts = self.attempt_facts(task_id, "PREEMPTED", "PREEMPTED")
                self.figures.requeued_off_quarantine += 1
                self.figures.lost_requeue_gpu_s += self.stop(task_id)
                self.pending.append(Ended(task_id, facts, True, True))

    def settle(self, ended: Ended) -> None:
        """What the sync does with an ended attempt: attribute it (with the policy), then
        requeue it, with its node excluded after a hardware or platform end, up to
        ``max_platform_retries``."""
        task_id = ended.task_id
        facts = ended.attempt
        events = [e for name in facts.nodes for e in self.recorded[name]]
        cause, evidence = attribute(facts, events)
        flagged = cause == HARDWARE
        self.figures.true_pos += flagged and ended.by_fault
        self.figures.false_pos += flagged and not ended.by_fault
        self.figures.false_neg += ended.by_fault and not flagged
        self.figures.negatives += not ended.by_fault
        if self.guard and ended.requeue and cause in (HARDWARE, PLATFORM):
            self.excluded[task_id].add(evidence.get("node") or facts.nodes[0])
            self.retries[task_id] += 1
            if self.retries[task_id] > self.rules.max_platform_retries:
                self.figures.given_up += 1
                self.ended_at[task_id] = self.now
                self.done_work[task_id] = self.tasks[task_id].runtime - self.remaining[task_id]
                return
        if ended.requeue:
            self.enqueue(task_id)

    def summary(self) -> Figures:
        figures = self.figures
        for events in self.history.values():
            figures.latencies += reliability.node_history(
                events, since=0.0, until=self.until
            ).latencies
        # Every run admitted in the month: one still going counts the work done so far (its
        # running attempt's too) over the wall time to the month's end (the KPI's "now").
        for task_id, first in self.first_start.items():
            task = self.tasks[task_id]
            end = self.ended_at.get(task_id)
            done = self.done_work.get(task_id)
            if end is None:
                held = self.held.get(task_id)
                running = self.until - held.started if held and held.started is not None else 0.0
                done = task.runtime - self.remaining[task_id] + running
            else:
                figures.runs_ended += 1
            assert done is not None
            figures.ettr += reliability.ettr(
                effective_gpu_s=task.gpus * done,
                gpus=task.gpus,
                wall_s=reliability.wall_seconds(first_admission=first, end=end, now=self.until),
            )
        return figures


def replay(
    tasks: list[Task],
    nodes: tuple[ClusterNode, ...],
    faults: Sequence[Fault],
    *,
    guard: bool,
    label: str,
    until: float,
    failing: frozenset[str] = frozenset(),
) -> tuple[Figures, HealthReplay]:
    started = time.perf_counter()
    sim = HealthReplay(
        tasks, nodes, until=until, faults=faults, guard=guard, label=label, failing=failing
    )
    sim.run()
    figures = sim.summary()
    figures.seconds = time.perf_counter() - started
    return figures, sim


def pick_lemons(sim: "Busy") -> dict[str, Lemon]:
    """The busiest nodes of the fault-free replay (GPU-seconds placed, counted as runs
    start), one per cluster, three of them: lemons of the classes of ``LEMON_CLASSES``. A
    lemon nobody lands on would cost nothing either way."""
    lemons: dict[str, Lemon] = {}
    clusters: set[str] = set()
    for name, _ in sorted(sim.busy_by_node.items(), key=lambda item: (-item[1], item[0])):
        cluster = sim.key_of[name][0]
        if cluster in clusters:
            continue
        clusters.add(cluster)
        signal = LEMON_CLASSES[len(lemons)]
        lemons[name] = Lemon(signal=signal, every_s=LEMON_EVERY_S, gpu=0)
        if len(lemons) == len(LEMON_CLASSES):
            break
    return lemons


class Busy(HealthReplay):
    """The fault-free replay, also counting each node's GPU-seconds (to pick the lemons)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.busy_by_node: Counter[str] = Counter()

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        super().start(task_id, nodes)
        per_node = self.held[task_id].run.gpus_per_node
        for name in nodes:
            self.busy_by_node[name] += per_node * min(
                self.remaining[task_id], self.until - self.now
            )


def _faulty(job: tuple) -> Figures:
    tasks, nodes, faults, guard, label, until, failing = job
    return replay(tasks, nodes, faults, guard=guard, label=label, until=until, failing=failing)[0]


def measure(
    tasks: list[Task],
    nodes: tuple[ClusterNode, ...],
    *,
    until: float,
    seed: int = SEED,
    failing: frozenset[str] = frozenset(),
) -> tuple[list[Figures], dict[str, Lemon], list[Fault]]:
    """The fault-free replay (which picks the lemons), then with and without the policy on
    the same faults, side by side in two processes."""
    started = time.perf_counter()
    clean = Busy(
        tasks,
        nodes,
        until=until,
        faults=(),
        guard=True,
        label="fault-free, with the policy",
        failing=failing,
    )
    clean.run()
    free = clean.summary()
    free.seconds = time.perf_counter() - started
    lemons = pick_lemons(clean)
    faults = inject(nodes, lemons, seed=seed, until=until)
    jobs = [
        (tasks, nodes, faults, True, "with the policy", until, failing),
        (tasks, nodes, faults, False, "without (baseline)", until, failing),
    ]
    workers = max(1, min(2, os.cpu_count() or 1))
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            guarded, bare = pool.map(_faulty, jobs, chunksize=1)
    else:
        guarded, bare = map(_faulty, jobs)
    return [guarded, bare, free], lemons, faults


def run() -> list[Section]:
    share, stride = (QUICK_NODE_SHARE, QUICK_STRIDE) if quick() else (NODE_SHARE, 1)
    until = DAYS * DAY_S
    nodes = trace_nodes(share)
    tasks = [t for t in load_tasks(compression=COMPRESSION) if t.arrival < until][::stride]
    failing = frozenset(row["name"] for row in read_pods(TASKS_CSV) if row["pod_phase"] == "Failed")
    figures, lemons, faults = measure(tasks, nodes, until=until, failing=failing)
    for f in figures:
        sys.stderr.write(f"bench: node_health: {f.label}: {f.seconds:.0f} s\n")
    from bench.node_health_report import section

    return [section(figures, lemons, faults, nodes=nodes, tasks=tasks, until=until)]
