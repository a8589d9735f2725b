"""A value handed from any thread to the one task waiting for it — how a
SQLite connection's thread answers the task that called it.

The thread never touches the event loop's state: it hands the loop a
callback (``call_soon_threadsafe`` under asyncio, the run's token under
trio), which settles the waiting task there. Under asyncio that callback
settles a future of the loop: a third less CPU per reply than an
``anyio.Event``, and every SQLite statement batch waits for one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

from ..runtime import asyncio_loop

T = TypeVar("T")

Outcome = tuple[bool, Any]  # (True, the value) or (False, the exception to raise)


class Reply(Generic[T]):
    """One value (or exception) for the task that made the reply: made and
    waited for in that task, sent once from any thread.

    ``settled``, if given, is called in the event loop with the value as it
    arrives, before the task is woken — also if the task was cancelled
    meanwhile (so it may hand on something the value frees). It must not
    raise."""

    __slots__ = ("_future", "_outcome", "_settled", "_trio", "_wake")

    def __init__(self, settled: Callable[[T], object] | None = None) -> None:
        self._settled = settled
        loop = asyncio_loop()
        if loop is not None:
            self._future: asyncio.Future[Outcome] | None = loop.create_future()
            self._wake: Callable[[Callable[[], object]], object] = loop.call_soon_threadsafe
        else:
            import trio

            self._future = None
            self._trio = trio.Event()
            self._outcome: Outcome = (False, None)
            self._wake = trio.lowlevel.current_trio_token().run_sync_soon

    def send(self, ok: bool, value: Any) -> None:
        """From any thread: ``value`` (``ok``) or the exception ``value``
        (not ``ok``) for the waiting task."""
        # RuntimeError: the event loop is gone, so nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            self._wake(partial(self._arrive, (ok, value)))

    def _arrive(self, outcome: Outcome) -> None:
        ok, value = outcome
        if ok and self._settled is not None:
            self._settled(value)
        future = self._future
        if future is not None:
            if not future.done():  # (else the awaiting task was cancelled)
                future.set_result(outcome)
        else:
            self._outcome = outcome
            self._trio.set()

    async def wait(self) -> T:
        """The value sent, or the exception sent raised here."""
        if self._future is not None:
            ok, value = await self._future
        else:
            await self._trio.wait()
            ok, value = self._outcome
        if not ok:
            raise value
        result: T = value
        return result
