"""The outbox's shared queries."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ..errors import OutboxCursorPruned, ValidationError
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, sql, sql_using
from ..transaction import outside_transactions
from .entry import OutboxEntry, entries_from_rows
from .tables import PRUNED_KEY, VERSION_KEY
from .ticks import sources, tick_if_due
from .versionstamp import MAX_INDEX, version_of, versionstamp

if TYPE_CHECKING:
    from ..engine import Engine

MAX_LIMIT = 10_000
_VS = Identifier("versionstamp")
_NAMES = ("versionstamp", "uow_id", "payload", "ref_map", "created_at")
COLUMNS = Fragment.join([sql("{c}", c=Identifier(c)) for c in _NAMES])
_SETTINGS = {"s": Identifier(SETTINGS_TABLE), "k": Identifier("key"), "v": Identifier("value")}
# (outbox_read_horizon names the settings table {t}.)
_SETTINGS_FOR_BOUND = {"t": _SETTINGS["s"], "k": _SETTINGS["k"], "v": _SETTINGS["v"]}


def check_limit(limit: object, name: str = "limit") -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{name} must be an int in 1..{MAX_LIMIT}, got {limit!r}")
    return limit


async def read_entries(db: Engine, after: str | None, limit: int) -> list[OutboxEntry]:
    """Up to ``limit`` entries after ``after``, none past :func:`read_bound`,
    the outbox ticked first if due (:mod:`.ticks`);
    :class:`OutboxCursorPruned` if ``after`` is older than the prune horizon.

    The horizon is read after the page: it only grows, and prune moves it in
    the transaction that deletes, so a horizon at or below ``after`` then was
    at or below it while the page was read — nothing the page should hold
    had been deleted. (One statement joining the two made MariaDB 10.11
    crash freeing its temporary table.)"""
    await tick_if_due(db)
    with _bounded_reading(db):
        up_to = await read_bound(db)
        if up_to == "":
            return []
        rows = await db.fetch(_page(db, after, up_to, limit))
        if after is not None:
            pruned = await db.fetch_value(_pruned_horizon())
            if pruned is not None and after < str(pruned):
                raise cursor_pruned(after, str(pruned))
    return entries_from_rows(rows, db.codec.decoder("timestamp"))


def _bounded_reading(db: Engine) -> contextlib.AbstractContextManager[None]:
    """Where reads are bounded (:func:`read_bound`), they run outside any
    transaction the caller has open: held there, the bound's lock would
    stop every outbox writer until the caller's transaction ends, and an
    older snapshot could miss entries up to the bound."""
    if db.adapter.sql.outbox_read_horizon is None:
        return contextlib.nullcontext()
    return outside_transactions()


def _page(db: Engine, after: str | None, up_to: str | None, limit: int) -> Fragment:
    """The page's query: where the outbox has two sources (the counter's
    entries and ticked ones), each source's page by its own index, then
    merged — a plan over their union would sort all of them."""
    pages = [
        sql(
            "SELECT {cols} FROM {t} {where} ORDER BY {vs} LIMIT {n}",
            cols=COLUMNS,
            t=source,
            where=_between(after, up_to),
            vs=_VS,
            n=limit,
        )
        for source in sources(db)
    ]
    if len(pages) == 1:
        return pages[0]
    union = Fragment.join([sql("({p})", p=page) for page in pages], " UNION ALL ")
    return sql(
        "SELECT {cols} FROM ({u}) AS af_pages ORDER BY {vs} LIMIT {n}",
        cols=COLUMNS,
        u=union,
        vs=_VS,
        n=limit,
    )


def _pruned_horizon() -> Fragment:
    """The versionstamp of the newest entry prune deleted (NULL: none)."""
    return sql("SELECT MAX({v}) FROM {s} WHERE {k} = {key}", **_SETTINGS, key=PRUNED_KEY)


def cursor_pruned(cursor: str, horizon: str) -> OutboxCursorPruned:
    return OutboxCursorPruned(
        f"outbox cursor {cursor} is older than the prune horizon {horizon}: the entries "
        f"up to {horizon} were deleted by db.outbox.prune(), so reading on from {cursor} "
        "would skip some. Rebuild what this reader derives from the outbox (or accept the "
        "gap and read on from the horizon); register readers as consumers, or widen "
        "prune's window, so that prune keeps what they still need",
        cursor=cursor,
        horizon=horizon,
    )


async def latest(db: Engine) -> str | None:
    """The versionstamp of the newest entry (none past :func:`read_bound`),
    or None when empty; the outbox ticked first if due."""
    await tick_if_due(db)
    with _bounded_reading(db):
        up_to = await read_bound(db)
        if up_to == "":
            return None
        newest = Fragment.join(
            [
                sql(
                    "(SELECT MAX({vs}) FROM {t} {where}) AS m{i}",
                    vs=_VS,
                    t=source,
                    where=_between(None, up_to),
                    i=Fragment((str(i),)),
                )
                for i, source in enumerate(sources(db))
            ]
        )
        row = await db.fetch_one(sql("SELECT {newest}", newest=newest))
    stamps = [str(value) for value in (row.raw if row is not None else ()) if value is not None]
    return max(stamps, default=None)


async def holds(db: Engine, stamp: str) -> bool:
    """Whether an entry with versionstamp ``stamp`` is in the outbox (in
    any of its sources)."""
    found = Fragment.join(
        [
            sql("SELECT 1 FROM {t} WHERE {vs} = {stamp}", t=source, vs=_VS, stamp=stamp)
            for source in sources(db)
        ],
        " UNION ALL ",
    )
    return bool(await db.fetch(found))


async def passed_by_promotion(db: Engine, stamp: str) -> bool:
    """Whether reading on after ``stamp``, an entry the outbox does not hold,
    skips nothing it holds, because a promotion lost it: ``stamp`` is at or
    below the version floor the server numbers above now
    (:attr:`SqlSnippets.outbox_version_floor
    <aiofragno.driver.SqlSnippets.outbox_version_floor>`), and the first
    entry after it, if any, is above that floor — numbered since. False
    where versions have no floor."""
    floor_sql = db.adapter.sql.outbox_version_floor
    if floor_sql is None:
        return False
    floor = int(await db.fetch_value(db.raw(f"SELECT {floor_sql}"), int))
    if version_of(stamp) > floor:
        return False
    following = await read_entries(db, stamp, 1)
    return not following or version_of(following[0].versionstamp) > floor


async def read_bound(db: Engine) -> str | None:
    """The newest versionstamp a reader may read up to, where the dialect
    needs a bound (:attr:`SqlSnippets.outbox_read_horizon
    <aiofragno.driver.SqlSnippets.outbox_read_horizon>`): every version up
    to it was reserved by a transaction that has finished, so no entry up to
    it can still become visible later. "" if no version was ever committed;
    None where no bound is needed. Call it outside a transaction, so that
    its lock ends with the statement."""
    statement = db.adapter.sql.outbox_read_horizon
    if statement is None:
        return None
    value = await db.fetch_value(sql_using(statement, **_SETTINGS_FOR_BOUND, key=VERSION_KEY))
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
