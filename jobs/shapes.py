"""Which shape of the same experiment starts first? (pure: no ORM, no clock, no I/O.)

A researcher asks for a shape (nodes × GPUs per node of a flavor, maybe inside one domain of
a topology level); the same experiment could often run in another: the same GPUs split
across more or fewer nodes, another flavor the tenant has a quota of, a looser topology.
``shape_starts`` names a few such shapes (at most ``MAX_SHAPES``, the one asked for
included) and says when each would start if submitted now, behind every queued run:

- now, when admission (``jobs.admission.decide``) on the current snapshot plus that run
  would admit it;
- else from the last forward simulation of the flavor's queue (``jobs.estimates``): the
  first simulated cycle where it fits (``estimates.first_fit``), exactly as the submit
  preview's start estimate is found, so the row of the shape asked for is that estimate.
  No queue is simulated again here, so a shape costs one admission decision and one pass
  over the stored steps;
- never, with the reason, when no quota or no cluster could ever hold it.

The rows come sorted by expected start, then by the start at full time limits.
"""

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import zip_longest

from jobs import admission, admission_types, estimates, placement

# At most this many shapes are judged, the one asked for included: each costs an admission
# decision over its flavor's queue, and a table longer than this is not read.
MAX_SHAPES = 8


@dataclass(frozen=True, slots=True)
class Shape:
    flavor: str
    nodes: int
    gpus_per_node: int
    topology_level: str = ""
    topology_required: bool = False

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def size(self) -> str:
        return f"{self.nodes}×{self.gpus_per_node}"

    @property
    def topology(self) -> str:
        if not self.topology_level:
            return "any"
        return f"one {self.topology_level}, {'required' if self.topology_required else 'preferred'}"


@dataclass(frozen=True, slots=True)
class ShapeStart:
    shape: Shape
    asked: bool  # the shape the researcher asked for
    expected: estimates.Start  # at None: no estimate, ``why`` says why
    full_limits: estimates.Start  # if every run ahead uses its whole max runtime
    now: bool = False  # admission would start it at once
    never: bool = False  # no quota or no cluster could ever hold it


def shape_of(run: admission_types.QueuedRun) -> Shape:
    return Shape(run.flavor, run.nodes, run.gpus_per_node, run.topology_level,
                 run.topology_required)  # fmt: skip


def shape_starts(
    snapshot: admission_types.Snapshot,
    *,
    probe: admission_types.QueuedRun,
    forecasts: Mapping[str, tuple[estimates.Forecast, estimates.Forecast]],
) -> tuple[ShapeStart, ...]:
    """When ``probe`` (a run not yet submitted) and a few other shapes of it would start,
    fastest first. ``forecasts``: flavor -> its last forward simulations (expected
    durations, full time limits); a flavor without one gets no number past now."""
    judged = [
        _judge(snapshot, run=_as(probe, shape), forecasts=forecasts, asked=index == 0)
        for index, shape in enumerate(
            alternatives(snapshot, asked=shape_of(probe), tenant=probe.tenant)
        )
    ]

    def order(row: ShapeStart) -> tuple[float, float, bool]:
        return (_at(row.expected, snapshot.now), _at(row.full_limits, snapshot.now), not row.asked)

    return tuple(sorted(judged, key=order))  # stable: ties keep the order they were named in


def _at(start: estimates.Start, now: float) -> float:
    # A forecast is up to a refresh old: a start it put before now is now, as shown.
    return math.inf if start.at is None else max(start.at, now)


def _as(probe: admission_types.QueuedRun, shape: Shape) -> admission_types.QueuedRun:
    return replace(
        probe,
        flavor=shape.flavor,
        nodes=shape.nodes,
        gpus_per_node=shape.gpus_per_node,
        topology_level=shape.topology_level,
        topology_required=shape.topology_required,
    )


def alternatives(snapshot: admission_types.Snapshot, *, asked: Shape, tenant: str) -> list[Shape]:
    """``asked`` first, then up to MAX_SHAPES - 1 others, taken in turn from three kinds so
    each kind is shown: a looser topology, another split of the same GPUs over nodes (fewest
    nodes first), another flavor the tenant has a quota of (the same GPUs, fewest nodes)."""
    kinds = (
        _looser(snapshot, asked),
        _splits(snapshot, asked),
        _other_flavors(snapshot, asked, tenant=tenant),
    )
    found = [asked]
    for group in zip_longest(*kinds):
        for shape in group:
            if shape is not None and shape not in found and len(found) < MAX_SHAPES:
                found.append(shape)
    return found


