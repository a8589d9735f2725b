"""Run an asyncio-only backend (asyncpg, asyncmy) from trio.

:func:`bridged` wraps a backend's :class:`~aiofragno.pool.PooledDialect`. Each
Database opened with the result gets one helper thread (named
``aiofragno-asyncio-N``) running a private asyncio event loop, and every
coroutine of the driver — ``connect`` and each :class:`Connection` method —
runs on that loop. Guarantees:

* The trio task waits for a call without blocking the trio loop. A call costs
  one hop each way: ``loop.call_soon_threadsafe`` there, ``TrioToken.run_sync_soon``
  back. ``is_closed`` reads through without a hop; ``begin`` travels with the
  transaction's first statement (as the Connection protocol allows), and a
  batch crosses once however many statements it holds.
* A call's result or exception comes back as the very object the driver
  produced, so the backend's error translation sees the driver's own types.
* A call runs in a copy of the calling trio task's context (contextvars;
  ``loop.call_soon_threadsafe`` takes it on the trio side, and the task it
  starts inherits it), so what the driver's instrumentation reads from the
  context — the current OpenTelemetry span — is the caller's.
* Cancelling the waiting trio task cancels the asyncio task, waits (shielded, at
  most :data:`CANCEL_GRACE` seconds) until it has finished, then lets the
  cancellation propagate: the pool never resets or closes a connection that a
  cancelled call is still using. A connection whose ``connect`` finished
  while its caller was being cancelled is closed, not leaked.
* The thread starts with the first connection. Destroying the driver refuses
  new connections; the pool closes its idle ones (through the loop) at once and
  those in use when they are released, which keep working until then. When the
  last one is closed, the loop is shut down — leftover tasks cancelled, stray
  connections closed, the default executor shut down — and the thread joined.
  Afterwards calls raise :class:`DatabaseClosed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Generic, Literal, TypeVar, cast

import trio

from ..driver import (
    CompiledQuery,
    Connection,
    DeferredBegin,
    DialectAdapter,
    IsolationLevel,
    Listens,
    QueryCompiler,
    QueryResult,
    Row,
    RowStream,
    StopWhen,
)
from ..errors import ConnectionLost, DatabaseClosed
from ..pool import Connector, Pool, PooledDialect, PooledDriver, ServersProbe

T = TypeVar("T")
Factory = Callable[[], Coroutine[Any, Any, T]]

# How long a cancelled call waits for its asyncio task to finish.
CANCEL_GRACE = 5.0
# How long stopping the loop may take (each of: shutdown work, thread exit).
SHUTDOWN_TIMEOUT = 5.0

logger = logging.getLogger("aiofragno")
_thread_numbers = itertools.count(1)


class _Call(Generic[T]):
    """One coroutine run on the loop for one trio task, and its outcome."""

    __slots__ = (
        "_factory",
        "_token",
        "abandon",
        "abandoned",
        "done",
        "error",
        "finished",
        "task",
        "value",
    )

    def __init__(self, factory: Factory[T], abandon: Callable[[T], None] | None) -> None:
        self._factory = factory
        self._token = trio.lowlevel.current_trio_token()
        self.abandon = abandon  # on the loop: disposes of a value nobody will receive
        self.abandoned = False
        self.finished = False  # on the loop: the outcome is on its way to trio
        self.done = trio.Event()
        self.task: asyncio.Task[None] | None = None
        self.value: T | None = None
        self.error: BaseException | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop: begin running the coroutine."""
        self.task = loop.create_task(self._drive())
        # A callback, not the end of _drive: a task cancelled before its first
        # step never runs _drive's body.
        self.task.add_done_callback(self._finished)

    def cancel(self) -> None:
        """On the loop: the trio side gave up; stop the coroutine, and dispose
        of a value it produces anyway."""
        assert self.task is not None  # start() was scheduled before this
        if self.finished:
            self._dispose()
        else:
            self.abandoned = True  # _finished disposes
            self.task.cancel()

    def outcome(self) -> T:
        """On the trio side, once done: the value, or the driver's exception."""
        error = self.error
        if error is None:
            return cast(T, self.value)
        try:
            raise error
        finally:  # no cycle through this frame
            del error, self

    async def _drive(self) -> None:
        try:
            self.value = await self._factory()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc

    def _finished(self, task: asyncio.Task[None]) -> None:
        """On the loop, when the task is done: hand the outcome to the trio side."""
        self.finished = True
        if task.cancelled():  # by the trio side, or by the shutdown
            self.error = ConnectionLost("the Database was closed while this operation ran")
        if self.abandoned:
            self._dispose()
        _notify(self._token, self.done.set)

    def _dispose(self) -> None:
        if self.error is None and self.abandon is not None:
            self.abandon(cast(T, self.value))


