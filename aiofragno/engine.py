"""The engine under a Database: what units of work, the outbox and
transactions run on.

It owns one database's connections — checked out into a :class:`Session`,
checked back in with its session state reset — and what it takes to talk
to that database: the dialect's adapter, query compiler and value codec,
the options, the stats, the outbox writer's compiled SQL. It runs
statements outside a transaction (or in the caller's current one) and
opens transactions. Features take the engine and never the
:class:`~aiofragno.Database`, which is the facade over it: the public API,
schemas and their layouts, migrations.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TypeVar

from . import runtime
from .codec import ValueCodec
from .driver import (
    ISOLATION_LEVELS,
    CompiledQuery,
    Connection,
    Dialect,
    DialectAdapter,
    IsolationLevel,
    Listens,
    leading_keyword,
)
from .errors import (
    ConnectionLost,
    DatabaseClosed,
    DatabaseUnavailable,
    Error,
    ProgrammingError,
    QueryCanceled,
    ValidationError,
)
from .hosts import HostStatus
from .outbox.tick_state import TickState
from .outbox.writer import EntryStatements, KeyedStatements, OutboxStatements, TickedStatements
from .queries import Queries, Read, whole_result
from .resilience import (
    FAILOVER_MAX_DELAY,
    MAX_DELAY,
    Deadline,
    is_retryable_loss,
    retry_read_after,
    shared_deadline,
)
from .session import Session, log_statement, logger
from .sql import Fragment
from .stats import Stats
from .streaming import EngineStream, Stream
from .transaction import (
    CommitWatcher,
    TransactionContext,
    current_transaction,
    transaction_stack,
)
from .uow.plans import CommitPlan
from .uow.plans import choose as choose_plan
from .url import DatabaseURL, Options, OutboxStrategy

T = TypeVar("T")


class Engine(Queries):
    """One database's connection pool and dialect, for aiofragno's features.
    ``backend`` (the driver's name) only describes it in error messages."""

    def __init__(self, dialect: Dialect, url: DatabaseURL, options: Options, backend: str) -> None:
        self.dialect = dialect
        self.url = url
        self.options = options
        self.backend = backend
        self.adapter = dialect.create_adapter()
        self.compiler = dialect.create_query_compiler()
        self._driver = dialect.create_driver()
        self.codec = ValueCodec(self.adapter.storage, naive_datetimes=options.naive_datetimes)
        # How outbox entries get their versions here (None: the outbox is off).
        self.outbox_strategy = outbox_strategy(options.outbox, self.adapter, dialect.name)
        # How units of work commit their mutation phase on this database.
        self.commit_plan: CommitPlan = choose_plan(self.adapter, self.outbox_strategy)
        self.stats = Stats()
        self._closed = False
        self._outbox_statements: EntryStatements | None = None
        self._keyed_outbox_statements: EntryStatements | None = None
        # What this engine's ticks have covered (aiofragno.outbox.ticks).
        self.outbox_ticks = TickState()
        # Connections open for listening (outside the pool), closed with the engine.
        self._listeners: set[Connection] = set()
        # The longest wait between attempts while the database is away: with
        # several servers (a failover under way) it is polled closely.
        several = len(url.servers) > 1
        self.reconnect_max_delay = FAILOVER_MAX_DELAY if several else MAX_DELAY

    @property
    def name(self) -> str:
        """The dialect: "postgresql", "sqlite" or "mysql"."""
        return self.dialect.name

    @property
    def pool_size(self) -> int:
        return self._driver.pool_size

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def outbox_statements(self) -> EntryStatements:
        """The outbox writer's SQL for this database and strategy, compiled once."""
        if self._outbox_statements is None:
            kind = TickedStatements if self.outbox_strategy == "ticks" else OutboxStatements
            self._outbox_statements = kind(self.compiler, self.adapter)
        return self._outbox_statements

    @property
    def keyed_outbox_statements(self) -> EntryStatements:
        """:attr:`outbox_statements` for a unit given an idempotency key:
        they record the key in ``fragno_db_unit_keys`` too."""
        if self._keyed_outbox_statements is None:
            self._keyed_outbox_statements = KeyedStatements(self.outbox_statements, self.compiler)
        return self._keyed_outbox_statements

    def describe(self) -> str:
        """The database and backend, as the Database's repr and errors name
        them (no password)."""
        return f"{self.url.describe()} backend={self.backend}"

    def compile(self, query: Fragment) -> CompiledQuery:
        return self.compiler.compile(query)

    def raw(self, text: str) -> Fragment:
        """A fragment of trusted SQL text without parameters (never build
        ``text`` from user input)."""
        return Fragment((text,))

    def transaction(
        self, isolation: IsolationLevel | None = None, *, watcher: CommitWatcher | None = None
    ) -> TransactionContext:
        """``async with engine.transaction() as tx`` (see
        :meth:`Database.transaction <aiofragno.Database.transaction>`);
        ``watcher`` is told of its COMMIT."""
        self.check_open()
        check_isolation(isolation)
        return TransactionContext(self, isolation, watcher=watcher)

    async def open(self) -> None:
        """Open the first connection, so a bad URL or a dead server fails now."""
        try:
            await self._driver.init()
        except Error:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for listener in list(self._listeners):
            await self.close_listener(listener)
        await self._driver.destroy()

    async def open_listener(
        self, channel: str, on_notify: Callable[[], object]
    ) -> Connection | None:
        """A connection of its own (outside the pool) listening on
        ``channel`` (see :class:`~aiofragno.driver.Listens`), or None where
        the backend cannot listen. Close it with :meth:`close_listener`; the
        engine closes those left open when it closes. Raises what opening a
        connection raises, translated."""
        self.check_open()
        try:
            connection = await self._driver.open_unpooled()
        except Error:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc
        self._listeners.add(connection)
        try:
            if not isinstance(connection, Listens):
                await self.close_listener(connection)
                return None
            await connection.listen(channel, on_notify)
        except BaseException as exc:
            await self.close_listener(connection)
            if isinstance(exc, Exception) and not isinstance(exc, Error):
                raise self.dialect.translate_error(exc) from exc
            raise
        return connection

    async def servers(self) -> list[HostStatus]:
        """Each server of the URL, asked afresh what it is (see
        :meth:`Database.servers <aiofragno.Database.servers>`)."""
        self.check_open()
        return await self._driver.servers()

    async def close_listener(self, connection: Connection) -> None:
        self._listeners.discard(connection)
        with runtime.shielded(runtime.CLEANUP_TIMEOUT):
            await connection.close()

    def check_open(self) -> None:
        if self._closed:
            raise DatabaseClosed(
                f"<aiofragno.Database {self.describe()} closed> is closed; "
                "open a new one with af.connect()"
            )

    def _stream(self, query: Fragment, batch_size: int) -> Stream:
        tx = current_transaction(self)
        if tx is not None:
            return tx._stream(query, batch_size)
        return EngineStream(self, self.compiler.compile(query), batch_size)

    async def _run(
        self, query: Fragment, read: Read[T], compiled: CompiledQuery | None = None
    ) -> T:
        """``query`` in the transaction open in this context, if any, else on
        a connection of the pool; ``read(result)``. A statement that may
        change the session (see :attr:`DialectAdapter.session_changes`) gets
        its connection reset before reuse; one that leaves a transaction open
        is refused. A plain SELECT that lost its connection is run again
        (``compiled`` given: this is that retry, which is not retried itself).
        One coroutine per query: the query methods return it as it is.

        (What :meth:`acquire`, :meth:`Session.execute` and :meth:`release`
        do, for the usual statement that succeeds and leaves the connection
        clean: the Session that notes what happened to the connection is
        made only when something did.)"""
        # (No transaction open in this context, the usual case, costs no call.)
        if transaction_stack.get() is not None:
            tx = current_transaction(self)
            if tx is not None:
                return read(await tx.execute(query))
        retry = compiled is None
        if compiled is None:
            compiled = self.compiler.compile(query)
        # (An idle connection, the usual case, takes no coroutine of its own;
        # acquire raises DatabaseClosed, and waits out the deadline while the
        # server is unreachable, so its failure is not retried below.)
        connection = None if self._closed else self._driver.take_idle_connection()
        if connection is None:
            connection = (await self.acquire()).connection
        dirty = self.adapter.session_changes(compiled.sql)
        if logger.isEnabledFor(logging.DEBUG):
            log_statement(compiled)
        try:
            result = await connection.execute_query(compiled)
        except BaseException as exc:
            session = self._session(connection, dirty)
            error = session.settle(exc)
            await self.release(session)
            # Only plain SELECTs are retried after a lost connection: anything
            # else (INSERT ... RETURNING through fetch, say) might have taken
            # effect.
            if (
                retry
                and isinstance(error, ConnectionLost | DatabaseUnavailable)
                and leading_keyword(compiled.sql) == "select"
                and is_retryable_loss(error)
            ):
                if error is not exc:
                    error.__cause__ = exc  # (as `raise error from exc` would)
                again = functools.partial(self._run, query, whole_result, compiled)
                return read(await retry_read_after(error, self.options.reconnect_deadline, again))
            if error is exc:
                raise
            raise error from exc
        if connection.in_transaction:
            await self.release(self._session(connection, True))
            raise ProgrammingError(
                f"{compiled.sql[:60]!r} left its connection in a transaction, which would "
                "have outlived the statement (BEGIN, START TRANSACTION or autocommit off "
                "outside db.transaction()); it has been rolled back. Run statements "
                "that belong together in `async with db.transaction() as tx:`"
            )
        if dirty or not self._driver.return_idle_connection(connection):
            await self.release(self._session(connection, dirty))
        return read(result)

    def _session(self, connection: Connection, dirty: bool) -> Session:
        session = Session(connection, self.dialect.translate_error)
        session.dirty = dirty
        return session

    async def acquire(self, *, wait: bool = True) -> Session:
        """A connection from the pool, wrapped in a :class:`Session`. While the
        server is unreachable, retries until ``reconnect_deadline`` (``wait``)."""
        self.check_open()
        connection = self._driver.take_idle_connection()  # (the usual case: no coroutine)
        if connection is not None:
            return Session(connection, self.dialect.translate_error)
        try:
            connection = await self._driver.acquire_connection()
        except Exception as exc:
            # (The deadline starts at the first failure: the usual checkout,
            # which succeeds at once, costs no deadline.) A backend's own
            # DatabaseUnavailable (no host of several suits: a failover under
            # way) is waited out as well; its other errors are final.
            if isinstance(exc, Error) and not isinstance(exc, DatabaseUnavailable):
                raise
            connection = await self._reconnect(exc, wait)
        return Session(connection, self.dialect.translate_error)

    async def _reconnect(self, failure: Exception, wait: bool) -> Connection:
        """A connection, after acquiring one failed with ``failure``: retried
        while the server is unavailable, until the operation's deadline."""
        with shared_deadline(self.options.reconnect_deadline if wait else None) as deadline:
            if not wait:
                deadline = Deadline(None)
            while True:
                error = self._unavailable(failure)
                deadline.max_delay = min(deadline.max_delay, self.reconnect_max_delay)
                if not isinstance(error, DatabaseUnavailable) or not await deadline.wait():
                    if error is failure:  # (the backend's own: no cause to chain)
                        raise error
                    raise error from failure
                self.stats.reconnect_waits += 1
                self.check_open()
                try:
                    return await self._driver.acquire_connection()
                except Exception as exc:
                    if isinstance(exc, Error) and not isinstance(exc, DatabaseUnavailable):
                        raise
                    failure = exc

    async def release(self, session: Session) -> None:
        """Return ``session``'s connection: reset it if an operation was
        interrupted, restore its session if that may have changed or the
        server still has a transaction open on it, discard it if it broke
        (or a reset failed). So the next caller gets the session as it was
        after connect."""
        connection = session.connection
        if not (
            session.broken
            or session.interrupted
            or session.in_transaction
            or session.dirty
            or connection.in_transaction
        ):
            # Clean: going back to the idle list awaits nothing that could be
            # cancelled, so no shielded scope is needed.
            if not self._driver.return_idle_connection(connection):
                await self._driver.release_connection(connection)
            return
        with runtime.shielded(runtime.CLEANUP_TIMEOUT):
            discard = session.broken
            try:
                if not discard and (session.interrupted or session.in_transaction):
                    discard = not await connection.reset()
                if not discard and (session.dirty or connection.in_transaction):
                    self.stats.session_resets += 1
                    discard = not await connection.reset_session()
            except Exception:
                discard = True
            await self._driver.release_connection(connection, discard=discard)

    def _unavailable(self, exc: Exception) -> Error:
        if isinstance(exc, DatabaseUnavailable):
            return exc  # (the backend's own, which says what it tried)
        error = self.dialect.translate_error(exc)
        # Failing to connect in time is the server being unavailable, whatever
        # the driver calls it.
        if isinstance(error, ConnectionLost | DatabaseUnavailable | QueryCanceled):
            return DatabaseUnavailable(
                f"cannot connect to {self.url.describe()}: {error}; "
                "check that the server is running and the URL is right",
                sqlstate=error.sqlstate,
                code=error.code,
            )
        return error if isinstance(error, Error) else Error(str(error))


def outbox_strategy(
    outbox: bool | OutboxStrategy, adapter: DialectAdapter, dialect: str
) -> OutboxStrategy | None:
    """The strategy the ``outbox`` option names on this dialect: None when
    off; True is "ticks" where the dialect has them, else "counter".
    :class:`ValidationError` for "ticks" on a dialect without them."""
    if outbox is False:
        return None
    has_ticks = adapter.sql.outbox_ticks is not None
    if outbox is True:
        return "ticks" if has_ticks else "counter"
    if outbox == "ticks" and not has_ticks:
        raise ValidationError(
            f'outbox="ticks" needs PostgreSQL; {dialect} has the "counter" strategy only: '
            'use outbox=True or outbox="counter"'
        )
    return outbox


def check_isolation(isolation: object) -> None:
    """Refuse an unknown isolation level where the user's value enters (it
    goes into SQL text later: ``BEGIN ISOLATION LEVEL ...``)."""
    if isolation is not None and isolation not in ISOLATION_LEVELS:
        raise ValidationError(
            f"unknown isolation level {isolation!r}; use one of {sorted(ISOLATION_LEVELS)}"
        )
