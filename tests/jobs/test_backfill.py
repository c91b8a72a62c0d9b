"""Backfill inside a tenant and flavor (issue 35): what a waiting head reserves, which
later runs of its tenant start ahead of it and why, and what the others are told.

Snapshots here are small and exact: node names, times and messages are checked whole.
"""

import random
from dataclasses import replace
from datetime import UTC, datetime

from jobs.admission import decide
from jobs.admission_types import (
    Admit,
    ClusterNode,
    HeldRun,
    QueuedRun,
    Queueing,
    Quota,
    Shadow,
    Snapshot,
    Wait,
    Waiting,
)

NOW = datetime(2026, 12, 5, tzinfo=UTC).timestamp()
HOUR = 3600.0
BEHIND = (
    "waiting behind run 1 of tenant alpha, which is first in line for a100 (priority, then "
    "submission order)"
)


def nodes(count: int = 4, *, cluster: str = "c", outside: int = 0, gpus: int = 8):
    return tuple(
        ClusterNode(cluster, "a100", f"{cluster}-n{i}", gpus, outside=outside) for i in range(count)
    )


def queued(run_id: int, n: int, g: int, runtime_h: float | None, *, tenant: str = "alpha"):
    return QueuedRun(
        run_id, tenant, "a100", n, g, 0, float(run_id),
        max_runtime_s=None if runtime_h is None else runtime_h * HOUR,
    )  # fmt: skip


def held(run_id: int, node: str, ends_h: float | None, *, gpus: int = 8, tenant: str = "alpha"):
    return HeldRun(
        run_id, tenant, "a100", node.split("-")[0], gpus, 0, 0.0, False, (node,),
        latest_end=None if ends_h is None else NOW + ends_h * HOUR,
    )  # fmt: skip


def snapshot(queue, held_runs=(), *, policy=Queueing.BACKFILL, node_list=None, **extra):
    node_list = nodes() if node_list is None else node_list
    return Snapshot(
        queued=tuple(queue),
        held=tuple(held_runs),
        nodes=node_list,
        quotas={("alpha", "a100"): Quota(64), ("beta", "a100"): Quota(64)},
        now=NOW,
        queueing={node.cluster: policy for node in node_list} if policy else {},
        **extra,
    )


# Three of four nodes busy until 1 h, 2 h and never (no bound); the head needs 2 nodes.
BUSY = (held(10, "c-n0", 1), held(11, "c-n1", 2), held(12, "c-n2", None, tenant="beta"))


def test_a_run_that_ends_before_the_heads_reserved_start_starts_ahead_of_it():
    decisions = decide(snapshot([queued(1, 2, 8, 4), queued(2, 1, 8, 0.5)], BUSY))
    assert decisions.admitted == (
        Admit(
            2, "c", nodes=("c-n3",), ahead_of=1,
            ahead_because=(
                "it ends by 2026-12-05 00:30 UTC at the latest, before run 1's reserved "
                "start at 2026-12-05 01:00 UTC"
            ),
        ),
    )  # fmt: skip
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n3"), NOW + HOUR),)
    assert decisions.waiting[0].reason == Wait.CAPACITY


def test_a_run_that_would_end_after_the_reserved_start_waits_and_says_where():
    decisions = decide(snapshot([queued(1, 2, 8, 4), queued(2, 1, 8, 1.5)], BUSY))
    assert decisions.admitted == ()
    assert decisions.waiting[1] == Waiting(
        2, Wait.BEHIND_HEAD,
        f"{BEHIND}; it would end after run 1's reserved start at 2026-12-05 01:00 UTC on c-n3",
        2,
    )  # fmt: skip


def test_a_run_without_a_maximum_runtime_cannot_start_ahead_of_a_reservation():
    decisions = decide(snapshot([queued(1, 2, 8, 4), queued(2, 1, 8, None)], BUSY))
    assert decisions.admitted == ()
    assert decisions.waiting[1].message == (
        f"{BEHIND}; it has no maximum runtime, so it cannot start ahead of run 1's reserved "
        "start at 2026-12-05 01:00 UTC on c-n3"
    )


