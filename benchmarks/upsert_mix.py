"""Upsert-heavy units against hand-written driver code.

Each unit upserts two random keys of ``KEYS`` (a counter's value set to a
random number; a new key is created, a known one updated and its version
bumped) and returns both rows' ids. Variants per backend:

* ``aiofragno``: ``db.execute_uow`` with two ``uow.upsert`` (outbox off);
* ``aiofragno+outbox``: the same with the outbox on (its entry says, per
  upsert, whether it created or updated);
* ``raw``: the same work hand-written on the driver, as one would write it —
  in one transaction, ``INSERT .. ON CONFLICT .. DO UPDATE .. RETURNING``
  twice (PostgreSQL: asyncpg pool, no reset query on release, as
  aiofragno's; SQLite: sqlite3 on a worker thread, the whole unit in one
  hop, ``BEGIN IMMEDIATE``), or ``INSERT .. ON DUPLICATE KEY UPDATE`` acting
  on the name alone and the read-back twice (MySQL: asyncmy pool). Each
  bumps the version of a row it updates and returns both rows' id, version
  and internal id (whether it created the row: its id is the one it sent).
  aiofragno's unit does the same work; on PostgreSQL its two upserts (by
  different keys) go as one statement, a round trip fewer;
* ``sqlalchemy-core``, ``sqlalchemy-orm``: the same statements through
  SQLAlchemy 2 Core and through its ORM (ORM-enabled upserts returning the
  mapped object), a pool of as many connections, the same drivers (aiosqlite
  on SQLite, its writers queued in-process as the others', see
  :func:`one_writer`).

All run interleaved in ``--rounds`` rounds (every other round in reverse
order, a warm-up excluded); reported: units/s (median over rounds) and the
per-round ratios (median and range); JSON in ``benchmarks/results/``.

    python -m benchmarks.upsert_mix [--backend all|sqlite,postgresql,mysql] \\
        [--units 2000] [--concurrency 16] [--rounds 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.schema import new_external_id

from . import _common as common
from . import _sqlalchemy as sa

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
    """Each unit's two (key, value) pairs, in key order: units writing the
    same two keys take their locks in one order, so none deadlocks (the raw
    and SQLAlchemy variants do not retry; PostgreSQL once reported one)."""
    rng = random.Random(seed)
    return [
        sorted((f"k{rng.randrange(KEYS):04}", rng.randrange(1_000_000)) for _ in range(2))
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
    target: common.Target, table: str, pool_size: int = common.POOL_SIZE
) -> tuple[Unit, Callable[[], Awaitable[None]]]:
    """The hand-written unit, and what closes its connections. The pools
    are set up as aiofragno's: asyncpg's sends nothing on release (its
    default reset query would be one more round trip per unit, which
    aiofragno does not make), asyncmy's talks utf8mb4."""
    returning = "RETURNING id, _version, _id"
    dialect = target.dialect
    if dialect == "postgresql":
        pool = await common.asyncpg_pool(target, pool_size)
        sql = (
            f"INSERT INTO {table} AS t (id, name, value) VALUES ($1, $2, $3) ON CONFLICT (name) "
            f"DO UPDATE SET value = excluded.value, _version = t._version + 1 {returning}"
        )

        async def pg(pairs: list[tuple[str, int]]) -> Any:
            async with pool.acquire() as conn, conn.transaction():
                return [await conn.fetchrow(sql, new_external_id(), n, v) for n, v in pairs]

        return pg, pool.close
    if dialect == "mysql":
        pool = await common.asyncmy_pool(target, pool_size)
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
    connection = sqlite3.connect(target.sqlite_path, check_same_thread=False, isolation_level=None)
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


def one_writer(unit: Unit) -> Unit:
    """``unit`` with its writers queued in this process, one at a time, as
    the raw variant's lock and aiofragno's write gate queue theirs: on
    SQLite, SQLAlchemy's writers otherwise wait in SQLite's busy handler,
    which serves them in no order, and on a loaded machine some waited past
    busy_timeout ("database is locked")."""
    lock = asyncio.Lock()

    async def queued(pairs: list[tuple[str, int]]) -> Any:
        async with lock:
            return await unit(pairs)

    return queued


