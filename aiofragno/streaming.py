"""Streaming a statement's rows: ``async with db.stream(query) as rows``.

A stream reads its result in batches — a PostgreSQL portal, a MySQL
unbuffered result, a SQLite cursor stepped in its thread (each backend's
:meth:`~aiofragno.driver.Connection.stream`) — so that memory holds one
batch, whatever the size of the result. Guarantees:

* The stream holds one connection from entering its ``async with`` to
  leaving it (on ``db``: a pooled connection of its own; in a transaction:
  the transaction's, which runs nothing else meanwhile). Leaving it, by the
  end of the rows, a ``break``, an exception or a cancellation, gives the
  connection back usable, or discards it: never with a result half read.
* Errors are translated as for every query; a connection lost after rows
  were handed out raises :class:`~aiofragno.errors.ConnectionLost` and is
  not retried (the caller has seen rows). On ``db``, opening a ``SELECT``
  and reading its first batch is retried after a lost connection, like
  ``fetch``: nothing has been handed out yet.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from . import runtime
from .driver import CompiledQuery, DialectAdapter, Row, RowStream, leading_keyword
from .errors import ProgrammingError, TransactionClosed, ValidationError
from .resilience import retry_read
from .session import Session
from .url import Options

if TYPE_CHECKING:
    from .transaction import Transaction

logger = logging.getLogger("aiofragno")

# Rows per batch when the caller does not say: large enough that a batch's
# round trip (or thread hop) costs little per row, small enough to hold.
DEFAULT_BATCH_SIZE = 1000


def check_batch_size(batch_size: object, name: str = "batch_size") -> int:
    """``batch_size`` if it is a positive int, else a :class:`ValidationError`
    naming the argument (``name``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValidationError(f"{name} must be a positive int, got {batch_size!r}")
    return batch_size


class StreamHost(Protocol):
    """What a stream outside a transaction needs of the engine it runs on
    (:class:`aiofragno.engine.Engine`)."""

    @property
    def adapter(self) -> DialectAdapter: ...

    @property
    def options(self) -> Options: ...

    def check_open(self) -> None: ...

    async def acquire(self, *, wait: bool = True) -> Session: ...

    async def release(self, session: Session) -> None: ...


class Rows:
    """The rows of an open stream: ``async for row in rows``, or a batch at
    a time with :meth:`next_batch`. Only the current batch is held."""

    __slots__ = ("_batch", "_batch_size", "_done", "_fetch", "_position", "closed")

    def __init__(
        self, first: list[Row], batch_size: int, fetch: Callable[[], Awaitable[list[Row]]]
    ) -> None:
        self._batch = first
        self._batch_size = batch_size
        self._position = 0
        self._fetch = fetch
        # (A batch short of batch_size is the last: no round trip to learn it.)
        self._done = len(first) < batch_size
        self.closed = False

    def __aiter__(self) -> Rows:
        return self

    async def __anext__(self) -> Row:
        batch = self._batch
        position = self._position
        if position < len(batch):
            self._position = position + 1
            return batch[position]
        batch = await self.next_batch()
        if not batch:
            raise StopAsyncIteration
        self._position = 1
        return batch[0]

    async def next_batch(self) -> list[Row]:
        """The rows not yet handed out of the current batch, else the next
        batch (at most ``batch_size`` rows); ``[]`` once all were read."""
        if self.closed:
            raise ProgrammingError(
                "this stream has ended (its `async with` block was left); read the rows "
                "inside the block"
            )
        batch, position = self._batch, self._position
        if position < len(batch):
            self._batch, self._position = [], 0
            return batch[position:] if position else batch
        if self._done:
            return []
        self._batch = []  # (the last batch can go before the next arrives)
        batch = await self._fetch()
        self._done = len(batch) < self._batch_size
        self._batch, self._position = batch, len(batch)
        return batch


class Stream(ABC):
    """``async with ... as rows``: what ``stream()`` returns. Both kinds (on
    a connection of its own, in a transaction) share the rows handed to the
    block, and closing the driver's stream when the block is left."""

    def __init__(self, query: CompiledQuery, batch_size: int) -> None:
        self._query = query
        self._batch_size = batch_size
        self._session: Session | None = None
        self._stream: RowStream | None = None
        self._rows: Rows | None = None

    @abstractmethod
    async def __aenter__(self) -> Rows: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._end(exc)

    @abstractmethod
    async def _end(self, exc: BaseException | None) -> None:
        """Close the stream and give its connection back (or leave it to the
        transaction), as the block is left with ``exc`` (None: normally)."""

    async def _open(self, session: Session) -> Rows:
        """Start the statement on ``session`` and read its first batch."""
        stream = self._stream = await session._call(
            session.connection.stream(self._query, self._batch_size)
        )
        first = await session._call(stream.fetch())
        self._rows = Rows(first, self._batch_size, self._fetch)
        return self._rows

    async def _fetch(self) -> list[Row]:
        session, stream = self._session, self._stream
        assert session is not None and stream is not None
        # A checkpoint per batch on every backend, also where the batch was
        # already in the driver's buffer (MySQL): a loop over a stream can be
        # cancelled, and lets other tasks run.
        await runtime.sleep(0)
        return await session._call(stream.fetch())

    async def _close(self, exc: BaseException | None, *, drain: bool) -> bool:
        """Close the driver's stream as the block is left with ``exc``; False
        when it did not end cleanly: the connection is then marked to be
        reset or discarded. Raises nothing: a failure here must not hide
        ``exc``, and the rows handed out were good. Shielded (and bounded)
        when the block is left by an exception, a cancellation included."""
        session, stream = self._session, self._stream
        if self._rows is not None:
            self._rows.closed = True
        if session is None or stream is None:
            return True
        self._stream = None
        scope = runtime.shielded(runtime.CLEANUP_TIMEOUT) if exc else runtime.CancelScope()
        with scope:
            try:
                if await session._call(stream.close(drain=drain)):
                    return True
            except Exception as error:
                logger.warning("closing a stream failed; discarding its connection: %s", error)
                session.broken = True
        # (Cut short, or the result not read to its end: reset or discard it.)
        session.interrupted = True
        return False


class EngineStream(Stream):
    """A stream on a pooled connection of its own (``db.stream`` outside a
    transaction): in a transaction of its own where the database needs one
    for it, committed when the block is left normally, else rolled back."""

    def __init__(self, engine: StreamHost, query: CompiledQuery, batch_size: int) -> None:
        super().__init__(query, batch_size)
        self._engine = engine
        self._own_transaction = engine.adapter.capabilities.streams_in_transaction

    async def __aenter__(self) -> Rows:
        engine = self._engine
        engine.check_open()
        if leading_keyword(self._query.sql) == "select":
            # Nothing handed out yet: a lost connection is retried, as fetch does.
            return await retry_read(engine.options.reconnect_deadline, self._open_on_a_connection)
        return await self._open_on_a_connection()

    async def _open_on_a_connection(self) -> Rows:
        engine = self._engine
        session = self._session = await engine.acquire()
        try:
            session.dirty = engine.adapter.session_changes(self._query.sql)
            if self._own_transaction:
                await session.begin(None)
            return await self._open(session)
        except BaseException as exc:
            await self._end(exc)
            raise

    async def _end(self, exc: BaseException | None) -> None:
        session = self._session
        if session is None:
            return
        try:
            clean = await self._close(exc, drain=False)
            if self._own_transaction and session.in_transaction and clean:
                if exc is None:
                    await session.commit()
                else:
                    await _rollback_quietly(session)
        finally:
            self._session = None
            await self._engine.release(session)


class TransactionStream(Stream):
    """A stream in an open transaction (``tx.stream``): its statements wait
    for the stream, which holds the transaction's connection until the block
    is left. Leaving early reads the rest of a result that would otherwise
    leave the connection unusable (MySQL), so that the transaction goes on;
    a cancellation does not wait for that: the connection is then discarded
    when the transaction ends."""

    def __init__(self, tx: Transaction, query: CompiledQuery, batch_size: int) -> None:
        super().__init__(query, batch_size)
        self._tx = tx

    async def __aenter__(self) -> Rows:
        tx = self._tx
        async with tx._lock:
            tx.check_usable()
            session = self._session = tx.session
            if tx.db.adapter.session_changes(self._query.sql):
                session.dirty = True  # reset when the transaction ends
            tx.stream_open = True
            try:
                return await self._open(session)
            except BaseException as exc:
                await self._end(exc)
                raise

    async def _fetch(self) -> list[Row]:
        async with self._tx._lock:
            if self._tx.ended:
                raise _ended()
            return await super()._fetch()

    async def _end(self, exc: BaseException | None) -> None:
        if self._tx.ended:
            # Left after the transaction (by another task): its connection
            # is no longer this stream's to touch; the transaction refused to
            # end over the open stream (Transaction._finish) and discarded it.
            if self._rows is not None:
                self._rows.closed = True
            self._stream = None
            return
        try:
            cancelled = isinstance(exc, runtime.get_cancelled_exc_class())
            await self._close(exc, drain=not cancelled)
        finally:
            self._tx.stream_open = False


def _ended() -> TransactionClosed:
    return TransactionClosed(
        "the transaction this stream ran in has ended, and its connection went back to "
        "the pool; leave the stream's `async with` before the transaction's"
    )


async def _rollback_quietly(session: Session) -> None:
    # (Shielded: the block may be left by a cancellation; a failed rollback
    # discards the connection rather than hide the exception that is leaving.)
    with runtime.shielded(runtime.CLEANUP_TIMEOUT):
        try:
            await session.rollback()
        except Exception:
            session.broken = True
