"""The outbox's shared queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ValidationError
from ..sql import Fragment, Identifier, sql
from .entry import OutboxEntry, entries_from_rows
from .ticks import sources, tick_if_due

if TYPE_CHECKING:
    from ..engine import Engine
    from ..session import Queries

MAX_LIMIT = 10_000
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
    """Up to ``limit`` entries after ``after``, through ``queries`` (the
    engine, or a transaction); the outbox ticked first if due (:mod:`.ticks`)."""
    await tick_if_due(db)
    vs = Identifier("versionstamp")
    where = sql("") if after is None else sql("WHERE {vs} > {after}", vs=vs, after=after)
    pages = [
        sql(
            "SELECT {cols} FROM {t} {where} ORDER BY {vs} LIMIT {n}",
            cols=COLUMNS,
            t=source,
            where=where,
            vs=vs,
            n=limit,
        )
        for source in sources(db)
    ]
    # (Each source's page by its own index, then merged: a plan over their
    # union sorts all of them.)
    query = pages[0]
    if len(pages) > 1:
        union = Fragment.join([sql("({p})", p=page) for page in pages], " UNION ALL ")
        query = sql(
            "SELECT {cols} FROM ({u}) AS af_pages ORDER BY {vs} LIMIT {n}",
            cols=COLUMNS,
            u=union,
            vs=vs,
            n=limit,
        )
    decode = db.codec.decoder("timestamp")
    return entries_from_rows(await queries.fetch(query), decode)


async def latest(db: Engine) -> str | None:
    """The versionstamp of the newest entry, or None when empty (the
    outbox ticked first if due)."""
    await tick_if_due(db)
    vs = Identifier("versionstamp")
    newest = Fragment.join(
        [
            sql("(SELECT MAX({vs}) FROM {t}) AS m{i}", vs=vs, t=source, i=Fragment((str(i),)))
            for i, source in enumerate(sources(db))
        ]
    )
    row = await db.fetch_one(sql("SELECT {newest}", newest=newest))
    stamps = [
        str(value) for value in (row.values() if row is not None else ()) if value is not None
    ]
    return max(stamps, default=None)
