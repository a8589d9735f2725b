"""MySQL and MariaDB through asyncmy (asyncio).

Connections use the FOUND_ROWS client flag, so an UPDATE reports the rows it
*matched* even when a value did not change — version checks rely on that.
Statements outside a transaction autocommit; ``begin`` opens an explicit one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import asyncmy
import asyncmy.errors
from asyncmy.connection import Connection as RawConnection
from asyncmy.constants import CLIENT, FIELD_TYPE
from asyncmy.constants.SERVER_STATUS import SERVER_STATUS_AUTOCOMMIT, SERVER_STATUS_IN_TRANS
from asyncmy.converters import escape_date, escape_datetime, escape_time, escape_timedelta
from asyncmy.cursors import SSCursor

from .. import tls as tls_
from ..dialects import mysql
from ..driver import (
    COMMIT,
    CompiledQuery,
    DeferredBegin,
    IsolationLevel,
    QueryResult,
    Row,
    StopWhen,
    column_index,
    commit_after,
)
from ..errors import (
    ConnectionLost,
    DatabaseError,
    DatabaseUnavailable,
    DataError,
    ErrorTable,
    IntegrityError,
    ProgrammingError,
    QueryCanceled,
    ValidationError,
)
from ..host_choice import HostChoice, Origin, Probe, hosts_of
from ..pool import PooledDialect
from ..url import DatabaseURL, HostPort, Options, describe_host
from .asyncmy_prepared import GoesAsText, Prepared, binary_values, changes_parsing, float32
from .tcp import tune_socket

ERRORS = ErrorTable(
    codes=mysql.CODES,
    sqlstates=mysql.SQLSTATES,
    types=[
        (asyncmy.errors.IntegrityError, IntegrityError),
        (asyncmy.errors.DataError, DataError),
        (asyncmy.errors.ProgrammingError, ProgrammingError),
        (TimeoutError, QueryCanceled),
        (ConnectionRefusedError, DatabaseUnavailable),
        (OSError, ConnectionLost),
        # asyncio.IncompleteReadError: the server closed the socket mid-reply.
        (EOFError, ConnectionLost),
    ],
)

_KILL_TIMEOUT = 2.0
_COM_RESET_CONNECTION = 0x1F  # (asyncmy has no call for it)
_DATETIME_TYPES = frozenset({FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP})


def _error_code(exc: BaseException) -> str | None:
    if isinstance(exc, asyncmy.errors.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return str(exc.args[0])
    return None


def _error_message(exc: BaseException) -> str | None:
    # asyncmy's errors are (code, message) pairs, whose str() is the tuple's repr.
    args = exc.args
    if isinstance(exc, asyncmy.errors.MySQLError) and len(args) == 2 and isinstance(args[1], str):
        return args[1]
    return None


def translate(exc: BaseException) -> Exception:
    return ERRORS.translate(exc, _error_code(exc), _error_message(exc))


@functools.lru_cache(maxsize=1024)
def _columns(
    description: tuple[tuple[Any, ...], ...],
) -> tuple[Mapping[str, int], tuple[int, ...], tuple[int, ...]]:
    """The rows' name-to-position index, and the positions of their DATETIME
    and of their FLOAT columns: the same for every result of the same
    columns (a result's description is new, and equal to the last one's: a
    look-up here costs less than working them out again)."""
    index = column_index(tuple([column[0] for column in description]))
    utc = tuple([i for i, column in enumerate(description) if column[1] in _DATETIME_TYPES])
    floats = tuple([i for i, column in enumerate(description) if column[1] == FIELD_TYPE.FLOAT])
    return index, utc, floats


def _fixed_rows(
    positions: tuple[int, ...],
    tuples: Sequence[tuple[Any, ...]],
    fix: Callable[[Any], Any],
) -> list[tuple[Any, ...]]:
    """``tuples`` with ``fix`` applied to their non-NULL values at ``positions``."""
    fixed = []
    for values in tuples:
        row = list(values)
        for i in positions:
            if row[i] is not None:
                row[i] = fix(row[i])
        fixed.append(tuple(row))
    return fixed


def _utc(value: Any) -> Any:
    # The session runs in UTC, so DATETIME values are UTC: make them aware.
    return value.replace(tzinfo=UTC) if isinstance(value, datetime) else value


Killer = Callable[[int, str], Awaitable[None]]

# A statement that goes as text (a batch, a stream, one the server will not
# prepare: see asyncmy_prepared for the others, whose values travel as
# binary parameters meaning what these literals mean) has its values written
# into the text (MySQL's text protocol has no parameters) by the functions
# below, never by the driver's escaping: each
# literal reads as the same value whatever the session's sql_mode
# (NO_BACKSLASH_ESCAPES or not), and none can end early under any character
# set — so a session changed by raw SQL, or a statement earlier in the same
# text, cannot make a value run as SQL. The compiler lets only these types
# through (``scalars`` in the dialect); the driver escapes nothing of ours.


def _text(value: str) -> str:
    # A doubled quote is one quote in either backslash mode. A backslash has
    # no spelling that both modes read alike, so text holding one goes as the
    # hex of its UTF-8, which nothing reinterprets (same charset and
    # collation as a plain literal: the session runs SET NAMES utf8mb4).
    if "\\" in value:
        return "_utf8mb4 X'" + value.encode().hex() + "'"
    return "'" + value.replace("'", "''") + "'"


def _binary(value: bytes | bytearray | memoryview) -> str:
    return "X'" + bytes(value).hex() + "'"


def _float(value: float) -> str:
    if not math.isfinite(value):
        raise ValidationError(f"MySQL has no {value!r}; store a finite number or NULL")
    text = float.__repr__(value)
    return text if "e" in text else text + "e0"  # a DOUBLE, not an exact DECIMAL


def _decimal(value: Decimal) -> str:
    if not value.is_finite():
        raise ValidationError(f"MySQL has no Decimal {value}; store a finite number or NULL")
    return format(value, "f")


_LITERALS: dict[type, Callable[[Any], str]] = {
    str: _text,
    int: int.__repr__,
    bool: lambda value: "1" if value else "0",
    type(None): lambda value: "NULL",
    float: _float,
    Decimal: _decimal,
    bytes: _binary,
    bytearray: _binary,
    memoryview: _binary,
    datetime: escape_datetime,
    date: escape_date,
    time: escape_time,
    timedelta: escape_timedelta,
}
# For subclasses (an IntEnum, a StrEnum): the base's literal of the value it
# holds, whatever the subclass overrides. datetime before date.
_BASES: tuple[tuple[type, Callable[[Any], str]], ...] = (
    (str, lambda value: _text(str.__str__(value))),
    (int, int.__repr__),
    (float, lambda value: _float(float(value))),
    *((base, _LITERALS[base]) for base in (Decimal, bytes, bytearray, datetime, date, time)),
    (timedelta, escape_timedelta),
)


def _literal(value: Any) -> str:
    write = _LITERALS.get(type(value)) or _subclass_literal
    return write(value)


def _subclass_literal(value: Any) -> str:
    write = next((w for base, w in _BASES if isinstance(value, base)), None)
    if write is None:
        raise ValidationError(
            f"cannot bind a {type(value).__name__} value on MySQL; convert it "
            "(for example str(value)) before passing it"
        )
    return write(value)


def _bind(sql: str, parameters: Sequence[Any]) -> str:
    """``sql`` with ``parameters`` as literals (``%`` in ``sql`` itself comes
    doubled from the compiler, so the formatting runs even without any)."""
    # (_literal written out, in a loop rather than a comprehension: one call
    # per value, and none of the loop's own.)
    literals, other = _LITERALS, _subclass_literal
    written = []
    for value in parameters:
        if type(value) is str and "\\" not in value:  # (_text's usual case, without its call)
            written.append("'" + value.replace("'", "''") + "'")
        else:
            written.append(literals.get(type(value), other)(value))
    return sql % tuple(written)


# How much SQL text one round trip carries at most (in characters, up to 4
# bytes each): a batch longer than this goes out in several, in order. The
# server refuses a packet over its max_allowed_packet, 16 MiB by default on
# MariaDB, 64 MiB on MySQL 8.
MAX_BATCH_CHARS = 2 * 1024 * 1024


def _pieces(texts: list[str]) -> list[list[str]]:
    """``texts`` cut, in order, into multi-statement texts of at most
    :data:`MAX_BATCH_CHARS` characters (a longer statement goes alone)."""
    pieces: list[list[str]] = [[]]
    size = 0
    for text in texts:
        if size + len(text) > MAX_BATCH_CHARS and pieces[-1]:
            pieces.append([])
            size = 0
        pieces[-1].append(text)
        size += len(text) + 2
    return pieces


def _query_result(raw: Any, result: Any, *, binary: bool) -> QueryResult:
    """asyncmy's ``result`` of one statement (of the binary protocol or
    not) as a QueryResult; ``raw``'s status made that of the result."""
    raw.server_status = result.server_status  # (see _keep_status)
    description = result.description
    if description is None:
        return QueryResult([], result.affected_rows, result.insert_id or None)
    tuples = result.rows
    index, utc, floats = _columns(description)
    if utc:
        tuples = _fixed_rows(utc, tuples, _utc)
    if floats and binary:
        tuples = _fixed_rows(floats, tuples, float32)
    # (_rows written out, with a loop: a comprehension is a call of its own.)
    rows = []
    for values in tuples:
        rows.append(Row(index, values))
    return QueryResult(rows, len(rows))


