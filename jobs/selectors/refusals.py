"""Why a run of a given shape could never start, whatever the queue: the flavor, node and
GPU counts the enabled clusters have, the tenant's quota, the topology levels offered and
whether any placement could ever exist. The submit validation and the submit form's preview
both ask ``resource_refusals``, so they never disagree."""

from clusters.models import Cluster, ClusterFlavor, ClusterNode
from jobs import admission_types, placement, shapes
from jobs.models import TopologyMode
from jobs.selectors.submit_context import SubmitContext
from tenants.models import GpuFlavor, Quota, Tenant


def flavor_node_limits() -> dict[str, tuple[int, int]]:
    """flavor slug -> (largest node count, largest GPUs per node) over enabled clusters."""
    limits: dict[str, tuple[int, int]] = {}
    rows = ClusterFlavor.objects.filter(cluster__enabled=True).values_list(
        "flavor__slug", "nodes", "gpus_per_node"
    )
    for slug, nodes, gpus_per_node in rows:
        max_nodes, max_gpus = limits.get(slug, (0, 0))
        limits[slug] = (max(max_nodes, nodes), max(max_gpus, gpus_per_node))
    return limits


def resource_refusals(
    *,
    tenant: Tenant | None,
    flavor: str,
    nodes: int,
    gpus_per_node: int,
    topology_level: str = "",
    topology_mode: str = "",
    context: SubmitContext | None = None,
) -> dict[str, list[str]]:
    """Why a run of this shape is refused at submit, by field; empty when it is not: the
    flavor, node and GPU counts the enabled clusters have, the tenant's quota (none, a per-run
    maximum, guarantee + borrow limit) and whether any placement could ever exist. The submit
    validation and the submit form's preview both ask this, so they never disagree.
    ``context``: the submit context of ``tenant`` and ``flavor`` (the flavor, its node
    limits, the tenant's quota of it), for a caller that has read it already (None: this
    reads them)."""
    errors: dict[str, list[str]] = {}

    def refuse(name: str, message: str) -> None:
        errors.setdefault(name, []).append(message)

    if context is None:
        limits = flavor_node_limits().get(flavor)
        flavor_known = GpuFlavor.objects.filter(slug=flavor).exists()
    else:
        limits = context.node_limits
        flavor_known = context.flavor is not None
    if not flavor_known:
        refuse("flavor", "Unknown GPU flavor.")
    elif limits is None:
        refuse("flavor", "No enabled cluster offers this GPU flavor.")
    if nodes < 1:
        refuse("nodes", "Must be at least 1.")
    if gpus_per_node < 1:
        refuse("gpus_per_node", "Must be at least 1.")
    if errors:
        return errors
    assert limits is not None  # else refused above
    max_nodes, max_gpus = limits
    quota = None
    if tenant is not None:
        if context is None:
            # One quota per (tenant, flavor): no order to ask for (the default one joins two
            # tables).
            quota = Quota.objects.filter(tenant=tenant, flavor__slug=flavor).order_by().first()
        else:
            quota = context.quota
    largest = _largest_run(tenant=tenant, flavor=flavor, limits=limits, quota=quota)
    if nodes > max_nodes:
        refuse("nodes", f"At most {max_nodes} nodes of {flavor}.{largest}")
    if gpus_per_node > max_gpus:
        refuse("gpus_per_node", f"A {flavor} node has at most {max_gpus} GPUs.{largest}")
    if tenant is not None and not errors:
        _quota_refusals(
            refuse,
            tenant=tenant,
            flavor=flavor,
            quota=quota,
            gpus=nodes * gpus_per_node,
            largest=largest,
        )
    # The levels are read only to judge a level asked for (most runs ask for none).
    levels = topology_levels_offered(flavor=flavor) if topology_level else []
    if topology_level and topology_level not in levels:
        refuse(
            "topology_level",
            f"No cluster with {flavor} GPUs has a {topology_level!r} level "
            f"(levels: {', '.join(levels) or 'none'}).",
        )
    if not {"nodes", "gpus_per_node", "topology_level"} & set(errors):
        why = placement_never_possible(
            flavor=flavor,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            topology_level=topology_level,
            required=bool(topology_level) and topology_mode == TopologyMode.REQUIRED,
        )
        if why:
            refuse("nodes", why)
    return errors


