"""Start estimates, the pure part (jobs.estimates): the forward simulation, its reasons when
there is no number, the duration predictor, the submit preview's lookup, and properties
over random queues (hypothesis, derandomized, no database)."""

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import estimates
from jobs.admission_types import ClusterNode, HeldRun, Pool, QueuedRun, Quota, Snapshot, nodes_of

EXACT = {"resolution": 0.0, "min_step_s": 0.0}  # every end a step of its own


def two_nodes(**changes) -> Snapshot:
    """Two 8-GPU nodes, each fully held by one run; tenant t waits for both nodes, tenant u
    for half a node."""
    snapshot = Snapshot(
        queued=(
            QueuedRun(10, "t", "a100", nodes=2, gpus_per_node=8, priority=50, submitted=1.0),
            QueuedRun(11, "u", "a100", nodes=1, gpus_per_node=4, priority=50, submitted=2.0),
        ),
        held=(
            HeldRun(1, "t", "a100", "c", 8, 50, 0.0, False, ("c-a100-00",)),
            HeldRun(2, "u", "a100", "c", 8, 50, 0.0, False, ("c-a100-01",)),
        ),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={("t", "a100"): Quota(16), ("u", "a100"): Quota(16)},
        now=100.0,
    )
    return replace(snapshot, **changes)


def test_each_run_starts_when_the_runs_on_its_nodes_end():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: 2000.0}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    # u's small run fits on the first node to free up; t's gang needs both nodes, so it
    # waits for run 2 and for u's run, which took half of the first node meanwhile.
    assert forecast.starts[11] == estimates.Start(11, 1000.0, "c", ("c-a100-00",), (1,))
    assert forecast.starts[10] == estimates.Start(
        10, 2000.0, "c", ("c-a100-00", "c-a100-01"), (2, 11)
    )
    assert forecast.ready == {"t/a100": 2000.0, "u/a100": 1000.0}
    # After the last queued run starts, the steps go on as held runs end (for the preview).
    assert [step.at for step in forecast.steps] == [100.0, 1000.0, 1300.0, 2000.0, 2500.0]


def test_steps_follow_a_grid_that_only_rounds_up():
    forecast = estimates.simulate(
        two_nodes(),
        ends={1: 1000.0, 2: 2000.0},
        runtimes={10: 500.0, 11: 300.0},
        resolution=0.02,
        min_step_s=60.0,
    )
    # 900 s and 1900 s ahead, 2 % is less than a minute: both round up to whole minutes of
    # the clock; u's run ends 300 s after its start, on a minute too.
    assert forecast.starts[11].at == 1020.0
    assert forecast.starts[10].at == 2040.0
    assert [step.at for step in forecast.steps] == [100.0, 1020.0, 1320.0, 2040.0, 2580.0]


def test_a_run_ahead_without_a_bound_gives_no_number_but_the_reason():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: None}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    assert forecast.starts[11].at == 1000.0
    assert forecast.starts[10] == estimates.Start(
        10, None, why="no bound: 1 run ahead has no maximum runtime"
    )
    assert forecast.ready == {"t/a100": None, "u/a100": 1000.0}


def test_jobs_from_outside_gantry_and_closed_nodes_are_named():
    nodes = (
        ClusterNode("c", "a100", "gpu-1", 8, outside=4),
        ClusterNode("c", "a100", "gpu-2", 8, schedulable=False, reason="drained: bad DIMM"),
    )
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),),
        held=(),
        nodes=nodes,
        quotas={("t", "a100"): Quota(16)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0}, **EXACT)
    assert forecast.starts[10].why == (
        "no bound: gpu-1 is busy with jobs from outside Gantry, whose end is unknown; "
        "gpu-2 (drained: bad DIMM) takes no work"
    )


def test_waits_no_end_can_lift_are_said_as_they_are():
    snapshot = two_nodes(
        held=(),
        quotas={("t", "a100"): Quota(8, max_gpus_per_run=8), ("u", "a100"): Quota(16)},
        budget_used={("u", "a100"): 100.0},
    )
    snapshot = replace(
        snapshot,
        quotas={**snapshot.quotas, ("u", "a100"): Quota(16, budget_gpu_hours=50.0)},
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0, 11: 60.0}, **EXACT)
    assert forecast.starts[10].why == "it is larger than the tenant's quota allows per run"
    assert forecast.starts[11].why == (
        "the tenant's hard GPU-hour budget for the month is spent; it starts when the budget "
        "resets or is raised"
    )


def test_beyond_the_horizon_it_says_how_far_it_looked():
    forecast = estimates.simulate(
        two_nodes(),
        ends={1: 100.0 + 10 * 86_400, 2: 100.0 + 20 * 86_400},
        runtimes={10: 60.0, 11: 60.0},
        horizon_s=7 * 86_400,
        **EXACT,
    )
    assert forecast.starts[10].why == "it does not start within the 168 hours looked ahead"
    assert forecast.starts[10].at is None


