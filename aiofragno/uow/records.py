"""What a committed unit of work leaves behind to be found by: its outbox
entry (the outbox on) or its idempotency key's row (the outbox off, a key
given). Both name the unit by its ``uow_id`` — unique, so one key commits
once — and the ``execute_uow`` call that wrote them by a random nonce, so
that a call finds its own commit and never mistakes an earlier call's with
the same key for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..codec import utc_now
from ..driver import CompiledQuery
from ..migrate import SETTINGS_TABLE
from ..outbox.tables import OUTBOX_ID, UNIT_KEYS_ID, VERSION_KEY
from ..sql import Identifier, sql

if TYPE_CHECKING:
    from ..database import Database
    from ..session import Queries


def new_nonce() -> str:
    """The name of one execute_uow call: 128 random bits as hex."""
    return os.urandom(16).hex()


@dataclass(frozen=True, slots=True)
class Record:
    """A committed unit's record: the nonce of the call that wrote it, and
    its outbox versionstamp (None without the outbox)."""

    nonce: str | None
    versionstamp: str | None


def key_statement(db: Database, key: str, nonce: str) -> CompiledQuery:
    """The row that records idempotency key ``key`` in the unit's own
    transaction, for a unit that writes no outbox entry."""
    query = sql(
        "INSERT INTO {t} ({k}, {n}, {c}) VALUES ({key}, {nonce}, {created})",
        t=UNIT_KEYS_ID,
        k=Identifier("key"),
        n=Identifier("nonce"),
        c=Identifier("created_at"),
        key=key,
        nonce=nonce,
        created=db.codec.encoder("timestamp")(utc_now()),
    )
    return db.compile(query)


async def find_record(db: Database, queries: Queries, uow_id: str) -> Record | None:
    """The record of the unit of work ``uow_id`` (through ``queries``: the
    Database or a transaction), or None when none committed."""
    if db.options.outbox:
        query = sql(
            "SELECT {n} AS nonce, {vs} AS versionstamp FROM {t} WHERE {u} = {id}",
            n=Identifier("nonce"),
            vs=Identifier("versionstamp"),
            t=OUTBOX_ID,
            u=Identifier("uow_id"),
            id=uow_id,
        )
    else:
        query = sql(
            "SELECT {n} AS nonce, NULL AS versionstamp FROM {t} WHERE {k} = {id}",
            n=Identifier("nonce"),
            t=UNIT_KEYS_ID,
            k=Identifier("key"),
            id=uow_id,
        )
    row = await queries.fetch_one(query)
    if row is None:
        return None
    stamp: Any = row["versionstamp"]
    return Record(row["nonce"], None if stamp is None else str(stamp))


def counter_lock(db: Database) -> Any:
    """A read of the outbox counter row holding its lock until commit: taken
    before :func:`find_record`, it waits for a commit that is finishing
    right now, so the look-up sees it."""
    return sql(
        "SELECT {v} FROM {t} WHERE {k} = {key}" + db.adapter.row_share_lock,
        v=Identifier("value"),
        t=Identifier(SETTINGS_TABLE),
        k=Identifier("key"),
        key=VERSION_KEY,
    )
