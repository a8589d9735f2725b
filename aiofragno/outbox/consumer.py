"""Durable outbox consumers.

Delivery guarantees of :meth:`Consumer.run`:

* **order**: entries reach the handler in versionstamp (commit) order;
* **at least once**: the cursor advances only past entries whose handler
  returned (or that were dead-lettered); an entry whose handler was interrupted
  (exception, cancellation, crash) is delivered again by the next run;
* **one worker at a time**: workers of one consumer name take a *lease* on the
  consumer's row before delivering (see :mod:`aiofragno.outbox.lease`). It
  lasts ``lease`` seconds and is renewed before a handler call whenever a
  third of it has passed, so a handler call must finish within two thirds of
  the lease, or another worker may take over. No transaction is held while a
  handler runs (except with ``transactional=True``), so a slow handler never
  blocks writers;
* **exactly-once effects** with ``transactional=True``: the handler receives
  the transaction that also advances the cursor, so its writes to the same
  database commit together with the delivery, or not at all;
* **lost connections are ridden out** at every step, up to
  ``reconnect_deadline`` per step (then :class:`DatabaseUnavailable`), without
  skipping an entry or delivering one to two workers at once (see
  :mod:`aiofragno.outbox.riding`). An entry whose cursor advance was lost may
  be delivered again; with ``transactional=True`` a lost COMMIT is settled by
  the cursor row before anything is redelivered.

A handler that keeps failing is retried with backoff (doubling from
``retry_delay``, at most ``max_retry_delay``) ``max_attempts`` times; then the
entry is written to the dead-letter table and skipped
(``on_failure="dead-letter"``), or the consumer stops with
:class:`ConsumerHalted` (``on_failure="halt"``, or when the dead letter
cannot be stored).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import runtime
from ..errors import DatabaseClosed, DatabaseUnavailable, Error, ValidationError
from ..resilience import shared_deadline
from ..sql import Fragment, Identifier, sql_using
from . import dead_letters
from .dead_letters import DeadLetter
from .entry import OutboxEntry
from .lease import MAX_LEASE, MIN_LEASE, AlreadyPast, Lease, LeaseLost
from .push import CommitWaiter
from .queries import check_limit, latest, read_entries
from .riding import Attempt, ride_out, unavailable
from .tables import CONSUMERS_ID
from .ticks import sources, tick_if_due

if TYPE_CHECKING:
    from ..engine import Engine

__all__ = ["Consumer", "ConsumerHalted", "DeadLetter"]

Handler = Callable[..., Awaitable[Any]]
Stop = runtime.Event | Callable[[], bool] | None

MAX_RETRY_DELAY = 60.0
MAX_SECONDS = 86_400.0  # for poll_interval and the retry delays


class ConsumerHalted(Error):
    """A consumer stopped at an entry: its handler kept failing there and
    ``on_failure="halt"``, or the entry's dead letter could not be stored.
    ``versionstamp`` is that entry; the cursor stays before it."""

    def __init__(self, message: str, versionstamp: str) -> None:
        super().__init__(message)
        self.versionstamp = versionstamp


def _seconds(name: str, value: object, low: float, high: float) -> float:
    # (NaN and infinities fail the range test; a huge int does not overflow it.)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValidationError(f"{name} must be a number of seconds in {low}..{high}, got {value!r}")
    return float(value)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise ValidationError(
            f"consumer names are non-empty str of at most 255 characters, got {name!r}"
        )
    if "\x00" in name or not _encodable(name):
        raise ValidationError(f"consumer names cannot hold NUL or lone surrogates, got {name!r}")
    return name


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return False
    return True


class Consumer:
    """A named, durable reader of the outbox (see the module docstring).
    ``lease``: seconds, in 0.01..86400. Made by ``db.outbox.consumer(name)``."""

    def __init__(self, db: Engine, name: str, *, lease: float = 30.0) -> None:
        facade = getattr(db, "_engine", None)
        if facade is not None:  # Consumer(database, ...), as before the engine existed
            warnings.warn(
                "Consumer(db, name) is deprecated: use db.outbox.consumer(name)",
                DeprecationWarning,
                stacklevel=2,
            )
            db = facade
        self._db = db
        self.name = _check_name(name)
        self.lease = _seconds("lease", lease, MIN_LEASE, MAX_LEASE)

    async def position(self) -> str | None:
        """The versionstamp of the last entry delivered, or None."""
        query = sql_using(
            "SELECT {c} FROM {t} WHERE {k} = {n}",
            c=Identifier("cursor"),
            t=CONSUMERS_ID,
            k=Identifier("name"),
            n=self.name,
        )
        value = await self._db.fetch_value(query)
        return None if value is None else str(value)

    async def lag(self) -> int:
        """How many committed entries this consumer has not processed yet."""
        cursor = await self.position()
        vs = Identifier("versionstamp")
        where = sql_using("") if cursor is None else sql_using("WHERE {vs} > {c}", vs=vs, c=cursor)
        await tick_if_due(self._db)
        counts = [
            sql_using("(SELECT COUNT(*) FROM {t} {w})", t=source, w=where)
            for source in sources(self._db)
        ]
        return await self._db.fetch_value(
            sql_using("SELECT {counts}", counts=Fragment.join(counts, " + ")), int
        )

    async def dead_letters(self) -> list[DeadLetter]:
        return await dead_letters.read(self._db, self.name)

    async def run(
        self,
        handler: Handler,
        *,
        batch_size: int = 100,
        max_attempts: int = 5,
        on_failure: Literal["dead-letter", "halt"] = "dead-letter",
        transactional: bool = False,
        stop: Stop = None,
        until_caught_up: bool = False,
        poll_interval: float = 0.5,
        retry_delay: float = 0.05,
        max_retry_delay: float = MAX_RETRY_DELAY,
    ) -> int:
        """Deliver entries to ``handler`` (``await handler(entry)``, or
        ``await handler(entry, tx)`` when ``transactional``) until ``stop`` is
        set / returns True, or — with ``until_caught_up`` — until no entry is
        left. Returns how many entries this call delivered. When caught up it
        waits for the next commit (woken at once on PostgreSQL, see
        :mod:`.push`), at most ``poll_interval`` seconds.

        While another worker holds the lease, waits (checking every
        ``poll_interval``) until it is released or lapses, then takes over;
        with ``until_caught_up`` it returns as soon as the consumer is caught
        up, by whichever worker. Raises :class:`ValidationError` for bad
        arguments before touching the database, :class:`ConsumerHalted`,
        :class:`DatabaseUnavailable` when the database stayed out of reach
        past ``reconnect_deadline``, and
        :class:`~aiofragno.OutboxCursorPruned` when entries after the cursor
        were pruned (a cursor restored from a backup, say)."""
        options = _Options(
            batch_size=check_limit(batch_size, "batch_size"),
            max_attempts=_attempts(max_attempts),
            halt=_on_failure(on_failure),
            transactional=_flag("transactional", transactional),
            until_caught_up=_flag("until_caught_up", until_caught_up),
            poll_interval=_seconds("poll_interval", poll_interval, 0.001, MAX_SECONDS),
            retry_delay=_seconds("retry_delay", retry_delay, 0.0, MAX_SECONDS),
            max_retry_delay=_seconds("max_retry_delay", max_retry_delay, 0.001, MAX_SECONDS),
        )
        if not callable(handler):
            raise ValidationError(f"handler must be an async callable, got {handler!r}")
        if not (stop is None or isinstance(stop, runtime.Event) or callable(stop)):
            raise ValidationError(f"stop must be an Event, a callable or None, got {stop!r}")
        return await _Run(self, handler, options).run(stop)

    async def _caught_up(self) -> bool:
        """Whether the cursor is at the newest entry (whoever moved it)."""
        cursor = await self.position()
        newest = await latest(self._db)
        return newest is None or (cursor is not None and cursor >= newest)


@dataclass(frozen=True, slots=True)
class _Options:
    batch_size: int
    max_attempts: int
    halt: bool
    transactional: bool
    until_caught_up: bool
    poll_interval: float
    retry_delay: float
    max_retry_delay: float


def _attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"max_attempts must be a positive int, got {value!r}")
    return value


def _on_failure(value: object) -> bool:
    if value not in ("dead-letter", "halt"):
        raise ValidationError(f"on_failure must be 'dead-letter' or 'halt', got {value!r}")
    return value == "halt"


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be a bool, got {value!r}")
    return value


def _stopped(stop: Stop) -> bool:
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

    def __init__(self, consumer: Consumer, handler: Handler, options: _Options) -> None:
        self.consumer = consumer
        self.db = consumer._db
        self.handler = handler
        self.options = options
        self.lease = Lease(self.db, consumer.name, consumer.lease)
        self.what = self.lease.what
        self.delivered = 0
        # Plain mode: the last entry done in this batch and how many of those
        # the handler took, not yet recorded by a cursor advance.
        self.done: str | None = None
        self.pending = 0
        # Wakes the run when an entry commits while it is caught up.
        self.waiter = CommitWaiter(self.db)

    async def run(self, stop: Stop) -> int:
        await self.lease.ensure_row()
        try:
            while not _stopped(stop):
                if not await self.lease.claim():
                    if self.options.until_caught_up and await ride_out(
                        self.db, self.what, self.consumer._caught_up
                    ):
                        return self.delivered
                    await runtime.sleep(self.options.poll_interval)
                    continue
                try:
                    count = await self.batch(stop)
                except LeaseLost:
                    continue
                if count == 0:
                    if self.options.until_caught_up:
                        return self.delivered
                    await self.waiter.wait(self.options.poll_interval)
            return self.delivered
        finally:
            try:
                await self.lease.release()
            finally:
                await self.waiter.aclose()

    async def batch(self, stop: Stop) -> int:
        """Deliver the next entries after the cursor; how many there were."""
        size, cursor = self.options.batch_size, self.lease.cursor
        entries = await ride_out(self.db, self.what, lambda: read_entries(self.db, cursor, size))
        if self.options.transactional:
            for entry in entries:
                if _stopped(stop):
                    break
                await self.deliver_in_transaction(entry)
            return len(entries)
        try:
            for entry in entries:
                if _stopped(stop):
                    break
                if await self.deliver(entry):
                    self.pending += 1
                self.done = entry.versionstamp
        except BaseException:
            await self.flush_on_the_way_out()
            raise
        await self.flush()
        return len(entries)

    async def keep_lease(self) -> None:
        """Before a handler call: renew the lease if it is due (recording the
        entries done so far, in plain mode); :class:`LeaseLost` if it is gone."""
        if self.lease.due():
            if self.done is not None:
                await self.flush()
            else:
                await self.lease.renew()

    async def flush(self) -> None:
        """Advance the cursor past the entries done in this batch."""
        done, pending = self.done, self.pending
        # Whatever happens, these are settled: advanced, or to be delivered again.
        self.done, self.pending = None, 0
        if done is not None:
            await self.lease.advance(done, pending)
            self.delivered += pending

    async def flush_on_the_way_out(self) -> None:
        # While an exception (a cancellation, too) propagates: record what was
        # done if that can be had quickly, without hiding the exception.
        with runtime.shielded(runtime.CLEANUP_TIMEOUT), contextlib.suppress(Error, LeaseLost):
            await self.flush()  # (if not, those entries are delivered again)

    async def pause(self, failures: int) -> None:
        """The backoff after the handler's ``failures``-th failure, keeping
        the lease meanwhile."""
        exponent = min(failures - 1, 64)  # (2 ** 1000 is no float)
        delay = min(self.options.max_retry_delay, self.options.retry_delay * 2**exponent)
        end = runtime.monotonic() + delay
        while (left := end - runtime.monotonic()) > 0:
            await runtime.sleep(min(left, self.lease.seconds / 3))
            await self.keep_lease()

    async def deliver(self, entry: OutboxEntry) -> bool:
        """True when the handler took ``entry``; False when it was dead-lettered."""
        for failures in range(self.options.max_attempts):
            if failures:
                await self.pause(failures)
            await self.keep_lease()
            try:
                await _call(self.handler, entry)
                return True
            except Exception as exc:
                error = exc
        await self.give_up(entry, error)
        return False

    async def give_up(self, entry: OutboxEntry, exc: Exception) -> None:
        """Dead-letter ``entry`` on a statement of its own (plain mode)."""
        error = self.halt_or_error_text(entry, exc)
        tries = 0

        async def store() -> None:
            nonlocal tries
            tries += 1
            # After a lost connection the INSERT may have been done already.
            exists = dead_letters.exists(self.consumer.name, entry.versionstamp)
            if tries > 1 and await self.db.fetch_value(exists) is not None:
                return
            query = dead_letters.insert(
                self.db, self.consumer.name, entry, error, self.options.max_attempts
            )
            await self.db.execute(query)

        try:
            await ride_out(self.db, self.what, store)
        except (DatabaseUnavailable, DatabaseClosed):
            raise
        except Error as failed:
            raise self.not_stored(entry, error, failed) from failed

    def halt_or_error_text(self, entry: OutboxEntry, exc: Exception) -> str:
        error = dead_letters.error_text(exc)
        if self.options.halt:
            raise ConsumerHalted(
                f"{self.what} halted at {entry.versionstamp} after "
                f"{self.options.max_attempts} attempts: {error}",
                entry.versionstamp,
            ) from exc
        return error

    def not_stored(self, entry: OutboxEntry, error: str, failed: Exception) -> ConsumerHalted:
        return ConsumerHalted(
            f"{self.what} stopped at {entry.versionstamp}: its handler failed "
            f"{self.options.max_attempts} times ({error}), and the dead letter could not be "
            f"stored ({failed}); the cursor stays before the entry: fix that and run it again",
            entry.versionstamp,
        )

    async def deliver_in_transaction(self, entry: OutboxEntry) -> None:
        """Deliver ``entry`` in the transaction that advances the cursor past
        it; after the handler's last failure, dead-letter it in one. A lost
        connection is not a failure of the handler's: the lost session is
        ended and the cursor row tells whether the delivery committed."""
        failures = 0
        error: Exception | None = None
        with shared_deadline(self.db.options.reconnect_deadline) as outage:
            while True:
                await self.keep_lease()
                attempt = Attempt(self.db)
                try:
                    if failures < self.options.max_attempts:
                        await self.attempt(attempt, entry)
                    else:
                        assert error is not None
                        await self.dead_letter_in_transaction(attempt, entry, error)
                    return
                except (LeaseLost, ConsumerHalted, DatabaseClosed):
                    raise
                except AlreadyPast:
                    return
                except Exception as exc:
                    if not attempt.lost(exc):
                        if failures == self.options.max_attempts:
                            raise self.not_stored(
                                entry, dead_letters.error_text(error or exc), exc
                            ) from exc
                        failures, error = failures + 1, exc
                        if failures < self.options.max_attempts:
                            await self.pause(failures)
                        continue
                    if not await outage.wait():
                        raise unavailable(self.db, self.what, exc) from exc
                    if await self.settled(attempt, entry):
                        return

    async def attempt(self, attempt: Attempt, entry: OutboxEntry) -> None:
        async with attempt.transaction() as tx:
            await _call(self.handler, entry, tx)
            started = await self.lease.advance_in(tx, entry.versionstamp)
        self.lease.moved(entry.versionstamp, started)
        self.delivered += 1

    async def dead_letter_in_transaction(
        self, attempt: Attempt, entry: OutboxEntry, exc: Exception
    ) -> None:
        error = self.halt_or_error_text(entry, exc)
        async with attempt.transaction() as tx:
            await tx.execute(
                dead_letters.insert(
                    self.db, self.consumer.name, entry, error, self.options.max_attempts
                )
            )
            started = await self.lease.advance_in(tx, entry.versionstamp)
        self.lease.moved(entry.versionstamp, started)

    async def settled(self, attempt: Attempt, entry: OutboxEntry) -> bool:
        """After ``attempt`` lost its connection: whether ``entry``'s delivery
        committed. Its session is ended first, so the answer is final."""

        async def look() -> bool:
            await attempt.end_lost_session()
            return await self.lease.passed(entry.versionstamp)

        return await ride_out(self.db, self.what, look)
