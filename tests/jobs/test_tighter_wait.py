"""What a tighter placement would have waited (issue 36, point 3): a gang admitted across
more than one domain of its cluster's narrowest topology level carries, on its ``Admit``,
how long it would have waited for its nodes inside one such domain, as backfill reserves a
start (``jobs.backfill.plan``, the held runs ending at their latest ends). Pure: no
database, exact values."""

from datetime import UTC, datetime

from jobs.admission import decide
from jobs.admission_types import Admit, ClusterNode, HeldRun, QueuedRun, Queueing, Quota, Snapshot

NOW = datetime(2026, 12, 5, tzinfo=UTC).timestamp()
HOUR = 3600.0
LEVELS = ("block", "leaf")


def node(name: str, *path: str, gpus: int = 8, schedulable: bool = True) -> ClusterNode:
    return ClusterNode("c", "a100", name, gpus, path=path, schedulable=schedulable)


def two_leaves(n3: ClusterNode | None = None) -> tuple[ClusterNode, ...]:
    """One block of two leaf switches, two nodes each."""
    return (
        node("n0", "b0", "l0"),
        node("n1", "b0", "l0"),
        node("n2", "b0", "l1"),
        n3 or node("n3", "b0", "l1"),
    )


def gang(run_id: int = 1, *, tenant: str = "alpha", gpn: int = 8, runtime_h: float = 10):
    return QueuedRun(
        run_id, tenant, "a100", 2, gpn, 0, float(run_id), max_runtime_s=runtime_h * HOUR
    )


def held(run_id, where, ends_h, *, gpus=8, tenant="gamma", borrowed=False):
    return HeldRun(
        run_id, tenant, "a100", "c", gpus, 0, 0.0, borrowed, (where,),
        latest_end=None if ends_h is None else NOW + ends_h * HOUR,
    )  # fmt: skip


def snapshot(queued, held_runs, nodes, **extra) -> Snapshot:
    quotas = {
        ("alpha", "a100"): Quota(64),
        ("beta", "a100"): Quota(0, borrow_limit=16),
        ("gamma", "a100"): Quota(64),
    }
    return Snapshot(
        queued=tuple(queued),
        held=tuple(held_runs),
        nodes=nodes,
        quotas=quotas,
        now=NOW,
        levels={"c": LEVELS},
        **extra,
    )


# n1 (leaf l0) is held until 2 h, n3 (leaf l1) until 5 h: the gang's two nodes share no leaf.
ONE_FREE_NODE_PER_LEAF = (held(10, "n1", 2), held(11, "n3", 5))


def test_a_gang_across_two_leaves_would_have_waited_for_the_first_leaf_to_free():
    decisions = decide(snapshot([gang()], ONE_FREE_NODE_PER_LEAF, two_leaves()))

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2"), tighter_wait_s=2 * HOUR),)


def test_a_borrowing_gang_across_two_leaves_gets_the_same_figure():
    decisions = decide(snapshot([gang(tenant="beta")], ONE_FREE_NODE_PER_LEAF, two_leaves()))

    assert decisions.admitted == (
        Admit(1, "c", borrowed=True, nodes=("n0", "n2"), tighter_wait_s=2 * HOUR),
    )


def test_a_gang_inside_one_leaf_has_none():
    decisions = decide(snapshot([gang()], (held(10, "n1", 2),), two_leaves()))

    assert decisions.admitted == (Admit(1, "c", nodes=("n2", "n3")),)
    assert decisions.admitted[0].tighter_wait_s is None


def test_a_one_node_run_has_none():
    run = QueuedRun(1, "alpha", "a100", 1, 8, 0, 1.0, max_runtime_s=HOUR)
    decisions = decide(snapshot([run], ONE_FREE_NODE_PER_LEAF, two_leaves()))

    assert decisions.admitted == (Admit(1, "c", nodes=("n0",)),)