def sqlalchemy_units(dialect: str, engine: Any, parts: tuple[str, ...]) -> tuple[Unit, Unit]:
    """The unit through SQLAlchemy 2 Core and through its ORM, one
    transaction each: PostgreSQL and SQLite ``insert(...).on_conflict_do_update
    (...).returning(...)``; MySQL ``insert(...).on_duplicate_key_update(...)``
    and the read-back. Core on ``engine.begin()``; the ORM on an
    ``AsyncSession`` with the ORM-enabled statements (RETURNING the mapped
    object; on MySQL a ``select(Counter)`` after the upsert), then commit."""
    from sqlalchemy import BigInteger, Integer, String, select
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Counter(Base):
        __tablename__ = parts[-1]
        __table_args__ = {"schema": sa.schema_of(parts)}
        pk = mapped_column("_id", sa.internal_id(), primary_key=True)
        id = mapped_column(String(64))
        version = mapped_column("_version", Integer)
        name = mapped_column(String(255))
        value = mapped_column(BigInteger)

    t = Counter.__table__
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    if dialect == "mysql":
        from sqlalchemy.dialects.mysql import insert

        def upsert(target: Any, name: str, value: int) -> Any:
            stmt = insert(target).values(id=new_external_id(), name=name, value=value)
            return stmt.on_duplicate_key_update(
                value=stmt.inserted.value, _version=t.c._version + 1
            )

        async def core(pairs: list[tuple[str, int]]) -> Any:
            async with engine.begin() as conn:
                rows = []
                for n, v in pairs:
                    await conn.execute(upsert(t, n, v))
                    read = select(t.c.id, t.c._version, t.c._id).where(t.c.name == n)
                    rows.append((await conn.execute(read)).one())
                return rows

        async def orm(pairs: list[tuple[str, int]]) -> Any:
            async with sessions() as session, session.begin():
                rows = []
                for n, v in pairs:
                    await session.execute(upsert(Counter, n, v))
                    read = select(Counter).where(Counter.name == n)
                    rows.append(
                        (await session.execute(read.execution_options(populate_existing=True)))
                        .scalars()
                        .one()
                    )
                return rows

        return core, orm
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    else:
        from sqlalchemy.dialects.sqlite import insert as dialect_insert

    def returning_upsert(target: Any, name: str, value: int) -> Any:
        stmt = dialect_insert(target).values(id=new_external_id(), name=name, value=value)
        return stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={"value": stmt.excluded.value, "_version": t.c._version + 1},
        )

    async def core_returning(pairs: list[tuple[str, int]]) -> Any:
        async with engine.begin() as conn:
            return [
                (
                    await conn.execute(
                        returning_upsert(t, n, v).returning(t.c.id, t.c._version, t.c._id)
                    )
                ).one()
                for n, v in pairs
            ]

    async def orm_returning(pairs: list[tuple[str, int]]) -> Any:
        async with sessions() as session, session.begin():
            return [
                (
                    await session.execute(
                        returning_upsert(Counter, n, v)
                        .returning(Counter)
                        .execution_options(populate_existing=True)
                    )
                )
                .scalars()
                .one()
                for n, v in pairs
            ]

    return core_returning, orm_returning


VARIANTS = ("aiofragno", "aiofragno+outbox", "raw", "sqlalchemy-core", "sqlalchemy-orm")
RATIOS = [("aiofragno", "raw"), ("aiofragno+outbox", "raw")] + [
    ("aiofragno", other) for other in VARIANTS[3:]
]


async def measure(
    target: common.Target, units: int, concurrency: int, rounds: int
) -> dict[str, Any]:
    """Each variant's units/s per round, interleaved."""
    jobs = work(units)
    namespace = f"b{uuid.uuid4().hex[:6]}"
    url = target.url
    async with contextlib.AsyncExitStack() as stack:
        db = await stack.enter_async_context(
            af.connect(url, outbox=False, pool_size=common.POOL_SIZE)
        )
        odb = await stack.enter_async_context(
            af.connect(url, outbox=True, pool_size=common.POOL_SIZE)
        )
        await odb.migrate(SCHEMA, namespace=namespace)
        layout = db.layout(SCHEMA, namespace)
        parts = layout.table("counters").identifier.parts
        quote = db._engine.compiler.quote_identifier
        table = ".".join(quote(p) for p in parts)
        try:
            raw, close = await raw_unit(target, table)
            stack.push_async_callback(close)
            engine = await sa.engine(target)
            stack.push_async_callback(engine.dispose)
            variants = dict(
                zip(
                    VARIANTS,
                    [
                        aiofragno_unit(db, namespace),
                        aiofragno_unit(odb, namespace),
                        raw,
                        *(
                            one_writer(unit) if target.dialect == "sqlite" else unit
                            for unit in sqlalchemy_units(target.dialect, engine, parts)
                        ),
                    ],
                    strict=True,
                )
            )
            for unit in variants.values():
                await run(unit, jobs[:200], concurrency)  # (warm-up)

            async def rate(unit: Unit) -> float:
                return units / await run(unit, jobs, concurrency)

            rates = await common.interleaved(
                {name: partial(rate, unit) for name, unit in variants.items()}, rounds
            )
        finally:
            if layout.db_schemas:
                for name in layout.db_schemas:
                    await db.execute(af.sql("DROP SCHEMA {s} CASCADE", s=af.Identifier(name)))
            else:
                await db.execute(af.sql("DROP TABLE {t}", t=layout.table("counters").identifier))
    return {
        "units_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "rounds": rates,
        "ratios": {f"{a} / {b}": common.round_ratios(rates, a, b) for a, b in RATIOS},
    }


async def main(args: argparse.Namespace) -> None:
    backends = common.BACKENDS if args.backend == "all" else args.backend.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is not None:
                    results[dialect] = await measure(
                        target, args.units, args.concurrency, args.rounds
                    )
    common.print_table(
        ["backend", *(f"{v}/s" for v in VARIANTS)],
        [[d, *(f"{r['units_per_s'][v]:.0f}" for v in VARIANTS)] for d, r in results.items()],
    )
    print()
    common.print_table(
        ["backend", *(f"{a} / {b}" for a, b in RATIOS)],
        [[d, *map(common.ratio_cell, r["ratios"].values())] for d, r in results.items()],
    )
    common.write_json(
        args.json or common.default_json_path("upsert_mix"),
        {
            "benchmark": "upsert_mix",
            "units": args.units,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "results": results,
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="all", help="sqlite,postgresql,mysql or all")
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    asyncio.run(main(parser.parse_args()))
