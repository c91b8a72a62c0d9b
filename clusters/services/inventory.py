"""Writing what the backends report about their clusters: the node inventory (and the
node-health signals it carries), and asking a backend whether its settings work."""

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from clusters.backends import BackendError, backend_for, inventory_items
from clusters.backends.base import Inventory
from clusters.backends.calls import backend_call
from clusters.health import Signal, SignalClass, Source
from clusters.models import Cluster, ClusterFlavor, ClusterNode
from clusters.outside_claims import claims_record
from clusters.services.health import node_signals_record
from core.bulk import rows_update
from core.log_context import log_context
from tenants.models import GpuFlavor, max_length_of

logger = logging.getLogger(__name__)

# Node fields the inventory mirrors; a row is written only when one of them changed.
_NODE_FIELDS = (
    "flavor_id",
    "gpus",
    "gpus_used",
    "gpus_used_by_gantry",
    "schedulable",
    "reason",
    "path",
)
NODE_REASON_MAX_LENGTH = max_length_of(ClusterNode, "reason")


def cluster_refresh_inventory(*, cluster: Cluster, now=None) -> None:
    """Mirror the backend's node inventory: a ClusterNode row per GPU node, the cluster's
    topology levels, what an operator should fix, and ClusterFlavor (capacity in brief).

    A backend that cannot be asked leaves the rows as they were and says why on the
    cluster (``inventory_error``); their age then makes admission hold back rather than
    place runs on what may no longer be true. Nodes of an unknown flavor, or reporting more
    GPUs than a node of their flavor can have, are left out and named as problems."""
    with log_context(cluster=cluster.name):
        _cluster_refresh_inventory(cluster=cluster, now=now or timezone.now())


def _cluster_refresh_inventory(*, cluster: Cluster, now) -> None:
    backend = backend_for(cluster)
    try:
        with backend_call(cluster=cluster.name, operation="inventory"):
            inventory = backend.inventory()
    except BackendError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(inventory_error=str(exc)[:2000])
        raise
    flavors = GpuFlavor.objects.in_bulk({n.flavor for n in inventory.nodes}, field_name="slug")
    problems = list(inventory.problems)
    wanted: dict[str, dict[str, Any]] = {}
    for node in inventory.nodes:
        flavor = flavors.get(node.flavor)
        if flavor is None:
            problems.append(f"node {node.name}: GPUs of unknown flavor {node.flavor}, left out")
            continue
        if not 0 < node.gpus <= flavor.max_per_node:
            problems.append(
                f"node {node.name} reports {node.gpus} {flavor.slug} GPUs; a node has 1 to "
                f"{flavor.max_per_node}: left out"
            )
            continue
        used = max(0, min(node.gpus_used, node.gpus))
        wanted[node.name] = {
            "flavor_id": flavor.pk,
            "gpus": node.gpus,
            "gpus_used": used,
            "gpus_used_by_gantry": max(0, min(node.gpus_used_by_gantry, used)),
            "schedulable": node.schedulable,
            "reason": node.reason[:NODE_REASON_MAX_LENGTH],
            "path": list(node.path),
        }
    with transaction.atomic():
        current = {node.name: node for node in ClusterNode.objects.filter(cluster=cluster)}
        lost = _gpus_lost(
            cluster=cluster, inventory=inventory, current=current, flavors=flavors, now=now
        )
        created, changed = [], []
        for name, values in wanted.items():
            row = current.get(name)
            if row is None:
                created.append(ClusterNode(cluster=cluster, name=name, updated_at=now, **values))
            elif any(getattr(row, field) != value for field, value in values.items()):
                for field, value in values.items():
                    setattr(row, field, value)
                row.updated_at = now
                changed.append(row)
        ClusterNode.objects.bulk_create(created)
        fields = [*_NODE_FIELDS, "updated_at"]
        # Not bulk_update: it binds parameters per node and field, past PostgreSQL's 65,535
        # at some 4,000 nodes.
        rows_update(
            ClusterNode, fields, [(n.pk, *(getattr(n, f) for f in fields)) for n in changed]
        )
        ClusterNode.objects.filter(cluster=cluster).exclude(name__among=list(wanted)).delete()
        _flavors_update(cluster=cluster, nodes=wanted.values())
        max_age = backend.inventory_max_age_s
        Cluster.objects.filter(pk=cluster.pk).update(
            inventory_at=now,
            inventory_valid_until=None if max_age is None else now + timedelta(seconds=max_age),
            inventory_error="",
            topology_levels=list(inventory.levels),
            inventory_problems=problems[:50],
            outside_claims=claims_record(
                inventory.claims,
                error=inventory.claims_error,
                reclaim_first=backend.reclaim_first,
                flavors=flavors,
            ),
        )
    _signals_record(
        cluster=cluster, signals=[*lost, *(s for n in inventory.nodes for s in n.signals)], now=now
    )