def test_a_preempted_borrower_goes_back_to_the_queue_and_starts_again():
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),),
        held=(HeldRun(1, "u", "a100", "c", 8, 50, 0.0, True, ("c-a100-00",)),),
        nodes=nodes_of(Pool("c", "a100", 1, 8)),
        quotas={("t", "a100"): Quota(8), ("u", "a100"): Quota(0, borrow_limit=8)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={1: 5000.0}, runtimes={10: 600.0}, **EXACT)
    # t reclaims its guarantee at once; u's run is requeued, starts again when t's run ends
    # (700) and holds the node for the 4,900 s it had left (until 5,600).
    assert forecast.starts[10] == estimates.Start(10, 100.0, "c", ("c-a100-00",), ())
    assert [(step.at, step.usage) for step in forecast.steps] == [
        (100.0, {"u/a100": 0, "t/a100": 8}),
        (700.0, {"t/a100": 0, "u/a100": 8}),
        (5600.0, {"u/a100": 0}),
    ]


def test_a_wait_no_end_can_lift_is_named_even_when_the_cycles_run_out():
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 1, 50, 1.0),),
        held=tuple(
            HeldRun(index, "u", "a100", "c", 1, 50, 0.0, False, ("c-a100-00",))
            for index in range(1, 6)
        ),
        nodes=nodes_of(Pool("c", "a100", 1, 8)),
        quotas={("u", "a100"): Quota(8)},
        now=0.0,
    )
    ends = {index: 3600.0 * index for index in range(1, 6)}
    forecast = estimates.simulate(snapshot, ends=ends, runtimes={10: 60.0}, max_steps=3)
    assert forecast.starts[10].why == "the tenant has no quota for this flavor"


def test_expected_runtime_takes_the_most_specific_history_with_enough_runs():
    day = 86_400.0
    # The experiment's one earlier run decides; a 30-day outlier among the template's runs
    # never matters then.
    assert estimates.expected_runtime([[3600.0], [60.0, 30 * day]], max_runtime_s=day) == 3600.0
    # No run of the experiment: the template's median (two runs: their mean).
    assert estimates.expected_runtime([[], [60.0, 120.0]], max_runtime_s=day) == 90.0
    # A tenant's runs of the size need three; with two, the max runtime stands.
    assert estimates.expected_runtime([[], [], [60.0, 120.0]], max_runtime_s=day) == day
    assert estimates.expected_runtime([[], [], [60.0, 30 * day, 120.0]], max_runtime_s=day) == 120.0
    # Never beyond the max runtime.
    assert estimates.expected_runtime([[2 * day]], max_runtime_s=day) == day


def test_expected_end_of_held_runs():
    assert (
        estimates.expected_end(started=0.0, now=100.0, expected_s=500.0, latest_end=900.0) == 500.0
    )
    assert (
        estimates.expected_end(started=None, now=100.0, expected_s=500.0, latest_end=900.0) == 600.0
    )
    # Past its expected duration: a tenth of the time it has left.
    assert (
        estimates.expected_end(started=0.0, now=600.0, expected_s=500.0, latest_end=900.0) == 630.0
    )
    assert (
        estimates.expected_end(started=None, now=100.0, expected_s=5000.0, latest_end=900.0)
        == 900.0
    )


def test_first_fit_waits_for_the_tenants_earlier_runs_quota_and_room():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: 2000.0}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    nodes = nodes_of(Pool("c", "a100", 2, 8))

    roomy = Quota(16)

    def fit(run: QueuedRun, quota: Quota | None = roomy) -> estimates.Start:
        return estimates.first_fit(forecast, run=run, quota=quota, nodes=nodes, levels={})

    # u's whole-node run: node 00 is free from 1300 (u's small run ends then).
    assert fit(QueuedRun(-1, "u", "a100", 1, 8, 50, 100.0)) == estimates.Start(
        -1, 1300.0, "c", ("c-a100-00",)
    )
    # t's 4-GPU run: behind t's gang (2000), then on what the gang leaves: nothing until
    # it ends at 2500.
    assert fit(QueuedRun(-1, "t", "a100", 1, 4, 50, 100.0)).at == 2500.0
    # u's 4-GPU run fits beside u's small run at 1000, if u's quota has room for 8 + 4 + 4;
    # with 12 it waits until the small run ends.
    assert fit(QueuedRun(-1, "u", "a100", 1, 4, 50, 100.0), Quota(16)).at == 1000.0
    assert fit(QueuedRun(-1, "u", "a100", 1, 4, 50, 100.0), Quota(12)).at == 1300.0
    assert fit(QueuedRun(-1, "v", "a100", 1, 4, 50, 100.0), None).why == (
        "tenant v has no quota for a100"
    )
    assert fit(QueuedRun(-1, "v", "h100", 1, 4, 50, 100.0)).why == (
        "no enabled cluster has h100 GPUs"
    )


# Properties over random queues ---------------------------------------------------------


