"""What waking outbox readers costs PostgreSQL writers: units/s of one-row
outbox units with the entry's ``pg_notify`` (nobody listening, and one
reader listening) against the same entry without it (the writer before
push, compiled in-process). Variants interleave over ``--rounds`` rounds
(order reversed every other round); reported: median units/s per variant
and concurrency, and the ratio to "no wake".

Runs in a database of its own (``aiofragno_bench_push``).

    python -m benchmarks.outbox_wake_cost [--units 2000] [--rounds 4] [--concurrency 1,16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.outbox.writer import OutboxStatements

from . import _common as common
from .outbox_push_latency import DATABASE, EVENTS

VARIANTS = ("no wake", "wake, nobody listening", "wake, one reader listening")


async def units_per_s(db: af.Database, units: int, concurrency: int) -> float:
    numbers = iter(range(units))

    def unit_for(n: int) -> Any:
        async def unit(uow: af.UnitOfWork) -> None:
            uow.create("events", {"n": n})

        return unit

    async def worker() -> None:
        for n in numbers:
            await db.execute_uow(unit_for(n), schema=EVENTS)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    return units / (time.perf_counter() - started)


@contextlib.asynccontextmanager
async def variant(db: af.Database, name: str, quiet: OutboxStatements) -> AsyncIterator[None]:
    engine = db._engine
    loud = engine.outbox_statements
    if name == "no wake":
        engine._outbox_statements = quiet
    try:
        if name == "wake, one reader listening":
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(follow(db))
                await asyncio.sleep(0.5)
                yield
                reader.cancel()
        else:
            yield
    finally:
        engine._outbox_statements = loud


async def follow(db: af.Database) -> None:
    async for _ in db.outbox.tail(after=await db.outbox.latest(), poll_interval=30):
        pass


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_wake_cost")
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    url = common.DEFAULT_URLS["postgresql"].rsplit("/", 1)[0] + "/" + DATABASE
    await common.ensure_database(url)
    rates: dict[tuple[str, int], list[float]] = {(v, c): [] for v in VARIANTS for c in levels}
    async with af.connect(url, outbox=True, pool_size=common.POOL_SIZE) as db:
        await db.migrate(EVENTS)
        servers = {"postgresql": await common.server_info(db)}
        engine = db._engine
        silent = dataclasses.replace(engine.adapter.sql, outbox_wake=None)
        quiet = OutboxStatements(engine.compiler, dataclasses.replace(engine.adapter, sql=silent))
        for number in range(args.rounds):
            order = VARIANTS if number % 2 == 0 else tuple(reversed(VARIANTS))
            for name in order:
                for concurrency in levels:
                    async with variant(db, name, quiet):
                        rate = await units_per_s(db, args.units, concurrency)
                    rates[(name, concurrency)].append(rate)
                    print(f"round {number} {name} c={concurrency}: {rate:.0f} units/s")
    results = [
        {
            "variant": name,
            "concurrency": concurrency,
            "units_per_s_median": round(statistics.median(rates[(name, concurrency)])),
            "ratio_to_no_wake": round(
                statistics.median(rates[(name, concurrency)])
                / statistics.median(rates[("no wake", concurrency)]),
                3,
            ),
            "units_per_s_rounds": [round(r) for r in rates[(name, concurrency)]],
        }
        for name in VARIANTS
        for concurrency in levels
    ]
    common.print_table(
        ["variant", "c", "units/s", "ratio"],
        [
            [r["variant"], r["concurrency"], r["units_per_s_median"], r["ratio_to_no_wake"]]
            for r in results
        ],
    )
    common.write_json(
        args.json or common.default_json_path("outbox_wake_cost"),
        {
            "benchmark": "outbox_wake_cost",
            "config": {"units": args.units, "rounds": args.rounds, "concurrency": levels},
            "machine": common.machine_info(servers),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
