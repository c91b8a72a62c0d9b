"""Verdict accuracy per injected cause (issue 36, point 6): simulated data-parallel gangs with
one cause injected — slow input on one node, a rank behind a slow network path, a slow GPU,
a placement spread over two leaf switches, NCCL differing between ranks — and clean gangs,
through the whole tree: the rank windows to ``telemetry.stragglers.detect``, its stragglers
with the gang's placement, versions and wait shares to ``telemetry.verdicts.tree``.

The gangs come from ``bench.stragglers.simulate`` (its docstring has the noise model).
Causes that are no straggler:

- *placement*: the gang's nodes alternate between two leaves (one leaf without the spread),
  and every all-reduce's transfer takes ``factor`` times as long (it crosses the spine);
- *NCCL mismatch*: one random rank reports another NCCL version than the rest.

A run's verdicts are *right* when the expected one is there (a slow rank with the injected
rank and cause; a spread placement; an NCCL mismatch) and nothing is claimed that was not
injected (a slow rank elsewhere or with another cause, a spread on a one-leaf gang, a
mismatch with one version). Clean runs are right with none of these.

Baseline, measured in the same run: the diagnosis Gantry gave before every rank reported
(``telemetry.diagnosis.diagnose`` on rank 0's waits alone). It is right for slow input
when it says input-bound, for a spread placement when it says communication-bound; it has
no verdict for a slow GPU, a network straggler (rank 0 waits on communication whatever slows
the straggler) or a version mismatch.
"""

import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from bench import stragglers as sim
from bench.report import Section, quick
from telemetry.accounting import Accounting
from telemetry.diagnosis import Code, Signals, diagnose
from telemetry.stragglers import Cause, Placement, RankWindow, detect
from telemetry.verdicts import Facts, SlowRank, Spread, Versions, tree

SEED = 3636
SIZES = (16, 32, 64, 128)
QUICK_SIZES = (16, 32)
FACTORS = (1.2, 1.3, 1.5, 2.0)
RUNS_PER_CASE = 3
QUICK_RUNS_PER_CASE = 1
CLEAN_RUNS = 40
QUICK_CLEAN_RUNS = 8
GOAL = 0.95
NCCL, OTHER_NCCL = "2.21.5", "2.18.3"

PLACEMENT = "placement"
NCCL_MISMATCH = "nccl_mismatch"
CAUSES = (
    Cause.SLOW_INPUT.value,
    Cause.NETWORK.value,
    Cause.SLOW_GPU.value,
    PLACEMENT,
    NCCL_MISMATCH,
)
# What the baseline must say to be right. A straggler of any cause makes rank 0 wait on
# communication, so "communication-bound" names no network straggler: only a spread.
BASELINE_CODE = {Cause.SLOW_INPUT.value: Code.INPUT_BOUND, PLACEMENT: Code.COMM_BOUND}


@dataclass(frozen=True, slots=True)
class Case:
    cause: str  # one of CAUSES, or "" for a clean gang
    factor: float
    ranks: int
    rank: int  # the injected rank (a straggler, or the odd NCCL)


def _spread_over_two_leaves(placement: Placement) -> Placement:
    nodes = sorted(placement.paths)
    return Placement({node: ("block-0", f"leaf-{i % 2}") for i, node in enumerate(nodes)})


def _slower_transfers(windows: list[RankWindow], factor: float) -> list[RankWindow]:
    """Every rank's step longer by (factor − 1) transfers, spent waiting on communication."""
    extra = (factor - 1) * sim.TRANSFER_S
    return [
        replace(w, step_time_s=w.step_time_s + extra, comm_wait_s=w.comm_wait_s + extra * w.steps)
        for w in windows
    ]


def _shares(windows: Sequence[RankWindow]) -> tuple[float, float]:
    """The data and communication wait shares of step time, over all ranks' windows."""
    step = sum(w.steps * w.step_time_s for w in windows)
    return sum(w.data_wait_s for w in windows) / step, sum(w.comm_wait_s for w in windows) / step


def _accounting(data: float, comm: float) -> Accounting:
    allocated = Fraction(36_000)
    waits = {"input_wait": allocated * Fraction(data), "comm_wait": allocated * Fraction(comm)}
    zero = Fraction(0)
    return Accounting(
        allocated=allocated, lost=zero, startup=zero, checkpoint=zero, interactive_idle=zero,
        idle=zero,
        effective=allocated - sum(waits.values()), active_gpu_hours=8.0, queue_s=None, **waits,
    )  # fmt: skip


