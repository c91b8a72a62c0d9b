"""A run's recorded events made into what a replay reads (``jobs.replay_record``)."""

import math

import pytest

from jobs.replay_record import (
    EventRow,
    Hold,
    RunRow,
    checkpoint_every,
    decayed_usage,
    holding,
    submission,
    timeline,
    used_since,
)
from jobs.replay_types import Actual, Ending, Holding, Submission

RUN = RunRow(
    id=7, tenant="a", flavor="a100", nodes=1, gpus_per_node=8, priority=50, submitted=100.0,
    max_runtime_s=7200.0, topology_level="", topology_required=False, state="SUCCEEDED",
    borrowed=False,
)  # fmt: skip


def event(at: float, source: str, target: str, reason: str = "", actor: str = "") -> EventRow:
    return EventRow(at, source, target, reason or target, actor)


def test_a_preempted_run_keeps_the_work_up_to_its_checkpoint_and_waits_again():
    events = [
        event(100, "", "QUEUED", "SUBMITTED"),
        event(160, "QUEUED", "ADMITTED"),
        event(170, "ADMITTED", "RUNNING", "STARTED"),
        event(1160, "RUNNING", "PREEMPTED"),
        event(1190, "PREEMPTED", "QUEUED", "REQUEUED"),
        event(1460, "QUEUED", "ADMITTED"),
        event(3460, "ADMITTED", "SUCCEEDED"),
    ]
    line = timeline(RUN, events)
    assert [(h.since, h.until, h.ended_by) for h in line.holds] == [
        (160, 1160, "PREEMPTED"),
        (1460, 3460, "SUCCEEDED"),
    ]
    # It waits from its submission, and again from losing its GPUs (not from the requeue).
    assert line.waits == ((100, 160), (1160, 1460))
    made = submission(RUN, line, [760.0], start=0.0, end=10_000.0)
    # The last hold, plus the 600 s of the preempted one up to its checkpoint at 760 s.
    assert (made.ran_s, made.failed_attempts_s, made.ended) == (2600.0, (), Ending.FINISHED)
    assert made.checkpoint_every_s == 600.0
    assert made.actual == Actual(
        held=((160, 1160), (1460, 3460)), queued_s=360.0, started=True, preemptions=1,
        lost_gpu_s=8 * 400.0,
    )  # fmt: skip


def test_a_retried_failure_is_a_failed_attempt_and_a_cancel_while_waiting_is_kept():
    events = [
        event(100, "", "QUEUED", "SUBMITTED"),
        event(100, "QUEUED", "ADMITTED"),
        event(700, "RUNNING", "QUEUED", "NODE_FAILURE"),
        event(900, "QUEUED", "CANCELLED", "CANCELLED", "bob"),
    ]
    run = RunRow(
        id=7, tenant="a", flavor="a100", nodes=1, gpus_per_node=8, priority=50,
        submitted=100.0, max_runtime_s=7200.0, topology_level="", topology_required=False,
        state="CANCELLED", borrowed=False,
    )  # fmt: skip
    line = timeline(run, events)
    assert (line.cancelled_at, line.cancelled_by) == (900, "bob")
    assert line.waits == ((100, 100), (700, 900))
    made = submission(run, line, [], start=0.0, end=10_000.0)
    assert (made.ran_s, made.failed_attempts_s, made.ended) == (0.0, (600.0,), Ending.CANCELLED)
    assert (made.cancelled_at, made.cancelled_by) == (900, "bob")
    assert made.checkpoint_every_s is None
    assert made.actual.queued_s == 200.0


def test_a_run_still_waiting_is_clipped_to_the_window():
    waiting = RunRow(
        id=8, tenant="a", flavor="a100", nodes=2, gpus_per_node=4, priority=50,
        submitted=500.0, max_runtime_s=None, topology_level="leaf", topology_required=True,
        state="QUEUED", borrowed=False,
    )  # fmt: skip
    line = timeline(waiting, [event(500, "", "QUEUED", "SUBMITTED")])
    assert line.waits == ((500, None),)
    made = submission(waiting, line, [], start=0.0, end=2000.0)
    assert (made.ended, made.topology_level, made.topology_required) == (
        Ending.UNFINISHED, "leaf", True
    )  # fmt: skip
    assert made.actual == Actual(queued_s=1500.0)


