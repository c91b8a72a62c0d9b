"""The workspace proxy's questions to Django: whose session is this, may they open that
workspace and where does it answer; and the activity it records. Django's database calls
run on a small thread pool of its own, never on the event loop; only the one read every
request makes, of its session row, runs on the loop, without blocking it (sessions.py)."""

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import import_module
from typing import TypeVar

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user
from django.contrib.sessions.backends.base import SessionBase
from django.contrib.sessions.models import Session
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest
from django.utils import timezone

from jobs.selectors.workspace_proxy import workspace_address_for_owner, workspace_closed_for_owner
from jobs.services.workspace_activity import workspace_proxy_activity_record
from jobs.services.workspaces import workspace_server_token
from portal.workspace_proxy.relay import Closed, Target
from portal.workspace_proxy.sessions import SessionRows

log = logging.getLogger("gantry.workspace_proxy")

# Threads (and so database connections) per proxy process: a lookup takes well under a
# millisecond, so a few threads serve thousands of requests a second.
DATABASE_THREADS = 4
# Each process records what a person did through it in a workspace at most this often: the
# idle check reads it in minutes.
ACTIVITY_EVERY_S = 30.0
# How long what a live session may open is kept (its session is read on every request).
DECISION_TTL_S = 1.0
DECISIONS_KEPT = 100_000
DB_SESSION_ENGINE = "django.contrib.sessions.backends.db"

Result = TypeVar("Result")


class DjangoGate:
    """Sessions through Django's session engine and auth (a session logged out, expired,
    deleted or of a changed password is nobody), workspaces through the jobs selector.

    Every request reads its session (one query: a session logged out, deleted or expired
    is refused at once). What follows from a session, its person's account check and the
    workspace's address, is kept for DECISION_TTL_S per session and workspace
    (``SessionDecisions``): a changed password, a deactivated account or a workspace that
    moved on is seen within that second."""

    def __init__(
        self, *, activity_every_s: float = ACTIVITY_EVERY_S, on_loop_sessions: bool = True
    ) -> None:
        self.activity_every_s = activity_every_s
        database = connections[DEFAULT_DB_ALIAS]
        # PostgreSQL and database sessions: each request's session row is read on the loop.
        self._rows = (
            SessionRows(database.settings_dict)
            if on_loop_sessions
            and database.vendor == "postgresql"
            and settings.SESSION_ENGINE == DB_SESSION_ENGINE
            else None
        )
        self._executor = ThreadPoolExecutor(DATABASE_THREADS, thread_name_prefix="proxy-db")
        self._connections: list[BaseDatabaseWrapper] = []
        self._lock = threading.Lock()
        self._thread = threading.local()
        self._recorded: dict[int, float] = {}  # run id → when (monotonic) last recorded
        self._writes: set[asyncio.Future[None]] = set()
        self.decisions = SessionDecisions()

    async def target(self, *, session_key: str | None, run_id: int) -> Target | Closed | None:
        if not session_key:
            return None
        if self._rows is None:
            return await self._in_thread(lambda: self.decisions.target(session_key, run_id))
        stamp = await self._rows.stored(session_key)
        if stamp is None:
            return None  # logged out, deleted or expired
        kept = self.decisions.kept(session_key, run_id, stamp)
        if kept:
            return kept.target
        return await self._in_thread(
            lambda: self.decisions.decide(
                self.decisions.engine.SessionStore(session_key), run_id, stamp
            )
        )

    def activity(self, run_id: int) -> None:
        now = time.monotonic()
        last = self._recorded.get(run_id)
        if last is not None and now - last < self.activity_every_s:
            return
        self._recorded[run_id] = now
        write = asyncio.ensure_future(
            self._in_thread(lambda: workspace_proxy_activity_record(run_id=run_id))
        )
        self._writes.add(write)
        write.add_done_callback(self._written)

    def _written(self, write: "asyncio.Future[None]") -> None:
        self._writes.discard(write)
        if not write.cancelled() and write.exception() is not None:
            log.warning("workspace proxy: activity not recorded: %r", write.exception())

    async def _in_thread(self, work: Callable[[], Result]) -> Result:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_connection, work)

    def _with_connection(self, work: Callable[[], Result]) -> Result:
        own = connections[DEFAULT_DB_ALIAS]  # this thread's
        if not getattr(self._thread, "known", False):
            with self._lock:
                self._connections.append(own)
            self._thread.known = True
        try:
            return work()
        except (InterfaceError, OperationalError):
            # A connection the database dropped (a restart, a failover): once more on a new one.
            own.close()
            return work()

    async def close(self) -> None:
        """Wait for the activity writes under way, then close the threads' connections."""
        if self._writes:
            await asyncio.wait(self._writes)
        self._executor.shutdown(wait=True)
        if self._rows is not None:
            await self._rows.close()
        await asyncio.to_thread(self._close_connections)  # Django's calls are synchronous

    def _close_connections(self) -> None:
        for thread_connection in self._connections:
            thread_connection.inc_thread_sharing()  # closed from this thread, once
            thread_connection.close()
            thread_connection.dec_thread_sharing()
        self._connections.clear()


