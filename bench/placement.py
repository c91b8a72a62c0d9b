"""Placement-aware admission (issue 18) against today's count-based admission.

(a) Simulated through time, on the same arrivals and run times, with the engine of
bench/trace.py. The cluster places jobs per node like a real backend: a run that
placement-aware admission (``jobs.admission.decide``) admits starts at once on the nodes
it was placed on; a run that count-based admission (``bench/count_based.py``, the admission
before issue 18) admits goes to the backend of its cluster, which starts it as soon as
``jobs.placement`` finds nodes for it there (pending jobs tried in admission order, none
holding back another); until then it waits at the backend, holding its GPUs of the quota
and of the pool's count. Two workloads:

- the fragmentation of the issue: one A100 pool of 4 nodes × 8 GPUs, 2 GPUs of each used
  by jobs from outside Gantry for the whole run, a stream of 1×8, 2×8 and 1×2 runs of two
  tenants (each run's tenant at random; and the same runs with the gangs of one tenant,
  the 1×2 runs of the other);
- the Alibaba trace (v2023, openb) on its node list, GPU models as flavors, with its
  default, multigpu50 and gpuspec33 pod lists.

(b) The pure decision at scale: ``decide`` against the count-based copy on the snapshot of
bench/workload.py (nodes and the count-based view of them), best of N.

Definitions in docs/benchmarks-notes.md.
"""

import hashlib
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace

from bench import count_based
from bench.report import Section, best_of, ms, quick, ratio
from bench.trace import (
    NODE_SHARE,
    QOS_ORDER,
    STARVATION_AFTER_S,
    Admitting,
    Gantry,
    Held,
    Result,
    Task,
    check_work,
    duration,
    load_tasks,
    node_groups,
    percentile,
    ran,
    read_pods,
    share,
    tenant_of,
)
from bench.workload import as_count_based, make_snapshot
from jobs.admission import decide
from jobs.admission_types import ClusterNode, Pool, nodes_of

# --- the policies ------------------------------------------------------------------------


class PlacementAware(Gantry):
    """``jobs.admission.decide``: a run is admitted only onto nodes where it can start."""

    policy = "placement-aware"

    def backend_start(self) -> None:
        assert not self.backend, "placement-aware admission admitted a run it did not place"


class CountBased(Admitting):
    """The count-based admission of ``bench/count_based.py``: GPUs counted per pool (its
    nodes × its largest node's GPUs; outside load unseen); the backend finds the nodes."""

    policy = "count-based"

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.pools = tuple(
            count_based.Pool(cluster, flavor, len(members), max(n.gpus for n in members))
            for (cluster, flavor), members in sorted(self.nodes.pools.items())
        )
        self.count_quotas = {
            key: count_based.Quota(**asdict(quota)) for key, quota in self.quotas.items()
        }
        # The queued and held runs as its snapshot has them.
        self.as_queued: dict[int, count_based.QueuedRun] = {}
        self.as_held: dict[int, count_based.HeldRun] = {}
        # (cluster, nodes, GPUs per node) -> the cluster's version when no placement existed
        self.no_room: dict[tuple[str, int, int], int] = {}

    def enqueue(self, task_id: int) -> None:
        super().enqueue(task_id)
        r = self.queued[task_id]
        self.as_queued[task_id] = count_based.QueuedRun(
            r.id, r.tenant, r.flavor, r.nodes, r.gpus_per_node, r.priority, r.submitted
        )

    def admitted(self, task_id: int, cluster: str, *, borrowed: bool) -> Held:
        held = super().admitted(task_id, cluster, borrowed=borrowed)
        run = held.run
        del self.as_queued[task_id]
        self.as_held[task_id] = count_based.HeldRun(
            task_id, run.tenant, run.flavor, cluster, run.gpus, run.priority, held.admitted,
            borrowed,
        )  # fmt: skip
        return held

    def release(self, task_id: int) -> Held:
        del self.as_held[task_id]
        return super().release(task_id)

    def admit(self) -> None:
        decisions = count_based.decide(
            count_based.Snapshot(
                queued=tuple(self.as_queued.values()),
                held=tuple(self.as_held.values()),
                pools=self.pools,
                quotas=self.count_quotas,
                decayed_usage=dict(self.decayed),
                now=self.now,
                starvation_after_s=STARVATION_AFTER_S,
            )
        )
        for preempted in decisions.preempted:
            self.preempt(preempted.run_id)
        for admit in decisions.admitted:
            self.admitted(admit.run_id, admit.cluster, borrowed=admit.borrowed)

    def backend_start(self) -> None:
        """The backend starts what it finds nodes for, in admission order; a job that does
        not fit holds no other back. (A shape that found no room on a cluster is not tried
        again there until the cluster's nodes change.)"""
        for task_id, held in list(self.backend.items()):
            run = held.run
            shape = (held.cluster, run.nodes, run.gpus_per_node)
            if self.no_room.get(shape) == self.nodes.version[held.cluster]:
                continue
            where = self.nodes.place(run, (held.cluster,))
            if where is None:
                self.no_room[shape] = self.nodes.version[held.cluster]
            else:
                self.start(task_id, where[1])


