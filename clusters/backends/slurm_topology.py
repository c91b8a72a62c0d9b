"""Slurm's switch tree: ``scontrol show topology`` (or topology.conf's lines), its paths and
the names of its levels. Pure: no Django, no processes.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from clusters.backends.slurm_hostlist import expand_hostlist

DERIVED_LEVEL_NAMES = ("leaf", "spine", "core")
UNKNOWN_TOPOLOGY = (
    "topology unknown: slurmrestd v0.0.38 has no topology endpoint; give topology.conf's "
    "lines in the cluster setting 'topology' (or [] for a cluster without one)"
)
_LISTED = 8  # nodes or switches named in one problem before the rest are counted


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    level: int  # 0 for a leaf switch, one more than its highest child switch above
    nodes: frozenset[str]  # every node under it, directly or through its child switches
    children: tuple[str, ...] = ()


def _listing(names: Iterable[str]) -> str:
    names = sorted(names)
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def parse_topology(text: str) -> tuple[dict[str, Switch], list[str]]:
    """``scontrol show topology`` (``SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu-node1``,
    ``SwitchName=spine Level=1 … Nodes=gpu-node[1-2] Switches=leaf[1-2]``), or the lines of
    topology.conf, which name only direct children: the switches by name, with every node
    under each and their levels, computed here from the tree. Returns the problems found
    (a line without a switch, an unknown child, a loop) instead of raising; with a loop
    there is no usable tree and no switch is returned."""
    direct: dict[str, set[str]] = {}
    children: dict[str, list[str]] = {}
    problems: list[str] = []
    for raw_line in (text or "").splitlines():
        line = raw_line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if eq:
                fields[key.lower()] = value
        name = fields.get("switchname", "")
        if not name:
            problems.append(f"topology: {line[:80]!r} names no switch (SwitchName=)")
            continue
        try:
            direct[name] = set(expand_hostlist(fields.get("nodes", "")))
            children[name] = expand_hostlist(fields.get("switches", ""))
        except ValueError as exc:
            problems.append(f"topology: switch {name}: {exc}")
            direct.pop(name, None)
    for name, kids in children.items():
        unknown = [kid for kid in kids if kid not in direct]
        if unknown:
            problems.append(f"topology: switch {name} names unknown switches {_listing(unknown)}")
            children[name] = [kid for kid in kids if kid in direct]

    levels: dict[str, int] = {}
    under: dict[str, frozenset[str]] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in levels:
            return
        if name in path:
            raise ValueError(" → ".join([*path[path.index(name) :], name]))
        for kid in children[name]:
            visit(kid, (*path, name))
        levels[name] = 1 + max((levels[kid] for kid in children[name]), default=-1)
        under[name] = frozenset(direct[name]).union(*(under[kid] for kid in children[name]))

    try:
        for name in sorted(direct):
            visit(name, ())
    except ValueError as loop:
        return {}, [*problems, f"topology: switches form a loop ({loop}): topology ignored"]
    switches = {
        name: Switch(name, levels[name], under[name], tuple(children[name])) for name in direct
    }
    return switches, problems


def derived_level_names(depth: int) -> tuple[str, ...]:
    """Names for a tree ``depth`` levels deep, widest first: ("spine", "leaf") for two."""
    return tuple(
        DERIVED_LEVEL_NAMES[level] if level < len(DERIVED_LEVEL_NAMES) else f"level-{level}"
        for level in range(depth - 1, -1, -1)
    )


def topology_paths(
    switches: Mapping[str, Switch], nodes: Iterable[str]
) -> tuple[dict[str, tuple[str, ...]], int, list[str]]:
    """Each node's switches, widest level first, one per level of the tree; its depth; and
    the problems (nodes under no switch, top switches that no switch joins).

    Where a node has no switch at a level (a tree of uneven depth), its nearest switch
    below stands in (a node hanging off a spine directly: that spine at the leaf level
    too), or, above its top switch, that top switch: the domain is then exactly its nodes,
    which is true of every level it lacks."""
    depth = 1 + max((switch.level for switch in switches.values()), default=-1)
    paths: dict[str, tuple[str, ...]] = {}
    outside = []
    for node in nodes:
        mine = sorted((s.level, s.name) for s in switches.values() if node in s.nodes)
        if not mine:
            if switches:
                outside.append(node)
            paths[node] = ()
            continue
        path = []
        for level in range(depth - 1, -1, -1):
            at_or_above = [entry for entry in mine if entry[0] >= level]
            path.append(min(at_or_above)[1] if at_or_above else mine[-1][1])
        paths[node] = tuple(path)
    problems = []
    if outside:
        problems.append(
            f"topology: node{'s' if len(outside) > 1 else ''} {_listing(outside)} "
            f"{'are' if len(outside) > 1 else 'is'} under no switch (topology.conf)"
        )
    tops = {path[0] for path in paths.values() if path}
    if len(tops) > 1:
        problems.append(
            f"topology: no switch joins the top switches {_listing(tops)}: Slurm's "
            "topology/tree runs no job across them"
        )
    return paths, depth, problems


def topology_levels(depth: int, configured: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """The level names: the settings' ``topology_levels`` when they fit the tree, else the
    derived ones and a problem saying what does not fit."""
    derived = derived_level_names(depth)
    if not configured or len(configured) == depth:
        return configured or derived, []
    if not depth:
        return (), [
            f"setting 'topology_levels' names {len(configured)} levels, but Slurm reports no "
            "switch tree (TopologyPlugin=topology/tree with a topology.conf)"
        ]
    return derived, [
        f"setting 'topology_levels' names {len(configured)} level"
        f"{'s' if len(configured) > 1 else ''} ({', '.join(configured)}), but the switch "
        f"tree has {depth} ({', '.join(derived)}): using {', '.join(derived)}"
    ]
