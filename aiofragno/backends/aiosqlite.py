"""SQLite through aiosqlite (asyncio): each connection has its own thread."""

from __future__ import annotations

from typing import TypeVar

import aiosqlite

from ..dialects import sqlite
from ..pool import PooledDialect
from ..url import DatabaseURL, Options

T = TypeVar("T")


class AiosqliteConnection(sqlite.SqliteConnection):
    async def _call(self, call: sqlite.Call[T]) -> T:
        # aiosqlite's hook for running a function on its thread: one hop for a
        # whole batch, where its public execute/fetch calls take one each.
        result: T = await self._raw._execute(call, self._raw._conn)
        return result

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
