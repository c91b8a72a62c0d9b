"""The node map: every enabled cluster's GPU nodes by topology domain, what holds each GPU,
and how fragmented each flavor's free GPUs are.

GPUs are counted exactly as admission counts them (``jobs.admission.held_placements``): a
node's GPUs less the load from outside Gantry and the GPUs Gantry's runs hold there; a node
that takes no work (drained, cordoned, or not seen since its inventory went out of date)
has none free. The map costs the same handful of queries whatever the number of nodes and
runs.

Who is named: platform admins see every run. Members of tenants (and finance) see the same
map, with the runs of their own tenants named and linked and every other run reduced to
"another tenant": the names of those runs are never read, so no template can show them.
"""

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from django.utils import timezone

from clusters.health import NodeHealth
from clusters.models import Cluster, ClusterNode
from core.types import UserLike
from jobs import admission, admission_types, placement
from jobs.models import HOLDING_STATES, Run
from jobs.selectors.queue import QUARANTINED, cluster_nodes, held_runs
from tenants.access import NotVisible, global_roles, is_platform_admin, tenant_roles


class Occupant(StrEnum):
    RUN = "run"  # a run the user may see: named, linked to its page
    OTHER_TENANT = "other"  # runs of tenants the user is not a member of: anonymised
    OUTSIDE = "outside"  # jobs the cluster runs that Gantry did not submit
    FREE = "free"  # free: admission may place a run here now
    UNUSED = "unused"  # not in use, on a node that takes no work


@dataclass(frozen=True, slots=True)
class NamedRun:
    id: int
    name: str  # the experiment's
    tenant: str  # the tenant's name
    project: str
    user: str
    state: str
    borrowed: bool


@dataclass(frozen=True, slots=True)
class GpuGroup:
    """Consecutive GPUs of a node with one occupant; each GPU is drawn as a cell."""

    occupant: Occupant
    gpus: int
    run: NamedRun | None = None  # for Occupant.RUN only

    @property
    def cells(self) -> range:
        return range(self.gpus)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    gpus: int
    free: int
    schedulable: bool
    reason: str  # why it takes no work, in the backend's words
    groups: tuple[GpuGroup, ...]
    # GPUs held by Gantry's runs and used by outside jobs beyond what the node has: load
    # from outside took GPUs a run was placed on before the backend started it.
    overbooked: int = 0
    # Gantry's own view of the node (clusters.health.NodeHealth), and why, for platform
    # admins only (the reason may name what failed there).
    health: str = NodeHealth.HEALTHY.value
    health_reason: str = ""


@dataclass(frozen=True, slots=True)
class DomainView:
    """The nodes of one flavor in one topology domain: ``path`` widest first, () for none."""

    path: tuple[tuple[str, str], ...]  # (level name, domain name) pairs
    nodes: tuple[NodeView, ...]
    free: int


@dataclass(frozen=True, slots=True)
class GangSize:
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True, slots=True)
class FlavorView:
    flavor: str
    nodes: int
    gpus: int
    free: int
    # The largest gang that could start now, for every number of GPUs per node from the
    # largest node's down to 1: how many nodes have that many GPUs free, anywhere.
    largest_gangs: tuple[GangSize, ...]
    domains: tuple[DomainView, ...]

    @property
    def largest_gangs_text(self) -> str:
        """The figure the nodes page and the admin home show: "1 × 5–8, 2 × 1–4" (nodes ×
        GPUs per node), per-node sizes with the same number of nodes taken together, and
        the sizes no gang could start with said as such ("none with 7–8")."""
        return gangs_text(self.largest_gangs)

    def _gpus_of(self, *occupants: Occupant) -> int:
        return sum(
            group.gpus
            for domain in self.domains
            for node in domain.nodes
            for group in node.groups
            if group.occupant in occupants
        )

    @property
    def held(self) -> int:
        """GPUs Gantry's runs hold, the user's own tenants' and others' alike."""
        return self._gpus_of(Occupant.RUN, Occupant.OTHER_TENANT)

    @property
    def outside(self) -> int:
        return self._gpus_of(Occupant.OUTSIDE)

    @property
    def unused(self) -> int:
        """GPUs on nodes that take no work (drained, cordoned, out of date)."""
        return self._gpus_of(Occupant.UNUSED)

    @property
    def held_percent(self) -> float | None:
        """Gantry's share of the GPUs that could take its work (all but outside and unused)."""
        usable = self.gpus - self.outside - self.unused
        return None if usable <= 0 else 100 * self.held / usable


