"""A runtime-agnostic connection pool, and the Driver every backend gets from it.

One pool for every backend, so health checks, lifetimes and the handling of
interrupted connections behave the same on PostgreSQL, SQLite and MySQL. A
backend supplies only a coroutine that opens one :class:`Connection`.

(We do not use the drivers' own pools: asyncpg's sends a reset query — a round
trip — on every release, and their health and cancellation rules differ.)
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from . import runtime
from .driver import Connection, DialectAdapter, QueryCompiler
from .errors import DatabaseClosed, PoolTimeout, WrongEventLoop
from .hosts import HostStatus
from .slots import Slots
from .url import Options

Connector = Callable[[], Awaitable[Connection]]
ServersProbe = Callable[[], Coroutine[Any, Any, list[HostStatus]]]


# An idle connection, when it was opened and when it was last released.
# (A tuple: the pool makes one per release.)
_Idle = tuple[Connection, float, float]


@dataclass(frozen=True, slots=True)
class PoolStats:
    size: int
    idle: int
    in_use: int


class Pool:
    """At most ``size`` connections, handed out first-come first-served.

    Guarantees:

    * a connection found closed at checkout, older than ``max_lifetime`` or idle
      longer than ``max_idle`` is closed and replaced before the caller sees it;
      with ``pre_ping`` an idle connection also answers one round trip first;
    * ``acquire`` waits at most ``acquire_timeout`` for a free slot, then raises
      :class:`PoolTimeout`;
    * a connection released with ``discard=True`` is closed, never reused;
    * after ``close()``, ``acquire`` raises :class:`DatabaseClosed` and
      connections still in use are closed when they come back;
    * with ``bound_to_loop`` (connections that belong to the event loop that
      opened them), ``acquire`` from another loop than the first one's raises
      :class:`WrongEventLoop` before anything is sent.
    """

    def __init__(
        self,
        connect: Connector,
        *,
        size: int,
        acquire_timeout: float,
        max_lifetime: float | None = None,
        max_idle: float | None = None,
        pre_ping: bool = False,
        bound_to_loop: bool = False,
    ) -> None:
        self._connect = connect
        self.size = size
        self._acquire_timeout = acquire_timeout
        # (None is no limit: infinity, so that a freshness check compares
        # without asking which limits are set.)
        self._max_lifetime = math.inf if max_lifetime is None else max_lifetime
        self._max_idle = math.inf if max_idle is None else max_idle
        self._pre_ping = pre_ping
        self._slots = Slots(size, acquire_timeout)
        self._idle: list[_Idle] = []
        self._in_use: dict[Connection, float] = {}
        self._closed = False
        self._bound_to_loop = bound_to_loop
        self._loop: object = None  # of the first acquire (the Database's open)

    @property
    def stats(self) -> PoolStats:
        return PoolStats(self.size, len(self._idle), len(self._in_use))

    async def acquire(self) -> Connection:
        if self._closed:
            raise _closed()
        if self._bound_to_loop:
            self._check_loop()
        connection = self.take_idle()
        if connection is not None:
            return connection
        if not self._slots.take() and not await self._slots.acquire():
            raise PoolTimeout(
                f"no connection free after {self._acquire_timeout}s "
                f"({self.size} in use); raise pool_size or hold connections for less time"
            )
        try:
            if self._closed:  # (while this one waited)
                raise _closed()
            idle = self._idle
            if idle and not self._pre_ping and self._fresh(idle[-1]):
                connection, created, _ = idle.pop()
            else:
                connection, created = await self._checkout()
        except BaseException:
            self._slots.release()
            raise
        self._in_use[connection] = created
        return connection

    def take_idle(self) -> Connection | None:
        """A fresh idle connection, taken with its slot without awaiting
        anything — the usual checkout, for callers that can skip a coroutine —
        or None when :meth:`acquire` must do it (no free slot or no idle
        connection, ``pre_ping``, closed). Raises :class:`WrongEventLoop` as
        :meth:`acquire` does."""
        idle = self._idle
        if not idle or self._closed or self._pre_ping:
            return None
        if self._bound_to_loop and runtime.asyncio_loop() is not self._loop:
            self._check_loop()
        connection, created, released = idle[-1]
        # (_fresh written out: the usual checkout makes no call of its own for it.)
        now = runtime.monotonic()
        if (
            now - created > self._max_lifetime
            or now - released > self._max_idle
            or connection.is_closed
            or connection.is_stale
            or not self._slots.take()
        ):
            return None
        idle.pop()
        self._in_use[connection] = created
        return connection

    def put_back(self, connection: Connection) -> bool:
        """Return ``connection`` (in use, unchanged) to the idle list without
        awaiting anything; False, doing nothing, when it must go through
        :meth:`release` instead (the pool is closed, or the connection is not
        this pool's)."""
        created = self._in_use.get(connection)
        # (One that closed since is closed and replaced at its next checkout.)
        if created is None or self._closed:
            return False
        del self._in_use[connection]
        self._idle.append((connection, created, runtime.monotonic()))
        self._slots.release()
        return True

    async def release(self, connection: Connection, *, discard: bool = False) -> None:
        created = self._in_use.pop(connection, None)
        try:
            if created is None:
                raise RuntimeError("connection released twice or not from this pool")
            if discard or self._closed or connection.is_closed or connection.is_stale:
                await _close(connection)
            else:
                self._idle.append((connection, created, runtime.monotonic()))
        finally:
            if created is not None:
                self._slots.release()

    async def connect_outside(self) -> Connection:
        """A new connection that the pool neither counts nor keeps."""
        if self._closed:
            raise _closed()
        if self._bound_to_loop:
            self._check_loop()
        return await self._connect()

    async def close(self) -> None:
        """Close idle connections now and the rest as they are released. Idempotent."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection, _, _ in idle:
            await _close(connection)

    def _check_loop(self) -> None:
        # Caught here, a loop mix-up names itself; in the driver it surfaces as
        # "attached to a different loop", or as a hang.
        loop = runtime.running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise WrongEventLoop(
                "this Database was opened in another event loop, and its connections "
                "belong to that loop; open the Database in the loop that uses it (under "
                "pytest-asyncio: give the fixture that opens it the test's loop_scope)"
            )

    async def _checkout(self) -> tuple[Connection, float]:
        while self._idle:
            entry = self._idle.pop()  # most recently used: warm, least likely stale
            connection, created, _ = entry
            if self._fresh(entry) and (not self._pre_ping or await _answers(connection)):
                return connection, created
            await _close(connection)
        return await self._connect(), runtime.monotonic()

    def _fresh(self, entry: _Idle) -> bool:
        """Not seen closed, and within ``max_lifetime`` and ``max_idle``."""
        connection, created, released = entry
        now = runtime.monotonic()
        return (
            now - created <= self._max_lifetime
            and now - released <= self._max_idle
            and not connection.is_closed
            and not connection.is_stale
        )


def _closed() -> DatabaseClosed:
    return DatabaseClosed("the database was closed; open a new one with af.connect()")


async def _answers(connection: Connection) -> bool:
    try:
        await connection.ping()
    except Exception:
        return False
    return True


async def _close(connection: Connection) -> None:
    with runtime.shielded(runtime.CLEANUP_TIMEOUT):
        await connection.close()


class PooledDriver:
    """The :class:`~aiofragno.driver.Driver` of every backend: connections come
    from a :class:`Pool`; transactions are run by the connection itself."""

    def __init__(
        self,
        pool: Pool,
        servers: ServersProbe | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.pool = pool
        self._servers = servers
        self._close = close
        # (The pool's own methods, not one more call of ours around each.)
        self.take_idle_connection: Callable[[], Connection | None] = pool.take_idle
        self.return_idle_connection: Callable[[Connection], bool] = pool.put_back

    @property
    def pool_size(self) -> int:
        return self.pool.size

    async def init(self) -> None:
        await self.release_connection(await self.acquire_connection())

    # (The pool's own coroutines, not one more of ours around each.)

    def acquire_connection(self) -> Coroutine[Any, Any, Connection]:
        return self.pool.acquire()

    def release_connection(
        self, connection: Connection, *, discard: bool = False
    ) -> Coroutine[Any, Any, None]:
        return self.pool.release(connection, discard=discard)

    async def open_unpooled(self) -> Connection:
        return await self.pool.connect_outside()

    async def destroy(self) -> None:
        await self.pool.close()
        if self._close is not None:
            await self._close()

    async def servers(self) -> list[HostStatus]:
        return [] if self._servers is None else await self._servers()


@dataclass(frozen=True, slots=True)
class PooledDialect:
    """A :class:`~aiofragno.driver.Dialect` assembled from a backend's parts: the
    SQL family's adapter and compiler, the driver's error translation, and a
    coroutine opening one connection. Backends build one of these instead of
    repeating the plumbing."""

    name: Literal["postgresql", "sqlite", "mysql"]
    adapter: DialectAdapter
    compiler: Callable[[], QueryCompiler]
    translate: Callable[[BaseException], Exception]
    connect: Connector
    options: Options
    pool_size: int
    # False for SQLite :memory:, whose data lives only as long as its connection.
    recycle: bool = True
    # True where a connection belongs to the asyncio loop that opened it
    # (asyncpg's, asyncmy's): the Database is then refused in other loops.
    bound_to_loop: bool = False
    # Asks each server of the URL what it is (PostgreSQL); None: nothing to tell.
    servers: ServersProbe | None = None
    # Closes what the backend holds besides the pool's connections, after them.
    close: Callable[[], Awaitable[None]] | None = None

    def create_driver(self) -> PooledDriver:
        options = self.options
        return PooledDriver(
            Pool(
                self.connect,
                size=self.pool_size,
                acquire_timeout=options.acquire_timeout,
                max_lifetime=options.max_lifetime if self.recycle else None,
                max_idle=options.max_idle if self.recycle else None,
                pre_ping=options.pre_ping,
                bound_to_loop=self.bound_to_loop,
            ),
            self.servers,
            self.close,
        )

    def create_query_compiler(self) -> QueryCompiler:
        return self.compiler()

    def create_adapter(self) -> DialectAdapter:
        return self.adapter

    def translate_error(self, exc: BaseException) -> Exception:
        return self.translate(exc)
