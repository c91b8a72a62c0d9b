"""One cluster's nodes of one flavor in a cycle of the start-estimate simulation
(``jobs.estimates_state``): ``jobs.admission_pool.PoolState`` with the same answers, found
with less work for what that simulation asks over and over (pure: no ORM, no clock, no I/O).

- ``opened``: the nodes with GPUs available, kept up to date as the pool changes, so that
  a one-node gang's placement looks at those only, and so that a pool that could not hold
  a starving run's reservation better than another is not asked (``could_beat``).
- ``closest``: the nodes a starving run comes closest to fitting on, from each domain's
  nodes kept in their order (``_Domain``) while the pool changes only by fencing nodes,
  as reservations change it; the nodes not entered since the run began starving are found
  by when they were entered, without a look at the others.
"""

import math
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import cast

from jobs import placement
from jobs.admission_pool import PoolState
from jobs.admission_types import QueuedRun

# A node that could hold a gang's share: (GPUs available, name, topology path).
_Candidate = tuple[int, str, tuple[str, ...]]


class SimPool(PoolState):
    """A pool of one simulated cycle: a copy of the kept one (``of``) that knows its nodes
    with GPUs available (``opened``) and finds the nodes a starving run comes closest to
    fitting on, and a one-node gang's placement, with less work."""

    opened: dict[str, int]  # schedulable node -> GPUs available, where there are any
    _stale: set[str]  # nodes changed since their ``placement.Node`` in ``_placeable`` was made
    # When runs entered its nodes (``entered``), in order; None: to be sorted again. A run
    # enters or leaves a node only as GPUs are taken or given there (``_change``).
    _entered_times: list[float] | None
    _own_placeable: bool  # ``_placeable`` is its own, not the pool's it was copied from
    # (GPUs per node, level, excluded nodes) -> per domain, its nodes in ``closest``'s order
    _rooms: dict[tuple[int, int | None, tuple[str, ...]], list["_Domain"]]

    @classmethod
    def of(cls, pool: PoolState) -> "SimPool":
        """A copy of ``pool`` to change apart from it: nothing remembered, its own flavor
        counters (the cycle's state joins it to its flavor's). The nodes and what could
        ever hold a shape do not change: shared."""
        other = cls.__new__(cls)
        other.cluster, other.flavor, other.levels = pool.cluster, pool.flavor, pool.levels
        other.nodes = pool.nodes
        other.free = dict(pool.free)
        other.reserved = defaultdict(int, pool.reserved)
        other.fenced = set(pool.fenced)
        other.borrowed = list(pool.borrowed)
        other.holders = set(pool.holders)
        other.entered = dict(pool.entered)
        other.version = pool.version
        other.flavor_version, other.flavor_gives = [0], [0]
        other._memo = {}
        other.tally = Counter()
        dict.update(other.tally, pool.tally)  # as ``Counter(pool.tally)``, without its checks
        # Shared until a view needs the nodes changed made again (``view``).
        other._placeable, other._own_placeable = pool._placeable, False
        other._stale = set(pool._stale) if isinstance(pool, SimPool) else set()
        other._settled = pool._settled
        other._capable_by_shape = pool._capable_by_shape
        if isinstance(pool, SimPool):
            other.opened = dict(pool.opened)
        else:
            other.opened = {}
            for name, node in pool.nodes.items():
                room = node.schedulable and pool.available(name)
                if room:
                    other.opened[name] = room
        other._rooms = {}
        other._entered_times = pool._entered_times if isinstance(pool, SimPool) else None
        return other

    def _change(self, name: str, *, free: int = 0, reserved: int = 0) -> None:
        """``PoolState._change`` of a settled pool (every ``SimPool`` is), and ``opened``
        kept up to date."""
        self.version += 1
        self.flavor_version[0] += 1
        if free > 0 or reserved < 0:
            self.flavor_gives[0] += 1
        if not reserved:
            self._entered_times = None
        tally, opened = self.tally, self.opened
        node = self.nodes[name]
        if node.schedulable:
            before = opened.get(name, 0)
            tally[before] -= 1
        self.free[name] += free
        self.reserved[name] += reserved
        left = self.free[name]
        held = self.reserved[name]
        room = left - held if left > held else 0
        if node.schedulable:
            tally[room] = tally.get(room, 0) + 1
            if room:
                opened[name] = room
            elif before:
                del opened[name]
        self._stale.add(name)  # its ``placement.Node``: made again once a view asks
        if name not in self.fenced:
            self._rooms.clear()  # a fenced node is in no order any more: they stay right

    def view(self, extra: Mapping[str, int] | None = None) -> list[placement.Node]:
        """``PoolState.view``, the nodes changed since the last view made again first."""
        if self._stale:
            if not self._own_placeable:
                self._placeable, self._own_placeable = dict(self._placeable), True
            for name in self._stale:
                node = self.nodes[name]
                left, held = self.free[name], self.reserved[name]
                self._placeable[name] = placement.Node(
                    name, node.gpus, left - held if left > held else 0, node.schedulable,
                    node.path, node.reason, outside=node.outside,
                    held=min(held, left if left > 0 else 0),
                )  # fmt: skip
            self._stale.clear()
        return super().view(extra)

    def fence(self, name: str) -> None:
        super().fence(name)
        for domains in self._rooms.values():
            for domain in domains:
                domain.drop(name)

    def could_fit(self, nodes: int, gpus_per_node: int) -> bool:
        """``PoolState.could_fit``: whether enough nodes have that many GPUs available."""
        tally = self.tally
        return sum([tally[free] for free in tally if free >= gpus_per_node]) >= nodes

    def could_beat(
        self, count: int, gpus_per_node: int, since: float, rank: tuple[int, int, str]
    ) -> bool:
        """Whether ``closest`` could rank this pool before ``rank``: always, if that rank has
        entered nodes (this pool's could have none); else only with GPUs available on
        enough nodes it could take (not fenced, able to hold the gang's share) and not
        entered ``since``."""
        if rank[0] > 0:
            return True
        fenced, entered, nodes = self.fenced, self.entered, self.nodes
        inf = -math.inf
        rooms = [
            min(room, gpus_per_node)
            for name, room in self.opened.items()
            if name not in fenced
            and nodes[name].gpus - nodes[name].outside >= gpus_per_node
            and entered.get(name, inf) < since
        ]
        if len(rooms) > count:
            rooms = sorted(rooms, reverse=True)[:count]
        return (0, -sum(rooms), self.cluster) < rank

    def closest(
        self, run: QueuedRun, since: float
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        """``PoolState.closest``, the same nodes and rank, from the capable nodes of each
        domain in the order of what they have available (then the name), kept while the
        pool changes only by fencing nodes: the first ``nodes`` of them not entered
        ``since``, then the first entered ones."""
        level = self.required_level(run)
        if level == -1:
            return None
        count, need, excluded = run.nodes, run.gpus_per_node, run.excluded
        # Remembered until the pool changes: only which nodes were entered ``since``
        # matters, so the key has where ``since`` falls among the times they were.
        times = self._entered_times
        if times is None:
            times = self._entered_times = sorted(self.entered.values())
        key = ("closest", count, need, level, excluded, bisect_left(times, since))
        hit = self._memo.get(key)
        if hit is not None and hit[0] == self.version:
            return cast(tuple[tuple[str, ...], tuple[int, int]] | None, hit[1])
        found = self._closest_now(count, need, level, excluded, since)
        self._memo[key] = (self.version, found)
        return found

    def _closest_now(
        self, count: int, need: int, level: int | None, excluded: tuple[str, ...], since: float
    ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
        domains = self._rooms.get((need, level, excluded))
        if domains is None:
            domains = self._rooms[(need, level, excluded)] = self._by_room(need, level, excluded)
        best: tuple[tuple[int, int], _Domain, list[int]] | None = None
        for domain in domains:
            if len(domain.names) < count:
                continue
            chosen, rank = domain.first(count, since)
            if best is None or rank < best[0]:
                best = (rank, domain, chosen)
        if best is None:
            return None
        rank, domain, chosen = best
        return tuple(sorted(domain.names[index] for index in chosen)), rank

    def _by_room(
        self, gpus_per_node: int, level: int | None, excluded: tuple[str, ...]
    ) -> list["_Domain"]:
        """Per domain at ``level`` (in order), its nodes that could ever hold
        ``gpus_per_node`` and are neither fenced nor ``excluded``, in ``closest``'s order."""
        entered, fenced, opened = self.entered, self.fenced, self.opened
        inf = -math.inf
        domains = []
        for names in self.capable(gpus_per_node, level):  # each in name order
            if fenced or excluded:
                names = [name for name in names if name not in fenced and name not in excluded]
            # The nodes with GPUs available by what they have of it; then the others, all
            # at 0, in name order as they come.
            ranked = sorted(
                [(-min(opened[name], gpus_per_node), name) for name in names if name in opened]
            )
            order = [name for _, name in ranked]
            order += [name for name in names if name not in opened]
            minus = [minus for minus, _ in ranked] + [0] * (len(order) - len(ranked))
            domains.append(_Domain(minus, order, [entered.get(name, inf) for name in order]))
        return domains

    def place(
        self, run: QueuedRun, extra: Mapping[str, int] | None = None
    ) -> placement.Placement | None:
        """``PoolState.place``; for a one-node gang on the GPUs available now, the node
        ``jobs.placement`` picks (the fewest available GPUs that are enough, then the
        name), found among the nodes with GPUs available."""
        if extra or run.nodes < 1 or run.gpus_per_node < 1:
            return super().place(run, extra)
        need = run.gpus_per_node
        if run.nodes > 1 and not self.could_fit(run.nodes, need):
            return None  # as ``PoolState.place``: no look at the nodes
        level = self.required_level(run)
        if level == -1:
            return None
        # Remembered until the pool changes, as ``PoolState.place`` remembers its own.
        key = ("opened", run.nodes, need, level, run.excluded)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == self.version:
            return cast(placement.Placement | None, hit[1])
        if run.nodes > 1:
            where = self._place_gang(run.nodes, need, level, run.excluded)
            self._memo[key] = (self.version, where)
            return where
        depth = level or 0
        best: tuple[int, str] | None = None
        for name, room in self.opened.items():
            if room >= need and (best is None or (room, name) < best):
                node = self.nodes[name]
                if node.gpus >= need and len(node.path) >= depth and name not in run.excluded:
                    best = (room, name)
        where = None
        if best is not None:
            where = placement.Placement(
                nodes=(best[1],), domain=self.nodes[best[1]].path, single_node=True
            )
        self._memo[key] = (self.version, where)
        return where

    def _place_gang(
        self, count: int, need: int, level: int | None, excluded: tuple[str, ...]
    ) -> placement.Placement | None:
        """``jobs.placement.place`` of a gang of ``count`` nodes on the nodes as ``view``
        gives them, from the nodes with GPUs available: only those can hold a share, and
        only their GPUs add up to a domain's free ones (its rule for the tightest domain,
        then the least left behind, then the fewest free in the domain, then its name)."""
        nodes = self.nodes
        candidates = [
            (room, name, nodes[name].path)
            for name, room in self.opened.items()
            if room >= need and nodes[name].gpus >= need and name not in excluded
        ]
        if len(candidates) < count:
            return None
        deepest = max(len(path) for _, _, path in candidates)
        for depth in range(deepest, (level or 0) - 1, -1):
            domains: dict[tuple[str, ...], list[_Candidate]] = defaultdict(list)
            for candidate in candidates:
                if len(candidate[2]) >= depth:
                    domains[candidate[2][:depth]].append(candidate)
            options = []
            for domain, members in domains.items():
                if len(members) < count:
                    continue
                chosen = sorted(members)[:count]  # by GPUs available, then name
                left = sum(room - need for room, _, _ in chosen)
                free = sum(
                    room
                    for name, room in self.opened.items()
                    if len(nodes[name].path) >= depth and nodes[name].path[:depth] == domain
                )
                options.append((left, free, domain, chosen))
            if options:
                _, _, domain, chosen = min(options, key=lambda option: option[:3])
                return placement.Placement(
                    nodes=tuple(sorted(name for _, name, _ in chosen)),
                    domain=domain,
                    single_node=False,
                )
        return None


class _Domain:
    """A domain's nodes in ``closest``'s order: the most of what the gang needs available
    first (``minus`` it), then by name; with when a run last entered each (``entered``)."""

    __slots__ = ("entered", "minus", "names")

    def __init__(self, minus: list[int], names: list[str], entered: list[float]):
        self.minus, self.names, self.entered = minus, names, entered

    def drop(self, name: str) -> None:
        if name in self.names:
            index = self.names.index(name)
            del self.minus[index], self.names[index], self.entered[index]

    def first(self, count: int, since: float) -> tuple[list[int], tuple[int, int]]:
        """The positions of the first ``count`` nodes by the order, those not entered
        ``since`` before the others, and their rank in ``closest``: how many of them were
        entered, then minus what they have available of what the gang needs."""
        fresh: list[int] = []
        entered: list[int] = []
        minus = self.minus
        for index, at in enumerate(self.entered):
            if at < since:
                fresh.append(index)
                if len(fresh) == count:
                    return fresh, (0, sum([minus[index] for index in fresh]))
            elif len(entered) < count:
                entered.append(index)
        need = count - len(fresh)
        chosen = fresh + entered[:need]
        return chosen, (need, sum([minus[index] for index in chosen]))