@st.composite
def queues(draw, *, tenants=("t1", "t2", "t3"), whole_nodes=False):
    """A cluster of 1-5 nodes, held runs on some, 1-8 queued runs; their max runtimes and
    actual durations (at most the max) and ends."""
    count = draw(st.integers(1, 5))
    sizes = [8] * count if whole_nodes else [draw(st.sampled_from([4, 8])) for _ in range(count)]
    nodes = tuple(ClusterNode("c", "f", f"n{i}", size) for i, size in enumerate(sizes))
    held, queued = [], []
    for index, node in enumerate(nodes):
        if draw(st.booleans()):
            gpus = node.gpus if whole_nodes else draw(st.integers(1, node.gpus))
            tenant = draw(st.sampled_from(tenants))
            held.append(HeldRun(index + 1, tenant, "f", "c", gpus, 50, 0.0, False, (node.name,)))
    for index in range(draw(st.integers(1, 8))):
        gang = draw(st.integers(1, count))
        per_node = 8 if whole_nodes else draw(st.sampled_from([1, 2, 4, 8]))
        queued.append(
            QueuedRun(
                100 + index, draw(st.sampled_from(tenants)), "f", gang if whole_nodes else 1,
                per_node, draw(st.sampled_from([50, 60])), float(index),
            )
        )  # fmt: skip
    quotas = {
        (tenant, "f"): Quota(draw(st.integers(0, 16)), borrow_limit=draw(st.integers(0, 16)))
        for tenant in tenants
    }
    if whole_nodes:
        quotas = {key: Quota(8 * count) for key in quotas}
    snapshot = Snapshot(tuple(queued), tuple(held), nodes, quotas, now=0.0)
    max_runtime = {run.id: 100.0 * draw(st.integers(1, 20)) for run in (*held, *queued)}
    ends = {run.id: max_runtime[run.id] * draw(st.floats(0.05, 1.0)) for run in held}
    actual_ends = {key: end * draw(st.floats(0.05, 1.0)) for key, end in ends.items()}
    runtimes = {run.id: max_runtime[run.id] for run in queued}
    actual = {key: runtime * draw(st.floats(0.05, 1.0)) for key, runtime in runtimes.items()}
    return snapshot, ends, runtimes, actual_ends, actual


@settings(max_examples=150, derandomize=True, deadline=None)
@given(queues())
def test_the_same_inputs_in_any_order_give_the_same_forecast(case):
    snapshot, ends, runtimes, _, _ = case
    first = estimates.simulate(snapshot, ends=ends, runtimes=runtimes)
    shuffled = replace(snapshot, queued=snapshot.queued[::-1], held=snapshot.held[::-1])
    assert estimates.simulate(shuffled, ends=ends, runtimes=runtimes) == first


@settings(max_examples=150, derandomize=True, deadline=None)
@given(queues(tenants=("t1",), whole_nodes=True))
def test_the_latest_start_bounds_the_start_when_runs_end_earlier(case):
    """Runs ending before their max runtimes never start a queued run after its bound: here
    for one tenant's gangs of whole nodes, where admission is first come, first served on a
    count of free nodes. Across tenants and partly used nodes it is no theorem (a run let in
    ahead when an early end makes room can hold nodes longer: list scheduling's anomalies);
    bench/estimates.py measures how often that happens on the Alibaba trace."""
    snapshot, ends, runtimes, actual_ends, actual = case
    bound = estimates.simulate(snapshot, ends=ends, runtimes=runtimes)  # on the default grid
    happened = estimates.simulate(snapshot, ends=actual_ends, runtimes=actual, **EXACT)
    for run_id, start in bound.starts.items():
        assert start.at is not None  # nothing here is without a bound
        assert happened.starts[run_id].at is not None
        assert happened.starts[run_id].at <= start.at


@settings(max_examples=150, derandomize=True, deadline=None)
@given(queues(), st.data())
def test_raising_a_runs_priority_never_makes_its_start_later(case, data):
    """Over other tenants' runs: a run considered earlier in every cycle takes what it fits
    no later than before. (Put ahead of its own tenant's earlier run, it also changes where
    that run goes, and with it the placements after: not covered.)"""
    snapshot, ends, runtimes, _, _ = case
    firsts = {}
    for run in snapshot.queued:
        firsts.setdefault(run.tenant, run)
    snapshot = replace(snapshot, queued=tuple(firsts.values()))
    run = data.draw(st.sampled_from(snapshot.queued))
    raised = replace(
        snapshot,
        queued=tuple(
            replace(each, priority=each.priority + 10) if each.id == run.id else each
            for each in snapshot.queued
        ),
    )
    before = estimates.simulate(snapshot, ends=ends, runtimes=runtimes).starts[run.id].at
    after = estimates.simulate(raised, ends=ends, runtimes=runtimes).starts[run.id].at
    if before is not None:
        assert after is not None and after <= before
    assert not math.isnan(after or 0.0)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(queues())
def test_deciding_on_each_lines_front_decides_as_on_the_whole_queue(case):
    """The simulation gives ``decide`` only the first runs of each tenant's line (more when
    a whole front is admitted): the same starts as with the whole queue every cycle."""
    snapshot, ends, runtimes, _, _ = case
    fronts = estimates.simulate(snapshot, ends=ends, runtimes=runtimes, **EXACT)
    front, estimates._Lines.FRONT = estimates._Lines.FRONT, 1_000_000
    try:
        whole = estimates.simulate(snapshot, ends=ends, runtimes=runtimes, **EXACT)
    finally:
        estimates._Lines.FRONT = front
    assert fronts.starts == whole.starts


