"""Straggler detection (telemetry/stragglers.py) on gangs built by hand: exact values, and the
issue's bad input, each case with its numbers."""

import dataclasses
import math

import pytest

from telemetry.stragglers import (
    Cause,
    Detection,
    GpuEvidence,
    Placement,
    RankWindow,
    Refusal,
    detect,
)
from tests.telemetry.stragglers_support import (
    COMPUTE_S,
    DATA_S,
    gang,
    slowed,
    uniform,
)

# Rank 3 (node-0, GPU 3) computes 1.5x slower from window 2 of 6: its time to the
# all-reduce is 0.45 + 0.02 = 0.47 s per step against the gang's 0.32 s.
SLOW_GPU = gang(8, 6, slowed(3, 1.5, since=2))
CLEAN = [GpuEvidence(f"node-{n}", str(g), 1980.0, 1980.0) for n in (0, 1) for g in range(4)]
CAPPED = [
    e if (e.host, e.gpu) != ("node-0", "3") else dataclasses.replace(e, sm_clock_mhz=1320.0)
    for e in CLEAN
]
TIMES = {
    "reach_s": 0.47,
    "compute_s": 0.45,
    "gang_compute_s": 0.3,
    "data_wait_s": 0.02,
    "gang_data_wait_s": 0.02,
    "comm_wait_s": 0.05,
    "gang_comm_wait_s": 0.2,
}


def only(detection: Detection):
    (straggler,) = detection.stragglers
    return straggler


def test_a_slow_gpu_is_flagged_with_its_node_gpu_and_slowdown():
    straggler = only(detect(SLOW_GPU, evidence=CAPPED))
    assert (straggler.rank, straggler.host, straggler.gpu, straggler.world_size) == (
        3,
        "node-0",
        "3",
        8,
    )
    assert (straggler.first_window, straggler.windows) == (2, 5)
    assert straggler.slowdown == 1.4688  # 0.47 / 0.32
    assert straggler.cause == Cause.SLOW_GPU
    assert straggler.evidence == {
        "data_wait_share_of_excess": 0.0,
        "sm_clock_share": 0.6667,
        "throttle_reasons": [],
        "pcie_replays": 0,
        "xids": [],
        "gpu_signs": ["SM clock at 67% of its maximum"],
        **TIMES,
    }


def test_the_others_wait_for_the_straggler_it_waits_least():
    straggler = only(detect(SLOW_GPU))
    assert straggler.evidence["comm_wait_s"] == 0.05
    assert straggler.evidence["gang_comm_wait_s"] == 0.2


@pytest.mark.parametrize(
    ("change", "signs"),
    [
        ({"throttle_reasons": frozenset({"thermal_throttle", "unheard_of"})}, ["thermal throttle"]),
        ({"throttle_reasons": frozenset({"power_throttle"})}, ["power throttle"]),
        ({"pcie_replays": 12}, ["12 PCIe replays"]),
        ({"xid": 79}, ["XID 79"]),
    ],
)
def test_each_gpu_sign_names_a_slow_gpu(change, signs):
    evidence = [
        dataclasses.replace(e, **change) if (e.host, e.gpu) == ("node-0", "3") else e for e in CLEAN
    ]
    straggler = only(detect(SLOW_GPU, evidence=evidence))
    assert straggler.cause == Cause.SLOW_GPU
    assert straggler.evidence["gpu_signs"] == signs


def test_a_clock_at_91_percent_is_no_sign_of_a_slow_gpu():
    evidence = [dataclasses.replace(e, sm_clock_mhz=1801.8) for e in CLEAN]
    straggler = only(detect(SLOW_GPU, evidence=evidence, placement=None))
    assert straggler.cause == Cause.UNKNOWN
    assert straggler.evidence["sm_clock_share"] == 0.91
    assert straggler.evidence["missing"] == "the gang's placement"


