"""Start estimates (issue 19): how accurate on the Alibaba trace, and what they cost.

(a) Accuracy. The Alibaba trace (v2023, openb, default pod list) replayed through Gantry's
admission and placement with the engine of bench/trace.py (``Gantry``: ``decide`` after
every batch of simultaneous events; a run starts at once on the nodes it was placed on and
ends after its true run time), arrivals ``COMPRESSION``× faster, from the first task on so
that the platform is as busy as the trace makes it. For every ``EVERY``-th task of a
contiguous window, at its submit cycle, on that cycle's snapshot:

- *latest start*: ``jobs.estimates.simulate`` as jobs.services.estimates calls it, every
  held run ending at its start + its maximum runtime, every queued run holding its GPUs
  for its maximum runtime;
- *expected start*: the same with durations predicted as jobs.selectors.estimates does
  (``estimates.expected_runtime`` over the 20 most recent finished runs of each key;
  ``estimates.expected_end`` for held runs), shown never after the latest start. The trace
  has no experiment and no template: the tenant's runs of the same request (GPUs, GPU
  share, CPU, memory) stand in for the experiment; then the tenant's runs of the flavor
  and size;
- baseline *queue position × mean*: now + the run's place among the waiting runs of its
  flavor after the cycle (0 if admitted) × the mean run time of the tasks finished so far;
- baseline *backfill*: the earliest time a placement exists for the run once the held runs
  end at their maximum runtimes, the queue ignored (one run's conservative profile).

A task's **maximum runtime**, which the trace does not have, is what a user would ask for:
more than the run uses, a round number. Its true run time × a factor log-uniform in [1, 4]
(drawn per task from a fixed seed and its name), rounded up to the next hour.

The latest start is a bound when its **assumptions held**: no task submitted after the run
started before it, and no run was preempted while it waited (from its submit cycle to the
cycle before its start). A **violation**: such a run started after its latest start.
Errors are absolute (|estimate − actual start|), per QoS class (the trace's ``qos``), on
the tasks for which every method gave a number; "waited": the tasks that did not start in
their submit cycle.

(b) Cost. ``decide`` on the snapshot of bench/workload.py (10,000 queued runs, 1,000 nodes)
against ``simulate`` on it in both modes, each run given a maximum runtime and an expected
duration at random; median of ``REPEAT`` runs each.

``GANTRY_BENCH_QUICK=1``: a short window and 1,000 queued runs (does it still work?).
"""

import bisect
import math
import random
import statistics
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from typing import TypeVar

from django.conf import settings

from bench.report import Section, ms, quick
from bench.trace import (
    QOS_ORDER,
    STARVATION_AFTER_S,
    TASKS_CSV,
    Gantry,
    Task,
    duration,
    load_pools,
    load_tasks,
    percentile,
    ran,
    read_pods,
    tenant_of,
)
from bench.workload import make_snapshot
from jobs import estimates, placement
from jobs.admission import decide
from jobs.admission_types import ClusterNode, Decisions, QueuedRun, Snapshot, nodes_of

COMPRESSION = 5  # arrivals this much faster than in the trace ("busy" in bench/trace.py)
WINDOW_START = 4_000  # the first task estimated (by arrival): runs queue from about here
WINDOW = 2_000  # tasks in the window: about a minute of replay on one core
EVERY = 1  # of the window's arrivals, one in this many is estimated
# GANTRY_BENCH_QUICK=1: a window of 40 tasks, one in 2 estimated, no task replayed after
# the next 40; the cost on 1,000 queued runs, once.
QUICK_WINDOW_START, QUICK_WINDOW, QUICK_EVERY = 4_000, 40, 2
PAD_FACTOR = (1.0, 4.0)  # a maximum runtime: the run time times this (log-uniform),
PAD_ROUND_S = 3600.0  # then rounded up to the next hour
SEED = 19
HISTORY_PER_KEY = 20  # as jobs.selectors.estimates
HORIZON_S = 7 * 24 * 3600.0  # GANTRY_ESTIMATE_HORIZON_H's default
MAX_STEPS = 200  # GANTRY_ESTIMATE_MAX_STEPS's default
COST_QUEUED, QUICK_COST_QUEUED = 10_000, 1_000
REPEAT, QUICK_REPEAT = 3, 1
COST_MAX_RUNTIMES_H = (1, 2, 4, 8, 24, 72)
BUDGET_MS = 300.0  # acceptance: estimating adds at most this per cycle

