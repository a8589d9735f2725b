"""An asyncio-only sink used from trio: every call runs on a private asyncio
loop in a helper thread (the same bridge that carries asyncpg and asyncmy,
:mod:`aiofragno.backends.asyncio_bridge`), which stops when the sink closes.
Cancelling the trio caller cancels the call on the loop and waits for it."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from ..entry import OutboxEntry

if TYPE_CHECKING:
    from ...backends.asyncio_bridge import AsyncioLoopThread
    from .sink import BrokerSink


class BridgedSink:
    """``sink``, reached from trio through a loop thread of its own."""

    asyncio_only = False

    def __init__(self, sink: BrokerSink) -> None:
        from ...backends.asyncio_bridge import AsyncioLoopThread

        self.sink = sink
        self._loop: AsyncioLoopThread = AsyncioLoopThread()

    async def last_published(self) -> str | None:
        return await self._loop.run(self.sink.last_published)

    async def publish_batch(self, entries: Sequence[OutboxEntry]) -> None:
        await self._loop.run(partial(self.sink.publish_batch, entries))

    async def close(self) -> None:
        try:
            await self._loop.run(self.sink.close)
        finally:
            await self._loop.stop()
