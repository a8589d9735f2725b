"""MySQL and MariaDB through asyncmy (asyncio).

Connections use the FOUND_ROWS client flag, so an UPDATE reports the rows it
*matched* even when a value did not change — version checks rely on that.
Statements outside a transaction autocommit; ``begin`` opens an explicit one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncmy
import asyncmy.errors
from asyncmy.constants import CLIENT, FIELD_TYPE

from ..dialects import mysql
from ..driver import CompiledQuery, IsolationLevel, QueryResult, Row, column_index
from ..errors import (
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    ErrorTable,
    IntegrityError,
    ProgrammingError,
    QueryCanceled,
)
from ..pool import PooledDialect
from ..url import DatabaseURL, Options

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
_DATETIME_TYPES = frozenset({FIELD_TYPE.DATETIME, FIELD_TYPE.TIMESTAMP})


def _error_code(exc: BaseException) -> str | None:
    if isinstance(exc, asyncmy.errors.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return str(exc.args[0])
    return None


def _utc_rows(description: Any, tuples: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # The session runs in UTC, so DATETIME values are UTC: make them aware.
    positions = [i for i, column in enumerate(description) if column[1] in _DATETIME_TYPES]
    if not positions:
        return tuples
    fixed = []
    for values in tuples:
        row = list(values)
        for i in positions:
            if isinstance(row[i], datetime):
                row[i] = row[i].replace(tzinfo=UTC)
        fixed.append(tuple(row))
    return fixed


Killer = Callable[[int], Awaitable[None]]


class AsyncmyConnection:
    __slots__ = ("_kill", "_raw")

    def __init__(self, raw: Any, kill: Killer) -> None:
        self._raw = raw
        self._kill = kill

    @property
    def is_closed(self) -> bool:
        # connected stays True after the peer closed the socket; the stream knows.
        return not self._raw.connected or bool(self._raw._stream_broken)

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        async with self._raw.cursor() as cursor:
            await cursor.execute(query.sql, query.parameters)
            description = cursor.description
            if description is None:
                return QueryResult([], cursor.rowcount, cursor.lastrowid or None)
            tuples = _utc_rows(description, await cursor.fetchall())
        index = column_index([column[0] for column in description])
        return QueryResult([Row(index, values) for values in tuples], len(tuples))

    async def begin(self, isolation: IsolationLevel | None) -> None:
        if isolation is not None:
            # Applies to the next transaction only.
            await self._raw.query(mysql.isolation_statement(isolation))
        await self._raw.begin()

    async def commit(self) -> None:
        await self._raw.commit()

    async def rollback(self) -> None:
        await self._raw.rollback()

    async def ping(self) -> None:
        await self._raw.ping(reconnect=False)

    async def reset(self) -> bool:
        # An interrupted read leaves the protocol stream mid-packet, so the
        # connection is discarded; the server would go on running the statement
        # (holding its locks) unless told to stop from another connection.
        with contextlib.suppress(Exception, asyncio.TimeoutError):
            async with asyncio.timeout(_KILL_TIMEOUT):
                await self._kill(self._raw.thread_id())
        return False

    async def close(self) -> None:
        if self._raw.connected:
            self._raw.close()


def create_dialect(url: DatabaseURL, options: Options) -> PooledDialect:
    async def kill(thread_id: int) -> None:
        async with asyncio.timeout(options.connect_timeout):
            killer = await _open(url, options)
        try:
            async with killer.cursor() as cursor:
                await cursor.execute("KILL QUERY %s", (thread_id,))
        finally:
            killer.close()

    async def connect() -> AsyncmyConnection:
        # asyncmy's connect_timeout covers the TCP connect only, not the handshake.
        async with asyncio.timeout(options.connect_timeout):
            raw = await _open(url, options)
        return AsyncmyConnection(raw, kill)

    return PooledDialect(
        name="mysql",
        adapter=mysql.ADAPTER,
        compiler=mysql.create_compiler,
        translate=lambda exc: ERRORS.translate(exc, _error_code(exc)),
        connect=connect,
        options=options,
        pool_size=options.pool_size,
    )


async def _open(url: DatabaseURL, options: Options) -> Any:
    return await asyncmy.connect(
        host=url.host or "localhost",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        database=url.database or None,
        charset="utf8mb4",
        autocommit=True,
        client_flag=CLIENT.FOUND_ROWS,
        connect_timeout=options.connect_timeout,
        read_timeout=options.command_timeout,
        init_command=mysql.SESSION_SQL,
    )