T = TypeVar("T")

# --- what users ask for and what history says ---------------------------------------------


def max_runtime(task: Task) -> float:
    """What the user asked for: more than the run uses, rounded up to the hour."""
    low, high = PAD_FACTOR
    draw = random.Random(f"{SEED}/{task.name}").uniform(math.log(low), math.log(high))
    return math.ceil(task.runtime * math.exp(draw) / PAD_ROUND_S) * PAD_ROUND_S


Request = tuple[str, str, str]  # GPU share (milli), CPU (milli), memory (MiB)


def requests() -> dict[str, Request]:
    """Task name -> its request beyond the GPU count, from the pod list."""
    return {
        row["name"]: (row["gpu_milli"], row["cpu_milli"], row["memory_mib"])
        for row in read_pods(TASKS_CSV)
        if ran(row)
    }


class History:
    """Run times of finished tasks by the keys the product reads (jobs.selectors.estimates),
    the most recent ``HISTORY_PER_KEY`` of each. The trace has no experiment or template:
    the tenant's runs of the same request stand in for the experiment, no template."""

    def __init__(self, request_of: Mapping[str, Request]):
        self.request_of = request_of
        self.durations: dict[tuple[object, ...], deque[float]] = defaultdict(
            lambda: deque(maxlen=HISTORY_PER_KEY)
        )
        self.total_s = 0.0
        self.count = 0

    def keys(self, task: Task) -> tuple[tuple[object, ...], tuple[object, ...]]:
        """(the experiment's stand-in, the tenant's shape)."""
        shape = (tenant_of(task), task.flavor, task.nodes, task.gpus_per_node)
        return (*shape, *self.request_of[task.name]), shape

    def add(self, task: Task) -> None:
        for key in self.keys(task):
            self.durations[key].append(task.runtime)
        self.total_s += task.runtime
        self.count += 1

    def expected_runtime(self, task: Task, max_runtime_s: float) -> float:
        experiment, shape = self.keys(task)
        histories = [self.durations.get(experiment, ()), (), self.durations.get(shape, ())]
        return estimates.expected_runtime(histories, max_runtime_s=max_runtime_s)

    def mean(self) -> float | None:
        """The mean run time of every task finished so far."""
        return self.total_s / self.count if self.count else None