def test_usage_before_the_window_decays_as_admission_integrates_it():
    half_life = 3600.0
    holds = [(("a", "a100"), 8, -2 * half_life, -half_life), (("b", "a100"), 4, -100.0, None)]
    usage = decayed_usage(holds, at=0.0, half_life_s=half_life)
    tau = half_life / math.log(2)
    # 8 GPUs for an hour that ended an hour ago: 8 tau (1/2 - 1/4).
    assert usage[("a", "a100")] == pytest.approx(8 * tau * 0.25)
    assert usage[("b", "a100")] == pytest.approx(4 * tau * (1 - math.exp(-100 / tau)))
    assert used_since(holds, since=-1.5 * half_life, until=0.0) == {
        ("a", "a100"): 8 * 0.5,
        ("b", "a100"): 4 * 100 / 3600,
    }


def test_every_field_of_the_run_reaches_its_submission_and_a_hold_before_the_window_is_done():
    run = RunRow(
        id=9, tenant="b", flavor="h100", nodes=2, gpus_per_node=4, priority=70, submitted=50.0,
        max_runtime_s=9000.0, topology_level="leaf", topology_required=True, state="FAILED",
        borrowed=True,
    )  # fmt: skip
    events = [
        event(50, "", "QUEUED", "SUBMITTED"),
        event(60, "QUEUED", "ADMITTED"),
        event(1000, "RUNNING", "PREEMPTED"),  # before the window: not replayed
        event(1000, "PREEMPTED", "QUEUED", "REQUEUED", "carol"),  # an admin's requeue
        event(2000, "QUEUED", "ADMITTED"),  # the window starts here
        event(2500, "RUNNING", "PREEMPTED"),
        event(2600, "PREEMPTED", "ADMITTED"),
        event(3600, "RUNNING", "PREEMPTED"),  # a checkpoint at the very moment
        event(3700, "PREEMPTED", "ADMITTED"),
        event(4000, "RUNNING", "FAILED"),
    ]
    line = timeline(run, events)
    assert (line.cancelled_at, line.cancelled_by) == (None, "")
    made = submission(run, line, [300.0, 2400.0, 3100.0, 3600.0], start=2000.0, end=4000.0)
    assert made == Submission(
        id=9, tenant="b", flavor="h100", nodes=2, gpus_per_node=4, priority=70, submitted=50.0,
        # the last hold (300 s), and what both preempted holds in the window kept
        ran_s=300.0 + 400.0 + 1000.0, max_runtime_s=9000.0, topology_level="leaf",
        topology_required=True, ended=Ending.FAILED, cancelled_at=None, cancelled_by="",
        failed_attempts_s=(),
        # the median of the gaps 240, 400, 500, 500 (each hold's first from its start)
        checkpoint_every_s=500.0,
        actual=Actual(
            held=((2000, 2500), (2600, 3600), (3700, 4000)), queued_s=100.0 + 100.0,
            started=True, preemptions=2, lost_gpu_s=8 * 100.0,
        ),
    )  # fmt: skip


def test_a_preemption_at_the_windows_start_counts_one_at_its_end_does_not():
    events = [
        event(100, "", "QUEUED", "SUBMITTED"),
        event(100, "QUEUED", "ADMITTED"),
        event(1000, "RUNNING", "PREEMPTED"),
        event(1500, "PREEMPTED", "ADMITTED"),
        event(2000, "RUNNING", "PREEMPTED"),
    ]
    line = timeline(RUN, events)
    got = submission(RUN, line, [], start=1000.0, end=2000.0).actual
    # Without a checkpoint the preempted hold loses all its 900 s on 8 GPUs.
    assert got == Actual(
        held=((1500, 2000),), queued_s=500.0, started=True, preemptions=1, lost_gpu_s=8 * 900.0
    )
    # A hold that begins at the window's end has not started in it.
    later = submission(RUN, timeline(RUN, events[:4]), [], start=0.0, end=1500.0).actual
    assert (later.started, later.held) == (True, ((100, 1000),))
    assert submission(RUN, timeline(RUN, events[3:4]), [], start=0.0, end=1500.0).actual == (
        Actual(held=(), queued_s=1400.0, started=False)
    )