POLICIES: tuple[type[Admitting], ...] = (CountBased, PlacementAware)

# --- (i) the fragmentation of the issue ------------------------------------------------------

FRAG_CLUSTER = "hpc-1"
FRAG_FLAVOR = "a100-80gb"
FRAG_OUTSIDE = 2  # GPUs of each node used by jobs from outside Gantry
FRAG_TENANTS = ("alpha", "beta")
FRAG_SHAPES = {(1, 8): 0.2, (2, 8): 0.1, (1, 2): 0.7}  # (nodes, GPUs per node): share
FRAG_MEAN_GAP_S = 600.0  # between two submissions, of either tenant (exponential)
FRAG_RUNTIME_S = (1200.0, 4 * 3600.0)  # log-uniform
FRAG_STREAM_S = 24 * 3600.0  # submissions for a day
FRAG_UNTIL_S = 48 * 3600.0  # then a day more, if anything is left


def fragmented_nodes(outside: int = FRAG_OUTSIDE) -> tuple[ClusterNode, ...]:
    return tuple(
        replace(node, outside=outside)
        for node in nodes_of(Pool(FRAG_CLUSTER, FRAG_FLAVOR, nodes=4, gpus_per_node=8))
    )


def fragmented_tasks(*, by_shape: bool = False, seed: int = 18) -> list[Task]:
    """The stream of the fragmentation scenario: each run of either tenant at random, or,
    ``by_shape``, the gangs (1×8, 2×8) of alpha and the 1×2 runs of beta; the same runs at
    the same times either way."""
    rng = random.Random(seed)
    shapes, weights = zip(*FRAG_SHAPES.items(), strict=True)
    low, high = FRAG_RUNTIME_S
    tasks, at = [], 0.0
    while True:
        at += rng.expovariate(1 / FRAG_MEAN_GAP_S)
        if at >= FRAG_STREAM_S:
            return tasks
        nodes, per_node = rng.choices(shapes, weights)[0]
        tenant = rng.choice(FRAG_TENANTS)
        if by_shape:
            tenant = FRAG_TENANTS[per_node < 8]
        tasks.append(
            Task(
                id=len(tasks) + 1, name=f"frag-{len(tasks) + 1}", qos="LS",
                gpus_per_node=per_node, arrival=round(at, 3),
                runtime=round(math.exp(rng.uniform(math.log(low), math.log(high))), 3),
                flavor=FRAG_FLAVOR, nodes=nodes, tenant=tenant,
            )
        )  # fmt: skip


# --- (ii) the Alibaba trace on its node list ------------------------------------------------

PODS = (
    "openb_pod_list_default.csv",
    "openb_pod_list_multigpu50.csv",
    "openb_pod_list_gpuspec33.csv",
)
COMPRESSION = 5  # arrivals this much faster than in the trace ("busy" in bench/trace.py)
WORKERS = 2  # simulations run side by side (at most one per core)
QUICK_STRIDE = 10  # GANTRY_BENCH_QUICK=1: every tenth task, on a quarter of the nodes


def stable(text: str) -> int:
    return int(hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest(), 16)


def trace_nodes(node_share: float = NODE_SHARE) -> tuple[ClusterNode, ...]:
    """The trace's node list, ``node_share`` of each (model, GPUs per node) group (rounded,
    at least one node): one cluster per group (``g2-x8``), the model as the flavor."""
    return nodes_of(
        *(
            Pool(f"{model.lower()}-x{gpus}", model.lower(), max(1, round(count * node_share)), gpus)
            for (model, gpus), count in sorted(node_groups().items())
        )
    )