def test_gpus_the_head_will_not_need_are_taken_by_a_run_of_any_length():
    # The head needs 6 of a node's 8 GPUs: 2 are spare on the node reserved for it, once.
    queue = [queued(1, 2, 6, 4), queued(2, 1, 2, None), queued(3, 1, 2, 9), queued(4, 1, 1, 9)]
    decisions = decide(snapshot(queue, BUSY))
    assert decisions.admitted == (
        Admit(2, "c", nodes=("c-n3",), ahead_of=1,
              ahead_because="it uses GPUs run 1 does not need"),
    )  # fmt: skip
    assert [w.message for w in decisions.waiting[1:]] == [
        f"{BEHIND}; it would end after run 1's reserved start at 2026-12-05 01:00 UTC on c-n3",
        f"{BEHIND}; it would end after run 1's reserved start at 2026-12-05 01:00 UTC on c-n3",
    ]


def test_strict_keeps_every_later_run_behind_the_head():
    decisions = decide(snapshot([queued(1, 2, 8, 4), queued(2, 1, 8, 0.5)], BUSY, policy=None))
    assert (decisions.admitted, decisions.shadows) == ((), ())
    assert decisions.waiting[1] == Waiting(2, Wait.BEHIND_HEAD, BEHIND, 2)


def test_best_effort_lets_a_later_run_pass_whatever_its_length():
    queue = [queued(1, 2, 8, 4), queued(2, 1, 8, None)]
    decisions = decide(snapshot(queue, BUSY, policy=Queueing.BEST_EFFORT))
    assert decisions.admitted == (
        Admit(2, "c", nodes=("c-n3",), ahead_of=1,
              ahead_because="the queueing policy is best-effort: run 1 holds nothing back"),
    )  # fmt: skip
    assert decisions.shadows == ()


def test_a_tenants_policy_overrides_its_clusters():
    queue = [queued(1, 2, 8, 4), queued(2, 1, 8, 0.5)]
    strict_cluster = decide(
        snapshot(queue, BUSY, policy=Queueing.STRICT,
                 tenant_queueing={"alpha": Queueing.BACKFILL})
    )  # fmt: skip
    assert [a.run_id for a in strict_cluster.admitted] == [2]
    strict_tenant = decide(snapshot(queue, BUSY, tenant_queueing={"alpha": Queueing.STRICT}))
    assert strict_tenant.admitted == ()


def test_a_head_no_cluster_could_ever_place_holds_nobody_back():
    # 2 GPUs of each node are used from outside Gantry: a 1x8 never fits, a 1x2 does.
    queue = [queued(1, 1, 8, 4), queued(2, 1, 2, None)]
    decisions = decide(snapshot(queue, node_list=nodes(outside=2)))
    assert decisions.admitted == (
        Admit(2, "c", nodes=("c-n0",), ahead_of=1,
              ahead_because=(
                  "run 1 could not be placed even with every Gantry run gone, so it holds "
                  "nothing back"
              )),
    )  # fmt: skip
    assert decisions.shadows == ()
    assert decisions.waiting[0].message.startswith("needs 8 a100 GPUs on one node; 22 a100")


def test_a_head_too_large_for_its_quota_holds_nobody_back():
    queue = [queued(1, 2, 8, 4), queued(2, 1, 8, 1)]
    decisions = decide(
        replace(snapshot(queue), quotas={("alpha", "a100"): Quota(64, max_gpus_per_run=8)})
    )
    assert [(a.run_id, a.ahead_of) for a in decisions.admitted] == [(2, 1)]
    assert decisions.waiting[0].reason == Wait.TOO_LARGE