# --- the replay ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a task was told at submit time; ``None``: no number (``why`` for the two
    simulated figures)."""

    task: Task
    latest: float | None
    expected: float | None
    by_position: float | None
    by_backfill: float | None
    latest_why: str = ""
    expected_why: str = ""


class Estimating(Gantry):
    """The trace replay of bench/trace.py, estimating the starts of the tasks in
    ``estimated`` when they arrive."""

    policy = "Gantry with estimates"

    def __init__(
        self,
        tasks: list[Task],
        nodes: tuple[ClusterNode, ...],
        *,
        estimated: set[int],
        history: History,
    ):
        super().__init__(tasks, nodes)
        self.estimated = estimated
        self.history = history
        self.max_runtime = {t.id: max_runtime(t) for t in tasks}
        self.arrived: list[int] = []  # this batch's arrivals to estimate
        self.estimates: dict[int, Estimate] = {}
        self.first_start: dict[int, float] = {}
        self.preemptions: list[float] = []  # when, in order
        self.simulate_s: list[float] = []

    def enqueue(self, task_id: int) -> None:
        if task_id in self.estimated and task_id not in self.first_start:  # not a requeue
            self.arrived.append(task_id)
        super().enqueue(task_id)

    def start(self, task_id: int, nodes: tuple[str, ...]) -> None:
        super().start(task_id, nodes)
        self.first_start.setdefault(task_id, self.now)

    def finish(self, task_id: int) -> None:
        super().finish(task_id)
        self.history.add(self.tasks[task_id])

    def preempt(self, task_id: int) -> None:
        self.preemptions.append(self.now)
        super().preempt(task_id)

    def snapshot(self) -> Snapshot:
        return Snapshot(
            queued=tuple(self.queued.values()),
            held=tuple(self.as_held.values()),
            nodes=tuple(self.nodes.node.values()),
            quotas=self.quotas,
            decayed_usage=dict(self.decayed),
            now=self.now,
            starvation_after_s=STARVATION_AFTER_S,
        )

    def admit(self) -> None:
        snapshot = self.snapshot()
        decisions = decide(snapshot, explain=False)
        if self.arrived:
            self.estimate(snapshot, decisions)
            self.arrived = []
        for preempted in decisions.preempted:
            self.preempt(preempted.run_id)
        for admit in decisions.admitted:
            self.admitted(admit.run_id, admit.cluster, borrowed=admit.borrowed)
            self.start(admit.run_id, admit.nodes)

    def started(self, run_id: int) -> float:
        """When a held run started on its nodes (every admitted run starts at once)."""
        return self.held[run_id].started or self.now

    def expected_runtime(self, run_id: int) -> float:
        return self.history.expected_runtime(self.tasks[run_id], self.max_runtime[run_id])

    def estimate(self, snapshot: Snapshot, decisions: Decisions) -> None:
        """Both simulated figures, as jobs.services.estimates computes and shows them, and
        both baselines, for this batch's arrivals."""
        now = snapshot.now
        max_runtimes = {run.id: self.max_runtime[run.id] for run in snapshot.queued}
        expected_runtimes = {run.id: self.expected_runtime(run.id) for run in snapshot.queued}
        latest_ends = {
            run.id: self.started(run.id) + self.max_runtime[run.id] for run in snapshot.held
        }
        expected_ends = {
            run.id: estimates.expected_end(
                started=self.started(run.id), now=now, expected_s=self.expected_runtime(run.id),
                latest_end=latest_ends[run.id],
            )
            for run in snapshot.held
        }  # fmt: skip
        began = time.perf_counter()
        latest = simulate(snapshot, latest_ends, max_runtimes)
        expected = simulate(snapshot, expected_ends, expected_runtimes)
        self.simulate_s.append(time.perf_counter() - began)
        positions = {wait.run_id: wait.position for wait in decisions.waiting}
        mean = self.history.mean()
        for task_id in self.arrived:
            bound, likely = latest.starts[task_id].at, expected.starts[task_id].at
            if bound is not None and (likely is None or likely > bound):
                likely = bound  # as the product shows it: never after the bound
            self.estimates[task_id] = Estimate(
                task=self.tasks[task_id],
                latest=bound,
                expected=likely,
                by_position=None if mean is None else now + positions.get(task_id, 0) * mean,
                by_backfill=backfill_start(self.queued[task_id], snapshot, latest_ends),
                latest_why=no_estimate_reason(latest, task_id),
                expected_why=no_estimate_reason(expected, task_id),
            )


def simulate(
    snapshot: Snapshot, ends: Mapping[int, float], runtimes: Mapping[int, float]
) -> estimates.Forecast:
    """``jobs.estimates.simulate`` as the product calls it: ``runtimes`` of the queued runs
    only, the default horizon and number of cycles."""
    return estimates.simulate(
        snapshot, ends=ends, runtimes=runtimes, horizon_s=HORIZON_S, max_steps=MAX_STEPS
    )


# What keeps GPUs with no known end, as ``simulate`` words it: (phrase, in short).
NO_BOUND_CAUSES = (
    ("outside Gantry", "outside load"),
    ("take no work", "nodes taking no work"),
    ("no maximum runtime", "a run ahead with no maximum runtime"),
)


