"""Slots: a semaphore whose waiters are served first come first served and
give up after a timeout — what the pool hands out connections with, and
SQLite's write gate admits writers with.

The usual way to bound a wait, a cancel scope with a deadline around it, arms
and disarms a timer for every wait; under a busy pool that was most of what a
wait cost (``python -m benchmarks.pool_wait``). Here a waiter waits without a
timer of its own. One alarm per Slots, set for the earliest deadline among the
waiters, expires those whose time is up and sets itself again for the next.
Since every waiter waits for the same timeout, in arrival order, the earliest
deadline is the first waiter's, and in a busy pool the alarm goes off about
once per timeout, however many waits there were.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from . import runtime


class Alarm:
    """One timer for a queue whose waiters give up at deadlines: it calls
    ``ring`` at the time it was set for, and again after the delay ``ring``
    returns (None: not again until :meth:`set`). Set at most once per event
    loop: an alarm dies with its loop, so in another one (a Database used
    under a second ``asyncio.run``) it counts as not set."""

    __slots__ = ("_loop", "_ring")

    def __init__(self, ring: Callable[[], float | None]) -> None:
        self._ring = ring
        self._loop: object = None  # the event loop it is set in, if any

    def set(self, delay: float) -> None:
        """Ring in ``delay`` seconds, unless already set in this event loop
        (for an earlier time: every waiter waits as long, in arrival order)."""
        loop = runtime.running_loop()
        if self._loop is not loop:
            self._loop = loop
            runtime.call_later(delay, self._go_off)

    def _go_off(self) -> None:
        self._loop = None
        delay = self._ring()
        if delay is not None:
            self.set(delay)


class _Waiter:
    __slots__ = ("deadline", "event", "granted")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.event = runtime.new_waiting()
        # None while waiting; True once handed a slot; False once it gave up
        # (timed out or cancelled).
        self.granted: bool | None = None


class Slots:
    """At most ``size`` holders at a time.

    Guarantees: a free slot goes to the longest-waiting waiter; a waiter that
    has waited ``timeout`` seconds of the event loop's clock gets none (its
    :meth:`acquire` returns False when the alarm runs, at its deadline); a
    cancelled waiter takes no slot with it, even one handed to it just
    before."""

    def __init__(self, size: int, timeout: float) -> None:
        self._free = size
        self._timeout = timeout
        self._waiters: deque[_Waiter] = deque()
        self._alarm = Alarm(self._expire)

    @property
    def free(self) -> int:
        return self._free

    def take(self) -> bool:
        """Take a free slot now, if there is one and nobody waits for it:
        :meth:`acquire` without a coroutine, for the caller's fast path."""
        if self._free and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> bool:
        """Take a slot, waiting at most ``timeout`` seconds; False (and no
        slot) when that ran out. A free slot is taken without yielding to the
        event loop."""
        if self.take():
            return True
        waiter = _Waiter(runtime.loop_time() + self._timeout)
        self._waiters.append(waiter)
        self._alarm.set(self._timeout)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.granted:  # handed a slot as it was cancelled: pass it on
                self.release()
            waiter.granted = False
            raise
        return bool(waiter.granted)

    def release(self) -> None:
        """Give a slot back: to the longest-waiting waiter, if any."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if waiter.granted is None:
                waiter.granted = True
                waiter.event.set()
                return
        self._free += 1

    def _expire(self) -> float | None:
        """The alarm: wake the waiters whose time is up; the delay to the
        first of the others' deadlines. (Waiters leave the front of the queue
        without touching the alarm, so it may go off before anyone's time.)"""
        now = runtime.loop_time()
        waiters = self._waiters
        while waiters and (waiters[0].granted is not None or waiters[0].deadline <= now):
            waiter = waiters.popleft()
            if waiter.granted is None:
                waiter.granted = False
                waiter.event.set()
        return waiters[0].deadline - now if waiters else None