def test_across_tenants_a_run_behind_that_backfills_makes_a_start_later_than_its_bound():
    """Why the full-limits figure is shown as an estimate with its track record and not as
    a bound (docs/admission.md): across tenants it is no theorem, and here is the smallest
    case, on whole nodes at exact wall time. Three nodes, each held by one of t1's runs
    until 1000 at the latest. In line: t1's gang of two nodes, t1's one-node run, then t2's
    one-node run. If every run uses its full time, t1's two start at 1000 and t2's at 2000.
    When one held run ends at 500 instead, t1's gang cannot use the one free node and t1's
    one-node run may not pass its tenant's head, so t2's run, behind both, takes the node
    (one tenant's blocked head never blocks another) and holds it past 1000: t1's one-node
    run starts at 1500, 500 s after its full-limits estimate."""
    nodes = nodes_of(Pool("c", "a100", 3, 8))
    snapshot = Snapshot(
        queued=(
            QueuedRun(100, "t1", "a100", nodes=2, gpus_per_node=8, priority=50, submitted=1.0),
            QueuedRun(101, "t1", "a100", nodes=1, gpus_per_node=8, priority=50, submitted=2.0),
            QueuedRun(102, "t2", "a100", nodes=1, gpus_per_node=8, priority=50, submitted=3.0),
        ),
        held=tuple(
            HeldRun(held, "t1", "a100", "c", 8, 50, 0.0, False, (node.name,))
            for held, node in enumerate(nodes, start=1)
        ),
        nodes=nodes,
        quotas={("t1", "a100"): Quota(24), ("t2", "a100"): Quota(24)},
        now=0.0,
    )
    runtimes = {100: 1000.0, 101: 1000.0, 102: 1000.0}

    full_limits = estimates.simulate(
        snapshot, ends={1: 1000.0, 2: 1000.0, 3: 1000.0}, runtimes=runtimes, **EXACT
    )
    happened = estimates.simulate(
        snapshot, ends={1: 1000.0, 2: 1000.0, 3: 500.0}, runtimes=runtimes, **EXACT
    )

    assert {run: start.at for run, start in full_limits.starts.items()} == {
        100: 1000.0,
        101: 1000.0,
        102: 2000.0,
    }
    assert {run: start.at for run, start in happened.starts.items()} == {
        100: 1000.0,
        101: 1500.0,
        102: 500.0,
    }


# --- the gaps mutation testing found (issue 32): each value worked out by hand ---------------


def test_on_the_default_grid_a_start_rounds_up_to_the_minute():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: 2000.0}, runtimes={10: 500.0, 11: 300.0}
    )
    # 900 s ahead, 5 % is 45 s: less than the minute, so 1,000 rounds up to 1,020; run 2's
    # end 1,900 s ahead rounds to the minute too (5 % is 95 s, the spacing below it 60 s).
    assert forecast.starts[11] == estimates.Start(11, 1020, "c", ("c-a100-00",), (1,))
    assert forecast.starts[10] == estimates.Start(
        10, 2040, "c", ("c-a100-00", "c-a100-01"), (2, 11)
    )
    assert [step.at for step in forecast.steps] == [100.0, 1020, 1320, 2040, 2640]
    # Each step lists only the nodes whose free GPUs changed: at 1020, node 00 (u's run took
    # half of it).
    assert [step.free for step in forecast.steps[:2]] == [
        {"c/c-a100-00": 0, "c/c-a100-01": 0},
        {"c/c-a100-00": 4},
    ]


def test_the_first_step_frees_nothing_on_closed_or_outside_busy_nodes():
    nodes = (
        ClusterNode("c", "a100", "gpu-1", 8, outside=4),
        ClusterNode("c", "a100", "gpu-2", 8, schedulable=False, reason="drained"),
        ClusterNode("c", "a100", "gpu-3", 8, outside=8),
    )
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),),
        held=(),
        nodes=nodes,
        quotas={("t", "a100"): Quota(16)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0}, **EXACT)
    assert forecast.steps[0].free == {"c/gpu-1": 4, "c/gpu-2": 0, "c/gpu-3": 0}
    assert forecast.starts == {
        10: estimates.Start(
            10,
            None,
            why="no bound: gpu-1, gpu-3 are busy with jobs from outside Gantry, whose end is "
            "unknown; gpu-2 (drained) takes no work",
        )
    }


def borrower(gpus: int = 8, wants: int = 4) -> Snapshot:
    """u borrows one 8-GPU node with ``gpus`` GPUs; t, guaranteed 8, queues ``wants``."""
    return Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, wants, 50, 1.0),),
        held=(HeldRun(1, "u", "a100", "c", gpus, 50, 0.0, True, ("c-a100-00",)),),
        nodes=nodes_of(Pool("c", "a100", 1, 8)),
        quotas={("t", "a100"): Quota(8), ("u", "a100"): Quota(0, borrow_limit=8)},
        now=100.0,
    )


def test_a_preempted_run_frees_its_gpus_and_gets_no_start_of_its_own():
    forecast = estimates.simulate(borrower(), ends={1: 5000.0}, runtimes={10: 600.0}, **EXACT)
    # t reclaims half the node: the other half is free while u waits for all 8 again.
    assert forecast.starts == {10: estimates.Start(10, 100.0, "c", ("c-a100-00",), ())}
    assert [(step.at, step.free, step.usage) for step in forecast.steps] == [
        (100.0, {"c/c-a100-00": 4}, {"u/a100": 0, "t/a100": 4}),
        (700.0, {"c/c-a100-00": 0}, {"u/a100": 8, "t/a100": 0}),
        (5600.0, {"c/c-a100-00": 8}, {"u/a100": 0}),
    ]