def no_estimate_reason(forecast: estimates.Forecast, run_id: int) -> str:
    """Why ``simulate`` gave the run no number, in short ("" if it gave one)."""
    start = forecast.starts[run_id]
    if start.at is not None:
        return ""
    if len(forecast.steps) >= MAX_STEPS:
        return f"the {MAX_STEPS} simulated cycles ran out"
    if start.why.startswith("no bound"):
        causes = [short for phrase, short in NO_BOUND_CAUSES if phrase in start.why]
        return f"no bound: {', '.join(causes) or start.why}"
    return start.why.split(";")[0]


def backfill_start(run: QueuedRun, snapshot: Snapshot, ends: Mapping[int, float]) -> float | None:
    """The earliest time a placement exists for ``run`` on one cluster of its flavor once
    the held runs end at ``ends``, every other queued run ignored; None if never."""
    nodes = [node for node in snapshot.nodes if node.flavor == run.flavor]
    free = {(n.cluster, n.name): n.gpus - n.outside for n in nodes}
    holding = [held for held in snapshot.held if held.flavor == run.flavor and held.nodes]
    for held in holding:
        for name in held.nodes:
            free[(held.cluster, name)] -= held.gpus // len(held.nodes)
    clusters: dict[str, list[ClusterNode]] = defaultdict(list)
    for node in nodes:
        clusters[node.cluster].append(node)
    gang = placement.Gang(run.nodes, run.gpus_per_node)

    def fits() -> bool:
        return any(
            placement.place(
                [placement.Node(n.name, n.gpus, free[(c, n.name)], n.schedulable, n.path)
                 for n in members],
                gang,
            )
            is not None
            for c, members in clusters.items()
        )  # fmt: skip

    if fits():
        return snapshot.now
    for end, ending in groupby(sorted(holding, key=lambda h: ends[h.id]), key=lambda h: ends[h.id]):
        for held in ending:
            for name in held.nodes:
                free[(held.cluster, name)] += held.gpus // len(held.nodes)
        if fits():
            return end
    return None


# --- (a) accuracy ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """An estimated task after the replay."""

    estimate: Estimate
    actual: float  # its first start
    overtaken: bool  # a task submitted after it started before it
    preempted_meanwhile: bool  # a run was preempted while it waited

    @property
    def assumptions_held(self) -> bool:
        return not self.overtaken and not self.preempted_meanwhile

    def off(self, estimate: float | None) -> float:
        """How much later than the actual start ``estimate`` is (negative: earlier)."""
        assert estimate is not None
        return estimate - self.actual

    @property
    def violates(self) -> bool:
        latest = self.estimate.latest
        return self.assumptions_held and latest is not None and self.actual > latest + 1e-6


def outcomes(replay: Estimating) -> list[Outcome]:
    arrival = {task_id: task.arrival for task_id, task in replay.tasks.items()}
    overtaken = overtaken_tasks(arrival, replay.first_start)
    result = []
    for task_id, estimate in sorted(replay.estimates.items()):
        actual = replay.first_start[task_id]
        first = bisect.bisect_left(replay.preemptions, arrival[task_id])
        meanwhile = first < len(replay.preemptions) and replay.preemptions[first] < actual
        result.append(Outcome(estimate, actual, task_id in overtaken, meanwhile))
    return result


def overtaken_tasks(arrival: Mapping[int, float], start: Mapping[int, float]) -> set[int]:
    """Tasks that a task submitted after them started before."""
    overtaken: set[int] = set()
    earliest_later_start = math.inf  # of the tasks submitted after the current arrival time
    by_arrival = sorted(arrival, key=lambda task_id: -arrival[task_id])
    for _, same_time in groupby(by_arrival, key=lambda task_id: arrival[task_id]):
        batch = list(same_time)
        overtaken.update(t for t in batch if earliest_later_start < start[t])
        earliest_later_start = min(earliest_later_start, *(start[t] for t in batch))
    return overtaken


