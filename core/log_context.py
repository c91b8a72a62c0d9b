"""Which run, attempt and cluster a log line concerns, without passing them to every call.

A service that acts on a run, an attempt or a cluster wraps its work in ``log_context``; a
``LogContextFilter`` on the log handler copies the ids onto every record emitted meanwhile,
in whatever module, and the JSON format (portal/log_format.py) writes them as fields. Context
variables keep concurrent requests and tasks apart. No Django here: logging is configured
before the apps are loaded.
"""

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

LOG_CONTEXT_FIELDS = ("run_id", "attempt_id", "cluster")

_current: ContextVar[Mapping[str, int | str]] = ContextVar(
    "gantry_log_context", default=MappingProxyType({})
)


@contextmanager
def log_context(
    *, run_id: int | None = None, attempt_id: int | None = None, cluster: str | None = None
) -> Iterator[None]:
    """Lines logged inside carry these ids, and those of any enclosing context."""
    given = {"run_id": run_id, "attempt_id": attempt_id, "cluster": cluster}
    merged = {**_current.get(), **{k: v for k, v in given.items() if v is not None}}
    token = _current.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _current.reset(token)


class LogContextFilter(logging.Filter):
    """Adds the ids of the current ``log_context`` to each record; drops none."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _current.get().items():
            if not hasattr(record, name):  # an explicit ``extra`` wins
                setattr(record, name, value)
        return True
