"""Issue 34, acceptance 5: an attempt that a platform or hardware fault ended is credited its
lost and startup GPU-seconds; charged = allocated − credited, exact and in whole seconds."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.accounting import (
    CATEGORIES,
    LOSING_OUTCOMES,
    AttemptTimeline,
    Outcome,
    ResumedCheckpoint,
    StepWindow,
    account,
    credit_due,
    credited,
    credited_whole,
)
from tests.telemetry.test_accounting import T0, busy, timelines


def crash(outcome: Outcome = Outcome.FAILED) -> AttemptTimeline:
    """docs/accounting.md's worked example: lost 480, startup 120 of 3,080 GPU-s."""
    return AttemptTimeline(
        gpus=4,
        start=T0,
        end=T0 + 770,
        outcome=outcome,
        resumed_checkpoint=ResumedCheckpoint(step=600, saved_at=T0 + 650),
        step_windows=[
            StepWindow(T0 + 30, T0 + 330, 300, 1.0, data_wait_s=15),
            StepWindow(T0 + 340, T0 + 640, 300, 1.0, data_wait_s=15),
            StepWindow(T0 + 650, T0 + 770, 120, 1.0, data_wait_s=6),
        ],
        checkpoint_intervals=[(T0 + 330, T0 + 340), (T0 + 640, T0 + 650)],
        activity=busy(4, 13),
    )


def test_a_crash_the_hardware_caused_is_credited_its_lost_and_startup_gpu_seconds():
    accounting = account(crash())
    whole = accounting.whole_seconds()

    assert credited(accounting, outcome=Outcome.FAILED, ours=True) == 480 + 120
    assert credited_whole(whole, outcome=Outcome.FAILED, ours=True) == 600
    # charged: the rest of the allocation, checkpointing and waiting for input included
    assert whole["allocated"] - 600 == 2480


def test_the_users_own_failure_is_charged_in_full():
    accounting = account(crash())

    assert credited(accounting, outcome=Outcome.FAILED, ours=False) == 0
    assert credited_whole(accounting.whole_seconds(), outcome=Outcome.FAILED, ours=False) == 0


@pytest.mark.parametrize("outcome", [Outcome.SUCCEEDED, Outcome.CANCELLED])
def test_a_cause_class_on_an_attempt_that_did_not_lose_its_work_credits_nothing(outcome):
    # A succeeded (or cancelled) attempt still had a startup of 120 GPU-s: not credited,
    # whatever cause is stored on it.
    accounting = account(crash(outcome))
    assert accounting.startup == 120

    assert credit_due(outcome=outcome, ours=True) is False
    assert credited(accounting, outcome=outcome, ours=True) == 0
    assert credited_whole(accounting.whole_seconds(), outcome=outcome, ours=True) == 0


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.PREEMPTED, Outcome.LOST])
def test_every_losing_end_is_credited_when_the_cause_is_ours(outcome):
    assert credit_due(outcome=outcome, ours=True) is True
    assert credit_due(outcome=outcome, ours=False) is False


def test_fractional_times_credit_the_rounded_categories_so_the_seconds_add_up():
    # 3 GPUs over 10.5 s: startup 3 * 0.3 = 0.9, lost the remaining 30.6 (no checkpoint).
    accounting = account(
        AttemptTimeline(
            gpus=3,
            start=Fraction(T0),
            end=Fraction(T0) + Fraction(21, 2),
            outcome=Outcome.LOST,
            step_windows=[StepWindow(Fraction(T0) + Fraction(3, 10), T0 + 20, 5, 1.0)],
        )
    )
    whole = accounting.whole_seconds()

    assert (accounting.startup, accounting.lost) == (Fraction(9, 10), Fraction(306, 10))
    assert credited(accounting, outcome=Outcome.LOST, ours=True) == Fraction(63, 2)
    # whole: allocated 31.5 rounds half up to 32; lost 30.6 → 31 and startup 0.9 → 1 by the
    # largest remainders, so every whole GPU-second is credited and none charged
    assert (whole["allocated"], whole["lost"], whole["startup"]) == (32, 31, 1)
    assert credited_whole(whole, outcome=Outcome.LOST, ours=True) == 32


@settings(max_examples=300, deadline=None)
@given(timelines(), st.booleans())
def test_charged_plus_credited_is_allocated_exactly_and_to_the_whole_second(timeline, ours):
    accounting = account(timeline)
    whole = accounting.whole_seconds()

    exact = credited(accounting, outcome=timeline.outcome, ours=ours)
    seconds = credited_whole(whole, outcome=timeline.outcome, ours=ours)

    due = ours and timeline.outcome in LOSING_OUTCOMES
    assert exact == (accounting.lost + accounting.startup if due else 0)
    assert 0 <= exact <= accounting.allocated
    charged = whole["allocated"] - seconds
    assert 0 <= charged <= whole["allocated"]
    assert charged + seconds == sum(whole[name] for name in CATEGORIES) == whole["allocated"]
    # Two categories, each rounded by less than a second: the whole credit is within two
    # seconds of the exact one.
    assert abs(seconds - exact) < 2
