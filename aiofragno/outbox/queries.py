"""The outbox's shared queries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import OutboxCursorPruned, ValidationError
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, sql
from .entry import OutboxEntry, entries_from_rows
from .tables import OUTBOX_ID, PRUNED_KEY

if TYPE_CHECKING:
    from ..engine import Engine
    from ..session import Queries

MAX_LIMIT = 10_000
_NAMES = ("versionstamp", "uow_id", "payload", "ref_map", "created_at")
COLUMNS = Fragment.join([sql("{c}", c=Identifier(c)) for c in _NAMES])
_OUTER_COLUMNS = Fragment.join([sql("af_o.{c}", c=Identifier(c)) for c in _NAMES])
_SETTINGS = {"s": Identifier(SETTINGS_TABLE), "k": Identifier("key"), "v": Identifier("value")}


def check_limit(limit: object, name: str = "limit") -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{name} must be an int in 1..{MAX_LIMIT}, got {limit!r}")
    return limit


async def read_entries(
    db: Engine, queries: Queries, after: str | None, limit: int
) -> list[OutboxEntry]:
    """Up to ``limit`` entries after ``after``, through ``queries`` (the
    engine, or a transaction). :class:`OutboxCursorPruned` if ``after`` is
    older than the prune horizon: the horizon is read by the same statement
    as the page, so both come from one snapshot — a page that misses pruned
    entries always sees the horizon that explains it."""
    vs = Identifier("versionstamp")
    where = sql("") if after is None else sql("WHERE {vs} > {after}", vs=vs, after=after)
    query = sql(
        "SELECT af_h.pruned, {outer} FROM (SELECT MAX({v}) AS pruned FROM {s} WHERE {k} = {key}) "
        "af_h LEFT JOIN (SELECT {cols} FROM {t} {where} ORDER BY {vs} LIMIT {n}) af_o ON 1 = 1 "
        "ORDER BY af_o.{vs}",
        outer=_OUTER_COLUMNS,
        cols=COLUMNS,
        t=OUTBOX_ID,
        where=where,
        vs=vs,
        n=limit,
        **_SETTINGS,
        key=PRUNED_KEY,
    )
    rows = await queries.fetch(query)
    horizon = rows[0].raw[0] if rows else None
    if after is not None and horizon is not None and after < horizon:
        raise cursor_pruned(after, str(horizon))
    if rows and rows[0].raw[1] is None:
        return []  # (the one row of an empty page: the horizon's)
    return entries_from_rows(rows, db.codec.decoder("timestamp"), skip=1)


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


async def latest(queries: Queries) -> str | None:
    """The versionstamp of the newest entry, or None when empty."""
    vs = Identifier("versionstamp")
    value = await queries.fetch_value(sql("SELECT MAX({vs}) FROM {t}", vs=vs, t=OUTBOX_ID))
    return None if value is None else str(value)
