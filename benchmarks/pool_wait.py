"""What waiting for a pool connection under a deadline costs, without I/O.

16 tasks share 10 slots (the transfer benchmark's concurrency and pool size):
each takes a slot, yields once to the event loop, and gives it back. Three
ways of taking a slot, side by side:

* ``Slots`` (``aiofragno.slots``, what ``Pool.acquire`` and SQLite's write
  gate use): bounded by ``acquire_timeout``, with one alarm per Slots instead
  of a timer per wait;
* an anyio ``Semaphore`` inside a cancel scope with a deadline: the timer per
  wait that ``Pool.acquire`` used before;
* an anyio ``Semaphore`` with no deadline: what a wait that could last
  forever costs.

Reported: CPU microseconds per acquire-and-release (best of ``--repeat``),
under asyncio and under trio.

    python -m benchmarks.pool_wait [-n 20000] [--repeat 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel

from aiofragno.slots import Slots

from . import _common as common

TASKS, SLOTS, TIMEOUT = 16, 10, 30.0


class Scoped:
    """A semaphore waited on in a deadline scope when none is free."""

    def __init__(self) -> None:
        self.semaphore = anyio.Semaphore(SLOTS)

    async def acquire(self) -> bool:
        try:
            self.semaphore.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        with anyio.CancelScope(deadline=anyio.current_time() + TIMEOUT) as scope:
            await self.semaphore.acquire()
        return not scope.cancelled_caught

    def release(self) -> None:
        self.semaphore.release()


class Untimed(Scoped):
    async def acquire(self) -> bool:
        await self.semaphore.acquire()
        return True


WAYS: dict[str, Callable[[], Any]] = {
    "Slots (one alarm)": lambda: Slots(SLOTS, TIMEOUT),
    "deadline scope per wait": Scoped,
    "no deadline": Untimed,
}


async def _cpu_per_take(make: Callable[[], Any], n: int) -> float:
    slots = make()
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            assert await slots.acquire()
            await anyio.lowlevel.checkpoint()
            slots.release()

    started = time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(TASKS):
            tg.start_soon(worker)
    return (time.process_time() - started) / n * 1e6


async def measure(n: int, repeat: int) -> dict[str, float]:
    best = dict.fromkeys(WAYS, float("inf"))
    for _ in range(repeat):
        for name, make in WAYS.items():
            best[name] = min(best[name], await _cpu_per_take(make, n))
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pool_wait")
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    print(f"{TASKS} tasks, {SLOTS} slots: CPU us per acquire + release (best of {args.repeat})")
    results: dict[str, dict[str, float]] = {}
    for backend in ("asyncio", "trio"):
        results[backend] = anyio.run(measure, args.n, args.repeat, backend=backend)
        for name, us in results[backend].items():
            print(f"  {backend:8} {name:24} {us:6.2f}")
    common.write_json(
        args.json or common.default_json_path("pool_wait"),
        {
            "benchmark": "pool_wait",
            "tasks": TASKS,
            "slots": SLOTS,
            "n": args.n,
            "repeat": args.repeat,
            "cpu_us_per_take": results,
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    main()