def _signals(data: float, comm: float) -> Signals:
    return Signals(
        mean_activity=0.8, mean_tensor_activity=0.5, data_wait_share=data, comm_wait_share=comm
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    case: Case
    right: bool
    baseline_right: bool


def run_case(rng: random.Random, case: Case) -> Outcome:
    injection = None
    if case.cause in (Cause.SLOW_INPUT, Cause.NETWORK, Cause.SLOW_GPU):
        injection = sim.Injection(Cause(case.cause), case.factor, case.rank, rng.randint(2, 8))
    gang = sim.simulate(rng, case.ranks, injection=injection, thermal=rng.random() < 0.5)
    windows, placement = gang.windows, gang.placement
    if case.cause == PLACEMENT:
        windows = _slower_transfers(windows, case.factor)
        placement = _spread_over_two_leaves(placement)
    nccl = {NCCL: case.ranks}
    if case.cause == NCCL_MISMATCH:
        nccl = {NCCL: case.ranks - 1, OTHER_NCCL: 1}
    detection = detect(windows, evidence=gang.evidence, placement=placement)
    data, comm = _shares(windows)
    leaves = len({path[1] for path in placement.paths.values()})
    facts = Facts(
        signals=_signals(data, comm),
        gpus=case.ranks,
        nodes=len(placement.paths),
        mean_dram_activity=0.2,
        ranks_reporting=case.ranks,
        slow_ranks=tuple(
            SlowRank(s.rank, s.host, s.gpu, s.cause.value, s.slowdown, s.windows, s.evidence)
            for s in detection.stragglers
        ),
        spread=Spread(len(placement.paths), (("block", 1), ("leaf", leaves))),
        versions=Versions(driver="550.54.15", image_cuda="12.4", image_nccl=NCCL, nccl_ranks=nccl),
    )
    found = tree(None, facts).findings
    slow = {(f.numbers["rank"], f.numbers["cause"]) for f in found if f.code == Code.SLOW_RANK}
    spread = any(f.code == Code.PLACEMENT_SPREAD for f in found)
    mismatch = any(f.code == Code.NCCL_MISMATCH for f in found)
    expected_slow = {(case.rank, case.cause)} if injection is not None else set()
    spread_expected = leaves > 1  # a network straggler's node sits in a leaf of its own
    right = (
        slow == expected_slow
        and spread == (spread_expected and comm >= 0.1)
        and mismatch == (case.cause == NCCL_MISMATCH)
        and (case.cause != PLACEMENT or spread)
    )
    rank0_data, rank0_comm = _shares([w for w in windows if w.rank == 0])
    baseline = {
        f.code
        for f in diagnose(_accounting(rank0_data, rank0_comm), _signals(rank0_data, rank0_comm))
    }
    wanted = BASELINE_CODE.get(case.cause)
    baseline_right = (wanted in baseline) if case.cause else not baseline
    return Outcome(case, right, baseline_right)


def cases(rng: random.Random, sizes: Sequence[int], runs: int, clean: int) -> list[Case]:
    out = [
        Case(cause, factor, ranks, rng.randrange(ranks))
        for cause in CAUSES
        for factor in FACTORS
        for ranks in sizes
        if not (cause == Cause.NETWORK and ranks < 3 * sim.GPUS_PER_NODE)
        for _ in range(runs)
    ]
    out += [Case("", 1.0, sizes[i % len(sizes)], -1) for i in range(clean)]
    return out


def section(sizes: Sequence[int], runs: int, clean: int) -> Section:
    rng = random.Random(SEED)
    started = time.perf_counter()
    outcomes = [run_case(rng, case) for case in cases(rng, sizes, runs, clean)]
    wall = time.perf_counter() - started
    tally: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        tally[outcome.case.cause or "clean"].append(outcome)
    result = Section(
        title="Verdicts: accuracy per injected cause (issue 36, point 6)",
        intro=(
            f"`telemetry.verdicts.tree` after `telemetry.stragglers.detect` on simulated "
            f"data-parallel gangs of {', '.join(map(str, sizes))} ranks (20 windows each, the "
            f"noise of `bench/stragglers.py`), one cause injected per run at "
            f"{', '.join(f'{f}×' for f in FACTORS)} ({runs} runs per cause, factor and size), "
            f"and {clean} clean runs; seed {SEED}. *Right*: the expected verdict is given and "
            "nothing that was not injected is claimed (`bench/verdicts.py`'s docstring). "
            "Baseline: the diagnosis from rank 0's waits alone, what Gantry gave before every "
            "rank reported."
        ),
        columns=[
            "injected cause", "runs", "right", "accuracy", "baseline right", "baseline accuracy",
        ],
    )  # fmt: skip
    notes = []
    for cause in (*CAUSES, "clean"):
        group = tally[cause]
        right = sum(o.right for o in group)
        base = sum(o.baseline_right for o in group)
        share = right / len(group)
        result.rows.append(
            [
                cause.replace("_", " "), str(len(group)), str(right), f"{share * 100:.1f} %",
                str(base), f"{base / len(group) * 100:.1f} %",
            ]
        )  # fmt: skip
        notes.append(f"{cause}: {share * 100:.1f} % — {'met' if share >= GOAL else 'missed'}")
    result.notes += [
        f"Goal: accuracy ≥ {GOAL * 100:.0f} % for each cause. " + "; ".join(notes) + ".",
        f"Simulation, detection and verdicts of all {len(outcomes)} runs: {wall:,.1f} s.",
    ]
    return result


def run() -> list[Section]:
    if quick():
        return [section(QUICK_SIZES, QUICK_RUNS_PER_CASE, QUICK_CLEAN_RUNS)]
    return [section(SIZES, RUNS_PER_CASE, CLEAN_RUNS)]
