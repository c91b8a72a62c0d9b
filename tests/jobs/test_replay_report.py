"""Two outcomes of a window in plain words (``jobs.replay_report``): every line as a whole."""

import math

from jobs.admission_types import ClusterNode
from jobs.replay_report import (
    Fidelity,
    TenantFidelity,
    change,
    compare,
    differences,
    duration,
    fidelity,
    outcomes_fidelity,
)
from jobs.replay_types import BudgetBurn, Ending, History, Outcome, Submission, TenantOutcome

DAY = 86400.0


def tenant(name: str, p50: float | None, p95: float | None, **more) -> TenantOutcome:
    return TenantOutcome(
        tenant=name,
        runs=more.pop("runs", 0 if p95 is None else 3),
        started=more.pop("started", 0 if p95 is None else 3),
        not_started=more.pop("not_started", 0),
        queue_p50_s=p50,
        queue_p95_s=p95,
        gpu_hours=more.pop("gpu_hours", 10.0),
        preemptions=more.pop("preemptions", 0),
        lost_gpu_hours=more.pop("lost_gpu_hours", 0.0),
        budgets=more.pop("budgets", ()),
    )


def outcome(*tenants: TenantOutcome, gpu_hours: float = 48.0, **more) -> Outcome:
    return Outcome(
        start=0.0,
        end=DAY,
        tenants=tenants,
        capacity_gpu_hours=more.pop("capacity_gpu_hours", 192.0),
        gpu_hours=gpu_hours,
        runs=more.pop("runs", 9),
        started=more.pop("started", 8),
        not_started=more.pop("not_started", 1),
        preemptions=more.pop("preemptions", 2),
        lost_gpu_hours=0.0,
    )


def test_a_duration_in_the_unit_a_person_reads():
    assert [duration(s) for s in (None, 0.0, 59.4, 60.0, 3599.0, 3600.0, 5400.0)] == [
        "—",
        "0 s",
        "59 s",
        "1 min",
        "60 min",
        "1.0 h",
        "1.5 h",
    ]
    assert [duration(s) for s in (2 * DAY - 1, 2 * DAY, 3.25 * DAY)] == ["48.0 h", "2.0 d", "3.2 d"]
    # Just above a rounding edge: 1.35 h and 2.35 d.
    assert [duration(s) for s in (4860.0, 203_040.0)] == ["1.4 h", "2.4 d"]


def test_a_change_in_percent_of_the_base():
    assert change(100.0, 29.0) == " (−71 %)"
    assert change(100.0, 112.0) == " (+12 %)"
    assert change(100.0, 100.0) == " (+0 %)"
    assert [change(None, 1.0), change(1.0, None), change(0.0, 5.0)] == ["", "", ""]


def test_who_wins_and_loses_by_a_noticeable_move_of_the_p95_queue_time():
    actual = outcome(
        tenant("a", 60.0, 1000.0),  # 941 s: more than a minute but within 5 %: the same
        tenant("b", 60.0, 10_000.0),  # 9,400 s: 6 % shorter, wins
        tenant("c", 60.0, 500.0),  # 561 s: 61 s longer, loses
        tenant("d", 60.0, 500.0),  # 559 s: 59 s longer, within the minute
        tenant("e", 60.0, 20_000.0),  # 19,000 s: 5 % exactly, the same
        tenant("f", 60.0, 100.0),  # 10 s: 90 s shorter, wins
        tenant("g", None, None),  # no runs before: neither
        tenant("i", 60.0, 60.0),
    )
    proposed = outcome(
        tenant("a", 60.0, 1041.0),
        tenant("b", 60.0, 9400.0),
        tenant("c", 60.0, 561.0),
        tenant("d", 60.0, 559.0),
        tenant("e", 60.0, 19_000.0),
        tenant("f", 60.0, 10.0),
        tenant("g", 60.0, 600.0),
        tenant("h", 60.0, 9000.0),  # new: neither
        tenant("i", 60.0, 200.0),  # 140 s longer (no runs before), loses
    )
    lines = compare(actual, proposed)
    assert lines[:2] == [
        "Wins (shorter p95 queue time): b, f.",
        "Loses (longer p95 queue time): c, i.",
    ]


def test_each_tenants_lines_then_the_platforms_with_runs_not_started_preemptions_and_budgets():
    jan = BudgetBurn("a100", "2027-01", 1234.4, 2000.0, True)
    actual = outcome(
        tenant("acme", 30.0, 5400.0, gpu_hours=1234.56, not_started=2, budgets=(jan,)),
        tenant("zeta", None, None, gpu_hours=0.0),
    )
    proposed = outcome(
        tenant(
            "acme", 30.0, 2 * DAY, gpu_hours=1300.0, preemptions=3, lost_gpu_hours=12.25,
            budgets=(
                BudgetBurn("a100", "2027-01", 1500.6, 2000.0, True),
                BudgetBurn("a100", "2027-02", 10.0, 2000.0, True),
            ),
        ),
        gpu_hours=96.0, capacity_gpu_hours=240.0, preemptions=5, not_started=0,
    )  # fmt: skip
    assert compare(actual, proposed) == [
        "Wins (shorter p95 queue time): nobody.",
        "Loses (longer p95 queue time): acme.",
        "acme: p95 queue time 1.5 h → 2.0 d (+3100 %); p50 30 s → 30 s (+0 %)",
        "acme: 1,234.6 → 1,300.0 GPU-hours delivered (+5 %)",
        "acme: runs not started by the window's end 2 → 0",
        "acme: preemptions 0 → 3, work lost 0.0 → 12.2 GPU-hours",
        "acme: a100 budget 2027-01: 1,234 → 1,501 of 2,000 GPU-hours",
        "acme: a100 budget 2027-02: — → 10 of 2,000 GPU-hours",
        "zeta: p95 queue time — → —; p50 — → —",
        "zeta: 0.0 → 0.0 GPU-hours delivered",
        "Platform: utilisation 25.0 % → 40.0 %; 48.0 → 96.0 GPU-hours of 192 → 240; "
        "preemptions 2 → 5; runs not started 1 → 0",
    ]