def _gpus_lost(
    *,
    cluster: Cluster,
    inventory: Inventory,
    current: dict[str, ClusterNode],
    flavors: dict[str, GpuFlavor],
    now,
) -> list[Signal]:
    """A GPU_LOST signal for each node reporting fewer GPUs of its flavor than its row had
    (none, too: it is then left out of the inventory). Not for the simulator, whose node
    sizes a person sets on its capacity page."""
    if cluster.backend == Cluster.Backend.SIMULATOR:
        return []
    lost = []
    for node in inventory.nodes:
        row, flavor = current.get(node.name), flavors.get(node.flavor)
        if row is None or flavor is None or row.flavor_id != flavor.pk or node.gpus >= row.gpus:
            continue
        lost.append(
            Signal(
                node=node.name,
                signal=SignalClass.GPU_LOST,
                source=Source.INVENTORY,
                at=now.timestamp(),
                code=str(node.gpus),
                detail=f"reports {node.gpus} GPUs, had {row.gpus}",
            )
        )
    return lost


def _signals_record(*, cluster: Cluster, signals: list[Signal], now) -> None:
    """The inventory's node-health signals to the policy. Nothing here stops the refresh:
    a failure is logged, and the next refresh brings the backend's signals again."""
    if not signals:
        return
    try:
        node_signals_record(cluster=cluster, signals=signals, now=now)
    except Exception:
        logger.exception("cluster %s: node-health signals not recorded", cluster.name)


def _flavors_update(*, cluster: Cluster, nodes: Iterable[dict[str, Any]]) -> None:
    """ClusterFlavor rows from the nodes: per flavor, its node count, largest node and
    GPUs in all."""
    wanted: dict[int, tuple[int, int, int]] = {}
    for node in nodes:
        count, largest, total = wanted.get(node["flavor_id"], (0, 0, 0))
        wanted[node["flavor_id"]] = (count + 1, max(largest, node["gpus"]), total + node["gpus"])
    current = {
        cf.flavor_id: (cf.nodes, cf.gpus_per_node, cf.gpus)
        for cf in ClusterFlavor.objects.filter(cluster=cluster)
    }
    if wanted == current:
        return
    for flavor_id, (count, gpus_per_node, gpus) in wanted.items():
        ClusterFlavor.objects.update_or_create(
            cluster=cluster,
            flavor_id=flavor_id,
            defaults={"nodes": count, "gpus_per_node": gpus_per_node, "gpus": gpus},
        )
    ClusterFlavor.objects.filter(cluster=cluster).exclude(flavor_id__in=wanted).delete()


def cluster_test_connection(*, cluster: Cluster) -> tuple[bool, str]:
    """Ask the cluster's backend whether its settings work; (ok, a sentence saying so or why).

    Backends that have a dedicated check (Kubernetes: version + who am I) use it; the others
    are asked for their inventory, which needs the same connection.
    """
    try:
        backend = backend_for(cluster)
        check = getattr(backend, "test_connection", None)
        if check is not None:
            return True, check()
        with backend_call(cluster=cluster.name, operation="inventory"):
            items = inventory_items(backend.inventory())
    except BackendError as exc:
        return False, f"{cluster.name}: {exc}"
    flavors = ", ".join(f"{i.nodes}×{i.gpus_per_node} {i.flavor}" for i in items) or "no GPUs"
    return True, f"Connected to {cluster.name}: it reports {flavors}."
