"""PostgreSQL through asyncpg (asyncio)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

import asyncpg

from .. import tls as tls_
from ..dialects import postgresql
from ..driver import (
    CompiledQuery,
    IsolationLevel,
    QueryResult,
    Row,
    StopWhen,
    column_index,
    commit_after,
    execute_in_turn,
)
from ..errors import (
    ConnectionLost,
    DatabaseUnavailable,
    ErrorTable,
    ProgrammingError,
    QueryCanceled,
    ValidationError,
)
from ..host_choice import HostChoice, Origin, Probe, hosts_of
from ..hosts import ServerRole
from ..libpq import server_settings
from ..pool import PooledDialect
from ..url import DatabaseURL, HostPort, Options, describe_host
from .tcp import tune_socket

ERRORS = ErrorTable(
    codes=postgresql.CODES,
    prefixes=postgresql.PREFIXES,
    types=[
        (asyncpg.exceptions.ConnectionDoesNotExistError, ConnectionLost),
        (asyncpg.exceptions.ConnectionFailureError, ConnectionLost),
        (asyncpg.exceptions.CannotConnectNowError, DatabaseUnavailable),
        # "connection is closed" and friends (other InterfaceErrors: see translate).
        (asyncpg.exceptions.InterfaceError, ConnectionLost),
        # "cannot switch to state ...; another operation is in progress": the
        # server's termination message arrived before its socket closed.
        (asyncpg.exceptions.InternalClientError, ConnectionLost),
        (TimeoutError, QueryCanceled),
        (ConnectionRefusedError, DatabaseUnavailable),
        (OSError, ConnectionLost),
    ],
)


def translate(exc: BaseException) -> Exception:
    message = str(exc)
    # asyncpg checks arguments against the prepared statement before sending.
    if "invalid input for query argument" in message:
        return ValidationError(message)
    if isinstance(exc, asyncpg.exceptions.InterfaceError) and "closed" not in message:
        return ProgrammingError(message)  # e.g. wrong number of arguments
    return ERRORS.translate(exc, getattr(exc, "sqlstate", None))


# What a session can hold beyond its settings at connect, dropped in one round
# trip (one simple-query text). Like DISCARD ALL, except that the prepared
# statements kept are asyncpg's own cache (DISCARD ALL would drop them under
# its feet): only those made by SQL PREPARE go. RESET ALL returns settings to
# their session defaults, which include those sent at connect (TimeZone,
# search_path, application_name).
_RESET_SESSION = (
    "CLOSE ALL; UNLISTEN *; SELECT pg_advisory_unlock_all(); "
    "SET SESSION AUTHORIZATION DEFAULT; RESET ROLE; RESET ALL; DISCARD TEMP; DISCARD SEQUENCES; "
    "DO $$DECLARE s text; BEGIN FOR s IN SELECT name FROM pg_prepared_statements "
    "WHERE from_sql LOOP EXECUTE 'DEALLOCATE ' || quote_ident(s); END LOOP; END$$"
)


def _rows_affected(status: str, returned: int) -> int:
    # "UPDATE 3", "INSERT 0 1", "SELECT 2"; commands without a count: rows returned.
    tail = status.rpartition(" ")[2]
    return int(tail) if tail.isdigit() else returned


def _result(records: Sequence[Any], rows_affected: int) -> QueryResult:
    # (asyncpg Records: values by position, like tuples.)
    if not records:
        return QueryResult([], rows_affected)
    index = column_index(tuple(records[0].keys()))
    return QueryResult([Row(index, r) for r in records], rows_affected)


# Statement texts whose kind StatementKinds remembers, at most. A longer text
# is prepared afresh at each run (as asyncpg does with a text longer than its
# max_cacheable_statement_size, whose default this is).
MAX_KIND_TEXT = 15 * 1024
MAX_KINDS = 1024


class StatementKinds:
    """Whether each statement text returns rows, learned at its first run.

    asyncpg's public API returns either a statement's rows (``fetch``) or its
    status with the affected-row count (``execute``), never both; which one a
    statement needs follows from the text, but only the server can tell (a
    SELECT INTO returns no rows, an UPDATE .. RETURNING does). A statement
    that returns rows affects as many as it returns (RETURNING yields one
    row per row written), so once the kind is known one public call per run
    gives both. It holds for every connection to the same database; one
    ``CALL`` whose procedure is replaced with one of other OUT parameters
    can change it, which nobody does to a running application. Least
    recently used texts go first."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: OrderedDict[str, bool] = OrderedDict()

    def get(self, sql: str) -> bool | None:
        known = self._known
        returns_rows = known.get(sql)
        if returns_rows is not None:
            known.move_to_end(sql)
        return returns_rows

    def learn(self, sql: str, returns_rows: bool) -> None:
        if len(sql) > MAX_KIND_TEXT:
            return
        known = self._known
        known[sql] = returns_rows
        if len(known) > MAX_KINDS:
            known.popitem(last=False)


