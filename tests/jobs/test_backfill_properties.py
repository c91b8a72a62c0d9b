"""Backfill's guarantees, checked on random queues (issue 35, point 3).

Every queue here is run through time the way the platform runs it: an admission cycle
(``jobs.admission.decide``) at each moment a run ends, runs holding their GPUs from the
cycle that admits them until they end, each within its maximum runtime.

What is guaranteed (docs/admission.md, "Backfill"), and checked:

- for the runs of one tenant with whole-node gangs, the first in line starts under
  ``backfill`` no later than its latest start under ``strict`` (the time it starts when
  every run ends at its maximum runtime and nothing passes it), however long the runs
  that passed it actually ran;
- no node is ever given more GPUs than it has, under every policy and with several
  tenants, shapes and policies mixed;
- a run that starves (S seconds in line) starts within S + M + one cycle, M bounding
  every runtime, under ``backfill`` as under ``strict``;
- the decisions depend only on the snapshot.

What is not: another tenant's runs are not held back by a head's reservation (as under
``strict``), so across tenants the head's start is bounded only by the starvation rule.
"""

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.admission import decide
from jobs.admission_types import (
    ClusterNode,
    HeldRun,
    QueuedRun,
    Queueing,
    Quota,
    Snapshot,
)

NOW = 1_800_000_000.0
HOUR = 3600.0
GPUS = 8  # per node


@dataclass(frozen=True)
class Case:
    snapshot: Snapshot
    runtime: dict[int, float]  # run id -> how long it actually holds its GPUs
    held_end: dict[int, float]  # held run id -> when it actually ends


@st.composite
def one_tenant_whole_nodes(draw) -> Case:
    """One tenant, one cluster of 2-6 nodes of 8 GPUs (one maybe drained), some held by
    runs that end within their bound, and a queue of whole-node gangs."""
    count = draw(st.integers(2, 6))
    drained = draw(st.integers(-1, count - 1))
    nodes = tuple(
        ClusterNode("c", "a100", f"n{i}", GPUS, schedulable=i != drained, reason="drained")
        for i in range(count)
    )
    held, held_end = [], {}
    for i in range(count):
        if i == drained or not draw(st.booleans()):
            continue
        bound = draw(st.sampled_from([0.5, 1, 2, 3, 5, 8])) * HOUR
        share = draw(st.sampled_from([0.25, 0.5, 1.0]))
        run_id = 100 + i
        held.append(
            HeldRun(run_id, "alpha", "a100", "c", GPUS, 0, NOW - HOUR, False, (f"n{i}",),
                    latest_end=NOW + bound)
        )  # fmt: skip
        held_end[run_id] = NOW + bound * share
    queued, runtime = [], {}
    for run_id in range(1, draw(st.integers(2, 7)) + 1):
        bound = draw(st.sampled_from([None, 0.25, 0.5, 1, 2, 4, 8]))
        share = draw(st.sampled_from([0.1, 0.5, 1.0]))
        queued.append(
            QueuedRun(run_id, "alpha", "a100", draw(st.integers(1, max(1, count - 1))), GPUS,
                      0, NOW - 100 + run_id,
                      max_runtime_s=None if bound is None else bound * HOUR)
        )  # fmt: skip
        runtime[run_id] = (bound or 6) * HOUR * share
    snapshot = Snapshot(
        queued=tuple(queued), held=tuple(held), nodes=nodes,
        quotas={("alpha", "a100"): Quota(guaranteed=count * GPUS)}, now=NOW,
    )  # fmt: skip
    return Case(snapshot, runtime, held_end)


def run_through(case: Case, policy: Queueing, *, at_bounds: bool = False, every: float = math.inf):
    """Start times by run id, with a check at every cycle that no node is over-committed.
    ``at_bounds``: every run holds its GPUs for its whole maximum runtime. Cycles run when a
    run ends and, if ``every`` is finite, that often besides."""
    snapshot = case.snapshot
    if policy is not None:
        snapshot = replace(snapshot, queueing=dict.fromkeys(snapshot.queueing or ["c"], policy))
    capacity = {(node.cluster, node.name): node.gpus - node.outside for node in snapshot.nodes}
    held = {run.id: run for run in snapshot.held}
    ends = {
        run.id: (run.latest_end if at_bounds else case.held_end[run.id]) for run in snapshot.held
    }
    queue = {run.id: run for run in snapshot.queued}
    original = dict(queue)
    starts: dict[int, float] = {}
    now = snapshot.now
    for _ in range(2000):
        if not queue:
            break
        cycle = replace(snapshot, queued=tuple(queue.values()), held=tuple(held.values()), now=now)
        decisions = decide(cycle)
        for preempted in decisions.preempted:  # back in line, with its earlier place
            held.pop(preempted.run_id)
            del ends[preempted.run_id]
            queue[preempted.run_id] = original[preempted.run_id]
        for admit in decisions.admitted:
            run = queue.pop(admit.run_id)
            starts[run.id] = now
            bound = run.max_runtime_s
            held[run.id] = HeldRun(
                run.id, run.tenant, run.flavor, admit.cluster, run.gpus, run.priority, now,
                admit.borrowed, admit.nodes,
                latest_end=None if bound is None else now + bound,
            )  # fmt: skip
            runtime = bound if at_bounds and bound is not None else case.runtime[run.id]
            ends[run.id] = now + runtime
        used: dict[tuple[str, str], int] = defaultdict(int)
        for run in held.values():
            for name in run.nodes:
                used[(run.cluster, name)] += run.gpus // len(run.nodes)
        assert all(used[name] <= capacity[name] for name in used), used
        upcoming = [end for end in ends.values() if end is not None and end > now]
        if not upcoming:
            break
        now = min(*upcoming, now + every)
        for run_id in [run_id for run_id, end in ends.items() if end is not None and end <= now]:
            held.pop(run_id)
            del ends[run_id]
    return starts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_tenant_whole_nodes())