def test_a_preempted_run_past_its_end_or_without_one_resumes_with_what_it_had_left():
    # Already past its end when preempted: it holds the node again for no time at all.
    past = estimates.simulate(borrower(), ends={1: 50.0}, runtimes={10: 600.0}, **EXACT)
    assert [(step.at, step.usage) for step in past.steps] == [
        (100.0, {"u/a100": 0, "t/a100": 4}),
        (700.0, {"u/a100": 8, "t/a100": 0}),
        (700.0, {"u/a100": 0}),
    ]
    # With no end it never frees the node again: nothing more is known to end.
    endless = estimates.simulate(borrower(), ends={1: None}, runtimes={10: 600.0}, **EXACT)
    assert [(step.at, step.usage) for step in endless.steps] == [
        (100.0, {"u/a100": 0, "t/a100": 4}),
        (700.0, {"u/a100": 8, "t/a100": 0}),
    ]


def test_a_preempted_one_gpu_run_is_requeued_as_one_gpu():
    forecast = estimates.simulate(
        borrower(gpus=1, wants=8), ends={1: 5000.0}, runtimes={10: 600.0}, **EXACT
    )
    assert [(step.at, step.free, step.usage) for step in forecast.steps] == [
        (100.0, {"c/c-a100-00": 0}, {"u/a100": 0, "t/a100": 8}),
        (700.0, {"c/c-a100-00": 7}, {"u/a100": 1, "t/a100": 0}),
        (5600.0, {"c/c-a100-00": 8}, {"u/a100": 0}),
    ]


def test_when_the_cycles_run_out_it_says_how_far_it_simulated():
    # 201 runs of a whole node, one after another, 64,807 s each: the 200 cycles start the
    # first 200 (the last 199 runtimes after now) and reach the end of the 200th, 3,600.4
    # hours after now; the 201st is left with the hours simulated.
    line = tuple(QueuedRun(100 + i, "t", "a100", 1, 8, 50, float(i)) for i in range(201))
    snapshot = Snapshot(
        queued=line,
        held=(),
        nodes=nodes_of(Pool("c", "a100", 1, 8)),
        quotas={("t", "a100"): Quota(8)},
        now=3600.0,
    )
    forecast = estimates.simulate(
        snapshot,
        ends={},
        runtimes={run.id: 64_807.0 for run in line},
        horizon_s=14_000_000.0,
        **EXACT,
    )
    assert len(forecast.steps) == 200
    assert forecast.starts[299] == estimates.Start(299, 12_900_193.0, "c", ("c-a100-00",), (298,))
    assert forecast.starts[300] == estimates.Start(
        300, None, why="it does not start within the 3,600 hours simulated"
    )


def test_an_end_exactly_at_the_horizon_is_still_simulated():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1100.0, 2: 1100.0}, runtimes={10: 60.0, 11: 60.0},
        horizon_s=1000.0, **EXACT,
    )  # fmt: skip
    assert forecast.starts[10] == estimates.Start(
        10, 1100.0, "c", ("c-a100-00", "c-a100-01"), (1, 2)
    )


def test_the_horizon_is_said_in_whole_hours():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 20_000_000.0, 2: 20_000_000.0}, runtimes={10: 60.0, 11: 60.0},
        horizon_s=12_961_080.0, **EXACT,
    )  # fmt: skip
    assert forecast.starts[10] == estimates.Start(
        10, None, why="it does not start within the 3,600 hours looked ahead"
    )


def test_a_run_no_cluster_can_ever_hold_is_said_so():
    snapshot = Snapshot(
        queued=(
            QueuedRun(10, "t", "a100", 3, 8, 50, 1.0),
            QueuedRun(11, "t", "h100", 1, 8, 50, 2.0),
        ),
        held=(),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={("t", "a100"): Quota(24), ("t", "h100"): Quota(8)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0, 11: 60.0}, **EXACT)
    assert forecast.starts == {
        10: estimates.Start(10, None, why="it cannot start while the clusters stay as they are"),
        11: estimates.Start(11, None, why="no enabled cluster has h100 GPUs"),
    }


def test_the_grid_off_when_either_setting_is_zero_and_its_edges():
    grid = estimates._on_grid
    # Either setting zero: no grid, the end itself.
    assert grid(1001.0, now=0.0, at=0.0, resolution=0.0, min_step_s=60.0) == 1001.0
    assert grid(1001.0, now=0.0, at=0.0, resolution=0.05, min_step_s=0.0) == 1001.0
    # A minimum under a minute and 5 % of 1,000.5 s (50 s) under every spacing: the
    # minimum is the spacing, 1 s or 30 s.
    assert grid(1000.5, now=0.0, at=0.0, resolution=0.05, min_step_s=1.0) == 1001
    assert grid(1010.0, now=0.0, at=0.0, resolution=0.01, min_step_s=30.0) == 1020
    # The distance counts from now: 1,050 s ahead of 1,000, 5 % is 52.5 s → a minute.
    assert grid(2050.0, now=1000.0, at=0.0, resolution=0.05, min_step_s=60.0) == 2100
    # A spacing exactly as wanted is taken: 10 % of 1,200 s is 120 s.
    assert grid(1230.0, now=30.0, at=0.0, resolution=0.1, min_step_s=60.0) == 1320
    # Never before the current step.
    assert grid(1230.0, now=30.0, at=5000.0, resolution=0.1, min_step_s=60.0) == 5000.0