@dataclass(frozen=True, slots=True)
class ClusterView:
    name: str
    backend: str
    levels: tuple[str, ...]
    inventory_at: datetime | None
    inventory_valid_until: datetime | None
    stale: bool  # past inventory_valid_until: its nodes take no new work
    inventory_error: str
    problems: tuple[str, ...] | None  # None: not for this user (platform admins only)
    flavors: tuple[FlavorView, ...]


@dataclass(frozen=True, slots=True)
class NodeMap:
    clusters: tuple[ClusterView, ...]
    names_every_run: bool  # a platform admin: no run is anonymised


def _natural(text: str) -> tuple[str | int, ...]:
    """Sort key that puts node-9 before node-10."""
    return tuple(
        int(part) if index % 2 else part for index, part in enumerate(re.split(r"(\d+)", text))
    )


def gang_sizes(node_gpus: Iterable[int]) -> list[int]:
    """Every number of GPUs per node a gang could ask for on these nodes: from the largest
    node's GPUs down to 1 (8-GPU nodes: 8, 7, …, 1)."""
    largest = max((gpus for gpus in node_gpus if gpus > 0), default=0)
    return list(range(largest, 0, -1))


def gangs_text(gangs: Iterable[GangSize]) -> str:
    """Largest gangs per GPUs per node, in words: runs of per-node sizes with the same number
    of nodes as one range, largest first; the sizes no node could take last."""
    groups: list[list[int]] = []  # [nodes, fewest GPUs per node, most]
    for gang in sorted(gangs, key=lambda g: -g.gpus_per_node):
        if groups and groups[-1][0] == gang.nodes:
            groups[-1][1] = gang.gpus_per_node
        else:
            groups.append([gang.nodes, gang.gpus_per_node, gang.gpus_per_node])

    def sizes(fewest: int, most: int) -> str:
        return str(most) if fewest == most else f"{fewest}–{most}"

    some = [f"{nodes} × {sizes(fewest, most)}" for nodes, fewest, most in groups if nodes]
    none = [sizes(fewest, most) for nodes, fewest, most in groups if not nodes]
    if not some:
        return "none" if not none else f"none with {', '.join(none)}"
    return ", ".join(some) + (f"; none with {', '.join(none)}" if none else "")


def _named_runs(*, user: UserLike) -> dict[int, NamedRun]:
    """The runs holding GPUs that ``user`` may see named: all for platform admins, else the
    runs of the tenants the user is a member of (finance reads every run elsewhere, but the
    map names only a member's own tenants)."""
    runs = Run.objects.filter(state__in=HOLDING_STATES)
    if not is_platform_admin(user):
        runs = runs.filter(tenant_id__in=list(tenant_roles(user)))
    return {
        row["id"]: NamedRun(
            id=row["id"],
            name=row["experiment__name"],
            tenant=row["tenant__name"],
            project=row["experiment__project__name"],
            user=row["submitted_by__username"],
            state=row["state"],
            borrowed=row["borrowed"],
        )
        for row in runs.values(
            "id",
            "experiment__name",
            "tenant__name",
            "experiment__project__name",
            "submitted_by__username",
            "state",
            "borrowed",
        )
    }


def _node_view(
    node: admission_types.ClusterNode,
    held: list[tuple[int, int]],
    named: Mapping[int, NamedRun],
    health: tuple[str, str] = (NodeHealth.HEALTHY.value, ""),
    *,
    admin: bool = False,
) -> NodeView:
    groups = []
    hidden = 0
    for run_id, gpus in sorted(held):
        run = named.get(run_id)
        if run is None:
            hidden += gpus
        else:
            groups.append(GpuGroup(Occupant.RUN, gpus, run))
    if hidden:
        groups.append(GpuGroup(Occupant.OTHER_TENANT, hidden))
    holding = sum(gpus for _, gpus in held)
    outside = min(node.outside, max(0, node.gpus - holding))
    if outside:
        groups.append(GpuGroup(Occupant.OUTSIDE, outside))
    rest = max(0, node.gpus - holding - outside)
    if rest:
        groups.append(GpuGroup(Occupant.FREE if node.schedulable else Occupant.UNUSED, rest))
    return NodeView(
        name=node.name,
        gpus=node.gpus,
        free=rest if node.schedulable else 0,
        schedulable=node.schedulable,
        # Why Gantry quarantined it is for platform admins; everyone sees that it did.
        reason=node.reason if admin or health[0] != NodeHealth.QUARANTINED else QUARANTINED,
        groups=tuple(groups),
        overbooked=max(0, holding + node.outside - node.gpus),
        health=health[0],
        health_reason=health[1],
    )


