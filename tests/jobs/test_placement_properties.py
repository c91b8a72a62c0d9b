"""jobs.placement against a brute-force reference: every set of nodes the gang could run on,
ranked by the module's rules (the tightest domain, then the least left behind, then the
domain with the fewest free GPUs, then names), on random clusters small enough to
enumerate: small random trees, and two-block, four-leaf-switch clusters of 8 to 14 nodes
where several domains hold the gang and the rules decide between them.

The examples are drawn at random locally and derandomized in CI (the ``ci`` profile of
tests/conftest.py, selected by CI=true, which `make mutation` sets too).
"""

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.placement import Gang, Node, Placement, largest_gang, place

LEVEL_NAMES = ("b", "l")


@st.composite
def small_clusters(draw) -> list[Node]:
    """1 to 7 nodes of any depth (none, a block, a block and a leaf switch)."""
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


@st.composite
def large_cases(draw) -> tuple[list[Node], Gang]:
    """A gang and a cluster of 8 to 14 nodes: most under one of four leaf switches in two
    blocks, a few under a block only or outside the tree, each with no GPU free, just the
    gang's share, a little more, or all: so that several leaf switches (or blocks) hold the
    gang, leave as much or little behind, and have more or fewer free GPUs."""
    gang = Gang(
        nodes=draw(st.integers(min_value=2, max_value=4)),
        gpus_per_node=draw(st.sampled_from([2, 4, 4, 8])),
        required_level=draw(st.sampled_from([None, None, None, 1, 2])),
    )
    count = draw(st.integers(min_value=8, max_value=14))
    # names not in path order, so the name tie-break is not the path order
    numbers = draw(st.permutations(range(count)))
    nodes = []
    for number in numbers:
        gpus = draw(st.sampled_from([8, 8, 8, 4]))
        block, leaf = draw(st.sampled_from("ab")), draw(st.sampled_from("12"))
        path = draw(
            st.sampled_from(
                [(f"block-{block}", f"leaf-{block}{leaf}")] * 8 + [(f"block-{block}",), ()]
            )
        )
        share = min(gang.gpus_per_node, gpus)
        free = min(draw(st.sampled_from([0, share, share, share + 1, gpus])), gpus)
        nodes.append(
            Node(
                name=f"n{number:02d}",
                gpus=gpus,
                free=free,
                schedulable=draw(st.integers(0, 7)) > 0,
                path=path,
            )
        )
    return nodes, gang


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
    """Every set of nodes the gang could run on, honouring its required level."""
    fits = [n for n in nodes if n.schedulable and n.free >= gang.gpus_per_node <= n.gpus]
    sets = []
    for members in itertools.combinations(fits, gang.nodes):
        depth = common_depth(list(members))
        limit = len(members[0].path) if len(members) == 1 else depth
        if gang.required_level is None or limit >= gang.required_level:
            sets.append(members)
    return sets


def reference(nodes: list[Node], gang: Gang) -> Placement | None:
    """The placement the module's rules pick, by ranking every feasible set: one node for a
    one-node run (the fewest free GPUs, then the name); else the sets in the deepest common
    domain, by the GPUs they leave free, then the free GPUs of every schedulable node in
    their domain, then the domain's path, then their nodes' (free, name) in order."""
    if gang.nodes < 1 or gang.gpus_per_node < 1:
        return None
    sets = feasible_sets(nodes, gang)
    if not sets:
        return None
    if gang.nodes == 1:
        [node] = min(sets, key=lambda s: (s[0].free, s[0].name))
        return Placement(nodes=(node.name,), domain=node.path, single_node=True)
    depth = max(common_depth(list(s)) for s in sets)

    def rank(members: tuple[Node, ...]):
        domain = members[0].path[:depth]
        left = sum(n.free - gang.gpus_per_node for n in members)
        domain_free = sum(n.free for n in nodes if n.schedulable and n.path[:depth] == domain)
        return left, domain_free, domain, sorted((n.free, n.name) for n in members)

    best = min((s for s in sets if common_depth(list(s)) == depth), key=rank)
    return Placement(
        nodes=tuple(sorted(n.name for n in best)), domain=best[0].path[:depth], single_node=False
    )


def assert_valid(nodes: list[Node], gang: Gang, placement: Placement) -> None:
    by_name = {node.name: node for node in nodes}
    chosen = [by_name[name] for name in placement.nodes]
    assert len(set(placement.nodes)) == gang.nodes  # distinct nodes, all of the gang
    assert all(n.schedulable and n.free >= gang.gpus_per_node for n in chosen)
    assert all(n.path[: len(placement.domain)] == placement.domain for n in chosen)
    if gang.required_level is not None:
        assert len(placement.domain) >= gang.required_level


@settings(max_examples=300, deadline=None)
@given(small_clusters(), gangs)
def test_on_small_trees_the_placement_is_the_references(nodes, gang):
    placement = place(nodes, gang)

    assert placement == reference(nodes, gang)
    if placement is not None:
        assert_valid(nodes, gang, placement)


@settings(max_examples=200, deadline=None)
@given(large_cases())
def test_on_clusters_of_8_to_14_nodes_the_placement_is_the_references(case):
    nodes, gang = case
    placement = place(nodes, gang)

    assert placement == reference(nodes, gang)
    if placement is not None:
        assert_valid(nodes, gang, placement)


@settings(max_examples=200, deadline=None)
@given(st.tuples(small_clusters(), gangs) | large_cases(), st.randoms(use_true_random=False))
def test_the_answer_does_not_depend_on_the_order_of_the_nodes(case, rng: random.Random):
    nodes, gang = case
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    assert place(shuffled, gang) == place(nodes, gang)


@settings(max_examples=200, deadline=None)
@given(small_clusters() | large_cases().map(lambda case: case[0]), st.sampled_from([1, 2, 4, 8]))
def test_a_one_node_run_takes_the_fullest_node_that_fits(nodes, gpus):
    placement = place(nodes, Gang(nodes=1, gpus_per_node=gpus))
    fits = [n for n in nodes if n.schedulable and n.free >= gpus <= n.gpus]
    assert largest_gang(nodes, gpus) == len(fits)
    if not fits:
        assert placement is None
        return
    [name] = placement.nodes
    chosen = next(n for n in nodes if n.name == name)
    assert chosen.free == min(n.free for n in fits)


@settings(max_examples=300, deadline=None)
@given(small_clusters(), gangs, st.data())
def test_an_excluded_node_is_never_placed_on(nodes, gang, data):
    names = sorted({node.name for node in nodes})
    excluded = frozenset(data.draw(st.sets(st.sampled_from(names)))) if names else frozenset()
    placement = place(nodes, Gang(gang.nodes, gang.gpus_per_node, gang.required_level, excluded))
    others = [node for node in nodes if node.name not in excluded]
    if placement is None:
        assert reference(others, gang) is None  # none without them either
        return
    assert not excluded.intersection(placement.nodes)
    assert_valid(others, gang, placement)
