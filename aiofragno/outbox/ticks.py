"""The outbox's "ticks" strategy (PostgreSQL), after PgQ's ticks.

A writer inserts its entry without a version, with its transaction's id
(``xid``), and shares no row with other writers: commits group, and
serializable units do not conflict over the outbox. Versions are given
afterwards by a *tick*: in one transaction, under an advisory lock, it
records the snapshot it reads in and gives the entries committed since the
previous tick's snapshot the counter's next versions, in entry id order
(:attr:`OutboxTicksSql.tick <aiofragno.driver.OutboxTicksSql.tick>`).

What readers get is what the counter gives, once ticked:

- versions are consecutive: each tick takes the next ones from the
  counter row, and commits them with its snapshot, or neither — but for
  one jump at a promotion, the first tick on the new timeline starting
  above the version floor (see :mod:`.writer`);
- no entry appears behind a version a reader has passed: a tick only
  versions entries that committed before its snapshot, every later tick
  versions above it, and ticks run one at a time;
- one entry per committed unit, none from a rollback (an entry only
  becomes visible, hence versioned, if its transaction committed);
- commit order for conflicting units: the second of two units writing
  one row inserts its entry after the first committed (the entry comes
  last in its transaction), so the first is in the same tick or an
  earlier one, and has the lower entry id;
- a long transaction does not hold back the entries that committed
  around it: it is in the snapshot's in-progress list, and only its own
  entry waits for the tick after it commits.

No one process ticks: every reader ticks before it reads when its engine
has not ticked for :data:`TICK_INTERVAL` (taking the lock if it is free,
else reading what the ticker that holds it gives). A reader whose engine
has seen units commit that no finished tick covers yet (its own, or others'
announced by a notification: :class:`TickState`), and
:meth:`OutboxReader.find <aiofragno.outbox.OutboxReader.find>`, wait for the
lock instead, so that they see the units that have committed — also when
another task of the same engine is ticking right now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import runtime
from ..sql import Fragment, Identifier, sql
from ..transaction import current_transaction, outside_transactions
from .tables import OUTBOX_ID, VERSION_KEY, VERSIONS_ID

if TYPE_CHECKING:
    from ..engine import Engine

# A reader ticks first when its engine's last tick is older than this (s).
TICK_INTERVAL = 0.01


async def tick(db: Engine, *, wait: bool = False) -> int | None:
    """Give versions to the entries committed since the last tick, in a
    transaction of its own; how many it versioned. None when another
    ticker held the lock and ``wait`` is false (that ticker versions what
    this one would have), or when called inside a transaction the caller
    has open on ``db``. 0 where the dialect has no ticks."""
    ticks = db.adapter.sql.outbox_ticks
    if ticks is None:
        return 0
    if current_transaction(db) is not None:
        # A read in the caller's transaction reads what has been ticked:
        # ticking takes a connection of its own, which could wait for the
        # caller's (a pool of one) and its transaction.
        return None
    state = db.outbox_ticks
    began_after = state.seen
    with outside_transactions():
        async with db.transaction() as tx:
            taken = await tx.fetch_value(db.raw(ticks.lock if wait else ticks.try_lock))
            if not taken:
                return None
            versioned = await tx.fetch_value(sql(ticks.tick, key=VERSION_KEY), int)
    state.finished(began_after)
    return versioned


async def tick_if_due(db: Engine) -> None:
    """:func:`tick` if this engine has seen units commit that no finished
    tick covers (waiting for the lock: a read sees the units written through
    the same Database before it), or has not ticked in the last
    :data:`TICK_INTERVAL`."""
    if db.adapter.sql.outbox_ticks is None:
        return
    state = db.outbox_ticks
    if state.behind:
        await tick(db, wait=True)
    elif runtime.monotonic() - state.ticked_at >= TICK_INTERVAL:
        await tick(db)


def _sources() -> tuple[Fragment, Fragment]:
    columns = ("uow_id", "payload", "ref_map", "created_at")
    own = Fragment.join([sql("{c}", c=Identifier(c)) for c in ("versionstamp", *columns)])
    joined = Fragment.join([sql("o.{c}", c=Identifier(c)) for c in columns])
    vs = Identifier("versionstamp")
    counted = sql(
        "(SELECT {own} FROM {t} WHERE {vs} IS NOT NULL) AS af_counted", own=own, t=OUTBOX_ID, vs=vs
    )
    ticked = sql(
        "(SELECT v.{vs}, {joined} FROM {v} v JOIN {t} o ON o.{id} = v.{entry}) AS af_ticked",
        vs=vs,
        joined=joined,
        v=VERSIONS_ID,
        t=OUTBOX_ID,
        id=Identifier("id"),
        entry=Identifier("entry_id"),
    )
    return counted, ticked


_BOTH = _sources()
_TABLE = (sql("{t}", t=OUTBOX_ID),)


def sources(db: Engine) -> tuple[Fragment, ...]:
    """What readers select entries from, each with the columns
    ``versionstamp``, ``uow_id``, ``payload``, ``ref_map``, ``created_at``:
    the outbox table; where the dialect has ticks, its counter's entries
    and its ticked ones (a database can hold both: one that moved from
    one strategy to the other). A reader queries each (each by its own
    index) and merges."""
    return _BOTH if db.adapter.sql.outbox_ticks is not None else _TABLE
