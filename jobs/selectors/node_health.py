"""What jobs read of node health: the cluster's policy, one field at a time."""

from typing import Any

from clusters.models import Cluster
from clusters.selectors import cluster_health_policy


def health_policy_value(cluster: Cluster, name: str) -> Any:
    """One field of the cluster's health policy (``clusters.health_policy.HealthPolicy``:
    its override, else the default). The one place jobs read the policy."""
    return getattr(cluster_health_policy(cluster=cluster), name)