class AsyncioLoopThread:
    """A private asyncio event loop in a helper thread, and the calls into it."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._live = 0  # connections handed out and not yet closed
        self._stopping = False  # no new connections; stop once _live is 0
        self._stopped = False
        self._on_exit: Callable[[], None] | None = None
        # Touched on the loop only: connections not yet closed, cleanup tasks.
        self._open: set[Connection] = set()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    async def run(self, factory: Factory[T], *, abandon: Callable[[T], None] | None = None) -> T:
        """Run the coroutine ``factory()`` on the loop and return its result."""
        if self._stopped:
            raise DatabaseClosed("the Database was closed; open a new one with af.connect()")
        return await self._call(self._started_loop(), _Call(factory, abandon))

    async def connect(self, connector: Connector) -> BridgedConnection:
        """Open a connection with ``connector`` on the loop."""
        if self._stopping:
            raise DatabaseClosed("the Database was closed; open a new one with af.connect()")
        raw = await self.run(partial(self._open_on_loop, connector), abandon=self._close_soon)
        self._live += 1
        return BridgedConnection(self, raw)

    async def close_connection(self, raw: Connection) -> None:
        """Close ``raw`` on the loop; after :meth:`stop`, the last one to close
        also shuts the loop down."""
        try:
            if not self._stopped:
                await self.run(partial(self._close_on_loop, raw))
        finally:
            self._live -= 1
            if self._stopping and self._live == 0:
                await self._shutdown()

    async def stop(self) -> None:
        """Refuse new connections, and shut the loop down now if none is open
        (else when the last one closes). Idempotent."""
        self._stopping = True
        if self._live == 0:
            await self._shutdown()

    async def _shutdown(self) -> None:
        """Stop the loop and join the thread; bounded even when the caller is
        being cancelled."""
        if self._stopped:
            return
        self._stopped = True
        loop = self._loop
        if loop is None:
            return
        try:
            with trio.move_on_after(SHUTDOWN_TIMEOUT, shield=True):
                await self._call(loop, _Call(self._shutdown_on_loop, None))
        finally:
            await self._join(loop)

    async def _call(self, loop: asyncio.AbstractEventLoop, call: _Call[T]) -> T:
        loop.call_soon_threadsafe(call.start, loop)
        try:
            await call.done.wait()
        except BaseException:
            await self._abandon(loop, call)
            raise
        return call.outcome()

    async def _abandon(self, loop: asyncio.AbstractEventLoop, call: _Call[Any]) -> None:
        loop.call_soon_threadsafe(call.cancel)
        with trio.move_on_after(CANCEL_GRACE, shield=True) as scope:
            await call.done.wait()
        if scope.cancelled_caught:
            logger.warning("a cancelled asyncio call did not finish within %ss", CANCEL_GRACE)

    def _started_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            name = f"aiofragno-asyncio-{next(_thread_numbers)}"
            self._thread = threading.Thread(target=self._main, name=name, daemon=True)
            self._thread.start()
        return self._loop

    def _main(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()
            asyncio.set_event_loop(None)
            if self._on_exit is not None:
                self._on_exit()

    async def _join(self, loop: asyncio.AbstractEventLoop) -> None:
        exited = trio.Event()
        self._on_exit = partial(_notify, trio.lowlevel.current_trio_token(), exited.set)
        loop.call_soon_threadsafe(loop.stop)
        with trio.move_on_after(SHUTDOWN_TIMEOUT, shield=True):
            await exited.wait()
        if not exited.is_set():
            logger.warning("the asyncio bridge thread did not stop within %ss", SHUTDOWN_TIMEOUT)
            return
        assert self._thread is not None
        self._thread.join()  # it has returned from _main: this does not block

    async def _open_on_loop(self, connector: Connector) -> Connection:
        connection = await connector()
        self._open.add(connection)
        return connection

    def _close_soon(self, raw: Connection) -> None:
        task = asyncio.get_running_loop().create_task(self._close_on_loop(raw))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _close_on_loop(self, raw: Connection) -> None:
        await raw.close()
        self._open.discard(raw)

    async def _shutdown_on_loop(self) -> None:
        await _cancel_other_tasks()  # calls still running, cleanup in flight
        for raw in list(self._open):
            try:
                await asyncio.wait_for(self._close_on_loop(raw), CANCEL_GRACE)
            except Exception as exc:
                logger.warning("closing a connection at shutdown failed: %r", exc)
        await _cancel_other_tasks()  # what closing started (e.g. cancel requests)
        loop = asyncio.get_running_loop()
        await loop.shutdown_asyncgens()
        await loop.shutdown_default_executor()


async def _cancel_other_tasks() -> None:
    """On the loop: cancel every task but this one and wait (bounded) for them."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=CANCEL_GRACE)


def _notify(token: trio.lowlevel.TrioToken, callback: Callable[[], object]) -> None:
    """From the loop thread: run ``callback`` on the trio loop soon (unless
    that trio run has ended, and so nobody is waiting)."""
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(callback)


