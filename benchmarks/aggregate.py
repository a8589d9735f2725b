"""What ``uow.aggregate`` costs over the same aggregate sent by hand on the
raw driver.

On each backend: the transfer workload's 1,000 accounts; each read is
``COUNT(*), SUM(balance), MAX(balance)`` of the accounts at or above a
random balance threshold — through ``db.execute_uow`` with ``uow.aggregate``
(one unit per read: its retrieval phase, no writes), and on the raw driver
(asyncpg, asyncmy, aiosqlite; one connection, the statement written by
hand, its SUM turned into an int as aiofragno does) — and, to tell what
the unit of work costs from what the aggregate costs, the same SQL through
aiofragno's raw SQL (``db.fetch``). They alternate in rounds (warm-up
excluded); the table gives µs per read, best round, and the ratio raw /
aiofragno (1.0: as fast as raw). On SQLite aiofragno sums
an integer column as its two 32-bit halves (exact past 64 bits), so its
statement does one more SUM than the hand-written one.

    python -m benchmarks.aggregate [--backend all|sqlite|postgresql|mysql] [-n 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from benchmarks import _common as common

Read = Callable[[int], Awaitable[tuple[int, int | None, int | None]]]


def thresholds(n: int) -> list[int]:
    rng = random.Random(7)
    return [rng.randrange(0, common.OPENING_BALANCE + 1) for _ in range(n)]


def aiofragno_read(db: af.Database) -> Read:
    async def read(threshold: int) -> tuple[int, int | None, int | None]:
        async def unit(uow: af.UnitOfWork) -> dict[str, Any]:
            op = uow.aggregate(
                "accounts",
                {"n": af.fn.count(), "total": af.fn.sum("balance"), "top": af.fn.max("balance")},
                af.c.balance >= threshold,
            )
            await uow.retrieve()
            result: dict[str, Any] = op.result
            return result

        r = await db.execute_uow(unit, schema=common.SCHEMA)
        return r["n"], r["total"], r["top"]

    return read


def fetch_read(db: af.Database, table: af.Identifier) -> Read:
    async def read(threshold: int) -> tuple[int, int | None, int | None]:
        query = af.sql(
            "SELECT COUNT(*), SUM(balance), MAX(balance) FROM {t} WHERE balance >= {p}",
            t=table,
            p=threshold,
        )
        row = await db.fetch_one(query)
        assert row is not None
        return _ints(tuple(row.values()))

    return read


def _ints(row: Sequence[Any]) -> tuple[int, int | None, int | None]:
    n, total, top = row
    return int(n), None if total is None else int(total), top


async def raw_read(target: common.Target, table: str) -> tuple[Read, Callable[[], Awaitable[Any]]]:
    """The hand-written read on the raw driver, and how to close it."""
    sql = "SELECT COUNT(*), SUM(balance), MAX(balance) FROM {t} WHERE balance >= {p}"
    if target.dialect == "postgresql":
        import asyncpg

        url = target.parsed
        conn = await asyncpg.connect(
            host=url.host, port=url.port, user=url.username, database=url.database
        )
        text = sql.format(t=table, p="$1")

        async def read_pg(threshold: int) -> tuple[int, int | None, int | None]:
            return _ints(await conn.fetchrow(text, threshold))

        return read_pg, conn.close
    if target.dialect == "mysql":
        import asyncmy

        my = await asyncmy.connect(**common.asyncmy_options(target.url))
        text = sql.format(t=table, p="%s")

        async def read_my(threshold: int) -> tuple[int, int | None, int | None]:
            async with my.cursor() as cursor:
                await cursor.execute(text, (threshold,))
                return _ints(await cursor.fetchone())

        async def close_my() -> None:
            my.close()

        return read_my, close_my
    import aiosqlite

    lite = await aiosqlite.connect(target.sqlite_path)
    text = sql.format(t=table, p="?")

    async def read_lite(threshold: int) -> tuple[int, int | None, int | None]:
        async with lite.execute(text, (threshold,)) as cursor:
            row = await cursor.fetchone()
            assert row is not None
            return _ints(row)

    return read_lite, lite.close


async def timed(read: Read, values: Sequence[int]) -> float:
    started = time.perf_counter()
    for value in values:
        await read(value)
    return (time.perf_counter() - started) / len(values)


async def bench(dialect: str, n: int, rounds: int, tmpdir: Path) -> list[Any] | None:
    async with common.target(dialect, tmpdir) as target:
        if target is None:
            return None
        async with af.connect(target.url) as db:
            await common.prepare(db)
            names = common.names(db)
            raw, close = await raw_read(target, names.qualified(names.accounts))
            try:
                variants = {
                    "aiofragno": aiofragno_read(db),
                    "fetch": fetch_read(db, af.Identifier(*names.accounts)),
                    "raw": raw,
                }
                values = thresholds(n)
                for value in values[:50]:  # same answers, and a warm-up
                    answers = {await read(value) for read in variants.values()}
                    assert len(answers) == 1, (value, answers)
                best = dict.fromkeys(variants, float("inf"))
                for _ in range(rounds):
                    for name, read in variants.items():
                        best[name] = min(best[name], await timed(read, values))
            finally:
                await close()
    us = {k: v * 1e6 for k, v in best.items()}
    return [
        dialect,
        f"{us['aiofragno']:.0f}",
        f"{us['fetch']:.0f}",
        f"{us['raw']:.0f}",
        f"{best['raw'] / best['aiofragno']:.2f}",
        f"{best['raw'] / best['fetch']:.2f}",
    ]


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=["all", *common.BACKENDS])
    parser.add_argument("-n", type=int, default=2000, help="reads per round and variant")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    dialects = common.BACKENDS if args.backend == "all" else (args.backend,)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in dialects:
            row = await bench(dialect, args.n, args.rounds, Path(tmp))
            if row is not None:
                rows.append(row)
    common.print_table(
        [
            "backend",
            "aggregate µs/read",
            "db.fetch µs/read",
            "raw µs/read",
            "raw / aggregate",
            "raw / db.fetch",
        ],
        rows,
    )


if __name__ == "__main__":
    asyncio.run(main())
