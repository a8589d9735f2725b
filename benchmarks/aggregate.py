"""What ``uow.aggregate`` costs over the same aggregate sent by hand on the
raw driver.

On each backend: the transfer workload's 1,000 accounts; each read is
``COUNT(*), SUM(balance), MAX(balance)`` of the accounts at or above a
random balance threshold — through ``db.execute_uow`` with ``uow.aggregate``
(one unit per read: its retrieval phase, no writes), and on the raw driver
(asyncpg and asyncmy: a connection from the driver's pool per read, asyncpg's
without a reset query; aiosqlite: one connection; the statement written by
hand, its SUM turned into an int as aiofragno does), through SQLAlchemy 2
Core (a ``select()`` of ``func.count/sum/max`` on ``engine.connect()``) and
its ORM (the same over the mapped class in an ``AsyncSession`` per read;
both on the same drivers, SUM turned into an int too) — and, to tell what
the unit of work costs from what the aggregate costs, the same SQL through
aiofragno's raw SQL (``db.fetch``). All give the same answers (checked
first). They run interleaved in rounds (warm-up excluded; every other
round in reverse order); the tables give reads/s (median over rounds) and
the aggregate's ratio to each other variant per round (median and range;
1.0: as fast). JSON in ``benchmarks/results/``.

    python -m benchmarks.aggregate [--backend all|sqlite|postgresql|mysql] [-n 2000] [--rounds 5] \\
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiofragno as af
from benchmarks import _common as common
from benchmarks import _sqlalchemy as sa

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
        pool = await common.asyncpg_pool(target, 1)
        text = sql.format(t=table, p="$1")

        async def read_pg(threshold: int) -> tuple[int, int | None, int | None]:
            async with pool.acquire() as conn:
                return _ints(await conn.fetchrow(text, threshold))

        return read_pg, pool.close
    if target.dialect == "mysql":
        my = await common.asyncmy_pool(target, 1)
        text = sql.format(t=table, p="%s")

        async def read_my(threshold: int) -> tuple[int, int | None, int | None]:
            async with my.acquire() as conn, conn.cursor() as cursor:
                await cursor.execute(text, (threshold,))
                return _ints(await cursor.fetchone())

        async def close_my() -> None:
            my.close()
            await my.wait_closed()

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


def sqlalchemy_reads(engine: Any, names: common.Names) -> tuple[Read, Read]:
    """The aggregate through SQLAlchemy 2 Core (``engine.connect()``, a
    ``select()`` of ``func.count/sum/max``) and through its ORM (an
    ``AsyncSession`` per read executing the same over the mapped class)."""
    from sqlalchemy import BigInteger, String, func, select
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Account(Base):
        __tablename__ = names.accounts[-1]
        __table_args__ = {"schema": sa.schema_of(names.accounts)}
        pk = mapped_column("_id", sa.internal_id(), primary_key=True)
        owner = mapped_column(String(255))
        balance = mapped_column(BigInteger)

    table = Account.__table__
    core = select(func.count(), func.sum(table.c.balance), func.max(table.c.balance))
    orm = select(func.count(Account.pk), func.sum(Account.balance), func.max(Account.balance))
    sessions = async_sessionmaker(engine)

    async def read_core(threshold: int) -> tuple[int, int | None, int | None]:
        async with engine.connect() as conn:
            result = await conn.execute(core.where(table.c.balance >= threshold))
            return _ints(result.one())

    async def read_orm(threshold: int) -> tuple[int, int | None, int | None]:
        async with sessions() as session:
            result = await session.execute(orm.where(Account.balance >= threshold))
            return _ints(result.one())

    return read_core, read_orm


async def timed(read: Read, values: Sequence[int]) -> float:
    """Reads per second."""
    started = time.perf_counter()
    for value in values:
        await read(value)
    return len(values) / (time.perf_counter() - started)


VARIANTS = ("aggregate", "db.fetch", "raw", "sqlalchemy-core", "sqlalchemy-orm")
RATIOS = [("aggregate", other) for other in VARIANTS[1:]]


async def bench(dialect: str, n: int, rounds: int, tmpdir: Path) -> dict[str, Any] | None:
    async with common.target(dialect, tmpdir) as target:
        if target is None:
            return None
        async with af.connect(target.url) as db:
            await common.prepare(db)
            names = common.names(db)
            raw, close = await raw_read(target, names.qualified(names.accounts))
            engine = await sa.engine(target, pool_size=1)
            try:
                variants = dict(
                    zip(
                        VARIANTS,
                        [
                            aiofragno_read(db),
                            fetch_read(db, af.Identifier(*names.accounts)),
                            raw,
                            *sqlalchemy_reads(engine, names),
                        ],
                        strict=True,
                    )
                )
                values = thresholds(n)
                for value in values[:50]:  # same answers, and a warm-up
                    answers = {await read(value) for read in variants.values()}
                    assert len(answers) == 1, (value, answers)
                rates = await common.interleaved(
                    {name: partial(timed, read, values) for name, read in variants.items()}, rounds
                )
            finally:
                await close()
                await engine.dispose()
    return {
        "reads_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "rounds": rates,
        "ratios": {f"{a} / {b}": common.round_ratios(rates, a, b) for a, b in RATIOS},
    }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=["all", *common.BACKENDS])
    parser.add_argument("-n", type=int, default=2000, help="reads per round and variant")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    dialects = common.BACKENDS if args.backend == "all" else (args.backend,)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in dialects:
            result = await bench(dialect, args.n, args.rounds, Path(tmp))
            if result is not None:
                results[dialect] = result
    common.print_table(
        ["backend", *(f"{v}/s" for v in VARIANTS)],
        [[d, *(f"{r['reads_per_s'][v]:.0f}" for v in VARIANTS)] for d, r in results.items()],
    )
    print()
    common.print_table(
        ["backend", *(f"{a} / {b}" for a, b in RATIOS)],
        [[d, *map(common.ratio_cell, r["ratios"].values())] for d, r in results.items()],
    )
    common.write_json(
        args.json or common.default_json_path("aggregate"),
        {
            "benchmark": "aggregate",
            "reads": args.n,
            "rounds": args.rounds,
            "results": results,
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
