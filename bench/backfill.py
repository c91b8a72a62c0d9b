"""Backfill measured (issue 35, point 5): the three queueing policies of admission,
``strict``, ``backfill`` and ``best-effort``, on every cluster.

(a) Simulated through time with the engine of bench/trace.py, on the workloads of
bench/placement.py: the fragmentation of issue 18 (4 nodes × 8 A100, 2 GPUs of each used
from outside Gantry, 1×8, 2×8 and 1×2 runs) and the three Alibaba pod lists on their node
list. Every run is submitted with a maximum runtime (``bench.trace.max_runtime``: its run
time rounded up to whole hours) and every held run tells its latest end (its start plus
that bound): what backfill reads; strict reads neither.

(b) The pure decision at 10,000 queued: ``decide`` on bench/workload.py's snapshot, its
runs given max runtimes and latest ends (``bounded``), with every cluster strict, then
every cluster backfill (and best-effort), best of N.

*Heads* are the runs backfill acted around: the waiting first run of a tenant's line for a
flavor that got a reserved start (``Decisions.shadows``) or that a later run of its tenant
started ahead of (``Admit.ahead_of``), once per attempt. Each is compared with the same run
under strict FIFO: the start of the same attempt (its first, or the one after its n-th
preemption) in the strict simulation; and with its *latest start*, the reserved start it
got when it first waited as a head (the held runs ending at their max runtimes: the start
strict FIFO would give it at the latest in that snapshot). Definitions in
docs/benchmarks-notes.md.
"""

import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Set
from dataclasses import dataclass, replace
from functools import partial

from bench.placement import (
    COMPRESSION,
    QUICK_STRIDE,
    WORKERS,
    PlacementAware,
    Replay,
    group_order,
    workload_replays,
)
from bench.report import Section, best_of, ms, quick, ratio
from bench.trace import (
    NODE_SHARE,
    Result,
    Task,
    check_work,
    duration,
    percentile,
    tenant_of,
)
from bench.workload import NOW, make_snapshot
from jobs.admission import decide
from jobs.admission_types import ClusterNode, Decisions, Queueing, Shadow, Snapshot

# --- the policies --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    since: float  # when it was first seen waiting as a head (for this attempt)
    reserved: float | None  # its first reserved start; None: it never got one


class Strict(PlacementAware):
    """``decide`` with every cluster's queueing policy ``queueing``; it keeps every run's
    starts, the heads, how many runs started ahead of one, and which heads' reserved nodes
    a run of another tenant entered while they waited."""

    policy = "strict"
    queueing = Queueing.STRICT

    def __init__(self, tasks: list[Task], nodes: tuple[ClusterNode, ...], *, until=math.inf):
        super().__init__(tasks, nodes, until=until)
        self.starts: dict[int, list[float]] = defaultdict(list)  # run id -> each attempt's
        self.heads: dict[tuple[int, int], Head] = {}  # (run id, attempt) -> head
        self.started_ahead = 0
        # (cluster, node) -> the heads reserved there that have not started; and back
        self.waiting_on: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
        self.reserved_on: dict[tuple[int, int], list[tuple[str, str]]] = {}
        self.entered: set[tuple[int, int]] = set()  # heads another tenant's run got in on
        # head -> the starving runs' holds (run id, GPUs) when it got its reservation
        self.holds_seen: dict[tuple[int, int], set[tuple[int, int]]] = {}

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        head = (task_id, len(self.starts[task_id]))
        super().start(task_id, nodes)
        self.starts[task_id].append(self.now)
        for node in self.reserved_on.pop(head, []):
            self.waiting_on[node].discard(head)
        held = self.held[task_id]
        for name in nodes:
            for other in self.waiting_on.get((held.cluster, name), ()):
                if tenant_of(self.tasks[other[0]]) != held.run.tenant:
                    self.entered.add(other)

    def decided(self, decisions: Decisions) -> None:
        """Runs admitted in this cycle before a head got its reservation are what it was
        planned around: only the starts of later cycles can enter its nodes. So can a
        starving run of another tenant, by holding GPUs there it did not hold when the head
        got its reservation (``Decisions.reservations``: a starving run outranks it)."""
        for held in decisions.reservations:
            for name in held.nodes:
                for head in self.waiting_on.get((held.cluster, name), ()):
                    if (held.run_id, held.gpus) not in self.holds_seen[head] and tenant_of(
                        self.tasks[held.run_id]
                    ) != tenant_of(self.tasks[head[0]]):
                        self.entered.add(head)
        for shadow in decisions.shadows:
            self.saw_head(shadow.run_id, shadow, decisions)
        for admit in decisions.admitted:
            if admit.ahead_of is not None:
                self.started_ahead += 1
                self.saw_head(admit.ahead_of, None, decisions)

    def saw_head(self, run_id: int, shadow: Shadow | None, decisions: Decisions) -> None:
        # A waiting run's attempt is the number of its starts so far.
        key = (run_id, len(self.starts[run_id]))
        head = self.heads.get(key)
        if head is None:
            head = self.heads[key] = Head(self.now, None)
        if head.reserved is None and shadow is not None and shadow.at is not None:
            self.heads[key] = replace(head, reserved=shadow.at)
            self.reserved_on[key] = [(shadow.cluster, name) for name in shadow.nodes]
            for node in self.reserved_on[key]:
                self.waiting_on[node].add(key)
            self.holds_seen[key] = {(held.run_id, held.gpus) for held in decisions.reservations}


