"""Reading a request's session row on the event loop itself (PostgreSQL, Django's database
sessions): the one query every proxied request makes, without a hop to a thread and back,
which on a busy machine cost more than the query (docs/workspaces.md, "The proxy")."""

import asyncio
from collections.abc import Mapping
from typing import Any

import psycopg
from django.contrib.sessions.models import Session
from django.utils import timezone

CONNECT_TIMEOUT_S = 5


class SessionRows:
    """One connection of its own, one query at a time (a query takes ~0.1 ms: thousands of
    requests a second); opened on first use, opened again after the database dropped it."""

    def __init__(self, database: Mapping[str, Any]) -> None:
        self._params = {
            "dbname": database["NAME"],
            "user": database.get("USER") or None,
            "password": database.get("PASSWORD") or None,
            "host": database.get("HOST") or None,
            "port": database.get("PORT") or None,
            "connect_timeout": CONNECT_TIMEOUT_S,
            **{k: v for k, v in (database.get("OPTIONS") or {}).items() if k == "sslmode"},
        }
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        table = Session._meta.db_table
        self._query = (
            f'SELECT session_data FROM "{table}" '  # noqa: S608 (our table's name)
            "WHERE session_key = %s AND expire_date > %s"
        )

    async def stored(self, session_key: str) -> str | None:
        """The session's stored data if it exists and has not expired (what the database
        session engine's ``load`` reads), else None."""
        async with self._lock:
            try:
                return await self._read(session_key)
            except psycopg.OperationalError:
                await self.close()  # dropped (a restart, a failover): once more, anew
                return await self._read(session_key)

    async def _read(self, session_key: str) -> str | None:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(
                autocommit=True, **self._params
            )
        cursor = await self._connection.execute(self._query, (session_key, timezone.now()))
        row = await cursor.fetchone()
        return row[0] if row else None

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None
