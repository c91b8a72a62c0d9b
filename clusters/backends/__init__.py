"""Backends, found through a registry by the cluster's ``backend`` kind."""

from collections.abc import Callable
from importlib import import_module

from clusters.backends.base import (
    MULTI_NODE_ENV,
    Backend,
    BackendError,
    CheckpointReport,
    Inventory,
    InventoryItem,
    JobRef,
    JobSpec,
    JobStatus,
    NodeInventory,
    PendingClaim,
    PermanentBackendError,
    TransientBackendError,
    WorkspaceSpec,
    inventory_items,
)

_REGISTRY: dict[str, Callable[..., Backend]] = {}
# Each backend lives in its own module and registers itself when imported; importing on
# first use keeps a deployment without, say, Kubernetes from loading its client.
_MODULES = {
    "simulator": "clusters.backends.simulator",
    "slurm": "clusters.backends.slurm",
    "kubernetes": "clusters.backends.kubernetes",
}


def register(kind: str):
    def decorator(factory):
        _REGISTRY[kind] = factory
        return factory

    return decorator


def backend_for(cluster) -> Backend:
    if cluster.backend not in _REGISTRY and cluster.backend in _MODULES:
        import_module(_MODULES[cluster.backend])
    try:
        factory = _REGISTRY[cluster.backend]
    except KeyError:
        raise PermanentBackendError(
            f"cluster {cluster.name}: backend {cluster.backend!r} is not available"
        ) from None
    return factory(cluster)


def spec_for_people(backend: str, stored: str) -> str:
    """An attempt's stored spec as a person reads it: Kubernetes manifests are stored as
    the JSON the API server receives and shown as YAML; scripts and the simulator's JSON
    as they are."""
    if backend == "kubernetes":
        from clusters.backends.k8s_manifest import stored_as_yaml

        return stored_as_yaml(stored)
    return stored


__all__ = [
    "MULTI_NODE_ENV",
    "Backend",
    "BackendError",
    "CheckpointReport",
    "Inventory",
    "InventoryItem",
    "JobRef",
    "JobSpec",
    "JobStatus",
    "NodeInventory",
    "PendingClaim",
    "PermanentBackendError",
    "TransientBackendError",
    "WorkspaceSpec",
    "backend_for",
    "inventory_items",
    "register",
    "spec_for_people",
]
