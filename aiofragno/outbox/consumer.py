"""Durable outbox consumers.

Delivery guarantees of :meth:`Consumer.run`:

* **order**: entries reach the handler in versionstamp (commit) order;
* **at least once**: the cursor advances only past entries whose handler
  returned (or that were dead-lettered); an entry whose handler was interrupted
  (exception, cancellation, crash) is delivered again by the next run;
* **one worker at a time**: workers of one consumer name take a *lease* on the
  consumer's row before delivering. The lease is claimed under the dialect's
  row lock (``FOR UPDATE SKIP LOCKED`` on PostgreSQL and MySQL; SQLite's
  single-writer ``BEGIN IMMEDIATE``), lasts ``lease`` seconds and is renewed
  with every cursor advance. No transaction is held while a handler runs
  (except with ``transactional=True``), so a slow handler never blocks writers.
  A handler call must finish within the lease, or another worker may take over;
* **exactly-once effects** with ``transactional=True``: the handler receives
  the transaction that also advances the cursor, so its writes to the same
  database commit together with the delivery, or not at all.

A handler that keeps failing is retried with backoff ``max_attempts`` times;
then the entry is written to the dead-letter table and skipped
(``on_failure="dead-letter"``), or the consumer stops with
:class:`ConsumerHalted` (``on_failure="halt"``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from .. import runtime, tagged_json
from ..codec import as_utc, utc_now
from ..errors import Error, UniqueViolation, ValidationError
from ..schema import new_external_id
from ..session import Queries
from ..sql import Identifier, sql_using
from .entry import OutboxEntry
from .queries import check_limit, read_entries
from .tables import CONSUMERS_ID, DEAD_LETTERS_ID, OUTBOX_ID

if TYPE_CHECKING:
    from ..database import Database

Handler = Callable[..., Awaitable[Any]]
logger = logging.getLogger("aiofragno")


class ConsumerHalted(Error):
    """A consumer with ``on_failure="halt"`` stopped at an entry its handler
    kept failing on. ``versionstamp`` is that entry; the cursor stays before it."""

    def __init__(self, message: str, versionstamp: str) -> None:
        super().__init__(message)
        self.versionstamp = versionstamp


class _LeaseLost(Exception):
    """Another worker took the consumer over (our lease expired)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    consumer: str
    versionstamp: str
    uow_id: str
    entry: dict[str, Any]
    error: str
    attempts: int
    created_at: datetime


_C = {
    "t": CONSUMERS_ID,
    "name": Identifier("name"),
    "cursor": Identifier("cursor"),
    "owner": Identifier("lease_owner"),
    "until": Identifier("lease_until"),
    "delivered": Identifier("delivered"),
}


