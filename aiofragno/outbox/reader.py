"""Reading the outbox: pages in versionstamp order, and a tail that follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

from ..errors import ValidationError
from ..sql import Fragment, Identifier, sql
from .consumer import Consumer, Stop
from .entry import OutboxEntry, entries_from_rows
from .push import CommitWaiter
from .queries import COLUMNS, check_limit, latest, read_entries
from .relay.run import relay
from .relay.sink import BrokerSink
from .retention import BATCH_SIZE, KEEP_FOR, KEEP_LAST, Retention
from .retention import horizon as read_horizon
from .retention import prune as prune_entries
from .retention import run_pruner as prune_every
from .riding import ride_out
from .ticks import sources, tick
from .versionstamp import check_versionstamp

if TYPE_CHECKING:
    from ..engine import Engine


class OutboxReader:
    """``db.outbox``: read committed units of work in commit order."""

    def __init__(self, db: Engine) -> None:
        self._db = db

    async def list(self, after: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        """Up to ``limit`` (1..10000) entries with versionstamp > ``after``."""
        if after is not None:
            check_versionstamp(after)
        return await read_entries(self._db, after, check_limit(limit))

    async def tail(
        self, after: str | None = None, *, poll_interval: float = 0.5, batch_size: int = 1000
    ) -> AsyncIterator[OutboxEntry]:
        """Every entry after ``after``, then new ones as they commit. When
        caught up it waits for the next commit: on PostgreSQL it is woken by
        a notification (LISTEN, on a connection of its own opened the first
        time it waits), and in any case it reads again every
        ``poll_interval`` seconds. Runs until cancelled or until you stop
        iterating. A lost connection (a failover) is ridden out as a
        consumer's is: each read again until ``reconnect_deadline``, then
        :class:`~aiofragno.errors.DatabaseUnavailable`.
        :class:`~aiofragno.OutboxCursorPruned` if entries after ``after``
        were pruned."""
        if after is not None:
            check_versionstamp(after)
        check_limit(batch_size, "batch_size")
        waiter = CommitWaiter(self._db)
        try:
            while True:
                read = partial(read_entries, self._db, after, batch_size)
                entries = await ride_out(self._db, "the outbox tail", read)
                for entry in entries:
                    yield entry
                if entries:
                    after = entries[-1].versionstamp
                if len(entries) < batch_size:
                    await waiter.wait(poll_interval)
        finally:
            await waiter.aclose()

    async def find(self, uow_id: str) -> OutboxEntry | None:
        """The entry a unit of work with idempotency key ``uow_id`` committed,
        if any. Under the "ticks" strategy this ticks first (waiting for a
        tick in progress), so the entry of a unit that has committed is
        found with its versionstamp."""
        await tick(self._db, wait=True)
        query = Fragment.join(
            [
                sql(
                    "SELECT {cols} FROM {t} WHERE {u} = {uow}",
                    cols=COLUMNS,
                    t=source,
                    u=Identifier("uow_id"),
                    uow=uow_id,
                )
                for source in sources(self._db)
            ],
            " UNION ALL ",
        )
        rows = await self._db.fetch(query)
        decode = self._db.codec.decoder("timestamp")
        return entries_from_rows(rows, decode)[0] if rows else None

    async def latest(self) -> str | None:
        """The versionstamp of the newest entry, or None when empty."""
        return await latest(self._db)

    async def prune(
        self,
        *,
        keep_last: int = KEEP_LAST,
        keep_for: float | timedelta = KEEP_FOR,
        batch_size: int = BATCH_SIZE,
    ) -> int:
        """Delete the oldest entries that every consumer has passed, except
        the newest ``keep_last`` and those younger than ``keep_for`` (seconds
        or a timedelta), in transactions of at most ``batch_size`` deletes
        that never wait for writers nor make them wait. Returns how many
        were deleted. Readers whose cursor it passed get
        :class:`~aiofragno.OutboxCursorPruned` (see docs/outbox.md,
        Retention)."""
        return await prune_entries(self._db, Retention.checked(keep_last, keep_for, batch_size))

    async def run_pruner(
        self,
        *,
        every: float = 60.0,
        keep_last: int = KEEP_LAST,
        keep_for: float | timedelta = KEEP_FOR,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        """:meth:`prune` now and then every ``every`` seconds, until
        cancelled: run it as a task of your application's."""
        retention = Retention.checked(keep_last, keep_for, batch_size)
        if isinstance(every, bool) or not isinstance(every, int | float) or not 0 < every <= 86_400:
            raise ValidationError(f"every must be a number of seconds in (0, 86400], got {every!r}")
        await prune_every(self._db, retention, float(every))

    async def horizon(self) -> str | None:
        """The versionstamp of the newest entry :meth:`prune` deleted (a
        cursor older than it is refused), or None if nothing was pruned."""
        return await read_horizon(self._db)

    def consumer(self, name: str, *, lease: float = 30.0) -> Consumer:
        """A durable consumer called ``name`` (its cursor lives in the database)."""
        return Consumer(self._db, name, lease=lease)

    async def relay(
        self,
        sink: BrokerSink,
        *,
        batch_size: int = 1000,
        poll_interval: float = 0.5,
        until_caught_up: bool = False,
        stop: Stop = None,
        after: str | None = None,
    ) -> int:
        """Publish entries to a message broker, in versionstamp order, until
        ``stop`` is set / returns True or — with ``until_caught_up`` — until
        none is left; returns how many this call published. ``sink``:
        :class:`~aiofragno.outbox.relay.NatsSink`,
        :class:`~aiofragno.outbox.relay.RedisSink` or your own
        :class:`~aiofragno.outbox.relay.BrokerSink`; it is closed on return.

        Starts after the newest entry the broker holds (so a relay stopped
        anywhere, even killed, resumes with nothing lost and nothing sent
        twice), or after ``after`` while the broker holds none. Reads
        ``batch_size`` entries at a time, checking every ``poll_interval``
        seconds when caught up. Raises :class:`RelayError` when the broker
        refuses or loses a message, and :class:`DatabaseUnavailable` when the
        database stayed out of reach past ``reconnect_deadline``."""
        return await relay(
            self._db,
            sink,
            batch_size=batch_size,
            poll_interval=poll_interval,
            until_caught_up=until_caught_up,
            stop=stop,
            after=after,
        )
