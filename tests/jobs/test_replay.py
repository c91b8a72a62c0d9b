"""The what-if replay (issue 38, point 1): small histories whose outcome can be worked out
by hand, replayed under the policy in force and under proposals."""

import json
import math
import random
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from jobs import replay as replay_module
from jobs.admission_types import ClusterNode, Queueing, Quota
from jobs.replay import ReplayStopped, nearest_rank, observed_outcome, replay
from jobs.replay_outcome import RunRecord, by_month, month_starts, outcome_of
from jobs.replay_report import compare
from jobs.replay_types import (
    Actual,
    Ending,
    History,
    Holding,
    NodeChange,
    Outcome,
    Proposal,
    QuotaChange,
    Submission,
)
from tests.conftest import machine_time_zone

HOUR = 3600.0
DAY = 86400.0
NODES = (ClusterNode("east", "a100", "n0", 8), ClusterNode("east", "a100", "n1", 8))


def run(id: int, tenant: str, *, at: float = 0.0, ran: float = HOUR, gpus: int = 8, **more):
    return Submission(
        id=id, tenant=tenant, flavor="a100", nodes=1, gpus_per_node=gpus, priority=50,
        submitted=at, ran_s=ran, max_runtime_s=4 * HOUR, **more,
    )  # fmt: skip


def history(*submissions, quotas=None, **more) -> History:
    values = {
        "start": 0.0,
        "end": DAY,
        "submissions": submissions,
        "holding": (),
        "nodes": NODES,
        "quotas": quotas or {("a", "a100"): Quota(8), ("b", "a100"): Quota(8)},
        "tenants": ("a", "b"),
        "flavors": ("a100",),
        **more,
    }
    return History(**values)


def two_tenants() -> History:
    """Tenants a and b, 8 A100s guaranteed each on two 8-GPU nodes, no borrowing: a submits
    three 1×8 runs of an hour at once, b one."""
    return history(run(1, "a"), run(2, "a"), run(3, "a"), run(4, "b"))


def waits(outcome: Outcome, tenant: str) -> tuple[float | None, float | None]:
    figures = outcome.tenant(tenant)
    assert figures is not None
    return figures.queue_p50_s, figures.queue_p95_s


def test_under_the_policy_in_force_each_tenant_waits_for_its_own_guarantee():
    outcome = replay(two_tenants())
    # a's second run waits an hour for its first, the third two hours; b starts at once.
    assert waits(outcome, "a") == (HOUR, 2 * HOUR)
    assert waits(outcome, "b") == (0.0, 0.0)
    assert (outcome.tenant("a").gpu_hours, outcome.tenant("b").gpu_hours) == (24.0, 8.0)
    assert outcome.capacity_gpu_hours == 16 * 24
    assert outcome.utilisation == pytest.approx(100 * 32 / 384)
    assert (outcome.runs, outcome.started, outcome.not_started, outcome.preemptions) == (4, 4, 0, 0)


def test_a_larger_guarantee_moves_the_queue_times_and_compare_says_who_wins():
    proposal = Proposal(quotas={("a", "a100"): Quota(16)})
    outcome = replay(two_tenants(), proposal)
    # a's first two runs take both nodes; its third (beyond 16) and b's wait an hour.
    assert waits(outcome, "a") == (0.0, HOUR)
    assert waits(outcome, "b") == (HOUR, HOUR)
    assert compare(replay(two_tenants()), outcome) == [
        "Wins (shorter p95 queue time): a.",
        "Loses (longer p95 queue time): b.",
        "a: p95 queue time 2.0 h → 1.0 h (−50 %); p50 1.0 h → 0 s (−100 %)",
        "a: 24.0 → 24.0 GPU-hours delivered (+0 %)",
        "b: p95 queue time 0 s → 1.0 h; p50 0 s → 1.0 h",
        "b: 8.0 → 8.0 GPU-hours delivered (+0 %)",
        "Platform: utilisation 8.3 % → 8.3 %; 32.0 → 32.0 GPU-hours of 384 → 384; "
        "preemptions 0 → 0; runs not started 0 → 0",
    ]