def flavor_chooser(nodes: Iterable[ClusterNode]) -> Callable[[dict[str, str]], str]:
    """A task's flavor: one of the GPU models its ``gpu_spec`` allows (any if none) with a
    node big enough for it, drawn by a stable hash of its name, in proportion to the GPUs
    of each model."""
    gpus: dict[str, int] = defaultdict(int)
    largest: dict[str, int] = defaultdict(int)
    for node in nodes:
        gpus[node.flavor] += node.gpus
        largest[node.flavor] = max(largest[node.flavor], node.gpus)

    def flavor_of(row: dict[str, str]) -> str:
        allowed = {m.lower() for m in row.get("gpu_spec", "").split("|") if m} or set(gpus)
        fitting = [f for f in sorted(allowed) if largest.get(f, 0) >= int(row["num_gpu"])]
        if not fitting:  # no allowed model has a node that large: any model that has
            fitting = [f for f in sorted(gpus) if largest[f] >= int(row["num_gpu"])]
        point = stable(f"{row['name']}/flavor") % sum(gpus[f] for f in fitting)
        for flavor in fitting:
            point -= gpus[flavor]
            if point < 0:
                return flavor
        raise AssertionError("unreachable")

    return flavor_of


def pod_rows(name: str) -> list[dict[str, str]]:
    """The pod list's rows, with times and QoS. multigpu50 has neither: its rows that are
    in the default list (the same name, the same request) take them from there; each of the
    others takes the QoS and run time of a default task with as many GPUs that ran, and the
    creation time of any GPU task that ran, both chosen by a stable hash of its name."""
    rows = read_pods(name)
    if "creation_time" in rows[0]:
        return rows
    default = read_pods(PODS[0])
    by_name = {row["name"]: row for row in default}
    ran_rows = [row for row in default if ran(row)]
    same_size: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in ran_rows:
        same_size[row["num_gpu"]].append(row)
    filled = []
    for row in rows:
        known = by_name.get(row["name"])
        if known is not None and known["num_gpu"] == row["num_gpu"]:
            filled.append({**known, **row})
            continue
        if int(row["num_gpu"]) < 1:
            continue
        twin = same_size[row["num_gpu"]]
        like = twin[stable(f"{row['name']}/runtime") % len(twin)]
        arrival = int(ran_rows[stable(f"{row['name']}/arrival") % len(ran_rows)]["creation_time"])
        runtime = int(like["deletion_time"]) - int(like["scheduled_time"])
        filled.append(
            {
                **row, "gpu_spec": "", "qos": like["qos"], "creation_time": str(arrival),
                "scheduled_time": str(arrival), "deletion_time": str(arrival + runtime),
            }
        )  # fmt: skip
    return filled


# --- measuring ---------------------------------------------------------------------------


@dataclass
class Replay:
    workload: str
    tasks: list[Task]
    nodes: tuple[ClusterNode, ...]
    group: Callable[[Task], str]  # queue times are reported per group (QoS class, tenant)
    until: float = math.inf


def whole_node_share(result: Result, nodes: Iterable[ClusterNode]) -> float:
    """Of the arrival window, the share of time during which at least one node of a flavor
    was entirely free, averaged over the flavors weighted by their GPUs."""
    window = result.last_arrival - result.first_arrival
    gpus: dict[str, int] = defaultdict(int)
    for node in nodes:
        gpus[node.flavor] += node.gpus
    total = sum(gpus.values())
    return sum(result.whole_node_s[f] / window * g / total for f, g in gpus.items())


def group_order(group: str) -> tuple[int, str]:
    return (QOS_ORDER.index(group), group) if group in QOS_ORDER else (len(QOS_ORDER), group)


def qos_of(task: Task) -> str:
    return task.qos


def replay_with(job: tuple[Replay, type[Admitting]]) -> tuple[Result, float]:
    """One simulation (in a worker process): its result and wall time."""
    replay, policy = job
    started = time.perf_counter()
    result = policy(replay.tasks, replay.nodes, until=replay.until).run()
    return result, time.perf_counter() - started


