"""jobs.placement: a gang lands only on nodes whose GPUs are free together, in the tightest
topology domain, leaving the least fragmentation; and says why when it cannot.

Examples first, then properties over random clusters checked against a brute-force oracle
(every subset of nodes) on clusters small enough to enumerate.
"""

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.placement import Gang, Node, Placement, explain, largest_gang, place

# 2 blocks of 2 leaf switches of 2 nodes, 8 GPUs each.
CLUSTER = [
    Node(f"a100-{block}{leaf}{n}", 8, 8, path=(f"block-{block}", f"leaf-{block}{leaf}"))
    for block in "ab"
    for leaf in "12"
    for n in "12"
]


def with_free(nodes: list[Node], **free: int) -> list[Node]:
    return [
        Node(n.name, n.gpus, free.get(n.name.replace("-", "_"), n.free), n.schedulable, n.path)
        for n in nodes
    ]


# --- examples ------------------------------------------------------------------------------


def test_the_fragmented_pool_of_the_issue_places_no_full_node_gang():
    # 4 nodes with 6 of 8 GPUs free each: 24 free, but no node has 8.
    nodes = [Node(f"a100-0{i}", 8, 6) for i in range(1, 5)]

    assert place(nodes, Gang(nodes=1, gpus_per_node=8)) is None
    assert place(nodes, Gang(nodes=2, gpus_per_node=8)) is None
    assert place(nodes, Gang(nodes=4, gpus_per_node=6)) == Placement(
        nodes=("a100-01", "a100-02", "a100-03", "a100-04"), domain=(), single_node=False
    )
    assert explain(nodes, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 2 nodes × 8 a100-80gb GPUs; 24 a100-80gb GPUs are free, at most 6 on any node "
        "(a100-01: 6, a100-02: 6, a100-03: 6, a100-04: 6)"
    )


def test_a_gang_takes_one_leaf_switch_before_spanning_two():
    nodes = with_free(CLUSTER, a100_a11=0, a100_b21=4)
    # Leaf a1 has one free node, leaf a2 two, leaf b1 two, leaf b2 one whole and one half.
    placement = place(nodes, Gang(nodes=2, gpus_per_node=8))

    # a2 and b1 both fit inside one leaf with nothing left over; a2 has fewer free GPUs in
    # its block (a: 8 + 16 = 24 against b: 16 + 12 = 28), so whole capacity stays in b.
    assert placement == Placement(
        nodes=("a100-a21", "a100-a22"), domain=("block-a", "leaf-a2"), single_node=False
    )


def test_a_gang_too_big_for_a_leaf_takes_one_block_then_the_cluster():
    assert place(CLUSTER, Gang(nodes=3, gpus_per_node=8)).domain == ("block-a",)
    assert place(CLUSTER, Gang(nodes=5, gpus_per_node=8)).domain == ()