def _looser(snapshot: admission_types.Snapshot, asked: Shape) -> list[Shape]:
    """A required level loosened: each wider level of the flavor's clusters (narrowest
    first), then the asked level as a preference only. A preferred level waits for nothing,
    so loosening it changes no start."""
    if not (asked.topology_level and asked.topology_required):
        return []
    offered = _levels_of(snapshot, asked.flavor)
    wider = (
        offered[: offered.index(asked.topology_level)] if asked.topology_level in offered else []
    )
    return [
        *(replace(asked, topology_level=level) for level in reversed(wider)),
        replace(asked, topology_required=False),
    ]


def _splits(snapshot: admission_types.Snapshot, asked: Shape) -> list[Shape]:
    return [replace(asked, nodes=n, gpus_per_node=g) for n, g in _fitting_splits(snapshot, asked)]


def _other_flavors(snapshot: admission_types.Snapshot, asked: Shape, *, tenant: str) -> list[Shape]:
    """The same GPUs on each other flavor the tenant has a quota of, on the fewest nodes
    that can hold them (as asked, to be refused with the reason, when none can). The
    topology level is kept where that flavor's clusters have it."""
    shapes = []
    for (who, flavor), quota in sorted(snapshot.quotas.items()):
        if who != tenant or flavor == asked.flavor or quota.guaranteed + quota.borrow_limit == 0:
            continue
        other = replace(asked, flavor=flavor)
        if asked.topology_level not in _levels_of(snapshot, flavor):
            other = replace(other, topology_level="", topology_required=False)
        splits = _fitting_splits(snapshot, other, include_asked=True)
        if splits:
            other = replace(other, nodes=splits[0][0], gpus_per_node=splits[0][1])
        shapes.append(other)
    return shapes


