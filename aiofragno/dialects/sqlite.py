"""SQLite: capabilities, compiler settings, error codes, and the connection
logic both SQLite backends share (they differ only in how a call reaches the
``sqlite3`` connection: aiosqlite's thread, or a worker thread of our own).

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
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import date, datetime, time
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar

from .. import runtime
from ..brief import brief
from ..codec import utc_instant
from ..driver import (
    CompiledQuery,
    DdlSpec,
    DialectAdapter,
    IsolationLevel,
    QueryResult,
    Row,
    StopWhen,
    StorageProfile,
    column_index,
    stopped,
)
from ..errors import (
    CheckViolation,
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    Error,
    ErrorTable,
    ForeignKeyViolation,
    IntegrityError,
    LockTimeout,
    NotNullViolation,
    ProgrammingError,
    QueryCanceled,
    SerializationFailure,
    UniqueViolation,
    ValidationError,
)
from ..pool import Connector, PooledDialect
from ..slots import Slots
from ..sql import Json, SqlCompiler, unicode_text
from ..url import DatabaseURL, Options
from .common import SessionChanges, json_param

_BASE = DialectAdapter(
    supports_returning=sqlite3.sqlite_version_info >= (3, 35, 0),
    supports_json=True,
    reports_affected_rows=True,
    supports_transactional_ddl=True,
    supports_skip_locked=False,
    supports_advisory_locks=False,
    outbox_version_strategy="insert-on-conflict-returning",
    default_naming="suffix",
    # SQLite has no limit; keep names portable to PostgreSQL's.
    max_identifier_length=63,
    now_sql="SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')",
    version_sql="SELECT sqlite_version()",
    row_share_lock="",
    version_hex_sql="printf('%020x', CAST({value} AS INTEGER))",
    json_from_text_sql="{x}",
    supports_writable_cte=False,
    rows_array_sql=None,  # (the driver sends a batch in one round trip)
    abort_sql=None,
    checks_batches_in_process=True,
    one_writer=True,
    reuses_row_ids=True,
    storage=StorageProfile(decimal="text", bool="int", date="text", timestamp="epoch-ms"),
    # PRAGMA is plain only for the pragmas that read (a setting's pragma
    # with an argument sets it); ATTACH and BEGIN are not plain.
    session_changes=SessionChanges(
        r"replace|reindex|vacuum|pragma\s+(?:\w+\.)?(?:table_x?info|table_list|index_x?info"
        r"|index_list|foreign_key_list|foreign_key_check|integrity_check|quick_check"
        r"|database_list|collation_list|function_list|module_list|pragma_list"
        r"|compile_options|data_version|page_count|freelist_count)"
    ),
    ddl=DdlSpec(
        types={
            "string": "text",
            "text": "text",
            "varchar": "varchar({n})",
            "integer": "integer",
            "bigint": "integer",
            # Text keeps every digit: SQLite has no exact decimal type.
            "decimal": "text",
            "bool": "integer",
            "json": "text",
            "json_document": "text",
            "binary": "blob",
            "date": "text",
            "timestamp": "integer",
            "external_id": "text",
            "reference": "integer",
            "versionstamp": "text",
            "version": "integer",
        },
        # An alias of the rowid: a 64-bit key without extra storage.
        primary_key="INTEGER PRIMARY KEY",
        table_options="",
        columns_sql="SELECT name FROM pragma_table_info({table})",
        indexes_sql="SELECT name FROM pragma_index_list({table})",
        add_column_references=True,
    ),
)


def adapter(options: Options) -> DialectAdapter:
    """The adapter for one Database: the timestamp storage profile is an option
    (``sqlite_timestamps``: "epoch-ms", the default, or "iso-text")."""
    if options.sqlite_timestamps == "epoch-ms":
        return _BASE
    storage = replace(_BASE.storage, timestamp="iso-text")
    ddl = replace(_BASE.ddl, types={**_BASE.ddl.types, "timestamp": "text"})
    return replace(_BASE, storage=storage, ddl=ddl)


def _datetime(value: datetime) -> str:
    # ISO-8601 text; aware values in UTC so text order is time order.
    if value.tzinfo is not None:
        value = utc_instant(value)
    return value.isoformat()


def _integer(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise ValidationError(
            f"{brief(value)} is outside SQLite's 64-bit integers; bind a Decimal or text"
        )
    return value


def _real(value: float) -> float:
    if value != value:
        raise ValidationError("NaN cannot be stored: SQLite would store NULL instead")
    return value


def create_compiler() -> SqlCompiler:
    return SqlCompiler(
        placeholder="?",
        quote='"',
        max_identifier_length=_BASE.max_identifier_length,
        encoders={
            str: unicode_text,
            int: _integer,
            float: _real,
            # sqlite3 has no exact decimal type: text keeps every digit.
            Decimal: str,
            datetime: _datetime,
            date: date.isoformat,
            time: time.isoformat,
            dict: json_param,
            Json: json_param,
        },
        empty_set="SELECT NULL WHERE 0",
        # What sqlite3 binds, and what the encoders above turn into that.
        scalars=(
            *(type(None), bool, int, float, str, bytes, bytearray, memoryview),
            *(Decimal, datetime, date, time, dict, Json),
        ),
    )


# SQLite extended result codes -> error class, and the nearest SQLSTATE.
_CODES: dict[str, tuple[type[Error], str | None]] = {
    "2067": (UniqueViolation, "23505"),  # SQLITE_CONSTRAINT_UNIQUE
    "1555": (UniqueViolation, "23505"),  # SQLITE_CONSTRAINT_PRIMARYKEY
    "787": (ForeignKeyViolation, "23503"),  # SQLITE_CONSTRAINT_FOREIGNKEY
    "1299": (NotNullViolation, "23502"),  # SQLITE_CONSTRAINT_NOTNULL
    "275": (CheckViolation, "23514"),  # SQLITE_CONSTRAINT_CHECK
    "19": (IntegrityError, "23000"),  # SQLITE_CONSTRAINT
    "5": (LockTimeout, "55P03"),  # SQLITE_BUSY: another process kept the lock
    "6": (LockTimeout, "55P03"),  # SQLITE_LOCKED
    "517": (SerializationFailure, "40001"),  # SQLITE_BUSY_SNAPSHOT
    "1": (ProgrammingError, "42000"),  # SQLITE_ERROR: syntax, no such table/column
    "9": (QueryCanceled, "57014"),  # SQLITE_INTERRUPT
    "18": (DataError, "22001"),  # SQLITE_TOOBIG
    "20": (DataError, "22000"),  # SQLITE_MISMATCH
    "14": (DatabaseUnavailable, None),  # SQLITE_CANTOPEN
}

ERRORS = ErrorTable(
    codes={code: cls for code, (cls, _) in _CODES.items()},
    types=[
        # Raised by sqlite3 for values it cannot bind (e.g. a list).
        (sqlite3.ProgrammingError, ValidationError),
        (sqlite3.IntegrityError, IntegrityError),
        (sqlite3.DataError, DataError),
        (sqlite3.OperationalError, ProgrammingError),
    ],
    sqlstates={code: state for code, (_, state) in _CODES.items() if state},
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


def _pragmas(url: DatabaseURL, options: Options) -> list[str]:
    statements = [
        f"PRAGMA busy_timeout = {int(options.busy_timeout * 1000)}",
        "PRAGMA foreign_keys = ON",
        # LIKE (starts_with) is case-sensitive on the other databases too.
        "PRAGMA case_sensitive_like = ON",
    ]
    if not url.is_memory:
        statements.append("PRAGMA journal_mode = WAL")
    return statements


def pooled_dialect(url: DatabaseURL, options: Options, connect: Connector) -> PooledDialect:
    """The Dialect of either SQLite backend, around its ``connect``."""
    return PooledDialect(
        name="sqlite",
        adapter=adapter(options),
        compiler=create_compiler,
        translate=translate_error,
        connect=connect,
        options=options,
        pool_size=pool_size(url, options),
        # ":memory:" lives as long as its one connection: never recycle it.
        recycle=not url.is_memory,
    )


def _is_read_only(sql: str) -> bool:
    return sql.lstrip()[:6].lower() in ("select", "explai")


class WriteGate:
    """Admits one writing transaction at a time, first come first served.
    Waiting here counts against ``busy_timeout`` like waiting for another
    process's lock does, so a writer gives up after about that long in all."""

    def __init__(self, timeout: float) -> None:
        self._slot = Slots(1, timeout)
        self._timeout = timeout

    async def acquire(self) -> None:
        if not await self._slot.acquire():
            raise LockTimeout(
                f"waited busy_timeout={self._timeout}s for this process's other writers; "
                "shorten write transactions or raise busy_timeout",
                sqlstate="55P03",
            )

    def release(self) -> None:
        self._slot.release()


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
        self._begin_pending = False
        self._closed = False
        self._settings: list[CompiledQuery] = []  # (configure)
        self._memory = False

    # In-process: a connection that breaks leaves nothing running elsewhere.
    server_session = None

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
        begin, self._begin_pending = self._begin_pending, False
        call = partial(run_batch, queries=queries, stop=stop, begin=begin)
        if self._holds_gate or all(_is_read_only(query.sql) for query in queries):
            return await self._interruptible(call)
        await self._gate.acquire()
        try:
            return await self._interruptible(call)
        finally:
            self._gate.release()

    async def begin(self, isolation: IsolationLevel | None) -> None:
        # SQLite transactions are serializable, which satisfies every level.
        await self._gate.acquire()
        self._holds_gate = True
        self._begin_pending = True

    async def commit(self) -> None:
        if self._begin_pending:
            self._begin_pending = False  # nothing ran: nothing to commit
        else:
            await self._call(partial(_run_sql, sql="COMMIT"))
        self._release_gate()

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """One hop for the statements, ``stop``'s checks and COMMIT. A
        cancelled caller interrupts the statements, never a COMMIT that has
        started (its outcome is then the database's)."""
        begin, self._begin_pending = self._begin_pending, False
        guard = CommitGuard(self._interrupt)
        call = partial(run_batch, queries=queries, stop=stop, begin=begin, commit=guard)
        try:
            results = await self._call(call)
        except runtime.get_cancelled_exc_class():
            guard.interrupt()
            raise
        if not stopped(queries, results, stop):
            self._release_gate()
        return results

    async def rollback(self) -> None:
        try:
            if self._begin_pending:
                self._begin_pending = False
            elif self._raw.in_transaction:
                await self._call(partial(_run_sql, sql="ROLLBACK"))
        finally:
            self._release_gate()

    async def ping(self) -> None:
        await self._call(partial(_run_sql, sql="SELECT 1"))

    async def configure(self, url: DatabaseURL, options: Options) -> None:
        """Apply the connection settings; closes the connection if that fails."""
        self._settings = [CompiledQuery(s) for s in _pragmas(url, options)]
        self._memory = url.is_memory
        try:
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
        self._begin_pending = False
        self._release_gate()
        await self._close_raw()

    def _release_gate(self) -> None:
        if self._holds_gate:
            self._holds_gate = False
            self._gate.release()