class Backfill(Strict):
    policy = "backfill"
    queueing = Queueing.BACKFILL


class BestEffort(Strict):
    policy = "best-effort"
    queueing = Queueing.BEST_EFFORT


POLICIES: tuple[type[Strict], ...] = (Strict, Backfill, BestEffort)


@dataclass
class Outcome:
    """What one simulation hands back from its worker process."""

    result: Result
    starts: dict[int, list[float]]
    heads: dict[tuple[int, int], Head]
    entered: Set[tuple[int, int]]  # heads whose reserved nodes another tenant's run entered
    started_ahead: int
    end: float  # simulated seconds: where it stopped
    seconds: float  # wall time


def simulate_one(job: tuple[Replay, type[Strict]]) -> Outcome:
    replay, policy = job
    started = time.perf_counter()
    sim = policy(replay.tasks, replay.nodes, until=replay.until)
    result = sim.run()
    end = replay.until if replay.until < math.inf else sim.now
    return Outcome(
        result, dict(sim.starts), sim.heads, sim.entered, sim.started_ahead, end,
        time.perf_counter() - started,
    )  # fmt: skip


def simulate(replays: list[Replay]) -> dict[tuple[str, str], Outcome]:
    """Every replay under every policy, ``WORKERS`` at a time (each alone on a core, so the
    decision times stay what one process measures), the longest first."""
    jobs = sorted(
        ((replay, policy) for replay in replays for policy in POLICIES),
        key=lambda job: -sum(t.gpus * min(t.runtime, 1e6) for t in job[0].tasks),
    )
    workers = max(1, min(WORKERS, os.cpu_count() or 1))
    done = {}
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for (replay, policy), outcome in zip(
            jobs, pool.imap(simulate_one, jobs, chunksize=1), strict=True
        ):
            sys.stderr.write(
                f"bench: backfill: {replay.workload}, {policy.policy}: {outcome.seconds:.0f} s, "
                f"{len(outcome.result.decision_s):,} decisions\n"
            )
            done[(replay.workload, policy.policy)] = outcome
    return done


# --- measuring ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lateness:
    heads: int
    later: int  # heads that started later than the same attempt under strict
    max_later: float  # the most (inf: started under strict, never here); 0 if none
    reserved: int  # heads that got a reserved start
    broken: int  # of those, started after it (or never, and the simulation went past it)
    broken_alone: int  # of those, heads whose reserved nodes no other tenant's run entered