def simulate(replays: list[Replay], platform: Section, waits: Section) -> None:
    """Every replay under every policy, ``WORKERS`` simulations at a time (each alone on a
    core, so the decision times stay what one process measures), the longest first."""
    jobs = sorted(
        ((replay, policy) for replay in replays for policy in POLICIES),
        key=lambda job: -sum(t.gpus * min(t.runtime, 1e6) for t in job[0].tasks),
    )
    workers = max(1, min(WORKERS, os.cpu_count() or 1))
    context = multiprocessing.get_context("fork")
    with context.Pool(workers) as pool:
        done = {}
        for (replay, policy), (result, seconds) in zip(
            jobs, pool.imap(replay_with, jobs, chunksize=1), strict=True
        ):
            sys.stderr.write(
                f"bench: placement: {replay.workload}, {policy.policy}: {seconds:.0f} s, "
                f"{len(result.decision_s):,} decisions\n"
            )
            done[(replay.workload, policy.policy)] = result
    for replay in replays:
        for policy in POLICIES:
            report(replay, done[(replay.workload, policy.policy)], platform, waits)


def report(replay: Replay, result: Result, platform: Section, waits: Section) -> None:
    if result.policy == PlacementAware.policy:
        assert result.unplaced_gpu_s == 0, "placement-aware admission left runs unplaced"
    if replay.until == math.inf:
        check_work(result, replay.tasks)
    usable = sum(node.gpus - node.outside for node in replay.nodes)
    window = result.last_arrival - result.first_arrival
    platform.rows.append(
        [
            replay.workload,
            result.policy,
            f"{len(replay.tasks):,}",
            f"{result.unplaced_gpu_s / 3600:,.1f}",
            f"{result.never_started:,}",
            share(result.window_busy_gpu_s, usable * window),
            f"{whole_node_share(result, replay.nodes):.0%}",
            f"{result.preemptions:,}",
            f"{statistics.mean(result.decision_s) * 1000:.2f} ms",
        ]
    )
    by_group: dict[str, list[float]] = defaultdict(list)
    for task in replay.tasks:
        by_group[replay.group(task)].append(result.waited[task.id])
    for group in sorted(by_group, key=group_order):
        waited = by_group[group]
        waits.rows.append(
            [
                replay.workload, result.policy, group, f"{len(waited):,}",
                *(duration(percentile(waited, q)) for q in (0.5, 0.95, 0.99)),
            ]
        )  # fmt: skip


def scenarios(node_share: float, stride: int) -> list[Section]:
    platform = Section(
        title="Placement-aware vs count-based admission, simulated (issue 18)",
        intro=(
            "The same arrivals and run times through two admitters, on a cluster that places "
            "jobs per node like a real backend. *Placement-aware*: `jobs.admission.decide`; a "
            "run is admitted onto nodes where it starts at once. *Count-based*: the admission "
            "before issue 18 (`bench/count_based.py`), which counts GPUs per pool; a run it "
            "admits with no node placement waits at the backend, holding its quota, until "
            "`jobs.placement` finds nodes for it there. *Fragmentation*: one A100 pool of 4 "
            f"nodes × 8 GPUs, {FRAG_OUTSIDE} GPUs of each used by jobs from outside Gantry "
            "throughout; tenants alpha and beta (guaranteed 16 GPUs each, may borrow 16) "
            "submit 1×8, 2×8 and 1×2 runs (20 / 10 / 70 %), one every 10 min on average for "
            "a day, runs of 20 min to 4 h; simulated for two days. *Alibaba*: the trace's "
            f"node list (1/{round(1 / node_share)} of each GPU model and node size's nodes, "
            "one cluster each, the GPU model as the flavor), arrivals "
            f"{COMPRESSION}× faster, three pod lists (tasks mapped as in the trace replay; a "
            "task's flavor: one of the models it allows, by hash). *Unplaceable*: GPU-hours "
            "admitted but waiting at the backend for nodes. *Never started*: runs still "
            "waiting at the end. *Utilization*: placed GPU-seconds over the GPUs not used "
            "from outside × the arrival window. *Whole node free*: share of the arrival "
            "window with at least one node of the flavor entirely free, averaged over the "
            "flavors by GPUs. *Decision*: mean wall time of one admission. Definitions: "
            "benchmarks-notes.md."
        ),
        columns=[
            "workload", "admission", "runs", "unplaceable GPU-h", "never started",
            "utilization", "whole node free", "preemptions", "decision",
        ],
    )  # fmt: skip
    waits = Section(
        title="Placement-aware vs count-based admission: queue time (issue 18)",
        intro=(
            "Same simulations. Queue time: from submission (or requeue after a preemption) "
            "to the start on nodes, so time waiting at the backend counts; per QoS class "
            "(per tenant for the fragmentation); *never* for a run that never started."
        ),
        columns=["workload", "admission", "group", "runs", "p50", "p95", "p99"],
    )
    replays = workload_replays(node_share, frag_stride=stride, alibaba_stride=stride)
    simulate(replays, platform, waits)
    return [platform, waits]


