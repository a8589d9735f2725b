"""The settings table, ``fragno_db_settings``: aiofragno's key-value record in
the database (schema versions, table ownership, the outbox counter and prune
horizon). Written only under the migration lock, except for those two outbox
rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .sql import Identifier, sql

if TYPE_CHECKING:
    from .session import Session

SETTINGS_TABLE = "fragno_db_settings"


def settings_names() -> dict[str, Identifier]:
    return {"t": Identifier(SETTINGS_TABLE), "k": Identifier("key"), "v": Identifier("value")}


async def read_setting(session: Session, compile: Any, key: str) -> str | None:
    result = await session.execute(
        compile(sql("SELECT {v} AS value FROM {t} WHERE {k} = {key}", **settings_names(), key=key))
    )
    return result.rows[0]["value"] if result.rows else None


async def read_settings_like(session: Session, compile: Any, pattern: str) -> list[tuple[str, str]]:
    """(key, value) of every key matching the LIKE ``pattern``."""
    query = sql(
        "SELECT {k} AS k, {v} AS v FROM {t} WHERE {k} LIKE {pattern}",
        **settings_names(),
        pattern=pattern,
    )
    return [(row["k"], row["v"]) for row in (await session.execute(compile(query))).rows]


async def write_setting(session: Session, compile: Any, key: str, value: str) -> None:
    """Insert or update ``key``; callers hold the migration lock, so a read
    followed by a write cannot race."""
    names = settings_names()
    if await read_setting(session, compile, key) is None:
        statement = sql(
            "INSERT INTO {t} ({k}, {v}) VALUES ({key}, {value})", **names, key=key, value=value
        )
    else:
        statement = sql(
            "UPDATE {t} SET {v} = {value} WHERE {k} = {key}", **names, key=key, value=value
        )
    await session.execute(compile(statement))


async def delete_setting(session: Session, compile: Any, key: str) -> None:
    """Remove ``key`` (callers hold the migration lock)."""
    names = settings_names()
    statement = sql("DELETE FROM {t} WHERE {k} = {key}", t=names["t"], k=names["k"], key=key)
    await session.execute(compile(statement))
