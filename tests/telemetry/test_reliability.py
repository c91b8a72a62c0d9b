"""The reliability figures' arithmetic (telemetry/reliability.py): no database."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from telemetry.kpis.metrics import Ratio
from telemetry.kpis.reliability import (
    EventKind,
    Mtbf,
    NodeEvent,
    NodeHistory,
    ettr,
    event_kind,
    is_fault,
    month_table,
    months_between,
    node_history,
    node_mtbf,
    wall_seconds,
)

H = 3600.0


def fault(at: float, recorded: float | None = None) -> NodeEvent:
    return NodeEvent(at, at if recorded is None else recorded, EventKind.FAULT, True)


def quarantine(at: float, observed: float | None = None, *, fault: bool = False) -> NodeEvent:
    return NodeEvent(at if observed is None else observed, at, EventKind.QUARANTINE, fault)


def release(at: float) -> NodeEvent:
    return NodeEvent(at, at, EventKind.RELEASE, False)


# --- ETTR ------------------------------------------------------------------------------------


def test_ettr_is_effective_seconds_per_gpu_over_the_wall_time():
    # 4 GPUs, 10 h of wall time, 30 effective GPU-hours: 7.5 productive hours of 10.
    ratio = ettr(effective_gpu_s=30 * H, gpus=4, wall_s=10 * H)
    assert ratio == Ratio(part=108_000, whole=144_000)
    assert ratio.percent == 75.0


def test_runs_add_up_weighted_by_their_gpus():
    big = ettr(effective_gpu_s=8 * 9 * H, gpus=8, wall_s=10 * H)  # 90 %
    small = ettr(effective_gpu_s=1 * 1 * H, gpus=1, wall_s=10 * H)  # 10 %
    assert (big + small).percent == pytest.approx(730 / 9)  # 73 of 90 GPU-hours
    assert round((big + small).percent, 4) == 81.1111


def test_ettr_of_no_wall_time_is_no_figure():
    assert ettr(effective_gpu_s=0, gpus=2, wall_s=0).percent is None


@pytest.mark.parametrize(
    ("effective", "gpus", "wall", "message"),
    [
        (1, 0, 1, "at least one GPU, not 0"),
        (-1, 1, 1, r"^wall time and effective GPU-seconds are never negative$"),
        (1, 1, -1, r"^wall time and effective GPU-seconds are never negative$"),
    ],
)
def test_ettr_refuses_impossible_input(effective, gpus, wall, message):
    with pytest.raises(ValueError, match=message):
        ettr(effective_gpu_s=effective, gpus=gpus, wall_s=wall)


def test_wall_seconds_run_to_the_end_or_to_now():
    assert wall_seconds(first_admission=100.0, end=400.0, now=1000.0) == 300.0
    assert wall_seconds(first_admission=100.0, end=None, now=1000.0) == 900.0
    assert wall_seconds(first_admission=500.0, end=400.0, now=1000.0) == 0.0  # skewed clock


# --- event kinds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "signal", "action", "kind"),
    [
        ("dcgm", "ecc_uncorrectable", "quarantine", EventKind.QUARANTINE),
        ("person", "quarantine", "quarantine", EventKind.QUARANTINE),
        ("person", "release", "release", EventKind.RELEASE),
        ("person", "release", "", EventKind.OTHER),  # H1 writes every release's action
        ("gantry", "fence", "fenced", EventKind.OTHER),
        ("gantry", "fence", "fence_failed", EventKind.OTHER),
        ("gantry", "unfence", "unfenced", EventKind.OTHER),
        ("health_check", "health_check_passed", "observe", EventKind.OTHER),
        ("health_check", "health_check_failed", "quarantine", EventKind.QUARANTINE),
        ("health_check", "health_check_failed", "warn", EventKind.FAULT),
        ("dcgm", "gpu_lost", "quarantine_refused", EventKind.FAULT),
        ("dcgm", "gpu_lost", "warn", EventKind.FAULT),
        ("backend", "node_down", "warn", EventKind.FAULT),
        ("dcgm", "thermal_throttle", "warn", EventKind.OTHER),
        ("dcgm", "xid_application", "observe", EventKind.OTHER),
        ("person", "gpu_lost", "", EventKind.OTHER),  # a person's act is no hardware signal
    ],
)
def test_event_kind(source, signal, action, kind):
    assert event_kind(source=source, signal=signal, action=action) == kind


def test_is_fault_only_for_hardware_signals_from_a_source():
    assert is_fault(source="dcgm", signal="ecc_uncorrectable")
    assert not is_fault(source="dcgm", signal="power_throttle")
    assert not is_fault(source="person", signal="ecc_uncorrectable")
    assert not is_fault(source="gantry", signal="gpu_lost")


# --- a node's history ------------------------------------------------------------------------


def test_latency_runs_from_the_first_fault_to_the_quarantine():
    history = node_history([quarantine(190.0), fault(100.0), fault(150.0)], since=0.0, until=1000.0)
    assert history == NodeHistory(faults=2, quarantined_s=810.0, latencies=(90.0,))


def test_a_signal_that_quarantines_is_a_fault_with_its_own_latency():
    # Observed at 100 by the GPU, recorded (and acted on) at 130.
    history = node_history([quarantine(130.0, observed=100.0, fault=True)], since=0.0, until=200.0)
    assert history == NodeHistory(faults=1, quarantined_s=70.0, latencies=(30.0,))


def test_release_ends_the_quarantine_and_the_next_fault_starts_afresh():
    events = [
        fault(10.0),
        quarantine(40.0),
        fault(50.0),  # while quarantined: counted, starts no latency
        quarantine(60.0),  # already quarantined: nothing new
        release(100.0),
        fault(300.0),
        quarantine(305.0),
        release(400.0),
        quarantine(500.0),  # a person's, with no fault since the release: no latency
    ]
    history = node_history(events, since=0.0, until=1000.0)
    assert history == NodeHistory(faults=3, quarantined_s=60 + 95 + 500, latencies=(30.0, 5.0))


def test_events_outside_the_window_do_not_count():
    events = [fault(5.0), quarantine(8.0), release(12.0), fault(30.0)]
    history = node_history(events, since=10.0, until=20.0, quarantined_before=True)
    assert history == NodeHistory(faults=0, quarantined_s=2.0, latencies=())


def test_quarantined_all_window_long():
    history = node_history([], since=0.0, until=50.0, quarantined_before=True)
    assert history == NodeHistory(faults=0, quarantined_s=50.0, latencies=())


def test_a_fault_and_a_quarantine_at_the_same_moment_measure_zero():
    history = node_history([quarantine(70.0), fault(70.0)], since=0.0, until=100.0)
    assert history.latencies == (0.0,)


def test_window_must_not_end_before_it_begins():
    with pytest.raises(ValueError, match=r"^the window ends before it begins$"):
        node_history([], since=10.0, until=9.0)
    # An empty window is a window: nothing in it.
    assert node_history([fault(10.0)], since=10.0, until=10.0) == NodeHistory(0, 0.0, ())


def test_the_window_includes_its_start_and_leaves_out_its_end():
    events = [fault(10.0), fault(20.0)]
    assert node_history(events, since=10.0, until=20.0).faults == 1


# --- MTBF ------------------------------------------------------------------------------------


def test_mtbf_of_a_node():
    # 30 days, 2 days quarantined, 4 faults, 8 GPUs: 28 days in service.
    history = NodeHistory(faults=4, quarantined_s=2 * 86400.0, latencies=())
    mtbf = node_mtbf(history, gpus=8, window_s=30 * 86400.0)
    assert mtbf == Mtbf(faults=4, in_service_s=28 * 86400.0, gpu_s=8 * 28 * 86400.0)
    assert mtbf.hours == 168.0  # 672 h ÷ 4
    assert mtbf.per_1000_gpu_days == pytest.approx(4000 / 224)
    assert round(mtbf.per_1000_gpu_days, 3) == 17.857


def test_mtbf_without_faults_or_time():
    assert Mtbf(faults=0, in_service_s=100.0, gpu_s=800.0).hours is None
    assert Mtbf(faults=0, in_service_s=100.0, gpu_s=800.0).per_1000_gpu_days == 0.0
    assert Mtbf().per_1000_gpu_days is None
    quarantined = node_mtbf(NodeHistory(1, 50.0, ()), gpus=8, window_s=40.0)
    assert quarantined == Mtbf(faults=1, in_service_s=0.0, gpu_s=0.0)
    assert quarantined.hours == 0.0


def test_mtbf_adds_up_over_nodes():
    total = Mtbf(1, 10 * H, 80 * H) + Mtbf(3, 30 * H, 120 * H)
    assert total == Mtbf(4, 40 * H, 200 * H)
    assert total.hours == 10.0
    assert total.per_1000_gpu_days == 4 * 1000 * 24 / 200


# A busy machine draws slowly; the examples, not their speed, are the point.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(EventKind)),
            st.floats(min_value=0, max_value=1000, allow_nan=False),
            st.floats(min_value=0, max_value=100, allow_nan=False),
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_history_stays_within_the_window(raw, quarantined_before):
    events = [NodeEvent(at, at + delay, kind, kind == EventKind.FAULT) for kind, at, delay in raw]
    history = node_history(events, since=100.0, until=900.0, quarantined_before=quarantined_before)
    assert 0.0 <= history.quarantined_s <= 800.0
    assert history.faults <= len(events)
    assert len(history.latencies) <= sum(1 for e in events if e.kind == EventKind.QUARANTINE)
    assert all(0.0 <= latency <= 900.0 for latency in history.latencies)


# --- failures per month ----------------------------------------------------------------------


def test_months_between_crosses_the_year():
    assert months_between((2025, 11), (2026, 2)) == ["2025-11", "2025-12", "2026-01", "2026-02"]
    assert months_between((2026, 3), (2026, 3)) == ["2026-03"]
    assert months_between((2026, 4), (2026, 3)) == []


def test_month_table_fills_zeros_and_leaves_out_the_unknown():
    counts = [("2026-01", "hardware", 3), ("2026-03", "user", 2), ("2026-03", "odd", 9)]
    table = month_table(
        counts, months=["2026-01", "2026-02", "2026-03"], causes=["user", "platform", "hardware"]
    )
    assert table == [("2026-01", [0, 0, 3]), ("2026-02", [0, 0, 0]), ("2026-03", [2, 0, 0])]
