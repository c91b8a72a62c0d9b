"""The pure admission function: gang fit, guarantees, borrowing, preemption, fair share,
budgets, priority/FIFO, reasons, positions, reservations."""

from dataclasses import replace

from jobs.admission import decide, free_gpus, held_placements
from jobs.admission_types import (
    Admit,
    ClusterNode,
    HeldRun,
    Pool,
    QueuedRun,
    Quota,
    Reservation,
    Snapshot,
    Wait,
    Waiting,
    nodes_of,
)
from jobs.reclaim import OutsideClaim, OutsideQueue

POOL = Pool("c1", "a100", nodes=4, gpus_per_node=8)


def run(id, tenant="vision", flavor="a100", nodes=1, gpn=8, priority=50, submitted=None):
    return QueuedRun(
        id=id,
        tenant=tenant,
        flavor=flavor,
        nodes=nodes,
        gpus_per_node=gpn,
        priority=priority,
        submitted=float(id if submitted is None else submitted),
    )


def held(id, tenant, gpus, *, borrowed=False, priority=50, admitted=0.0, cluster="c1"):
    return HeldRun(id, tenant, "a100", cluster, gpus, priority, admitted, borrowed)


def snapshot(
    queued, *, held_runs=(), pools=(POOL,), quotas=None, budget=None, decayed=None, now=0.0
):
    return Snapshot(
        queued=tuple(queued),
        held=tuple(held_runs),
        nodes=nodes_of(*pools),
        quotas=quotas or {("vision", "a100"): Quota(32), ("nlp", "a100"): Quota(32)},
        budget_used=budget or {},
        decayed_usage=decayed or {},
        now=now,
        starvation_after_s=600,
    )


def admitted(decisions):
    return [(a.run_id, a.cluster, a.borrowed) for a in decisions.admitted]


def waiting(decisions):
    return [(w.run_id, w.reason, w.position) for w in decisions.waiting]


def test_gang_is_all_or_nothing_and_the_rest_waits_with_position():
    decisions = decide(snapshot([run(1, nodes=3), run(2, nodes=2, tenant="nlp")]))
    assert admitted(decisions) == [(1, "c1", False)]
    assert waiting(decisions) == [(2, Wait.CAPACITY, 1)]
    # Both tenants' guarantees (32 each) exceed the 32 GPUs: the wait says so.
    assert decisions.waiting[0].message == (
        "needs 2 nodes × 8 a100 GPUs; 8 a100 GPUs are free, at most 8 on any node "
        "(c1-a100-00: 0, c1-a100-01: 0, c1-a100-02: 0, c1-a100-03: 8); the a100 guarantees of "
        "all tenants add up to "
        "more than the 32 GPUs the clusters have, so not all can be kept at once"
    )


def test_beyond_guarantee_without_borrowing_waits_with_quota_reason():
    decisions = decide(
        snapshot(
            [run(1, gpn=4)],
            held_runs=[held(9, "vision", 14)],
            quotas={("vision", "a100"): Quota(16)},
        )
    )
    assert decisions.admitted == ()
    assert decisions.waiting[0].reason == Wait.QUOTA
    assert decisions.waiting[0].message == (
        "tenant vision uses 14 of 16 guaranteed a100 GPUs and may not borrow; this run needs 4"
    )


def test_borrowing_uses_idle_gpus_up_to_the_limit_and_is_marked_preemptible():
    quotas = {("vision", "a100"): Quota(8, borrow_limit=8)}
    decisions = decide(snapshot([run(1), run(2), run(3)], quotas=quotas))
    assert admitted(decisions) == [(1, "c1", False), (2, "c1", True)]
    assert decisions.waiting[0].reason == Wait.BORROW_LIMIT
    assert decisions.waiting[0].message == (
        "tenant vision uses 16 of 8 guaranteed + 8 borrowable a100 GPUs; this run needs 8"
    )


def test_borrowing_never_preempts_and_says_there_is_nothing_idle():
    quotas = {("vision", "a100"): Quota(8, borrow_limit=32), ("nlp", "a100"): Quota(32)}
    decisions = decide(
        snapshot([run(1)], held_runs=[held(9, "vision", 8), held(10, "nlp", 24)], quotas=quotas)
    )
    assert decisions.preempted == ()
    assert decisions.waiting[0].reason == Wait.NO_IDLE
    assert decisions.waiting[0].message == (
        "tenant vision uses 8 of 8 guaranteed a100 GPUs; to borrow idle ones, this run needs "
        "8 a100 GPUs on one node; 0 a100 GPUs are free, at most 0 on any node "
        "(c1-a100-00: 0, c1-a100-01: 0, c1-a100-02: 0, c1-a100-03: 0)"
    )