def lateness(outcome: Outcome, strict: Outcome) -> Lateness:
    later, max_later, reserved, broken, alone = 0, 0.0, 0, 0, 0
    for (run_id, attempt), head in outcome.heads.items():
        start = attempt_start(outcome.starts, run_id, attempt)
        baseline = attempt_start(strict.starts, run_id, attempt)
        if start > baseline:
            later += 1
            max_later = max(max_later, start - baseline)
        if head.reserved is not None:
            reserved += 1
            if start > head.reserved and (start < math.inf or outcome.end >= head.reserved):
                broken += 1
                alone += (run_id, attempt) not in outcome.entered
    return Lateness(len(outcome.heads), later, max_later, reserved, broken, alone)


def attempt_start(starts: dict[int, list[float]], run_id: int, attempt: int) -> float:
    runs = starts.get(run_id, [])
    return runs[attempt] if attempt < len(runs) else math.inf


def waits_by_group(replay: Replay, result: Result) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for task in replay.tasks:
        groups[replay.group(task)].append(result.waited[task.id])
    return {group: groups[group] for group in sorted(groups, key=group_order)}


def utilization(replay: Replay, result: Result) -> float:
    """Placed GPU-seconds in the arrival window over the GPUs not used from outside."""
    usable = sum(node.gpus - node.outside for node in replay.nodes)
    return result.window_busy_gpu_s / (usable * (result.last_arrival - result.first_arrival))


def worse_p95(replays: list[Replay], done: dict[tuple[str, str], Outcome]) -> list[str]:
    """The groups (QoS classes; tenants for the fragmentation) whose p95 queue time is longer
    under backfill than under strict: "workload group: strict → backfill"."""
    worse = []
    for replay in replays:
        strict = waits_by_group(replay, done[(replay.workload, Strict.policy)].result)
        backfill = waits_by_group(replay, done[(replay.workload, Backfill.policy)].result)
        for group, waited in backfill.items():
            before, after = percentile(strict[group], 0.95), percentile(waited, 0.95)
            if after > before:
                worse.append(f"{replay.workload} {group}: {duration(before)} → {duration(after)}")
    return worse


def every(stride: int) -> str:
    """Which tasks a stride keeps, in words: "every task", "every other task", …"""
    return {1: "every task", 2: "every other task"}.get(stride, f"every {stride}th task")


def met(ok: bool) -> str:
    return "met" if ok else "missed"


# --- (a) the workloads -------------------------------------------------------------------

FRAGMENTATION = "fragmentation"
# Every other Alibaba task, on the placement section's nodes: the whole lists would take
# backfill (its decisions slower, three policies) past `make bench`'s few minutes a section.
STRIDE = 2


def replays(node_share: float, stride: int) -> list[Replay]:
    """The workloads: every ``stride``-th Alibaba task on ``node_share`` of the node list;
    the whole fragmentation stream unless quick."""
    frag_stride = QUICK_STRIDE if quick() else 1
    return workload_replays(node_share, frag_stride=frag_stride, alibaba_stride=stride)


def scenarios(node_share: float, stride: int) -> list[Section]:
    chosen = replays(node_share, stride)
    done = simulate(chosen)
    platform, waits, heads = sections(node_share, stride)
    for replay in chosen:
        strict = done[(replay.workload, Strict.policy)]
        for policy in POLICIES:
            outcome = done[(replay.workload, policy.policy)]
            result = outcome.result
            assert result.unplaced_gpu_s == 0, "admission left runs unplaced"
            if replay.until == math.inf:
                check_work(result, replay.tasks)
            platform.rows.append(
                [
                    replay.workload, policy.policy, f"{len(replay.tasks):,}",
                    f"{result.never_started:,}", f"{utilization(replay, result):.0%}",
                    f"{outcome.started_ahead:,}", f"{result.preemptions:,}",
                    f"{statistics.mean(result.decision_s) * 1000:.2f} ms",
                ]
            )  # fmt: skip
            for group, waited in waits_by_group(replay, result).items():
                waits.rows.append(
                    [
                        replay.workload, policy.policy, group, f"{len(waited):,}",
                        *(duration(percentile(waited, q)) for q in (0.5, 0.95, 0.99)),
                    ]
                )  # fmt: skip
            if policy is not Strict:
                late = lateness(outcome, strict)
                heads.rows.append(
                    [
                        replay.workload, policy.policy, f"{late.heads:,}", f"{late.later:,}",
                        duration(late.max_later) if late.later else "—",
                        f"{late.reserved - late.broken:,} of {late.reserved:,}"
                        if late.reserved else "—",
                        f"{late.broken_alone:,}" if late.reserved else "—",
                    ]
                )  # fmt: skip
    goals(chosen, done, platform, waits, heads)
    return [platform, waits, heads]