def test_several_rows_of_one_gpu_are_combined():
    rows = [*CLEAN, GpuEvidence("node-0", "3", 1500.0, 2000.0, pcie_replays=2)]
    rows.append(GpuEvidence("node-0", "3", xid=13, pcie_replays=1))
    straggler = only(detect(SLOW_GPU, evidence=rows))
    assert straggler.evidence["gpu_signs"] == [
        "SM clock at 75% of its maximum",
        "3 PCIe replays",
        "XID 13",
    ]


def test_slow_input_is_named_from_its_data_wait():
    straggler = only(detect(gang(8, 6, slowed(5, 1.5, since=2, on="data")), evidence=CLEAN))
    assert (straggler.rank, straggler.host, straggler.gpu) == (5, "node-1", "1")
    assert straggler.slowdown == 1.5
    assert straggler.cause == Cause.SLOW_INPUT
    assert straggler.evidence == {
        "data_wait_share_of_excess": 1.0,
        "reach_s": 0.48,
        "compute_s": 0.3,
        "gang_compute_s": 0.3,
        "data_wait_s": 0.18,
        "gang_data_wait_s": 0.02,
        "comm_wait_s": 0.05,
        "gang_comm_wait_s": 0.21,
    }


# Three nodes on leaf a, node-1 alone on leaf b.
APART = Placement(
    {
        "node-0": ("block", "a"),
        "node-1": ("block", "b"),
        "node-2": ("block", "a"),
        "node-3": ("block", "a"),
    }
)


def test_a_healthy_gpu_on_a_node_apart_from_the_gang_is_the_network():
    windows = gang(16, 6, slowed(5, 1.3, since=1))
    evidence = [
        GpuEvidence(f"node-{n}", str(g), 1980.0, 1980.0) for n in range(4) for g in range(4)
    ]
    straggler = only(detect(windows, evidence=evidence, placement=APART))
    assert straggler.cause == Cause.NETWORK
    assert straggler.evidence["placement_domains"] == 2
    assert straggler.evidence["node_apart"] is True
    assert straggler.slowdown == 1.2813  # (0.39 + 0.02) / 0.32


def test_a_healthy_gpu_on_the_gangs_leaf_is_unknown():
    windows = gang(16, 6, slowed(1, 1.3, since=1))
    evidence = [
        GpuEvidence(f"node-{n}", str(g), 1980.0, 1980.0) for n in range(4) for g in range(4)
    ]
    straggler = only(detect(windows, evidence=evidence, placement=APART))
    assert straggler.cause == Cause.UNKNOWN
    assert straggler.evidence["node_apart"] is False
    assert "missing" not in straggler.evidence


@pytest.mark.parametrize(
    ("evidence", "placement", "missing"),
    [
        ((), APART, "DCGM evidence for GPU 3 on node-0"),
        ([GpuEvidence("node-0", "3")], APART, "the GPU's SM clock"),
        (CLEAN, None, "the gang's placement"),
        (CLEAN, Placement({"node-1": ("a",)}), "the topology path of node-0"),
    ],
)
def test_missing_evidence_leaves_the_cause_unknown_and_says_which(evidence, placement, missing):
    straggler = only(detect(SLOW_GPU, evidence=evidence, placement=placement))
    assert straggler.cause == Cause.UNKNOWN
    assert straggler.evidence["missing"] == missing
    assert straggler.slowdown == 1.4688


def test_two_slow_windows_are_not_a_straggler_three_are():
    assert detect(gang(8, 6, slowed(3, 2.0, since=5))).stragglers == ()
    assert only(detect(gang(8, 7, slowed(3, 2.0, since=5)))).first_window == 5


def test_a_margin_under_the_relative_floor_is_not_flagged():
    # 1.095x time to the collective: within the 10 % floor over an identical gang.
    assert detect(gang(8, 6, slowed(3, 1.1, since=1))).stragglers == ()
    assert only(detect(gang(8, 6, slowed(3, 1.11, since=1)), floor=0.05)).slowdown == 1.1031