class CommitGuard:
    """Lets a cancelled caller interrupt a batch up to its COMMIT, and not
    once COMMIT has started: an interrupted COMMIT could leave the caller
    unsure whether it applied while the transaction is in fact gone."""

    def __init__(self, interrupt: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._interrupt = interrupt
        self._state = "running"  # -> "interrupted" | "committing"

    def interrupt(self) -> None:
        """From the caller's side: stop the batch unless COMMIT has started."""
        with self._lock:
            if self._state == "running":
                self._state = "interrupted"
                self._interrupt()

    def commit(self, raw: sqlite3.Connection) -> None:
        """From sqlite3's thread: COMMIT, unless the caller has gone."""
        with self._lock:
            if self._state == "interrupted":
                # (sqlite3's interrupt is lost when no statement was running.)
                raise sqlite3.OperationalError("interrupted before COMMIT")
            self._state = "committing"
        _run_sql(raw, "COMMIT")


def run_batch(
    raw: sqlite3.Connection,
    *,
    queries: Sequence[CompiledQuery],
    stop: StopWhen | None = None,
    begin: bool = False,
    commit: CommitGuard | None = None,
) -> list[QueryResult]:
    """Statements start to finish on the calling thread (sqlite3's), after
    ``BEGIN IMMEDIATE`` when ``begin``, up to the stop point; then, if none
    was reached, COMMIT through ``commit``."""
    if begin:
        _run_sql(raw, "BEGIN IMMEDIATE")
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
            inserted = query.sql.lstrip()[:7].lower() in ("insert ", "replace")
            return QueryResult([], max(cursor.rowcount, 0), cursor.lastrowid if inserted else None)
        values = cursor.fetchall()
        index = column_index(tuple([column[0] for column in description]))
        return QueryResult([Row(index, row) for row in values], len(values), cursor.lastrowid)
    finally:
        cursor.close()


def _run_sql(raw: sqlite3.Connection, sql: str) -> None:
    raw.execute(sql).close()
