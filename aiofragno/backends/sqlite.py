"""SQLite through the standard library's sqlite3, each connection on its own
worker thread — runs under asyncio and trio alike.

Calls on one connection run in order on its thread; the event loop is woken
straight from that thread (``call_soon_threadsafe`` / a trio token), which costs
less than a trip through a shared thread pool. A cancelled statement is
interrupted (``sqlite3.Connection.interrupt``); the next call queues behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import sniffio

from ..pool import PooledDialect
from ..url import DatabaseURL, Options
from .sqlite_connection import Call, SqliteConnection, WriteGate, database_path, pooled_dialect

T = TypeVar("T")
Wake = Callable[[Callable[[], object]], object]


def _waker() -> Wake:
    """How to run a callback in the current event loop from another thread."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon
    return asyncio.get_running_loop().call_soon_threadsafe


class _Worker:
    """One thread running submitted calls one after another."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="aiofragno-sqlite", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    async def run(self, func: Callable[[], T]) -> T:
        wake, done = _waker(), anyio.Event()
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append((True, func()))
            except BaseException as exc:  # handed to the awaiting task
                outcome.append((False, exc))
            # RuntimeError: the event loop is gone, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                wake(done.set)

        self._calls.put(call)
        await done.wait()
        ok, value = outcome[0]
        if not ok:
            raise value
        result: T = value
        return result

    def stop(self) -> None:
        self._calls.put(None)


class ThreadSqliteConnection(SqliteConnection):
    def __init__(self, raw: sqlite3.Connection, gate: WriteGate, worker: _Worker) -> None:
        super().__init__(raw, gate)
        self._worker = worker

    async def _call(self, call: Call[T]) -> T:
        return await self._worker.run(partial(call, self._raw))

    def _interrupt(self) -> None:
        self._raw.interrupt()

    async def _close_raw(self) -> None:
        try:
            await self._worker.run(self._raw.close)
        finally:
            self._worker.stop()


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

    return pooled_dialect(url, options, connect)
