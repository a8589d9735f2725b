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
        async with self._raw.execute(sql, parameters) as cursor:
            description = cursor.description
            rows = await cursor.fetchall() if description is not None else []
            return description, list(rows), cursor.rowcount, cursor.lastrowid

    def _interrupt(self) -> None:
        # aiosqlite's own interrupt() is queued behind the running statement;
        # the sqlite3 connection's is thread-safe and immediate.
        self._raw._conn.interrupt()

    async def _close_raw(self) -> None:
        await self._raw.close()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    gate = sqlite.WriteGate()

    async def connect() -> AiosqliteConnection:
        raw = await aiosqlite.connect(
            sqlite.database_path(url), isolation_level=None, timeout=options.busy_timeout
        )
        connection = AiosqliteConnection(raw, gate)
        await connection.configure(url, options)
        return connection

    return sqlite.pooled_dialect(url, options, connect)
