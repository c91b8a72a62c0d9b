"""A run's recorded events made into what a replay reads (``jobs.replay_record``)."""

import math

import pytest

from jobs.replay_record import (
    EventRow,
    RunRow,
    decayed_usage,
    submission,
    timeline,
    used_since,
)
from jobs.replay_types import Actual, Ending

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
