"""A retrieval phase's reads as of one moment.

Each ``retrieve()`` runs its reads — a joined tree's find and the read of
each join, and whatever else was queued — as one batch. One statement sees
one snapshot everywhere; several statements outside a transaction would each
see their own, so a write committing between them could show a transfer
whose account a join no longer finds, or a balance that its rows, read a
moment later, do not add up to. So a batch of several statements runs in a
read-only transaction of the dialect's ``read_snapshot``, whose reads all see
the snapshot taken at its start (PostgreSQL: repeatable read; MySQL and
MariaDB: ``WITH CONSISTENT SNAPSHOT`` at repeatable read; SQLite: a deferred
transaction, whose first read fixes what the rest see). BEGIN and its end
travel in the batch itself: no round trip more where the driver sends a
batch at once (MySQL, SQLite); PostgreSQL combines its reads into one
statement and needs the transaction only for reads too many to combine.
The transaction ends with ROLLBACK: it wrote nothing, and so its end is
never a COMMIT, whose outcome a lost connection would make unknown.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from ..driver import ROLLBACK, CompiledQuery, QueryResult
from ..session import Session

END = ROLLBACK


async def read_in_snapshot(
    session: Session, begin: Sequence[str], queries: Sequence[CompiledQuery]
) -> list[QueryResult]:
    """The results of ``queries``, all read from one snapshot of the
    database: one statement alone, several after ``begin`` (the dialect's
    ``read_snapshot``) and before :data:`END`, in the same batch. A read that
    fails leaves no transaction open (it is rolled back)."""
    if len(queries) < 2 or not begin:
        return await session.execute_batch(queries)
    opening = [CompiledQuery(sql) for sql in begin]
    try:
        results = await session.execute_batch([*opening, *queries, END])
    except Exception:
        if session.connection.in_transaction and not session.broken:
            # (Else the pool would reset the session, or discard it.)
            with contextlib.suppress(Exception):
                await session.rollback()
        raise
    return results[len(opening) : -1]
