"""Properties of straggler detection (telemetry/stragglers.py) over generated gangs: no flag on
clean gangs with noise, a straggler at 1.2× or more flagged within 10 windows, and the input's
order, repetitions, clock skew and step counts change nothing."""

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.stragglers import CONSECUTIVE, detect
from tests.telemetry.stragglers_support import COMPUTE_S, DATA_S, gang, host_of

SETTINGS = settings(max_examples=60, deadline=None)


def noisy(seed: int, spread: float, victim: int = -1, factor: float = 1.0, since: int = 1):
    """Compute and data wait × (1 ± ``spread``) per rank and window, uniform; the victim's
    compute × ``factor`` from window ``since``."""
    rng = random.Random(seed)
    cache: dict[tuple[int, int], tuple[float, float]] = {}

    def shape(rank: int, seq: int) -> tuple[float, float]:
        if (rank, seq) not in cache:
            compute = COMPUTE_S * (1 + rng.uniform(-spread, spread))
            if rank == victim and seq >= since:
                compute *= factor
            cache[(rank, seq)] = (compute, DATA_S * (1 + rng.uniform(-spread, spread)))
        return cache[(rank, seq)]

    return shape


@SETTINGS
@given(
    ranks=st.integers(3, 40),
    windows=st.integers(1, 20),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 0.03),
)
def test_a_clean_gang_with_noise_flags_nobody(ranks, windows, seed, spread):
    # +/-3 % on each rank's time puts the slowest at most 1.03 / 0.97 = 1.062x the median.
    assert detect(gang(ranks, windows, noisy(seed, spread))).stragglers == ()


@SETTINGS
@given(
    ranks=st.integers(3, 40),
    since=st.integers(1, 10),
    factor=st.floats(1.2, 3.0),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_a_straggler_at_1_2x_is_flagged_within_10_windows(ranks, since, factor, seed, data):
    victim = data.draw(st.integers(0, ranks - 1))
    windows = gang(ranks, since + 9, noisy(seed, 0.01, victim, factor, since))
    (straggler,) = detect(windows).stragglers
    assert straggler.rank == victim
    assert since <= straggler.first_window
    assert straggler.first_window + CONSECUTIVE - 1 <= since + 9
    assert straggler.slowdown >= 1.1


@SETTINGS
@given(
    ranks=st.integers(3, 16),
    factor=st.floats(1.0, 2.0),
    seed=st.integers(0, 2**32),
    data=st.data(),
)
def test_order_repetition_skew_and_step_counts_change_nothing(ranks, factor, seed, data):
    shape = noisy(seed, 0.02, victim=ranks // 2, factor=factor, since=2)
    windows = gang(ranks, 8, shape)
    expected = detect(windows)

    shuffled = data.draw(st.permutations(windows))
    assert detect(shuffled) == expected

    again = data.draw(st.lists(st.sampled_from(windows), max_size=20))
    repeated = detect([*windows, *again])
    assert repeated.duplicates == len(again)
    assert dataclasses.replace(repeated, duplicates=0) == expected

    offsets = {host_of(r): data.draw(st.floats(-86_400, 86_400)) for r in range(ranks)}
    assert detect(gang(ranks, 8, shape, skew=offsets.__getitem__)) == expected

    counts = data.draw(st.lists(st.integers(1, 500), min_size=ranks, max_size=ranks))
    rescaled = detect(gang(ranks, 8, shape, steps=lambda rank, seq: counts[rank]))
    assert [(s.rank, s.first_window, s.windows, s.cause) for s in rescaled.stragglers] == [
        (s.rank, s.first_window, s.windows, s.cause) for s in expected.stragglers
    ]
    assert [s.slowdown for s in rescaled.stragglers] == [s.slowdown for s in expected.stragglers]


@SETTINGS
@given(ranks=st.integers(3, 16), seed=st.integers(0, 2**32), data=st.data())
def test_a_minority_of_slow_ranks_is_flagged_exactly(ranks, seed, data):
    # Fewer than half the ranks 1.5x slower: the median stays the healthy ranks', so every
    # slow rank is flagged and no healthy one.
    slow = set(data.draw(st.lists(st.integers(0, ranks - 1), max_size=ranks // 2 - 1)))
    rng = random.Random(seed)

    def shape(rank: int, seq: int) -> tuple[float, float]:
        return (COMPUTE_S * (1.5 if rank in slow else 1 + rng.uniform(-0.03, 0.03)), DATA_S)

    assert {s.rank for s in detect(gang(ranks, 6, shape)).stragglers} == slow
