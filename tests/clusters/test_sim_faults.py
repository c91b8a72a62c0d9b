"""The simulator's faults (clusters/sim_faults.py): seeded, the same for any process and any
split of the window, at the configured rates, lemons at their period, throttled GPUs
slowing their gang, and bad settings refused with the setting named. No database."""

import math
from collections import Counter

import pytest

from clusters.health import HARDWARE_CLASSES, XIDS, SignalClass, xid_class
from clusters.sim_faults import (
    CLASS_XID,
    XID_HOLD_S,
    Fault,
    FaultSettings,
    GaugeReading,
    Lemon,
    Throttle,
    fault_settings,
    faults_between,
    first_fault_hitting,
    gang_speed,
    gauge_readings,
    lemon_phase_s,
)

NODES = {f"n{i:02d}": 8 for i in range(100)}
RATES = {"gpu_lost": 0.02, "ecc_uncorrectable": 0.01, "nvlink": 0.01}
DAY = 86400


def settings(**raw) -> FaultSettings:
    return fault_settings(raw, nodes=NODES)


def test_each_injected_class_reports_nvidias_xid_of_that_class():
    for signal, code in CLASS_XID.items():
        assert xid_class(code) == signal
    assert CLASS_XID[SignalClass.XID_UNKNOWN] not in XIDS
    assert (CLASS_XID["gpu_lost"], CLASS_XID["ecc_uncorrectable"], CLASS_XID["nvlink"]) == (
        79, 48, 74,
    )  # fmt: skip
    assert CLASS_XID["gpu_reset_needed"] == 119


def test_the_same_seed_gives_the_same_faults_for_any_split_of_the_window():
    nodes = {f"n{i:02d}": 8 for i in range(10)}
    faults = settings(seed=7, rates_per_node_day=RATES)
    whole = faults_between(nodes, faults, start=0, end=30 * DAY)
    halves = faults_between(nodes, faults, start=0, end=17 * DAY + 123.5) + faults_between(
        nodes, faults, start=17 * DAY + 123.5, end=30 * DAY
    )
    # Another process, asking for the same window: the same faults.
    again = faults_between(nodes, settings(seed=7, rates_per_node_day=RATES), start=0,
                           end=30 * DAY)  # fmt: skip
    assert whole == halves == again
    assert len(whole) == 9
    assert whole[0] == Fault(116975.33506890759, "n01", 6, SignalClass.ECC_UNCORRECTABLE, 48)
    assert whole != faults_between(nodes, settings(seed=8, rates_per_node_day=RATES), start=0,
                                   end=30 * DAY)  # fmt: skip


def test_rates_over_ten_thousand_node_days_are_close_to_the_configured_ones():
    faults = faults_between(
        NODES, settings(seed=7, rates_per_node_day=RATES), start=0, end=100 * DAY
    )
    counts = Counter(fault.signal.value for fault in faults)
    # 10,000 node-days: 200, 100 and 100 expected.
    assert counts == {"gpu_lost": 190, "ecc_uncorrectable": 106, "nvlink": 81}
    for name, rate in RATES.items():
        expected = rate * 10_000
        assert abs(counts[name] - expected) < 3 * math.sqrt(expected)
    assert all(0 <= fault.gpu < 8 for fault in faults)
    assert len({fault.gpu for fault in faults}) == 8  # every GPU index is drawn
    assert all(fault.xid == CLASS_XID[fault.signal] for fault in faults)


def test_a_rate_of_zero_and_no_settings_inject_nothing():
    assert faults_between(NODES, settings(rates_per_node_day={"gpu_lost": 0}), start=0,
                          end=DAY) == []  # fmt: skip
    assert fault_settings(None, nodes=NODES) == FaultSettings()
    assert faults_between(NODES, FaultSettings(), start=0, end=DAY) == []