def test_guarantee_reclaims_borrowed_gpus_lowest_priority_then_newest_smallest_set():
    quotas = {("vision", "a100"): Quota(16), ("nlp", "a100"): Quota(8, borrow_limit=24)}
    borrowed = [
        held(11, "nlp", 8, borrowed=True, priority=50, admitted=1.0),
        held(12, "nlp", 8, borrowed=True, priority=10, admitted=2.0),
        held(13, "nlp", 4, borrowed=True, priority=10, admitted=3.0),
        held(14, "nlp", 4, borrowed=True, priority=10, admitted=4.0),
    ]
    decisions = decide(
        snapshot(
            [run(1, gpn=8)],
            held_runs=[held(10, "nlp", 8), *borrowed],
            quotas=quotas,
        )
    )
    # 8 GPUs needed, none idle: the priority-10 runs go first, newest first (14, 13) free 8.
    assert admitted(decisions) == [(1, "c1", False)]
    assert [p.run_id for p in decisions.preempted] == [14, 13]
    # The preempted tenant reads no other tenant's name or run; platform admins read both.
    assert decisions.preempted[0].message == (
        "a tenant within its guarantee reclaimed 8 a100 GPUs on c1; this run had borrowed 4"
    )
    assert decisions.preempted[0].detail == (
        "tenant vision reclaimed 8 a100 GPUs of its guarantee on c1 for run 1; this run had "
        "borrowed 4"
    )


def test_victims_are_trimmed_to_what_is_needed():
    quotas = {("vision", "a100"): Quota(16), ("nlp", "a100"): Quota(0, borrow_limit=32)}
    borrowed = [
        held(11, "nlp", 2, borrowed=True, priority=10, admitted=5.0),
        held(12, "nlp", 8, borrowed=True, priority=20, admitted=1.0),
        held(13, "nlp", 22, borrowed=True, priority=30, admitted=1.0),
    ]
    decisions = decide(snapshot([run(1, gpn=8)], held_runs=borrowed, quotas=quotas))
    # Greedy takes 11 (2) then 12 (8); 11 is then unnecessary and is spared.
    assert [p.run_id for p in decisions.preempted] == [12]


def test_a_tenant_never_preempts_its_own_borrowed_runs():
    quotas = {("vision", "a100"): Quota(32, borrow_limit=0)}
    decisions = decide(
        snapshot([run(1)], held_runs=[held(9, "vision", 32, borrowed=True)], quotas=quotas)
    )
    assert decisions.preempted == ()
    assert decisions.waiting[0].reason == Wait.QUOTA


def test_fair_share_orders_competing_borrowers_by_decayed_usage_per_weight():
    quotas = {
        ("vision", "a100"): Quota(0, borrow_limit=32, weight=1),
        ("nlp", "a100"): Quota(0, borrow_limit=32, weight=4),
    }
    pools = (Pool("c1", "a100", nodes=1, gpus_per_node=8),)
    # vision used 1000 GPU-s with weight 1; nlp 2000 with weight 4: nlp's share is lower.
    decisions = decide(
        snapshot(
            [run(1, tenant="vision"), run(2, tenant="nlp")],
            pools=pools,
            quotas=quotas,
            decayed={("vision", "a100"): 1000.0, ("nlp", "a100"): 2000.0},
        )
    )
    assert admitted(decisions) == [(2, "c1", True)]
    assert waiting(decisions) == [(1, Wait.NO_IDLE, 1)]


def test_hard_budget_blocks_and_soft_budget_flags():
    quotas = {
        ("vision", "a100"): Quota(16, budget_gpu_hours=100, budget_hard=True),
        ("nlp", "a100"): Quota(16, budget_gpu_hours=100, budget_hard=False),
    }
    decisions = decide(
        snapshot(
            [run(1, tenant="vision"), run(2, tenant="nlp")],
            quotas=quotas,
            budget={("vision", "a100"): 100.0, ("nlp", "a100"): 250.5},
        )
    )
    assert [(a.run_id, a.over_budget) for a in decisions.admitted] == [(2, True)]
    assert decisions.waiting[0].reason == Wait.BUDGET_EXHAUSTED
    assert decisions.waiting[0].message == (
        "tenant vision has used 100 of its 100 a100 GPU-hour budget this month (hard limit)"
    )


