"""A consumer's lease and cursor: its row in ``fragno_db_outbox_consumers``.

One worker at a time delivers a consumer's entries: the one whose lease
(``lease_owner``, and ``lease_until`` in milliseconds on the database's
clock) is current. A worker claims the lease under the dialect's row lock
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MySQL; SQLite's one writer),
and renews it before a handler call whenever a third of it has passed
(:meth:`Lease.due`), so every handler call starts with at least two thirds
of the lease left. The cursor moves only while the lease is the worker's
own, and only forward: a late or repeated advance (its connection lost, the
statement re-run) can neither take the consumer back nor skip an entry, and
a transactional delivery that finds the cursor already past its entry
committed before and is rolled back (:class:`AlreadyPast`).

Every step rides out lost connections (:mod:`aiofragno.outbox.riding`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

from .. import runtime
from ..codec import as_utc
from ..errors import Error, UniqueViolation
from ..schema import new_external_id
from ..sql import Fragment, Identifier, sql_using
from .riding import Attempt, ride_out
from .tables import CONSUMERS_ID

if TYPE_CHECKING:
    from ..engine import Engine
    from ..queries import Queries

logger = logging.getLogger("aiofragno")

MIN_LEASE = 0.01
MAX_LEASE = 86_400.0
# How long releasing the lease may hold up the end of a run (else it lapses).
RELEASE_TIMEOUT = 5.0

_C = {
    "t": CONSUMERS_ID,
    "name": Identifier("name"),
    "cursor": Identifier("cursor"),
    "owner": Identifier("lease_owner"),
    "until": Identifier("lease_until"),
    "delivered": Identifier("delivered"),
}


class LeaseLost(Exception):
    """Another worker took the consumer over (our lease had lapsed)."""


class AlreadyPast(Exception):
    """The cursor is already past the entry being delivered: its delivery
    committed before (the reply to that COMMIT was lost)."""


class Lease:
    """One worker's hold on consumer ``name`` (a new owner id per run)."""

    def __init__(self, db: Engine, name: str, seconds: float) -> None:
        self.db = db
        self.name = name
        self.seconds = seconds
        self.owner = new_external_id()
        self.what = f"consumer {name!r}"
        self.cursor: str | None = None  # as of the last claim or advance
        self._confirmed = -math.inf  # monotonic time the lease was last made ours

    def due(self) -> bool:
        """Whether to renew before the next handler call."""
        return runtime.monotonic() - self._confirmed >= self.seconds / 3

    def _query(self, template: str, **params: Any) -> Fragment:
        return sql_using(template, **_C, n=self.name, o=self.owner, **params)

    async def _now_ms(self, queries: Queries) -> int:
        now = await queries.fetch_value(self.db.raw(self.db.adapter.sql.now))
        return int(as_utc(now).timestamp() * 1000)

    def _until(self, now: int) -> int:
        return now + int(self.seconds * 1000)

    async def ensure_row(self) -> None:
        async def ensure() -> None:
            if await self.db.fetch_value(self._query("SELECT 1 FROM {t} WHERE {name} = {n}")):
                return
            # Another worker (or our own lost INSERT) may have created it: all we wanted.
            with contextlib.suppress(UniqueViolation):
                await self.db.execute(self._query("INSERT INTO {t} ({name}) VALUES ({n})"))

        await ride_out(self.db, self.what, ensure)

    async def claim(self) -> bool:
        """Take (or renew) the lease, and read the cursor; False while another
        worker holds it."""
        return await ride_out(self.db, self.what, self._claim)

    async def _claim(self) -> bool:
        lock = (
            " FOR UPDATE SKIP LOCKED" if self.db.adapter.capabilities.supports_skip_locked else ""
        )
        select = self._query("SELECT {cursor}, {owner}, {until} FROM {t} WHERE {name} = {n}" + lock)
        started = runtime.monotonic()
        attempt = Attempt(self.db)
        try:
            async with attempt.transaction() as tx:
                row = await tx.fetch_one(select)
                if row is None:
                    return False  # locked by another worker right now
                now = await self._now_ms(tx)
                holder, until = row["lease_owner"], row["lease_until"]
                if holder not in (None, self.owner) and until is not None and int(until) > now:
                    return False
                update = "UPDATE {t} SET {owner} = {o}, {until} = {u} WHERE {name} = {n}"
                await tx.execute(self._query(update, u=self._until(now)))
                cursor = row["cursor"]
        except Exception as exc:
            # Its row lock must not outlive the connection: our next claim
            # would skip the row as another worker's.
            if attempt.lost(exc):
                await attempt.end_lost_session()
            raise
        self.cursor, self._confirmed = cursor, started
        return True

    async def renew(self) -> None:
        """Extend the lease; :class:`LeaseLost` if it is no longer ours."""

        async def renew() -> None:
            started = runtime.monotonic()
            now = await self._now_ms(self.db)
            update = "UPDATE {t} SET {until} = {u} WHERE {name} = {n} AND {owner} = {o}"
            result = await self.db.execute(self._query(update, u=self._until(now)))
            if result.rows_affected == 0:
                raise LeaseLost
            self._confirmed = started

        await ride_out(self.db, self.what, renew)

    def _advance(self, now: int, cursor: str, count: int) -> Fragment:
        return self._query(
            "UPDATE {t} SET {owner} = {o}, {until} = {u}, {cursor} = {c}, "
            "{delivered} = {delivered} + {d} "
            "WHERE {name} = {n} AND {owner} = {o} AND ({cursor} IS NULL OR {cursor} < {c})",
            u=self._until(now),
            c=cursor,
            d=count,
        )

    async def _not_advanced(self, queries: Queries, cursor: str) -> None:
        """After an advance to ``cursor`` matched no row: return if the cursor
        is there already (an earlier advance whose reply was lost), else
        :class:`LeaseLost`."""
        state = self._query("SELECT {cursor}, {owner} FROM {t} WHERE {name} = {n}")
        row = await queries.fetch_one(state)
        if row is None or row["lease_owner"] != self.owner:
            raise LeaseLost
        if row["cursor"] is None or row["cursor"] < cursor:
            raise LeaseLost  # (the row changed under us: claim it afresh)

    async def advance(self, cursor: str, count: int) -> None:
        """Move the cursor to ``cursor`` (``count`` more delivered), renewing
        the lease, in a statement of its own; :class:`LeaseLost` if the lease
        is no longer ours."""

        async def advance() -> None:
            started = runtime.monotonic()
            now = await self._now_ms(self.db)
            result = await self.db.execute(self._advance(now, cursor, count))
            if result.rows_affected == 0:
                await self._not_advanced(self.db, cursor)
            else:
                self._confirmed = started
            self.cursor = cursor

        await ride_out(self.db, self.what, advance)

    async def advance_in(self, tx: Queries, cursor: str) -> float:
        """Advance past one delivered entry inside the delivery's transaction
        ``tx``; returns the time to pass to :meth:`moved` once it committed.
        :class:`LeaseLost`, or :class:`AlreadyPast` (roll ``tx`` back: the
        delivery committed before)."""
        started = runtime.monotonic()
        now = await self._now_ms(tx)
        if (await tx.execute(self._advance(now, cursor, 1))).rows_affected == 0:
            await self._not_advanced(tx, cursor)
            raise AlreadyPast
        return started

    def moved(self, cursor: str, started: float) -> None:
        self.cursor, self._confirmed = cursor, started

    async def passed(self, versionstamp: str) -> bool:
        """Whether the cursor is at or past ``versionstamp`` (read afresh)."""
        query = self._query("SELECT {cursor} FROM {t} WHERE {name} = {n}")
        cursor = await ride_out(self.db, self.what, lambda: self.db.fetch_value(query))
        if isinstance(cursor, str) and cursor >= versionstamp:  # (None: nothing delivered yet)
            self.cursor = cursor
            return True
        return False

    async def release(self) -> None:
        """Give the lease up, so another worker need not wait for it to lapse.
        Never raises: a lease that cannot be released lapses by itself."""
        if self.db.closed:
            return
        update = (
            "UPDATE {t} SET {owner} = NULL, {until} = NULL WHERE {name} = {n} AND {owner} = {o}"
        )
        query = self._query(update)
        with runtime.shielded(RELEASE_TIMEOUT) as scope:
            try:
                await ride_out(self.db, self.what, lambda: self.db.execute(query))
            except Error as exc:
                logger.warning(
                    "could not release %s's lease (it lapses by itself): %s", self.what, exc
                )
        if scope.cancelled_caught:
            logger.warning("releasing %s's lease timed out (it lapses by itself)", self.what)