def test_more_than_three_names_are_counted():
    assert estimates._names(["a", "b", "c"]) == "a, b, c"
    assert estimates._names(["a", "b", "c", "d"]) == "a, b, c and 1 more"
    assert estimates._names(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"


def test_expected_runtime_of_an_even_history_and_of_no_history():
    # Four runs: the mean of the middle two (120 and 180), not of the first two.
    assert estimates.expected_runtime([[240.0, 60.0, 180.0, 120.0]], max_runtime_s=3600.0) == 150.0
    # Fewer histories than levels, none with enough runs: the max runtime.
    assert estimates.expected_runtime([[], []], max_runtime_s=3600.0) == 3600.0


def test_a_run_at_its_expected_end_exactly_is_given_a_tenth_of_its_time_left():
    assert (
        estimates.expected_end(started=0.0, now=600.0, expected_s=600.0, latest_end=900.0) == 630.0
    )


def test_first_fit_counts_borrowing_in_the_quota_and_needs_no_earlier_run():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: 2000.0}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    nodes = nodes_of(Pool("c", "a100", 2, 8))

    def fit(run: QueuedRun, quota: Quota | None) -> estimates.Start:
        return estimates.first_fit(forecast, run=run, quota=quota, nodes=nodes, levels={})

    # u holds 12 GPUs at 1000 and 8 from 1300: 6 guaranteed + 6 borrowed has room for 4
    # more at 1300.
    assert fit(QueuedRun(-1, "u", "a100", 1, 4, 50, 100.0), Quota(6, borrow_limit=6)) == (
        estimates.Start(-1, 1300.0, "c", ("c-a100-00",))
    )
    # w has nothing queued or held: a quota of exactly its one GPU lets it in at 1000, the
    # first step with a free GPU.
    assert fit(QueuedRun(-1, "w", "a100", 1, 1, 50, 100.0), Quota(1)) == (
        estimates.Start(-1, 1000.0, "c", ("c-a100-00",))
    )
    assert fit(QueuedRun(-1, "w", "a100", 1, 1, 50, 100.0), None) == (
        estimates.Start(-1, None, why="tenant w has no quota for a100")
    )
    assert fit(QueuedRun(-1, "w", "h100", 1, 1, 50, 100.0), Quota(1)) == (
        estimates.Start(-1, None, why="no enabled cluster has h100 GPUs")
    )
    # Three whole nodes on a cluster of two: never.
    assert fit(QueuedRun(-1, "w", "a100", 3, 8, 50, 100.0), Quota(24)) == (
        estimates.Start(-1, None, why="it does not start within the 168 hours looked ahead")
    )


def test_first_fit_behind_a_run_without_an_estimate_has_none():
    forecast = estimates.simulate(
        two_nodes(), ends={1: 1000.0, 2: None}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    start = estimates.first_fit(
        forecast,
        run=QueuedRun(-1, "t", "a100", 1, 1, 50, 100.0),
        quota=Quota(16),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        levels={},
    )
    assert start == estimates.Start(-1, None, why="an earlier run of the tenant has no estimate")


def test_first_fit_says_how_far_the_forecast_looked():
    node = (ClusterNode("c", "a100", "gpu-1", 8),)
    run = QueuedRun(-1, "t", "a100", 1, 1, 50, 100.0)
    # From the first step to the end of the forecast: 3,600.3 hours, said as 3,600. A node
    # no step mentions has no free GPU.
    steps = (estimates.Step(3600.0, {}, {}), estimates.Step(10_800.0, {}, {}))
    looked = estimates.Forecast(starts={}, steps=steps, until=12_964_680.0, ready={})
    assert estimates.first_fit(
        looked, run=run, quota=Quota(8), nodes=node, levels={}
    ) == estimates.Start(-1, None, why="it does not start within the 3,600 hours looked ahead")
    # No step at all: it looked nowhere.
    empty = estimates.Forecast(starts={}, steps=(), until=12_961_080.0, ready={})
    assert estimates.first_fit(
        empty, run=run, quota=Quota(8), nodes=node, levels={}
    ) == estimates.Start(-1, None, why="it does not start within the 0 hours looked ahead")


def test_first_fit_keeps_a_required_topology_level_and_skips_clusters_without_it():
    # Cluster a has no topology; on b, n0 is alone under leaf l1, n1 and n2 share leaf l2,
    # and n2 is busy until 500.
    nodes = (
        ClusterNode("a", "a100", "a0", 8),
        *(
            ClusterNode("b", "a100", name, 8, path=("blk", leaf))
            for name, leaf in (("n0", "l1"), ("n1", "l2"), ("n2", "l2"))
        ),
    )
    steps = (
        estimates.Step(0.0, {"a/a0": 0, "b/n0": 8, "b/n1": 8, "b/n2": 0}, {}),
        estimates.Step(500.0, {"b/n2": 8}, {}),
    )
    forecast = estimates.Forecast(starts={}, steps=steps, until=10_000.0, ready={})
    levels = {"b": ("block", "leaf")}

    def fit(required: bool) -> estimates.Start:
        run = QueuedRun(-1, "t", "a100", 2, 8, 50, 0.0, topology_level="leaf",
                        topology_required=required)  # fmt: skip
        return estimates.first_fit(forecast, run=run, quota=Quota(16), nodes=nodes, levels=levels)

    # Required: both nodes under one leaf switch, so n1 and n2 once n2 is free.
    assert fit(True) == estimates.Start(-1, 500.0, "b", ("n1", "n2"))
    # Only preferred: at once, on the two free nodes under different leaves.
    assert fit(False) == estimates.Start(-1, 0.0, "b", ("n0", "n1"))


def test_a_run_that_borrowed_in_the_simulation_can_be_reclaimed_later():
    # t borrows the free node at once; when u's run on the other node ends, u's gang of two
    # nodes (within u's guarantee) reclaims it, and t's run starts again when the gang ends
    # with the 2,100 s it had left.
    snapshot = Snapshot(
        queued=(
            QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),
            QueuedRun(11, "u", "a100", 2, 8, 50, 2.0),
        ),
        held=(HeldRun(1, "u", "a100", "c", 8, 50, 0.0, False, ("c-a100-00",)),),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={("t", "a100"): Quota(0, borrow_limit=8), ("u", "a100"): Quota(16)},
        now=100.0,
    )
    forecast = estimates.simulate(
        snapshot, ends={1: 1000.0}, runtimes={10: 3000.0, 11: 600.0}, **EXACT
    )
    assert forecast.starts == {
        10: estimates.Start(10, 100.0, "c", ("c-a100-01",)),
        11: estimates.Start(11, 1000.0, "c", ("c-a100-00", "c-a100-01"), (1,)),
    }
    assert [(step.at, step.usage) for step in forecast.steps] == [
        (100.0, {"u/a100": 8, "t/a100": 8}),
        (1000.0, {"u/a100": 16, "t/a100": 0}),
        (1600.0, {"u/a100": 0, "t/a100": 8}),
        (3700.0, {"t/a100": 0}),
    ]


