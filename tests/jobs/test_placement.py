"""jobs.placement: a gang lands only on nodes whose GPUs are free together, in the tightest
topology domain, leaving the least fragmentation; and says why when it cannot.

Examples, with the exact nodes chosen and every explanation's whole text; the properties
against a brute-force reference are in test_placement_properties.py.
"""

import pytest

from jobs.placement import Gang, Node, Placement, explain, largest_gang, largest_shape, place

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
    # Two capable nodes in each leaf switch: the level is not the reason, the free GPUs are.
    assert explain(
        nodes,
        Gang(nodes=2, gpus_per_node=8, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 2 nodes × 8 a100-80gb GPUs in one leaf switch; 32 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-a11: 8, a100-a12: 0, a100-a21: 8, a100-a22: 0, "
        "a100-b11: 8, a100-b12: 0, a100-b21: 8, a100-b22: 0)"
    )


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
    assert place([Node("n", 8, 8)], Gang(nodes=1, gpus_per_node=0)) is None


# --- the domain that leaves the least behind, on clusters of more than 7 nodes -------------

# 2 blocks of 2 leaf switches of 3 nodes, 8 GPUs each: a100-a11 … a100-b23.
CLUSTER_12 = [
    Node(f"a100-{block}{leaf}{n}", 8, 8, path=(f"block-{block}", f"leaf-{block}{leaf}"))
    for block in "ab"
    for leaf in "12"
    for n in "123"
]
EMPTY = dict.fromkeys(node.name.replace("-", "_") for node in CLUSTER_12)


def only_free(**free: int) -> list[Node]:
    """CLUSTER_12 with the GPUs free given, none free on the other nodes."""
    return with_free(CLUSTER_12, **{**dict.fromkeys(EMPTY, 0), **free})


def test_of_two_leaf_switches_holding_the_gang_the_one_left_emptiest_wins():
    # Two nodes of 4 GPUs: leaf a1 holds them on its 5 and 5, leaving 2 behind; leaf b1 on
    # its 4 and 4, leaving none, though b1 has more free GPUs (16 against 13) and comes
    # later by name: what is left behind decides first.
    nodes = only_free(a100_a11=5, a100_a12=5, a100_a13=3, a100_b11=4, a100_b12=4, a100_b13=8)

    assert place(nodes, Gang(nodes=2, gpus_per_node=4)) == Placement(
        nodes=("a100-b11", "a100-b12"), domain=("block-b", "leaf-b1"), single_node=False
    )
    # Within a leaf switch, the nodes that leave least: a1's two 5s (2 left), not its 8,
    # and not leaf b1's 6 and 8 (6 left).
    nodes = only_free(a100_a11=8, a100_a12=5, a100_a13=5, a100_b11=6, a100_b12=8)
    assert place(nodes, Gang(nodes=2, gpus_per_node=4)) == Placement(
        nodes=("a100-a12", "a100-a13"), domain=("block-a", "leaf-a1"), single_node=False
    )


def test_leaving_as_much_the_leaf_switch_with_fewer_free_gpus_wins_drained_ones_not_counted():
    # Both leave nothing behind; leaf a1 has 16 free GPUs, leaf b1 8 (its drained node's 8
    # are not free to anyone), so b1 takes the gang and a1's whole node stays free.
    nodes = only_free(a100_a11=4, a100_a12=4, a100_a13=8, a100_b11=4, a100_b12=4)
    nodes = [
        Node(n.name, 8, 8, schedulable=False, path=n.path) if n.name == "a100-b13" else n
        for n in nodes
    ]

    assert place(nodes, Gang(nodes=2, gpus_per_node=4)) == Placement(
        nodes=("a100-b11", "a100-b12"), domain=("block-b", "leaf-b1"), single_node=False
    )
    # As much left and as many free: the first leaf switch by name, whatever the order.
    nodes = only_free(a100_a21=4, a100_a22=4, a100_b21=4, a100_b22=4)
    assert place(nodes[::-1], Gang(nodes=2, gpus_per_node=4)) == Placement(
        nodes=("a100-a21", "a100-a22"), domain=("block-a", "leaf-a2"), single_node=False
    )


def test_a_gang_no_leaf_switch_holds_takes_the_block_that_leaves_least_behind():
    # No leaf switch has 4 nodes with 4 free. Block a holds the gang on 8, 4, 4, 4 (4 left
    # behind), block b on 4, 4, 4, 4 (none), though b has 32 free GPUs against a's 20.
    nodes = only_free(
        a100_a11=8, a100_a12=4, a100_a13=4, a100_a21=4,
        a100_b11=4, a100_b12=4, a100_b13=4, a100_b21=4, a100_b22=8, a100_b23=8,
    )  # fmt: skip

    assert place(nodes, Gang(nodes=4, gpus_per_node=4)) == Placement(
        nodes=("a100-b11", "a100-b12", "a100-b13", "a100-b21"),
        domain=("block-b",),
        single_node=False,
    )
    # Required in one leaf switch, it is not placed at all.
    assert place(nodes, Gang(nodes=4, gpus_per_node=4, required_level=2)) is None


def test_a_one_node_run_with_a_required_level_takes_a_node_under_that_level():
    nodes = [
        Node("a100-01", 8, 4),  # the fullest node that fits, but in no block
        Node("a100-02", 8, 6, path=("block-a",)),  # in a block, in no leaf switch
        Node("a100-03", 8, 8, path=("block-a", "leaf-a1")),
    ]

    assert place(nodes, Gang(nodes=1, gpus_per_node=4)).nodes == ("a100-01",)
    assert place(nodes, Gang(nodes=1, gpus_per_node=4, required_level=1)) == Placement(
        nodes=("a100-02",), domain=("block-a",), single_node=True
    )
    assert place(nodes, Gang(nodes=1, gpus_per_node=4, required_level=2)) == Placement(
        nodes=("a100-03",), domain=("block-a", "leaf-a1"), single_node=True
    )
    assert place(nodes[:2], Gang(nodes=1, gpus_per_node=4, required_level=2)) is None
    assert explain(
        nodes[:2],
        Gang(nodes=1, gpus_per_node=4, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 4 a100-80gb GPUs on one node; 10 a100-80gb GPUs are free, at most 6 on any node "
        "(a100-01: 4, a100-02: 6); no leaf switch has 1 such node"
    )


# --- explain(): each reason with its whole text ---------------------------------------------


def test_explain_says_how_few_nodes_have_that_many_gpus_at_all():
    # Given out of name order; a node that takes no work still has its GPUs.
    nodes = [
        Node("a100-04", 8, 0, schedulable=False, reason="cordoned"),
        Node("a100-02", 4, 4),
        Node("a100-01", 8, 8),
        Node("a100-03", 4, 0, outside=2, held=2),
    ]
    spread = (
        "12 a100-80gb GPUs are free, at most 8 on any node (a100-01: 8, a100-02: 4, a100-03: 0 "
        "(2 used from outside Gantry, 2 reserved for a long-waiting run), "
        "a100-04: takes no work (cordoned))"
    )

    assert explain(nodes[1:], Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 2 nodes × 8 a100-80gb GPUs; 12 a100-80gb GPUs are free, at most 8 on any node "
        "(a100-01: 8, a100-02: 4, "
        "a100-03: 0 (2 used from outside Gantry, 2 reserved for a long-waiting run)); "
        "only 1 node has 8 GPUs at all"
    )
    assert explain(nodes, Gang(nodes=3, gpus_per_node=8), flavor="a100-80gb") == (
        f"needs 3 nodes × 8 a100-80gb GPUs; {spread}; only 2 nodes have 8 GPUs at all"
    )
    assert explain(nodes, Gang(nodes=1, gpus_per_node=16), flavor="a100-80gb") == (
        f"needs 16 a100-80gb GPUs on one node; {spread}; only 0 nodes have 16 GPUs at all"
    )
    # As many nodes have 8 GPUs as the gang needs: the free GPUs are the reason.
    assert explain(nodes, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        f"needs 2 nodes × 8 a100-80gb GPUs; {spread}"
    )


def test_explain_says_no_domain_of_the_required_level_has_enough_such_nodes():
    assert explain(
        CLUSTER,
        Gang(nodes=3, gpus_per_node=8, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 3 nodes × 8 a100-80gb GPUs in one leaf switch; 64 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-a11: 8, a100-a12: 8, a100-a21: 8, a100-a22: 8, "
        "a100-b11: 8, a100-b12: 8, a100-b21: 8, a100-b22: 8); no leaf switch has 3 such nodes"
    )
    # Only nodes with 8 GPUs under a leaf switch count: a100-03 has 4, a100-04 no leaf.
    nodes = [
        Node("a100-01", 8, 0, path=("block-a", "leaf-a1")),
        Node("a100-02", 8, 0, path=("block-a", "leaf-a1")),
        Node("a100-03", 4, 4, path=("block-a", "leaf-a1")),
        Node("a100-04", 8, 8, path=("block-a",)),
    ]
    assert explain(
        nodes,
        Gang(nodes=3, gpus_per_node=8, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 3 nodes × 8 a100-80gb GPUs in one leaf switch; 12 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 0, a100-02: 0, a100-03: 4, a100-04: 8); "
        "no leaf switch has 3 such nodes"
    )
    # One such node per leaf switch; a node that takes no work, outside the tree, is named.
    assert explain(
        [
            Node("a100-03", 8, 8, schedulable=False),
            Node("a100-02", 8, 8, path=("block-a", "leaf-a2")),
            Node("a100-01", 8, 8, path=("block-a", "leaf-a1")),
        ],
        Gang(nodes=2, gpus_per_node=8, required_level=2),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 2 nodes × 8 a100-80gb GPUs in one leaf switch; 16 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 8, a100-02: 8, a100-03: takes no work "
        "(not schedulable)); no leaf switch has 2 such nodes"
    )
    # Three such nodes in one block: the free GPUs are the reason.
    assert explain(
        nodes,
        Gang(nodes=3, gpus_per_node=8, required_level=1),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 3 nodes × 8 a100-80gb GPUs in one block; 12 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 0, a100-02: 0, a100-03: 4, a100-04: 8)"
    )


def test_explain_names_a_level_the_cluster_does_not_name_by_its_depth():
    nodes = [Node("a100-01", 8, 8, path=("block-a", "leaf-a1"))]

    assert explain(
        nodes, Gang(nodes=2, gpus_per_node=8, required_level=2), flavor="a100-80gb", levels=()
    ) == (
        "needs 2 nodes × 8 a100-80gb GPUs in one level-2 domain; 8 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 8); only 1 node has 8 GPUs at all"
    )
    assert explain(
        nodes,
        Gang(nodes=2, gpus_per_node=4, required_level=2),
        flavor="a100-80gb",
        levels=("block",),
    ) == (
        "needs 2 nodes × 4 a100-80gb GPUs in one level-2 domain; 8 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 8); only 1 node has 4 GPUs at all"
    )
    # Level 0 is the whole cluster, which no level name names.
    assert explain(
        nodes,
        Gang(nodes=2, gpus_per_node=4, required_level=0),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 2 nodes × 4 a100-80gb GPUs in one level-0 domain; 8 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 8); only 1 node has 4 GPUs at all"
    )
    assert explain(
        nodes,
        Gang(nodes=2, gpus_per_node=4, required_level=1),
        flavor="a100-80gb",
        levels=("block", "leaf switch"),
    ) == (
        "needs 2 nodes × 4 a100-80gb GPUs in one block; 8 a100-80gb GPUs are free, "
        "at most 8 on any node (a100-01: 8); only 1 node has 4 GPUs at all"
    )


def test_explain_when_every_node_is_drained_names_each():
    nodes = [
        Node("a100-02", 8, 0, schedulable=False),
        Node("a100-01", 8, 8, schedulable=False, reason="drained: bad DIMM"),
    ]

    assert explain(nodes, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "needs 2 nodes × 8 a100-80gb GPUs; no a100-80gb node takes work now; "
        "node a100-01 takes no work (drained: bad DIMM); "
        "node a100-02 takes no work (not schedulable)"
    )


def test_explain_past_8_nodes_names_8_that_take_no_work_and_counts_the_rest():
    drained = [Node(f"d{i:02d}", 8, 8, schedulable=False, reason="drained") for i in range(10)]
    working = [Node("w01", 8, 4), Node("w02", 8, 8), Node("w03", 8, 8)]
    named = [f"node d{i:02d} takes no work (drained)" for i in range(8)]
    need = "needs 2 nodes × 8 a100-80gb GPUs"
    free = "20 a100-80gb GPUs are free, at most 8 on any node (2 nodes with 8, 1 node with 4)"

    assert explain(drained + working, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "; ".join([need, free, *named, "2 more nodes take no work"])
    )
    assert explain(drained[:9], Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "; ".join([need, "no a100-80gb node takes work now", *named, "1 more node takes no work"])
    )
    # Exactly 8 that take no work, past 8 nodes: all named, none counted.
    assert explain(drained[:8] + working, Gang(nodes=2, gpus_per_node=8), flavor="a100-80gb") == (
        "; ".join([need, free, *named])
    )


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


@pytest.mark.parametrize(
    ("max_nodes", "per_node", "max_gpus", "shape"),
    [
        (6, 8, 16, (2, 8)),
        (4, 8, 12, (2, 6)),  # 12 does not fill 8-GPU nodes: two nodes of 6
        (1, 8, 1000, (1, 8)),  # the node limit binds
        (4, 8, 7, (1, 7)),
        (3, 8, 13, (2, 6)),  # 13 is prime and above 8: the next count that fits, 12
        (3, 4, 10, (3, 3)),  # 10 needs 4 nodes of at most 4; 9 fits on exactly 3
        (4, 8, 0, (0, 0)),
        (4, 8, -5, (0, 0)),
        (0, 8, 16, (0, 0)),
        (1, 8, 1, (1, 1)),
    ],
)
def test_the_largest_shape_is_the_most_gpus_on_the_fewest_nodes(
    max_nodes, per_node, max_gpus, shape
):
    largest = largest_shape(max_nodes=max_nodes, max_gpus_per_node=per_node, max_gpus=max_gpus)

    assert largest == shape
    assert [type(count) for count in largest] == [int, int]  # counts, printed in messages


def test_a_gang_whose_exclusions_leave_no_placement_says_so():
    from jobs.placement import Gang, Node, explain, place

    nodes = [Node("n1", 8, 8), Node("n2", 8, 8)]
    gang = Gang(2, 8, excluded=frozenset({"n2"}))
    assert place(nodes, gang) is None
    assert explain(nodes, gang, flavor="a100") == (
        "needs 2 nodes × 8 a100 GPUs; 8 a100 GPUs are free, at most 8 on any node (n1: 8); "
        "not placed on n2: excluded from this run (a fault ended an attempt of it there, or a "
        "person restarted it without that node)"
    )
