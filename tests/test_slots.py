"""Slots (aiofragno.slots), under asyncio and trio: first come first served,
waiters give up at their own deadline although only one alarm runs, and no
slot is lost to a waiter that gave up or was cancelled."""

from __future__ import annotations

import asyncio
import time

import anyio
import pytest
import trio
import trio.testing

from aiofragno.slots import Slots

# Timing tolerances: a waiter must not give up before its deadline, nor much
# after it (an alarm running late, or not at all, would).
EARLY = 0.02
LATE = 0.25


async def wait_for(slots: Slots, name: str, log: list[tuple[str, bool, float]]) -> None:
    started = anyio.current_time()
    got = await slots.acquire()
    log.append((name, got, anyio.current_time() - started))


@pytest.mark.anyio
async def test_free_slots_are_taken_at_once_then_waiters_in_arrival_order() -> None:
    slots = Slots(2, timeout=5)
    assert await slots.acquire() and await slots.acquire()
    assert slots.free == 0
    log: list[tuple[str, bool, float]] = []
    async with anyio.create_task_group() as tg:
        for name in "abcd":
            tg.start_soon(wait_for, slots, name, log)
            await anyio.wait_all_tasks_blocked()
        for _ in "abcd":
            slots.release()
            await anyio.wait_all_tasks_blocked()
    assert [(name, got) for name, got, _ in log] == [(n, True) for n in "abcd"]
    for _ in range(2):
        slots.release()
    assert slots.free == 2


@pytest.mark.anyio
async def test_take_never_jumps_the_queue() -> None:
    """``take`` (the pool's fast path, without a coroutine) takes a free slot
    only while nobody waits: a slot freed with a waiter queued is the
    waiter's, as with ``acquire``."""
    slots = Slots(1, timeout=5)
    assert slots.take()
    assert not slots.take() and slots.free == 0
    log: list[tuple[str, bool, float]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for, slots, "waiter", log)
        await anyio.wait_all_tasks_blocked()
        slots.release()  # handed to the waiter, not left free
        assert not slots.take()
    assert [(name, got) for name, got, _ in log] == [("waiter", True)]
    slots.release()
    assert slots.take() and slots.free == 0


@pytest.mark.anyio
async def test_each_waiter_gives_up_at_its_own_deadline() -> None:
    """Waiters that arrived at different times time out in turn, each about
    ``timeout`` after it arrived: the one alarm sets itself again for the next."""
    timeout = 0.3
    slots = Slots(1, timeout)
    assert await slots.acquire()
    log: list[tuple[str, bool, float]] = []
    with anyio.fail_after(5):  # (an alarm that never goes off again must not hang here)
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for, slots, "first", log)
            await anyio.sleep(0.15)
            tg.start_soon(wait_for, slots, "second", log)
    assert [(name, got) for name, got, _ in log] == [("first", False), ("second", False)]
    for _, _, waited in log:
        assert timeout - EARLY <= waited < timeout + LATE, log
    slots.release()
    assert slots.free == 1  # nobody who gave up kept a slot


@pytest.mark.anyio
async def test_alarm_set_for_a_waiter_that_was_served_still_expires_the_next() -> None:
    """The alarm was set for the first waiter, who got a slot instead; a
    waiter that came later still gives up at its own deadline, not at the
    first one's and not never."""
    timeout = 0.3
    slots = Slots(1, timeout)
    assert await slots.acquire()
    log: list[tuple[str, bool, float]] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for, slots, "served", log)
            await anyio.sleep(0.1)
            slots.release()  # to "served", which keeps it
            await anyio.sleep(0.1)
            tg.start_soon(wait_for, slots, "late", log)
    assert [(name, got) for name, got, _ in log] == [("served", True), ("late", False)]
    waited = log[1][2]
    assert timeout - EARLY <= waited < timeout + LATE, log


