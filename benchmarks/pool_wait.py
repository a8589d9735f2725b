"""What waiting for a pool connection under a deadline costs, without I/O.

16 tasks share 10 slots (the transfer benchmark's concurrency and pool size):
each takes a slot, yields once to the event loop, and gives it back. Slots are
taken with ``runtime.acquire_within`` — what ``Pool.acquire`` does, bounded by
``acquire_timeout`` — and, for comparison, with a plain ``acquire()`` that
could wait forever. Reported: CPU microseconds per acquire-and-release (best of
``--repeat``), under asyncio.

    python -m benchmarks.pool_wait [-n 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from aiofragno import runtime

TASKS, SLOTS, TIMEOUT = 16, 10, 30.0


async def _cpu_per_take(take: Callable[[runtime.Semaphore], Awaitable[object]], n: int) -> float:
    slots = runtime.Semaphore(SLOTS)
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await take(slots)
            await asyncio.sleep(0)
            slots.release()

    started = time.process_time()
    async with asyncio.TaskGroup() as tg:
        for _ in range(TASKS):
            tg.create_task(worker())
    return (time.process_time() - started) / n * 1e6


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pool_wait")
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    ways: dict[str, Callable[[runtime.Semaphore], Awaitable[object]]] = {
        "acquire_within (deadline)": lambda s: runtime.acquire_within(s, TIMEOUT),
        "acquire() (no deadline)": lambda s: s.acquire(),
    }
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.repeat):
        for name, take in ways.items():
            best[name] = min(best[name], await _cpu_per_take(take, args.n))
    print(f"{TASKS} tasks, {SLOTS} slots: CPU us per acquire + release (best of {args.repeat})")
    for name, us in best.items():
        print(f"  {name:28} {us:6.2f}")


if __name__ == "__main__":
    asyncio.run(main())
