"""The user's transaction: ``async with db.transaction() as tx``, its
savepoints, and which transaction a task is in."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Protocol, TypeVar

from . import runtime
from .driver import CompiledQuery, DialectAdapter, IsolationLevel
from .errors import Error, ProgrammingError, TransactionClosed
from .queries import Queries, Read
from .session import Session
from .sql import Fragment
from .streaming import TransactionStream

logger = logging.getLogger("aiofragno")
T = TypeVar("T")


class TransactionHost(Protocol):
    """What a transaction needs of the engine it runs on
    (:class:`aiofragno.engine.Engine`): its connections, and its dialect's
    compiler and adapter."""

    @property
    def adapter(self) -> DialectAdapter: ...

    def compile(self, query: Fragment) -> CompiledQuery: ...

    def raw(self, text: str) -> Fragment: ...

    async def acquire(self, *, wait: bool = True) -> Session: ...

    async def release(self, session: Session) -> None: ...


class CommitWatcher(Protocol):
    """Told of a transaction's COMMIT (:class:`aiofragno.replicas.ReplicaSet`
    keeps each task's commit position with it): ``committing()`` before it
    is sent, ``committed(session)`` once it succeeded, on its connection."""

    def committing(self) -> None: ...

    async def committed(self, session: Session) -> None: ...


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
        self.stream_open = False  # (a stream holds the connection: see check_usable)
        # Serializes the statements (and the end) of tasks sharing it. A free
        # lock is taken without a trip through the event loop, but a pending
        # cancellation is raised before the statement is sent: else SQLite
        # would run it (in its thread) and the caller, told it was cancelled,
        # could go on to commit it.
        self._lock = runtime.Lock(fast_acquire=True)

    async def _run(self, query: Fragment, read: Read[T]) -> T:
        compiled = self.db.compile(query)
        await self._lock.acquire()
        try:
            self.check_usable()
            if self.db.adapter.session_changes(compiled.sql):
                self.session.dirty = True  # reset when the transaction ends
            return read(await self.session.execute(compiled))
        finally:
            self._lock.release()

    def _stream(self, query: Fragment, batch_size: int) -> TransactionStream:
        return TransactionStream(self, self.db.compile(query), batch_size)

    def check_usable(self) -> None:
        """Raise unless a statement may run in this transaction now:
        :class:`TransactionClosed` once it has ended, :class:`ProgrammingError`
        while a stream is open on it (its connection is reading that result)."""
        if self.ended:
            raise TransactionClosed(
                "this transaction has ended (committed or rolled back), and its connection "
                "went back to the pool; run the query on the Database, or in a new "
                "db.transaction()"
            )
        if self.stream_open:
            raise ProgrammingError(
                "a stream is open on this transaction, and its connection runs nothing else "
                "until the stream's `async with` block is left; keep what you need from the "
                "rows and run the statements after it (or stream on db, outside the "
                "transaction, and write in the transaction)"
            )

    async def _finish(self, end: Callable[[], Awaitable[Any]]) -> None:
        """``end`` (COMMIT or ROLLBACK) once the statement another task may be
        running in this transaction is done. Refused with
        :class:`ProgrammingError` while another task's stream is open on it:
        the connection is reading that stream's result, and could neither
        end the transaction (MySQL would wait forever for its reply) nor go
        back to the pool; it is discarded instead."""
        await self._lock.acquire()
        try:
            if self.stream_open:
                self.session.broken = True
                raise ProgrammingError(
                    "this transaction was left while a stream was still open on it (in another "
                    "task); it has been rolled back and its connection discarded. Leave the "
                    "stream's `async with` block before the transaction's"
                )
            await end()
        finally:
            self._lock.release()

    def transaction(self) -> TransactionContext:
        """A savepoint inside this transaction: rolled back alone on exception."""
        return TransactionContext(self.db, None, parent=self)


# The innermost transaction open in this context (of any Database), the
# others through ``outer``; None when none is, the usual case, which the
# engine checks before it looks for its own (current_transaction).
transaction_stack: ContextVar[Transaction | None] = ContextVar(
    "aiofragno_transaction", default=None
)


def current_transaction(db: TransactionHost) -> Transaction | None:
    """The innermost transaction of ``db`` open in this context, if any (a
    task started inside a transaction inherits the context, and may outlive
    the transaction)."""
    tx = transaction_stack.get()
    while tx is not None and (tx.db is not db or tx.ended):
        tx = tx.outer
    return tx


@contextmanager
def outside_transactions() -> Iterator[None]:
    """Inside this block, queries and ``db.transaction()`` do not join a
    transaction the caller has open: for aiofragno's own bookkeeping, whose
    reads and locks must not become part of (and last as long as) the
    caller's transaction."""
    token = transaction_stack.set(None)
    try:
        yield
    finally:
        transaction_stack.reset(token)


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
        watcher: CommitWatcher | None = None,
    ) -> None:
        self._db = db
        self._watcher = watcher
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
        session = await self._db.acquire()
        try:
            await session.begin(self._isolation)
        except BaseException:
            await self._db.release(session)
            raise
        self._tx = Transaction(self._db, session, transaction_stack.get())
        self._token = transaction_stack.set(self._tx)
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
        transaction_stack.reset(self._token)
        tx.ended = True  # (from now on, other tasks' statements are refused)
        try:
            if exc is None:
                watcher = self._watcher
                if watcher is not None:
                    watcher.committing()
                await tx._finish(tx.session.commit)
                if watcher is not None:
                    await watcher.committed(tx.session)
            elif not (tx.session.broken or tx.session.interrupted):
                # (An interrupted connection is reset or discarded by release.)
                await _rollback_quietly(tx.session, lambda: tx._finish(tx.session.rollback))
        finally:
            await self._db.release(tx.session)

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