def test_a_head_waiting_for_quota_keeps_later_runs_behind_it():
    # Beyond its guarantee and borrow limit: a later, smaller run would take its quota.
    queue = [queued(1, 1, 8, 4), queued(2, 1, 2, 1)]
    decisions = decide(replace(snapshot(queue, BUSY), quotas={("alpha", "a100"): Quota(20)}))
    assert decisions.admitted == ()
    assert [w.reason for w in decisions.waiting] == [Wait.QUOTA, Wait.BEHIND_HEAD]


def test_the_reservation_moves_off_a_node_that_no_longer_takes_work():
    drained = tuple(
        replace(node, schedulable=False, reason="quarantined") if node.name == "c-n3" else node
        for node in nodes(5)
    )
    decisions = decide(snapshot([queued(1, 2, 8, 4)], BUSY, node_list=drained))
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n4"), NOW + HOUR),)


def test_an_overdue_run_is_taken_to_end_now_so_nothing_ends_before_the_reserved_start():
    overdue = (
        held(10, "c-n0", -1),
        held(11, "c-n1", 2),
        held(12, "c-n2", None),
        held(13, "c-n3", 3),
    )
    decisions = decide(
        snapshot([queued(1, 2, 8, 4), queued(2, 1, 8, 0.01)], overdue, node_list=nodes(5))
    )
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n4"), NOW),)
    assert decisions.admitted == ()


def test_a_reservation_behind_runs_with_no_bound_has_no_start_and_keeps_its_nodes():
    unbounded = (held(10, "c-n0", None), held(11, "c-n1", None), held(12, "c-n2", None))
    queue = [queued(1, 2, 8, 4), queued(2, 1, 8, 1), queued(3, 2, 4, 1)]
    decisions = decide(snapshot(queue, unbounded))
    # The free node first, then one that waits on a run with no bound.
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n3"), None),)
    assert decisions.admitted == ()
    assert [w.message for w in decisions.waiting[1:]] == [
        f"{BEHIND}; run 1's reserved nodes (c-n3) have no known start (a run there has no "
        "maximum runtime), so it may use only GPUs run 1 does not need there",
        f"{BEHIND}; it does not fit the GPUs free now either",
    ]


def test_the_reservation_is_on_the_cluster_where_the_head_starts_first():
    both = nodes(2, cluster="c") + nodes(2, cluster="d")
    busy = (held(10, "c-n0", 3), held(11, "c-n1", 3), held(12, "d-n0", 2), held(13, "d-n1", 5))
    decisions = decide(snapshot([queued(1, 2, 8, 4)], busy, node_list=both))
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n1"), NOW + 3 * HOUR),)


def test_the_decisions_do_not_depend_on_the_order_the_runs_came_in():
    queue = [
        queued(i, 1 + i % 2, 8 if i % 3 else 2, 0.5 * i, tenant=("alpha", "beta")[i % 2])
        for i in range(1, 12)
    ]
    first = decide(snapshot(queue, BUSY))
    shuffled = list(queue)
    random.Random(35).shuffle(shuffled)
    assert decide(snapshot(shuffled, BUSY)) == first
    assert [a.run_id for a in first.admitted] != []


def test_a_run_of_a_year_uses_only_gpus_the_head_does_not_need():
    year = 365 * 24.0
    queue = [queued(1, 2, 6, 4), queued(2, 1, 2, year), queued(3, 1, 4, year)]
    decisions = decide(snapshot(queue, BUSY))
    assert [(a.run_id, a.nodes, a.ahead_because) for a in decisions.admitted] == [
        (2, ("c-n3",), "it uses GPUs run 1 does not need")
    ]
    assert decisions.waiting[1].message == (
        f"{BEHIND}; it would end after run 1's reserved start at 2026-12-05 01:00 UTC on c-n3"
    )


def test_when_the_head_is_cancelled_the_next_run_is_the_head_and_passers_keep_running():
    # Run 2 passed run 1, which was then cancelled: run 3 heads the line.
    passer = held(2, "c-n3", 0.5)
    decisions = decide(snapshot([queued(3, 2, 8, 4), queued(4, 1, 8, 0.25)], (*BUSY, passer)))
    assert decisions.shadows == (Shadow(3, "c", "a100", ("c-n0", "c-n3"), NOW + HOUR),)
    assert decisions.admitted == ()
    assert decisions.waiting[1].message == (
        "waiting behind run 3 of tenant alpha, which is first in line for a100 (priority, then "
        "submission order); it does not fit the GPUs free now either"
    )


