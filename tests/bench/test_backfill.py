"""The backfill benchmark's pieces (bench/backfill.py) on a tiny input: one tenant on one node
of 8 GPUs (a second node is all outside load). Run 1 (1×4, 7,000 s, max 2 h) starts at 0;
run 2 (1×8) waits for it, reserved at 7,200 s; run 3 (1×2, 1,000 s, max 1 h) comes at 20 s
and ends before that; run 4 (1×4, 6,500 s, max 2 h) comes at 1,500 s and would not."""

import math
from dataclasses import replace

from bench.backfill import (
    Backfill,
    BestEffort,
    Head,
    Lateness,
    Outcome,
    Strict,
    bounded,
    lateness,
    simulate_one,
    utilization,
    waits_by_group,
    with_queueing,
    worse_p95,
)
from bench.placement import Replay
from bench.trace import Result, Task, max_runtime, tenant_of
from bench.workload import NOW
from jobs.admission_types import HeldRun, Pool, QueuedRun, Queueing, Quota, Snapshot, nodes_of

ON, OFF = nodes_of(Pool("c", "gpu", nodes=2, gpus_per_node=8))
NODES = (ON, replace(OFF, outside=8))


def task(run_id: int, gpus: int, arrival: float, runtime: float) -> Task:
    return Task(
        id=run_id, name=f"r{run_id}", qos="LS", gpus_per_node=gpus, arrival=arrival,
        runtime=runtime, tenant="a",
    )  # fmt: skip


TASKS = [
    task(1, 4, 0.0, 7_000.0),
    task(2, 8, 10.0, 1_000.0),
    task(3, 2, 20.0, 1_000.0),
    task(4, 4, 1_500.0, 6_500.0),
]
REPLAY = Replay("tiny", TASKS, NODES, tenant_of)


def outcomes() -> dict[tuple[str, str], Outcome]:
    """(workload, policy) -> the simulation's outcome, as ``bench.backfill.simulate`` keys it."""
    return {
        (REPLAY.workload, policy.policy): simulate_one((REPLAY, policy))
        for policy in (Strict, Backfill, BestEffort)
    }


def test_max_runtime_is_the_run_time_rounded_up_to_whole_hours():
    assert [max_runtime(t) for t in TASKS] == [7_200.0, 3_600.0, 3_600.0, 7_200.0]
    assert max_runtime(replace(TASKS[0], runtime=3_600.0)) == 3_600.0


def test_strict_holds_every_later_run_behind_the_head():
    strict = outcomes()[("tiny", "strict")]
    assert strict.starts == {1: [0.0], 2: [7_000.0], 3: [8_000.0], 4: [8_000.0]}
    assert strict.heads == {} and strict.started_ahead == 0
    assert strict.result.waited == {1: 0.0, 2: 6_990.0, 3: 7_980.0, 4: 6_500.0}
    # In the arrival window (0 to 1,500 s) only run 1 runs: 4 of the 8 usable GPUs.
    assert utilization(REPLAY, strict.result) == 0.5


def test_backfill_starts_only_what_ends_before_the_heads_reserved_start():
    found = outcomes()
    backfill = found[("tiny", "backfill")]
    # Run 3 ends by 3,620 s at the latest, before 7,200 s; run 4 would end at 8,700 s.
    assert backfill.starts == {1: [0.0], 2: [7_000.0], 3: [20.0], 4: [8_000.0]}
    assert backfill.started_ahead == 1
    # Run 4 is a head too once run 2 runs: reserved for 7,000 s + run 2's hour.
    assert backfill.heads == {(2, 0): Head(10.0, 7_200.0), (4, 0): Head(7_000.0, 10_600.0)}
    assert backfill.entered == set()
    assert lateness(backfill, found[("tiny", "strict")]) == Lateness(2, 0, 0.0, 2, 0, 0)
    assert utilization(REPLAY, backfill.result) == (6_000.0 + 2_000.0) / (8 * 1_500.0)


