"""SQLAlchemy 2 for the benchmarks: an asyncio engine on the same drivers
(asyncpg, asyncmy, aiosqlite) and the same database as a Target, and
declarative models over tables aiofragno migrated."""

from __future__ import annotations

import contextlib
from typing import Any

from . import _common as common

DRIVERS = {"postgresql": "asyncpg", "mysql": "asyncmy", "sqlite": "aiosqlite"}
SQLITE_PRAGMAS = (
    f"PRAGMA busy_timeout = {int(common.SQLITE_BUSY_TIMEOUT * 1000)}",
    "PRAGMA foreign_keys = ON",
    "PRAGMA journal_mode = WAL",
)


def url(target: common.Target) -> Any:
    """``target``'s database as a SQLAlchemy URL with its async driver."""
    from sqlalchemy.engine import URL

    parsed = target.parsed
    drivername = f"{target.dialect}+{DRIVERS[target.dialect]}"
    if target.dialect == "sqlite":
        return URL.create(drivername, database=parsed.database)
    return URL.create(
        drivername,
        username=parsed.username,
        password=parsed.password,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query={"charset": "utf8mb4"} if target.dialect == "mysql" else {},
    )


async def engine(target: common.Target, pool_size: int = common.POOL_SIZE) -> Any:
    """An AsyncEngine on ``target``: a pool of ``pool_size`` connections,
    opened now (as the other variants' are); on SQLite with aiofragno's
    pragmas."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import AsyncAdaptedQueuePool

    created = create_async_engine(
        url(target), poolclass=AsyncAdaptedQueuePool, pool_size=pool_size, max_overflow=0
    )
    if target.dialect == "sqlite":

        @event.listens_for(created.sync_engine, "connect")
        def pragmas(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in SQLITE_PRAGMAS:
                cursor.execute(pragma)
            cursor.close()

    async with contextlib.AsyncExitStack() as stack:
        for _ in range(pool_size):
            await stack.enter_async_context(created.connect())
    return created


def schema_of(parts: tuple[str, ...]) -> str | None:
    """The SQL schema of a physical table's Identifier parts (None: the default)."""
    return parts[0] if len(parts) > 1 else None


def internal_id() -> Any:
    """The ``_id`` column's type: BIGINT, INTEGER on SQLite (its rowid alias)."""
    from sqlalchemy import BigInteger, Integer

    return BigInteger().with_variant(Integer, "sqlite")