def test_a_run_cancelled_while_it_waited_is_cancelled_then_in_the_replay_too():
    cancelled = run(5, "b", at=100.0, ran=0.0, ended=Ending.CANCELLED, cancelled_at=1000.0,
                    cancelled_by="bob")  # fmt: skip
    in_force = replay(history(run(4, "b"), cancelled))
    # b's guarantee is held by run 4 for an hour: run 5 waits 900 s and is cancelled.
    assert in_force.tenant("b").not_started == 1
    assert in_force.tenant("b").queue_p95_s == 900.0
    assert in_force.tenant("b").gpu_hours == 8.0
    # With room for it, it starts at once and holds its GPUs until the moment it was
    # cancelled.
    roomy = replay(history(run(4, "b"), cancelled), Proposal(quotas={("b", "a100"): Quota(16)}))
    assert roomy.tenant("b").not_started == 0
    assert roomy.tenant("b").gpu_hours == 8.0 + 8 * 900 / HOUR


def test_a_failed_attempt_holds_its_gpus_then_goes_back_to_the_queue():
    flaky = run(1, "a", ran=HOUR, failed_attempts_s=(600.0,))
    other = run(2, "a", at=300.0, ran=HOUR)
    outcome = replay(history(flaky, other))
    # Run 1 holds a's guarantee 600 s and fails; its retry keeps its place in the queue
    # (submitted at 0, before run 2), so it starts again at once and run 2 waits until it
    # ends at 600 + 3,600 s.
    assert waits(outcome, "a") == (0.0, 600.0 + HOUR - 300.0)
    assert outcome.tenant("a").gpu_hours == 8 * (600 + HOUR + HOUR) / HOUR


def test_a_preempted_run_loses_the_work_since_its_last_checkpoint():
    borrowed = run(1, "b", ran=3 * HOUR, checkpoint_every_s=1000.0)
    reclaiming = run(2, "a", at=2500.0)
    quotas = {("a", "a100"): Quota(8), ("b", "a100"): Quota(0, borrow_limit=16)}
    nodes = NODES[:1]
    outcome = replay(history(borrowed, reclaiming, quotas=quotas, nodes=nodes))
    b = outcome.tenant("b")
    # Preempted at 2,500 s, it keeps 2,000 s of work and loses 500; it returns when run 2
    # ends (2,500 + 3,600) and needs 3 h less 2,000 s more.
    assert (b.preemptions, b.lost_gpu_hours) == (1, 8 * 500 / HOUR)
    assert b.gpu_hours == 8 * (2500 + 3 * HOUR - 2000) / HOUR
    assert waits(outcome, "b") == (HOUR, HOUR)
    # Without preemption, run 2 waits for the borrowed run to end.
    calm = replay(history(borrowed, reclaiming, quotas=quotas, nodes=nodes),
                  Proposal(preemption=False))  # fmt: skip
    assert calm.preemptions == 0
    assert waits(calm, "a") == (3 * HOUR - 2500, 3 * HOUR - 2500)


def test_a_hard_budget_holds_runs_until_the_next_month():
    start = datetime(2027, 1, 31, 20, 0, tzinfo=UTC).timestamp()
    month = datetime(2027, 2, 1, tzinfo=UTC).timestamp()
    runs = [run(i, "a", at=start + (i - 1) * HOUR) for i in (1, 2, 3)]
    quotas = {("a", "a100"): Quota(16, budget_gpu_hours=20)}
    h = history(*runs, quotas=quotas, start=start, end=start + 8 * HOUR,
                budget_used={("a", "a100"): 4.0}, tenants=("a",))  # fmt: skip
    outcome = replay(h)
    # 4 used before; runs 1 and 2 take 16 more by 22:00, so run 3 (21:00... no: submitted
    # at 22:00) finds 20 of 20 spent and waits for February: two hours.
    assert waits(outcome, "a") == (0.0, month - (start + 2 * HOUR))
    burns = [(b.month, b.used_gpu_hours, b.budget_gpu_hours) for b in outcome.tenant("a").budgets]
    assert burns == [("2027-01", 20.0, 20.0), ("2027-02", 8.0, 20.0)]
    # A soft budget lets it start at once.
    soft = replay(
        h, Proposal(quotas={("a", "a100"): Quota(16, budget_gpu_hours=20, budget_hard=False)})
    )
    assert waits(soft, "a") == (0.0, 0.0)