async def _read_result(cursor: Any) -> QueryResult:
    description = cursor.description
    if description is None:
        return QueryResult([], cursor.rowcount, cursor.lastrowid or None)
    rows = _rows(description, await cursor.fetchall())
    return QueryResult(rows, len(rows))


def _rows(description: tuple[tuple[Any, ...], ...], tuples: Sequence[tuple[Any, ...]]) -> list[Row]:
    index, utc, _ = _columns(description)
    if utc:
        tuples = _fixed_rows(utc, tuples, _utc)
    return [Row(index, values) for values in tuples]


async def _drain(cursor: Any) -> None:
    """Read the results of statements past a batch's stop point: the server
    ran them, and their errors no longer matter (the caller rolls back)."""
    with contextlib.suppress(asyncmy.errors.MySQLError):
        while await cursor.nextset():
            pass


class AsyncmyConnection:
    """Batches travel as one multi-statement text (asyncmy always negotiates
    CLIENT_MULTI_STATEMENTS and binds values client-side), so a batch costs one
    round trip, and a deferred ``begin`` rides along with the next one."""

    __slots__ = ("_begin", "_kill", "_origin", "_prepared", "_raw", "_restore", "server_session")

    def __init__(
        self, raw: Any, kill: Killer, server_session: str, restore: Restore, origin: Origin
    ) -> None:
        self._raw = raw
        self._prepared = Prepared(raw)
        self._kill = kill
        self.server_session = server_session
        self._restore = restore
        self._origin = origin
        # Statements to send ahead of the next batch.
        self._begin: DeferredBegin[tuple[str, ...]] = DeferredBegin()
        raw._proto._closed_waiter.add_done_callback(self._ended)

    @property
    def is_closed(self) -> bool:
        # connected stays True after the peer closed the socket; the stream knows.
        return not self._raw.connected or bool(self._raw._stream_broken)

    @property
    def is_stale(self) -> bool:
        # Another connection to the same host was lost since this one was
        # opened: the pool replaces it rather than hand it out.
        return self._origin.outdated

    @property
    def in_transaction(self) -> bool:
        # (From the status flags of the server's last OK or EOF packet.)
        status = self._raw.server_status
        return bool(status & SERVER_STATUS_IN_TRANS or not status & SERVER_STATUS_AUTOCOMMIT)

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        if self._begin.pending is not None:
            return (await self.execute_batch((query,)))[0]
        # One statement, the usual case, goes without the batch's bookkeeping
        # and without a cursor: with parameters, as a prepared statement
        # (see asyncmy_prepared), else the connection's own query call,
        # whose result the cursor would only copy. (Nor does it fetch the
        # statement's warnings with a SHOW WARNINGS round trip, to log them,
        # as the cursor does: aiofragno raises errors, and runs in strict
        # mode, where what would lose data is an error.)
        raw = self._raw
        sql, parameters = query
        if changes_parsing[sql]:
            # (Until the reset that follows, statements go as text, parsed
            # in the session as it is now: see asyncmy_prepared.)
            self._prepared.paused = True
        elif parameters and not self._prepared.paused:
            try:
                values = binary_values(parameters)  # (checked before anything is sent)
            except GoesAsText:
                values = None
            if values is not None:
                statement = self._prepared.statements.get(sql)
                if statement is None:
                    statement = await self._prepared.prepare(sql, len(parameters))
                if statement is not None:
                    result = await statement.execute(values)
                    return _query_result(raw, result, binary=True)
        await raw.query(_bind(sql, parameters))
        read = _query_result(raw, raw._result, binary=False)
        if raw._result.has_next:
            # (Text holding more statements: the cursor reads their
            # results too, errors included, so that the next command can go.)
            while raw._result.has_next:
                await raw.next_result()
            _keep_status(raw)
        return read

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        if len(queries) == 1 and self._begin.pending is None:
            return [await self.execute_query(queries[0])]
        lead = self._begin.take() or ()
        for query in queries:  # (see execute_query)
            if changes_parsing[query.sql]:
                self._prepared.paused = True
        texts = [*lead, *(_bind(*query) for query in queries)]
        results: list[QueryResult] = []
        skip = len(lead)  # (the lead's own results are not asked for)
        for piece in _pieces(texts):
            async with self._raw.cursor() as cursor:
                await cursor.execute(";\n".join(piece))
                for n in range(len(piece)):
                    if n:
                        await cursor.nextset()
                    if skip:
                        skip -= 1
                        continue
                    result = await _read_result(cursor)
                    results.append(result)
                    if stop is not None and stop(len(results) - 1, result):
                        await _drain(cursor)
                        _keep_status(self._raw)
                        return results
            _keep_status(self._raw)
        return results

    async def stream(self, query: CompiledQuery, batch_size: int) -> AsyncmyStream:
        if self._begin.pending is not None:
            await self.execute_batch(())  # (the deferred BEGIN, alone)
        if changes_parsing[query.sql]:  # (see execute_query)
            self._prepared.paused = True
        cursor = self._raw.cursor(SSCursor)
        await cursor.execute(_bind(*query))
        return AsyncmyStream(self._raw, cursor, batch_size)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        if isolation is None:
            self._begin.defer(("BEGIN",))
        else:  # (SET TRANSACTION applies to the next transaction only)
            self._begin.defer((mysql.isolation_statement(isolation), "BEGIN"))

    async def commit(self) -> None:
        if self._begin.drop():
            return  # nothing ran: nothing to commit
        await self._raw.commit()

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        if stop is not None:
            # The server runs a multi-statement text to its end: the results
            # are checked before COMMIT goes out.
            return await commit_after(self, queries, stop)
        # COMMIT ends the multi-statement text: the server commits right after
        # the last statement, without a round trip to us in between.
        return (await self.execute_batch([*queries, COMMIT]))[:-1]

    async def rollback(self) -> None:
        if self._begin.drop():
            return
        await self._raw.rollback()

    async def ping(self) -> None:
        await self._raw.ping(reconnect=False)

    async def reset(self) -> bool:
        self._begin.drop()
        # An interrupted read leaves the protocol stream mid-packet, so the
        # connection is discarded; the server would go on running the statement
        # (holding its locks) unless told to stop from another connection.
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            async with asyncio.timeout(_KILL_TIMEOUT):
                await self._kill(self._raw.thread_id(), self.server_session)
        return False

    async def reset_session(self) -> bool:
        self._begin.drop()
        # COM_RESET_CONNECTION ends the transaction, drops temporary tables,
        # user variables and prepared statements, releases every user-level
        # lock and returns settings to the server's defaults; it keeps the
        # current database. Then the connection's own session comes back.
        raw = self._raw
        await raw._execute_command(_COM_RESET_CONNECTION, b"")
        self._prepared.forget()  # (the server dropped them, whatever comes next)
        await raw._read_ok_packet()
        async with raw.cursor() as cursor:
            await cursor.execute(self._restore.sql)
            while cursor.description is None and await cursor.nextset():
                pass
            row = await cursor.fetchone()
        _keep_status(raw)
        return bool(row == (1, self._restore.database))

    def _ended(self, _closed: object) -> None:
        # (asyncmy's protocol resolves this future when the socket closes:
        # by us — then the connection has dropped its transport first — or
        # by the server or the network, which makes the other connections
        # to that host suspect.)
        if self._raw._transport is not None:
            self._origin.lost()

    async def close(self) -> None:
        if self._raw.connected:
            self._raw.close()