def test_priority_first_then_fifo():
    pools = (Pool("c1", "a100", nodes=1, gpus_per_node=8),)
    queued = [run(1, gpn=8), run(2, gpn=8, priority=90), run(3, gpn=8, tenant="nlp")]
    decisions = decide(snapshot(queued, pools=pools))
    assert [a.run_id for a in decisions.admitted] == [2]
    assert [(w.run_id, w.position) for w in decisions.waiting] == [(1, 1), (3, 2)]


def test_a_blocked_head_holds_its_tenant_but_not_others():
    pools = (Pool("c1", "a100", nodes=2, gpus_per_node=8),)
    queued = [run(1, nodes=2), run(2, gpn=1), run(3, tenant="nlp", gpn=1)]
    decisions = decide(snapshot(queued, held_runs=[held(9, "nlp", 8)], pools=pools))
    assert [a.run_id for a in decisions.admitted] == [3]
    reasons = {w.run_id: w.reason for w in decisions.waiting}
    assert reasons == {1: Wait.CAPACITY, 2: Wait.BEHIND_HEAD}


def test_a_starving_run_reserves_idle_gpus_against_later_runs():
    pools = (Pool("c1", "a100", nodes=2, gpus_per_node=8),)
    queued = [run(1, nodes=2, submitted=0), run(2, tenant="nlp", gpn=4, submitted=700)]
    nlp_holds = [held(9, "nlp", 8)]
    # Waiting 500 s: not starving yet, so nlp's later run may use the idle GPUs.
    recent = decide(snapshot(queued, held_runs=nlp_holds, pools=pools, now=500))
    assert [a.run_id for a in recent.admitted] == [2]
    assert recent.reservations == ()
    # Waiting 800 s (> 600): run 1 holds the 8 idle GPUs; run 2 may not take them.
    starving = decide(snapshot(queued, held_runs=nlp_holds, pools=pools, now=800))
    assert starving.admitted == ()
    assert [(r.run_id, r.cluster, r.gpus) for r in starving.reservations] == [(1, "c1", 8)]
    # The later run is told why the 8 idle GPUs are not free for it (not "0 free" alone).
    assert {w.run_id: w.message for w in starving.waiting}[2] == (
        "needs 4 a100 GPUs on one node; 0 a100 GPUs are free, at most 0 on any node "
        "(c1-a100-00: 0, c1-a100-01: 0 (8 reserved for a long-waiting run))"
    )


def test_no_quota_and_too_large_have_their_own_reasons():
    quotas = {("vision", "a100"): Quota(16, max_gpus_per_run=4)}
    decisions = decide(snapshot([run(1, tenant="audio"), run(2, gpn=8)], quotas=quotas))
    assert {w.run_id: (w.reason, w.message) for w in decisions.waiting} == {
        1: (Wait.NO_QUOTA, "tenant audio has no quota for a100"),
        2: (Wait.TOO_LARGE, "asks for 8 a100 GPUs; tenant vision may use at most 4 per run"),
    }


def test_best_fit_prefers_the_pool_left_fullest_and_respects_node_shape():
    pools = (
        Pool("big", "a100", nodes=4, gpus_per_node=8),
        Pool("small", "a100", nodes=1, gpus_per_node=8),
        Pool("narrow", "a100", nodes=8, gpus_per_node=2),
    )
    decisions = decide(
        snapshot(
            [run(1, gpn=4), run(2, gpn=4)],
            held_runs=[held(9, "nlp", 4, cluster="small")],
            pools=pools,
        )
    )
    assert [(a.run_id, a.cluster) for a in decisions.admitted] == [(1, "small"), (2, "big")]


def test_same_snapshot_same_decisions():
    queued = [run(i, tenant=("vision", "nlp")[i % 2], gpn=1 + i % 8) for i in range(200)]
    first = decide(snapshot(queued))
    assert decide(snapshot(list(reversed(queued)))) == first