def run(id: int, **more) -> Submission:
    return Submission(
        id=id, tenant="a", flavor="a100", nodes=2, gpus_per_node=4, priority=50,
        submitted=0.0, ran_s=3600.0, **more,
    )  # fmt: skip


def window(*submissions: Submission, outside: int = 0, notes: tuple[str, ...] = ()) -> History:
    nodes = (
        ClusterNode("east", "a100", "n0", 8, outside=outside),
        ClusterNode("east", "a100", "n1", 8, outside=1 if outside else 0),
    )
    return History(
        start=0.0, end=DAY, submissions=submissions, holding=(), nodes=nodes, quotas={},
        notes=notes,
    )  # fmt: skip


def test_where_the_replay_departs_from_reality_in_numbers():
    history = window(
        run(1, failed_attempts_s=(1800.0, 900.0)),
        run(2, failed_attempts_s=(3600.0,)),
        run(3, ended=Ending.CANCELLED, cancelled_by="bob", cancelled_at=100.0),
        run(4, ended=Ending.CANCELLED),
        run(5, ended=Ending.CANCELLED, cancelled_at=50.0),
        run(6, ended=Ending.UNFINISHED),
        outside=2,
        notes=("The quotas of a deleted tenant are not known.",),
    )
    assert differences(history) == [
        "Outside load: jobs from outside Gantry use 3 GPUs now; the replay assumes they did "
        "for the whole window (72 GPU-hours), as the node inventory keeps no history.",
        "Failures: 3 attempts of 2 runs failed and were retried (14.0 GPU-hours); the replay "
        "fails them after the same time and requeues them, wherever they run.",
        "Cancelled runs: 3 (1 by people); 2 while waiting, cancelled at the same moment in the "
        "replay, the others after the time they really ran.",
        "Still going: 1 runs had not ended when the history was read; the replay lets them run "
        "to their time limit.",
        "The quotas of a deleted tenant are not known.",
    ]
    assert differences(window(run(1))) == []
    # An hour and a half of 1 GPU outside, 1.35 GPU-hours failed: just above rounding edges.
    short = History(
        start=0.0, end=5400.0, submissions=(run(1, failed_attempts_s=(607.5,)),),
        holding=(), nodes=(ClusterNode("east", "a100", "n0", 8, outside=1),), quotas={},
    )  # fmt: skip
    assert [reason.split(";")[0] for reason in differences(short)] == [
        "Outside load: jobs from outside Gantry use 1 GPUs now",
        "Failures: 1 attempts of 1 runs failed and were retried (1.4 GPU-hours)",
    ]
    assert "for the whole window (2 GPU-hours)" in differences(short)[0]


def test_fidelity_is_each_p50_within_ten_percent_or_the_slack_and_utilisation_within_3_points():
    observed = outcome(
        tenant("a", 1000.0, 1.0),
        tenant("b", 1000.0, 1.0),
        tenant("c", 10.0, 1.0),
        tenant("d", None, None),
        tenant("e", 100.0, 1.0),
        tenant("f", None, None),
        tenant("g", 5.0, 1.0),
        gpu_hours=96.0,
    )
    replayed = outcome(
        tenant("a", 900.0, 1.0),  # 10 % shorter: within
        tenant("b", 1101.0, 1.0),  # more than 10 % longer
        tenant("c", 40.0, 1.0),  # 30 s longer: within a slack of 30 s
        tenant("d", None, None),
        tenant("f", 5.0, 1.0),  # ran nothing, then did
        tenant("g", 6.0, 1.0),  # a second more: 20 %, within the slack only
        gpu_hours=90.24,  # 47.0 % against 50.0 %
    )
    history = window(run(1, ended=Ending.UNFINISHED))
    check = fidelity(history, observed, replayed, slack_s=30.0)
    assert check == Fidelity(
        tenants=(
            TenantFidelity("a", 1000.0, 900.0, True),
            TenantFidelity("b", 1000.0, 1101.0, False),
            TenantFidelity("c", 10.0, 40.0, True),
            TenantFidelity("d", None, None, True),
            TenantFidelity("e", 100.0, None, False),
            TenantFidelity("f", None, 5.0, False),
            TenantFidelity("g", 5.0, 6.0, True),
        ),
        observed_utilisation=50.0,
        replayed_utilisation=47.0,
        reasons=tuple(differences(history)),
    )
    assert math.isclose(check.replayed_utilisation, 47.0)
    assert (check.utilisation_within, check.within) == (True, False)
    # Without the slack c's 30 s are 300 %; without b, c, e and f every tenant is within.
    assert outcomes_fidelity(observed, replayed, reasons=()).tenants[2].within is False
    # No slack unless asked for: g's second is 20 %.
    assert outcomes_fidelity(observed, replayed, reasons=()).tenants[6].within is False
    assert fidelity(history, observed, replayed).tenants[6].within is False
    kept = ("a", "d")
    close = Fidelity(tuple(t for t in check.tenants if t.tenant in kept), 50.0, 47.0, reasons=())
    assert (close.utilisation_within, close.within) == (True, True)
    assert Fidelity(close.tenants, 50.0, 46.9, ()).within is False
    assert Fidelity(close.tenants, 46.9, 50.0, ()).utilisation_within is False