def test_nodes_added_or_removed_change_the_capacity_replayed():
    # A third node, and a may borrow 8 beyond its guarantee: its third run borrows it.
    proposal = Proposal(
        nodes=(NodeChange("east", "a100", 1),), quotas={("a", "a100"): Quota(8, borrow_limit=8)}
    )
    more = replay(two_tenants(), proposal)
    assert waits(more, "a") == (0.0, HOUR) and waits(more, "b") == (0.0, 0.0)
    assert more.capacity_gpu_hours == 24 * 24
    fewer = replay(two_tenants(), Proposal(nodes=(NodeChange("east", "a100", -1),)))
    # One node: the runs one after another in queue order (all submitted at 0: by id), an
    # hour each, b's last.
    assert waits(fewer, "a") == (HOUR, 2 * HOUR)
    assert waits(fewer, "b") == (3 * HOUR, 3 * HOUR)
    assert fewer.capacity_gpu_hours == 8 * 24


def test_a_run_holding_gpus_at_the_start_keeps_them_for_its_recorded_time():
    holder = Holding(id=9, tenant="a", flavor="a100", cluster="east", gpus=8, nodes=("n1",),
                     priority=50, submitted=-HOUR, admitted=-HOUR, borrowed=False,
                     remaining_s=1800.0)  # fmt: skip
    outcome = replay(history(run(1, "a"), holding=(holder,)))
    assert waits(outcome, "a") == (1800.0, 1800.0)
    assert outcome.tenant("a").gpu_hours == 8 * (1800 + HOUR) / HOUR


def test_a_quota_changed_during_the_window_is_replayed_when_it_was_made():
    change = QuotaChange(at=1800.0, tenant="a", flavor="a100", quota=Quota(16))
    outcome = replay(history(run(1, "a"), run(2, "a"), quota_changes=(change,)))
    assert waits(outcome, "a") == (0.0, 1800.0)
    # A proposal for the same quota wins over the recorded change.
    kept = Proposal(quotas={("a", "a100"): Quota(8)})
    h = history(run(1, "a"), run(2, "a"), quota_changes=(change,))
    assert waits(replay(h, kept), "a") == (0.0, HOUR)


def test_problems_with_a_proposal_are_errors_and_an_overcommit_is_a_warning():
    h = two_tenants()
    bad = Proposal(
        quotas={("a", "a100"): Quota(-1, borrow_limit=-2, weight=0),
                ("gone", "a100"): Quota(1), ("b", "h100"): Quota(1)},
        nodes=(NodeChange("east", "a100", -3), NodeChange("west", "a100", 1)),
        starvation_after_s=-5.0,
    )  # fmt: skip
    problems = bad.validate(h)
    assert problems.errors == (
        "a a100: the guarantee cannot be -1 GPUs (0 at least).",
        "a a100: the borrow limit cannot be -2 GPUs (0 at least).",
        "a a100: the fair-share weight cannot be 0 (1 at least).",
        "There is no GPU flavor h100 (deleted since?).",
        "There is no tenant gone (deleted since?).",
        "east a100: cannot remove 3 nodes; it has 2.",
        "There is no cluster west (deleted since?).",
        "The starvation threshold cannot be negative.",
    )
    with pytest.raises(ValueError, match="cannot remove 3 nodes"):
        replay(h, bad)
    overcommit = Proposal(quotas={("a", "a100"): Quota(16)}).validate(h)
    assert overcommit.errors == ()
    assert overcommit.warnings == (
        "The a100 guarantees of all tenants add up to 24 GPUs, 8 more than the 16 the "
        "clusters would have: not all can be kept at once. Confirm to replay or apply it "
        "anyway.",
    )


