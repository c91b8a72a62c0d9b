"""One cluster's nodes of one flavor as an admission cycle goes (``jobs.admission``): what
is free and held back on each node, which borrowed runs could be reclaimed there, and the
placements, closest nodes and reasons asked about it, remembered until it changes."""

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar, cast

from jobs import placement
from jobs.admission_types import ClusterNode, HeldRun, QueuedRun

_T = TypeVar("_T")


class PoolState:
    """One cluster's nodes of one flavor as the cycle goes: what is free on each node, what
    is held for starving runs, which borrowed runs could be reclaimed there."""

    def __init__(
        self, cluster: str, flavor: str, nodes: list[ClusterNode], levels: tuple[str, ...]
    ):
        self.cluster = cluster
        self.flavor = flavor
        self.levels = levels
        self.nodes = {node.name: node for node in sorted(nodes, key=lambda n: n.name)}
        self.free = {node.name: node.gpus - node.outside for node in nodes}
        self.reserved: dict[str, int] = defaultdict(int)
        self.fenced: set[str] = set()  # nodes a starving run waits on: no reclaims there
        self.borrowed: list[HeldRun] = []  # in victim order
        self.holders: set[int] = set()  # the runs holding GPUs here (by id)
        self.entered: dict[str, float] = {}  # node -> when the latest run on it was admitted
        # Every change bumps the version; placements, views and reasons computed at a
        # version are reused until the next change (many queued runs share a shape).
        self.version = 0
        # Shared by the pools of one flavor: bumped with any of their versions, it says
        # whether anything that answers a question about the flavor changed.
        self.flavor_version = [0]
        # Bumped, like it, only when GPUs become available (a preemption): until then a gang
        # that fitted nowhere still fits nowhere, since the cycle only takes GPUs.
        self.flavor_gives = [0]
        self._memo: dict[tuple[object, ...], tuple[int, object]] = {}
        # How many schedulable nodes have each number of available GPUs (a gang that needs
        # more such nodes than there are is refused without looking at the nodes), and the
        # nodes as placement sees them: built by ``settle`` once the held runs are in, then
        # kept up to date node by node.
        self.tally: Counter[int] = Counter()
        self._placeable: dict[str, placement.Node] = {}
        self._settled = False
        self._capable_by_shape: dict[tuple[int, int | None], list[list[str]]] = {}

    def settle(self) -> None:
        self.tally = Counter(
            self.available(name) for name, node in self.nodes.items() if node.schedulable
        )
        self._placeable = {
            name: placement.Node(
                name,
                node.gpus,
                self.available(name),
                node.schedulable,
                node.path,
                node.reason,
                outside=node.outside,
                held=self.held(name),
            )
            for name, node in self.nodes.items()
        }
        self._settled = True

    def available(self, name: str) -> int:
        return max(0, self.free[name] - self.reserved[name])

    def held(self, name: str) -> int:
        """GPUs of the node that are free but held back for a starving run."""
        return min(self.reserved[name], max(0, self.free[name]))

    def remembered(self, key: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``, or what it gave for ``key`` at this version."""
        hit = self._memo.get(key)
        if hit is not None and hit[0] == self.version:
            return cast(_T, hit[1])
        value = compute()
        self._memo[key] = (self.version, value)
        return value

    def _change(self, name: str, *, free: int = 0, reserved: int = 0) -> None:
        self.version += 1
        self.flavor_version[0] += 1
        if free > 0 or reserved < 0:
            self.flavor_gives[0] += 1
        if not self._settled:
            self.free[name] += free
            self.reserved[name] += reserved
            return
        schedulable = self.nodes[name].schedulable
        if schedulable:
            self.tally[self.available(name)] -= 1
        self.free[name] += free
        self.reserved[name] += reserved
        if schedulable:
            self.tally[self.available(name)] += 1
        self._placeable[name] = replace(
            self._placeable[name], free=self.available(name), held=self.held(name)
        )

    def take(self, name: str, gpus: int) -> None:
        if name in self.nodes:
            self._change(name, free=-gpus)

    def give(self, name: str, gpus: int) -> None:
        if name in self.nodes:
            self._change(name, free=gpus)

    def hold(self, name: str, gpus: int) -> None:
        self._change(name, reserved=gpus)

    def fence(self, name: str) -> None:
        self.version += 1
        self.flavor_version[0] += 1
        self.fenced.add(name)

    def closest(
        self, run: QueuedRun, since: float
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        """The ``nodes`` nodes that could ever hold the gang (inside one domain at its
        required level, with its GPUs besides those used from outside Gantry, not waited on
        by another run): the fewest that a run entered ``since``, then the most of what it
        needs available now. With their rank: (how many were entered, minus what they have);
        None if there are not that many."""
        level = self.required_level(run)
        if level == -1:
            return None
        # Only which nodes were entered since ``since`` matters: the memo is keyed on where
        # ``since`` falls among the times nodes were entered, not on the time itself.
        times = self.remembered(("entered",), lambda: sorted(set(self.entered.values())))
        return self.remembered(
            (
                "closest",
                run.nodes,
                run.gpus_per_node,
                level,
                bisect_left(times, since),
                run.excluded,
            ),
            lambda: self._closest(run.nodes, run.gpus_per_node, level, since, run.excluded),
        )

    def _closest(
        self,
        count: int,
        gpus_per_node: int,
        level: int | None,
        since: float,
        excluded: tuple[str, ...] = (),
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        best: tuple[tuple[str, ...], tuple[int, int]] | None = None
        entered, free, reserved, fenced = self.entered, self.free, self.reserved, self.fenced
        for names in self.capable(gpus_per_node, level):
            ranked = sorted(
                [
                    (
                        entered.get(name, -math.inf) >= since,
                        -min(max(0, free[name] - reserved[name]), gpus_per_node),
                        name,
                    )
                    for name in names
                    if name not in fenced and name not in excluded
                ]
            )[:count]
            if len(ranked) < count:
                continue
            rank = (sum(e for e, _, _ in ranked), sum(minus for _, minus, _ in ranked))
            if best is None or rank < best[1]:
                best = (tuple(sorted(name for _, _, name in ranked)), rank)
        return best

    def capable(self, gpus_per_node: int, level: int | None) -> list[list[str]]:
        """The nodes that could ever hold ``gpus_per_node`` (taking work, with that many
        GPUs besides the outside load), grouped by their domain at ``level``, domains in
        order. It depends on nothing the cycle changes: computed once per shape."""
        key = (gpus_per_node, level)
        if key not in self._capable_by_shape:
            domains: dict[tuple[str, ...], list[str]] = defaultdict(list)
            for name, node in self.nodes.items():
                if not node.schedulable or node.gpus - node.outside < gpus_per_node:
                    continue
                if level is None or len(node.path) >= level:
                    domains[node.path[:level] if level else ()].append(name)
            self._capable_by_shape[key] = [domains[domain] for domain in sorted(domains)]
        return self._capable_by_shape[key]

    def could_fit(self, nodes: int, gpus_per_node: int) -> bool:
        fitting = 0
        for free, count in self.tally.items():
            if free >= gpus_per_node:
                fitting += count
                if fitting >= nodes:
                    return True
        return False

    def required_level(self, run: QueuedRun) -> int | None:
        """The depth the run's gang must share, None for any; -1: this cluster has no such
        level, so the run cannot go here."""
        if not run.topology_required or not run.topology_level:
            return None
        if run.topology_level not in self.levels:
            return -1
        return self.levels.index(run.topology_level) + 1

    def view(self, extra: Mapping[str, int] | None = None) -> list[placement.Node]:
        """The nodes as ``jobs.placement`` takes them, with ``extra`` GPUs free on some."""
        nodes = list(self._placeable.values())
        if extra:
            nodes = [
                replace(
                    node,
                    free=max(0, self.free[node.name] + extra[node.name] - self.reserved[node.name]),
                )
                if extra.get(node.name)
                else node
                for node in nodes
            ]
        return nodes

    def place(
        self, run: QueuedRun, extra: Mapping[str, int] | None = None
    ) -> placement.Placement | None:
        if not extra and not self.could_fit(run.nodes, run.gpus_per_node):
            return None  # the common case on a busy cluster: no look at the nodes
        level = self.required_level(run)
        if level == -1:
            return None
        gang = placement.Gang(
            run.nodes, run.gpus_per_node, required_level=level, excluded=frozenset(run.excluded)
        )
        if extra:
            return placement.place(self.view(extra), gang)
        return self.remembered(("place", gang), lambda: placement.place(self.view(), gang))

    def left_after(self, run: QueuedRun, where: placement.Placement) -> int:
        return sum(self.available(name) - run.gpus_per_node for name in where.nodes)

    def explain(self, run: QueuedRun) -> str:
        level = self.required_level(run)
        if level == -1:
            return (
                f"needs its {run.nodes} nodes in one {run.topology_level}, a level {self.cluster}"
                f" does not have (its levels: {', '.join(self.levels) or 'none'})"
            )
        gang = placement.Gang(
            run.nodes, run.gpus_per_node, required_level=level, excluded=frozenset(run.excluded)
        )
        return self.remembered(
            ("explain", gang),
            lambda: placement.explain(self.view(), gang, flavor=self.flavor, levels=self.levels),
        )
