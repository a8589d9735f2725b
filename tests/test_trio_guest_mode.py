"""Trio run as a guest of an asyncio loop (``trio.lowlevel.start_guest_run``):
inside it, asyncio's running-loop lookup finds the host's loop, which is no
loop of trio's tasks. The runtime port asks sniffio first, so what it picks
for trio (SQLite's worker wake-up, waiters of the pool and the write gate, the
alarm of their timeouts) stays trio's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import trio

import aiofragno as af
from aiofragno.slots import Slots


def _as_guest(main: Any) -> Any:
    """``main()`` run by trio as a guest of a new asyncio loop: its outcome."""

    async def host() -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
            host_uses_signal_set_wakeup_fd=True,
        )
        return await asyncio.wait_for(done, 30)

    return asyncio.run(host()).unwrap()


def test_sqlite_reads_and_writes_from_a_guest_run(tmp_path: Path) -> None:
    schema = af.Schema("guest", af.Table("notes", af.Column("text", "string")))

    async def main() -> list[str]:
        async with af.connect(f"sqlite:///{tmp_path / 'guest.db'}", pool_size=2) as db:
            await db.migrate(schema)

            async def write(n: int) -> None:
                async def unit(uow: af.UnitOfWork) -> None:
                    uow.create("notes", {"text": f"n{n}"})

                await db.execute_uow(unit, schema=schema)

            async with trio.open_nursery() as nursery:  # (writers queue at the write gate)
                for n in range(6):
                    nursery.start_soon(write, n)
            rows = await db.fetch(
                af.sql(
                    "SELECT {t} FROM {n}",
                    t=af.Identifier("text"),
                    n=db.layout(schema).table("notes").identifier,
                )
            )
            return sorted(row["text"] for row in rows)

    assert _as_guest(main) == [f"n{n}" for n in range(6)]


def test_slots_wait_and_time_out_in_a_guest_run() -> None:
    async def main() -> list[tuple[str, bool]]:
        slots = Slots(1, 0.2)
        log: list[tuple[str, bool]] = []

        async def waiter(name: str) -> None:
            log.append((name, await slots.acquire()))

        assert await slots.acquire()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, "times out")  # (at 0: its deadline 0.2)
            await trio.sleep(0.15)
            nursery.start_soon(waiter, "served")  # (at 0.15: its deadline 0.35)
            await trio.sleep(0.1)
            slots.release()  # (at 0.25)
        return log

    assert _as_guest(main) == [("times out", False), ("served", True)]