def _flavor_view(
    flavor: str,
    nodes: list[NodeView],
    paths: Mapping[str, tuple[str, ...]],
    levels: tuple[str, ...],
) -> FlavorView:
    by_path: dict[tuple[str, ...], list[NodeView]] = defaultdict(list)
    for node in nodes:
        by_path[paths[node.name]].append(node)
    domains = tuple(
        DomainView(
            path=tuple(
                (placement.level_name(levels, depth), name)
                for depth, name in enumerate(path, start=1)
            ),
            nodes=tuple(sorted(members, key=lambda n: _natural(n.name))),
            free=sum(node.free for node in members),
        )
        for path, members in sorted(
            by_path.items(), key=lambda item: [_natural(p) for p in item[0]]
        )
    )
    free_nodes = [
        placement.Node(node.name, node.gpus, node.free, node.schedulable) for node in nodes
    ]
    return FlavorView(
        flavor=flavor,
        nodes=len(nodes),
        gpus=sum(node.gpus for node in nodes),
        free=sum(node.free for node in nodes),
        largest_gangs=tuple(
            GangSize(placement.largest_gang(free_nodes, gpus_per_node), gpus_per_node)
            for gpus_per_node in gang_sizes(node.gpus for node in nodes)
        ),
        domains=domains,
    )


def _unhealthy_nodes(*, admin: bool) -> dict[tuple[str, str], tuple[str, str]]:
    """(cluster, node) -> (health, reason) of the suspect and quarantined nodes, in one
    query; the reason only for platform admins."""
    rows = (
        ClusterNode.objects.filter(cluster__enabled=True)
        .exclude(health=NodeHealth.HEALTHY.value)
        .values_list("cluster__name", "name", "health", "health_reason")
    )
    return {
        (cluster, name): (health, reason if admin else "") for cluster, name, health, reason in rows
    }


def cluster_node_map(*, user: UserLike, now: datetime | None = None) -> NodeMap:
    """The node map of every enabled cluster, as ``user`` may see it. Raises NotVisible
    (404 at the edge) for a user with neither a tenant nor a global role."""
    if not global_roles(user) and not tenant_roles(user):
        raise NotVisible("No such page")
    now = now or timezone.now()
    clusters = {cluster.name: cluster for cluster in Cluster.objects.filter(enabled=True)}
    nodes = cluster_nodes(now=now)
    levels = {name: tuple(cluster.topology_levels) for name, cluster in clusters.items()}
    held = held_runs(now=now)
    snapshot = admission_types.Snapshot(
        queued=(), held=held, nodes=tuple(nodes), quotas={}, levels=levels
    )
    held_on: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    cluster_of = {run.id: run.cluster for run in held}
    for run_id, on in admission.held_placements(snapshot).items():
        for node_name, gpus in on.items():
            if gpus > 0:
                held_on[(cluster_of[run_id], node_name)].append((run_id, gpus))
    named = _named_runs(user=user)
    admin = is_platform_admin(user)
    unhealthy = _unhealthy_nodes(admin=admin)

    pools: dict[tuple[str, str], list[NodeView]] = defaultdict(list)
    paths: dict[str, dict[str, tuple[str, ...]]] = defaultdict(dict)
    for node in nodes:
        view = _node_view(
            node,
            held_on.get((node.cluster, node.name), []),
            named,
            unhealthy.get((node.cluster, node.name), (NodeHealth.HEALTHY.value, "")),
            admin=admin,
        )
        pools[(node.cluster, node.flavor)].append(view)
        paths[node.cluster][node.name] = node.path
    views = []
    for name, cluster in sorted(clusters.items()):
        valid_until = cluster.inventory_valid_until
        views.append(
            ClusterView(
                name=name,
                backend=Cluster.Backend(cluster.backend).label,
                levels=levels[name],
                inventory_at=cluster.inventory_at,
                inventory_valid_until=valid_until,
                stale=valid_until is not None and valid_until < now,
                inventory_error=cluster.inventory_error,
                problems=tuple(cluster.inventory_problems) if admin else None,
                flavors=tuple(
                    _flavor_view(flavor, pool, paths[name], levels[name])
                    for (cluster_name, flavor), pool in sorted(pools.items())
                    if cluster_name == name
                ),
            )
        )
    return NodeMap(clusters=tuple(views), names_every_run=admin)