def test_between_clusters_the_tighter_domain_wins_over_leaving_less_behind_and_the_name():
    # Both clusters place the gang (2 nodes, 4 GPUs each): on "a" its nodes share only a
    # block (their leaves differ), on "b" they share a leaf. "b" leaves 8 GPUs behind on
    # them, "a" none, and "a" comes first by name: the tighter domain still wins.
    levels = ("block", "leaf")
    nodes = (
        ClusterNode("a", "a100", "a-0", 4, path=("b0", "b0-l0")),
        ClusterNode("a", "a100", "a-1", 4, path=("b0", "b0-l1")),
        ClusterNode("b", "a100", "b-0", 8, path=("b0", "b0-l0")),
        ClusterNode("b", "a100", "b-1", 8, path=("b0", "b0-l0")),
    )
    decisions = decide(
        Snapshot(
            queued=(run(1, nodes=2, gpn=4),),
            held=(),
            nodes=nodes,
            quotas={("vision", "a100"): Quota(32)},
            levels={"a": levels, "b": levels},
        )
    )
    assert decisions.admitted == (Admit(1, "b", nodes=("b-0", "b-1")),)
    assert decisions.waiting == ()


def test_reclaims_bring_two_tenants_back_within_their_guarantees_and_their_runs_go_in_line():
    # A and E are beyond their guarantees (their borrowed runs 1 and 2 fill nodes 00 and 01),
    # so their runs 10, 12 and 13 wait as borrowers while B's run 11 reclaims both nodes.
    # That brings A and E back within their guarantees: their three runs get a second pass,
    # in line (10, 13, 12, not tenant by tenant), and reclaim D's two borrowed halves of
    # node 03 (newest first); the third finds nothing left to reclaim.
    pool = Pool("c1", "a100", nodes=4, gpus_per_node=8)
    n0, n1, n2, n3 = (node.name for node in pool.expand())
    queued = [
        run(10, tenant="A", gpn=4, submitted=100),
        run(13, tenant="E", gpn=4, submitted=150),
        run(11, tenant="B", nodes=2, gpn=8, submitted=200),
        run(12, tenant="A", gpn=4, submitted=300),
    ]
    holding = [
        HeldRun(1, "A", "a100", "c1", 8, 0, 1.0, True, (n0,)),
        HeldRun(2, "E", "a100", "c1", 8, 0, 2.0, True, (n1,)),
        HeldRun(5, "C", "a100", "c1", 8, 50, 5.0, False, (n2,)),
        HeldRun(3, "D", "a100", "c1", 4, 50, 3.0, True, (n3,)),
        HeldRun(4, "D", "a100", "c1", 4, 50, 4.0, True, (n3,)),
    ]
    quotas = {
        ("A", "a100"): Quota(8, borrow_limit=8),
        ("E", "a100"): Quota(4, borrow_limit=8),
        ("B", "a100"): Quota(16),
        ("C", "a100"): Quota(8),
        ("D", "a100"): Quota(0, borrow_limit=8),
    }
    decisions = decide(snapshot(queued, held_runs=holding, pools=(pool,), quotas=quotas))

    assert decisions.admitted == (
        Admit(11, "c1", nodes=(n0, n1)),
        Admit(10, "c1", nodes=(n3,)),
        Admit(13, "c1", nodes=(n3,)),
    )
    assert [(p.run_id, p.by_run_id) for p in decisions.preempted] == [
        (2, 11),
        (1, 11),
        (4, 10),
        (3, 13),
    ]
    assert decisions.preempted[3].detail == (
        "tenant E reclaimed 4 a100 GPUs of its guarantee on c1 for run 13; this run had borrowed 4"
    )
    assert decisions.waiting == (
        Waiting(
            12,
            Wait.CAPACITY,
            "needs 4 a100 GPUs on one node; 0 a100 GPUs are free, at most 0 on any node "
            "(c1-a100-00: 0, c1-a100-01: 0, c1-a100-02: 0, c1-a100-03: 0); the a100 "
            "guarantees of all tenants add up to more than the 32 GPUs the clusters have, "
            "so not all can be kept at once",
            1,
        ),
    )
    assert decisions.reservations == ()


