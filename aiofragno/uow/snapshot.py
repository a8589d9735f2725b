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
batch at once (MySQL, SQLite). PostgreSQL, MySQL and MariaDB combine reads
into one statement (:mod:`.combine_reads`) and need the transaction only
for reads they cannot combine.
The transaction ends with ROLLBACK: it wrote nothing, and so its end is
never a COMMIT, whose outcome a lost connection would make unknown.

Some reads need the rows of others first (``then``: a join's newest rows
per parent, on MariaDB, read by key once its parents are known): they go
in a second batch of the same transaction, which carries its ROLLBACK.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from ..driver import ROLLBACK, CompiledQuery, QueryResult
from ..session import Session

END = ROLLBACK

Then = Callable[[list[QueryResult]], Sequence[CompiledQuery]]
"""The reads that follow from the results of the first ones (called once
per attempt: a read run again on a new connection calls it again)."""


async def read_in_snapshot(
    session: Session,
    begin: Sequence[str],
    queries: Sequence[CompiledQuery],
    then: Then | None = None,
) -> list[QueryResult]:
    """The results of ``queries`` and then of the reads ``then`` makes of
    them, all read from one snapshot of the database: one statement alone,
    several after ``begin`` (the dialect's ``read_snapshot``) and before
    :data:`END`, in the same batch (two batches with ``then``). A read that
    fails leaves no transaction open (it is rolled back)."""
    if not begin:  # (a dialect without a read_snapshot: each batch as its driver runs it)
        first = await session.execute_batch(queries)
        return first if then is None else first + await session.execute_batch(then(first))
    if then is None and len(queries) < 2:
        return await session.execute_batch(queries)
    opening = [CompiledQuery(sql) for sql in begin]
    try:
        if then is None:
            return (await session.execute_batch([*opening, *queries, END]))[len(opening) : -1]
        first = (await session.execute_batch([*opening, *queries]))[len(opening) :]
        return first + (await session.execute_batch([*then(first), END]))[:-1]
    except Exception:
        if session.connection.in_transaction and not session.broken:
            # (Else the pool would reset the session, or discard it.)
            with contextlib.suppress(Exception):
                await session.rollback()
        raise