METHODS: tuple[tuple[str, Callable[[Estimate], float | None]], ...] = (
    ("expected", lambda e: e.expected),
    ("queue position × mean", lambda e: e.by_position),
    ("backfill (max runtimes)", lambda e: e.by_backfill),
)


def waited(outcome: Outcome) -> bool:
    return outcome.actual > outcome.estimate.task.arrival


def errors_row(qos: str, subset: str, chosen: list[Outcome]) -> list[str]:
    cells = [qos, subset, f"{len(chosen):,}"]
    for _, figure in METHODS:
        errors = [abs(o.off(figure(o.estimate))) for o in chosen]
        cells.append(
            f"{duration(percentile(errors, 0.5))} / {duration(percentile(errors, 0.9))}"
            if errors
            else "—"
        )
    early = [-o.off(o.estimate.expected) for o in chosen]
    cells.append(signed(statistics.median(early)) if early else "—")
    return cells


def signed(seconds: float) -> str:
    return f"{'−' if seconds < 0 else ''}{duration(abs(seconds))}"


def accuracy_section(done: list[Outcome], intro: str) -> Section:
    section = Section(
        title="Start estimates: expected start error (issue 19, point 3)",
        intro=intro,
        columns=[
            "QoS", "tasks", "count", *(f"{name}: median / p90 error" for name, _ in METHODS),
            "actual − expected, median",
        ],
    )  # fmt: skip
    numbered = [o for o in done if all(figure(o.estimate) is not None for _, figure in METHODS)]
    classes = [q for q in QOS_ORDER if any(o.estimate.task.qos == q for o in numbered)]
    for qos in [*classes, "all"]:
        chosen = [o for o in numbered if qos in ("all", o.estimate.task.qos)]
        section.rows.append(errors_row(qos, "all", chosen))
        section.rows.append(errors_row(qos, "waited", [o for o in chosen if waited(o)]))
    left_out = len(done) - len(numbered)
    if left_out:
        section.notes.append(f"{left_out:,} tasks left out: a method gave them no number.")
    return section


def bound_section(done: list[Outcome], replay: Estimating) -> Section:
    section = Section(
        title="Start estimates: the latest-start bound (issue 19, point 3)",
        intro=(
            "Same replay. *Assumptions held*: no task submitted after the run started before "
            "it, and no run was preempted while it waited. *Violation*: such a run started "
            'after its latest start. *No latest start*: the product says "no estimate" '
            "with the reason; *no expected start*: the product shows the latest start."
        ),
        columns=["", "tasks", "share of the estimated tasks"],
    )
    total = len(done)
    held = [o for o in done if o.assumptions_held]
    bounded = [o for o in held if o.estimate.latest is not None]
    violations = [o for o in bounded if o.violates]
    rows = [
        ("estimated at submit time", total),
        ("… of which waited", sum(waited(o) for o in done)),
        ("overtaken by a later submission", sum(o.overtaken for o in done)),
        ("a preemption while it waited", sum(o.preempted_meanwhile for o in done)),
        ("assumptions held", len(held)),
        ("… with a latest start", len(bounded)),
        ("… … of which waited", sum(waited(o) for o in bounded)),
        ("… **started after its latest start** (goal 0)", len(violations)),
    ]
    for figure, attribute in (("latest", "latest_why"), ("expected", "expected_why")):
        reasons = Counter(getattr(o.estimate, attribute) for o in done)
        reasons.pop("", None)
        rows.append((f"no {figure} start", sum(reasons.values())))
        rows += [(f"… {why}", count) for why, count in reasons.most_common()]
    section.rows = [[label, f"{count:,}", f"{count / total:.1%}"] for label, count in rows]
    if violations:
        late = [-o.off(o.estimate.latest) for o in violations]
        first = violations[0]
        task, latest = first.estimate.task, first.estimate.latest
        assert latest is not None
        section.notes.append(
            f"Lateness of the violations: median {duration(statistics.median(late))}, max "
            f"{duration(max(late))}. First: task {task.id} ({task.qos}, {task.gpus} GPU, "
            f"tenant {tenant_of(task)}), latest start {duration(latest - task.arrival)} after "
            "submission, "
            f"started after {duration(first.actual - task.arrival)}."
        )
    slack = [o.off(o.estimate.latest) for o in bounded if waited(o) and not o.violates]
    if slack:
        section.notes.append(
            "Latest start minus actual start, where it held and the run waited: median "
            f"{duration(percentile(slack, 0.5))}, p90 {duration(percentile(slack, 0.9))}."
        )
    seconds = replay.simulate_s
    section.notes.append(
        f"Both simulations at one submit: mean {ms(statistics.mean(seconds))}, max "
        f"{ms(max(seconds))} ({len(seconds):,} submit cycles)."
    )
    return section