# Held runs as admission counts them: on known nodes an equal share each (the remainder to
# the first names), on unknown ones the nodes with the most free GPUs, oldest run first.
COUNTED = Snapshot(
    queued=(),
    held=(
        HeldRun(1, "vision", "a100", "c1", 5, 50, 2.0, False, ("c1-a100-01", "c1-a100-00")),
        HeldRun(2, "vision", "a100", "c1", 6, 50, 1.0, False),
        HeldRun(3, "vision", "a100", "gone", 8, 50, 0.0, False),  # a cluster not in the nodes
        HeldRun(4, "nlp", "h100", "c1", 2, 50, 0.0, True),
        HeldRun(5, "nlp", "a100", "c2", 12, 50, 0.0, True),
        HeldRun(6, "nlp", "a100", "c1", 4, 50, 0.5, False),
    ),
    nodes=(
        ClusterNode("c1", "a100", "c1-a100-00", 8, outside=2),
        ClusterNode("c1", "a100", "c1-a100-01", 8),
        ClusterNode("c1", "a100", "c1-a100-02", 8, schedulable=False, reason="drained: bad DIMM"),
        ClusterNode("c1", "h100", "c1-h100-00", 4, outside=5),  # outside load beyond its GPUs
        ClusterNode("c2", "a100", "c2-a100-00", 8),
    ),
    quotas={},
)


def test_held_runs_are_counted_on_their_nodes_or_where_most_gpus_are_free():
    assert held_placements(COUNTED) == {
        1: {"c1-a100-00": 3, "c1-a100-01": 2},
        # Run 6 is older than run 2: it goes first, onto the drained node's 8 free GPUs
        # (a drained node still runs what it has); run 2 then onto node 01 (6 free).
        6: {"c1-a100-02": 4},
        2: {"c1-a100-01": 6},
        4: {},  # nothing free on its only node: counted, on no node
        5: {"c2-a100-00": 8},  # 12 GPUs, 8 where they can be
    }


def test_free_gpus_count_only_nodes_that_take_work_less_held_and_outside_gpus():
    # a100: node 00 has 8 - 2 outside - 3 of run 1; node 01 8 - 2 - 6; node 02 is drained;
    # c2's node is full. h100: outside load beyond the node's GPUs leaves 0, not -1.
    assert free_gpus(COUNTED) == {"a100": 3, "h100": 0}


def test_a_pool_is_shorthand_for_identical_free_nodes_named_by_cluster_and_flavor():
    pool = Pool("c1", "a100", nodes=2, gpus_per_node=4)
    assert pool.capacity == 8
    assert nodes_of(pool, Pool("c2", "h100", nodes=1, gpus_per_node=8)) == (
        ClusterNode("c1", "a100", "c1-a100-00", 4),
        ClusterNode("c1", "a100", "c1-a100-01", 4),
        ClusterNode("c2", "h100", "c2-h100-00", 8),
    )


def test_each_cluster_says_why_and_the_later_runs_say_whom_they_wait_behind():
    # Run 1 needs its 2 nodes in one leaf: c1 has no levels; c2's two nodes are in different
    # leaves, one half taken by nlp's borrowed run (reclaiming it would not help). Run 2
    # waits behind it; run 3 asks for a flavor no cluster has.
    snapshot = Snapshot(
        queued=(
            QueuedRun(1, "vision", "a100", 2, 8, 50, 1.0, "leaf", topology_required=True),
            run(2, gpn=1),
            run(3, flavor="h100"),
        ),
        held=(HeldRun(9, "nlp", "a100", "c2", 4, 50, 0.0, True, ("c2-a100-01",)),),
        nodes=(
            ClusterNode("c1", "a100", "c1-a100-00", 8),
            ClusterNode("c1", "a100", "c1-a100-01", 8),
            ClusterNode("c2", "a100", "c2-a100-00", 8, path=("b0", "b0-l0")),
            ClusterNode("c2", "a100", "c2-a100-01", 8, path=("b0", "b0-l1")),
        ),
        quotas={
            ("vision", "a100"): Quota(16),
            ("vision", "h100"): Quota(8),
            ("nlp", "a100"): Quota(0, borrow_limit=8),
        },
        levels={"c2": ("block", "leaf")},
    )
    decisions = decide(snapshot)

    assert decisions.admitted == ()
    assert decisions.waiting == (
        Waiting(
            1,
            Wait.CAPACITY,
            "on c1: needs its 2 nodes in one leaf, a level c1 does not have (its levels: none); "
            "on c2: needs 2 nodes × 8 a100 GPUs in one leaf; 12 a100 GPUs are free, at most 8 "
            "on any node (c2-a100-00: 8, c2-a100-01: 4); no leaf has 2 such nodes; reclaiming "
            "the GPUs other tenants borrowed would not make room",
            1,
        ),
        Waiting(
            2,
            Wait.BEHIND_HEAD,
            "waiting behind run 1 of tenant vision, which is first in line for a100 (priority, "
            "then submission order)",
            2,
        ),
        Waiting(
            3,
            Wait.CAPACITY,
            "needs 8 h100 GPUs; no enabled cluster has h100 GPUs; the h100 guarantees of all "
            "tenants add up to more than the 0 GPUs the clusters have, so not all can be kept "
            "at once",
            1,
        ),
    )
    # Without explanations (the estimates' forward simulation): the same, messages empty.
    assert decide(snapshot, explain=False).waiting == tuple(
        replace(wait, message="") for wait in decisions.waiting
    )


