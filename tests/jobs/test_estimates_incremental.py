"""The start-estimate simulation made incremental (issue 38, point 4): ``jobs.estimates.simulate``
must forecast exactly as the simulation it replaced, kept as ``simulate_reference`` in
bench/estimates_reference.py: the same starts (time, cluster, nodes, the runs behind, the
reason without a number), the same steps, the same readiness, on every snapshot.

The snapshots are the admission properties' (tests/jobs/test_admission_properties.py: 1-3
clusters with 0-2 topology levels, drained nodes, outside load, held runs on known and on
unknown nodes, borrowed ones to reclaim, quotas with borrowing, per-run limits, budgets and
weights, a starvation bound or none), given besides what only the simulation reads: the
clusters' and tenants' queueing policies, maximum runtimes (or none), nodes a run is kept
off, jobs from outside Gantry waiting for the clusters, the placement grace, when each held
run ends (never, already, later) and how long each queued run holds its GPUs; on an exact
time grid or the product's, over a horizon of hours or a week, with the cycles running out
or not. Then a few platforms of a few dozen nodes with long lines, where lines are deepened,
starving heads reserve in many cycles and preemptions send runs back to the queue.
Derandomized: CI runs the same examples every time.
"""

import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.estimates_reference import simulate_reference
from clusters.outside_claims import OutsideClaim, OutsideQueue
from jobs import estimates
from jobs.admission_state import CycleState
from jobs.admission_types import ClusterNode, HeldRun, QueuedRun, Queueing, Quota, Snapshot
from jobs.estimates_lines import Lines
from jobs.estimates_pool import SimPool
from jobs.estimates_state import Clusters, decide_flavor
from tests.jobs.test_admission_properties import (
    NOW,
    between,
    pick,
    snapshots,
    snapshots_with_a_reclaimable_head,
)

EXAMPLES = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
POLICIES = (Queueing.STRICT, Queueing.BACKFILL, Queueing.BEST_EFFORT)
STRICTER = (Queueing.STRICT, *POLICIES)  # strict half the time
EXACT = {"resolution": 0.0, "min_step_s": 0.0}
GRIDS = (
    {},  # the product's: 5 % of the distance, at least a minute
    EXACT,
    {"resolution": 0.2, "min_step_s": 600.0},
)
# (horizon, cycles): a week and the product's 200; three hours; cycles running out.
REACH = ((7 * 86_400.0, 200), (3 * 3_600.0, 200), (7 * 86_400.0, 6))


@st.composite
def cases(draw):
    """A snapshot with what the simulation reads beyond admission's, and its settings."""
    snapshot = draw(snapshots() | snapshots_with_a_reclaimable_head())
    clusters = sorted({node.cluster for node in snapshot.nodes})
    tenants = sorted({run.tenant for run in (*snapshot.queued, *snapshot.held)})
    queueing = {cluster: pick(draw, POLICIES) for cluster in clusters if pick(draw, (True, False))}
    tenant_queueing = {
        tenant: pick(draw, POLICIES) for tenant in tenants if between(draw, 0, 3) == 0
    }
    names = {flavor: [] for flavor in {node.flavor for node in snapshot.nodes}}
    for node in snapshot.nodes:
        names[node.flavor].append(node.name)
    queued = []
    for run in snapshot.queued:
        limit = pick(draw, (3_600.0, None, 600.0, 7_200.0, 36_000.0))
        excluded: tuple[str, ...] = ()
        if names.get(run.flavor) and between(draw, 0, 5) == 0:
            excluded = (pick(draw, sorted(names[run.flavor])),)
        queued.append(replace(run, max_runtime_s=limit, excluded=excluded))
    held = [
        replace(
            run, latest_end=pick(draw, (None, run.admitted + 20_000.0, NOW - 60.0, NOW + 900.0))
        )
        for run in snapshot.held
    ]
    outside = {}
    for cluster in clusters:
        if between(draw, 0, 3) == 0 and names:
            claims = tuple(
                OutsideClaim(
                    job=f"Slurm job {index}",
                    flavor=pick(draw, sorted(names)),
                    nodes=between(draw, 1, 2),
                    gpus_per_node=pick(draw, (1, 4, 8)),
                )
                for index in range(between(draw, 1, 2))
            )
            outside[cluster] = OutsideQueue(reclaim_first=pick(draw, (False, True)), claims=claims)
    snapshot = replace(
        snapshot,
        queued=tuple(queued),
        held=tuple(held),
        queueing=queueing,
        tenant_queueing=tenant_queueing,
        outside=outside,
        start_grace_s=pick(draw, (0.0, 300.0)),
    )
    # When each held run frees its GPUs: later, already, or not known (None).
    ends = {
        run.id: pick(draw, (NOW + 1_800.0, None, NOW + 600.0, NOW + 7_200.0, NOW - 30.0))
        for run in snapshot.held
    }
    runtimes = {
        run.id: pick(draw, (1_200.0, None, 300.0, 3_600.0, 14_400.0)) for run in snapshot.queued
    }
    horizon_s, max_steps = pick(draw, REACH)
    grid = pick(draw, GRIDS)
    return snapshot, ends, runtimes, {"horizon_s": horizon_s, "max_steps": max_steps, **grid}


