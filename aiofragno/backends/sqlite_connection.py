"""The SQLite connection both SQLite backends build on — they differ only in
how a call reaches the ``sqlite3`` connection: aiosqlite's thread, or a worker
thread of our own — and the Dialect they assemble around it.

Concurrency model. SQLite allows one writer at a time per database file. Every
transaction starts with ``BEGIN IMMEDIATE`` (it takes the write lock up front,
so it can never fail later on lock upgrade), and inside one process writers
queue on a fair :class:`WriteGate` instead of polling SQLite's busy handler —
so concurrent transactions wait their turn and never fail with "database is
locked". Another *process* holding the lock longer than ``busy_timeout`` gives
:class:`~aiofragno.errors.LockTimeout`. WAL mode lets readers run beside the
writer.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from .. import runtime
from ..dialects import sqlite
from ..driver import (
    ROLLBACK,
    CompiledQuery,
    DeferredBegin,
    IsolationLevel,
    QueryResult,
    Row,
    StopWhen,
    column_index,
    leading_keyword,
    stopped,
)
from ..errors import (
    ConnectionLost,
    DataError,
    ErrorTable,
    IntegrityError,
    ProgrammingError,
    ValidationError,
)
from ..pool import PooledDialect
from ..url import DatabaseURL, Options
from .sqlite_functions import add_functions
from .sqlite_gate import CommitGuard, WriteGate, Writer

ERRORS = ErrorTable(
    codes=sqlite.CODES,
    types=[
        # Raised by sqlite3 for values it cannot bind (e.g. a list).
        (sqlite3.ProgrammingError, ValidationError),
        (sqlite3.IntegrityError, IntegrityError),
        (sqlite3.DataError, DataError),
        (sqlite3.OperationalError, ProgrammingError),
    ],
    sqlstates=sqlite.SQLSTATES,
)


def translate_error(exc: BaseException) -> Exception:
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
        return ConnectionLost(str(exc))
    code = getattr(exc, "sqlite_errorcode", None)
    return ERRORS.translate(exc, None if code is None else str(code))


def database_path(url: DatabaseURL) -> str:
    return ":memory:" if url.is_memory else url.database


def pool_size(url: DatabaseURL, options: Options) -> int:
    # Each connection to ":memory:" is a separate database: share one.
    return 1 if url.is_memory else options.pool_size


C = TypeVar("C", bound="SqliteConnection")


def pooled_dialect(
    url: DatabaseURL,
    options: Options,
    open_connection: Callable[[WriteGate], Awaitable[C]],
    writer: Callable[[C], Writer] | None = None,
) -> PooledDialect:
    """The Dialect of either SQLite backend: ``open_connection(gate)`` opens
    one of its connections to ``url``, queueing its writers on ``gate`` (one
    per Database); here it gets its settings. ``writer``: the gate's writer
    made of one more such connection (:mod:`.sqlite_gate`), where the
    backend has one; a ``:memory:`` database has none (another connection
    would be another database)."""
    gate = WriteGate(options.busy_timeout)

    async def connect() -> C:
        connection = await open_connection(gate)
        await connection.configure(url, options)
        return connection

    if writer is not None and not url.is_memory:
        make_writer = writer

        async def open_writer() -> Writer:
            return make_writer(await connect())

        gate.use_writer(open_writer)

    return PooledDialect(
        name="sqlite",
        adapter=sqlite.adapter(options, sqlite3.sqlite_version_info),
        compiler=sqlite.create_compiler,
        translate=translate_error,
        connect=connect,
        options=options,
        pool_size=pool_size(url, options),
        # ":memory:" lives as long as its one connection: never recycle it.
        recycle=not url.is_memory,
        close=gate.close,
    )


# Statements that run beside a writer without its gate, and those that insert.
_READS = frozenset({"select", "explain"})
_INSERTS = frozenset({"insert", "replace"})


def _reads_only(sql: str) -> bool:
    return leading_keyword(sql) in _READS


def _batch_reads_only(queries: Sequence[CompiledQuery]) -> bool:
    """Whether ``queries`` only read: reads alone, or reads in a snapshot
    (the dialect's read-only BEGIN, then reads, then ROLLBACK), which takes
    no write lock."""
    if len(queries) > 2 and queries[0].sql == sqlite.READ_SNAPSHOT and queries[-1] == ROLLBACK:
        queries = queries[1:-1]
    return all(_reads_only(query.sql) for query in queries)


T = TypeVar("T")
# Runs on the sqlite3 connection's own thread.
Call = Callable[[sqlite3.Connection], T]


class SqliteConnection(ABC):
    """A SQLite connection; subclasses say how a call reaches sqlite3's thread.

    Every statement costs a thread hop each way, so whole batches go in one
    call, and ``begin`` (which only queues on the write gate) sends its
    ``BEGIN IMMEDIATE`` with the transaction's first statement."""

    def __init__(self, raw: Any, gate: WriteGate) -> None:
        # raw: a sqlite3.Connection, or aiosqlite's wrapper around one.
        self._raw = raw
        self._gate = gate
        self._holds_gate = False
        self._begin: DeferredBegin[str] = DeferredBegin()
        self._closed = False
        self._settings: list[CompiledQuery] = []  # (configure)
        self._memory = False

    # In-process: a connection that breaks leaves nothing running elsewhere.
    server_session = None

    # (In-process: there is no server to lose.)
    is_stale = False

    @property
    def is_closed(self) -> bool:
        if self._closed:
            return True
        try:
            self._raw.total_changes  # noqa: B018  (raises once sqlite3 closed it)
        except (sqlite3.ProgrammingError, ValueError):
            return True
        return False

    @property
    def in_transaction(self) -> bool:
        # (A closed connection raises when asked.)
        return not self.is_closed and bool(self._raw.in_transaction)

    @abstractmethod
    async def _call(self, call: Call[T]) -> T:
        """``call(sqlite3 connection)`` on the connection's thread."""

    async def _call_settled(self, call: Call[T], settled: Callable[[T], object]) -> T:
        """:meth:`_call`, and ``settled`` with its value as soon as it is
        there: where the backend can, before the caller resumes (else as it
        resumes). ``settled`` must not raise."""
        value = await self._call(call)
        settled(value)
        return value

    @abstractmethod
    async def _close_raw(self) -> None:
        """Close the sqlite3 connection in its thread."""

    @abstractmethod
    def _interrupt(self) -> None:
        """Make the statement running in sqlite3's thread stop (thread-safe)."""

    async def _interruptible(self, call: Call[T]) -> T:
        try:
            return await self._call(call)
        except runtime.get_cancelled_exc_class():
            # The thread would otherwise run the statement to its end.
            self._interrupt()
            raise

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        return (await self.execute_batch((query,)))[0]

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        # A transaction's first statements take the gate, and send its BEGIN.
        begin = None if self._begin.pending is None else await self._take_begin()
        call = partial(run_batch, queries=queries, stop=stop, begin=begin)
        if self._holds_gate or _batch_reads_only(queries):
            return await self._interruptible(call)
        await self._gate.acquire()
        try:
            return await self._interruptible(call)
        finally:
            self._gate.release()

    async def stream(self, query: CompiledQuery, batch_size: int) -> SqliteStream:
        """A cursor stepped ``batch_size`` rows per thread hop. A statement
        that writes (``INSERT .. RETURNING``) holds the write gate until the
        stream is closed: SQLite holds its write lock as long."""
        begin = await self._take_begin()
        gated = not self._holds_gate and not _reads_only(query.sql)
        if gated:
            await self._gate.acquire()
        try:
            cursor = await self._interruptible(partial(_open_cursor, query=query, begin=begin))
        except BaseException:
            if gated:
                self._gate.release()
            raise
        return SqliteStream(self, cursor, batch_size, gated)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        # SQLite transactions are serializable, which satisfies every level.
        # The gate is taken with the first statement, or by the job the
        # whole transaction goes as (commit_batch).
        self._begin.defer("BEGIN IMMEDIATE")

    async def _take_begin(self) -> str | None:
        """The deferred BEGIN, to send with this call's statements (the
        write gate taken first), or None."""
        if self._begin.pending is not None and not self._holds_gate:
            await self._gate.acquire()
            self._holds_gate = True
        return self._begin.take()

    async def commit(self) -> None:
        if not self._begin.drop():  # (else nothing ran: nothing to commit)
            await self._call(partial(_run_sql, sql="COMMIT"))
        self._release_gate()

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """One hop for the statements, ``stop``'s checks and COMMIT. A whole
        transaction (nothing sent since BEGIN) goes to the gate's writer as
        a job, where the gate has one. A cancelled caller interrupts the
        statements, never a COMMIT that has started (its outcome is then the
        database's)."""
        begin = self._begin.pending
        if begin is not None and not self._holds_gate:
            guard = CommitGuard(self._gate.interrupt_writer, started=False)
            job = partial(run_batch, queries=queries, stop=stop, begin=begin, commit=guard)
            results = await self._gate.run_alone(job, guard)
            self._begin.take()  # (sent, on the writer; or with the statements below)
            if results is not None:
                return results  # (nothing is open here)
            self._holds_gate = True  # (no writer: the gate is this connection's)
        guard = CommitGuard(self._interrupt)
        call = partial(run_batch, queries=queries, stop=stop, begin=begin, commit=guard)

        def settled(results: list[QueryResult]) -> None:
            # Committed: the next writer may go at once, while this one's
            # caller has yet to resume (its thread starts while this task
            # takes its results, instead of after).
            if not stopped(queries, results, stop):
                self._release_gate()

        try:
            return await self._call_settled(call, settled)
        except runtime.get_cancelled_exc_class():
            guard.interrupt()
            raise

    async def rollback(self) -> None:
        try:
            if not self._begin.drop():
                # Asked on sqlite3's thread, after whatever is queued there: a
                # call its cancelled caller left behind may open the transaction
                # yet, which this thread would not see and leave open.
                await self._call(_rollback_open)
        finally:
            self._release_gate()

    async def ping(self) -> None:
        await self._call(partial(_run_sql, sql="SELECT 1"))

    async def configure(self, url: DatabaseURL, options: Options) -> None:
        """Apply the connection settings; closes the connection if that fails."""
        self._settings = [CompiledQuery(s) for s in sqlite.pragmas(url, options)]
        self._memory = url.is_memory
        try:
            await self._call(add_functions)
            await self._call(partial(run_batch, queries=self._settings))
        except BaseException:
            with runtime.shielded():
                await self.close()
            raise

    async def reset(self) -> bool:
        try:
            await self.rollback()
        except Exception:
            return False
        return True

    async def reset_session(self) -> bool:
        """A database file's connection is replaced: a new one is cheap, and
        nothing short of that undoes every PRAGMA, temporary object and
        attached database. A ``:memory:`` database lives only as long as its
        one connection, so that one is rolled back and configured again;
        anything else raw SQL changed on it stays."""
        await self.rollback()
        if not self._memory:
            return False
        await self._call(partial(run_batch, queries=self._settings))
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._begin.drop()
        self._release_gate()
        await self._close_raw()

    def _release_gate(self) -> None:
        if self._holds_gate:
            self._holds_gate = False
            self._gate.release()


class SqliteStream:
    """An open sqlite3 cursor, stepped in the connection's thread."""

    def __init__(
        self, connection: SqliteConnection, cursor: sqlite3.Cursor, batch_size: int, gated: bool
    ) -> None:
        self._connection = connection
        self._cursor = cursor
        self._batch = batch_size
        self._gated = gated
        description = cursor.description
        self._index = (
            None if description is None else column_index(tuple(c[0] for c in description))
        )

    async def fetch(self) -> list[Row]:
        index = self._index
        if index is None:
            return []
        values = await self._connection._interruptible(
            partial(_fetchmany, self._cursor, self._batch)
        )
        return [Row(index, row) for row in values]

    async def close(self, *, drain: bool) -> bool:
        # (A statement left open would make later ones fail after an interrupt().)
        try:
            await self._connection._call(partial(_close_cursor, self._cursor))
        finally:
            if self._gated:
                self._gated = False
                self._connection._gate.release()
        return True


def _open_cursor(
    raw: sqlite3.Connection, *, query: CompiledQuery, begin: str | None
) -> sqlite3.Cursor:
    if begin is not None:
        _run_sql(raw, begin)
    return raw.execute(query.sql, query.parameters)


def _fetchmany(cursor: sqlite3.Cursor, size: int, _raw: sqlite3.Connection) -> list[Any]:
    return cursor.fetchmany(size)


def _close_cursor(cursor: sqlite3.Cursor, _raw: sqlite3.Connection) -> None:
    cursor.close()


def run_batch(
    raw: sqlite3.Connection,
    *,
    queries: Sequence[CompiledQuery],
    stop: StopWhen | None = None,
    begin: str | None = None,
    commit: CommitGuard | None = None,
) -> list[QueryResult]:
    """Statements start to finish on the calling thread (sqlite3's), after
    ``begin`` (a deferred BEGIN) if given, up to the stop point; then, if
    none was reached, COMMIT through ``commit``."""
    if begin is not None:
        _run_sql(raw, begin)
    results: list[QueryResult] = []
    for index, query in enumerate(queries):
        result = _run_query(raw, query)
        results.append(result)
        if stop is not None and stop(index, result):
            return results
    if commit is not None:
        commit.commit(raw)
    return results


def _run_query(raw: sqlite3.Connection, query: CompiledQuery) -> QueryResult:
    # Each cursor is finished and closed: a statement left open would make
    # every later one fail after an interrupt().
    cursor = raw.execute(query.sql, query.parameters)
    try:
        description = cursor.description
        if description is None:
            # sqlite3 keeps lastrowid from the connection's last INSERT: report
            # it only for the statement that inserted.
            inserted = leading_keyword(query.sql) in _INSERTS
            return QueryResult([], max(cursor.rowcount, 0), cursor.lastrowid if inserted else None)
        values = cursor.fetchall()
        index = column_index(tuple([column[0] for column in description]))
        return QueryResult([Row(index, row) for row in values], len(values), cursor.lastrowid)
    finally:
        cursor.close()


def _run_sql(raw: sqlite3.Connection, sql: str) -> None:
    raw.execute(sql).close()


def _rollback_open(raw: sqlite3.Connection) -> None:
    """Roll back the transaction open on ``raw``, if one is."""
    if raw.in_transaction:
        _run_sql(raw, "ROLLBACK")
