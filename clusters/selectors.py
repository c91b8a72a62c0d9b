"""How the cluster backends are doing, as their syncs and inventory refreshes leave it
(platform admins' home page): one query whatever the number of clusters."""

from dataclasses import dataclass
from datetime import datetime

from clusters.models import Cluster


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