def test_a_required_level_is_never_relaxed():
    nodes = with_free(CLUSTER, a100_a12=0, a100_a22=0, a100_b12=0, a100_b22=0)
    # One free node per leaf: a 2-node gang fits in a block, not in a leaf switch.
    assert place(nodes, Gang(nodes=2, gpus_per_node=8, required_level=2)) is None
    assert place(nodes, Gang(nodes=2, gpus_per_node=8, required_level=1)).domain == ("block-a",)
    assert explain(
        nodes,
        Gang(nodes=2, gpus_per_node=8, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ).startswith("needs 2 nodes × 8 a100-80gb GPUs in one leaf switch; 32 a100-80gb GPUs")


def test_a_small_run_packs_onto_a_partly_used_node():
    nodes = with_free(CLUSTER, a100_b22=3, a100_a11=5)
    assert place(nodes, Gang(nodes=1, gpus_per_node=2)) == Placement(
        nodes=("a100-b22",), domain=("block-b", "leaf-b2"), single_node=True
    )


def test_drained_nodes_take_nothing_and_are_named():
    nodes = [
        Node("a100-01", 8, 8, schedulable=False, reason="drained: bad DIMM"),
        Node("a100-02", 8, 8),
    ]
    assert place(nodes, Gang(nodes=2, gpus_per_node=8)) is None
    assert place(nodes, Gang(nodes=1, gpus_per_node=8)).nodes == ("a100-02",)
    assert largest_gang(nodes, 8) == 1
    assert explain(nodes, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 2 nodes × 8 a100-80gb GPUs; 8 a100-80gb GPUs are free, at most 8 on any node "
        "(a100-01: takes no work (drained: bad DIMM), a100-02: 8)"
    )


def test_a_shape_no_node_has_is_never_placed():
    assert place([Node("n", 4, 4)], Gang(nodes=1, gpus_per_node=8)) is None
    assert place([Node("n", 8, 8)], Gang(nodes=0, gpus_per_node=8)) is None


# --- properties ----------------------------------------------------------------------------

LEVEL_NAMES = ("b", "l")


@st.composite
def clusters(draw) -> list[Node]:
    count = draw(st.integers(min_value=1, max_value=7))
    nodes = []
    for index in range(count):
        gpus = draw(st.sampled_from([4, 8]))
        depth = draw(st.integers(min_value=0, max_value=2))
        path = tuple(f"{LEVEL_NAMES[d]}{draw(st.integers(0, 1))}" for d in range(depth))
        # a leaf name is unique to its block, as a real tree's is
        path = tuple("".join(path[: d + 1]) for d in range(depth))
        nodes.append(
            Node(
                name=f"n{index}",
                gpus=gpus,
                free=draw(st.integers(min_value=0, max_value=gpus)),
                schedulable=draw(st.booleans()) or draw(st.booleans()),
                path=path,
            )
        )
    return nodes


gangs = st.builds(
    Gang,
    nodes=st.integers(min_value=1, max_value=4),
    gpus_per_node=st.sampled_from([1, 2, 4, 8]),
    required_level=st.none() | st.integers(min_value=0, max_value=2),
)


def common_depth(members: list[Node]) -> int:
    if len(members) == 1:
        return len(members[0].path) + 1  # one node is tighter than any domain
    depth = 0
    while (
        all(len(m.path) > depth for m in members)
        and len({m.path[: depth + 1] for m in members}) == 1
    ):
        depth += 1
    return depth


def feasible_sets(nodes: list[Node], gang: Gang) -> list[tuple[Node, ...]]:
    """Every set of nodes the gang could run on, honouring its required level (the oracle)."""
    fits = [n for n in nodes if n.schedulable and n.free >= gang.gpus_per_node <= n.gpus]
    sets = []
    for members in itertools.combinations(fits, gang.nodes):
        depth = common_depth(list(members))
        limit = len(members[0].path) if len(members) == 1 else depth
        if gang.required_level is None or limit >= gang.required_level:
            sets.append(members)
    return sets


@settings(max_examples=400, deadline=None)
@given(clusters(), gangs)
def test_a_placement_exists_exactly_when_the_oracle_finds_one_and_is_valid(nodes, gang):
    placement = place(nodes, gang)
    sets = feasible_sets(nodes, gang)

    assert (placement is not None) == bool(sets)
    if placement is None:
        return
    by_name = {node.name: node for node in nodes}
    chosen = [by_name[name] for name in placement.nodes]
    assert len(set(placement.nodes)) == gang.nodes  # distinct nodes, all of the gang
    assert all(n.schedulable and n.free >= gang.gpus_per_node for n in chosen)
    assert all(n.path[: len(placement.domain)] == placement.domain for n in chosen)
    if gang.required_level is not None:
        assert len(placement.domain) >= gang.required_level
    # The tightest: one node for a one-node run; else no feasible set lies in a deeper
    # common domain.
    if gang.nodes == 1:
        assert placement.single_node
    else:
        tightest = max(common_depth(list(s)) for s in sets)
        assert common_depth(chosen) == tightest

        # And of the tightest sets, one that leaves the fewest GPUs free on its nodes.
        def left(members) -> int:
            return sum(n.free - gang.gpus_per_node for n in members)

        assert left(chosen) == min(left(s) for s in sets if common_depth(list(s)) == tightest)


@settings(max_examples=200, deadline=None)
@given(clusters(), gangs, st.randoms(use_true_random=False))
def test_the_answer_does_not_depend_on_the_order_of_the_nodes(nodes, gang, rng: random.Random):
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    assert place(shuffled, gang) == place(nodes, gang)


@settings(max_examples=200, deadline=None)
@given(clusters(), st.sampled_from([1, 2, 4, 8]))
def test_a_one_node_run_takes_the_fullest_node_that_fits(nodes, gpus):
    placement = place(nodes, Gang(nodes=1, gpus_per_node=gpus))
    fits = [n for n in nodes if n.schedulable and n.free >= gpus <= n.gpus]
    if not fits:
        assert placement is None
        return
    [name] = placement.nodes
    chosen = next(n for n in nodes if n.name == name)
    assert chosen.free == min(n.free for n in fits)
    assert largest_gang(nodes, gpus) == len(fits)


def test_each_node_is_named_with_its_own_figure_and_why_idle_gpus_are_not_free():
    # The issue's demo: six nodes, the fifth drained, the sixth busy with outside jobs, one
    # holding GPUs for a long-waiting run. Each name gets its own figure, none is skipped.
    demo = [
        Node("sim-east-a100-80gb-00", 8, 6),
        Node("sim-east-a100-80gb-01", 8, 6),
        Node("sim-east-a100-80gb-02", 8, 6),
        Node("sim-east-a100-80gb-03", 8, 2, held=4),
        Node("sim-east-a100-80gb-04", 8, 8, schedulable=False, reason="drained: XID 79"),
        Node("sim-east-a100-80gb-05", 8, 0, outside=6),
    ]
    assert explain(demo, Gang(nodes=1, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 8 a100-80gb GPUs on one node; 20 a100-80gb GPUs are free, at most 6 on any node "
        "(sim-east-a100-80gb-00: 6, sim-east-a100-80gb-01: 6, sim-east-a100-80gb-02: 6, "
        "sim-east-a100-80gb-03: 2 (4 reserved for a long-waiting run), "
        "sim-east-a100-80gb-04: takes no work (drained: XID 79), "
        "sim-east-a100-80gb-05: 0 (6 used from outside Gantry))"
    )
    # Past EXPLAIN_NODES_LISTED nodes, a tally, with what is not counted and why.
    many = [Node(f"n{i:02d}", 8, 2, outside=6) for i in range(9)]
    many.append(Node("n09", 8, 0, held=8))
    many.append(Node("n10", 8, 8, schedulable=False, reason="drained: bad DIMM"))
    assert explain(many, Gang(nodes=1, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 8 a100-80gb GPUs on one node; 18 a100-80gb GPUs are free, at most 2 on any node "
        "(9 nodes with 2, 1 node with 0; not counted: 54 used from outside Gantry, 8 reserved "
        "for long-waiting runs); node n10 takes no work (drained: bad DIMM)"
    )
