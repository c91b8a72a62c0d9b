"""Backends, found through a registry by the cluster's ``backend`` kind."""

from collections.abc import Callable

from jobs.backends.base import (
    Backend,
    BackendError,
    CheckpointReport,
    InventoryItem,
    JobRef,
    JobSpec,
    JobStatus,
    PermanentBackendError,
    TransientBackendError,
)

_REGISTRY: dict[str, Callable[..., Backend]] = {}


def register(kind: str):
    def decorator(factory):
        _REGISTRY[kind] = factory
        return factory

    return decorator


def backend_for(cluster) -> Backend:
    # Imported here so each backend registers itself without a cycle at import time.
    from jobs.backends import simulator  # noqa: F401

    try:
        factory = _REGISTRY[cluster.backend]
    except KeyError:
        raise PermanentBackendError(
            f"cluster {cluster.name}: backend {cluster.backend!r} is not available"
        ) from None
    return factory(cluster)


__all__ = [
    "Backend",
    "BackendError",
    "CheckpointReport",
    "InventoryItem",
    "JobRef",
    "JobSpec",
    "JobStatus",
    "PermanentBackendError",
    "TransientBackendError",
    "backend_for",
    "register",
]
