"""Reading clusters: how their backends are doing, as their syncs and inventory refreshes
leave it (platform admins' home page: one query whatever the number of clusters), the
clusters a platform admin manages, the capacity of each flavor, and the nodes' health:
their policy and their history."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Prefetch, Q, QuerySet, Sum

from clusters.health_policy import DEFAULT_POLICY, HealthPolicy, policy_from
from clusters.models import Cluster, ClusterFlavor, NodeHealthCheck, NodeHealthEvent
from core.schema import SchemaError
from core.types import UserLike
from tenants.access import require_platform_admin

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClusterHealth:
    name: str
    backend: str  # the backend's label
    last_sync_at: datetime | None
    inventory_at: datetime | None
    problems: tuple[str, ...]  # empty: healthy

    @property
    def healthy(self) -> bool:
        return not self.problems


def cluster_health_list(*, now: datetime) -> list[ClusterHealth]:
    """Every enabled cluster with what is wrong with it now: its last sync failed, its
    inventory could not be read or is out of date (its nodes then take no new work), or it
    was never read. A sync or refresh that succeeds clears its error."""
    health = []
    for cluster in Cluster.objects.filter(enabled=True).order_by("name"):
        problems = []
        if cluster.last_error:
            problems.append(f"Sync failed: {cluster.last_error}")
        if cluster.inventory_error:
            problems.append(f"Inventory not read: {cluster.inventory_error}")
        if cluster.inventory_at is None:
            problems.append("Inventory never read: its nodes take no work yet")
        elif cluster.inventory_valid_until is not None and cluster.inventory_valid_until < now:
            problems.append("Inventory out of date: its nodes take no new work")
        health.append(
            ClusterHealth(
                name=cluster.name,
                backend=Cluster.Backend(cluster.backend).label,
                last_sync_at=cluster.last_sync_at,
                inventory_at=cluster.inventory_at,
                problems=tuple(problems),
            )
        )
    return health


def offered_flavor_slugs() -> frozenset[str]:
    """Flavors some enabled cluster offers: the only ones GPUs can be borrowed of."""
    return frozenset(
        ClusterFlavor.objects.filter(cluster__enabled=True).values_list("flavor__slug", flat=True)
    )


def cluster_list_manageable(*, user: UserLike) -> QuerySet[Cluster]:
    """Every cluster with its capacity per flavor: platform admins only, else NotVisible."""
    require_platform_admin(user)
    return Cluster.objects.order_by("name").prefetch_related(
        Prefetch(
            "flavors",
            queryset=ClusterFlavor.objects.select_related("flavor").order_by("flavor__slug"),
        )
    )


def cluster_get_manageable(*, user: UserLike, name: str) -> Cluster:
    return cluster_list_manageable(user=user).get(name=name)


def flavor_capacity(*, flavor_ids: Iterable[int] | None = None) -> dict[int, int]:
    """flavor id -> GPUs of the flavor on enabled clusters."""
    pools = ClusterFlavor.objects.filter(cluster__enabled=True)
    if flavor_ids is not None:
        pools = pools.filter(flavor_id__in=list(flavor_ids))
    return dict(
        pools.values("flavor_id").annotate(gpus=Sum("gpus")).values_list("flavor_id", "gpus")
    )


def cluster_health_policy(*, cluster: Cluster) -> HealthPolicy:
    """The cluster's node-health policy: its stored overrides on the defaults. A stored
    policy that is not one (written around ``cluster_health_policy_set``) counts as the
    defaults, and says so in the log, rather than stopping every health decision."""
    try:
        return policy_from(cluster.health_policy or {})
    except SchemaError as exc:
        logger.warning("cluster %s: health policy ignored, defaults apply: %s", cluster.name, exc)
        return DEFAULT_POLICY


def node_health_events(
    *, cluster: Cluster, node: str | None = None, since: datetime | None = None
) -> QuerySet[NodeHealthEvent]:
    """A cluster's node-health history, newest first: every signal recorded and every act
    (a person's quarantine or release, Gantry's drain on the backend), of one node or all;
    ``since``: the events still going on then or later (last seen at or after it)."""
    events = NodeHealthEvent.objects.filter(cluster=cluster).select_related("actor")
    if node is not None:
        events = events.filter(node=node)
    if since is not None:
        events = events.filter(Q(last_observed_at__gte=since) | Q(observed_at__gte=since))
    return events.order_by("-observed_at", "-id")


def node_health_checks(*, cluster: Cluster, node: str, limit: int = 10) -> list[NodeHealthCheck]:
    """The node's latest active health checks, newest first, with who asked."""
    return list(
        NodeHealthCheck.objects.filter(cluster=cluster, node=node)
        .select_related("requested_by")
        .order_by("-requested_at", "-id")[:limit]
    )