def workload_replays(node_share: float, *, frag_stride: int, alibaba_stride: int) -> list[Replay]:
    """The fragmentation stream (both mixes) and the Alibaba pod lists on ``node_share`` of
    the node list: every ``frag_stride``-th and ``alibaba_stride``-th task."""
    replays = [
        Replay(
            "fragmentation" + (", gangs of alpha, 1×2 of beta" if by_shape else ""),
            fragmented_tasks(by_shape=by_shape)[::frag_stride],
            fragmented_nodes(),
            tenant_of,
            FRAG_UNTIL_S,
        )
        for by_shape in (False, True)
    ]
    nodes = trace_nodes(node_share)
    flavor_of = flavor_chooser(nodes)
    for pods in PODS:
        rows = pod_rows(pods)
        tasks = load_tasks(compression=COMPRESSION, rows=rows, flavor_of=flavor_of)
        label = pods.removeprefix("openb_pod_list_").removesuffix(".csv")
        replays.append(Replay(f"Alibaba {label}", tasks[::alibaba_stride], nodes, qos_of))
    return replays


# --- (b) the pure decision at scale ---------------------------------------------------------

SIZES = (10_000, 100_000)  # queued runs
QUICK_SIZES = (1_000, 2_000)
TARGET_RATIO = 2.0  # placement-aware ÷ count-based at the smaller size
TARGET_SCALING = 12.0  # placement-aware, larger ÷ smaller size


def decision(sizes: tuple[int, ...]) -> list[Section]:
    section = Section(
        title="Placement-aware decision at scale (pure, issue 18)",
        intro=(
            "`jobs.admission.decide` against the count-based admission before issue 18 "
            "(`bench/count_based.py`) on the same snapshot (`bench/workload.py`: 100 tenants, "
            "4 flavors, 10 clusters, 1,000 nodes of 8 GPUs, held runs on nodes; the count-based "
            "copy sees each cluster's flavor as a pool of 25 × 8 GPUs). Best of 5 "
            "(placement-aware) and of 5 (count-based)."
        ),
        columns=[
            "queued runs", "admitted (placement-aware / count-based)", "placement-aware",
            "count-based", "placement-aware ÷ count-based",
        ],
    )  # fmt: skip
    aware: dict[int, float] = {}
    counted_s: dict[int, float] = {}
    for queued in sizes:
        snapshot = make_snapshot(queued=queued)
        counted = as_count_based(snapshot)
        placed = decide(snapshot)
        baseline = count_based.decide(counted)
        aware[queued] = best_of(lambda snapshot=snapshot: decide(snapshot), repeat=5)
        counted_s[queued] = best_of(lambda counted=counted: count_based.decide(counted), repeat=5)
        section.rows.append(
            [
                f"{queued:,}",
                f"{len(placed.admitted):,} / {len(baseline.admitted):,}",
                ms(aware[queued]),
                ms(counted_s[queued]),
                ratio(aware[queued], counted_s[queued]),
            ]
        )
    small, large = min(sizes), max(sizes)
    met = aware[small] <= TARGET_RATIO * counted_s[small]
    scales = aware[large] <= TARGET_SCALING * aware[small]
    section.notes += [
        f"Goal: placement-aware at most {TARGET_RATIO:.0f}× count-based at {small:,} queued: "
        f"{ratio(aware[small], counted_s[small])} — {'met' if met else 'missed'}.",
        f"Placement-aware, {large:,} / {small:,} queued: {ratio(aware[large], aware[small])} "
        f"(goal ≤ {TARGET_SCALING:.0f}×: {'met' if scales else 'missed'}); count-based: "
        f"{ratio(counted_s[large], counted_s[small])}.",
    ]
    return [section]


def run() -> list[Section]:
    if quick():
        return scenarios(NODE_SHARE / 4, QUICK_STRIDE) + decision(QUICK_SIZES)
    return scenarios(NODE_SHARE, 1) + decision(SIZES)
