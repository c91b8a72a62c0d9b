"""Every call to a backend goes through ``backend_call``: timed, and counted by the kind of
its error if it raises (the portal's metrics, core/metrics.py, take the kind as a string)."""

from collections.abc import Iterator
from contextlib import contextmanager

from clusters.backends.base import PermanentBackendError, TransientBackendError
from core import metrics


def error_kind(exc: BaseException) -> str:
    """The kind of a backend's error, as the metrics count it (``metrics.ERROR_KINDS``)."""
    if isinstance(exc, TransientBackendError):
        return "transient"
    if isinstance(exc, PermanentBackendError):
        return "permanent"
    return "unexpected"


@contextmanager
def backend_call(*, cluster: str, operation: str) -> Iterator[None]:
    """Time one call to a backend and count it if it raises (the error goes on)."""
    with metrics.backend_call_timed(cluster=cluster, operation=operation):
        try:
            yield
        except Exception as exc:
            metrics.backend_error_count(cluster=cluster, operation=operation, kind=error_kind(exc))
            raise
