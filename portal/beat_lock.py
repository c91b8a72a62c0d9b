"""The lock that makes one of several beats the scheduler of periodic work, and the
schedule's last runs kept beside it (``portal/beat.py`` uses both; docs/operator-guide.md,
"Several beats").

Two backends behind one interface, chosen by ``GANTRY_BEAT_LOCK_URL``:

- Redis (``redis://``, the broker's by default): ``SET key token NX PX ttl`` takes the lock
  for ``ttl``; the holder renews it, and renewing, releasing and recording a run compare the
  token first, in one Lua script each, so a beat whose lock expired can neither prolong,
  nor free, nor write under the lock another beat took since. A killed holder's lock expires
  by itself after the TTL.
- A file (``file:///dir``, the embedded default's, which has no Redis): ``flock`` on
  ``dir/leader.lock``. The kernel releases it when the holder's process dies, so it needs no
  TTL; beats on one host share it.

The last runs live with the lock because whoever may take the lock can read them: a beat
that takes over continues the schedule where the one before stopped (seconds since the
epoch, one per entry name).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import redis

logger = logging.getLogger(__name__)

# Redis calls of a beat give up after this long: a beat that cannot reach Redis in time does
# not lead (its renewal counts as failed), long before its lock's TTL has run out.
REDIS_TIMEOUT_S = 3.0

# KEYS[1] the lock, ARGV[1] the token, ARGV[2] the TTL in milliseconds.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# KEYS[1] the lock, ARGV[1] the token.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
# KEYS[1] the lock, KEYS[2] the hash of last runs, ARGV[1] the token, then name, time, ….
_RECORD = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('hset', KEYS[2], unpack(ARGV, 2))
  return 1
end
return 0
"""


class LockUnreachable(Exception):
    """The lock's store did not answer: this beat cannot know whether it leads."""


class BeatLock(Protocol):
    """One beat holds it at a time; ``acquire`` and ``renew`` say whether this one does."""

    #: Where the lock is, for the logs (never a password).
    where: str

    def acquire(self) -> bool:
        """Take the lock if it is free (or already this beat's)."""

    def renew(self) -> bool:
        """Keep the lock for another TTL; False once it is no longer this beat's."""

    def release(self) -> None:
        """Free the lock if it is still this beat's."""

    def last_runs(self) -> dict[str, float]:
        """When each schedule entry last ran, in seconds since the epoch; LockUnreachable
        when the store does not answer."""

    def record_runs(self, runs: Mapping[str, float]) -> bool:
        """Store these last runs if this beat still holds the lock; whether it does."""


def beat_lock(url: str, *, key_prefix: str, ttl_s: float) -> BeatLock:
    """The lock at ``url``: ``redis://…`` (or ``rediss://``) or ``file:///directory``."""
    scheme = urlsplit(url).scheme
    if scheme in {"redis", "rediss"}:
        client = redis.Redis.from_url(
            url,
            socket_timeout=REDIS_TIMEOUT_S,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            decode_responses=True,
        )
        return RedisBeatLock(client, key_prefix=key_prefix, ttl_s=ttl_s, where=lock_where(url))
    if scheme == "file":
        return FileBeatLock(Path(urlsplit(url).path))
    raise ValueError(f"a beat lock URL starts with redis://, rediss:// or file://, not {scheme!r}")


def lock_where(url: str) -> str:
    """Where the lock at ``url`` is, for the logs: without the URL's user and password."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return f"file {parts.path}"
    return f"{parts.scheme} {parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"


def holder_name() -> str:
    """This process, as the logs and the lock's token name it."""
    return f"{socket.gethostname()} pid {os.getpid()}"