def _fitting_splits(
    snapshot: admission_types.Snapshot, shape: Shape, *, include_asked: bool = False
) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) holding the same GPUs as ``shape`` that one cluster of its
    flavor has enough nodes for, fewest nodes first."""
    counts: dict[str, list[int]] = defaultdict(list)  # cluster -> GPUs of each node
    for node in snapshot.nodes:
        if node.flavor == shape.flavor:
            counts[node.cluster].append(node.gpus)
    found = []
    # No node has more GPUs than the largest: a count past it is not tried (a spec may ask
    # for a billion GPUs per node; only the refusal reads that number).
    largest = max((gpus for sizes in counts.values() for gpus in sizes), default=0)
    for per_node in range(min(shape.gpus, largest), 0, -1):
        if shape.gpus % per_node:
            continue
        nodes = shape.gpus // per_node
        if (nodes, per_node) == (shape.nodes, shape.gpus_per_node) and not include_asked:
            continue
        if any(sum(1 for gpus in sizes if gpus >= per_node) >= nodes for sizes in counts.values()):
            found.append((nodes, per_node))
    return found


def _levels_of(snapshot: admission_types.Snapshot, flavor: str) -> list[str]:
    """The topology levels of the clusters with GPUs of ``flavor``, widest first."""
    levels: list[str] = []
    for cluster in sorted({node.cluster for node in snapshot.nodes if node.flavor == flavor}):
        levels += [name for name in snapshot.levels.get(cluster, ()) if name not in levels]
    return levels


def _judge(
    snapshot: admission_types.Snapshot,
    *,
    run: admission_types.QueuedRun,
    forecasts: Mapping[str, tuple[estimates.Forecast, estimates.Forecast]],
    asked: bool,
) -> ShapeStart:
    shape = shape_of(run)
    never = never_reason(snapshot, run)
    if never:
        return _without(shape, asked, run, never, never=True)
    decisions = admission.decide(_with_flavor_only(snapshot, run), explain=False)
    admit = next((each for each in decisions.admitted if each.run_id == run.id), None)
    if admit is not None:
        start = estimates.Start(run.id, snapshot.now, admit.cluster, admit.nodes)
        return ShapeStart(shape, asked, expected=start, full_limits=start, now=True)
    wait = next(each for each in decisions.waiting if each.run_id == run.id)
    if wait.reason in estimates.STUCK:
        return _without(shape, asked, run, estimates.STUCK[wait.reason])
    stored = forecasts.get(run.flavor)
    if stored is None:
        return _without(shape, asked, run, f"no start forecast of {run.flavor} yet")
    expected, full_limits = (
        estimates.first_fit(
            forecast,
            run=run,
            quota=snapshot.quotas.get((run.tenant, run.flavor)),
            nodes=snapshot.nodes,
            levels=snapshot.levels,
        )
        for forecast in stored
    )
    return ShapeStart(shape, asked, expected=expected, full_limits=full_limits)


def _without(
    shape: Shape, asked: bool, run: admission_types.QueuedRun, why: str, *, never: bool = False
) -> ShapeStart:
    none = estimates.Start(run.id, None, why=why)
    return ShapeStart(shape, asked, expected=none, full_limits=none, never=never)


def _with_flavor_only(
    snapshot: admission_types.Snapshot, run: admission_types.QueuedRun
) -> admission_types.Snapshot:
    """The snapshot of ``run``'s flavor alone, ``run`` queued last: flavors share nothing in
    admission (as the forward simulation decides them), so this decides ``run`` as the whole
    snapshot would, at a fraction of the cost."""
    return replace(
        snapshot,
        queued=(*(each for each in snapshot.queued if each.flavor == run.flavor), run),
        held=tuple(each for each in snapshot.held if each.flavor == run.flavor),
        nodes=tuple(node for node in snapshot.nodes if node.flavor == run.flavor),
    )


def never_reason(snapshot: admission_types.Snapshot, run: admission_types.QueuedRun) -> str:
    """Why ``run`` could never start, whatever the queue: the tenant's quota of the flavor
    could never hold it, or no cluster could place it with every node free; "" if it could."""
    quota = snapshot.quotas.get((run.tenant, run.flavor))
    ceiling = 0 if quota is None else quota.guaranteed + quota.borrow_limit
    if quota is None or ceiling == 0:
        return estimates.STUCK[admission_types.Wait.NO_QUOTA]
    if quota.max_gpus_per_run is not None and run.gpus > quota.max_gpus_per_run:
        return estimates.STUCK[admission_types.Wait.TOO_LARGE]
    if run.gpus > ceiling:
        return f"the tenant may hold at most {ceiling} {run.flavor} GPUs"
    return never_placed(
        snapshot.nodes,
        snapshot.levels,
        flavor=run.flavor,
        nodes=run.nodes,
        gpus_per_node=run.gpus_per_node,
        topology_level=run.topology_level,
        required=run.topology_required,
    )


def never_placed(
    inventory: Sequence[admission_types.ClusterNode],
    levels: Mapping[str, Sequence[str]],
    *,
    flavor: str,
    nodes: int,
    gpus_per_node: int,
    topology_level: str = "",
    required: bool = False,
) -> str:
    """Why no cluster of ``inventory`` could place this gang even with every node free and
    taking work, as a phrase ("no single cluster has ..."); "" when one could."""
    by_cluster: dict[str, list[placement.Node]] = defaultdict(list)
    for node in inventory:
        if node.flavor == flavor:
            by_cluster[node.cluster].append(
                placement.Node(node.name, node.gpus, node.gpus, path=node.path)
            )
    if not by_cluster:
        return f"no enabled cluster has {flavor} GPUs"
    required = required and bool(topology_level)
    level_known = False
    for cluster, cluster_nodes in sorted(by_cluster.items()):
        level = None
        if required:
            cluster_levels = tuple(levels.get(cluster, ()))
            if topology_level not in cluster_levels:
                continue
            level = cluster_levels.index(topology_level) + 1
            level_known = True
        gang = placement.Gang(nodes, gpus_per_node, required_level=level)
        if placement.place(cluster_nodes, gang) is not None:
            return ""
    if required and not level_known:
        return f"no cluster with {flavor} GPUs has a {topology_level} level"
    within = f" in one {topology_level}" if required else ""
    return f"no single cluster has {nodes} nodes with {gpus_per_node} {flavor} GPUs each{within}"
