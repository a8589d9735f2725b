"""The small runtime port: everything asynchronous the core needs, over anyio.

The core imports these names instead of asyncio or trio, so it runs unchanged
under both. Backends that need asyncio itself live in ``aiofragno.backends``.
The one thing anyio does not offer, a timer that calls a function without a
task of its own (:func:`call_later`), is built here from each runtime's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

import anyio
import sniffio
from anyio import (
    CancelScope,
    Event,
    Lock,
    Semaphore,
    WouldBlock,
    current_time,
    get_cancelled_exc_class,
    move_on_after,
    sleep,
    to_thread,
)

__all__ = [
    "CancelScope",
    "Event",
    "Lock",
    "Semaphore",
    "WouldBlock",
    "call_later",
    "current_runtime",
    "current_time",
    "get_cancelled_exc_class",
    "monotonic",
    "move_on_after",
    "run_sync_in_thread",
    "shielded",
    "sleep",
]

T = TypeVar("T")


def current_runtime() -> str:
    """``"asyncio"`` or ``"trio"``: the event loop running the current task."""
    return sniffio.current_async_library()


def monotonic() -> float:
    """Seconds on a monotonic clock (the same one in every runtime)."""
    return time.monotonic()


def call_later(delay: float, callback: Callable[[], object]) -> None:
    """Call ``callback`` in the event loop's thread after ``delay`` seconds,
    from no task of the caller's: under asyncio a timer of the loop, under
    trio a system task (so it must not raise). It cannot be cancelled: make
    the callback find out whether it is still wanted. May be called from
    such a callback, too."""
    # (Not sniffio: in an asyncio loop callback there is no task for it to
    # recognize. A thread runs an asyncio loop, or else it is trio's.)
    import asyncio  # noqa: TID251  (the asyncio timer is this port's job)

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        loop.call_later(delay, callback)
        return
    import trio

    async def later() -> None:
        await trio.sleep(delay)
        callback()

    trio.lowlevel.spawn_system_task(later)


def shielded(timeout: float | None = None) -> AbstractContextManager[CancelScope]:
    """A scope that outside cancellation cannot interrupt — for cleanup that must
    finish (rollback, returning a connection) — bounded by ``timeout`` seconds
    so a dead peer cannot hang it."""
    if timeout is None:
        return CancelScope(shield=True)
    return move_on_after(timeout, shield=True)


async def run_sync_in_thread(
    func: Callable[[], T], *, limiter: anyio.CapacityLimiter | None = None
) -> T:
    """Run blocking ``func`` in a worker thread; the caller waits even if
    cancelled, so ``func`` never outlives the await."""
    return await to_thread.run_sync(func, limiter=limiter)