class Consumer:
    """A named, durable reader of the outbox (see the module docstring)."""

    def __init__(self, db: Database, name: str, *, lease: float = 30.0) -> None:
        if not isinstance(name, str) or not name or len(name) > 255:
            raise ValidationError(
                f"consumer names are non-empty str of at most 255 characters, got {name!r}"
            )
        self._db = db
        self.name = name
        self.lease = lease

    async def position(self) -> str | None:
        """The versionstamp of the last entry delivered, or None."""
        query = sql_using("SELECT {cursor} FROM {t} WHERE {name} = {n}", **_C, n=self.name)
        value = await self._db.fetch_value(query)
        return None if value is None else str(value)

    async def lag(self) -> int:
        """How many committed entries this consumer has not processed yet."""
        cursor = await self.position()
        vs = Identifier("versionstamp")
        where = sql_using("") if cursor is None else sql_using("WHERE {vs} > {c}", vs=vs, c=cursor)
        return int(
            await self._db.fetch_value(
                sql_using("SELECT COUNT(*) FROM {t} {w}", t=OUTBOX_ID, w=where)
            )
        )

    async def dead_letters(self) -> list[DeadLetter]:
        cols = ["consumer", "versionstamp", "uow_id", "entry", "error", "attempts", "created_at"]
        query = sql_using(
            "SELECT "
            + ", ".join(f"{{c{i}}}" for i in range(len(cols)))
            + " FROM {t} WHERE {k} = {n} ORDER BY {v}",
            **{f"c{i}": Identifier(c) for i, c in enumerate(cols)},
            t=DEAD_LETTERS_ID,
            k=Identifier("consumer"),
            v=Identifier("versionstamp"),
            n=self.name,
        )
        decode = self._db.codec.decoder("timestamp")
        letters = []
        for row in await self._db.fetch(query):
            created = row["created_at"] if decode is None else decode(row["created_at"])
            letters.append(
                DeadLetter(
                    consumer=row["consumer"],
                    versionstamp=row["versionstamp"],
                    uow_id=row["uow_id"],
                    entry=tagged_json.loads(row["entry"]),
                    error=row["error"],
                    attempts=int(row["attempts"]),
                    created_at=created,
                )
            )
        return letters

    async def run(
        self,
        handler: Handler,
        *,
        batch_size: int = 100,
        max_attempts: int = 5,
        on_failure: Literal["dead-letter", "halt"] = "dead-letter",
        transactional: bool = False,
        stop: runtime.Event | Callable[[], bool] | None = None,
        until_caught_up: bool = False,
        poll_interval: float = 0.5,
        retry_delay: float = 0.05,
    ) -> int:
        """Deliver entries to ``handler`` (``await handler(entry)``, or
        ``await handler(entry, tx)`` when ``transactional``) until ``stop`` is
        set / returns True, or — with ``until_caught_up`` — until no entry is
        left. Returns how many entries were delivered."""
        check_limit(batch_size)
        if on_failure not in ("dead-letter", "halt"):
            raise ValidationError(f"on_failure must be 'dead-letter' or 'halt', got {on_failure!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValidationError(f"max_attempts must be a positive int, got {max_attempts!r}")
        run = _Run(self, handler, max_attempts, on_failure, transactional, retry_delay)
        await self._ensure_row()
        try:
            while not _stopped(stop):
                if not await run.claim():
                    if until_caught_up:
                        return run.delivered
                    await runtime.sleep(poll_interval)
                    continue
                try:
                    count = await run.batch(batch_size, stop)
                except _LeaseLost:
                    continue
                if count == 0:
                    if until_caught_up:
                        return run.delivered
                    await runtime.sleep(poll_interval)
            return run.delivered
        finally:
            await run.release()

    async def _ensure_row(self) -> None:
        query = sql_using("SELECT 1 FROM {t} WHERE {name} = {n}", **_C, n=self.name)
        if await self._db.fetch_value(query) is not None:
            return
        # Another worker may create it first: that is all we wanted.
        with contextlib.suppress(UniqueViolation):
            await self._db.execute(
                sql_using("INSERT INTO {t} ({name}) VALUES ({n})", **_C, n=self.name)
            )


def _stopped(stop: runtime.Event | Callable[[], bool] | None) -> bool:
    if stop is None:
        return False
    if isinstance(stop, runtime.Event):
        return stop.is_set()
    return bool(stop())


async def _call(handler: Handler, *args: Any) -> None:
    outcome = handler(*args)
    if inspect.isawaitable(outcome):
        await outcome


class _Run:
    """The state of one ``Consumer.run`` call."""

    def __init__(
        self,
        consumer: Consumer,
        handler: Handler,
        max_attempts: int,
        on_failure: str,
        transactional: bool,
        retry_delay: float,
    ) -> None:
        self.consumer = consumer
        self.db = consumer._db
        self.handler = handler
        self.max_attempts = max_attempts
        self.on_failure = on_failure
        self.transactional = transactional
        self.retry_delay = retry_delay
        self.owner = new_external_id()
        self.delivered = 0
        self.cursor: str | None = None

    async def now_ms(self, queries: Queries) -> int:
        now = await queries.fetch_value(self.db.raw(self.db.adapter.now_sql))
        return int(as_utc(now).timestamp() * 1000)

    async def claim(self) -> bool:
        """Take (or renew) the lease; False while another worker holds it."""
        lock = " FOR UPDATE SKIP LOCKED" if self.db.adapter.supports_skip_locked else ""
        select = sql_using(
            "SELECT {cursor}, {owner}, {until} FROM {t} WHERE {name} = {n}" + lock,
            **_C,
            n=self.consumer.name,
        )
        async with self.db.transaction() as tx:
            row = await tx.fetch_one(select)
            if row is None:
                return False  # locked by another worker right now
            now = await self.now_ms(tx)
            holder, until = row["lease_owner"], row["lease_until"]
            if holder not in (None, self.owner) and until is not None and int(until) > now:
                return False
            await tx.execute(self._lease_update(now))
            self.cursor = row["cursor"]
        return True

    def _lease_update(self, now: int, *, cursor: str | None = None, delivered: int = 0) -> Any:
        """Renew our lease; with ``cursor``, also advance — only while the lease
        is still ours."""
        template = "UPDATE {t} SET {owner} = {o}, {until} = {u} WHERE {name} = {n}"
        params: dict[str, Any] = {}
        if cursor is not None:
            template = (
                "UPDATE {t} SET {owner} = {o}, {until} = {u}, {cursor} = {c}, "
                "{delivered} = {delivered} + {d} WHERE {name} = {n} AND {owner} = {o}"
            )
            params = {"c": cursor, "d": delivered}
        until = now + int(self.consumer.lease * 1000)
        return sql_using(template, **_C, o=self.owner, u=until, n=self.consumer.name, **params)

    async def advance(self, queries: Queries, cursor: str, count: int) -> None:
        """Move the cursor to ``cursor`` if we still hold the lease."""
        now = await self.now_ms(queries)
        result = await queries.execute(self._lease_update(now, cursor=cursor, delivered=count))
        if result.rows_affected == 0:
            raise _LeaseLost
        self.cursor = cursor

    async def release(self) -> None:
        if self.db.closed:
            return
        with runtime.shielded(5.0):
            query = sql_using(
                "UPDATE {t} SET {owner} = NULL, {until} = NULL WHERE {name} = {n} AND {owner} = {o}",
                **_C,
                n=self.consumer.name,
                o=self.owner,
            )
            try:
                await self.db.execute(query)
            except Error as exc:
                logger.warning(
                    "could not release consumer %r's lease (it expires by itself): %s",
                    self.consumer.name,
                    exc,
                )

    async def batch(self, size: int, stop: Any) -> int:
        entries = await read_entries(self.db, self.db, self.cursor, size)
        if self.transactional:
            for entry in entries:
                if _stopped(stop):
                    break
                await self.deliver_in_transaction(entry)
            return len(entries)
        done: OutboxEntry | None = None
        count = 0
        try:
            for entry in entries:
                if _stopped(stop):
                    break
                if await self.deliver(entry):
                    count += 1
                done = entry
        finally:
            if done is not None:
                with runtime.shielded(5.0):
                    await self.advance(self.db, done.versionstamp, count)
                self.delivered += count
        return len(entries)

    async def deliver(self, entry: OutboxEntry) -> bool:
        """True when the handler took ``entry``; False when it was dead-lettered."""
        for attempt in range(1, self.max_attempts + 1):
            try:
                await _call(self.handler, entry)
                return True
            except Exception as exc:
                if attempt == self.max_attempts:
                    await self.give_up(self.db, entry, exc, attempt)
                    return False
                await runtime.sleep(self.retry_delay * 2 ** (attempt - 1))
        raise AssertionError("max_attempts >= 1 was checked by run()")

    async def deliver_in_transaction(self, entry: OutboxEntry) -> None:
        for attempt in range(1, self.max_attempts + 1):
            try:
                async with self.db.transaction() as tx:
                    await _call(self.handler, entry, tx)
                    await self.advance(tx, entry.versionstamp, 1)
                self.delivered += 1
                return
            except _LeaseLost:
                raise
            except Exception as exc:
                if attempt == self.max_attempts:
                    async with self.db.transaction() as tx:
                        await self.give_up(tx, entry, exc, attempt)
                        await self.advance(tx, entry.versionstamp, 0)
                    return
                await runtime.sleep(self.retry_delay * 2 ** (attempt - 1))

    async def give_up(
        self, queries: Queries, entry: OutboxEntry, exc: Exception, attempts: int
    ) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if self.on_failure == "halt":
            raise ConsumerHalted(
                f"consumer {self.consumer.name!r} halted at {entry.versionstamp} after {attempts} attempts: {error}",
                entry.versionstamp,
            ) from exc
        await queries.execute(_dead_letter(self.db, self.consumer.name, entry, error, attempts))


def _dead_letter(db: Database, consumer: str, entry: OutboxEntry, error: str, attempts: int) -> Any:
    record = {
        "versionstamp": entry.versionstamp,
        "uow_id": entry.uow_id,
        "payload": entry.payload,
        "ref_map": entry.ref_map,
        "created_at": entry.created_at,
    }
    return sql_using(
        "INSERT INTO {t} ({c}, {v}, {u}, {e}, {err}, {a}, {at}) VALUES ({consumer}, {vs}, {uow}, {entry}, {error}, {attempts}, {now})",
        t=DEAD_LETTERS_ID,
        c=Identifier("consumer"),
        v=Identifier("versionstamp"),
        u=Identifier("uow_id"),
        e=Identifier("entry"),
        err=Identifier("error"),
        a=Identifier("attempts"),
        at=Identifier("created_at"),
        consumer=consumer,
        vs=entry.versionstamp,
        uow=entry.uow_id,
        entry=tagged_json.dumps(record),
        error=error[:10_000],
        attempts=attempts,
        now=db.codec.encoder("timestamp")(utc_now()),
    )
