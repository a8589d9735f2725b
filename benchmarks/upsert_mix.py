"""Upsert-heavy units against hand-written driver code.

Each unit upserts two random keys of ``KEYS`` (a counter's value set to a
random number; a new key is created, a known one updated and its version
bumped) and returns both rows' ids. Variants per backend:

* ``aiofragno``: ``db.execute_uow`` with two ``uow.upsert`` (outbox off);
* ``aiofragno+outbox``: the same with the outbox on (its entry says, per
  upsert, whether it created or updated);
* ``raw``: the statements aiofragno sends, hand-written on the driver — in
  one transaction, ``INSERT .. ON CONFLICT .. DO UPDATE .. RETURNING`` twice
  (PostgreSQL: asyncpg pool; SQLite: sqlite3 on a worker thread, the whole
  unit in one hop, ``BEGIN IMMEDIATE``), or ``INSERT .. ON DUPLICATE KEY
  UPDATE`` and the read-back twice (MySQL: asyncmy pool).

    python -m benchmarks.upsert_mix --backend sqlite|postgresql|mysql \\
        [--url URL] --units 2000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.schema import new_external_id

from . import _common as common

KEYS = 200
SCHEMA = af.Schema(
    "bench_upsert",
    af.Table(
        "counters",
        af.Column("name", "string"),
        af.Column("value", "bigint", default=0),
        af.Index("by_name", ["name"], unique=True),
    ),
)
Unit = Callable[[list[tuple[str, int]]], Awaitable[Any]]


def work(units: int, seed: int = 7) -> list[list[tuple[str, int]]]:
    rng = random.Random(seed)
    return [
        [(f"k{rng.randrange(KEYS):04}", rng.randrange(1_000_000)) for _ in range(2)]
        for _ in range(units)
    ]


async def run(unit: Unit, jobs: list[list[tuple[str, int]]], concurrency: int) -> float:
    queue = list(reversed(jobs))

    async def worker() -> None:
        while queue:
            await unit(queue.pop())

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


def aiofragno_unit(db: af.Database, namespace: str) -> Unit:
    async def unit(pairs: list[tuple[str, int]]) -> Any:
        async def fn(uow: af.UnitOfWork) -> list[af.Upserted]:
            return [
                uow.upsert("counters", {"name": name, "value": value}, on="by_name")
                for name, value in pairs
            ]

        return [h.result for h in await db.execute_uow(fn, schema=SCHEMA, namespace=namespace)]

    return unit


async def raw_unit(
    dialect: str, url: str, table: str
) -> tuple[Unit, Callable[[], Awaitable[None]]]:
    """The hand-written unit, and what closes its connections."""
    returning = "RETURNING id, _version, _id"
    if dialect == "postgresql":
        import asyncpg

        pool = await asyncpg.create_pool(url, min_size=common.POOL_SIZE, max_size=common.POOL_SIZE)
        sql = (
            f"INSERT INTO {table} AS t (id, name, value) VALUES ($1, $2, $3) ON CONFLICT (name) "
            f"DO UPDATE SET value = excluded.value, _version = t._version + 1 {returning}"
        )

        async def pg(pairs: list[tuple[str, int]]) -> Any:
            async with pool.acquire() as conn, conn.transaction():
                return [await conn.fetchrow(sql, new_external_id(), n, v) for n, v in pairs]

        return pg, pool.close
    if dialect == "mysql":
        import asyncmy

        pool = await asyncmy.create_pool(
            minsize=common.POOL_SIZE, maxsize=common.POOL_SIZE, **common.asyncmy_options(url)
        )
        upsert = (
            f"INSERT INTO {table} (id, name, value) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
            "value = IF(name <=> VALUES(name), VALUES(value), value), "
            "_version = IF(name <=> VALUES(name), _version + 1, _version)"
        )
        read = f"SELECT id, _version, _id FROM {table} WHERE name = %s AND (id = %s OR ROW_COUNT() = 2)"

        async def my(pairs: list[tuple[str, int]]) -> Any:
            async with pool.acquire() as conn:
                await conn.begin()
                rows = []
                async with conn.cursor() as cursor:
                    for n, v in pairs:
                        new = new_external_id()
                        await cursor.execute(upsert, (new, n, v))
                        await cursor.execute(read, (n, new))
                        rows.append(await cursor.fetchone())
                await conn.commit()
                return rows

        async def close() -> None:
            pool.close()
            await pool.wait_closed()

        return my, close
    path = common.Target("sqlite", url).sqlite_path
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    connection.execute(f"PRAGMA busy_timeout = {int(common.SQLITE_BUSY_TIMEOUT * 1000)}")
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA foreign_keys = ON")
    lock = asyncio.Lock()
    sql = (
        f"INSERT INTO {table} AS t (id, name, value) VALUES (?, ?, ?) ON CONFLICT (name) "
        f"DO UPDATE SET value = excluded.value, _version = t._version + 1 {returning}"
    )

    def in_thread(pairs: list[tuple[str, int]]) -> Any:
        connection.execute("BEGIN IMMEDIATE")
        rows = [connection.execute(sql, (new_external_id(), n, v)).fetchone() for n, v in pairs]
        connection.execute("COMMIT")
        return rows

    async def lite(pairs: list[tuple[str, int]]) -> Any:
        async with lock:
            return await asyncio.to_thread(in_thread, pairs)

    async def close() -> None:
        connection.close()

    return lite, close


async def measure(dialect: str, url: str, units: int, concurrency: int) -> dict[str, float]:
    jobs = work(units)
    namespace = f"b{uuid.uuid4().hex[:6]}"
    rates: dict[str, float] = {}
    async with af.connect(url, outbox=False, pool_size=common.POOL_SIZE) as db:
        await db.migrate(SCHEMA, namespace=namespace)
        layout = db.layout(SCHEMA, namespace)
        quote = db._engine.compiler.quote_identifier
        table = ".".join(quote(p) for p in layout.table("counters").identifier.parts)
        unit, close = await raw_unit(dialect, url, table)
        try:
            await run(unit, jobs[:200], concurrency)  # (warm-up)
            rates["raw"] = units / await run(unit, jobs, concurrency)
        finally:
            await close()
        mine = aiofragno_unit(db, namespace)
        await run(mine, jobs[:200], concurrency)
        rates["aiofragno"] = units / await run(mine, jobs, concurrency)
    async with af.connect(url, outbox=True, pool_size=common.POOL_SIZE) as db:
        await db.migrate(SCHEMA, namespace=namespace)
        mine = aiofragno_unit(db, namespace)
        await run(mine, jobs[:200], concurrency)
        rates["aiofragno+outbox"] = units / await run(mine, jobs, concurrency)
        layout = db.layout(SCHEMA, namespace)
        if layout.db_schemas:
            for name in layout.db_schemas:
                await db.execute(af.sql("DROP SCHEMA {s} CASCADE", s=af.Identifier(name)))
        else:
            await db.execute(af.sql("DROP TABLE {t}", t=layout.table("counters").identifier))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=common.BACKENDS, default="sqlite")
    parser.add_argument("--url", help="the database (default: the benchmarks' own)")
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or (
            f"sqlite:///{Path(tmp) / 'bench.db'}"
            if args.backend == "sqlite"
            else common.DEFAULT_URLS[args.backend]
        )
        rates = asyncio.run(measure(args.backend, url, args.units, args.concurrency))
    raw = rates["raw"]
    print(f"{args.backend}, {args.units} units x 2 upserts, concurrency {args.concurrency}:")
    for name, rate in rates.items():
        print(f"  {name:18} {rate:8.0f} units/s  ({rate / raw:.2f} x raw)")


if __name__ == "__main__":
    main()