def test_a_lemon_fails_again_and_again_at_its_period():
    lemon = {"n01": {"class": "ecc_uncorrectable", "every_s": 3600, "gpu": 3}}
    faults = settings(seed=7, lemons=lemon)
    assert faults.lemons == {"n01": Lemon(SignalClass.ECC_UNCORRECTABLE, 3600, 3)}
    assert lemon_phase_s("n01", faults.lemons["n01"], 7) == 1979
    assert faults_between(NODES, faults, start=0, end=4 * 3600) == [
        Fault(at, "n01", 3, SignalClass.ECC_UNCORRECTABLE, 48, lemon=True)
        for at in (1979.0, 5579.0, 9179.0, 12779.0)
    ]
    # A window that starts at a fault includes it; one that ends at it does not.
    assert [f.at for f in faults_between(NODES, faults, start=1979, end=5579)] == [1979.0]


def test_a_fault_hits_the_jobs_on_its_gpu_or_for_a_node_wide_one_on_its_node():
    faults = FaultSettings(
        lemons={
            "n01": Lemon(SignalClass.ECC_UNCORRECTABLE, 3600, 3),
            "n02": Lemon(SignalClass.GPU_LOST, 3600, 5),
            "n03": Lemon(SignalClass.XID_APPLICATION, 3600, 0),
        }
    )
    phase = lemon_phase_s("n01", faults.lemons["n01"], 0)
    assert first_fault_hitting({"n01": [0, 1, 2]}, NODES, faults, start=0, end=DAY) is None
    hit = first_fault_hitting({"n01": [3, 4]}, NODES, faults, start=0, end=DAY)
    assert hit is not None and (hit.at, hit.failure_reason, hit.exit_code) == (
        float(phase), "GPU_XID", 1,
    )  # fmt: skip
    assert (
        hit.message() == "XID 48 (Double Bit ECC Error) on GPU 3 of n01: the job's processes exited"
    )
    lost = first_fault_hitting({"n02": [0]}, NODES, faults, start=0, end=DAY)
    assert lost is not None and (lost.signal, lost.failure_reason, lost.exit_code) == (
        SignalClass.GPU_LOST, "NODE_FAILURE", 137,
    )  # fmt: skip
    assert lost.message() == (
        "XID 79 (GPU has fallen off the bus) on GPU 5 of n02: the node went down with it"
    )
    # An application XID is no hardware fault: the job goes on.
    assert SignalClass.XID_APPLICATION not in HARDWARE_CLASSES
    assert first_fault_hitting({"n03": [0]}, NODES, faults, start=0, end=DAY) is None


def test_a_throttled_gpu_slows_its_gang_to_its_pace():
    faults = settings(
        throttled={"n01": {"gpu": 2, "reasons": 0x40}, "n02": {"gpu": 0, "reasons": 0x04}}
    )
    assert faults.throttled == {"n01": Throttle(2, 0x40, 0.5), "n02": Throttle(0, 0x04, 0.8)}
    assert not faults.injects  # throttling fails nothing
    assert gang_speed({"n01": [0, 1]}, faults) == 1.0
    assert gang_speed({"n01": [2, 3]}, faults) == 0.5
    assert gang_speed({"n02": [0], "n03": [0]}, faults) == 0.8
    assert gang_speed({"n01": [2], "n02": [0]}, faults) == 0.5
    assert (
        settings(throttled={"n01": {"gpu": 2, "reasons": 64, "speed": 0.9}}).throttled["n01"].speed
        == 0.9
    )


