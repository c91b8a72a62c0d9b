"""The straggler benchmark's pieces (bench/stragglers.py) on tiny inputs, without noise where
the values are exact."""

import random

from bench.stragglers import (
    GPUS_PER_NODE,
    QUIET,
    Band,
    Gang,
    Injection,
    Outcome,
    bands,
    cause_accuracy,
    naive_medians,
    placement_of,
    score,
    simulate,
)
from telemetry.stragglers import Cause, Detection, Straggler, detect


def quiet(ranks: int, injection: Injection | None = None, windows: int = 6) -> Gang:
    return simulate(random.Random(0), ranks, windows=windows, injection=injection, noise=QUIET)


def test_the_gang_moves_in_lockstep_and_the_others_wait_for_the_straggler():
    gang = quiet(16, Injection(Cause.SLOW_GPU, 2.0, rank=5, since=3))
    window_3 = {w.rank: w for w in gang.windows if w.seq == 3}
    assert {round(w.step_time_s, 9) for w in window_3.values()} == {0.68}  # 0.60 + 0.03 + 0.05
    assert round(window_3[5].comm_wait_s, 9) == 5.0  # the transfer only, x 100 steps
    assert round(window_3[0].comm_wait_s, 9) == 35.0  # 0.30 s more per step: waiting for 5
    assert len(gang.windows) == 16 * 6
    (capped,) = [e for e in gang.evidence if e.sm_clock_mhz != e.max_sm_clock_mhz]
    assert (capped.host, capped.gpu, capped.sm_clock_mhz) == ("node-0000", "5", 990.0)


def test_each_injected_cause_is_found_and_named():
    for cause in (Cause.SLOW_GPU, Cause.SLOW_INPUT, Cause.NETWORK):
        gang = quiet(32, Injection(cause, 1.5, rank=17, since=2))
        detection = detect(gang.windows, evidence=gang.evidence, placement=gang.placement)
        assert score(gang, detection) == Outcome(
            ranks=32,
            injection=gang.injection,
            found=True,
            false_flags=0,
            windows_to_detection=3,
            cause=cause,
        )


def test_a_network_straggler_node_sits_on_a_leaf_of_its_own():
    placement = placement_of(32, Injection(Cause.NETWORK, 1.5, rank=17, since=2))
    assert placement.paths == {
        "node-0000": ("block-0", "leaf-0"),
        "node-0001": ("block-0", "leaf-0"),
        "node-0002": ("block-0", "leaf-apart"),
        "node-0003": ("block-0", "leaf-0"),
    }
    # 40 nodes spread over three leaves of at most 16.
    assert sorted(set(placement_of(40 * GPUS_PER_NODE, None).paths.values())) == [
        ("block-0", f"leaf-{i}") for i in range(3)
    ]


def test_a_clean_quiet_gang_scores_no_flag():
    gang = quiet(8)
    assert score(gang, detect(gang.windows)) == Outcome(8, None, False, 0, None, None)


def straggler(rank: int, first_window: int, cause: Cause) -> Straggler:
    return Straggler(rank, "h", "0", first_window, 3, 1.5, cause, {}, 8)


def test_score_counts_false_flags_and_windows_to_detection():
    gang = quiet(8, Injection(Cause.SLOW_INPUT, 1.2, rank=2, since=4))
    detection = Detection(
        (straggler(2, 6, Cause.UNKNOWN), straggler(3, 1, Cause.SLOW_GPU)),
    )
    assert score(gang, detection) == Outcome(8, gang.injection, True, 1, 5, Cause.UNKNOWN)
    assert score(gang, Detection((straggler(3, 1, Cause.SLOW_GPU),))) == Outcome(
        8, gang.injection, False, 1, None, None
    )


def outcome(cause: Cause, factor: float, found: bool, named: Cause | None, **kw) -> Outcome:
    return Outcome(
        ranks=8,
        injection=Injection(cause, factor, 0, 2),
        found=found,
        false_flags=kw.get("false_flags", 0),
        windows_to_detection=kw.get("delay", 3 if found else None),
        cause=named,
    )


OUTCOMES = [
    outcome(Cause.SLOW_GPU, 1.1, False, None),
    outcome(Cause.SLOW_GPU, 1.2, True, Cause.SLOW_GPU, delay=4),
    outcome(Cause.SLOW_INPUT, 1.2, True, Cause.UNKNOWN, false_flags=1),
    outcome(Cause.NETWORK, 1.2, False, None),
    outcome(Cause.NETWORK, 2.0, True, Cause.NETWORK),
]


def test_bands_give_precision_recall_and_delays_per_slowdown():
    assert bands(OUTCOMES) == {
        1.1: Band(runs=1, found=0, false_flags=0, delays=[]),
        1.2: Band(runs=3, found=2, false_flags=1, delays=[4, 3]),
        2.0: Band(runs=1, found=1, false_flags=0, delays=[3]),
    }
    band = bands(OUTCOMES)[1.2]
    assert (band.precision, band.recall) == (2 / 3, 2 / 3)
    assert (Band().precision, Band().recall) == (1.0, 1.0)


def test_cause_accuracy_counts_found_runs_at_1_2x_or_more():
    assert cause_accuracy(OUTCOMES) == {
        Cause.SLOW_GPU: (1, 1),
        Cause.SLOW_INPUT: (0, 1),
        Cause.NETWORK: (1, 1),
    }


def test_the_naive_baseline_finds_each_windows_median():
    gang = quiet(3, Injection(Cause.SLOW_GPU, 2.0, rank=1, since=2), windows=2)
    assert {seq: round(m, 9) for seq, m in naive_medians(gang.windows).items()} == {
        1: 0.33,
        2: 0.33,
    }
