"""A checked-out connection in use (Session) and the user's transaction handle.

The Session is the one place where driver exceptions become aiofragno errors
and where we remember what happened to a connection (broken, interrupted, in a
transaction, its session changed by raw SQL), so that it is discarded or reset
— never returned dirty.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

from . import runtime
from .driver import (
    CompiledQuery,
    Connection,
    DialectAdapter,
    IsolationLevel,
    QueryResult,
    Row,
    StopWhen,
    stopped,
)
from .errors import CommitOutcomeUnknown, ConnectionLost, Error, TransactionClosed, UnexpectedType
from .sql import Fragment

logger = logging.getLogger("aiofragno")
T = TypeVar("T")


class Session:
    """One connection checked out of the pool for one logical caller."""

    __slots__ = (
        "broken",
        "connection",
        "dirty",
        "in_transaction",
        "interrupted",
        "savepoints",
        "translate",
    )

    def __init__(
        self, connection: Connection, translate: Callable[[BaseException], Exception]
    ) -> None:
        self.connection = connection
        self.translate = translate
        self.broken = False  # lost: discard on release
        self.interrupted = False  # cancelled mid-operation: reset or discard
        self.in_transaction = False
        self.dirty = False  # raw SQL may have changed the session: reset it
        self.savepoints = 0

    def fail(self, exc: Exception) -> Exception:
        """The aiofragno error for driver exception ``exc``; notes a lost connection."""
        error = exc if isinstance(exc, Error) else self.translate(exc)
        if isinstance(error, ConnectionLost):
            self.broken = True
        return error

    async def execute(self, query: CompiledQuery) -> QueryResult:
        if logger.isEnabledFor(logging.DEBUG):
            _log(query)
        return await self._call(self.connection.execute_query(query))

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """:meth:`Connection.execute_batch <aiofragno.driver.Connection.execute_batch>`:
        ``queries`` in as few round trips as the driver allows, up to the first
        result for which ``stop(index, result)`` is true."""
        if logger.isEnabledFor(logging.DEBUG):
            for query in queries:
                _log(query)
        return await self._call(self.connection.execute_batch(queries, stop))

    async def begin(self, isolation: IsolationLevel | None) -> None:
        await self._call(self.connection.begin(isolation))
        self.in_transaction = True

    async def rollback(self) -> None:
        await self._call(self.connection.rollback())
        self.in_transaction = False

    async def commit(
        self, queries: Sequence[CompiledQuery] = (), stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """COMMIT, after running ``queries`` in the same round trip where the
        driver can (:meth:`Connection.commit_batch
        <aiofragno.driver.Connection.commit_batch>`); their results. At a stop
        point (see :meth:`execute_batch`) the transaction stays open, for the
        caller to roll back. A lost connection raises :class:`CommitOutcomeUnknown`."""
        results: list[QueryResult] = []
        if queries:
            results = await self._committing(self.connection.commit_batch(queries, stop))
            if stopped(queries, results, stop):
                return results
        else:
            await self._committing(self.connection.commit())
        self.in_transaction = False
        return results

    async def execute_committing(self, query: CompiledQuery) -> QueryResult:
        """``query``, outside any transaction: it commits on its own, so a
        lost connection raises :class:`CommitOutcomeUnknown` as in :meth:`commit`."""
        if logger.isEnabledFor(logging.DEBUG):
            _log(query)
        return await self._committing(self.connection.execute_query(query))

    def _committing(self, operation: Awaitable[T]) -> Coroutine[Any, Any, T]:
        """``operation``, which commits: a connection lost on the way (open
        when it started) raises :class:`CommitOutcomeUnknown`."""
        return self._call(
            operation, functools.partial(self._commit_failed, not self.connection.is_closed)
        )

    def _commit_failed(self, was_open: bool, exc: Exception) -> Exception:
        error = self.fail(exc)
        if isinstance(exc, TimeoutError) and was_open:
            # The client stopped waiting (command_timeout), not the server:
            # the COMMIT may still be applied, and the connection is in an
            # unknown state.
            self.broken = True
            return CommitOutcomeUnknown(
                f"no reply to COMMIT within command_timeout, so the transaction may or may "
                f"not have been applied; check before re-running it ({error})",
                sqlstate=getattr(error, "sqlstate", None),
                code=getattr(error, "code", None),
                server_session=self.connection.server_session,
            )
        if isinstance(error, ConnectionLost) and was_open:
            return CommitOutcomeUnknown(
                f"the connection broke while COMMIT was in flight, so the transaction may "
                f"or may not have been applied; check before re-running it ({error})",
                sqlstate=error.sqlstate,
                code=error.code,
                server_session=self.connection.server_session,
            )
        return error

    async def _call(
        self, operation: Awaitable[T], fail: Callable[[Exception], Exception] | None = None
    ) -> T:
        """``operation``, its driver exception raised as the aiofragno error
        that ``fail`` (default: :meth:`fail`) makes of it; the session marked
        interrupted if it is cancelled."""
        try:
            return await operation
        except Exception as exc:
            error = (fail or self.fail)(exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            self.interrupted = True
            raise


def _log(query: CompiledQuery) -> None:
    # Parameters stay out of logs (they may be personal data): their count only.
    logger.debug("%s  -- %d parameter(s)", query.sql, len(query.parameters))


class Queries(ABC):
    """``fetch`` / ``fetch_one`` / ``fetch_value`` / ``execute`` over one
    ``_run``; shared by :class:`~aiofragno.Database`, its engine and :class:`Transaction`.
    Each takes an ``af.sql(...)`` fragment, never a str: values stay bound
    parameters (anything else is a :class:`ValidationError` before any SQL is sent)."""

    @abstractmethod
    async def _run(self, query: Fragment) -> QueryResult:
        """Run one ``af.sql`` query where this object runs queries."""

    async def execute(self, query: Fragment) -> QueryResult:
        """Run ``query`` (an ``af.sql`` fragment) and return its
        :class:`QueryResult` (rows, ``rows_affected``, ``insert_id``)."""
        return await self._run(query)

    async def fetch(self, query: Fragment) -> list[Row]:
        """All rows of ``query``."""
        return (await self._run(query)).rows

    async def fetch_one(self, query: Fragment) -> Row | None:
        """The first row of ``query``, or None. (All rows are read; add
        ``LIMIT 1`` to a query that could return many.)"""
        rows = (await self._run(query)).rows
        return rows[0] if rows else None

    @overload
    async def fetch_value(self, query: Fragment) -> object: ...

    @overload
    async def fetch_value(self, query: Fragment, kind: type[T]) -> T: ...

    async def fetch_value(self, query: Fragment, kind: type[object] | None = None) -> object:
        """The first column of the first row, or None when there is no row.
        With ``kind`` (``fetch_value(query, int)``), the value must be an
        instance of it, and is typed so: None (NULL, or no row) or a value
        of another type is an :class:`UnexpectedType`."""
        row = await self.fetch_one(query)
        value = None if row is None else next(iter(row.values()))
        if kind is None or isinstance(value, kind):
            return value
        raise _unexpected_type(value, kind, no_row=row is None)


def _unexpected_type(value: object, kind: type[object], *, no_row: bool) -> UnexpectedType:
    # The value's type only: the value itself may be personal data.
    got = "no row" if no_row else "NULL" if value is None else f"a {type(value).__name__}"
    return UnexpectedType(
        f"fetch_value(query, {kind.__name__}) got {got}; make the query return a "
        f"{kind.__name__} (COALESCE a NULL, CAST a value), or call fetch_value(query) "
        "without a type to take whatever it returns, None included"
    )


class TransactionHost(Protocol):
    """What a transaction needs of the engine it runs on
    (:class:`aiofragno.engine.Engine`): its connections, and its dialect's
    compiler and adapter."""

    @property
    def adapter(self) -> DialectAdapter: ...

    def compile(self, query: Fragment) -> CompiledQuery: ...

    def raw(self, text: str) -> Fragment: ...

    async def checkout(self, *, wait: bool = True) -> Session: ...

    async def checkin(self, session: Session) -> None: ...


class Transaction(Queries):
    """An open transaction: run queries in it, or nest a savepoint with
    ``async with tx.transaction():``. Operations from several tasks sharing it
    are serialized (one connection runs one statement at a time), and its
    COMMIT or ROLLBACK waits for the one running. Once it has ended, using
    it raises :class:`~aiofragno.errors.TransactionClosed`, and tasks that
    were started inside it no longer join it."""

    def __init__(self, db: TransactionHost, session: Session, outer: Transaction | None) -> None:
        self.db = db
        self.session = session
        self.outer = outer  # the enclosing transaction in this context, of any Database
        self.ended = False
        # (A free lock is taken without a trip through the event loop; a
        # pending cancellation is still raised before the statement is sent.)
        self._lock = runtime.Lock(fast_acquire=True)

    async def _run(self, query: Fragment) -> QueryResult:
        compiled = self.db.compile(query)
        async with self._lock:
            if self.ended:
                raise TransactionClosed(
                    "this transaction has ended (committed or rolled back), and its connection "
                    "went back to the pool; run the query on the Database, or in a new "
                    "db.transaction()"
                )
            if self.db.adapter.session_changes(compiled.sql):
                self.session.dirty = True  # reset when the transaction ends
            return await self.session.execute(compiled)

    async def _finish(self, end: Callable[[], Awaitable[Any]]) -> None:
        """``end`` (COMMIT or ROLLBACK) once the statement another task may be
        running in this transaction is done."""
        async with self._lock:
            await end()

    def transaction(self) -> TransactionContext:
        """A savepoint inside this transaction: rolled back alone on exception."""
        return TransactionContext(self.db, None, parent=self)


_current: ContextVar[Transaction | None] = ContextVar("aiofragno_transaction", default=None)


def current_transaction(db: TransactionHost) -> Transaction | None:
    """The innermost transaction of ``db`` open in this context, if any (a
    task started inside a transaction inherits the context, and may outlive
    the transaction)."""
    tx = _current.get()
    while tx is not None and (tx.db is not db or tx.ended):
        tx = tx.outer
    return tx


@contextmanager
def outside_transactions() -> Iterator[None]:
    """Inside this block, queries and ``db.transaction()`` do not join a
    transaction the caller has open: for aiofragno's own bookkeeping, whose
    reads and locks must not become part of (and last as long as) the
    caller's transaction."""
    token = _current.set(None)
    try:
        yield
    finally:
        _current.reset(token)