def test_a_tenant_beyond_its_guarantee_is_told_by_how_much():
    on_two = HeldRun(9, "vision", "a100", "c1", 12, 50, 0.0, False, ("c1-a100-00", "c1-a100-01"))
    decisions = decide(
        snapshot([run(1)], held_runs=[on_two], quotas={("vision", "a100"): Quota(8)})
    )
    assert decisions.waiting == (
        Waiting(
            1,
            Wait.QUOTA,
            "tenant vision uses 12 a100 GPUs, 4 beyond its guarantee of 8 and may not borrow; "
            "this run needs 8",
            1,
        ),
    )
    nlp_full = HeldRun(8, "nlp", "a100", "c1", 16, 50, 0.0, False, ("c1-a100-02", "c1-a100-03"))
    decisions = decide(
        snapshot(
            [run(1)],
            held_runs=[on_two, nlp_full],
            quotas={("vision", "a100"): Quota(8, borrow_limit=16)},
        )
    )
    assert decisions.waiting == (
        Waiting(
            1,
            Wait.NO_IDLE,
            "tenant vision uses 12 a100 GPUs, 4 beyond its guarantee of 8; to borrow idle ones, "
            "this run needs 8 a100 GPUs on one node; 4 a100 GPUs are free, at most 2 on any "
            "node (c1-a100-00: 2, c1-a100-01: 2, c1-a100-02: 0, c1-a100-03: 0)",
            1,
        ),
    )


def test_a_reclaim_an_outside_job_would_steal_moves_to_another_cluster_or_waits():
    # nlp's borrowed runs fill c1 (run 1) and c2 (runs 3 and 4); vision, within its guarantee,
    # reclaims 16 GPUs on either. A job from outside Gantry waiting in a cluster's queue for 2
    # whole nodes would start first on the GPUs freed there (jobs.reclaim).
    vision = QueuedRun(2, "vision", "a100", 1, 8, 0, 200.0)
    held_runs = (
        HeldRun(1, "nlp", "a100", "c1", 16, 0, 100.0, True, ("c1-a100-00", "c1-a100-01")),
        HeldRun(3, "nlp", "a100", "c2", 16, 0, 50.0, True, ("c2-a100-00", "c2-a100-01")),
        HeldRun(4, "nlp", "a100", "c2", 8, 50, 60.0, True, ("c2-a100-02",)),
    )
    outside_job = OutsideQueue(
        reclaim_first=False, claims=(OutsideClaim("Slurm job 812", "a100", 2, 8),)
    )

    def decided(outside):
        return decide(
            Snapshot(
                queued=(vision,),
                held=held_runs,
                nodes=nodes_of(Pool("c1", "a100", 2, 8), Pool("c2", "a100", 3, 8)),
                quotas={("vision", "a100"): Quota(16), ("nlp", "a100"): Quota(0, borrow_limit=40)},
                outside=outside,
            )
        )

    # Equal cost (16 GPUs, one run): c1 by its name; with the outside job on c1, c2.
    for outside, cluster, victim in (({}, "c1", 1), ({"c1": outside_job}, "c2", 3)):
        decisions = decided(outside)
        assert decisions.admitted == (Admit(2, cluster, nodes=(f"{cluster}-a100-00",)),)
        assert [(p.run_id, p.by_run_id) for p in decisions.preempted] == [(victim, 2)]
    # On both: no preemption; the reason names the first cluster's.
    decisions = decided({"c1": outside_job, "c2": outside_job})
    assert (decisions.admitted, decisions.preempted) == ((), ())
    assert decisions.waiting == (
        Waiting(
            2,
            Wait.CAPACITY,
            "preempting 1 borrowed run on c1 would free 16 a100 GPUs, but Slurm job 812 from "
            "outside Gantry (2 × 8 a100 GPUs) waits for them and c1 would start it first; this "
            "run waits until that job has started elsewhere or GPUs free up without a preemption",
            1,
        ),
    )


