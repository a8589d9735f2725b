"""The outbox's shared queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ValidationError
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, sql, sql_using
from .entry import OutboxEntry, entries_from_rows
from .tables import OUTBOX_ID, VERSION_KEY
from .versionstamp import MAX_INDEX, versionstamp

if TYPE_CHECKING:
    from ..engine import Engine
    from ..queries import Queries

MAX_LIMIT = 10_000
_VS = Identifier("versionstamp")
COLUMNS = Fragment.join(
    [
        sql("{c}", c=Identifier(c))
        for c in ("versionstamp", "uow_id", "payload", "ref_map", "created_at")
    ]
)


def check_limit(limit: object, name: str = "limit") -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{name} must be an int in 1..{MAX_LIMIT}, got {limit!r}")
    return limit


async def read_entries(
    db: Engine, queries: Queries, after: str | None, limit: int
) -> list[OutboxEntry]:
    """Up to ``limit`` entries after ``after``, none past :func:`horizon`,
    through ``queries``: the engine (in a transaction, the horizon's lock,
    and with it the next outbox writer, would wait for its end)."""
    up_to = await horizon(db, queries)
    if up_to == "":
        return []
    query = sql(
        "SELECT {cols} FROM {t} {where} ORDER BY {vs} LIMIT {n}",
        cols=COLUMNS,
        t=OUTBOX_ID,
        where=_between(after, up_to),
        vs=_VS,
        n=limit,
    )
    decode = db.codec.decoder("timestamp")
    return entries_from_rows(await queries.fetch(query), decode)


async def latest(db: Engine, queries: Queries) -> str | None:
    """The versionstamp of the newest entry (none past :func:`horizon`), or
    None when empty."""
    up_to = await horizon(db, queries)
    if up_to == "":
        return None
    query = sql("SELECT MAX({vs}) FROM {t} {where}", vs=_VS, t=OUTBOX_ID, where=_between(None, up_to))
    value = await queries.fetch_value(query)
    return None if value is None else str(value)


async def horizon(db: Engine, queries: Queries) -> str | None:
    """The newest versionstamp a reader may read up to, where the dialect
    needs a bound (:attr:`SqlSnippets.outbox_read_horizon
    <aiofragno.driver.SqlSnippets.outbox_read_horizon>`): every version up
    to it was reserved by a transaction that has finished, so no entry up to
    it can still become visible later. "" if no version was ever committed;
    None where no bound is needed. Through ``queries`` outside a
    transaction (the engine), so that its lock ends with the statement."""
    statement = db.adapter.sql.outbox_read_horizon
    if statement is None:
        return None
    value = await queries.fetch_value(
        sql_using(
            statement,
            t=Identifier(SETTINGS_TABLE),
            k=Identifier("key"),
            v=Identifier("value"),
            key=VERSION_KEY,
        )
    )
    return "" if value is None else versionstamp(int(str(value)), MAX_INDEX)


def _between(after: str | None, up_to: str | None) -> Fragment:
    """The WHERE clause for versionstamps after ``after`` and up to ``up_to``
    (either None: unbounded on that side)."""
    bounds = [
        sql(f"{{vs}} {op} {{stamp}}", vs=_VS, stamp=stamp)
        for op, stamp in ((">", after), ("<=", up_to))
        if stamp is not None
    ]
    return sql("WHERE ") + Fragment.join(bounds, " AND ") if bounds else sql("")