def test_backfill_never_starts_the_head_later_than_its_latest_start_under_strict(case):
    latest = run_through(case, Queueing.STRICT, at_bounds=True).get(1, math.inf)
    for policy_starts in (run_through(case, Queueing.BACKFILL),):
        assert policy_starts.get(1, math.inf) <= latest


@st.composite
def mixed(draw) -> Case:
    """Two tenants, shapes of every kind, load from outside Gantry, one policy per cluster
    and maybe a tenant's own: for the checks that hold whatever the mix."""
    clusters = ("c", "d")[: draw(st.integers(1, 2))]
    nodes = tuple(
        ClusterNode(cluster, "a100", f"{cluster}{i}", GPUS,
                    outside=draw(st.sampled_from([0, 0, 2, 6])), path=("spine", f"leaf{i // 2}"))
        for cluster in clusters
        for i in range(draw(st.integers(1, 4)))
    )  # fmt: skip
    policies = st.sampled_from(list(Queueing))
    queued, runtime = [], {}
    for run_id in range(1, draw(st.integers(1, 10)) + 1):
        bound = draw(st.sampled_from([None, 0.5, 1, 3]))
        queued.append(
            QueuedRun(run_id, draw(st.sampled_from(["alpha", "beta"])), "a100",
                      draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4, 8])),
                      draw(st.integers(0, 1)), NOW - 1000 + run_id,
                      topology_level="leaf", topology_required=draw(st.booleans()),
                      max_runtime_s=None if bound is None else bound * HOUR)
        )  # fmt: skip
        runtime[run_id] = (bound or 2) * HOUR * draw(st.sampled_from([0.2, 1.0]))
    snapshot = Snapshot(
        queued=tuple(queued), held=(), nodes=nodes,
        quotas={("alpha", "a100"): Quota(16, 16), ("beta", "a100"): Quota(8, 24)},
        now=NOW, starvation_after_s=draw(st.sampled_from([math.inf, 0.0, 1800.0])),
        levels=dict.fromkeys(clusters, ("spine", "leaf")),
        queueing={cluster: draw(policies) for cluster in clusters},
        tenant_queueing=draw(st.sampled_from([{}, {"alpha": Queueing.BACKFILL},
                                              {"beta": Queueing.STRICT}])),
    )  # fmt: skip
    return Case(snapshot, runtime, {})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed())
def test_no_node_is_ever_over_committed_and_the_decisions_depend_only_on_the_snapshot(case):
    run_through(case, None, every=900.0)  # checks every node at every cycle
    snapshot = case.snapshot
    assert decide(snapshot) == decide(replace(snapshot, queued=snapshot.queued[::-1]))
    capacity = {(n.cluster, n.name): n.gpus - n.outside for n in snapshot.nodes}
    used: dict[tuple[str, str], int] = defaultdict(int)
    decisions = decide(snapshot)
    by_id = {run.id: run for run in snapshot.queued}
    for admit in decisions.admitted:
        run = by_id[admit.run_id]
        assert len(admit.nodes) == run.nodes
        for name in admit.nodes:
            used[(admit.cluster, name)] += run.gpus_per_node
        if admit.ahead_of is not None:
            head = by_id[admit.ahead_of]
            assert (head.tenant, head.flavor) == (run.tenant, run.flavor)
            assert admit.ahead_of not in {a.run_id for a in decisions.admitted}
    assert all(used[key] <= capacity[key] for key in used)


@st.composite
def starving(draw) -> tuple[Case, float, float]:
    """One tenant's big whole-node run first in line behind a stream of its own small
    runs, each within M; the big one starves after S."""
    case = draw(one_tenant_whole_nodes())
    starve_after = draw(st.sampled_from([0.0, 600.0, 1800.0]))
    bound = 8 * HOUR  # the largest maximum runtime drawn
    queued = tuple(
        replace(run, max_runtime_s=run.max_runtime_s or bound) for run in case.snapshot.queued
    )
    snapshot = replace(case.snapshot, queued=queued, starvation_after_s=starve_after)
    return replace(case, snapshot=snapshot), starve_after, bound


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(starving())
def test_a_starving_head_starts_within_s_plus_m_under_backfill(drawn):
    case, starve_after, bound = drawn
    head = case.snapshot.queued[0]
    capacity = sum(1 for node in case.snapshot.nodes if node.schedulable)
    tick = 600.0
    starts = run_through(case, Queueing.BACKFILL, every=tick)
    if head.nodes <= capacity:
        # The first cycle at or after S (within one tick of it) holds its nodes; every run
        # on them then ends within M.
        assert starts[head.id] <= head.submitted + starve_after + tick + bound
