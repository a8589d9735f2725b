"""SQLite through the standard library's sqlite3 on anyio worker threads — runs
under asyncio and trio alike.

A cancelled statement is interrupted (``sqlite3.Connection.interrupt``); the
next call on the connection waits until the interrupted one has returned.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from functools import partial
from typing import Any

import anyio

from ..dialects import sqlite
from ..pool import PooledDialect
from ..url import DatabaseURL, Options


class ThreadSqliteConnection(sqlite.SqliteConnection):
    def __init__(self, raw: sqlite3.Connection, gate: sqlite.WriteGate) -> None:
        super().__init__(raw, gate)
        # Held by the worker thread while it uses the connection, so a call made
        # after a cancelled one cannot overlap with it.
        self._busy = threading.Lock()

    def _call(self, sql: str, parameters: Sequence[Any]) -> sqlite.Outcome:
        with self._busy:
            return sqlite.run_statement(self._raw, sql, parameters)

    async def _run(self, sql: str, parameters: Sequence[Any]) -> sqlite.Outcome:
        return await anyio.to_thread.run_sync(
            partial(self._call, sql, parameters), abandon_on_cancel=True
        )

    def _interrupt(self) -> None:
        self._raw.interrupt()

    async def _close_raw(self) -> None:
        def close() -> None:
            with self._busy:
                self._raw.close()

        await anyio.to_thread.run_sync(close)


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    gate = sqlite.WriteGate()

    def open_raw() -> sqlite3.Connection:
        return sqlite3.connect(
            sqlite.database_path(url),
            isolation_level=None,
            timeout=options.busy_timeout,
            check_same_thread=False,
        )

    async def connect() -> ThreadSqliteConnection:
        connection = ThreadSqliteConnection(await anyio.to_thread.run_sync(open_raw), gate)
        await connection.configure(url, options)
        return connection

    return PooledDialect(
        name="sqlite",
        adapter=sqlite.adapter(options),
        compiler=sqlite.create_compiler,
        translate=sqlite.translate_error,
        connect=connect,
        options=options,
        pool_size=sqlite.pool_size(url, options),
        recycle=not url.is_memory,
    )