@dataclass(frozen=True)
class _Decision:
    at: float  # monotonic
    stamp: object  # the session as stored (or its login), to tell that it did not change
    target: Target | Closed | None


class SessionDecisions:
    """What a live session may open, kept for DECISION_TTL_S (thread-safe: a dict's get and
    set are atomic, and a lost race only repeats a lookup).

    Every call reads the session first. With Django's database sessions (the default) that
    is the engine's own query, written out (``SessionStore.load`` filters on the key and
    ``expire_date > now``): the ORM's building of it cost more than the proxy's whole
    budget on this machine. While the stored session is byte for byte the one decided on,
    within the second, the decision stands; otherwise the session is loaded through the
    engine and Django's auth again. Other engines are loaded through the engine each time.
    """

    def __init__(self) -> None:
        self._decisions: dict[tuple[str, int], _Decision] = {}
        self.engine = import_module(settings.SESSION_ENGINE)
        self._raw = settings.SESSION_ENGINE == DB_SESSION_ENGINE

    def target(self, session_key: str, run_id: int) -> Target | Closed | None:
        """The decision for a session (read now) and a workspace: kept, or made anew."""
        session = self.engine.SessionStore(session_key)
        stamp: object
        if self._raw:
            stamp = _stored_session(session_key)
        else:
            login = tuple(session.get(key) for key in (SESSION_KEY, BACKEND_SESSION_KEY))
            stamp = (*login, session.get(HASH_SESSION_KEY)) if login[0] is not None else None
        if stamp is None:
            return None  # logged out, deleted or expired
        kept = self.kept(session_key, run_id, stamp)
        return kept.target if kept else self.decide(session, run_id, stamp)

    def kept(self, session_key: str, run_id: int, stamp: object) -> "_Decision | None":
        """The decision kept for this session as stored (``stamp``) and workspace, if made
        less than DECISION_TTL_S ago. No database."""
        kept = self._decisions.get((session_key, run_id))
        if kept is not None and kept.stamp == stamp and time.monotonic() - kept.at < DECISION_TTL_S:
            return kept
        return None

    def decide(self, session: SessionBase, run_id: int, stamp: object) -> Target | Closed | None:
        """Decide through Django's session engine, auth and the jobs selector; keep it."""
        session_key = session.session_key  # before auth may flush it
        at = time.monotonic()
        target = session_workspace_target(session, run_id)
        if len(self._decisions) >= DECISIONS_KEPT:
            self._decisions.clear()  # rare: as many live sessions and workspaces per second
        if session_key is None:
            return target
        self._decisions[(session_key, run_id)] = _Decision(at=at, stamp=stamp, target=target)
        return target


def _stored_session(session_key: str) -> str | None:
    """The database session engine's row for ``session_key`` if not expired: its data."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT session_data FROM {connection.ops.quote_name(Session._meta.db_table)} "  # noqa: S608 (a table name of ours)
            "WHERE session_key = %s AND expire_date > %s",
            [session_key, timezone.now()],
        )
        row = cursor.fetchone()
    return row[0] if row else None


class _SessionRequest(HttpRequest):
    """Just enough of a request for django.contrib.auth.get_user: a session."""

    def __init__(self, session: SessionBase) -> None:
        super().__init__()
        self.session = session


def session_workspace_target(session: SessionBase, run_id: int) -> Target | Closed | None:
    """Where run ``run_id``'s workspace answers, if the session is of its owner (else None).
    Asks the database for the session (unless loaded), its user and the workspace."""
    user = get_user(_SessionRequest(session))
    if not user.is_authenticated:
        return None
    address = workspace_address_for_owner(run_id=run_id, user_id=user.pk)
    if address is None:
        closed = workspace_closed_for_owner(run_id=run_id, user_id=user.pk)
        return None if closed is None else Closed(closed)
    return Target(
        run_id=address.run_id,
        attempt_id=address.attempt_id,
        host=address.host,
        port=address.port,
        token=workspace_server_token(address.attempt_id),
    )