def test_a_clock_step_back_moves_every_bound_with_it_and_admits_nothing_twice():
    queue = [queued(1, 2, 8, 4), queued(2, 1, 8, 0.5)]
    ahead = decide(snapshot(queue, BUSY))
    stepped = decide(replace(snapshot(queue, BUSY), now=NOW - 2 * HOUR))
    # Two hours earlier the held runs end 3 h and 4 h after "now": run 2 still ends first.
    assert [a.run_id for a in ahead.admitted] == [a.run_id for a in stepped.admitted] == [2]
    assert stepped.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n3"), NOW + HOUR),)
    forward = decide(replace(snapshot(queue, BUSY), now=NOW + 5 * HOUR))
    # Five hours later the bounded runs are overdue, taken to end now: the head is reserved
    # their nodes from now, and the free node is one it does not need.
    assert forward.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n1"), NOW + 5 * HOUR),)
    assert [(a.run_id, a.nodes, a.ahead_because) for a in forward.admitted] == [
        (2, ("c-n3",), "it uses GPUs run 1 does not need")
    ]


def test_a_run_admitted_this_cycle_holds_its_gpus_until_its_start_grace_and_max_runtime():
    # Run 5 takes the free node now; it starts within the 300 s grace, so it ends by 01:05.
    queue = [queued(5, 1, 8, 1), queued(6, 2, 8, 4)]
    decisions = decide(replace(snapshot(queue, BUSY), start_grace_s=300.0))
    assert [a.run_id for a in decisions.admitted] == [5]
    assert decisions.shadows == (Shadow(6, "c", "a100", ("c-n0", "c-n3"), NOW + HOUR + 300),)


def test_a_run_passing_its_head_keeps_another_tenants_reserved_start_and_names_no_run_of_it():
    # beta's head (run 1) is reserved c-n0 and c-n3 from 01:00; alpha's head (run 2) can
    # never be placed, so alpha's run 3 could pass it, but not onto beta's reservation.
    queue = [
        queued(1, 2, 8, 4, tenant="beta"),
        queued(2, 5, 8, 4),
        queued(3, 1, 8, 3),
        queued(4, 1, 8, 0.5),
    ]
    decisions = decide(snapshot(queue, BUSY))
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n3"), NOW + HOUR),)
    assert [(a.run_id, a.nodes, a.ahead_of) for a in decisions.admitted] == [(4, ("c-n3",), 2)]
    assert decisions.waiting[2].message == (
        "waiting behind run 2 of tenant alpha, which is first in line for a100 (priority, then "
        "submission order); GPUs on c-n3 are reserved for a run of another tenant waiting "
        "first in its line from 2026-12-05 01:00 UTC, and it would still run then"
    )


def test_a_partly_used_node_is_ready_now_and_what_ends_there_by_the_start_is_spare():
    # c-n0 has 4 GPUs free now and 4 more from 00:30; c-n1 is full until 01:00.
    partly = (
        held(10, "c-n0", 0.5, gpus=4),
        held(11, "c-n1", 1),
        held(12, "c-n2", None),
        held(13, "c-n3", None),
    )
    decisions = decide(snapshot([queued(1, 2, 4, 4), queued(2, 1, 4, None)], partly))
    assert decisions.shadows == (Shadow(1, "c", "a100", ("c-n0", "c-n1"), NOW + HOUR),)
    # At 01:00 c-n0 has 8 GPUs, the head needs 4 there: the other 4 are spare now.
    assert [(a.run_id, a.nodes, a.ahead_because) for a in decisions.admitted] == [
        (2, ("c-n0",), "it uses GPUs run 1 does not need")
    ]
