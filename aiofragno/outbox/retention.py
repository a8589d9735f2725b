"""Pruning the outbox: deleting the entries every consumer has passed,
keeping a window for readers that keep their cursor elsewhere.

Guarantees of :func:`prune`:

* **no consumer loses an entry**: nothing after the cursor of any consumer
  (a row of ``fragno_db_outbox_consumers``) is deleted; a consumer without a
  cursor yet (it delivered nothing) holds everything back;
* **the window is kept**: the newest ``keep_last`` entries and the entries
  younger than ``keep_for`` seconds stay;
* **what is deleted is a prefix**: the oldest entries, in versionstamp order,
  so that the *prune horizon* — the newest deleted entry, recorded in the
  settings table in the transaction that deletes — splits the outbox in two:
  a reader whose cursor is older than it gets
  :class:`~aiofragno.OutboxCursorPruned`, never a page with a silent gap;
* **writers are never waited for, nor made to wait**: the bounds are read
  before any transaction opens (they only ever move forward, so a bound read
  early is a safe one), and each batch is one short transaction that deletes
  at most ``batch_size`` rows by versionstamp range and moves the horizon row
  — never the version counter row, which every writer locks. On SQLite, with
  its one writer, a unit waits for at most one batch.

Under the "ticks" strategy (:mod:`.ticks`) prune ticks first, reads the
versions of both kinds of entry, deletes ticked entries with their rows in
the versions table, and keeps only the newest tick.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from .. import runtime
from ..codec import utc_now
from ..errors import IntegrityError, ValidationError
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, sql, sql_using
from .queries import check_limit
from .tables import CONSUMERS_ID, OUTBOX_ID, PRUNED_KEY, TICKS_ID, UNIT_KEYS_ID, VERSIONS_ID
from .ticks import sources, tick_if_due

if TYPE_CHECKING:
    from ..engine import Engine
    from ..queries import Queries

_NAMES = {
    "o": OUTBOX_ID,
    "vs": Identifier("versionstamp"),
    "s": Identifier(SETTINGS_TABLE),
    "k": Identifier("key"),
    "v": Identifier("value"),
    "key": PRUNED_KEY,
}
_CREATED = Identifier("created_at")
_KEYS = {"keys": UNIT_KEYS_ID, "kc": Identifier("key"), "u": Identifier("uow_id")}
_TICKED = {"versions": VERSIONS_ID, "id": Identifier("id"), "entry": Identifier("entry_id")}
_READ_HORIZON = sql_using("SELECT {v} FROM {s} WHERE {k} = {key}", **_NAMES)
MAX_KEEP_FOR = 100 * 365 * 86_400.0
KEEP_LAST = 1000
KEEP_FOR = 86_400.0
BATCH_SIZE = 1000


@dataclass(frozen=True, slots=True)
class Retention:
    """What :func:`prune` keeps: the newest ``keep_last`` entries, those
    committed in the last ``keep_for`` seconds, and everything a consumer
    has not passed. It deletes in transactions of at most ``batch_size``
    entries."""

    keep_last: int = KEEP_LAST
    keep_for: float = KEEP_FOR
    batch_size: int = BATCH_SIZE

    @classmethod
    def checked(cls, keep_last: object, keep_for: object, batch_size: object) -> Retention:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise ValidationError(f"keep_last must be an int >= 0, got {keep_last!r}")
        if isinstance(keep_for, timedelta):
            keep_for = keep_for.total_seconds()
        if (
            isinstance(keep_for, bool)
            or not isinstance(keep_for, int | float)
            or not 0 <= keep_for <= MAX_KEEP_FOR
        ):
            raise ValidationError(
                f"keep_for must be a timedelta or seconds in 0..{MAX_KEEP_FOR:.0f}, got {keep_for!r}"
            )
        return cls(keep_last, float(keep_for), check_limit(batch_size, "batch_size"))


async def prune(db: Engine, retention: Retention) -> int:
    """Delete the entries every consumer has passed, outside ``retention``'s
    window, oldest first, in batches until none is left; how many were
    deleted."""
    await _ensure_horizon_row(db)
    await tick_if_due(db)  # (what a tick would number counts toward the window)
    await _forget_old_ticks(db)
    deleted = 0
    while True:
        upto = await _next_batch_end(db, retention)
        if upto is None:
            return deleted
        count = await _delete_through(db, upto)
        deleted += count
        if count < retention.batch_size:
            return deleted


async def _forget_old_ticks(db: Engine) -> None:
    """Delete every tick but the newest (the only one a tick reads), where
    the outbox has ticks: one row per tick that numbered something would
    otherwise pile up."""
    if db.adapter.sql.outbox_ticks is not None:
        await db.execute(
            sql_using(
                "DELETE FROM {t} WHERE {id} < (SELECT MAX({id}) FROM {t})",
                t=TICKS_ID,
                id=_TICKED["id"],
            )
        )


async def horizon(queries: Queries) -> str | None:
    """The prune horizon: the versionstamp of the newest pruned entry, or
    None if nothing was ever pruned."""
    value = await queries.fetch_value(_READ_HORIZON)
    return str(value) if value else None


async def run_pruner(db: Engine, retention: Retention, every: float) -> None:
    """:func:`prune` every ``every`` seconds, until cancelled."""
    while True:
        await prune(db, retention)
        await runtime.sleep(every)


async def _ensure_horizon_row(db: Engine) -> None:
    """Create the horizon's settings row (empty: nothing pruned) once, so
    that every batch only updates it — on its own row, never the counter's."""
    if await db.fetch_value(_READ_HORIZON) is not None:
        return
    with contextlib.suppress(IntegrityError):  # (another pruner created it meanwhile)
        await db.execute(sql_using("INSERT INTO {s} ({k}, {v}) VALUES ({key}, '')", **_NAMES))


