"""The verdict benchmark's pieces (bench/verdicts.py) on tiny inputs: each injected cause
scores as right only with its verdict, the baseline as the old diagnosis would."""

import random

import pytest

from bench.verdicts import NCCL_MISMATCH, PLACEMENT, Case, cases, run_case
from telemetry.stragglers import Cause


@pytest.mark.parametrize(
    ("cause", "ranks", "baseline"),
    [
        (Cause.SLOW_INPUT.value, 16, False),  # rank 0's own input is not slow
        (Cause.SLOW_GPU.value, 16, False),
        (Cause.NETWORK.value, 32, False),
        (PLACEMENT, 16, True),  # every rank waits on the slower transfers
        (NCCL_MISMATCH, 16, False),
    ],
)
def test_each_injected_cause_is_named(cause, ranks, baseline):
    outcome = run_case(random.Random(7), Case(cause, 1.5, ranks, 5))
    assert (outcome.right, outcome.baseline_right) == (True, baseline)


def test_a_clean_gang_gets_no_verdict():
    assert run_case(random.Random(7), Case("", 1.0, 16, -1)).right is True


def test_the_cases_cover_every_cause_factor_and_size_but_network_inside_two_nodes():
    made = cases(random.Random(1), (16, 32), runs=1, clean=2)
    assert len(made) == 5 * 4 * 2 - 4 + 2
    assert {(c.cause, c.ranks) for c in made if c.cause == Cause.NETWORK} == {("network", 32)}
    assert [c.cause for c in made[-2:]] == ["", ""]
