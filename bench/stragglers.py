"""Straggler detection measured (issue 36, point 6): simulated synchronous data-parallel gangs
of 8 to 1,024 ranks, with one straggler injected at 1.1× to 2× (a slow GPU, slow input on its
node, or its node's network path) and 100 clean runs, through ``telemetry.stragglers.detect``;
then the detection's time at 10,000 ranks × 10 windows beside a naive per-window sort.

The gang model (``simulate``), per rank and window, per step:

- compute: 0.30 s × a persistent per-rank offset (1 + N(0, 1 %): GPUs of one model differ) ×
  window jitter (1 + N(0, 2 %)); in 0.5 % of rank-windows a transient stall × U(1.2, 1.6)
  (garbage collection, a checkpoint's I/O: one window, not a straggler);
- data wait: 0.03 s × U(0.8, 1.2) (a window's mean over ~100 steps);
- lockstep: every rank's step is the slowest rank's compute + data wait plus a 0.05 s
  transfer; each rank's communication wait is the rest (the others wait for the slowest);
- 80–120 steps per window per rank, each host's clock off by U(−60, 60) s, 1 % of windows
  sent twice and every run's windows shuffled (the SDK's resends, out-of-order arrival);
- 8 GPUs per node, leaves of 16 nodes (a larger gang spreads evenly over leaves); DCGM
  evidence for every GPU: SM clock at its maximum, nothing else.

Injected from window U{2..8} to the end (20 windows), on a random rank:

- *slow GPU*: its compute × f; its GPU's evidence shows the SM clock at max ÷ f (a clock cap,
  issue 36 point 5), and in every other run also the thermal throttle reason;
- *slow input*: its data wait + (f − 1) × the gang's time to the collective;
- *network*: its node moved to a leaf of its own, its time to the collective + (f − 1) × the
  gang's outside its compute and data wait (host-side communication work the SDK does not time
  as a wait); GPU evidence clean. Only on gangs of 3 nodes or more: inside one node there is
  no network between ranks, and of two nodes on two leaves neither is the one apart.

The injected signals are what the method reads, so cause accuracy here checks the decision
rules and their margins under noise, not the physics; docs/stragglers.md says what a real
cluster adds.
"""

import math
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.report import Section, best_of, ms, quick, ratio
from telemetry.stragglers import (
    CONSECUTIVE,
    Cause,
    Detection,
    GpuEvidence,
    Placement,
    RankWindow,
    detect,
)

SEED = 36
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
QUICK_SIZES = (8, 16, 32)
FACTORS = (1.1, 1.2, 1.3, 1.5, 2.0)
CAUSES = (Cause.SLOW_GPU, Cause.SLOW_INPUT, Cause.NETWORK)
SEEDS_PER_CASE = 2  # runs per (cause, factor, size)
CLEAN_RUNS = 100
QUICK_CLEAN_RUNS = 10
WINDOWS = 20
SPEED_RANKS, SPEED_WINDOWS = 10_000, 10
QUICK_SPEED_RANKS = 1_000
REPEAT = 3

GPUS_PER_NODE = 8
NODES_PER_LEAF = 16
COMPUTE_S, DATA_S, TRANSFER_S = 0.30, 0.03, 0.05
MAX_CLOCK_MHZ = 1980.0
GOAL_FACTOR = 1.2
GOAL_SHARE = 0.95
GOAL_WINDOWS = 10


@dataclass(frozen=True, slots=True)
class Noise:
    offset: float = 0.01  # sigma of a rank's persistent compute offset
    jitter: float = 0.02  # sigma of a window's compute jitter
    data_spread: float = 0.2  # data wait times U(1 - this, 1 + this)
    stall_rate: float = 0.005  # transient stalls per rank-window
    steps: tuple[int, int] = (80, 120)
    skew_s: float = 60.0
    resend_rate: float = 0.01


