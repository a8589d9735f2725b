"""The migration lock: one migration at a time per database, and no migration
waiting for ever.

PostgreSQL takes a transaction-level advisory lock, MySQL/MariaDB the
user-level lock ``GET_LOCK``, SQLite its write lock (``BEGIN IMMEDIATE``,
bounded by ``busy_timeout``). On PostgreSQL a migration first takes a
session lock outside any transaction, held until its online index builds
are done (:func:`held_outside_transaction`): a build waits for every
transaction older than it, so no migration may wait for a build from
inside a transaction. The wait for it is bounded by ``lock_timeout``
seconds; so, on PostgreSQL and MySQL, is each lock the migration's DDL waits
for (a table lock that a long transaction holds), since DDL queued behind it
would hold up every other statement on that table meanwhile. A wait that runs
out raises :class:`~aiofragno.errors.MigrationError` saying what to do.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio

from .driver import DdlSpec
from .errors import LockTimeout, MigrationError, ValidationError
from .sql import sql_using

if TYPE_CHECKING:
    from .session import Session

MIGRATION_LOCK_KEY = "aiofragno.migrate"
ONLINE_LOCK_KEY = "aiofragno.migrate.online"
DEFAULT_LOCK_TIMEOUT = 60.0
# Seconds between tries of the online builds' lock.
_RETRY = 0.05


def check_lock_timeout(lock_timeout: Any) -> None:
    if (
        not isinstance(lock_timeout, int | float)
        or isinstance(lock_timeout, bool)
        or not math.isfinite(lock_timeout)
        or lock_timeout <= 0
    ):
        raise ValidationError(
            f"lock_timeout must be a positive number of seconds, got {lock_timeout!r}"
        )


@asynccontextmanager
async def held(session: Session, compile: Any, spec: DdlSpec, wait: float) -> AsyncIterator[None]:
    """The migration lock, held on ``session`` for the block, whose lock waits
    are bounded by ``wait`` seconds too."""
    await _run(session, compile, spec.lock_timeout_sql, wait)
    try:
        await _take(session, compile, spec, wait)
        try:
            yield
        finally:
            if not session.broken:
                await _run(session, compile, spec.migration_unlock_sql, wait)
    finally:
        if not session.broken:
            await _run(session, compile, spec.lock_timeout_reset_sql, wait)


def timed_out(wait: float, exc: LockTimeout, namespace: str) -> MigrationError:
    """The error for a DDL statement that waited ``wait`` seconds for a lock."""
    return MigrationError(
        f"migrating namespace {namespace!r}: waited lock_timeout={wait} s for a lock that another "
        f"transaction holds on a table this migration changes ({exc}); run migrate again once "
        "that transaction has ended, or pass a larger lock_timeout"
    )


async def _take(session: Session, compile: Any, spec: DdlSpec, wait: float) -> None:
    if not spec.migration_lock_sql:
        return
    busy = (
        f"another migration holds the migration lock: it was not free within lock_timeout={wait} "
        "s; run migrate again once that migration has finished (or end the session holding the "
        "lock), or pass a larger lock_timeout"
    )
    try:
        result = await _run(session, compile, spec.migration_lock_sql, wait)
    except LockTimeout as exc:
        raise MigrationError(busy) from exc
    if not result or result[0]["taken"] not in (1, True):
        raise MigrationError(busy)


async def _run(
    session: Session,
    compile: Any,
    template: str | None,
    wait: float,
    key: str = MIGRATION_LOCK_KEY,
) -> list[Any]:
    """Run ``template`` if there is one, given the lock key and ``wait`` in the
    units it takes ({seconds}; {whole_seconds} and {milliseconds}, rounded up
    and at least 1, as 0 would mean no limit); its rows."""
    if template is None:
        return []
    query = sql_using(
        template,
        key=key,
        seconds=wait,
        whole_seconds=max(1, math.ceil(wait)),
        milliseconds=max(1, math.ceil(wait * 1000)),
    )
    return list((await session.execute(compile(query))).rows)


@asynccontextmanager
async def held_outside_transaction(
    session: Session, compile: Any, spec: DdlSpec, wait: float
) -> AsyncIterator[None]:
    """Where online builds run outside the migration's transaction
    (PostgreSQL's ``CREATE INDEX CONCURRENTLY``): the online builds' lock, a
    session lock, held on ``session`` for the block — the whole migration,
    its transaction and then its builds; its wait, and the builds', bounded
    by ``wait``. Elsewhere nothing.

    Why before the transaction: a build waits for every transaction older
    than it. A migration transaction that waited for a running build — for
    the migration lock, or for the table lock an ``ALTER TABLE`` of the
    same table needs — was such a transaction: the two waited for each
    other, and PostgreSQL broke the deadlock by failing one (40P01). So the
    lock is taken before ``BEGIN``, and never waited for but tried again and
    again (the last statement of :attr:`DdlSpec.online_lock_sql`), each try
    a statement that ends at once."""
    if not (spec.online_outside_transaction and spec.online_lock_sql):
        yield
        return
    # (A session lock and setting: reset on release, should the unlock not
    # run because the task was cancelled.)
    session.dirty = True
    *setup, take = spec.online_lock_sql
    for template in setup:
        await _run(session, compile, template, wait, ONLINE_LOCK_KEY)
    deadline = anyio.current_time() + wait
    while True:
        rows = await _run(session, compile, take, wait, ONLINE_LOCK_KEY)
        if rows and rows[0]["taken"] in (1, True):
            break
        left = deadline - anyio.current_time()
        if left <= 0:
            raise MigrationError(
                "another migration holds the migration lock (or is building indexes online): "
                f"it was not free within lock_timeout={wait} s; migrate again once it has "
                "finished, or pass a larger lock_timeout"
            )
        await anyio.sleep(min(_RETRY, left))
    try:
        yield
    finally:
        if not session.broken:
            if session.in_transaction:
                # (The migration failed in its transaction: the unlock cannot
                # run in that aborted transaction.)
                await session.rollback()
            for template in spec.online_unlock_sql:
                await _run(session, compile, template, wait, ONLINE_LOCK_KEY)
