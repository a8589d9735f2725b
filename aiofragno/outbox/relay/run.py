"""The relay's loop: outbox entries after the broker's newest one, published
in versionstamp order, batch after batch.

The relay keeps no cursor of its own: the broker is the cursor. It starts
(and, after an :class:`OutOfStep`, starts again) from
:meth:`BrokerSink.last_published`, and every sink stores a prefix of each
batch, so a relay stopped anywhere — an error, a cancellation, SIGKILL —
resumes exactly after the last entry the broker holds: nothing lost, nothing
sent twice.
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import TYPE_CHECKING

from ... import runtime
from ...errors import ValidationError
from ..consumer import MAX_SECONDS, Stop, _flag, _seconds, _stopped
from ..queries import check_limit, holds, passed_by_promotion, read_entries
from ..riding import ride_out
from ..versionstamp import check_versionstamp
from .sink import BrokerSink, OutOfStep, RelayError

if TYPE_CHECKING:
    from ...engine import Engine


async def relay(
    db: Engine,
    sink: BrokerSink,
    *,
    batch_size: int = 1000,
    poll_interval: float = 0.5,
    until_caught_up: bool = False,
    stop: Stop = None,
    after: str | None = None,
) -> int:
    """Publish outbox entries to ``sink`` (see :meth:`OutboxReader.relay`);
    closes ``sink`` when it returns or raises. Returns how many it published."""
    batch_size = check_limit(batch_size, "batch_size")
    poll_interval = _seconds("poll_interval", poll_interval, 0.001, MAX_SECONDS)
    until_caught_up = _flag("until_caught_up", until_caught_up)
    if after is not None:
        check_versionstamp(after, "after")
    if not (stop is None or isinstance(stop, runtime.Event) or callable(stop)):
        raise ValidationError(f"stop must be an Event, a callable or None, got {stop!r}")
    if not isinstance(sink, BrokerSink):
        raise ValidationError(f"sink must be a BrokerSink (NatsSink, RedisSink...), got {sink!r}")
    if sink.asyncio_only and runtime.current_runtime() != "asyncio":
        from .bridge import BridgedSink

        sink = BridgedSink(sink)
    try:
        published = await _Relay(db, sink, batch_size, after).run(
            poll_interval, until_caught_up, stop
        )
    except BaseException:
        # (A failure to close must not hide why the relay stopped.)
        with runtime.shielded(runtime.CLEANUP_TIMEOUT), contextlib.suppress(Exception):
            await sink.close()
        raise
    with runtime.shielded(runtime.CLEANUP_TIMEOUT):
        await sink.close()
    return published


class _Relay:
    def __init__(self, db: Engine, sink: BrokerSink, batch_size: int, after: str | None) -> None:
        self.db = db
        self.sink = sink
        self.batch_size = batch_size
        self.after = after  # where to start while the broker holds nothing
        self.published = 0

    async def resume_point(self) -> str | None:
        """After the broker's newest entry, which must be in the outbox: if
        it is not (the relay points at another database's stream, or the
        database was restored from before it), entries reusing its
        versions would be skipped — unless a promotion lost it and the
        entries numbered since are above it (:func:`passed_by_promotion`)."""
        last = await self.sink.last_published()
        if last is None:
            return self.after
        if not await ride_out(self.db, "the outbox relay", partial(self._resumable, last)):
            raise RelayError(
                f"the broker's newest entry, {last}, is not in this database's outbox: "
                "is the relay pointed at the right stream (or was the database restored "
                "from a backup older than the stream)?"
            )
        return last

    async def _resumable(self, last: str) -> bool:
        return await holds(self.db, last) or await passed_by_promotion(self.db, last)

    async def run(self, poll_interval: float, until_caught_up: bool, stop: Stop) -> int:
        cursor = await self.resume_point()
        while not _stopped(stop):
            entries = await ride_out(
                self.db,
                "the outbox relay",
                partial(read_entries, self.db, cursor, self.batch_size),
            )
            if entries:
                try:
                    await self.sink.publish_batch(entries)
                except OutOfStep:
                    cursor = await self.resume_point()
                    continue
                cursor = entries[-1].versionstamp
                self.published += len(entries)
            if len(entries) < self.batch_size:
                if until_caught_up:
                    break
                await runtime.sleep(poll_interval)
        return self.published
