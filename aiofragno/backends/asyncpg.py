"""PostgreSQL through asyncpg (asyncio)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
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
from ..libpq import server_settings
from ..pool import PooledDialect
from ..url import DatabaseURL, Options

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


def _rows_affected(status: bytes, returned: int) -> int:
    # b"UPDATE 3", b"INSERT 0 1", b"SELECT 2"; commands without a count: rows returned.
    tail = status.rpartition(b" ")[2]
    return int(tail) if tail.isdigit() else returned


class AsyncpgConnection:
    __slots__ = ("_raw", "_timeout", "server_session")

    def __init__(self, raw: asyncpg.Connection, timeout: float | None, server_session: str) -> None:
        self._raw = raw
        self._timeout = timeout
        self.server_session = server_session

    @property
    def is_closed(self) -> bool:
        return self._raw.is_closed()

    @property
    def in_transaction(self) -> bool:
        # (From the transaction status of the server's last ReadyForQuery; a
        # terminated connection has no protocol left to ask.)
        raw = self._raw
        return not raw.is_closed() and raw.is_in_transaction()

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        # asyncpg's public API returns either the rows (fetch) or the status
        # (execute); _execute returns both in one round trip, which we need for
        # RETURNING statements whose affected-row count matters.
        records, status, _ = await self._raw._execute(  # type: ignore[attr-defined]
            query.sql, query.parameters, 0, self._timeout, return_status=True
        )
        if not records:
            return QueryResult([], _rows_affected(status, 0))
        index = column_index(tuple(records[0].keys()))
        return QueryResult([Row(index, r) for r in records], _rows_affected(status, len(records)))

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        # The extended protocol carries one statement per Parse, and asyncpg
        # pipelines only executemany: one round trip per statement.
        return await execute_in_turn(self, queries, stop)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        await self._raw.execute(postgresql.begin_sql(isolation))

    async def commit(self) -> None:
        await self._raw.execute("COMMIT")

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await commit_after(self, queries, stop)

    async def rollback(self) -> None:
        await self._raw.execute("ROLLBACK")

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

    async def close(self) -> None:
        if self._raw.is_closed():
            return
        try:
            await self._raw.close(timeout=2)
        except Exception:
            self._raw.terminate()


def _close_unwanted(opening: asyncio.Future[AsyncpgConnection]) -> None:
    """Close a connection that finished opening after its caller gave up."""
    if opening.cancelled() or opening.exception() is not None:
        return  # (reading the exception is what keeps it from being reported)
    _closing.add(task := asyncio.ensure_future(opening.result().close()))
    task.add_done_callback(_closing.discard)


# Closes of unwanted connections still running (asyncio keeps weak references only).
_closing: set[asyncio.Future[None]] = set()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    # Settings and TLS are checked (and certificate files read) here, once:
    # a bad one is a ValidationError before anything is sent.
    settings = server_settings(options)
    tls = tls_.configure(url, options)
    host, port = url.host or "localhost", url.port or 5432
    address = url.unix_socket or f"{host}:{port}"
    arguments: dict[str, Any] = {
        "host": host,
        "port": port,
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
        opening = asyncio.ensure_future(open_connection())
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_unwanted)
            raise

    async def open_connection() -> AsyncpgConnection:
        try:
            raw = await asyncpg.connect(**arguments)
        except Exception as exc:
            # asyncpg says only in words that the server answered "no TLS here".
            refused = isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc)
            error = tls_.failure(exc, address=address, tls=tls, offers_tls=not refused)
            if error is not None:
                raise error from exc
            raise
        try:
            session = await raw.fetchval(postgresql.SESSION_SQL, timeout=options.connect_timeout)
        except BaseException:
            raw.terminate()
            raise
        return AsyncpgConnection(raw, options.command_timeout, session)

    return PooledDialect(
        name="postgresql",
        adapter=postgresql.ADAPTER,
        compiler=postgresql.create_compiler,
        translate=translate,
        connect=connect,
        options=options,
        pool_size=options.pool_size,
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