class AsyncpgConnection:
    __slots__ = (
        "_closing",
        "_kinds",
        "_origin",
        "_raw",
        "_timeout",
        "server_session",
    )

    def __init__(
        self,
        raw: asyncpg.Connection,
        timeout: float | None,
        server_session: str,
        kinds: StatementKinds,
        origin: Origin,
    ) -> None:
        self._raw = raw
        self._timeout = timeout
        self.server_session = server_session
        self._kinds = kinds
        self._origin = origin
        self._closing = False
        raw.add_termination_listener(self._terminated)

    def _terminated(self, _raw: object) -> None:
        # (asyncpg calls this when the connection ends: closed by us, or
        # lost. A loss makes the other connections to that host suspect.)
        if not self._closing:
            self._origin.lost()

    @property
    def is_closed(self) -> bool:
        return self._raw.is_closed()

    @property
    def is_stale(self) -> bool:
        # Another connection to the same host was lost since this one was
        # opened: the pool replaces it rather than hand it out.
        return self._origin.outdated

    async def _timed_out(self, error: TimeoutError) -> Exception:
        """What a statement that got no reply within command_timeout raises:
        :class:`ConnectionLost` when its server does not accept a new
        connection within connect_timeout either (a host gone silent: no
        RST, no FIN), else the timeout itself (a slow statement)."""
        if await self._origin.answers():
            return error
        self._origin.lost()
        self._raw.terminate()
        return ConnectionLost(
            f"no reply within command_timeout={self._timeout}s, and "
            f"{self._origin.describe()} does not accept a new connection within "
            "connect_timeout either: the connection counts as lost"
        )

    @property
    def in_transaction(self) -> bool:
        # (From the transaction status of the server's last ReadyForQuery; a
        # terminated connection has no protocol left to ask.)
        raw = self._raw
        return not raw.is_closed() and raw.is_in_transaction()

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        # Public calls only (what driver instrumentation such as OpenTelemetry's
        # sees): see StatementKinds.
        sql, parameters = query
        returns_rows = self._kinds.get(sql)
        try:
            if returns_rows is None:
                return await self._first_run(sql, parameters)
            if returns_rows:
                records = await self._raw.fetch(sql, *parameters, timeout=self._timeout)
                return _result(records, len(records))
            status = await self._raw.execute(sql, *parameters, timeout=self._timeout)
        except TimeoutError as exc:
            raise await self._timed_out(exc) from None
        return QueryResult([], _rows_affected(status, 0))

    async def _first_run(self, sql: str, parameters: Sequence[Any]) -> QueryResult:
        """Run a statement of unknown kind through a prepared statement, which
        tells the kind and gives both rows and status: the two round trips
        asyncpg's fetch spends on a statement it has not cached (Parse and
        Describe, then Bind and Execute). Unnamed, it leaves nothing to close
        on the server."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        statement = await self._raw.prepare(sql, name="", timeout=self._timeout)
        # (A SELECT of no columns counts as returning nothing, at every run.)
        returns_rows = bool(statement.get_attributes())
        self._kinds.learn(sql, returns_rows)
        remaining = None if deadline is None else deadline - time.monotonic()
        records = await statement.fetch(*parameters, timeout=remaining)
        # (The status is None only before the statement has run.)
        status = statement.get_statusmsg() or ""
        return _result(records if returns_rows else [], _rows_affected(status, len(records)))

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        # The extended protocol carries one statement per Parse, and asyncpg
        # pipelines only executemany: one round trip per statement.
        return await execute_in_turn(self, queries, stop)

    async def stream(self, query: CompiledQuery, batch_size: int) -> AsyncpgStream:
        # A portal (asyncpg's Cursor, of its cached prepared statement): each
        # fetch is one Execute of at most batch_size rows.
        cursor = await self._raw.cursor(query.sql, *query.parameters, timeout=self._timeout)
        return AsyncpgStream(cursor, batch_size, self._timeout)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        await self._control(postgresql.begin_sql(isolation))

    async def commit(self) -> None:
        # (A COMMIT without reply within command_timeout is ambiguous: the
        # session layer makes it CommitOutcomeUnknown.)
        await self._control("COMMIT")

    async def _control(self, statement: str) -> None:
        """BEGIN, COMMIT or ROLLBACK, within command_timeout like any statement."""
        try:
            await self._raw.execute(statement, timeout=self._timeout)
        except TimeoutError as exc:
            raise await self._timed_out(exc) from None

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await commit_after(self, queries, stop)

    async def rollback(self) -> None:
        await self._control("ROLLBACK")

    async def ping(self) -> None:
        await self._raw.execute("SELECT 1")

    async def reset(self) -> bool:
        # After a cancelled query asyncpg may still be cancelling it server-side;
        # a fresh connection is cheaper to trust than that state.
        return False

    async def reset_session(self) -> bool:
        rollback = "ROLLBACK; " if self._raw.is_in_transaction() else ""
        await self._raw.execute(rollback + _RESET_SESSION, timeout=self._timeout)
        return True

    async def listen(self, channel: str, on_notify: Callable[[], object]) -> None:
        # (asyncpg calls both on this connection's loop, outside any task of ours.)
        def lost(_connection: object) -> None:
            on_notify()

        def notified(_connection: object, _pid: int, _channel: str, _payload: object) -> None:
            on_notify()

        self._raw.add_termination_listener(lost)
        await self._raw.add_listener(channel, notified)

    async def close(self) -> None:
        self._closing = True
        if self._raw.is_closed():
            return
        try:
            await self._raw.close(timeout=2)
        except Exception:
            self._raw.terminate()


class AsyncpgStream:
    """A portal read in batches, in the caller's transaction; other
    statements may run beside it. Closing it closes the portal through
    asyncpg's Cursor internals (``_portal_name``, ``_close_portal``: the
    Cursor has no public close), else it would stay open, read to its end or
    not, until the transaction ends."""

    __slots__ = ("_batch", "_cursor", "_timeout")

    def __init__(self, cursor: Any, batch_size: int, timeout: float | None) -> None:
        self._cursor = cursor
        self._batch = batch_size
        self._timeout = timeout

    async def fetch(self) -> list[Row]:
        return _result(await self._cursor.fetch(self._batch, timeout=self._timeout), 0).rows

    async def close(self, *, drain: bool) -> bool:
        # (An open portal keeps the tables it reads "in use": DROP TABLE,
        # say, fails in the rest of the transaction.)
        cursor = self._cursor
        if cursor._portal_name and not self._closed_connection():
            await cursor._close_portal(self._timeout)
        return True

    def _closed_connection(self) -> bool:
        return bool(self._cursor._connection.is_closed())


def _close_unwanted(opening: asyncio.Future[AsyncpgConnection]) -> None:
    """Close a connection that finished opening after its caller gave up."""
    if opening.cancelled() or opening.exception() is not None:
        return  # (reading the exception is what keeps it from being reported)
    _closing.add(task := asyncio.ensure_future(opening.result().close()))
    task.add_done_callback(_closing.discard)


# Closes of unwanted connections still running (asyncio keeps weak references only).
_closing: set[asyncio.Future[None]] = set()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    kinds = StatementKinds()
    # Settings and TLS are checked (and certificate files read) here, once:
    # a bad one is a ValidationError before anything is sent.
    settings = server_settings(options)
    tls = tls_.configure(url, options)
    hosts = hosts_of(url, options)
    arguments: dict[str, Any] = {
        "user": url.username or "postgres",
        "database": url.database or None,
        "timeout": options.connect_timeout,
        "server_settings": settings,
        **_tls_arguments(tls),
    }
    if url.password is not None:
        arguments["password"] = url.password

    async def connect() -> AsyncpgConnection:
        # asyncpg's connect, cancelled half-way, leaves a future whose error
        # nobody reads ("Future exception was never retrieved", once per
        # cancelled checkout in a cancellation storm): let it finish (it is
        # bounded by connect_timeout) and close what it opened for nobody.
        opening = asyncio.ensure_future(choose() if choice.needed else open_first())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_unwanted)
            raise

    async def open_raw(server: HostPort) -> asyncpg.Connection:
        host, port = server
        try:
            raw: asyncpg.Connection = await asyncpg.connect(
                host=host, port=port or 5432, **arguments
            )
        except Exception as exc:
            # asyncpg says only in words that the server answered "no TLS here".
            refused = isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc)
            address = host if host.startswith("/") else describe_host(host, port or 5432)
            error = tls_.failure(exc, address=address, tls=tls, offers_tls=not refused)
            if error is not None:
                raise error from exc
            raise
        try:
            # (asyncpg keeps its transport private; the socket is the standard one.)
            tune_socket(raw._transport, options)  # type: ignore[attr-defined]
        except BaseException:
            raw.terminate()
            raise
        return raw

    def wrap(raw: asyncpg.Connection, server: HostPort, session: str) -> AsyncpgConnection:
        origin = choice.origin(server)
        return AsyncpgConnection(raw, options.command_timeout, session, kinds, origin)

    async def open_first() -> AsyncpgConnection:
        server = hosts.servers[0]
        raw = await open_raw(server)
        try:
            session = await raw.fetchval(postgresql.SESSION_SQL, timeout=options.connect_timeout)
        except BaseException:
            raw.terminate()
            raise
        return wrap(raw, server, session)

    async def ask(raw: asyncpg.Connection) -> Any:
        row = await raw.fetchrow(postgresql.ROLE_SQL, timeout=options.connect_timeout)
        assert row is not None  # (one row, always)
        return row

    probe = Probe(open=open_raw, ask=ask, role=_role, drop=asyncpg.Connection.terminate)
    choice = HostChoice(url, hosts, probe, follower="standby")

    async def choose() -> AsyncpgConnection:
        raw, server, row = await choice.choose()
        return wrap(raw, server, row["session"])

    def translate_here(exc: BaseException) -> Exception:
        return choice.read_only_elsewhere(translate(exc))

    return PooledDialect(
        name="postgresql",
        adapter=postgresql.ADAPTER,
        compiler=postgresql.create_compiler,
        translate=translate_here,
        connect=connect,
        options=options,
        pool_size=options.pool_size,
        bound_to_loop=True,
        servers=choice.servers,
    )


def _role(row: Any) -> ServerRole:
    lag = row["replay_lag"]
    return ServerRole(
        standby=row["standby"],
        read_only=row["read_only"],
        system=row["system"],
        timeline=row["timeline"],
        replay_lag=None if lag is None else float(lag),
    )


def _tls_arguments(tls: tls_.TLS) -> dict[str, Any]:
    """asyncpg's arguments for ``tls``. In the modes that may fall back to
    plain, asyncpg builds the context (it falls back on the same socket):
    only the client certificate is ours to give, as libpq parameters."""
    if tls.mode not in ("allow", "prefer"):
        return {"ssl": tls.context or False}
    files = {"sslcert": tls.cert, "sslkey": tls.key, "sslpassword": tls.password}
    given = {name: value for name, value in files.items() if value}
    return {"ssl": tls.mode, **({"dsn": "postgresql://?" + urlencode(given)} if given else {})}
