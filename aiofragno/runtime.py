"""The small runtime port: everything asynchronous the core needs, over anyio.

The core imports these names instead of asyncio or trio, so it runs unchanged
under both. Backends that need asyncio itself live in ``aiofragno.backends``.
What anyio does not offer, a timer that calls a function without a task of
its own (:func:`call_later`) and the clock it counts on, is built here from
each runtime's own.
"""

from __future__ import annotations

import asyncio  # noqa: TID251  (the loop's own clock and timer: see call_later)
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

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
    "CLEANUP_TIMEOUT",
    "CancelScope",
    "Event",
    "Lock",
    "Semaphore",
    "Waiting",
    "WouldBlock",
    "asyncio_loop",
    "call_later",
    "current_runtime",
    "current_time",
    "get_cancelled_exc_class",
    "loop_time",
    "monotonic",
    "move_on_after",
    "new_waiting",
    "run_sync_in_thread",
    "running_loop",
    "shielded",
    "sleep",
]

T = TypeVar("T")


def current_runtime() -> str:
    """``"asyncio"`` or ``"trio"``: the event loop running the current task."""
    return sniffio.current_async_library()


# Seconds on a monotonic clock (the same one in every runtime).
monotonic: Callable[[], float] = time.monotonic


# The event loop's own clock and timer, which anyio does not offer: they are
# needed in a callback of the loop too, where no task tells sniffio (or
# anyio) which runtime this is. A thread that runs an asyncio loop is
# asyncio's; any other is trio's.


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The asyncio loop running in this thread, or None: what
    :func:`running_loop` returns under asyncio, for a hot path's check
    against it. None under trio, also where trio runs as a guest of an
    asyncio loop (trio names itself to sniffio while it runs; the host's
    loop is no loop of its tasks). No exception raised and caught per call."""
    if sniffio.thread_local.name == "trio":
        return None
    return asyncio._get_running_loop()


asyncio_loop = _asyncio_loop


def running_loop() -> object:
    """The event loop running in this thread: the asyncio loop, or the trio
    run (its token). From a task or from a :func:`call_later` callback."""
    loop = _asyncio_loop()
    if loop is not None:
        return loop
    import trio

    return trio.lowlevel.current_trio_token()


class Waiting(Protocol):
    """An event to wait for once: what :func:`new_waiting` makes."""

    def set(self) -> None: ...

    async def wait(self) -> object: ...


def new_waiting() -> Waiting:
    """An event for one waiter on a hot path (a pool's checkout, SQLite's
    write gate): the runtime's own — ``asyncio.Event`` costs a quarter of
    an ``anyio.Event``, which looks its backend up when made. Made and
    waited for in the same task; set from the same event loop."""
    if _asyncio_loop() is not None:
        return asyncio.Event()
    import trio

    return trio.Event()


def loop_time() -> float:
    """Seconds on the clock of the event loop running in this thread — what
    :func:`call_later` counts on (under trio a test's mock clock, say)."""
    loop = _asyncio_loop()
    if loop is not None:
        return loop.time()
    import trio

    return trio.current_time()


def call_later(delay: float, callback: Callable[[], object]) -> None:
    """Call ``callback`` in this thread's event loop after ``delay`` seconds
    of :func:`loop_time`, from no task of the caller's: under asyncio a timer
    of the loop, under trio a system task (so it must not raise). It cannot
    be cancelled, and it is dropped if the loop ends first: make the callback
    find out whether it is still wanted, and its setter notice a loop that
    ended (:func:`running_loop`)."""
    loop = _asyncio_loop()
    if loop is not None:
        loop.call_later(delay, callback)
        return
    import trio

    async def later() -> None:
        await trio.sleep(delay)
        callback()

    trio.lowlevel.spawn_system_task(later)


# How long cleanup (a rollback, a reset, closing a connection) may take in a
# shielded scope: it must finish even when the task is being cancelled, but
# must not hang on a dead peer.
CLEANUP_TIMEOUT = 5.0


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