def accuracy() -> list[Section]:
    start, size, every = (
        (QUICK_WINDOW_START, QUICK_WINDOW, QUICK_EVERY)
        if quick()
        else (WINDOW_START, WINDOW, EVERY)
    )
    tasks = load_tasks(compression=COMPRESSION)
    if quick():
        tasks = tasks[: start + 2 * size]  # arrivals go on for a while after the window
    window = tasks[start : start + size]
    pools = load_pools()
    replay = Estimating(
        tasks,
        nodes_of(*pools),
        estimated={t.id for t in window[::every]},
        history=History(requests()),
    )
    replay.run()
    done = outcomes(replay)
    intro = (
        f"`{TASKS_CSV}` replayed as in the trace replay ({len(tasks):,} tasks, "
        f"{sum(p.capacity for p in pools)} GPUs, arrivals {COMPRESSION}× faster); estimated "
        f"at submit: tasks {start + 1:,}–{start + size:,} by arrival"
        f"{f', one in {every}' if every > 1 else ''}. *Expected*: `jobs.estimates.simulate` "
        "with durations from the tenant's finished runs of the same request, else of the "
        "same size (as `jobs.selectors.estimates`), never after the latest start. "
        "Baselines: *queue position × mean* run time so far; *backfill*: the earliest time "
        "the run's nodes free up as held runs reach their maximum runtime, the queue "
        "ignored. Maximum runtime: the true run time × 1–4 (log-uniform, fixed seed), "
        "rounded up to the hour. Error: |estimate − actual start|; *waited*: did not start "
        "in its submit cycle. Definitions: the docstring of `bench/estimates.py`."
    )
    return [accuracy_section(done, intro), bound_section(done, replay)]


# --- (b) cost ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostInputs:
    """What the product would pass ``simulate`` for the snapshot, in both modes."""

    latest_ends: dict[int, float]
    max_runtimes: dict[int, float]  # queued runs only, as the product passes them
    expected_ends: dict[int, float]
    expected_runtimes: dict[int, float]


def cost_inputs(snapshot: Snapshot) -> CostInputs:
    """A maximum runtime for every run (a held run's one it has not yet exceeded), an
    expected duration of 5–100 % of it; held runs end as jobs.selectors.estimates has it."""
    rng = random.Random(SEED)
    now = snapshot.now
    inputs = CostInputs({}, {}, {}, {})
    for held in snapshot.held:
        ran_s = now - held.admitted
        hours = rng.choice([h for h in COST_MAX_RUNTIMES_H if h * 3600 > ran_s])
        latest_end = held.admitted + hours * 3600.0
        inputs.latest_ends[held.id] = latest_end
        inputs.expected_ends[held.id] = estimates.expected_end(
            started=held.admitted, now=now, expected_s=hours * 3600.0 * rng.uniform(0.05, 1.0),
            latest_end=latest_end,
        )  # fmt: skip
    for queued in snapshot.queued:
        seconds = rng.choice(COST_MAX_RUNTIMES_H) * 3600.0
        inputs.max_runtimes[queued.id] = seconds
        inputs.expected_runtimes[queued.id] = seconds * rng.uniform(0.05, 1.0)
    return inputs