def _largest_run(
    *, tenant: Tenant | None, flavor: str, limits: tuple[int, int], quota: Quota | None
) -> str:
    """The largest run of ``flavor`` that could ever start (for ``tenant``: within its quota,
    with every node free), said after a refusal of a run too large, so the person knows what
    to ask for instead, after a space. "" when the tenant may run none (the refusal says why)."""
    max_nodes, max_gpus = limits
    cap = max_nodes * max_gpus
    if tenant is not None:
        if quota is None:
            return ""
        cap = min(cap, quota.guaranteed_gpus + quota.borrow_limit_gpus)
        if quota.max_gpus_per_run is not None:
            cap = min(cap, quota.max_gpus_per_run)
    nodes, per_node = placement.largest_shape(
        max_nodes=max_nodes, max_gpus_per_node=max_gpus, max_gpus=cap
    )
    if nodes == 0:
        return ""
    whose = f" for tenant {tenant.slug}" if tenant is not None else ""
    return (
        f" The largest {flavor} run that could ever start{whose}: {nodes * per_node} GPUs "
        f"({nodes} node{'s' if nodes > 1 else ''} × {per_node})."
    )


def _quota_refusals(
    refuse, *, tenant: Tenant, flavor: str, quota: Quota | None, gpus: int, largest: str
) -> None:
    """What the tenant's quota of the flavor (None: it has none) could never admit."""
    ceiling = 0 if quota is None else quota.guaranteed_gpus + quota.borrow_limit_gpus
    if quota is None or ceiling == 0:
        refuse("flavor", f"Tenant {tenant.slug} has no quota for {flavor}.")
    elif quota.max_gpus_per_run is not None and gpus > quota.max_gpus_per_run:
        refuse(
            "gpus_per_node",
            f"This run asks for {gpus} GPUs; tenant {tenant.slug} may use at most "
            f"{quota.max_gpus_per_run} {flavor} GPUs per run.{largest}",
        )
    elif gpus > ceiling:
        refuse(
            "gpus_per_node",
            f"This run asks for {gpus} GPUs and could never start: tenant {tenant.slug} may "
            f"hold at most {ceiling} {flavor} GPUs ({quota.guaranteed_gpus} guaranteed + "
            f"{quota.borrow_limit_gpus} borrowed).{largest}",
        )


def placement_never_possible(
    *, flavor: str, nodes: int, gpus_per_node: int, topology_level: str = "", required: bool = False
) -> str:
    """Why no enabled cluster could place this gang even with every node free and taking
    work; "" when one could. What a submit is refused for, not what it waits for."""
    inventory = []
    levels: dict[str, tuple[str, ...]] = {}
    for cluster, cluster_levels, name, gpus, path in ClusterNode.objects.filter(
        cluster__enabled=True, flavor__slug=flavor
    ).values_list("cluster__name", "cluster__topology_levels", "name", "gpus", "path"):
        levels[cluster] = tuple(cluster_levels)
        inventory.append(admission_types.ClusterNode(cluster, flavor, name, gpus, path=tuple(path)))
    why = shapes.never_placed(
        inventory,
        levels,
        flavor=flavor,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        topology_level=topology_level,
        required=required,
    )
    return f"{why[:1].upper()}{why[1:]}." if why else ""


def topology_levels_offered(*, flavor: str | None = None) -> list[str]:
    """The topology levels of enabled clusters (with GPUs of ``flavor``), widest first."""
    clusters = Cluster.objects.filter(enabled=True)
    if flavor is not None:
        clusters = clusters.filter(nodes__flavor__slug=flavor).distinct()
    levels: list[str] = []
    for names in clusters.order_by("name").values_list("topology_levels", flat=True):
        levels += [name for name in names if name not in levels]
    return levels