def test_a_gang_that_starves_in_the_simulation_keeps_the_nodes_it_waits_for():
    # t's gang needs both nodes; u's whole-node run could take node 00 when v's run there
    # ends at 1000, but by then (past the 500 s starvation limit, counted at each simulated
    # cycle) the gang is starving and holds it: it starts at 2000, u's run after it.
    snapshot = Snapshot(
        queued=(
            QueuedRun(10, "t", "a100", 2, 8, 50, 0.0),
            QueuedRun(11, "u", "a100", 1, 8, 50, 1.0),
        ),
        held=(
            HeldRun(1, "v", "a100", "c", 8, 50, 0.0, False, ("c-a100-00",)),
            HeldRun(2, "v", "a100", "c", 4, 50, 0.0, False, ("c-a100-01",)),
        ),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={key: Quota(16) for key in (("t", "a100"), ("u", "a100"), ("v", "a100"))},
        now=100.0,
        starvation_after_s=500.0,
    )
    forecast = estimates.simulate(
        snapshot, ends={1: 1000.0, 2: 2000.0}, runtimes={10: 600.0, 11: 3000.0}, **EXACT
    )
    assert forecast.starts == {
        10: estimates.Start(10, 2000.0, "c", ("c-a100-00", "c-a100-01"), (1, 2)),
        11: estimates.Start(11, 2600.0, "c", ("c-a100-00",), (10,)),
    }


def test_a_run_ending_on_a_cluster_the_snapshot_does_not_list_frees_nothing_listed():
    # Run 3 holds GPUs on a cluster that is no longer enabled: its end changes no free GPU.
    snapshot = two_nodes(
        held=(
            *two_nodes().held,
            HeldRun(3, "t", "a100", "gone", 8, 50, 0.0, False, ("g-0",)),
        )
    )
    forecast = estimates.simulate(
        snapshot, ends={1: 1000.0, 2: 2000.0, 3: 500.0}, runtimes={10: 500.0, 11: 300.0}, **EXACT
    )
    assert forecast.starts[11] == estimates.Start(11, 1000.0, "c", ("c-a100-00",), (1,))
    assert [(step.at, step.free) for step in forecast.steps[:2]] == [
        (100.0, {"c/c-a100-00": 0, "c/c-a100-01": 0}),
        (500.0, {}),
    ]


def test_a_closed_node_without_a_reason_is_said_to_take_no_work():
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),),
        held=(),
        nodes=(ClusterNode("c", "a100", "gpu-1", 8, schedulable=False),),
        quotas={("t", "a100"): Quota(8)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0}, **EXACT)
    assert forecast.starts[10].why == "no bound: gpu-1 (takes no work) takes no work"


def test_a_line_longer_than_its_front_starts_whole_when_all_of_it_fits():
    # Nine one-GPU runs of one tenant and 16 free GPUs: every run starts in the first cycle,
    # the line's front deepened twice (2, 8, 32) as each whole front is admitted.
    snapshot = Snapshot(
        queued=tuple(QueuedRun(10 + i, "t", "a100", 1, 1, 50, float(i)) for i in range(9)),
        held=(),
        nodes=nodes_of(Pool("c", "a100", 2, 8)),
        quotas={("t", "a100"): Quota(16)},
        now=100.0,
    )
    forecast = estimates.simulate(
        snapshot, ends={}, runtimes={10 + i: 600.0 for i in range(9)}, **EXACT
    )
    assert {run_id: start.at for run_id, start in forecast.starts.items()} == {
        10 + i: 100.0 for i in range(9)
    }
    assert forecast.steps[0].usage == {"t/a100": 9}