class TransactionContext:
    """``async with db.transaction() as tx``: commit on success, roll back on
    exception. Inside an open transaction of the same Database (in this task or
    its children), it becomes a savepoint instead."""

    def __init__(
        self,
        db: TransactionHost,
        isolation: IsolationLevel | None,
        *,
        parent: Transaction | None = None,
    ) -> None:
        self._db = db
        self._isolation = isolation
        self._parent = parent
        self._tx: Transaction | None = None
        self._savepoint: str | None = None
        self._token: Any = None

    async def __aenter__(self) -> Transaction:
        parent = self._parent or current_transaction(self._db)
        if parent is not None:
            session = parent.session
            session.savepoints += 1
            self._savepoint = f"af_savepoint_{session.savepoints}"
            await parent.execute(self._db.raw(f"SAVEPOINT {self._savepoint}"))
            self._tx = parent
            return parent
        session = await self._db.checkout()
        try:
            await session.begin(self._isolation)
        except BaseException:
            await self._db.checkin(session)
            raise
        self._tx = Transaction(self._db, session, _current.get())
        self._token = _current.set(self._tx)
        return self._tx

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tx = self._tx
        assert tx is not None, "transaction context exited without being entered"
        if self._savepoint is not None:
            await self._end_savepoint(tx, failed=exc is not None)
            return
        _current.reset(self._token)
        tx.ended = True  # (from now on, other tasks' statements are refused)
        try:
            if exc is None:
                await tx._finish(tx.session.commit)
            elif not (tx.session.broken or tx.session.interrupted):
                # (An interrupted connection is reset or discarded by checkin.)
                await _rollback_quietly(tx.session, lambda: tx._finish(tx.session.rollback))
        finally:
            await self._db.checkin(tx.session)

    async def _end_savepoint(self, tx: Transaction, *, failed: bool) -> None:
        name = self._savepoint
        tx.session.savepoints -= 1
        if not failed:
            await tx.execute(self._db.raw(f"RELEASE SAVEPOINT {name}"))
        elif not tx.session.broken:
            await _rollback_quietly(
                tx.session, lambda: tx.execute(self._db.raw(f"ROLLBACK TO SAVEPOINT {name}"))
            )


async def _rollback_quietly(session: Session, rollback: Callable[[], Awaitable[Any]]) -> None:
    """Roll back while an exception is already propagating: a failure here must
    not replace the caller's exception. The connection is then marked broken,
    so it is discarded rather than reused."""
    with runtime.shielded(runtime.CLEANUP_TIMEOUT) as scope:
        try:
            await rollback()
        except Error as exc:
            logger.warning("rollback failed; discarding the connection: %s", exc)
            session.broken = True
    if scope.cancelled_caught:
        logger.warning(
            "rollback timed out after %ss; discarding the connection", runtime.CLEANUP_TIMEOUT
        )
        session.broken = True
