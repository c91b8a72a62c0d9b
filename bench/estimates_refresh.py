"""Start estimates: one refresh, the incremental simulation against today's (issue 38,
points 4 and 5).

A refresh is what ``jobs.services.estimates.estimates_refresh`` simulates: both forecasts,
*latest* (every run holding its GPUs for its maximum runtime) and *expected* (the
durations predicted), with the product's horizon (7 days) and cycles (at most 200). On the
snapshot of the admission benchmark (bench/workload.py: 1,000 nodes, 1,069 held runs, 100
tenants, 4 flavors, every cluster ``strict``, as the issue measured it) at 1,000, 10,000 and
100,000 queued runs; and at 10,000 with every cluster's queueing policy ``backfill``, the
policy a cluster has unless set otherwise. The inputs are those of the cost benchmark
(``bench.estimates.cost_inputs``: maximum runtimes of 1-72 h, expected durations of 5-100 %
of them).

*Incremental*: ``jobs.estimates.simulate``, the best of 3 refreshes (1 at 100,000).
*Today's*: the simulation it replaced, ``bench.estimates_reference``
(``simulate_reference``), timed once: it takes minutes at 100,000. Both in the same run,
on the same inputs; their forecasts (every start, step and readiness) are asserted equal.
Each refresh is timed in CPU seconds of this process, and in wall time: on a machine
shared with other work the wall time counts the waits for a core as well, so the speed-up
and the targets are read on CPU time.

``GANTRY_BENCH_QUICK=1``: 1,000 queued runs only, under both policies, once each.
"""

import math
import time
from collections.abc import Callable
from dataclasses import replace

from django.conf import settings

from bench.estimates_reference import simulate_reference
from bench.report import Section, ms, quick, ratio
from bench.workload import make_snapshot
from jobs import estimates
from jobs.admission_types import Queueing, Snapshot

HORIZON_S = 7 * 24 * 3600.0  # GANTRY_ESTIMATE_HORIZON_H's default
MAX_STEPS = 200  # GANTRY_ESTIMATE_MAX_STEPS's default
# (queued runs, queueing policy of every cluster, refreshes timed, the best taken)
SIZES = (
    (1_000, Queueing.STRICT, 3),
    (10_000, Queueing.STRICT, 3),
    (100_000, Queueing.STRICT, 1),
    (10_000, Queueing.BACKFILL, 3),
)
QUICK_SIZES = ((1_000, Queueing.STRICT, 1), (1_000, Queueing.BACKFILL, 1))
TARGET_S = {10_000: 2.0, 100_000: 20.0}  # issue 38, point 4, on the snapshot

Simulate = Callable[..., estimates.Forecast]


def refresh(
    simulate: Simulate, snapshot: Snapshot, inputs: object
) -> tuple[float, float, tuple[estimates.Forecast, estimates.Forecast]]:
    """Seconds of CPU and of wall time one refresh (both simulations) takes, and its two
    forecasts."""
    from bench.estimates import CostInputs

    assert isinstance(inputs, CostInputs)
    started, cpu = time.perf_counter(), time.process_time()
    latest = simulate(
        snapshot, ends=inputs.latest_ends, runtimes=inputs.max_runtimes,
        horizon_s=HORIZON_S, max_steps=MAX_STEPS,
    )  # fmt: skip
    expected = simulate(
        snapshot, ends=inputs.expected_ends, runtimes=inputs.expected_runtimes,
        horizon_s=HORIZON_S, max_steps=MAX_STEPS,
    )  # fmt: skip
    return time.process_time() - cpu, time.perf_counter() - started, (latest, expected)


def section() -> Section:
    from bench.estimates import cost_inputs

    result = Section(
        title="Start estimates: one refresh, incremental vs today's simulation (issue 38)",
        intro=(
            "Both forecasts of a refresh (latest and expected, 7 days ahead, at most 200 "
            "simulated cycles) on the admission benchmark's snapshot (1,000 nodes, 1,069 held "
            "runs; every cluster `strict`, as issue 38 measured it; and with every cluster "
            "`backfill`, the default policy). *Incremental*: `jobs.estimates.simulate`, best "
            "of 3 refreshes (one at 100,000 queued). *Today's*: the simulation it replaced "
            "(`bench/estimates_reference.py`), one refresh. The same inputs in the same run; "
            "their forecasts (every start, step and readiness) asserted equal. Seconds of CPU "
            "(of wall time in brackets: on a machine busy with other work it counts the waits "
            "for a core too; on an idle one the two are the same, the simulation being one "
            "thread); the speed-up and the targets are on CPU time. Definitions: the "
            "docstring of `bench/estimates_refresh.py`."
        ),
        columns=[
            "queued runs", "policy", "simulated cycles (latest / expected)", "runs with a start",
            "incremental: CPU (wall)", "today's: CPU (wall)", "speed-up", "forecasts equal",
            "target (CPU)",
        ],
    )  # fmt: skip
    every = {}
    for queued, policy, repeat in QUICK_SIZES if quick() else SIZES:
        snapshot = make_snapshot(queued=queued)
        if policy is not Queueing.STRICT:
            snapshot = replace(snapshot, queueing=dict.fromkeys(snapshot.levels, policy))
        inputs = cost_inputs(snapshot)
        runs = [refresh(estimates.simulate, snapshot, inputs) for _ in range(repeat)]
        fast = min(cpu for cpu, _, _ in runs)
        fast_wall = min(wall for _, wall, _ in runs)
        slow, slow_wall, reference = refresh(simulate_reference, snapshot, inputs)
        forecasts = runs[-1][2]
        assert forecasts == reference, f"the forecasts differ at {queued:,} queued ({policy})"
        target = TARGET_S.get(queued) if policy is Queueing.STRICT else None
        if policy is Queueing.STRICT:
            every[queued] = fast
        latest, expected = forecasts
        result.rows.append(
            [
                f"{queued:,}",
                str(policy),
                f"{len(latest.steps)} / {len(expected.steps)}",
                f"{sum(start.at is not None for start in latest.starts.values()):,} / "
                f"{sum(start.at is not None for start in expected.starts.values()):,}",
                f"{ms(fast)} ({ms(fast_wall)})",
                f"{ms(slow)} ({ms(slow_wall)})",
                ratio(slow, fast),
                "yes",
                "—"
                if target is None
                else f"≤ {target:.0f} s: {'met' if fast <= target else 'missed'}",
            ]
        )
    factor, tick = settings.GANTRY_ESTIMATE_COST_FACTOR, settings.GANTRY_ESTIMATE_INTERVAL_S
    for queued, seconds in every.items():
        # The next refresh: at the first tick of the beat once ``factor`` times the last one's
        # duration has passed since it began (jobs.services.estimates).
        spaced = max(tick, math.ceil(factor * seconds / tick) * tick)
        result.notes.append(
            f"At {queued:,} queued runs a refresh takes {ms(seconds)} of CPU; on a worker with "
            f"a core to itself, refreshed no sooner than {factor}× that, at the beat's next "
            f"tick (every {tick} s): every {spaced:,} s, so estimates are at most about "
            f"{spaced + seconds:,.0f} s old."
        )
    return result