class RedisBeatLock:
    def __init__(
        self,
        client: redis.Redis,  # made with decode_responses=True
        *,
        key_prefix: str,
        ttl_s: float,
        where: str = "redis",
        token: str | None = None,
    ) -> None:
        self._client = client
        self._key = f"{key_prefix}:leader"
        self._runs_key = f"{key_prefix}:last-run"
        self._ttl_ms = round(ttl_s * 1000)
        # Unique even for a process that restarts with the same pid on the same host.
        self.token = token or f"{holder_name()} {secrets.token_hex(8)}"
        self.where = where
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._record = client.register_script(_RECORD)

    def acquire(self) -> bool:
        try:
            if self._client.set(self._key, self.token, nx=True, px=self._ttl_ms):
                return True
        except redis.RedisError as exc:
            _log_unreachable("take", exc)
            return False
        return self.renew()

    def renew(self) -> bool:
        try:
            return bool(self._renew(keys=[self._key], args=[self.token, self._ttl_ms]))
        except redis.RedisError as exc:
            _log_unreachable("renew", exc)
            return False

    def release(self) -> None:
        try:
            self._release(keys=[self._key], args=[self.token])
        except redis.RedisError as exc:
            _log_unreachable("release", exc)

    def last_runs(self) -> dict[str, float]:
        try:
            stored = self._client.hgetall(self._runs_key)
        except redis.RedisError as exc:
            raise LockUnreachable(f"{type(exc).__name__}: {exc}") from exc
        return {str(name): float(at) for name, at in stored.items()}

    def record_runs(self, runs: Mapping[str, float]) -> bool:
        pairs = [value for name, at in runs.items() for value in (name, repr(at))]
        try:
            return bool(self._record(keys=[self._key, self._runs_key], args=[self.token, *pairs]))
        except redis.RedisError as exc:
            _log_unreachable("record a run under", exc)
            return False


def _log_unreachable(action: str, exc: redis.RedisError) -> None:
    # The exception's class and text name the host, never the URL's password.
    logger.warning("beat: could not %s the leader lock: %s: %s", action, type(exc).__name__, exc)


class FileBeatLock:
    def __init__(self, directory: Path) -> None:
        self._lock_path = directory / "leader.lock"
        self._runs_path = directory / "last-run.json"
        self._fd: int | None = None
        self.where = f"file {self._lock_path}"

    def acquire(self) -> bool:
        if self._fd is not None:
            return self.renew()
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def renew(self) -> bool:
        """The kernel keeps the lock while this process lives; it is lost only when someone
        removed or replaced the file (another beat could then lock the new one)."""
        if self._fd is None:
            return False
        try:
            held = os.stat(self._lock_path).st_ino == os.fstat(self._fd).st_ino
        except FileNotFoundError:
            held = False
        if not held:
            self.release()
        return held

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def last_runs(self) -> dict[str, float]:
        try:
            stored = json.loads(self._runs_path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            logger.warning("beat: %s is not JSON; the schedule starts afresh", self._runs_path)
            return {}
        return {str(name): float(at) for name, at in stored.items()}

    def record_runs(self, runs: Mapping[str, float]) -> bool:
        if not self.renew():
            return False
        merged = self.last_runs() | dict(runs)
        # Written whole and renamed into place: a beat killed while writing leaves the
        # previous state, never half a file.
        temporary = self._runs_path.with_name(f"{self._runs_path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(merged, sort_keys=True))
        os.replace(temporary, self._runs_path)
        return True


class Leadership:
    """Whether this beat may send periodic tasks now, from its lock and a monotonic clock.

    A leader renews every third of the TTL, so a renewal that fails (Redis gone, the lock
    taken) still leaves two thirds of the TTL in which no other beat can lead: it stops
    sending at once. A standby tries to take the lock every ``poll_s``. A leader that was
    frozen (SIGSTOP, a swapped-out VM) past its renewal renews before it sends anything, and
    learns then that it lost the lock. ``check`` is called before every send.
    """

    def __init__(self, lock: BeatLock, *, ttl_s: float, poll_s: float) -> None:
        self.lock = lock
        self.leading = False
        self._renew_every_s = ttl_s / 3
        self._poll_s = poll_s
        self._next_check = float("-inf")

    def check(self, now: float) -> str | None:
        """Renew the lock or try to take it, if that is due at ``now``; the change of
        leadership it brought: ``"acquired"``, ``"lost"`` or None."""
        if now < self._next_check:
            return None
        if self.leading:
            if self.lock.renew():
                self._next_check = now + self._renew_every_s
                return None
            return self.lose(now)
        if self.lock.acquire():
            self.leading = True
            self._next_check = now + self._renew_every_s
            return "acquired"
        self._next_check = now + self._poll_s
        return None

    def lose(self, now: float) -> str:
        """Stop leading (the lock said so); try to take it again after ``poll_s``."""
        self.leading = False
        self._next_check = now + self._poll_s
        return "lost"

    def seconds_to_next_check(self, now: float) -> float:
        return max(0.0, self._next_check - now)