async def _bound(db: Engine, keep_last: int) -> str | None:
    """The newest entry that the consumers and the count window allow to go,
    or None when nothing may go. Both bounds only move forward (cursors
    advance, entries are appended), so one read before the batch is safe."""
    row = await db.fetch_one(
        sql_using(
            "SELECT COUNT(*) AS n, COUNT({c}) AS known, MIN({c}) AS slowest FROM {t}",
            c=Identifier("cursor"),
            t=CONSUMERS_ID,
        )
    )
    assert row is not None
    if row["n"] != row["known"]:
        return None  # a consumer that has delivered nothing yet needs every entry
    stamps = await db.fetch(
        sql_using(
            "SELECT {vs} FROM {e} ORDER BY {vs} DESC LIMIT 1 OFFSET {skip}",
            **_NAMES,
            e=_entries(db),
            skip=keep_last,
        )
    )
    if not stamps:
        return None
    newest_allowed = str(stamps[0].raw[0])
    slowest = row["slowest"]
    return newest_allowed if slowest is None else min(newest_allowed, str(slowest))


async def _next_batch_end(db: Engine, retention: Retention) -> str | None:
    """The newest entry of the next batch to delete: of the oldest
    ``batch_size`` entries within the bound, the last of those (from the
    first on) older than ``keep_for``; None when there is none."""
    bound = await _bound(db, retention.keep_last)
    if bound is None:
        return None
    cutoff = db.codec.encoder("timestamp")(utc_now() - timedelta(seconds=retention.keep_for))
    rows = await db.fetch(
        sql_using(
            "SELECT {vs}, CASE WHEN {c} < {cutoff} THEN 1 ELSE 0 END FROM {e} "
            "WHERE {vs} <= {bound} ORDER BY {vs} LIMIT {n}",
            **_NAMES,
            e=_entries(db),
            c=Identifier("created_at"),
            cutoff=cutoff,
            bound=bound,
            n=retention.batch_size,
        )
    )
    upto = None
    for stamp, old in (row.raw for row in rows):
        if not old:
            break  # (created_at only roughly follows commit order: stop at the first young one)
        upto = str(stamp)
    return upto


def _entries(db: Engine) -> Fragment:
    """Every entry's versionstamp and created_at: the outbox table, or where
    it has two sources (the counter's entries and ticked ones,
    :func:`.ticks.sources`), their union."""
    parts = sources(db)
    if len(parts) == 1:
        return parts[0]
    selects = [sql_using("SELECT {vs}, {c} FROM {p}", **_NAMES, c=_CREATED, p=p) for p in parts]
    return sql("({u}) AS af_entries", u=Fragment.join(selects, " UNION ALL "))


async def _delete_through(db: Engine, upto: str) -> int:
    """One batch, in a transaction of its own (see :func:`delete_in`)."""
    async with db.transaction(isolation="read committed") as tx:
        return await delete_in(db, tx, upto)


async def delete_in(db: Engine, tx: Queries, upto: str) -> int:
    """A batch's statements, in transaction ``tx``: move the horizon to
    ``upto`` and delete the entries up to it; how many were deleted. The
    horizon row's lock orders concurrent pruners; one that finds the
    horizon already past ``upto`` deletes nothing."""
    moved = await tx.execute(
        sql_using(
            "UPDATE {s} SET {v} = {upto} WHERE {k} = {key} AND {v} < {upto}",
            **_NAMES,
            upto=upto,
        )
    )
    if moved.rows_affected != 1:
        return 0
    # A keyed unit's key lives as long as its entry (and no longer).
    await tx.execute(
        sql_using(
            "DELETE FROM {keys} WHERE {kc} IN (SELECT {u} FROM {o} WHERE {vs} <= {upto})",
            **_NAMES,
            **_KEYS,
            upto=upto,
        )
    )
    deleted = await tx.execute(
        sql_using("DELETE FROM {o} WHERE {vs} <= {upto}", **_NAMES, upto=upto)
    )
    if db.adapter.sql.outbox_ticks is None:
        return deleted.rows_affected
    # Ticked entries: their keys and versions, then the entries those named.
    await tx.execute(
        sql_using(
            "DELETE FROM {keys} WHERE {kc} IN (SELECT o.{u} FROM {o} o "
            "JOIN {versions} v ON v.{entry} = o.{id} WHERE v.{vs} <= {upto})",
            **_NAMES,
            **_KEYS,
            **_TICKED,
            upto=upto,
        )
    )
    ticked = await tx.execute(
        sql_using(
            "DELETE FROM {o} WHERE {id} IN (SELECT {entry} FROM {versions} WHERE {vs} <= {upto})",
            **_NAMES,
            **_TICKED,
            upto=upto,
        )
    )
    await tx.execute(
        sql_using("DELETE FROM {versions} WHERE {vs} <= {upto}", **_NAMES, **_TICKED, upto=upto)
    )
    return deleted.rows_affected + ticked.rows_affected
