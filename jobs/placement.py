"""Where a gang can start: nodes whose GPUs are free together, in the tightest topology
domain (pure: plain data in and out).

A cluster's nodes of one flavor each report their GPUs, the GPUs free as the backend sees
them (jobs Gantry did not submit included), whether they take work (drained, cordoned,
NotReady nodes do not) and their topology path from the widest domain to the tightest,
for example ``("block-a", "leaf-2")``; the node itself is the last, implicit level. A gang
of ``nodes`` × ``gpus_per_node`` is placeable only on that many distinct schedulable
nodes with ``gpus_per_node`` free each, all inside one domain at the level it requires.

Among the placements there are, ``place`` takes:

1. the tightest domain: one node for a one-node run, else the deepest level at which some
   domain holds enough nodes (one leaf switch before one block before the whole cluster);
2. within that level, the domain and nodes that leave the least behind: the chosen nodes'
   free GPUs after placing fewest first (best fit: small runs pack onto partly used nodes,
   so whole nodes stay free for gangs), then the domain with the fewest free GPUs (whole
   free domains stay free for larger gangs), then names, so the answer never depends on
   the order the nodes came in.

``explain`` says in plain words why a gang cannot be placed, with the numbers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpus: int  # of the flavor, on this node
    free: int  # free as the backend sees them
    schedulable: bool = True
    path: tuple[str, ...] = ()  # topology domains, widest first; the node is implicit
    reason: str = ""  # why it is not schedulable, in the backend's words
    # Why GPUs that are not busy with Gantry's runs are still not free, for the reasons:
    outside: int = 0  # used by jobs from outside Gantry
    held: int = 0  # reserved for a run waiting past the starvation limit


@dataclass(frozen=True, slots=True)
class Gang:
    nodes: int
    gpus_per_node: int
    # The gang must lie inside one domain at this depth of the path (1: the first level,
    # e.g. a block; 2: a leaf switch, ...); None: anywhere in the cluster.
    required_level: int | None = None
    # Nodes this gang is never placed on (a fault ended one of its attempts there).
    excluded: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Placement:
    nodes: tuple[str, ...]  # sorted by name
    domain: tuple[str, ...]  # the tightest domain holding them all; () is the whole cluster
    single_node: bool  # all on one node (tighter than any domain)


def _fits(node: Node, gpus_per_node: int) -> bool:
    return node.schedulable and node.free >= gpus_per_node and gpus_per_node <= node.gpus


def _best_fit(candidates: Iterable[Node], count: int) -> list[Node]:
    """The ``count`` nodes that leave the fewest GPUs free after placing a gang's share on
    each (ties by name): the fewest free now, as each gives up the same share."""
    return sorted(candidates, key=lambda n: (n.free, n.name))[:count]


def place(nodes: Sequence[Node], gang: Gang) -> Placement | None:
    """The placement of ``gang`` on ``nodes`` (see the module's rules), or None."""
    if gang.nodes < 1 or gang.gpus_per_node < 1:
        return None
    candidates = [
        node for node in nodes if _fits(node, gang.gpus_per_node) and node.name not in gang.excluded
    ]
    if len(candidates) < gang.nodes:
        return None
    if gang.nodes == 1:  # one node is tighter than any domain
        if gang.required_level is not None:
            candidates = [node for node in candidates if len(node.path) >= gang.required_level]
        if not candidates:
            return None
        [node] = _best_fit(candidates, 1)
        return Placement(nodes=(node.name,), domain=node.path, single_node=True)

    deepest = max(len(node.path) for node in candidates)
    shallowest = 0 if gang.required_level is None else gang.required_level
    for level in range(deepest, shallowest - 1, -1):
        domains: dict[tuple[str, ...], list[Node]] = defaultdict(list)
        for node in candidates:
            if len(node.path) >= level:
                domains[node.path[:level]].append(node)
        domain_free: dict[tuple[str, ...], int] = defaultdict(int)
        for node in nodes:
            if node.schedulable and len(node.path) >= level:
                domain_free[node.path[:level]] += node.free
        options = []
        for domain, members in domains.items():
            if len(members) < gang.nodes:
                continue
            chosen = _best_fit(members, gang.nodes)
            left = sum(node.free - gang.gpus_per_node for node in chosen)
            options.append((left, domain_free[domain], domain, chosen))
        if options:
            left, _, domain, chosen = min(options, key=lambda o: (o[0], o[1], o[2]))
            return Placement(
                nodes=tuple(sorted(node.name for node in chosen)),
                domain=domain,
                single_node=False,
            )
    return None


def largest_gang(nodes: Sequence[Node], gpus_per_node: int) -> int:
    """How many nodes a gang of ``gpus_per_node`` per node could span now, anywhere."""
    return sum(1 for node in nodes if _fits(node, gpus_per_node))


# Beyond this many nodes, a reason gives the spread of free GPUs, not each node's.
EXPLAIN_NODES_LISTED = 8


def level_name(levels: Sequence[str], level: int) -> str:
    return levels[level - 1] if 0 < level <= len(levels) else f"level-{level} domain"


def explain(nodes: Sequence[Node], gang: Gang, *, flavor: str, levels: Sequence[str] = ()) -> str:
    """Why ``gang`` cannot be placed now, with the numbers people need: what it needs,
    what is free and where, which nodes take no work. ``levels`` names the topology levels
    (e.g. ``("block", "leaf switch")``). Short whatever the cluster's size: past
    ``EXPLAIN_NODES_LISTED`` nodes it counts nodes by their free GPUs instead of naming them."""
    need = (
        f"needs {gang.gpus_per_node} {flavor} GPUs on one node"
        if gang.nodes == 1
        else f"needs {gang.nodes} nodes × {gang.gpus_per_node} {flavor} GPUs"
    )
    if gang.required_level is not None and gang.nodes > 1:
        need += f" in one {level_name(levels, gang.required_level)}"
    excluded = sorted(node.name for node in nodes if node.name in gang.excluded)
    usable = [node for node in nodes if node.name not in gang.excluded]
    nodes, every_node = usable, nodes
    working = [node for node in nodes if node.schedulable]  # summed and tallied: any order
    every = sorted(nodes, key=lambda n: n.name)
    listed = len(every) <= EXPLAIN_NODES_LISTED
    parts = [need]
    if working:
        free = sum(node.free for node in working)
        most = max(node.free for node in working)
        if listed:
            spread = ", ".join(_node_figure(node) for node in every)
        else:
            tally: dict[int, int] = defaultdict(int)
            for node in working:
                tally[node.free] += 1
            spread = ", ".join(
                f"{count} node{'s' if count > 1 else ''} with {gpus}"
                for gpus, count in sorted(tally.items(), reverse=True)
            )
            spread += _not_free_totals(working)
        parts.append(f"{free} {flavor} GPUs are free, at most {most} on any node ({spread})")
        # Excluded nodes count here: the GPUs exist, only not for this run (said below).
        capable = [node for node in every_node if node.gpus >= gang.gpus_per_node]
        if len(capable) < gang.nodes:
            parts.append(
                f"only {len(capable)} node{'' if len(capable) == 1 else 's'} "
                f"{'has' if len(capable) == 1 else 'have'} {gang.gpus_per_node} GPUs at all"
            )
        elif gang.required_level is not None:
            # A one-node run with a required level, too, takes only a node under that level.
            domains: dict[tuple[str, ...], int] = defaultdict(int)
            for node in capable:
                if len(node.path) >= gang.required_level:
                    domains[node.path[: gang.required_level]] += 1
            if max(domains.values(), default=0) < gang.nodes:
                such = "such nodes" if gang.nodes > 1 else "such node"
                parts.append(
                    f"no {level_name(levels, gang.required_level)} has {gang.nodes} {such}"
                )
    else:
        parts.append(f"no {flavor} node takes work now")
    if excluded:
        parts.append(_excluded_words(excluded))
    if listed and working:
        return "; ".join(parts)  # the list above names the nodes that take no work
    unschedulable = sorted((node for node in nodes if not node.schedulable), key=lambda n: n.name)
    for node in unschedulable[:EXPLAIN_NODES_LISTED]:
        parts.append(f"node {node.name} takes no work ({node.reason or 'not schedulable'})")
    more = len(unschedulable) - EXPLAIN_NODES_LISTED
    if more > 0:
        parts.append(f"{more} more node{'s take' if more > 1 else ' takes'} no work")
    return "; ".join(parts)


def _excluded_words(excluded: Sequence[str]) -> str:
    named = ", ".join(excluded[:EXPLAIN_NODES_LISTED])
    more = len(excluded) - EXPLAIN_NODES_LISTED
    named += f" and {more} more" if more > 0 else ""
    return (
        f"not placed on {named}: excluded from this run (a fault ended an attempt of it "
        "there, or a person restarted it without that node)"
    )


def _node_figure(node: Node) -> str:
    """One node and its own figure: the GPUs free on it, or why it takes no work, and why
    GPUs Gantry's runs do not use are still not free."""
    if not node.schedulable:
        return f"{node.name}: takes no work ({node.reason or 'not schedulable'})"
    why = []
    if node.outside:
        why.append(f"{node.outside} used from outside Gantry")
    if node.held:
        why.append(f"{node.held} reserved for a long-waiting run")
    return f"{node.name}: {node.free}" + (f" ({', '.join(why)})" if why else "")


def _not_free_totals(nodes: Sequence[Node]) -> str:
    outside = sum(node.outside for node in nodes)
    held = sum(node.held for node in nodes)
    why = []
    if outside:
        why.append(f"{outside} used from outside Gantry")
    if held:
        why.append(f"{held} reserved for long-waiting runs")
    return f"; not counted: {', '.join(why)}" if why else ""


def largest_shape(*, max_nodes: int, max_gpus_per_node: int, max_gpus: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of the largest gang within ``max_nodes`` nodes of
    ``max_gpus_per_node`` GPUs and ``max_gpus`` GPUs in all: the most GPUs, on the fewest
    nodes. (0, 0) when no GPU may be asked for."""
    total = min(max_nodes * max_gpus_per_node, max(max_gpus, 0))
    for gpus in range(total, 0, -1):
        for per_node in range(min(gpus, max_gpus_per_node), 0, -1):
            if gpus % per_node == 0 and gpus // per_node <= max_nodes:
                return gpus // per_node, per_node
    return 0, 0