@pytest.mark.anyio
async def test_a_timed_out_waiter_is_skipped_by_the_next_release() -> None:
    slots = Slots(1, timeout=0.1)
    assert await slots.acquire()
    log: list[tuple[str, bool, float]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for, slots, "gives up", log)
        await anyio.sleep(0.3)
        assert log and not log[0][1]
        tg.start_soon(wait_for, slots, "waits", log)
        await anyio.wait_all_tasks_blocked()
        slots.release()
    assert [(name, got) for name, got, _ in log] == [("gives up", False), ("waits", True)]
    assert slots.free == 0


@pytest.mark.anyio
async def test_cancelled_waiters_take_no_slot() -> None:
    slots = Slots(1, timeout=5)
    assert await slots.acquire()
    with anyio.move_on_after(0.1):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(slots.acquire)
    slots.release()
    assert slots.free == 1


@pytest.mark.anyio
async def test_waiter_cancelled_as_a_slot_is_handed_to_it_passes_it_on() -> None:
    """The waiter is cancelled, and before it runs again the slot is handed
    to it: it must pass the slot on to the next waiter, not keep it."""
    slots = Slots(1, timeout=5)
    assert await slots.acquire()
    log: list[tuple[str, bool, float]] = []
    cancelled = anyio.CancelScope()

    async def cancellable() -> None:
        with cancelled:
            await wait_for(slots, "cancelled", log)

    async with anyio.create_task_group() as tg:
        tg.start_soon(cancellable)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(wait_for, slots, "next", log)
        await anyio.wait_all_tasks_blocked()
        cancelled.cancel()
        slots.release()  # (no await in between: the cancelled waiter has not run)
    assert cancelled.cancelled_caught
    assert [(name, got) for name, got, _ in log] == [("next", True)]
    slots.release()
    assert slots.free == 1


async def two_waiters_time_out() -> list[bool]:
    """Two waiters, the second arriving later: the alarm set for the first
    goes off in the event loop itself and sets the next one from there."""
    slots = Slots(1, timeout=0.2)
    assert await slots.acquire()
    outcomes: list[bool] = []

    async def wait() -> None:
        outcomes.append(await slots.acquire())

    with anyio.fail_after(5):  # (an alarm not set again would hang)
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.1)
            tg.start_soon(wait)
    return outcomes


def test_alarm_under_asyncio_run() -> None:
    """Under a bare ``asyncio.run``, as in an application: the alarm's
    callback runs in no task, where the runtime cannot be told from the
    current task, and must still set the next alarm. (anyio's test runner
    marks the thread with its runtime, which hid this from the tests above.)"""
    assert asyncio.run(two_waiters_time_out()) == [False, False]


def test_alarm_under_trio_run() -> None:
    assert trio.run(two_waiters_time_out) == [False, False]


def test_deadlines_count_on_the_event_loops_clock() -> None:
    """The alarm counts on the loop's clock, so the deadlines must too: under
    trio's mock clock (pytest-trio's autojump_clock) a 5 s timeout passes at
    once, not after 5 real seconds of alarms that find it not due yet."""

    async def one_waiter() -> bool:
        slots = Slots(1, timeout=5)
        assert await slots.acquire()
        return await slots.acquire()

    started = time.monotonic()
    assert trio.run(one_waiter, clock=trio.testing.MockClock(autojump_threshold=0)) is False
    assert time.monotonic() - started < 1


def test_an_alarm_lost_with_its_event_loop_is_set_again_in_the_next() -> None:
    """A loop that ends drops the alarm it held; Slots used again under a
    second asyncio.run (a Database kept between runs) must set a new one."""
    slots = Slots(1, timeout=0.2)

    async def first() -> None:
        assert await slots.acquire()  # (held for good)
        with anyio.move_on_after(0.05):  # a waiter that leaves the alarm set
            await slots.acquire()

    async def second() -> bool:
        with anyio.fail_after(5):
            return await slots.acquire()

    asyncio.run(first())
    assert asyncio.run(second()) is False