def test_starving_runs_of_one_shape_each_hold_a_node_of_their_own():
    # Every node has 4 of 8 GPUs free; three runs of 8 GPUs, starving (1000 s in line, 600 s
    # allowed), hold the free half of one node each, in line, never the same node twice (the
    # nodes each one waits on are no longer a choice for the next).
    pool = Pool("c1", "a100", nodes=4, gpus_per_node=8)
    names = [node.name for node in pool.expand()]
    decisions = decide(
        Snapshot(
            queued=tuple(run(i, tenant=f"t{i}", submitted=0) for i in (1, 2, 3)),
            held=tuple(
                HeldRun(10 + i, "lab", "a100", "c1", 4, 50, 0.0, False, (name,))
                for i, name in enumerate(names)
            ),
            nodes=pool.expand(),
            quotas={(tenant, "a100"): Quota(8) for tenant in ("t1", "t2", "t3")}
            | {("lab", "a100"): Quota(16)},
            now=1000.0,
            starvation_after_s=600.0,
        )
    )
    assert decisions.reservations == tuple(
        Reservation(i, "c1", "a100", 4, (names[i - 1],)) for i in (1, 2, 3)
    )
    assert [(w.run_id, w.reason) for w in decisions.waiting] == [
        (1, Wait.CAPACITY),
        (2, Wait.CAPACITY),
        (3, Wait.CAPACITY),
    ]


def test_between_borrowers_with_the_same_decayed_usage_the_lower_usage_per_weight_goes_first():
    # Neither has decayed usage; A holds 8 GPUs with weight 4 (2 per weight), B holds 4 with
    # weight 1 (4 per weight): A's run takes the one free node.
    quotas = {
        ("A", "a100"): Quota(0, borrow_limit=32, weight=4),
        ("B", "a100"): Quota(0, borrow_limit=32, weight=1),
    }
    holding = [held(8, "A", 8, borrowed=True), held(9, "B", 4, borrowed=True)]
    pools = (Pool("c1", "a100", nodes=3, gpus_per_node=8),)
    decisions = decide(
        snapshot(
            [run(1, tenant="B"), run(2, tenant="A")], held_runs=holding, pools=pools, quotas=quotas
        )
    )
    assert decisions.admitted == (Admit(2, "c1", borrowed=True, nodes=("c1-a100-02",)),)
    assert [(w.run_id, w.reason) for w in decisions.waiting] == [(1, Wait.NO_IDLE)]


def test_a_reclaim_whose_gpus_outside_load_has_taken_places_nothing():
    # Outside load has grown to all 4 GPUs of the node under nlp's borrowed run: preempting it
    # would free nothing, so vision's 1-GPU run waits and nothing is preempted.
    decisions = decide(
        Snapshot(
            queued=(run(1, gpn=1),),
            held=(HeldRun(9, "nlp", "a100", "c1", 4, 50, 0.0, True, ("c1-a100-00",)),),
            nodes=(ClusterNode("c1", "a100", "c1-a100-00", 4, outside=4),),
            quotas={("vision", "a100"): Quota(4), ("nlp", "a100"): Quota(0, borrow_limit=4)},
        )
    )
    assert (decisions.admitted, decisions.preempted) == ((), ())
    assert [(w.run_id, w.reason) for w in decisions.waiting] == [(1, Wait.CAPACITY)]


def test_the_overcommitted_guarantees_are_named_only_when_they_leave_no_room():
    # The guarantees (16 + 16) exceed the 16 GPUs; nlp holds 4 on each node. Vision's 8 GPUs
    # plus nlp's 8 fit in the 16: the wait is fragmentation, not the overcommitment...
    halves = [
        HeldRun(8, "nlp", "a100", "c1", 4, 50, 0.0, False, ("c1-a100-00",)),
        HeldRun(9, "nlp", "a100", "c1", 4, 50, 0.0, False, ("c1-a100-01",)),
    ]
    pools = (Pool("c1", "a100", nodes=2, gpus_per_node=8),)
    quotas = {("vision", "a100"): Quota(16), ("nlp", "a100"): Quota(16)}
    fragmented = "needs 8 a100 GPUs on one node; 8 a100 GPUs are free, at most 4 on any node"
    decisions = decide(snapshot([run(1)], held_runs=halves, pools=pools, quotas=quotas))
    assert [w.message for w in decisions.waiting] == [
        f"{fragmented} (c1-a100-00: 4, c1-a100-01: 4)"
    ]
    # ...once nlp's run of this cycle takes one more GPU, 8 + 9 no longer fit in the 16.
    decisions = decide(
        snapshot(
            [run(1), run(2, tenant="nlp", gpn=1)], held_runs=halves, pools=pools, quotas=quotas
        )
    )
    assert decisions.admitted == (Admit(2, "c1", nodes=("c1-a100-00",)),)
    assert [w.message for w in decisions.waiting] == [
        "needs 8 a100 GPUs on one node; 7 a100 GPUs are free, at most 4 on any node "
        "(c1-a100-00: 3, c1-a100-01: 4); the a100 guarantees of all tenants add up to more than "
        "the 16 GPUs the clusters have, so not all can be kept at once"
    ]


