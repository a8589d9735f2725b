"""Reading the outbox: pages in versionstamp order, and a tail that follows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .. import runtime
from ..sql import Fragment, Identifier, sql
from .consumer import Consumer
from .entry import OutboxEntry, entries_from_rows
from .queries import COLUMNS, check_limit, latest, read_entries
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
        return await read_entries(self._db, self._db, after, check_limit(limit))

    async def tail(
        self, after: str | None = None, *, poll_interval: float = 0.5, batch_size: int = 1000
    ) -> AsyncIterator[OutboxEntry]:
        """Every entry after ``after``, then new ones as they commit (checking
        every ``poll_interval`` seconds when caught up). Runs until cancelled
        or until you stop iterating."""
        if after is not None:
            check_versionstamp(after)
        check_limit(batch_size, "batch_size")
        while True:
            entries = await read_entries(self._db, self._db, after, batch_size)
            for entry in entries:
                yield entry
            if entries:
                after = entries[-1].versionstamp
            if len(entries) < batch_size:
                await runtime.sleep(poll_interval)

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

    def consumer(self, name: str, *, lease: float = 30.0) -> Consumer:
        """A durable consumer called ``name`` (its cursor lives in the database)."""
        return Consumer(self._db, name, lease=lease)
