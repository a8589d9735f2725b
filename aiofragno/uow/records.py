"""What a committed unit of work leaves behind to be found by — its outbox
entry (the outbox on) and its idempotency key's row (a key given: every
keyed unit has one, so a key is unique in one table whatever the unit
writes) — and settling a lost COMMIT by it.

Both records name the unit by its ``uow_id`` — unique, so one key commits
once — and the ``execute_uow`` call that wrote them by a random nonce, so
that a call finds its own commit and never mistakes an earlier call's with
the same key for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..codec import utc_now
from ..driver import CompiledQuery
from ..errors import AlreadyApplied, CommitOutcomeUnknown, ConnectionLost, ValidationError
from ..migrate import SETTINGS_TABLE
from ..outbox.tables import OUTBOX_ID, UNIT_KEYS_ID, VERSION_KEY, VERSIONS_ID
from ..outbox.ticks import tick
from ..outbox.writer import KEY_INSERT
from ..random_bytes import random_bytes
from ..resilience import retry_read
from ..server_sessions import end_server_session
from ..sql import Identifier, sql
from ..transaction import outside_transactions

if TYPE_CHECKING:
    from ..engine import Engine
    from ..queries import Queries
    from .unit import UnitOfWork

VS = Identifier("versionstamp")
# How long a lost session may take to end once asked to.
END_SESSION_TIMEOUT = 30.0


def new_nonce() -> str:
    """The name of one execute_uow call: 128 random bits as hex."""
    return random_bytes(16).hex()


@dataclass(frozen=True, slots=True)
class Record:
    """A committed unit's record: the nonce of the call that wrote it, its
    outbox versionstamp (None without the outbox), and whether the unit
    was given its id as an idempotency key (it has a row in the keys
    table; else the id was generated, and only its outbox entry has it)."""

    nonce: str | None
    versionstamp: str | None
    keyed: bool


def key_statement(db: Engine, key: str, nonce: str) -> CompiledQuery:
    """The row that records idempotency key ``key`` in the unit's own
    transaction, for a unit that writes no outbox entry (one that writes an
    entry records it with the entry: :class:`~aiofragno.outbox.writer.KeyedStatements`)."""
    query = sql(
        KEY_INSERT,
        keys=UNIT_KEYS_ID,
        key=Identifier("key"),
        n=Identifier("nonce"),
        c=Identifier("created_at"),
        uow_id=key,
        nonce=nonce,
        created=db.codec.encoder("timestamp")(utc_now()),
    )
    return db.compile(query)


async def find_record(db: Engine, queries: Queries, uow_id: str) -> Record | None:
    """The record of the unit of work ``uow_id`` (through ``queries``: the
    engine or a transaction), or None when none committed. Both tables are
    looked in: whether a unit writes an entry depends on the unit (its
    ``outbox=`` and the tables it wrote), not only on the database. (An
    entry under ticks has its versionstamp in the versions table once
    ticked; the record is found before that too.)"""
    versioned = db.adapter.sql.outbox_ticks is not None
    query = sql(
        "SELECT o.{n} AS nonce, {vs} AS versionstamp, 0 AS keyed FROM {t} o {join} "
        "WHERE o.{u} = {id} UNION ALL SELECT {n}, NULL, 1 FROM {keys} WHERE {k} = {id}",
        n=Identifier("nonce"),
        vs=sql("COALESCE(o.{vs}, v.{vs})" if versioned else "o.{vs}", vs=VS),
        t=OUTBOX_ID,
        join=sql(
            "LEFT JOIN {v} v ON v.{e} = o.{i}",
            v=VERSIONS_ID,
            e=Identifier("entry_id"),
            i=Identifier("id"),
        )
        if versioned
        else sql(""),
        u=Identifier("uow_id"),
        keys=UNIT_KEYS_ID,
        k=Identifier("key"),
        id=uow_id,
    )
    rows = await queries.fetch(query)
    if not rows:
        return None
    keys = [row for row in rows if row["keyed"]]
    if not keys:  # (a unit without a key: its entry)
        row = max(rows, key=lambda r: r["versionstamp"] is not None)
        return Record(row["nonce"], _stamp(row["versionstamp"]), False)
    # A keyed unit's call is its key's row; its entry, if any, has the same
    # nonce and tells the versionstamp. (An entry of a unit without a key
    # may have this id too, where the keyed unit wrote no entry.)
    nonce = keys[0]["nonce"]
    stamps = [r["versionstamp"] for r in rows if not r["keyed"] and r["nonce"] == nonce]
    return Record(nonce, _stamp(max(stamps, key=lambda s: s is not None, default=None)), True)


def _stamp(value: Any) -> str | None:
    return None if value is None else str(value)


def id_taken(key: str, versionstamp: str | None) -> ValidationError:
    """The error for an idempotency key that is the generated id of a unit
    run without a key (its outbox entry's ``uow_id``, unique like a key)."""
    entry = "" if versionstamp is None else f" (outbox entry {versionstamp})"
    return ValidationError(
        f"idempotency_key {key!r} is the uow_id of a unit of work that committed without a "
        f"key{entry}, and unit ids are unique; this unit wrote nothing. To apply a unit once "
        f"per such entry, derive its key from the id and what handles it (say "
        f"'<consumer>:{key}')"
    )


def counter_lock(db: Engine) -> Any:
    """A read of the outbox counter row holding its lock until commit: taken
    before :func:`find_record`, it waits for a commit that is finishing
    right now, so the look-up sees it."""
    return sql(
        "SELECT {v} FROM {t} WHERE {k} = {key}" + db.adapter.sql.row_share_lock,
        v=Identifier("value"),
        t=Identifier(SETTINGS_TABLE),
        k=Identifier("key"),
        key=VERSION_KEY,
    )


async def committed(
    db: Engine, uow: UnitOfWork, nonce: str, lost: CommitOutcomeUnknown, keyed: bool
) -> bool:
    """Whether this call's mutation phase committed, after its connection
    broke during COMMIT (``lost``): its record exists (:mod:`.records`)
    with this call's ``nonce``. The lost server session is ended first
    (:mod:`aiofragno.server_sessions`), so nothing can commit the phase after
    we looked; unless the database's outbox ticks, the counter row is locked
    as well, so a commit that finished just now is visible (under ticks the
    entry is found by ``uow_id`` and nonce whether or not it has been
    versioned yet). All of it on connections of
    its own, even when the caller has a transaction open: held there, the
    counter's lock would stop the unit's re-run until the caller — who
    waits for that re-run — commits. Raises :class:`AlreadyApplied` when
    the record is another call's (this one cannot have committed: the key
    is unique); any other error means the outcome is still unknown."""

    async def look() -> bool:
        await end_server_session(db, lost.server_session, END_SESSION_TIMEOUT)
        try:
            async with db.transaction() as tx:
                if db.adapter.sql.local_commit is not None:
                    await tx.execute(db.raw(db.adapter.sql.local_commit))
                if db.outbox_strategy != "ticks":
                    await tx.fetch(counter_lock(db))
                record = await find_record(db, tx, uow.uow_id)
        except CommitOutcomeUnknown as exc:
            # This transaction only read: losing its COMMIT loses nothing.
            raise ConnectionLost(str(exc)) from exc
        if record is None or (keyed and not record.keyed):
            # (A keyed unit that committed left its key's row.)
            return False
        if record.nonce != nonce:
            raise already_applied(uow.uow_id, record.versionstamp)
        if db.outbox_strategy == "ticks":
            # As after a COMMIT that answered: known from a tick, not now.
            db.outbox_ticks.commit_seen()
        else:
            uow.versionstamp = record.versionstamp
        return True

    with outside_transactions():
        return await retry_read(db.options.reconnect_deadline, look)


def already_applied(key: str, versionstamp: str | None) -> AlreadyApplied:
    entry = "" if versionstamp is None else f" (outbox entry {versionstamp})"
    return AlreadyApplied(
        f"a unit of work with idempotency_key {key!r} has already committed{entry}; "
        "this one wrote nothing. A key applies a unit once: treat this as that unit's "
        "success, or use a new key for new work",
        idempotency_key=key,
        versionstamp=versionstamp,
    )


async def settle(
    db: Engine, uow: UnitOfWork, nonce: str, lost: CommitOutcomeUnknown, keyed: bool
) -> bool:
    """:func:`committed`, where every failure to tell is a
    :class:`CommitOutcomeUnknown` chained to what went wrong: the unit may
    have committed, so neither a plain error (as if nothing was done) nor a
    re-run would be true."""
    try:
        return await committed(db, uow, nonce, lost, keyed)
    except AlreadyApplied:
        raise
    except Exception as exc:
        raise CommitOutcomeUnknown(
            f"{lost}; then looking up whether unit of work {uow.uow_id} committed failed "
            f"({type(exc).__name__}: {exc}), so it may or may not have been applied. "
            f"Once the database answers, look for its effects (or run it again with the "
            f"same idempotency_key, which raises AlreadyApplied if it committed)",
            sqlstate=lost.sqlstate,
            code=lost.code,
            server_session=lost.server_session,
        ) from exc


async def key_taken(db: Engine, uow: UnitOfWork, nonce: str) -> Exception | None:
    """After a unique violation in a unit with an idempotency key: the
    :class:`AlreadyApplied` to raise when another call's record holds the
    key (:func:`id_taken`'s error when that record is a unit's without a
    key, whose generated id it is), or None when the violation was another
    constraint (or the look-up failed, which leaves the violation as the
    answer: nothing committed)."""
    try:
        with outside_transactions():
            if db.options.outbox:
                await tick(db, wait=True)  # (so that the entry's versionstamp is known)
            record = await find_record(db, db, uow.uow_id)
    except Exception:
        return None
    if record is None or record.nonce == nonce:
        return None
    if not record.keyed:
        return id_taken(uow.uow_id, record.versionstamp)
    return already_applied(uow.uow_id, record.versionstamp)