def test_a_borrower_with_nothing_idle_holds_back_its_tenant_and_is_named_as_the_head():
    quotas = {("vision", "a100"): Quota(8, borrow_limit=32), ("nlp", "a100"): Quota(32)}
    decisions = decide(
        snapshot(
            [run(1), run(2)], held_runs=[held(9, "vision", 8), held(10, "nlp", 24)], quotas=quotas
        )
    )
    assert waiting(decisions) == [(1, Wait.NO_IDLE, 1), (2, Wait.BEHIND_HEAD, 2)]
    assert decisions.waiting[1].message == (
        "waiting behind run 1 of tenant vision, which is first in line for a100 (priority, "
        "then submission order)"
    )


def test_between_borrowed_runs_of_one_priority_and_age_the_larger_id_is_preempted_first():
    pool = Pool("c1", "a100", nodes=2, gpus_per_node=8)
    first, second = (node.name for node in pool.expand())
    borrowed = [
        HeldRun(11, "nlp", "a100", "c1", 8, 10, 1.0, True, (first,)),
        HeldRun(12, "nlp", "a100", "c1", 8, 10, 1.0, True, (second,)),
    ]
    quotas = {("vision", "a100"): Quota(8), ("nlp", "a100"): Quota(0, borrow_limit=16)}
    decisions = decide(snapshot([run(1)], held_runs=borrowed, pools=(pool,), quotas=quotas))
    assert [(p.run_id, p.by_run_id) for p in decisions.preempted] == [(12, 1)]
    assert decisions.admitted == (Admit(1, "c1", nodes=(second,)),)


def starving_in_leaves(leaves):
    """A starving gang of 2 × 8 GPUs that must share a leaf, on nodes each used 4 of 8 by a
    run of tenant lab: the leaves given as {leaf: node count}."""
    nodes = tuple(
        ClusterNode("c1", "a100", f"{leaf}-{i}", 8, path=(leaf,))
        for leaf, count in leaves.items()
        for i in range(count)
    )
    return decide(
        Snapshot(
            queued=(replace(run(1, nodes=2, submitted=0), topology_level="leaf",
                            topology_required=True),),
            held=tuple(
                HeldRun(10 + i, "lab", "a100", "c1", 4, 50, 0.0, False, (node.name,))
                for i, node in enumerate(nodes)
            ),
            nodes=nodes,
            quotas={("vision", "a100"): Quota(16), ("lab", "a100"): Quota(32)},
            now=1000.0,
            starvation_after_s=600.0,
            levels={"c1": ("leaf",)},
        )
    )  # fmt: skip


def test_a_starving_gang_that_must_share_a_leaf_holds_nodes_in_a_leaf_large_enough():
    decisions = starving_in_leaves({"l1": 1, "l2": 2})
    assert decisions.reservations == (Reservation(1, "c1", "a100", 8, ("l2-0", "l2-1")),)


def test_a_starving_gang_between_leaves_as_close_to_fitting_holds_the_first():
    decisions = starving_in_leaves({"l1": 2, "l2": 2})
    assert decisions.reservations == (Reservation(1, "c1", "a100", 8, ("l1-0", "l1-1")),)


def test_a_one_node_run_goes_where_it_leaves_least_whatever_the_depth_of_the_node():
    nodes = (
        ClusterNode("c1", "a100", "c1-00", 8),
        ClusterNode("c2", "a100", "c2-00", 8, path=("row1", "leaf1")),
    )
    decisions = decide(
        Snapshot(queued=(run(1),), held=(), nodes=nodes, quotas={("vision", "a100"): Quota(8)})
    )
    assert decisions.admitted == (Admit(1, "c1", nodes=("c1-00",)),)