class AsyncmyStream:
    """An unbuffered result (asyncmy's SSCursor), read in batches.

    The server sends the whole result as fast as the socket takes it, and
    asyncmy reads whatever arrives into its buffer: so that the rows wait in
    the server's socket rather than in our memory, the connection stops
    reading between fetches (the transport's flow control). The connection
    can send nothing else until the last row has been read."""

    __slots__ = ("_batch", "_cursor", "_raw")

    def __init__(self, raw: Any, cursor: Any, batch_size: int) -> None:
        self._raw = raw
        self._cursor = cursor
        self._batch = batch_size
        self._pause()

    def _active(self) -> bool:
        result = self._raw._result
        return result is not None and bool(result.unbuffered_active)

    def _pause(self) -> None:
        transport = self._raw._transport
        if self._active() and transport is not None:
            transport.pause_reading()

    def _resume(self) -> None:
        transport = self._raw._transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    async def fetch(self) -> list[Row]:
        cursor = self._cursor
        if cursor.description is None or not self._active():
            return []
        self._resume()
        tuples = await cursor.fetchmany(self._batch)
        self._pause()
        return _rows(cursor.description, tuples)

    async def close(self, *, drain: bool) -> bool:
        self._resume()  # (a paused connection would wait forever for its next reply)
        if self._active() and not drain:
            return False  # (MySQL cannot stop a result but by closing its connection)
        await self._cursor.close()  # (reads what is left of the result)
        _keep_status(self._raw)
        return True