def test_the_gauges_hold_the_last_xid_until_released_and_report_throttle_reasons():
    faults = FaultSettings(
        lemons={"n01": Lemon(SignalClass.GPU_LOST, 7 * 3600, 3)},
        throttled={"n02": Throttle(1, 0x40, 0.5)},
    )
    nodes = {"n01": 8, "n02": 8}
    phase = lemon_phase_s("n01", faults.lemons["n01"], 0)
    readings = gauge_readings(nodes, faults, start=phase - 30, end=phase + 46, every_s=15)
    ticks = [t for t in range(0, phase + 46, 15) if t >= phase - 30]
    xid = [(r.at, r.value) for r in readings if r.metric == "xid"]
    assert xid == [(float(t), 79) for t in ticks if t >= phase]
    assert [r for r in readings if r.metric == "clock_reasons"] == [
        GaugeReading("n02", 1, float(t), "clock_reasons", 0x40) for t in ticks
    ]
    # Held XID_HOLD_S after the fault, then 0 (left out); a release resets it sooner.
    late = gauge_readings(nodes, faults, start=phase + XID_HOLD_S - 30,
                          end=phase + XID_HOLD_S + 30, every_s=15)  # fmt: skip
    assert {r.at for r in late if r.metric == "xid"} == {
        float(t) for t in range(0, phase + XID_HOLD_S, 15) if t >= phase + XID_HOLD_S - 30
    }
    released = gauge_readings(nodes, faults, start=phase, end=phase + 600, every_s=15,
                              released={"n01": phase + 300})  # fmt: skip
    assert max(r.at for r in released if r.metric == "xid") < phase + 300


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "faults must be an object, got list"),
        ({"sead": 1},
         "faults: unknown key sead; allowed: seed, rates_per_node_day, lemons, throttled"),
        ({"seed": "7"}, "faults.seed must be a whole number, got '7'"),
        ({"seed": -1}, "faults.seed must be from 0 to 9223372036854775807, got -1"),
        ({"rates_per_node_day": {"gpu_lots": 0.1}},
         "faults.rates_per_node_day.gpu_lots: the simulator cannot inject 'gpu_lots'; it injects "
         "gpu_lost, ecc_uncorrectable, nvlink, gpu_reset_needed, row_remap_failure, "
         "ecc_page_retirement, xid_application, xid_unknown"),
        ({"rates_per_node_day": {"attempt_failures": 0.1}},
         "faults.rates_per_node_day.attempt_failures: the simulator cannot inject "
         "'attempt_failures'; it injects gpu_lost, ecc_uncorrectable, nvlink, gpu_reset_needed, "
         "row_remap_failure, ecc_page_retirement, xid_application, xid_unknown"),
        ({"rates_per_node_day": {"nvlink": -0.1}},
         "faults.rates_per_node_day.nvlink must be from 0 to 24 faults per node-day, got -0.1"),
        ({"rates_per_node_day": {"nvlink": True}},
         "faults.rates_per_node_day.nvlink must be a number, got True"),
        ({"rates_per_node_day": {"nvlink": float("nan")}},
         "faults.rates_per_node_day.nvlink must be a number, got nan"),
        ({"lemons": {"n99x": {"class": "nvlink", "every_s": 3600}}},
         "faults.lemons.n99x: no node named n99x in this cluster"),
        ({"lemons": {"n01": {"class": "nvlink"}}}, "faults.lemons.n01 needs a class and every_s"),
        ({"lemons": {"n01": {"class": "nvlink", "every_s": 10}}},
         "faults.lemons.n01.every_s must be from 60 to 2592000, got 10"),
        ({"lemons": {"n01": {"class": "nvlink", "every_s": 3600, "gpu": 8}}},
         "faults.lemons.n01.gpu must be from 0 to 7, got 8"),
        ({"lemons": {"n01": {"class": "nvlink", "every_s": 3600, "gpus": 1}}},
         "faults.lemons.n01: unknown key gpus; allowed: class, every_s, gpu"),
        ({"rates_per_node_day": []}, "faults.rates_per_node_day must be an object, got list"),
        ({"throttled": {"n01": {"gpu": 9, "reasons": 64}}},
         "faults.throttled.n01.gpu must be from 0 to 7, got 9"),
        ({"throttled": {"n01": {"gpu": 1}}},
         "faults.throttled.n01.reasons must be a whole number, got None"),
        ({"throttled": {"n01": {"gpu": 1, "reasons": 0x200}}},
         "faults.throttled.n01.reasons must be from 1 to 511, got 512"),
        ({"throttled": {"n01": {"gpu": 1, "reasons": 64, "speed": 0}}},
         "faults.throttled.n01.speed must be a number above 0, at most 1"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_naming_the_setting(raw, message):
    with pytest.raises(ValueError) as error:
        fault_settings(raw, nodes=NODES)
    assert str(error.value) == message
