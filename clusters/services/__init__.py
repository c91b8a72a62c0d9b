"""Writing what the backends report about their clusters (``inventory``) and the nodes'
health (``health``). Today's callers import the inventory's names from here."""

from clusters.services.inventory import (
    NODE_REASON_MAX_LENGTH,
    cluster_refresh_inventory,
    cluster_test_connection,
)

__all__ = ["NODE_REASON_MAX_LENGTH", "cluster_refresh_inventory", "cluster_test_connection"]