def _keep_status(raw: Any) -> None:
    """Make the driver's ``server_status`` that of the last result read:
    asyncmy keeps the last non-zero one, and 0 (autocommit off, no
    transaction) is news as well."""
    result = raw._result
    if result is not None:
        raw.server_status = result.server_status


@dataclass(frozen=True, slots=True)
class Restore:
    """What brings a reset connection's session back (``sql``: settings,
    database, session lock; its last statement returns the lock's GET_LOCK
    and ``DATABASE()``), and the database it must be in."""

    sql: str
    database: str | None

    @classmethod
    def of(cls, url: DatabaseURL, session: str) -> Restore:
        statements = [mysql.SESSION_SQL]
        if url.database:
            statements.append("USE `" + url.database.replace("`", "``") + "`")
        statements.append(f"SELECT GET_LOCK({_text(session)}, 0), DATABASE()")
        return cls(";\n".join(statements), url.database or None)


async def kill_query(
    url: DatabaseURL,
    options: Options,
    thread_id: int,
    session: str,
    *,
    tls: tls_.TLS | None = None,
    server: HostPort | None = None,
) -> None:
    """Stop the statement running on connection ``thread_id`` of ``server``
    (default: the URL's first), from a new connection, if that connection
    still holds the session lock ``session``. The server hands out
    connection ids afresh after a restart, so the id alone could name
    someone else's connection by now; the lock names ours."""
    async with asyncio.timeout(options.connect_timeout):
        killer = await open_raw(url, options, tls, server)
    try:
        async with killer.cursor() as cursor:
            await cursor.execute(mysql.SESSION_HOLDER_SQL, (session,))
            (holder,) = await cursor.fetchone()
            if holder == thread_id:
                await cursor.execute("KILL QUERY %s", (thread_id,))
    finally:
        killer.close()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    # Checked (and certificate files read) here, once: a bad setting is a
    # ValidationError before anything is sent.
    tls = tls_.configure(url, options)
    hosts = hosts_of(url, options)
    # (The fence's replication set: see mysql.server_role.)
    replication_set = "mysql:" + ",".join(sorted(describe_host(*s) for s in hosts.servers))

    async def open_server(server: HostPort) -> Any:
        # asyncmy's connect_timeout covers the TCP connect only, not the handshake.
        async with asyncio.timeout(options.connect_timeout):
            return await open_raw(url, options, tls, server)

    async def ask(raw: Any) -> tuple[Any, ...]:
        async with asyncio.timeout(options.connect_timeout), raw.cursor() as cursor:
            await cursor.execute(mysql.role_sql(raw.get_server_info()))
            row: tuple[Any, ...] = await cursor.fetchone()
        return row

    async def lag(raw: Any) -> float | None:
        try:
            async with asyncio.timeout(options.connect_timeout), raw.cursor() as cursor:
                await cursor.execute(mysql.REPLICA_STATUS_SQL)
                rows = await cursor.fetchall()
                columns = [column[0] for column in cursor.description or ()]
        except asyncmy.errors.OperationalError:
            return None  # (no privilege to see the replica's status)
        return mysql.replica_lag(columns, rows)

    probe = Probe(
        open=open_server,
        ask=ask,
        role=lambda row: mysql.server_role(row, replication_set),
        drop=lambda raw: raw.close(),
        lag=lag,
    )
    choice = HostChoice(url, hosts, probe, follower="replica")

    async def connect() -> AsyncmyConnection:
        if choice.needed:
            raw, server, _ = await choice.choose()
        else:
            server = hosts.servers[0]
            raw = await open_server(server)
        session = f"aiofragno-session-{os.urandom(12).hex()}"
        try:
            async with asyncio.timeout(options.connect_timeout), raw.cursor() as cursor:
                await cursor.execute(mysql.SESSION_LOCK_SQL, (session,))
                (taken,) = await cursor.fetchone()
        except BaseException:
            raw.close()
            raise
        if taken != 1:
            raw.close()
            raise DatabaseError(f"could not take the session lock {session!r} (GET_LOCK: {taken})")
        kill = functools.partial(kill_query, url, options, tls=tls, server=server)
        restore = Restore.of(url, session)
        return AsyncmyConnection(raw, kill, session, restore, choice.origin(server))

    def translate_here(exc: BaseException) -> Exception:
        return choice.read_only_elsewhere(translate(exc))

    return PooledDialect(
        name="mysql",
        adapter=mysql.ADAPTER,
        compiler=mysql.create_compiler,
        translate=translate_here,
        connect=connect,
        options=options,
        pool_size=options.pool_size,
        bound_to_loop=True,
        servers=choice.servers,
    )