def test_best_effort_lets_run_4_delay_the_head():
    found = outcomes()
    best_effort = found[("tiny", "best-effort")]
    assert best_effort.starts == {1: [0.0], 3: [20.0], 4: [1_500.0], 2: [8_000.0]}
    assert best_effort.heads == {(2, 0): Head(20.0, None)}
    assert best_effort.started_ahead == 2
    assert lateness(best_effort, found[("tiny", "strict")]) == Lateness(1, 1, 1_000.0, 0, 0, 0)
    assert worse_p95([REPLAY], found) == []
    assert waits_by_group(REPLAY, best_effort.result) == {"a": [0.0, 7_990.0, 0.0, 0.0]}


def test_another_tenants_run_on_a_reserved_node_is_seen():
    # Tenant b's 1x2 comes at 1,000 s and fits beside runs 1 and 3 on run 2's reserved node.
    other = Task(
        id=5, name="r5", qos="LS", gpus_per_node=2, arrival=1_000.0, runtime=400.0, tenant="b"
    )
    replay = replace(REPLAY, tasks=[*TASKS, other])
    backfill = simulate_one((replay, Backfill))
    assert backfill.starts == {1: [0.0], 2: [7_000.0], 3: [20.0], 5: [1_000.0], 4: [8_000.0]}
    assert backfill.entered == {(2, 0)}
    assert simulate_one((replay, Strict)).entered == set()


def test_a_head_past_its_reserved_start_breaks_it_one_still_short_of_it_does_not():
    def outcome(
        starts: dict[int, list[float]],
        heads: dict[tuple[int, int], Head],
        entered: frozenset[tuple[int, int]] = frozenset(),
    ) -> Outcome:
        return Outcome(Result("p"), starts, heads, entered, 0, end=5_000.0, seconds=0.0)

    strict = outcome({1: [100.0], 2: [100.0], 3: [50.0, 900.0]}, {})
    heads = {
        (1, 0): Head(0.0, 200.0),  # starts at 300 s: late by 200 s, broken
        (2, 0): Head(0.0, 4_000.0),  # never starts, the simulation went past: broken
        (3, 1): Head(60.0, 6_000.0),  # its second attempt never starts, due after the end
        (4, 0): Head(0.0, None),  # never under either: not later
    }
    late = lateness(outcome({1: [300.0], 3: [50.0]}, heads), strict)
    assert late == Lateness(
        heads=4, later=3, max_later=math.inf, reserved=3, broken=2, broken_alone=2
    )
    # Another tenant's run got onto run 2's reserved nodes while it waited.
    late = lateness(outcome({1: [300.0], 3: [50.0]}, heads, frozenset({(2, 0)})), strict)
    assert (late.broken, late.broken_alone) == (2, 1)


def test_a_longer_p95_under_backfill_is_named():
    found = outcomes()
    waited = {1: 0.0, 2: 0.0, 3: 9_000.0, 4: 0.0}
    found[("tiny", "backfill")] = Outcome(
        Result("p", waited=waited), {}, {}, set(), 0, end=0.0, seconds=0.0
    )
    # p95 is the value at rank ⌊0.95 x 4⌋ = 3 of the sorted waits: strict's is run 3's 7,980 s.
    assert worse_p95([REPLAY], found) == ["tiny a: 2.2 h → 2.5 h"]


def test_bounded_gives_every_run_a_bound_and_every_held_run_a_future_latest_end():
    snapshot = Snapshot(
        queued=(
            QueuedRun(1, "a", "gpu", 1, 8, 50, NOW - 60), QueuedRun(2, "a", "gpu", 1, 2, 50, NOW),
        ),
        held=(
            HeldRun(3, "a", "gpu", "c", 4, 50, NOW - 7_200.0, False, (ON.name,)),
            HeldRun(4, "a", "gpu", "c", 4, 50, NOW - 20 * 3_600.0, False, (ON.name,)),
        ),
        nodes=NODES,
        quotas={("a", "gpu"): Quota(guaranteed=8)},
        now=NOW,
    )  # fmt: skip
    given = bounded(snapshot)
    assert [r.max_runtime_s for r in given.queued] == [72 * 3_600.0, 12 * 3_600.0]
    assert [r.latest_end for r in given.held] == [NOW + 10 * 3_600.0, NOW + 52 * 3_600.0]
    assert given == bounded(snapshot)
    assert with_queueing(given, Queueing.BACKFILL).queueing == {"c": Queueing.BACKFILL}