QUIET = Noise(0.0, 0.0, 0.0, 0.0, (100, 100), 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Injection:
    cause: Cause
    factor: float
    rank: int
    since: int


@dataclass
class Gang:
    windows: list[RankWindow]
    evidence: list[GpuEvidence]
    placement: Placement
    injection: Injection | None = None


def host(rank: int) -> str:
    return f"node-{rank // GPUS_PER_NODE:04d}"


def placement_of(ranks: int, injection: Injection | None) -> Placement:
    nodes = [host(r) for r in range(0, ranks, GPUS_PER_NODE)]
    leaves = math.ceil(len(nodes) / NODES_PER_LEAF)
    paths = {node: ("block-0", f"leaf-{i % leaves}") for i, node in enumerate(nodes)}
    if injection is not None and injection.cause == Cause.NETWORK:
        paths[host(injection.rank)] = ("block-0", "leaf-apart")
    return Placement(paths)


def evidence_of(ranks: int, injection: Injection | None, *, thermal: bool) -> list[GpuEvidence]:
    rows = {
        (host(r), str(r % GPUS_PER_NODE)): GpuEvidence(
            host(r), str(r % GPUS_PER_NODE), MAX_CLOCK_MHZ, MAX_CLOCK_MHZ
        )
        for r in range(ranks)
    }
    if injection is not None and injection.cause == Cause.SLOW_GPU:
        key = (host(injection.rank), str(injection.rank % GPUS_PER_NODE))
        rows[key] = GpuEvidence(
            *key,
            sm_clock_mhz=MAX_CLOCK_MHZ / injection.factor,
            max_sm_clock_mhz=MAX_CLOCK_MHZ,
            throttle_reasons=frozenset({"thermal_throttle"}) if thermal else frozenset(),
        )
    return list(rows.values())


def _shape(
    rng: random.Random, ranks: int, noise: Noise, injection: Injection | None, seq: int
) -> list[tuple[float, float, float]]:
    """Per rank: compute, data wait and untimed communication work per step in window seq."""
    out = []
    for _ in range(ranks):
        compute = COMPUTE_S * (1 + rng.gauss(0, noise.jitter))
        if noise.stall_rate and rng.random() < noise.stall_rate:
            compute *= rng.uniform(1.2, 1.6)
        data = DATA_S * (1 + rng.uniform(-noise.data_spread, noise.data_spread))
        out.append((compute, data, 0.0))
    if injection is not None and seq >= injection.since:
        compute, data, extra = out[injection.rank]
        excess = (injection.factor - 1) * (COMPUTE_S + DATA_S)
        if injection.cause == Cause.SLOW_GPU:
            compute *= injection.factor
        elif injection.cause == Cause.SLOW_INPUT:
            data += excess
        else:
            extra += excess
        out[injection.rank] = (compute, data, extra)
    return out


def simulate(
    rng: random.Random,
    ranks: int,
    *,
    windows: int = WINDOWS,
    injection: Injection | None = None,
    noise: Noise = Noise(),
    thermal: bool = False,
) -> Gang:
    offsets = [1 + rng.gauss(0, noise.offset) for _ in range(ranks)]
    skews = {host(r): rng.uniform(-noise.skew_s, noise.skew_s) for r in range(ranks)}
    out: list[RankWindow] = []
    for seq in range(1, windows + 1):
        shape = _shape(rng, ranks, noise, injection, seq)
        reach = [c * offsets[r] + d + x for r, (c, d, x) in enumerate(shape)]
        step = max(reach) + TRANSFER_S
        for rank, (_compute, data, _extra) in enumerate(shape):
            steps = rng.randint(*noise.steps)
            start = 1_700_000_000.0 + seq * 30.0 + skews[host(rank)]
            window = RankWindow(
                rank, ranks, host(rank), str(rank % GPUS_PER_NODE), seq, start, start + 30.0,
                steps, step, data * steps, (step - reach[rank]) * steps,
            )  # fmt: skip
            out.append(window)
            if noise.resend_rate and rng.random() < noise.resend_rate:
                out.append(window)
    if noise.resend_rate:
        rng.shuffle(out)
    return Gang(
        out, evidence_of(ranks, injection, thermal=thermal), placement_of(ranks, injection),
        injection,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    ranks: int
    injection: Injection | None
    found: bool  # the injected rank was flagged
    false_flags: int  # other ranks flagged
    windows_to_detection: int | None  # from the first slow window to the flag, inclusive
    cause: Cause | None  # named for the injected rank


def score(gang: Gang, detection: Detection) -> Outcome:
    injection = gang.injection
    victim = injection.rank if injection is not None else -1
    flagged = {s.rank: s for s in detection.stragglers}
    hit = flagged.get(victim)
    to_detection = None
    if hit is not None and injection is not None:
        to_detection = hit.first_window + CONSECUTIVE - injection.since
    return Outcome(
        ranks=len(gang.placement.paths) * GPUS_PER_NODE,
        injection=injection,
        found=hit is not None,
        false_flags=len(flagged) - (hit is not None),
        windows_to_detection=to_detection,
        cause=hit.cause if hit is not None else None,
    )


def run_case(rng: random.Random, ranks: int, injection: Injection | None, thermal: bool) -> Outcome:
    gang = simulate(rng, ranks, injection=injection, thermal=thermal)
    return score(gang, detect(gang.windows, evidence=gang.evidence, placement=gang.placement))


def injected_runs(sizes: Sequence[int], seeds: int) -> list[Outcome]:
    rng = random.Random(SEED)
    outcomes = []
    for cause in CAUSES:
        for factor in FACTORS:
            for ranks in sizes:
                if cause == Cause.NETWORK and ranks < 3 * GPUS_PER_NODE:
                    continue
                for i in range(seeds):
                    injection = Injection(cause, factor, rng.randrange(ranks), rng.randint(2, 8))
                    outcomes.append(run_case(rng, ranks, injection, thermal=i % 2 == 1))
    return outcomes


def clean_runs(sizes: Sequence[int], runs: int) -> list[Outcome]:
    rng = random.Random(SEED + 1)
    return [run_case(rng, sizes[i % len(sizes)], None, thermal=False) for i in range(runs)]


@dataclass
class Band:
    runs: int = 0
    found: int = 0
    false_flags: int = 0
    delays: list[int] = field(default_factory=list)

    @property
    def precision(self) -> float:
        flagged = self.found + self.false_flags
        return self.found / flagged if flagged else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.runs if self.runs else 1.0


def bands(outcomes: Sequence[Outcome]) -> dict[float, Band]:
    by_factor: dict[float, Band] = defaultdict(Band)
    for o in outcomes:
        assert o.injection is not None
        band = by_factor[o.injection.factor]
        band.runs += 1
        band.found += o.found
        band.false_flags += o.false_flags
        if o.windows_to_detection is not None:
            band.delays.append(o.windows_to_detection)
    return dict(sorted(by_factor.items()))


def cause_accuracy(outcomes: Sequence[Outcome]) -> dict[Cause, tuple[int, int]]:
    """Per injected cause, at ≥ 1.2×: (found with the right cause, found)."""
    tally: dict[Cause, tuple[int, int]] = {}
    for cause in CAUSES:
        found = [
            o
            for o in outcomes
            if o.injection and o.injection.cause == cause and o.injection.factor >= GOAL_FACTOR
            if o.found
        ]
        tally[cause] = (sum(o.cause == cause for o in found), len(found))
    return tally


def naive_medians(windows: Sequence[RankWindow]) -> dict[int, float]:
    """The baseline: each window's median time to the collective by one sort per window."""
    by_seq: dict[int, list[float]] = defaultdict(list)
    for w in windows:
        by_seq[w.seq].append(w.step_time_s - w.comm_wait_s / w.steps)
    return {seq: sorted(values)[len(values) // 2] for seq, values in by_seq.items()}


def percent(share: float) -> str:
    return f"{share * 100:.1f} %"


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def detection_section(sizes: Sequence[int], seeds: int, clean: int) -> Section:
    started = time.perf_counter()
    injected = injected_runs(sizes, seeds)
    clean_outcomes = clean_runs(sizes, clean)
    wall = time.perf_counter() - started
    section = Section(
        title="Stragglers: detection (issue 36, point 6)",
        intro=(
            f"`telemetry.stragglers.detect` on simulated lockstep data-parallel gangs of "
            f"{', '.join(map(str, sizes))} ranks, {WINDOWS} windows each: one straggler per run "
            f"(slow GPU, slow input, network) at {', '.join(f'{f}×' for f in FACTORS)} from a "
            f"random window 2–8, {seeds} runs per cause, factor and size ({len(injected)} runs), "
            f"and {len(clean_outcomes)} clean runs; noise, resends, shuffling, clock skew and "
            "step counts as in `bench/stragglers.py`'s docstring (seed 36). *Windows to "
            "detection*: from the first slow window to the one that completes the flag, "
            "inclusive."
        ),
        columns=[
            "slowdown", "runs", "flagged (right rank)", "false flags", "precision", "recall",
            "windows to detection: median / max",
        ],
    )  # fmt: skip
    by_factor = bands(injected)
    for factor, band in by_factor.items():
        delays = f"{statistics.median(band.delays):g} / {max(band.delays)}" if band.delays else "—"
        section.rows.append(
            [
                f"{factor}×", str(band.runs), str(band.found), str(band.false_flags),
                percent(band.precision), percent(band.recall), delays,
            ]
        )  # fmt: skip
    goal = [b for f, b in by_factor.items() if f >= GOAL_FACTOR]
    found = sum(b.found for b in goal)
    flagged = found + sum(b.false_flags for b in goal)
    runs = sum(b.runs for b in goal)
    latest = max((d for b in goal for d in b.delays), default=0)
    false_clean = sum(o.false_flags for o in clean_outcomes)
    accuracy = cause_accuracy(injected)
    section.notes += [
        f"Goal: precision ≥ 95 % at ≥ {GOAL_FACTOR}×: {percent(found / flagged)} — "
        f"{met(found / flagged >= GOAL_SHARE)}.",
        f"Goal: recall ≥ 95 % at ≥ {GOAL_FACTOR}×: {percent(found / runs)} — "
        f"{met(found / runs >= GOAL_SHARE)}.",
        f"Goal: 0 false flags on {len(clean_outcomes)} clean runs: {false_clean} — "
        f"{met(false_clean == 0)}.",
        f"Goal: detection within {GOAL_WINDOWS} windows at ≥ {GOAL_FACTOR}×: at most {latest} — "
        f"{met(latest <= GOAL_WINDOWS)}.",
        *(
            f"Goal: cause accuracy ≥ 95 % for {cause.value} at ≥ {GOAL_FACTOR}×: "
            f"{right} of {total}, {percent(right / total if total else 0)} — "
            f"{met(total > 0 and right / total >= GOAL_SHARE)}."
            for cause, (right, total) in accuracy.items()
        ),
        f"Simulation and detection of all {len(injected) + len(clean_outcomes)} runs: "
        f"{wall:,.1f} s.",
    ]
    return section


def speed_section(ranks: int) -> Section:
    rng = random.Random(SEED + 2)
    gang = simulate(
        rng, ranks, windows=SPEED_WINDOWS, injection=Injection(Cause.SLOW_GPU, 1.5, 7, 2)
    )
    detection = detect(gang.windows, evidence=gang.evidence, placement=gang.placement)
    seconds = best_of(
        lambda: detect(gang.windows, evidence=gang.evidence, placement=gang.placement),
        repeat=REPEAT,
    )
    baseline = best_of(lambda: naive_medians(gang.windows), repeat=REPEAT)
    n = len(gang.windows)
    return Section(
        title=f"Stragglers: detection at {ranks:,} ranks × {SPEED_WINDOWS} windows (pure)",
        intro=(
            f"One simulated run ({n:,} windows with resends, shuffled; one slow GPU at 1.5×), "
            f"best of {REPEAT}. Baseline: a naive per-window median (group the windows by "
            "number, sort each window's times to the collective): the least any per-window "
            "median method does. `detect` is O(n log r) for n windows of r ranks."
        ),
        columns=["method", "time", "per window", "÷ baseline", "stragglers"],
        rows=[
            [
                "`detect`", ms(seconds), f"{seconds / n * 1e6:.2f} µs", ratio(seconds, baseline),
                ", ".join(f"rank {s.rank} ({s.cause.value})" for s in detection.stragglers),
            ],
            ["naive per-window sort", ms(baseline), f"{baseline / n * 1e6:.2f} µs", "1.0×", "—"],
        ],
    )  # fmt: skip


def run() -> list[Section]:
    if quick():
        return [
            detection_section(QUICK_SIZES, 1, QUICK_CLEAN_RUNS),
            speed_section(QUICK_SPEED_RANKS),
        ]
    return [detection_section(SIZES, SEEDS_PER_CASE, CLEAN_RUNS), speed_section(SPEED_RANKS)]
