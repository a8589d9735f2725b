"""The outbox's shared queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import OutboxCursorPruned, ValidationError
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, sql, sql_using
from ..transaction import outside_transactions
from .entry import OutboxEntry, entries_from_rows
from .tables import OUTBOX_ID, PRUNED_KEY, VERSION_KEY
from .versionstamp import MAX_INDEX, versionstamp

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
    """Up to ``limit`` entries after ``after``, none past :func:`read_bound`;
    :class:`OutboxCursorPruned` if ``after`` is older than the prune horizon.

    The horizon is read after the page: it only grows, and prune moves it in
    the transaction that deletes, so a horizon at or below ``after`` then was
    at or below it while the page was read — nothing the page should hold
    had been deleted. (One statement joining the two made MariaDB 10.11
    crash freeing its temporary table.) Outside any transaction the caller
    has open: held there, the read bound's lock would stop every outbox
    writer until the caller's transaction ends, and an older snapshot could
    miss entries up to the bound."""
    with outside_transactions():
        up_to = await read_bound(db)
        if up_to == "":
            return []
        rows = await db.fetch(_page(after, up_to, limit))
        if after is not None:
            pruned = await db.fetch_value(_pruned_horizon())
            if pruned is not None and after < str(pruned):
                raise cursor_pruned(after, str(pruned))
    return entries_from_rows(rows, db.codec.decoder("timestamp"))


def _page(after: str | None, up_to: str | None, limit: int) -> Fragment:
    return sql(
        "SELECT {cols} FROM {t} {where} ORDER BY {vs} LIMIT {n}",
        cols=COLUMNS,
        t=OUTBOX_ID,
        where=_between(after, up_to),
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
    or None when empty; outside the caller's transaction, as
    :func:`read_entries`."""
    with outside_transactions():
        up_to = await read_bound(db)
        if up_to == "":
            return None
        query = sql(
            "SELECT MAX({vs}) FROM {t} {where}", vs=_VS, t=OUTBOX_ID, where=_between(None, up_to)
        )
        value = await db.fetch_value(query)
    return None if value is None else str(value)


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