def median_time(fn: Callable[[], T], *, repeat: int) -> tuple[float, T]:
    """The median wall time of ``repeat`` calls, and what the last one returned."""
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def cost() -> Section:
    queued, repeat = (QUICK_COST_QUEUED, QUICK_REPEAT) if quick() else (COST_QUEUED, REPEAT)
    snapshot = make_snapshot(queued=queued)
    inputs = cost_inputs(snapshot)
    section = Section(
        title="Start estimates: cost per cycle (issue 19, point 4)",
        intro=(
            f"The snapshot of the admission benchmark ({queued:,} queued runs, "
            f"{len(snapshot.nodes):,} nodes, {len(snapshot.held):,} held runs). *Cycle*: "
            "`decide(snapshot)`, the decision without estimates. *Latest* / *expected*: "
            "`jobs.estimates.simulate` as the product calls it, with maximum runtimes of "
            f"{', '.join(map(str, COST_MAX_RUNTIMES_H))} h (at random) / durations of 5–100 % "
            f"of them; {HORIZON_S / 86_400:.0f} days ahead, at most {MAX_STEPS} simulated "
            f"cycles. Median of {repeat}."
        ),
        columns=["", "wall time", "simulated cycles", "runs with a start", "no estimate: why"],
    )
    cycle_s, _ = median_time(lambda: decide(snapshot), repeat=repeat)
    section.rows.append(["cycle (`decide`)", ms(cycle_s), "1", "", ""])
    added = 0.0
    for label, ends, runtimes in (
        ("latest (`simulate`)", inputs.latest_ends, inputs.max_runtimes),
        ("expected (`simulate`)", inputs.expected_ends, inputs.expected_runtimes),
    ):
        seconds, forecast = median_time(partial(simulate, snapshot, ends, runtimes), repeat=repeat)
        added += seconds
        reasons = Counter(no_estimate_reason(forecast, run.id) for run in snapshot.queued)
        numbered = reasons.pop("", 0)
        section.rows.append(
            [
                label,
                ms(seconds),
                f"{len(forecast.steps):,}",
                f"{numbered:,}",
                "; ".join(f"{count:,}: {why}" for why, count in reasons.most_common()),
            ]
        )
    section.rows.append(["added by both", ms(added), "", "", ""])
    # The product does not refresh with every cycle: a task of its own, every
    # GANTRY_ESTIMATE_INTERVAL_S, and no sooner than GANTRY_ESTIMATE_COST_FACTOR times what the
    # last refresh took (jobs.services.estimates). Spread over the admission cycles run
    # between two refreshes, that is what it adds per cycle.
    every_s = max(settings.GANTRY_ESTIMATE_INTERVAL_S, settings.GANTRY_ESTIMATE_COST_FACTOR * added)
    per_cycle_s = added * settings.GANTRY_ADMISSION_INTERVAL_S / every_s
    met = per_cycle_s * 1000 <= BUDGET_MS
    section.notes.append(
        f"One refresh (both simulations) takes {ms(added)}, {added / cycle_s:,.1f}× the "
        f"cycle's decision: too much for every cycle. Refreshed by a task of its own, no "
        f"sooner than {settings.GANTRY_ESTIMATE_COST_FACTOR}× what the last one took (here "
        f"every {every_s:,.0f} s), it adds {ms(per_cycle_s)} per admission cycle "
        f"(every {settings.GANTRY_ADMISSION_INTERVAL_S} s) on average. Goal: at most "
        f"{BUDGET_MS:.0f} ms per cycle — {'met' if met else 'missed'}, on average; at this "
        "scale the estimates are that many seconds old at most."
    )
    return section


def run() -> list[Section]:
    from bench import estimates_refresh  # it reads this module's inputs

    return [*accuracy(), cost(), estimates_refresh.section()]
