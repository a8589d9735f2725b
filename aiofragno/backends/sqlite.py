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

from ..pool import PooledDialect
from ..runtime import asyncio_loop
from ..url import DatabaseURL, Options
from .sqlite_connection import Call, SqliteConnection, WriteGate, database_path, pooled_dialect

T = TypeVar("T")
Wake = Callable[[Callable[[], object]], object]


Outcome = tuple[bool, Any]  # (True, the call's value) or (False, what it raised)


class _Worker:
    """One thread running submitted calls one after another."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="aiofragno-sqlite", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()

    async def run(self, func: Callable[[], T], settled: Callable[[T], object] | None = None) -> T:
        """``func()`` on the thread, its value or what it raised here. The
        thread wakes the event loop when done: under asyncio by settling a
        future of the loop (a third less CPU per call than an
        ``anyio.Event``, and each statement batch is one such call), under
        trio by setting an event through the run's token. ``settled`` is
        called with the value there, before the caller is woken (also if
        it was cancelled meanwhile)."""
        loop = asyncio_loop()
        if loop is not None:
            future: asyncio.Future[Outcome] = loop.create_future()
            self._submit(func, loop.call_soon_threadsafe, partial(_settle, future, settled))
            ok, value = await future
        else:
            import trio

            done = trio.Event()
            outcome: list[Outcome] = []

            def settle(result: Outcome) -> None:
                _tell(settled, result)
                outcome.append(result)
                done.set()

            self._submit(func, trio.lowlevel.current_trio_token().run_sync_soon, settle)
            await done.wait()
            ok, value = outcome[0]
        if not ok:
            raise value
        result: T = value
        return result

    def _submit(
        self, func: Callable[[], Any], wake: Wake, settle: Callable[[Outcome], object]
    ) -> None:
        """Queue ``func``; once it ran, ``wake`` calls ``settle`` with its outcome."""

        def call() -> None:
            try:
                outcome: Outcome = (True, func())
            except BaseException as exc:  # handed to the awaiting task
                outcome = (False, exc)
            # RuntimeError: the event loop is gone, so nobody is waiting any more.
            with contextlib.suppress(RuntimeError):
                wake(partial(settle, outcome))

        self._calls.put(call)

    def stop(self) -> None:
        self._calls.put(None)


def _settle(
    future: asyncio.Future[Outcome], settled: Callable[[Any], object] | None, outcome: Outcome
) -> None:
    _tell(settled, outcome)
    if not future.done():  # (else the awaiting task was cancelled)
        future.set_result(outcome)


def _tell(settled: Callable[[Any], object] | None, outcome: Outcome) -> None:
    ok, value = outcome
    if ok and settled is not None:
        settled(value)


class ThreadSqliteConnection(SqliteConnection):
    def __init__(self, raw: sqlite3.Connection, gate: WriteGate, worker: _Worker) -> None:
        super().__init__(raw, gate)
        self._worker = worker

    async def _call(self, call: Call[T]) -> T:
        return await self._worker.run(partial(call, self._raw))

    async def _call_settled(self, call: Call[T], settled: Callable[[T], object]) -> T:
        return await self._worker.run(partial(call, self._raw), settled)

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