def forecasts(snapshot: Snapshot, ends, runtimes, params):
    return (
        estimates.simulate(snapshot, ends=ends, runtimes=runtimes, **params),
        simulate_reference(snapshot, ends=ends, runtimes=runtimes, **params),
    )


@EXAMPLES
@given(cases())
def test_the_incremental_simulation_forecasts_exactly_as_the_one_it_replaced(case):
    snapshot, ends, runtimes, params = case
    incremental, reference = forecasts(snapshot, ends, runtimes, params)
    assert incremental == reference


def platform(seed: int) -> tuple[Snapshot, dict[int, float | None], dict[int, float | None]]:
    """A busy platform of a few dozen nodes: 2 clusters × 2 flavors of 4-8 nodes (one
    cluster with a block/leaf topology, some outside load, a drained node), 8 tenants with
    guarantees, borrowing, limits and budgets, the nodes 90 % held (a third borrowed, some on
    unknown nodes), and 150 runs in line, most starving within the first cycles, under
    ``strict`` or mixed policies."""
    rng = random.Random(seed)
    nodes = []
    for cluster in ("c1", "c2"):
        for flavor in ("a100", "h100"):
            for index in range(rng.randint(4, 8)):
                nodes.append(
                    ClusterNode(
                        cluster, flavor, f"{cluster}-{flavor}-{index:02d}", rng.choice((8, 8, 4)),
                        outside=rng.choice((0,) * 9 + (2,)),
                        schedulable=index != 3 or cluster != "c2",
                        path=(f"b{index // 4}", f"l{index // 2}") if cluster == "c1" else (),
                    )
                )  # fmt: skip
    tenants = [f"t{i}" for i in range(8)]
    quotas = {
        (tenant, flavor): Quota(
            guaranteed=rng.choice((0, 4, 8, 16)),
            borrow_limit=rng.choice((0, 8, 32)),
            max_gpus_per_run=rng.choice((None, None, None, 8)),
            budget_gpu_hours=rng.choice((None,) * 9 + (10.0,)),
            budget_hard=rng.choice((True, False)),
            weight=rng.choice((1, 2, 4)),
        )
        for tenant in tenants
        for flavor in ("a100", "h100")
        if rng.random() < 0.9
    }
    room = {node.name: node.gpus - node.outside for node in nodes}
    held, next_id = [], 1
    for node in nodes:
        while room[node.name] > node.gpus * 0.1:
            gpus = rng.choice((1, 2, 4, 8))
            if gpus > room[node.name]:
                break
            room[node.name] -= gpus
            held.append(
                HeldRun(
                    next_id, rng.choice(tenants), node.flavor, node.cluster, gpus,
                    rng.choice((10, 50, 90)), NOW - rng.uniform(600, 20_000),
                    borrowed=rng.random() < 0.33,
                    nodes=(node.name,) if rng.random() < 0.9 else (),
                    latest_end=rng.choice((None, NOW + rng.uniform(0, 30_000))),
                )
            )  # fmt: skip
            next_id += 1
    queued = []
    for _ in range(150):
        count, per_node = rng.choice(((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (3, 8)))
        queued.append(
            QueuedRun(
                next_id, rng.choice(tenants), rng.choice(("a100", "h100")), count, per_node,
                rng.choice((10, 50, 50, 90)), NOW - rng.uniform(0, 5_400),
                topology_level="leaf" if count > 1 and rng.random() < 0.3 else "",
                topology_required=rng.random() < 0.5,
                max_runtime_s=rng.choice((3_600.0, 7_200.0, 28_800.0, 28_800.0, None)),
            )
        )  # fmt: skip
        next_id += 1
    snapshot = Snapshot(
        queued=tuple(queued),
        held=tuple(held),
        nodes=tuple(nodes),
        quotas=quotas,
        budget_used={key: rng.choice((0.0, 20.0)) for key in quotas},
        decayed_usage={key: rng.uniform(0, 10**6) for key in quotas},
        now=NOW,
        starvation_after_s=1_800.0,
        levels={"c1": ("block", "leaf")},
        queueing={"c1": rng.choice(STRICTER), "c2": rng.choice(STRICTER)},
        tenant_queueing={tenants[0]: rng.choice(POLICIES)} if rng.random() < 0.3 else {},
    )
    ends = {run.id: None if rng.random() < 0.05 else NOW + rng.uniform(0, 40_000) for run in held}
    runtimes = {run.id: None if rng.random() < 0.05 else rng.uniform(600, 20_000) for run in queued}
    return snapshot, ends, runtimes


@settings(EXAMPLES, max_examples=25)
@given(st.integers(0, 10**6))
def test_on_busy_platforms_with_long_lines_it_forecasts_exactly_as_the_one_it_replaced(seed):
    snapshot, ends, runtimes = platform(seed)
    incremental, reference = forecasts(snapshot, ends, runtimes, {})
    assert incremental == reference
    # Not a vacuous case: runs start over many cycles, some behind others.
    assert len(reference.steps) > 10
    assert sum(start.at is not None for start in reference.starts.values()) > 10


# The simulation's pools and cycle state answer as admission's own, change after change
# (issue 38, point 4: ``jobs.estimates_pool.SimPool`` places gangs from the nodes with GPUs
# available, decides whether a gang could fit from its tally in one pass and remembers a
# starving run's closest nodes; ``LazyState`` finds a one-node gang's best node over every
# pool at once and undoes what a cycle changed of the kept state instead of copying it).
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 4), (2, 8), (3, 8), (4, 8))