def test_progress_is_reported_every_percent_and_a_stop_is_honoured():
    reports: list[float] = []
    replay(two_tenants(), progress=reports.append)
    assert reports == [step / 100 for step in range(1, 101)]
    asked = []

    def stop() -> bool:
        asked.append(True)
        return len(asked) > 3

    with pytest.raises(ReplayStopped):
        replay(two_tenants(), should_stop=stop)
    assert len(asked) == 4


def test_an_outcome_survives_json():
    h = two_tenants()
    h = replace(h, quotas={("a", "a100"): Quota(8, budget_gpu_hours=100), ("b", "a100"): Quota(8)})
    outcome = replay(h)
    assert Outcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome


def test_a_proposal_survives_json():
    proposal = Proposal(
        quotas={("a", "a100"): Quota(8, borrow_limit=4, max_gpus_per_run=8, budget_gpu_hours=1e3,
                                     budget_hard=False, weight=3)},
        nodes=(NodeChange("east", "a100", -1, 8),),
        preemption=False,
        starvation_after_s=600.0,
        queueing={"east": Queueing.STRICT},
        tenant_queueing={"b": Queueing.BEST_EFFORT},
        fair_share_half_life_s=7200.0,
    )  # fmt: skip
    assert Proposal.from_json(json.loads(json.dumps(proposal.to_json()))) == proposal
    assert Proposal.from_json(Proposal().to_json()) == Proposal()


def test_the_observed_outcome_uses_the_same_definitions():
    seen = run(1, "a", actual=Actual(held=((0.0, HOUR),), queued_s=0.0, started=True))
    late = run(2, "a", actual=Actual(held=((HOUR, 2 * HOUR),), queued_s=HOUR, started=True))
    waiting = run(3, "a", at=DAY - 600, actual=Actual(queued_s=600.0))
    outcome = observed_outcome(history(seen, late, waiting))
    a = outcome.tenant("a")
    assert (a.runs, a.started, a.not_started) == (3, 2, 1)
    assert (a.queue_p50_s, a.queue_p95_s, a.gpu_hours) == (600.0, HOUR, 16.0)
    assert outcome.tenant("b").runs == 0


def test_nearest_rank():
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 0.95) == 4.0