def goals(
    chosen: list[Replay],
    done: dict[tuple[str, str], Outcome],
    platform: Section,
    waits: Section,
    heads: Section,
) -> None:
    """The issue's goals for backfill, as met/missed lines under their tables."""
    frag = next(replay for replay in chosen if replay.workload == FRAGMENTATION)
    strict_use, backfill_use = (
        utilization(frag, done[(FRAGMENTATION, policy.policy)].result)
        for policy in (Strict, Backfill)
    )
    platform.notes.append(
        f"Goal: backfill's utilization in the fragmentation ≥ 10× strict's: {backfill_use:.1%} "
        f"vs {strict_use:.1%}, {ratio(backfill_use, strict_use)} — "
        f"{met(backfill_use >= 10 * strict_use)}."
    )
    worse = worse_p95(chosen, done)
    waits.notes.append(
        "Goal: no QoS class's (tenant's, in the fragmentation) p95 longer under backfill than "
        f"under strict: {'; '.join(worse) if worse else 'none longer'} — {met(not worse)}."
    )
    late = [lateness(done[(r.workload, Backfill.policy)], done[(r.workload, Strict.policy)])
            for r in chosen]  # fmt: skip
    broken, alone = sum(x.broken for x in late), sum(x.broken_alone for x in late)
    heads.notes.append(
        "Goal: no head under backfill starts after its strict-FIFO latest start (its first "
        "reserved start), for the runs of its own tenant (the guarantee: another tenant's "
        f"runs are not held back by it, under strict neither): {alone:,} started after it "
        f"with no other tenant's run on its reserved nodes meanwhile — {met(alone == 0)}. "
        f"With other tenants' runs counted: {broken:,} of {sum(x.reserved for x in late):,} "
        "heads with a reserved start started after it."
    )


def sections(node_share: float, stride: int) -> tuple[Section, Section, Section]:
    platform = Section(
        title="Backfill: strict, backfill and best-effort (issue 35, point 5)",
        intro=(
            "The workloads of the placement section above (the fragmentation of issue 18, "
            f"and the Alibaba node list, 1/{round(1 / node_share)} of each group's nodes, "
            f"arrivals {COMPRESSION}× faster, three pod lists, {every(stride)}), "
            "each through "
            "`jobs.admission.decide` three times, every cluster with one queueing policy: "
            "*strict* (FIFO inside a tenant and flavor: today's), *backfill* (EASY: a later "
            "run of the tenant starts ahead of its waiting head if it ends by the head's "
            "reserved start or takes only GPUs the head does not need there) and "
            "*best-effort* (later runs start whenever they fit). Every run is submitted with a "
            "maximum runtime of its run time rounded up to whole hours; a held run's latest "
            "end is its start plus that. *Never started*, *utilization* (placed GPU-seconds "
            "over the GPUs not used from outside × the arrival window) and *decision* as in "
            "the placement section; *started ahead*: runs admitted ahead of their tenant's "
            "waiting head (`Admit.ahead_of`)."
        ),
        columns=[
            "workload", "queueing", "runs", "never started", "utilization", "started ahead",
            "preemptions", "decision",
        ],
    )  # fmt: skip
    waits = Section(
        title="Backfill: queue time (issue 35, point 5)",
        intro=(
            "Same simulations. Queue time from submission (or requeue after a preemption) to "
            "the start on nodes, per QoS class (per tenant for the fragmentation); *never* for "
            "a run that never started."
        ),
        columns=["workload", "queueing", "group", "runs", "p50", "p95", "p99"],
    )
    heads = Section(
        title="Backfill: heads against strict FIFO (issue 35, point 5)",
        intro=(
            "Same simulations. *Heads*: runs that waited first in their tenant's line for a "
            "flavor and got a reserved start or had a later run of their tenant start ahead "
            "of them (once per attempt). *Later than strict*: heads whose start (of that "
            "attempt) came after the same run's under strict, and the most (*never*: it "
            "started under strict, never here); the simulations diverge, so this counts "
            "other tenants' effects too. *Latest start kept*: heads that started by the "
            "reserved start they got when they first waited (the held runs ending at their "
            "max runtimes: strict FIFO's latest start for them in that snapshot), of those "
            "that got one (best-effort reserves nothing); *late, own tenant only*: heads that "
            "started after it though no run of another tenant entered its reserved nodes "
            "while it waited, nor held GPUs there as a starving run (what backfill "
            "guarantees against)."
        ),
        columns=[
            "workload", "queueing", "heads", "later than strict", "most later",
            "latest start kept", "late, own tenant only",
        ],
    )  # fmt: skip
    return platform, waits, heads


