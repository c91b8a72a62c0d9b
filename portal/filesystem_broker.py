"""The embedded default's Celery broker: kombu's filesystem transport, written atomically.

Kombu's transport creates a message file and only then writes it, and a consumer takes any
``*.msg`` file it lists: a worker that lists the folder in between reads an empty message,
fails to decode it and stops ("Unrecoverable error: JSONDecodeError", kombu #1551), which
stops ``make run``. The exchange tables (the fan-out bindings of remote control) are
created the same way. Here every file is written under a name no reader takes and renamed
into place (``os.replace`` is atomic on POSIX), so a reader sees a whole file or none.

``portal/celery.py`` makes ``filesystem://`` mean this transport in every process.
"""

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

TEMPORARY_SUFFIX = ".tmp"


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all, as seen by any reader."""
    temporary = path.with_name(f"{path.name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ChannelError(f"Cannot write {path}") from exc


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's name, so its _get, _size and _purge find the message; the temporary name
        # ends in .tmp, which none of them takes for a message of any queue.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        write_atomically(Path(self.data_folder_out) / name, dumps(payload).encode())

    def _table_file(self, exchange: str) -> Path:
        # kombu's, which refuses a name that would leave the control folder; its stubs
        # (celery-types) predate it.
        return Path(self._exchange_file(exchange))  # type: ignore[attr-defined]

    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:  # type: ignore[override]
        try:
            table = loads(self._table_file(exchange).read_bytes())
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open the table of exchange {exchange!r}") from exc
        return [filesystem.exchange_queue_t(*binding) for binding in table]

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        self.control_folder.mkdir(exist_ok=True)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_locked(exchange):
            bindings = self.get_table(exchange)
            if binding not in bindings:
                self._table_write(exchange, [binding, *bindings])

    def _delete(
        self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any
    ) -> None:
        # The virtual channel's part (the queue's state in this process), not kombu's
        # in-place rewrite of the table.
        super(filesystem.Channel, self)._delete(
            queue, exchange, routing_key, pattern, *args, **kwargs
        )
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_locked(exchange):
            bindings = self.get_table(exchange)
            if binding in bindings:
                bindings.remove(binding)
                self._table_write(exchange, bindings)

    @contextmanager
    def _table_locked(self, exchange: str) -> Iterator[None]:
        # Writers read, change and replace a table one at a time: a lock on a file of its
        # own, as the table itself is replaced rather than written in place.
        file = self._table_file(exchange)
        self.control_folder.mkdir(exist_ok=True)
        with open(file.with_name(f"{file.name}.lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield

    def _table_write(self, exchange: str, bindings: list[filesystem.exchange_queue_t]) -> None:
        write_atomically(self._table_file(exchange), dumps(bindings).encode())


class Transport(filesystem.Transport):
    Channel = Channel