def random_history(seed: int) -> History:
    rng = random.Random(seed)
    nodes = tuple(
        ClusterNode(cluster, "a100", f"{cluster}-{i}", size, path=(f"leaf{i % 2}",))
        for cluster, count, size in (("east", 3, 8), ("west", 4, 4))
        for i in range(count)
    )
    tenants = ("a", "b", "c")
    quotas = {
        (t, "a100"): Quota(rng.choice((0, 4, 8, 16)), borrow_limit=rng.choice((0, 8, 24)),
                           weight=rng.choice((1, 2)))
        for t in tenants
    }  # fmt: skip
    submissions = []
    for i in range(1, 41):
        per_node = rng.choice((1, 2, 4, 8))
        submissions.append(
            Submission(
                id=i, tenant=rng.choice(tenants), flavor="a100",
                nodes=rng.choice((1, 1, 2)) if per_node >= 4 else 1, gpus_per_node=per_node,
                priority=rng.choice((10, 50)), submitted=rng.uniform(0, 6 * HOUR),
                ran_s=rng.uniform(60, 3 * HOUR), max_runtime_s=4 * HOUR,
                checkpoint_every_s=rng.choice((None, 900.0)),
            )
        )  # fmt: skip
    policy = rng.choice(list(Queueing))
    # Runs holding GPUs at the start: one within its guarantee, one borrowed.
    holding = tuple(
        Holding(id=100 + i, tenant=tenant, flavor="a100", cluster="east", gpus=8,
                nodes=(f"east-{i}",), priority=10, submitted=-HOUR, admitted=-HOUR,
                borrowed=borrowed, remaining_s=rng.uniform(60, 4 * HOUR))
        for i, (tenant, borrowed) in enumerate((("a", False), ("b", True)))
    )  # fmt: skip
    return History(
        start=0.0, end=12 * HOUR, submissions=tuple(submissions), holding=holding, nodes=nodes,
        quotas=quotas, tenants=tenants, flavors=("a100",), starvation_after_s=1800.0,
        queueing={"east": policy, "west": policy},
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_skipping_the_cycles_that_cannot_start_anything_changes_nothing(seed, monkeypatch):
    h = random_history(seed)
    skipping = replay(h)
    monkeypatch.setattr(replay_module._Replay, "skip_idle_cycles", False)
    assert replay(h) == skipping
    assert not math.isnan(skipping.utilisation)


JAN, FEB, MAR = (datetime(2027, m, 1, tzinfo=UTC).timestamp() for m in (1, 2, 3))


def test_the_months_a_window_touches_are_utc_months_up_to_its_end():
    assert month_starts(JAN + 14 * DAY, MAR) == [JAN, FEB]
    assert month_starts(JAN + 14 * DAY, MAR + 1) == [JAN, FEB, MAR]
    assert month_starts(FEB - 1, FEB) == [JAN]


def test_a_hold_is_cut_at_each_month_start_it_spans():
    months = [JAN, FEB, MAR]
    assert list(by_month(months, FEB - 1, MAR + 5)) == [(0, 1.0), (1, MAR - FEB), (2, 5.0)]
    assert list(by_month(months, FEB + 10, FEB + 30)) == [(1, 20.0)]
    assert list(by_month(months, MAR + 10, MAR + 30)) == [(2, 20.0)]
    assert list(by_month([JAN, FEB], JAN + 10, FEB + 30)) == [(0, FEB - JAN - 10), (1, 30.0)]
    assert list(by_month(months, JAN, JAN)) == []


def test_each_budget_is_counted_per_utc_month_for_every_tenant_whatever_the_machines_zone():
    # Two tenants, each with a quota without a budget sorted before one with a budget.
    quotas = {
        ("a", "a100"): Quota(8),
        ("a", "h100"): Quota(8, budget_gpu_hours=100.0),
        ("b", "a100"): Quota(8),
        ("b", "h100"): Quota(8, budget_gpu_hours=50.0, budget_hard=False),
    }
    window = history(
        quotas=quotas, start=FEB - DAY, end=FEB + DAY, budget_used={("a", "h100"): 7.5}
    )
    records = [
        RunRecord("a", "h100", 2, counted=True, started=True, held=[(FEB - HOUR, FEB + HOUR)]),
        # a hold that ended before the window and one of no length count nothing
        RunRecord("b", "h100", 4, counted=True, held=[(0.0, HOUR), (FEB, FEB)]),
    ]
    with machine_time_zone("Pacific/Pago_Pago"):  # UTC-11: 1 February UTC is 31 January there
        outcome = outcome_of(window, quotas, records, capacity_gpus=16)
    assert [(b.flavor, b.month, b.used_gpu_hours, b.budget_gpu_hours, b.hard)
            for b in outcome.tenant("a").budgets] == [
        ("h100", "2027-01", 7.5 + 2.0, 100.0, True),
        ("h100", "2027-02", 2.0, 100.0, True),
    ]  # fmt: skip
    assert [(b.month, b.used_gpu_hours, b.hard) for b in outcome.tenant("b").budgets] == [
        ("2027-01", 0.0, False),
        ("2027-02", 0.0, False),
    ]
    assert (outcome.tenant("a").gpu_hours, outcome.tenant("b").gpu_hours) == (4.0, 0.0)
    assert (outcome.tenant("b").runs, outcome.tenant("b").not_started) == (1, 1)