# --- (b) the decision at 10,000 queued ----------------------------------------------------

QUEUED = 10_000
QUICK_QUEUED = 1_000
REPEAT = 5
BOUNDS_S = (3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0, 72 * 3600.0)
TARGET_RATIO = 1.5  # backfill ÷ strict


def bounded(snapshot: Snapshot, *, seed: int = 35) -> Snapshot:
    """``snapshot`` with a max runtime on every queued run and a latest end on every held
    run (its admission plus a max runtime it has not yet reached: it would be gone)."""
    rng = random.Random(seed)
    queued = tuple(replace(r, max_runtime_s=rng.choice(BOUNDS_S)) for r in snapshot.queued)
    held = tuple(
        replace(
            r, latest_end=r.admitted + rng.choice([b for b in BOUNDS_S if r.admitted + b > NOW])
        )
        for r in snapshot.held
    )
    return replace(snapshot, queued=queued, held=held)


def with_queueing(snapshot: Snapshot, queueing: Queueing) -> Snapshot:
    clusters = sorted({node.cluster for node in snapshot.nodes})
    return replace(snapshot, queueing=dict.fromkeys(clusters, queueing))


def decision(queued: int) -> list[Section]:
    section = Section(
        title=f"Backfill: the decision at {queued:,} queued (pure, issue 35, point 5)",
        intro=(
            f"`jobs.admission.decide` on bench/workload.py's snapshot with {queued:,} queued "
            "runs (1,000 nodes of 8 GPUs, 100 tenants, held runs on nodes), each queued run "
            "given a max runtime of 1, 4, 12, 24 or 72 h and each held run a latest end (its "
            "admission plus such a bound it has not reached), at random (seed 35); every "
            f"cluster with one queueing policy. Best of {REPEAT}."
        ),
        columns=[
            "queueing", "admitted", "started ahead", "reserved starts", "decision", "÷ strict",
        ],
    )  # fmt: skip
    base = bounded(make_snapshot(queued=queued))
    seconds: dict[Queueing, float] = {}
    for queueing in (Queueing.STRICT, Queueing.BACKFILL, Queueing.BEST_EFFORT):
        snapshot = with_queueing(base, queueing)
        decisions = decide(snapshot)
        seconds[queueing] = best_of(partial(decide, snapshot), repeat=REPEAT)
        section.rows.append(
            [
                queueing.value,
                f"{len(decisions.admitted):,}",
                f"{sum(1 for a in decisions.admitted if a.ahead_of is not None):,}",
                f"{len(decisions.shadows):,}",
                ms(seconds[queueing]),
                ratio(seconds[queueing], seconds[Queueing.STRICT]),
            ]
        )
    slower = seconds[Queueing.BACKFILL] / seconds[Queueing.STRICT]
    section.notes.append(
        f"Goal: backfill at most {TARGET_RATIO}× strict at {queued:,} queued: {slower:.2f}× — "
        f"{met(slower <= TARGET_RATIO)}."
    )
    return [section]


def run() -> list[Section]:
    if quick():
        return scenarios(NODE_SHARE / 4, QUICK_STRIDE) + decision(QUICK_QUEUED)
    return scenarios(NODE_SHARE, STRIDE) + decision(QUEUED)