async def open_raw(
    url: DatabaseURL,
    options: Options,
    tls: tls_.TLS | None = None,
    server: HostPort | None = None,
) -> Any:
    """An asyncmy connection to ``server`` (default: the URL's first) with
    the backend's settings, no session lock taken; over TLS as ``tls`` says
    (default: as ``options`` say)."""
    raw = await _open(url, options, tls or tls_.configure(url, options), server or url.servers[0])
    try:
        tune_socket(raw._transport, options)
    except BaseException:
        raw.close()
        raise
    return raw


async def _open(url: DatabaseURL, options: Options, tls: tls_.TLS, server: HostPort) -> Any:
    arguments = _arguments(url, options, server)
    if tls.context is None:
        return await asyncmy.connect(**arguments)
    # (Made here rather than by asyncmy.connect, to see its greeting after a failure.)
    raw = RawConnection(**arguments, ssl=tls.context)  # type: ignore[no-untyped-call]
    try:
        await raw.connect()
        return raw
    except Exception as exc:
        # asyncmy asks for TLS even of a server whose greeting offered none.
        offers_tls = _offers_tls(raw)
        if not (tls.mode == "prefer" and offers_tls is False):
            address = describe_host(server[0], server[1] or 3306)
            error = tls_.failure(exc, address=address, tls=tls, offers_tls=offers_tls)
            if error is not None:
                raise error from exc
            raise
    return await asyncmy.connect(**arguments)  # prefer: the server has no TLS


def _arguments(url: DatabaseURL, options: Options, server: HostPort) -> dict[str, Any]:
    host, port = server
    where = (
        {"unix_socket": host}
        if host.startswith("/")
        else {"host": host or "localhost", "port": port or 3306}
    )
    return {
        **where,
        "user": url.username or "root",
        "password": url.password or "",
        "database": url.database or None,
        "charset": "utf8mb4",
        "autocommit": True,
        "client_flag": CLIENT.FOUND_ROWS,
        "connect_timeout": options.connect_timeout,
        "read_timeout": options.command_timeout,
        "init_command": mysql.SESSION_SQL,
        "program_name": options.application_name,
    }


def _offers_tls(raw: Any) -> bool | None:
    """Whether the server's greeting offered TLS; None if none was read."""
    capabilities = getattr(raw, "server_capabilities", None)
    return None if capabilities is None else bool(capabilities & CLIENT.SSL)
