"""SQLite through the standard library's sqlite3, each connection on its own
worker thread — runs under asyncio and trio alike.

Calls on one connection run in order on its thread; the event loop is woken
straight from that thread (``call_soon_threadsafe`` / a trio token), which costs
less than a trip through a shared thread pool. A cancelled statement is
interrupted (``sqlite3.Connection.interrupt``); the next call queues behind it.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from ..pool import PooledDialect
from ..url import DatabaseURL, Options
from .sqlite_connection import Call, SqliteConnection, database_path, pooled_dialect
from .sqlite_gate import WriteGate
from .thread_reply import Reply

T = TypeVar("T")


class _Worker:
    """One thread running submitted calls one after another."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="aiofragno-sqlite", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    async def run(self, func: Callable[[], T], settled: Callable[[T], object] | None = None) -> T:
        """``func()`` on the thread, its value or what it raised here; the
        thread wakes the event loop straight when done (:class:`Reply`).
        ``settled``: see :class:`Reply`."""
        reply: Reply[T] = Reply(settled)
        self._calls.put(partial(_answer, func, reply))
        return await reply.wait()

    def post(self, func: Callable[[], object]) -> None:
        """``func()`` on the thread, after the calls queued before it, with
        nobody waiting for it (it must not raise)."""
        self._calls.put(func)

    def stop(self) -> None:
        self._calls.put(None)


def _answer(func: Callable[[], T], reply: Reply[T]) -> None:
    try:
        value = func()
    except BaseException as exc:  # handed to the awaiting task
        reply.send(False, exc)
    else:
        reply.send(True, value)


class ThreadSqliteConnection(SqliteConnection):
    def __init__(self, raw: sqlite3.Connection, gate: WriteGate, worker: _Worker) -> None:
        super().__init__(raw, gate)
        self._worker = worker

    async def _call(self, call: Call[T]) -> T:
        return await self._worker.run(partial(call, self._raw))

    async def _call_settled(self, call: Call[T], settled: Callable[[T], object]) -> T:
        return await self._worker.run(partial(call, self._raw), settled)

    def post(self, run: Call[object]) -> None:
        """``run(sqlite3 connection)`` on the connection's thread, with nobody
        waiting for it (it must not raise)."""
        self._worker.post(partial(run, self._raw))

    def _interrupt(self) -> None:
        self._raw.interrupt()

    async def _close_raw(self) -> None:
        try:
            await self._worker.run(self._raw.close)
        finally:
            self._worker.stop()


class _Writer:
    """A connection as the write gate's writer (:mod:`.sqlite_gate`)."""

    def __init__(self, connection: ThreadSqliteConnection) -> None:
        self._connection = connection

    def post(self, run: Callable[[sqlite3.Connection], object]) -> None:
        self._connection.post(run)

    def interrupt(self) -> None:
        self._connection._interrupt()

    async def close(self) -> None:
        await self._connection.close()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    def open_raw() -> sqlite3.Connection:
        return sqlite3.connect(
            database_path(url),
            isolation_level=None,
            timeout=options.busy_timeout,
            check_same_thread=False,
        )

    async def connect(gate: WriteGate) -> ThreadSqliteConnection:
        worker = _Worker()
        try:
            raw = await worker.run(open_raw)
        except BaseException:
            worker.stop()
            raise
        return ThreadSqliteConnection(raw, gate, worker)

    return pooled_dialect(url, options, connect, _Writer)
