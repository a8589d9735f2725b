"""SQLite through aiosqlite (asyncio): each connection has its own thread."""

from __future__ import annotations

from typing import TypeVar

import aiosqlite

from ..pool import PooledDialect
from ..url import DatabaseURL, Options
from .sqlite_connection import Call, SqliteConnection, database_path, pooled_dialect
from .sqlite_gate import WriteGate

T = TypeVar("T")


class AiosqliteConnection(SqliteConnection):
    async def _call(self, call: Call[T]) -> T:
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
    async def connect(gate: WriteGate) -> AiosqliteConnection:
        raw = await aiosqlite.connect(
            database_path(url), isolation_level=None, timeout=options.busy_timeout
        )
        return AiosqliteConnection(raw, gate)

    return pooled_dialect(url, options, connect)
