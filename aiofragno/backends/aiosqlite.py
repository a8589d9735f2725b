"""SQLite through aiosqlite (asyncio): each connection has its own thread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiosqlite

from ..dialects import sqlite
from ..pool import PooledDialect
from ..url import DatabaseURL, Options


class AiosqliteConnection(sqlite.SqliteConnection):
    async def _run(self, sql: str, parameters: Sequence[Any]) -> sqlite.Outcome:
        # One thread hop for a statement without rows, two with rows. The cursor
        # is not closed (a third hop): its statement has run to the end either
        # way, so nothing is left active on the connection.
        cursor = await self._raw.execute(sql, parameters)
        description = cursor.description
        rows = list(await cursor.fetchall()) if description is not None else []
        return description, rows, cursor.rowcount, cursor.lastrowid

    def _interrupt(self) -> None:
        # aiosqlite's own interrupt() is queued behind the running statement;
        # the sqlite3 connection's is thread-safe and immediate.
        self._raw._conn.interrupt()

    async def _close_raw(self) -> None:
        await self._raw.close()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    gate = sqlite.WriteGate(options.busy_timeout)

    async def connect() -> AiosqliteConnection:
        raw = await aiosqlite.connect(
            sqlite.database_path(url), isolation_level=None, timeout=options.busy_timeout
        )
        connection = AiosqliteConnection(raw, gate)
        await connection.configure(url, options)
        return connection

    return sqlite.pooled_dialect(url, options, connect)