class BridgedConnection:
    """A driver connection living on the loop thread, used from trio."""

    __slots__ = ("_begin", "_bridge", "_closed", "raw")

    def __init__(self, bridge: AsyncioLoopThread, raw: Connection) -> None:
        self._bridge = bridge
        self._closed = False
        # The driver's begin, run on the loop with the first statement.
        self._begin: DeferredBegin[Factory[None]] = DeferredBegin()
        self.raw = raw

    @property
    def is_closed(self) -> bool:
        return self._closed or self.raw.is_closed

    @property
    def is_stale(self) -> bool:
        return self.raw.is_stale

    @property
    def server_session(self) -> str | None:
        return self.raw.server_session

    @property
    def in_transaction(self) -> bool:
        # (An attribute of the connection, read without a hop: no call of
        # the loop uses the connection while its pool user awaits nothing.)
        return self.raw.in_transaction

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        if self._begin.pending is None:
            return await self._bridge.run(partial(self.raw.execute_query, query))
        return (await self.execute_batch((query,)))[0]

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await self._after_begin(partial(self.raw.execute_batch, queries, stop))

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await self._after_begin(partial(self.raw.commit_batch, queries, stop))

    async def stream(self, query: CompiledQuery, batch_size: int) -> BridgedStream:
        raw = await self._after_begin(partial(self.raw.stream, query, batch_size))
        return BridgedStream(self._bridge, raw)

    async def _after_begin(self, call: Factory[T]) -> T:
        """``call`` on the loop, after the deferred ``begin`` if one is pending:
        one crossing for both."""
        begin = self._begin.take()

        async def run() -> T:
            if begin is not None:
                await begin()
            return await call()

        return await self._bridge.run(run)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        self._begin.defer(partial(self.raw.begin, isolation))

    async def commit(self) -> None:
        if self._begin.drop():
            return  # nothing ran: nothing to commit
        await self._bridge.run(self.raw.commit)

    async def rollback(self) -> None:
        if self._begin.drop():
            return
        await self._bridge.run(self.raw.rollback)

    async def ping(self) -> None:
        await self._bridge.run(self.raw.ping)

    async def reset(self) -> bool:
        self._begin.drop()
        return await self._bridge.run(self.raw.reset)

    async def reset_session(self) -> bool:
        self._begin.drop()
        return await self._bridge.run(self.raw.reset_session)

    async def listen(self, channel: str, on_notify: Callable[[], object]) -> None:
        """The driver's LISTEN, its callbacks brought over to this trio run."""
        raw = self.raw
        if not isinstance(raw, Listens):
            raise TypeError(f"{type(raw).__name__} cannot listen for notifications")
        token = trio.lowlevel.current_trio_token()
        await self._bridge.run(partial(raw.listen, channel, partial(_notify, token, on_notify)))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._bridge.close_connection(self.raw)


class BridgedStream:
    """A driver's :class:`~aiofragno.driver.RowStream` on the loop thread: a
    hop each way per batch."""

    __slots__ = ("_bridge", "raw")

    def __init__(self, bridge: AsyncioLoopThread, raw: RowStream) -> None:
        self._bridge = bridge
        self.raw = raw

    async def fetch(self) -> list[Row]:
        return await self._bridge.run(self.raw.fetch)

    async def close(self, *, drain: bool) -> bool:
        return await self._bridge.run(partial(self.raw.close, drain=drain))


class BridgedDriver(PooledDriver):
    """The pooled driver whose connections live on ``bridge``; destroying it
    also stops the bridge's thread."""

    def __init__(
        self, pool: Pool, bridge: AsyncioLoopThread, servers: ServersProbe | None = None
    ) -> None:
        super().__init__(pool, servers)
        self.bridge = bridge

    async def destroy(self) -> None:
        try:
            await super().destroy()
        finally:
            await self.bridge.stop()


class BridgedDialect:
    """``dialect``, with one asyncio loop thread per driver it creates."""

    def __init__(self, dialect: PooledDialect) -> None:
        self.inner = dialect
        self.name: Literal["postgresql", "sqlite", "mysql"] = dialect.name

    def create_driver(self) -> BridgedDriver:
        bridge = AsyncioLoopThread()
        # The connections live in the bridge's loop, which outlasts the caller's
        # trio runs: the pool may be used from any of them.
        servers = self.inner.servers
        pooled = replace(
            self.inner,
            connect=partial(bridge.connect, self.inner.connect),
            bound_to_loop=False,
            servers=None if servers is None else partial(bridge.run, servers),
        )
        driver = pooled.create_driver()
        return BridgedDriver(driver.pool, bridge, pooled.servers)

    def create_query_compiler(self) -> QueryCompiler:
        return self.inner.create_query_compiler()

    def create_adapter(self) -> DialectAdapter:
        return self.inner.create_adapter()

    def translate_error(self, exc: BaseException) -> Exception:
        return self.inner.translate_error(exc)


def bridged(dialect: object) -> BridgedDialect:
    """``dialect`` (an asyncio backend's PooledDialect), usable from trio."""
    if not isinstance(dialect, PooledDialect):
        raise TypeError(f"the asyncio bridge wraps a PooledDialect, not {dialect!r}")
    return BridgedDialect(dialect)