def test_a_missing_window_breaks_the_run():
    windows = [w for w in gang(8, 5, slowed(3, 2.0, since=1)) if (w.rank, w.seq) != (3, 3)]
    assert detect(windows).stragglers == ()
    windows = [w for w in gang(8, 7, slowed(3, 2.0, since=1)) if (w.rank, w.seq) != (3, 3)]
    assert only(detect(windows)).first_window == 4


def test_different_step_counts_are_normalised_per_step():
    windows = gang(8, 6, slowed(3, 1.5, since=2), steps=lambda rank, seq: 50 + 7 * rank + seq)
    assert detect(windows, evidence=CAPPED) == detect(SLOW_GPU, evidence=CAPPED)


def test_skewed_clocks_change_nothing():
    skewed = gang(8, 6, slowed(3, 1.5, since=2), skew=lambda host: 3600.0 * (host == "node-1"))
    assert detect(skewed, evidence=CAPPED) == detect(SLOW_GPU, evidence=CAPPED)


def test_windows_out_of_order_or_twice_change_nothing_but_the_count():
    again = [*reversed(SLOW_GPU), *SLOW_GPU[:5]]
    detection = detect(again, evidence=CAPPED)
    assert detection.duplicates == 5
    assert dataclasses.replace(detection, duplicates=0) == detect(SLOW_GPU, evidence=CAPPED)


def test_a_rank_and_window_reported_with_different_values_is_dropped():
    other = dataclasses.replace(SLOW_GPU[0], comm_wait_s=1.0)
    detection = detect([*SLOW_GPU, other, SLOW_GPU[0]], evidence=CAPPED)
    assert (detection.duplicates, detection.conflicts) == (0, 1)
    # Rank 0's first window is gone; rank 3 is still the straggler.
    assert only(detection).rank == 3


def test_a_missing_rank_is_said_and_the_others_are_analysed():
    windows = [w for w in SLOW_GPU if w.rank != 7]
    detection = detect(windows)
    assert only(detection).rank == 3
    assert detection.notes == ("world size 8: ranks that never reported: 1",)


def test_a_window_fewer_than_half_the_gang_reported_is_not_analysed():
    windows = [w for w in gang(8, 5, slowed(3, 2.0, since=1)) if w.seq != 3 or w.rank < 3]
    detection = detect(windows)
    assert detection.stragglers == ()
    assert detection.notes == (
        "world size 8: 1 of 5 windows not analysed (fewer than 4 ranks reported them, "
        "or no rank computed)",
    )


def test_a_world_size_change_is_two_segments_never_mixed():
    # Rank 3 is slow in windows 1-2 at 8 ranks and in window 3 at 6: no run of three.
    before = gang(8, 2, slowed(3, 2.0))

    def slow_in_window_3(rank: int, seq: int) -> tuple[float, float]:
        return (COMPUTE_S * (2.0 if (rank, seq) == (3, 3) else 1.0), DATA_S)

    after = gang(6, 3, slow_in_window_3, first_seq=3)
    detection = detect([*before, *after])
    assert detection.stragglers == ()
    assert detection.notes == (
        "the world size changed (6, 8): each is analysed apart",
        "world size 8: 2 windows per rank at most; 3 in a row are needed",
    )
    within = only(detect([*before, *gang(6, 3, slowed(3, 2.0), first_seq=3)]))
    assert (within.world_size, within.first_window, within.windows) == (6, 3, 3)


def test_too_few_ranks_flag_nothing_and_say_why():
    detection = detect(gang(2, 6, slowed(1, 2.0)))
    assert detection.stragglers == ()
    assert detection.notes == (
        "world size 2: 2 ranks reported; at least 3 are needed to tell a slow rank from the gang",
    )
    assert only(detect(gang(3, 6, slowed(1, 2.0)))).rank == 1