def test_a_run_started_in_the_simulation_holds_the_node_it_was_placed_on():
    # Run 10 takes the whole 4-GPU node n0 at once. When run 1 frees the 8-GPU node n1, run
    # 11 fits there: admission must know run 10 is on n0 (a run with unknown nodes would be
    # assumed on n1, the node with the most free GPUs, and 11 would wait for run 10's end).
    snapshot = Snapshot(
        queued=(
            QueuedRun(10, "t", "a100", 1, 4, 50, 1.0),
            QueuedRun(11, "u", "a100", 1, 8, 50, 2.0),
        ),
        held=(HeldRun(1, "v", "a100", "c", 8, 50, 0.0, False, ("n1",)),),
        nodes=(ClusterNode("c", "a100", "n0", 4), ClusterNode("c", "a100", "n1", 8)),
        quotas={key: Quota(16) for key in (("t", "a100"), ("u", "a100"), ("v", "a100"))},
        now=100.0,
    )
    forecast = estimates.simulate(
        snapshot, ends={1: 500.0}, runtimes={10: 3000.0, 11: 600.0}, **EXACT
    )
    assert forecast.starts == {
        10: estimates.Start(10, 100.0, "c", ("n0",), ()),
        11: estimates.Start(11, 500.0, "c", ("n1",), (1,)),
    }


def test_every_kind_of_unbounded_hold_is_named_in_the_plural_too():
    # Two closed nodes, one busy from outside, two runs ahead without a maximum runtime.
    nodes = (
        ClusterNode("c", "a100", "gpu-1", 8, outside=2),
        ClusterNode("c", "a100", "gpu-2", 8, schedulable=False),
        ClusterNode("c", "a100", "gpu-3", 8, schedulable=False, reason="drained"),
        ClusterNode("c", "a100", "gpu-4", 8),
        ClusterNode("c", "a100", "gpu-5", 8),
    )
    snapshot = Snapshot(
        queued=(QueuedRun(10, "t", "a100", 1, 8, 50, 1.0),),
        held=(
            HeldRun(1, "u", "a100", "c", 8, 50, 0.0, False, ("gpu-4",)),
            HeldRun(2, "u", "a100", "c", 8, 50, 0.0, False, ("gpu-5",)),
        ),
        nodes=nodes,
        quotas={("t", "a100"): Quota(16), ("u", "a100"): Quota(16)},
        now=100.0,
    )
    forecast = estimates.simulate(snapshot, ends={}, runtimes={10: 60.0}, **EXACT)
    assert forecast.starts[10] == estimates.Start(
        10,
        None,
        why="no bound: gpu-1 is busy with jobs from outside Gantry, whose end is unknown; "
        "gpu-2 (takes no work), gpu-3 (drained) take no work; "
        "2 runs ahead have no maximum runtime",
    )


def test_a_preempted_run_goes_back_in_line_by_when_it_was_admitted():
    # u's preempted run (admitted at 0) is back in u's line ahead of u's run 12 (submitted
    # at 5): it restarts when t's run ends and holds the node again for the 4,900 s it had
    # left, so run 12 starts after it.
    snapshot = replace(
        borrower(), queued=(*borrower().queued, QueuedRun(12, "u", "a100", 1, 8, 50, 5.0))
    )
    forecast = estimates.simulate(
        snapshot, ends={1: 5000.0}, runtimes={10: 600.0, 12: 300.0}, **EXACT
    )
    assert forecast.starts == {
        10: estimates.Start(10, 100.0, "c", ("c-a100-00",), ()),
        12: estimates.Start(12, 5600.0, "c", ("c-a100-00",), (1,)),
    }


def test_runs_started_in_the_simulation_end_by_their_max_runtime_as_held_runs(monkeypatch):
    # Admission's backfill reads a held run's latest end: the simulation gives the runs it
    # starts theirs (start + max runtime, whatever they are expected to take) and keeps
    # those of the snapshot's held runs.
    seen: list[tuple[float, dict[int, float | None]]] = []
    real_decide = estimates.estimates_state.decide

    def decide(snapshot, state, *args, **kwargs):
        # What the cycle's backfill reads of the runs holding GPUs (``CycleState``).
        seen.append((snapshot.now, dict(state.latest_end)))
        return real_decide(snapshot, state, *args, **kwargs)

    monkeypatch.setattr(estimates.estimates_state, "decide", decide)
    snapshot = two_nodes()
    small = replace(snapshot.queued[1], max_runtime_s=900.0)
    held = (snapshot.held[0], replace(snapshot.held[1], latest_end=2500.0))

    forecast = estimates.simulate(
        replace(snapshot, queued=(snapshot.queued[0], small), held=held),
        ends={1: 1000.0, 2: 2000.0},
        runtimes={10: 500.0, 11: 5000.0},
        **EXACT,
    )

    assert forecast.starts[11].at == 1000.0
    assert seen[:3] == [
        (100.0, {1: None, 2: 2500.0}),
        (1000.0, {2: 2500.0}),  # run 1 has left; run 11 starts in this cycle
        (2000.0, {11: 1900.0}),  # 1000 + its 900 s max runtime, not its 5000 s expected
    ]
