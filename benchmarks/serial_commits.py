"""How many durable commits per second a server gives when every transaction
holds one row's lock until it commits — the bound on outbox writers, which all
update the version counter row — against the same commits on a row each.

16 connections of the raw driver, each looping an autocommit single-row
upsert for ``--seconds``; first all on one row (serialized), then each on its
own row (parallel, group commit possible). No aiofragno code is measured.

    python -m benchmarks.serial_commits [--backend postgresql|mysql|all] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.url import parse_url

from . import _common as common

TASKS = 16
Upsert = Callable[[Any, int], Awaitable[None]]


async def _postgresql(url: str) -> tuple[Any, Upsert]:
    import asyncpg

    parsed = parse_url(url)
    pool = await asyncpg.create_pool(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        database=parsed.database,
        min_size=TASKS,
        max_size=TASKS,
    )
    await pool.execute("CREATE TABLE IF NOT EXISTS bench_serial (k int PRIMARY KEY, v bigint)")

    async def upsert(conn: Any, key: int) -> None:
        await conn.execute(
            "INSERT INTO bench_serial VALUES ($1, 0) "
            "ON CONFLICT (k) DO UPDATE SET v = bench_serial.v + 1",
            key,
        )

    return pool, upsert


async def _mysql(url: str) -> tuple[Any, Upsert]:
    import asyncmy

    pool = await asyncmy.create_pool(**common.asyncmy_options(url), minsize=TASKS, maxsize=TASKS)

    async def upsert(conn: Any, key: int) -> None:
        async with conn.cursor() as cursor:
            await cursor.execute(
                "INSERT INTO bench_serial VALUES (%s, 0) ON DUPLICATE KEY UPDATE v = v + 1", (key,)
            )

    async with pool.acquire() as conn, conn.cursor() as cursor:
        await cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_serial (k int PRIMARY KEY, v bigint)"
        )
    return pool, upsert


async def _rate(pool: Any, upsert: Upsert, *, shared: bool, seconds: float) -> float:
    count = 0
    stop = time.perf_counter() + seconds

    async def worker(task: int) -> None:
        nonlocal count
        async with pool.acquire() as conn:
            while time.perf_counter() < stop:
                await upsert(conn, 0 if shared else task + 1)
                count += 1

    await asyncio.gather(*(worker(task) for task in range(TASKS)))
    return count / seconds


async def measure(dialect: str, seconds: float) -> dict[str, Any] | None:
    async with common.target(dialect, Path(".")) as target:
        if target is None:
            return None
        async with af.connect(target.url, pool_size=1) as admin:
            server = await common.server_info(admin)
        pool, upsert = await (_postgresql if dialect == "postgresql" else _mysql)(target.url)
        try:
            serialized = await _rate(pool, upsert, shared=True, seconds=seconds)
            parallel = await _rate(pool, upsert, shared=False, seconds=seconds)
        finally:
            if dialect == "mysql":
                pool.close()
                await pool.wait_closed()
            else:
                await pool.close()
    return {
        "backend": dialect,
        "one_row_commits_per_s": round(serialized),
        "row_each_commits_per_s": round(parallel),
        "server": server,
    }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serial_commits")
    parser.add_argument("--backend", default="all", choices=["postgresql", "mysql", "all"])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    dialects = ["postgresql", "mysql"] if args.backend == "all" else [args.backend]
    results = [r for d in dialects if (r := await measure(d, args.seconds)) is not None]
    common.print_table(
        ["backend", "one row: commits/s", "a row each: commits/s"],
        [[r["backend"], r["one_row_commits_per_s"], r["row_each_commits_per_s"]] for r in results],
    )
    common.write_json(
        args.json or common.default_json_path("serial_commits"),
        {
            "benchmark": "serial_commits",
            "config": {"tasks": TASKS, "seconds": args.seconds},
            "machine": common.machine_info({r["backend"]: r["server"] for r in results}),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