def some_run(rng: random.Random, flavor: str, names: list[str]) -> QueuedRun:
    count, per_node = rng.choice(SHAPES)
    return QueuedRun(
        10**6 + rng.randrange(1000), "t0", flavor, count, per_node, 50, NOW,
        topology_level=rng.choice(("", "leaf", "block", "rack")),
        topology_required=rng.random() < 0.5,
        excluded=tuple(rng.sample(names, 1)) if names and rng.random() < 0.2 else (),
    )  # fmt: skip


@settings(EXAMPLES, max_examples=40)
@given(st.integers(0, 10**6))
def test_the_simulations_pools_answer_as_admissions_change_after_change(seed):
    snapshot, _, _ = platform(seed)
    rng = random.Random(seed)
    kept = CycleState(snapshot)  # admission's pools
    pools = {key: SimPool.of(pool) for key, pool in CycleState(snapshot).pools.items()}
    starts = sorted({run.submitted + snapshot.starvation_after_s for run in snapshot.queued})
    asked = 0
    for _ in range(60):
        key = rng.choice(sorted(pools))
        theirs, ours = kept.pools[key], pools[key]
        names = sorted(theirs.nodes)
        name = rng.choice(names)
        change = rng.randrange(4)
        if change == 0 and theirs.available(name):
            gpus = rng.randint(1, theirs.available(name))
            theirs.take(name, gpus), ours.take(name, gpus)
            theirs.entered[name] = ours.entered[name] = NOW + rng.uniform(0, 100)
        elif change == 1:
            theirs.give(name, 1), ours.give(name, 1)
        elif change == 2 and theirs.available(name):
            theirs.hold(name, 1), ours.hold(name, 1)
        else:
            theirs.fence(name), ours.fence(name)
        for _ in range(5):
            run = some_run(rng, key[1], names)
            assert ours.place(run) == theirs.place(run)
            assert ours.could_fit(run.nodes, run.gpus_per_node) == theirs.could_fit(
                run.nodes, run.gpus_per_node
            )
            since = rng.choice(starts)
            assert ours.closest(run, since) == theirs.closest(run, since)
            asked += ours.place(run) is not None
    assert asked > 0  # not a vacuous case: some gangs fit


@settings(EXAMPLES, max_examples=40)
@given(st.integers(0, 10**6))
def test_a_simulated_cycle_finds_the_best_fit_as_admission_and_leaves_the_kept_state_as_it_was(
    seed,
):
    snapshot, _, _ = platform(seed)
    rng = random.Random(seed)
    clusters = Clusters(snapshot)
    admission_state = CycleState(snapshot)
    for flavor in ("a100", "h100"):
        state = clusters.cycle_state((flavor,), NOW)
        names = sorted(node.name for node in snapshot.nodes if node.flavor == flavor)
        for run in [
            *(r for r in snapshot.queued if r.flavor == flavor),
            *(some_run(rng, flavor, names) for _ in range(20)),
        ]:
            ours, theirs = state.best_fit(run), admission_state.best_fit(run)
            assert (ours and (ours[0].cluster, ours[1])) == (
                theirs and (theirs[0].cluster, theirs[1])
            )
        state.restore()
    for run in snapshot.held[::2]:  # half the held runs end: the cycles admit
        clusters.remove(run.id)
    before = (
        {key: gpus for key, gpus in clusters.base.usage.items() if gpus},
        dict(clusters.base.held_on),
        dict(clusters.base.pool_of),
        dict(clusters.base.latest_end),
    )
    admitted = 0
    for flavor in ("a100", "h100"):
        lines = Lines(run for run in snapshot.queued if run.flavor == flavor)
        decisions, _ = decide_flavor(
            replace(snapshot, now=NOW + 3_600.0), clusters, lines, flavor, passable=set()
        )
        admitted += len(decisions.admitted)
    assert admitted > 0  # not a vacuous case: the cycles changed the state
    after = (
        {key: gpus for key, gpus in clusters.base.usage.items() if gpus},
        clusters.base.held_on,
        clusters.base.pool_of,
        clusters.base.latest_end,
    )
    assert after == before