def test_a_cancel_is_by_whoever_asked_for_it_even_when_gantry_ends_the_run():
    events = [
        event(100, "", "QUEUED", "SUBMITTED"),
        event(150, "QUEUED", "ADMITTED", "ADMITTED", "dave"),  # an actor, not a cancel
        event(900, "RUNNING", "RUNNING", "CANCEL_REQUESTED", "alice"),
        event(950, "RUNNING", "CANCELLED", "CANCELLED"),
    ]
    line = timeline(RUN, events)
    assert (line.cancelled_at, line.cancelled_by) == (None, "alice")
    assert line.holds == (Hold(150, 950, "CANCELLED"),)
    assert timeline(RUN, events[:2]).cancelled_by == ""


def test_a_run_holding_gpus_at_the_windows_start_keeps_them_for_its_recorded_time():
    run = RunRow(
        id=3, tenant="c", flavor="a100", nodes=2, gpus_per_node=4, priority=60, submitted=10.0,
        max_runtime_s=8000.0, topology_level="", topology_required=False, state="SUCCEEDED",
        borrowed=True,
    )  # fmt: skip
    events = [event(10, "", "QUEUED", "SUBMITTED"), event(40, "QUEUED", "ADMITTED")]
    line = timeline(run, events)
    assert line.holds == (Hold(40, None, ""),)  # still holding when read
    hold = Hold(40, None, "", cluster="east", nodes=("n0", "n1"))
    assert holding(run, line, hold, [], start=1000.0, end=5000.0) == Holding(
        id=3, tenant="c", flavor="a100", cluster="east", gpus=8, nodes=("n0", "n1"),
        priority=60, submitted=10.0, admitted=40, borrowed=True, remaining_s=4000.0,
        max_runtime_s=8000.0, ended=Ending.UNFINISHED,
        actual=Actual(held=((1000, 5000),), queued_s=0.0, started=True),
    )  # fmt: skip
    # Ended in the window: as recorded; nodes not known for each of its 2 nodes: none.
    ended = Hold(40, 3000.0, "SUCCEEDED", cluster="east", nodes=("n0",))
    kept = holding(run, timeline(run, [*events, event(3000, "RUNNING", "SUCCEEDED")]), ended,
                   [], start=1000.0, end=5000.0)  # fmt: skip
    assert (kept.nodes, kept.remaining_s, kept.ended) == ((), 2000.0, Ending.FINISHED)
    assert kept.actual.held == ((1000, 3000),)
    # Preempted in the window: 2 nodes of 4 GPUs lose the 500 s since the checkpoint.
    preempted = [*events, event(2000, "RUNNING", "PREEMPTED")]
    hold = Hold(40, 2000.0, "PREEMPTED", cluster="east", nodes=("n0", "n1"))
    line = timeline(run, preempted)
    got = holding(run, line, hold, [1500.0], start=1000.0, end=5000.0).actual
    assert (got.preemptions, got.lost_gpu_s) == (1, 8 * 500.0)


def test_the_checkpoint_interval_is_the_median_gap_inside_each_hold():
    spread = [Hold(0, 100, "PREEMPTED"), Hold(1000, 1100, "PREEMPTED"), Hold(2000, None, "")]
    # 50 s into each hold; the open one too. A gap never spans two holds.
    assert checkpoint_every([50.0, 1050.0, 2050.0], spread) == 50.0
    # One saved at the very moment a hold began measures nothing.
    starts = [Hold(0, 100, "PREEMPTED"), Hold(200, 300, "PREEMPTED"), Hold(400, 500, "")]
    assert checkpoint_every([0.0, 200.0, 450.0], starts) == 50.0
    assert checkpoint_every([], starts) is None


def test_usage_adds_up_the_holds_of_one_tenant_and_flavor_and_skips_empty_ones():
    key = ("a", "a100")
    holds = [(key, 2, -50.0, -50.0), (key, 2, -3600.0, -1800.0), (key, 1, -1800.0, 0.0)]
    usage = decayed_usage(holds, at=0.0, half_life_s=1e12)  # no decay to speak of
    assert usage == {key: pytest.approx(2 * 1800.0 + 1800.0)}
    assert decayed_usage(holds[:1], at=0.0, half_life_s=3600.0) == {}
    assert used_since(holds, since=-3600.0, until=0.0) == {key: 1.5}
