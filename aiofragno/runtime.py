"""The small runtime port: everything asynchronous the core needs, over anyio.

The core imports these names instead of asyncio or trio, so it runs unchanged
under both. Backends that need asyncio itself live in ``aiofragno.backends``.
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
    "acquire_within",
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


async def acquire_within(semaphore: Semaphore, seconds: float) -> bool:
    """Acquire ``semaphore``, waiting at most ``seconds``; False when
    that ran out (and the semaphore was not acquired)."""
    try:
        semaphore.acquire_nowait()  # the common case: no timer, no cancel scope
        return True
    except WouldBlock:
        pass
    # A bare deadline scope, on the event loop's clock: fail_after's wrapper
    # costs as much again, and under load every waiter passes here.
    with CancelScope(deadline=current_time() + seconds) as scope:
        await semaphore.acquire()
    return not scope.cancelled_caught


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