def test_a_gang_no_leaf_could_ever_hold_has_none():
    # Each leaf has one node that could hold the gang: n3 takes no work.
    nodes = two_leaves(node("n3", "b0", "l1", schedulable=False))
    decisions = decide(snapshot([gang()], (held(10, "n1", None),), nodes))

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2")),)


def test_a_gang_whose_leaves_free_only_when_runs_without_a_bound_end_has_none():
    decisions = decide(
        snapshot([gang()], (held(10, "n1", None), held(11, "n3", None)), two_leaves())
    )

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2")),)


def test_the_wait_is_for_the_narrowest_level_not_a_wider_one():
    # The gang spans both blocks. Block b0 would hold it once n2 frees (1 h), but its leaf
    # l0 only once n1 frees (3 h): a tighter placement means one leaf.
    nodes = (
        node("n0", "b0", "l0"),
        node("n1", "b0", "l0"),
        node("n2", "b0", "l1"),
        node("n3", "b1", "l2"),
    )
    decisions = decide(snapshot([gang()], (held(10, "n1", 3), held(11, "n2", 1)), nodes))

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n3"), tighter_wait_s=3 * HOUR),)


def test_a_node_whose_leaf_is_unknown_makes_no_figure():
    # n2 names its block only: whether the gang spans leaves is not known.
    nodes = (node("n0", "b0", "l0"), node("n1", "b0", "l0"), node("n2", "b0"))
    decisions = decide(snapshot([gang()], (held(10, "n1", 2),), nodes))

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2")),)


def test_a_cluster_without_levels_makes_no_figure():
    nodes = tuple(ClusterNode("c", "a100", f"n{i}", 8) for i in range(4))
    decisions = decide(
        Snapshot(
            queued=(gang(),),
            held=(held(10, "n1", 2), held(11, "n3", 5)),
            nodes=nodes,
            quotas={("alpha", "a100"): Quota(64), ("gamma", "a100"): Quota(64)},
            now=NOW,
        )
    )

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2")),)


def test_a_reclaiming_gang_counts_from_after_its_preemptions():
    # Beta's borrowed run on n0 (until 9 h) is reclaimed: leaf l0 then waits only on n1 (2 h).
    held_runs = (
        held(9, "n0", 9, tenant="beta", borrowed=True),
        held(10, "n1", 2),
        held(11, "n3", 5),
    )
    decisions = decide(snapshot([gang()], held_runs, two_leaves()))

    assert [p.run_id for p in decisions.preempted] == [9]
    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2"), tighter_wait_s=2 * HOUR),)


def test_a_run_started_ahead_of_a_head_off_its_reserved_leaf_waited_zero():
    # Head 1 (3 nodes of 8 GPUs) starts at 1 h on n0, n1 and n4. Run 2 (2 nodes of 4, for
    # 10 h) may not take n0 or n1, the free leaf: it starts ahead on n2 and n3 (4 GPUs free
    # on each, in two leaves). A tighter placement was free, but reserved for the head: 0.
    nodes = (
        node("n0", "b0", "l0"),
        node("n1", "b0", "l0"),
        node("n2", "b0", "l1"),
        node("n3", "b0", "l2"),
        node("n4", "b0", "l3"),
    )
    held_runs = (held(10, "n2", 5, gpus=4), held(11, "n3", 5, gpus=4), held(12, "n4", 1))
    head = QueuedRun(1, "alpha", "a100", 3, 8, 0, 1.0, max_runtime_s=HOUR)
    decisions = decide(
        snapshot([head, gang(2, gpn=4)], held_runs, nodes, queueing={"c": Queueing.BACKFILL})
    )

    [admitted] = decisions.admitted
    assert (admitted.run_id, admitted.nodes, admitted.ahead_of) == (2, ("n2", "n3"), 1)
    assert admitted.tighter_wait_s == 0.0


def test_a_simulation_that_does_not_explain_makes_no_figure():
    decisions = decide(snapshot([gang()], ONE_FREE_NODE_PER_LEAF, two_leaves()), explain=False)

    assert decisions.admitted == (Admit(1, "c", nodes=("n0", "n2")),)