def test_too_few_windows_flag_nothing_and_say_why():
    detection = detect(gang(8, 2, slowed(3, 2.0)))
    assert detection.stragglers == ()
    assert detection.notes == ("world size 8: 2 windows per rank at most; 3 in a row are needed",)


def test_a_gpu_the_attempt_does_not_hold_is_refused():
    held = {(f"node-{n}", str(g)) for n in (0, 1) for g in range(4)} - {("node-1", "2")}
    detection = detect(SLOW_GPU, attempt_gpus=held)
    assert only(detection).rank == 3
    assert [(r.window.rank, r.window.seq) for r in detection.refused] == [
        (6, seq) for seq in range(1, 7)
    ]
    assert {r.reason for r in detection.refused} == {
        "GPU '2' on 'node-1', which the attempt does not hold"
    }


BASE = SLOW_GPU[0]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"step_time_s": math.nan}, "a time that is not a finite number"),
        ({"end": math.inf}, "a time that is not a finite number"),
        ({"world_size": 0, "rank": 0}, "world size 0 (at least 1)"),
        ({"rank": 8}, "rank 8 outside 0..7 for world size 8"),
        ({"rank": -1}, "rank -1 outside 0..7 for world size 8"),
        ({"seq": 0}, "window number 0 (they start at 1)"),
        ({"steps": 0}, "0 steps (at least 1)"),
        ({"end": BASE.start - 1}, "a window that ends before it starts"),
        ({"step_time_s": 0.0}, "a step time that is not positive, or a negative wait"),
        ({"data_wait_s": -0.1}, "a step time that is not positive, or a negative wait"),
        ({"comm_wait_s": 100.0}, "waits of 102 s longer than its 100 steps of 0.37 s"),
    ],
)
def test_bad_windows_are_refused_with_a_reason_and_change_nothing(change, reason):
    bad = dataclasses.replace(BASE, **change)
    detection = detect([*SLOW_GPU, bad], evidence=CAPPED)
    assert detection.refused == (Refusal(bad, reason),)
    assert dataclasses.replace(detection, refused=()) == detect(SLOW_GPU, evidence=CAPPED)


def test_waits_equal_to_the_whole_step_are_accepted():
    whole = dataclasses.replace(BASE, data_wait_s=0.0, comm_wait_s=BASE.step_time_s * 100)
    assert detect([whole]).refused == ()


def test_a_clean_gang_flags_nobody():
    detection = detect(gang(64, 20, uniform), evidence=CLEAN)
    assert detection == Detection(stragglers=())


def test_a_rank_that_moves_gpu_is_named_where_it_is_slow_now():
    windows = [
        dataclasses.replace(w, gpu="9") if (w.rank, w.seq) in {(3, 5), (3, 6), (3, 7)} else w
        for w in gang(8, 7, slowed(3, 2.0, since=2))
    ]
    straggler = only(detect(windows))
    assert (straggler.gpu, straggler.first_window, straggler.windows) == ("9", 2, 6)


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="consecutive ≥ 1"):
        detect(SLOW_GPU, consecutive=0)
    with pytest.raises(ValueError, match="min_ranks ≥ 2"):
        detect(SLOW_GPU, min_ranks=1)


def test_the_gang_median_is_robust_to_a_second_straggler():
    def two(rank: int, seq: int) -> tuple[float, float]:
        return (COMPUTE_S * (1.6 if rank in (2, 6) else 1.0), DATA_S)

    detection = detect(gang(8, 4, two))
    assert [(s.rank, s.slowdown) for s in detection.stragglers] == [(2, 1.5625), (6, 1.5625)]


def test_rank_window_is_the_ingest_contract():
    assert [f.name for f in dataclasses.fields(RankWindow)] == [
        "rank",
        "world_size",
        "host",
        "gpu",
        "seq",
        "start",
        "end",
        "steps",
        "step_time_s",
        "data_wait_s",
        "comm_wait_s",
    ]
