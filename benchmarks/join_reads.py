"""A read with a join: a page of ``--accounts`` accounts (1: one account)
each with its last 10 transfers (of 100).

aiofragno: ``find("accounts", where=af.c.owner >= o, order_by="owner",
limit=N, join={"recent": af.many("transfers", by="src", order_by=("seq",
"desc"), limit=10)})`` — one round trip (one statement on PostgreSQL).
two-retrieves: aiofragno without a join — the accounts, then a second
retrieve with one find per account (one more round trip).

raw: hand-written code on the driver, as a repository function would do it:
the accounts (``WHERE owner >= ? ORDER BY owner LIMIT N``), then each one's
transfers (``WHERE src = ? ORDER BY seq DESC LIMIT 10``, the references'
external ids joined), 1 + N statements on a connection from the driver's pool (asyncpg: no
reset query on release, as in ``benchmarks.transfer``), and the same
result shape: a dict per account with its transfers as a list of dicts
(asyncpg ``dict(record)``; asyncmy and sqlite3 ``dict(zip(columns, row))``)
— values as the driver decodes them (ids as str, not RowIds with versions).
On SQLite: sqlite3 with one worker-thread hop per statement
(``asyncio.to_thread``), as aiofragno's default SQLite backend.

sqlalchemy-core: the raw code's two statements as SQLAlchemy 2 Core
``select()``s on its asyncio engine (``engine.connect()`` per read), rows
turned into the same nested dicts (``row._asdict()``). sqlalchemy-orm: the
2.0-style ORM on an ``AsyncSession`` per read: ``select(Account)``, then per
account ``select(Transfer)`` with ``joinedload`` of its two accounts (their
``id`` only); the result the ORM's objects, (account, [transfers]) pairs.
Both on the same drivers (aiosqlite on SQLite).

Interleaved in rounds (every other round in reverse order), one read at a
time; reported: reads/s per variant and the join's ratios to the others
per backend (median of the per-round ratios, and their range); JSON in
``benchmarks/results/``.

    python -m benchmarks.join_reads [--backend all] [--accounts 1] [--reads 1000] [--rounds 5] \\
        [--json PATH]

With ``--instructions`` it counts client instructions per read instead
(callgrind; driver included, server excluded, so the machine's load does
not move it) of the join and the raw code, as ``benchmarks.unit_instructions``
does: the data seeded once, then each variant run under ``valgrind
--tool=callgrind`` for ``SMALL`` and ``LARGE`` reads in a process of its own,
(large - small) / (LARGE - SMALL) reported.

    python -m benchmarks.join_reads --instructions [--backend all] [--accounts 1] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common
from . import _sqlalchemy as sa

ACCOUNTS = 200
TRANSFERS_EACH = 100
SCHEMA = af.Schema(
    "joins",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Index("by_owner", ["owner"], unique=True),
    ),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("dst", "accounts"),
        af.Column("amount", "bigint"),
        af.Column("seq", "bigint"),
        af.Index("by_src", ["src", "seq"]),
    ),
)
Read = Callable[[str], Awaitable[Any]]


async def seed(db: af.Database) -> None:
    for table in ("transfers", "accounts"):
        ident = db.layout(SCHEMA).table(table).identifier
        await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=ident))
    with contextlib.suppress(af.ProgrammingError):  # (no settings table before a migration)
        await db.execute(
            af.sql(
                "DELETE FROM {t} WHERE {k} LIKE {p}",
                t=af.Identifier("fragno_db_settings"),
                k=af.Identifier("key"),
                p="default.%",
            )
        )
    await db.migrate(SCHEMA)

    async def accounts(uow: af.UnitOfWork) -> list[af.RowId]:
        return [uow.create("accounts", {"owner": common.owner(i)}) for i in range(ACCOUNTS)]

    ids = await db.execute_uow(accounts, schema=SCHEMA)
    rng = random.Random(7)

    async def transfers(uow: af.UnitOfWork) -> None:
        for seq in range(TRANSFERS_EACH):
            for src in ids:
                dst = ids[rng.randrange(ACCOUNTS)]
                uow.create("transfers", {"src": src, "dst": dst, "amount": seq, "seq": seq})

    await db.execute_uow(transfers, schema=SCHEMA)


def aiofragno_read(db: af.Database, page: int) -> Read:
    async def read(owner: str) -> Any:
        async def unit(uow: af.UnitOfWork) -> Any:
            accounts = uow.find(
                "accounts",
                where=af.c.owner >= owner,
                order_by="owner",
                limit=page,
                join={"recent": af.many("transfers", by="src", order_by=("seq", "desc"), limit=10)},
            )
            await uow.retrieve()
            return accounts.result

        rows = await db.execute_uow(unit, schema=SCHEMA)
        assert len(rows) == page and all(len(row["recent"]) == 10 for row in rows)
        return rows

    return read


def aiofragno_two_reads(db: af.Database, page: int) -> Read:
    """The same without a join: the accounts, then (a second retrieve) one
    find per account, all in that retrieve's round trip."""

    async def read(owner: str) -> Any:
        async def unit(uow: af.UnitOfWork) -> Any:
            accounts = uow.find("accounts", where=af.c.owner >= owner, order_by="owner", limit=page)
            await uow.retrieve()
            recent = [
                uow.find("transfers", where={"src": row["id"]}, order_by=("seq", "desc"), limit=10)
                for row in accounts.result
            ]
            await uow.retrieve()
            return [
                {**row, "recent": r.result} for row, r in zip(accounts.result, recent, strict=True)
            ]

        rows = await db.execute_uow(unit, schema=SCHEMA)
        assert len(rows) == page and all(len(row["recent"]) == 10 for row in rows)
        return rows

    return read


def raw_sql(db: af.Database, placeholder: str, page: int) -> tuple[str, str]:
    layout = db.layout(SCHEMA)
    quote = db._engine.compiler.quote_identifier

    def name(table: str) -> str:
        return ".".join(quote(p) for p in layout.table(table).identifier.parts)

    accounts, transfers = name("accounts"), name("transfers")
    account = (
        f'SELECT "_id", "id", "_version", "owner", "balance" FROM {accounts} '
        f'WHERE "owner" >= {placeholder} ORDER BY "owner" LIMIT {page}'
    )
    recent = (
        f't."_id", t."id", t."_version", s."id" AS "src", d."id" AS "dst", t."amount", t."seq" '
        f"FROM {transfers} t "
        f'JOIN {accounts} s ON s."_id" = t."src" JOIN {accounts} d ON d."_id" = t."dst" '
        f'WHERE t."src" = {placeholder} ORDER BY t."seq" DESC LIMIT 10'
    )
    if quote("x") == "`x`":
        account, recent = account.replace('"', "`"), recent.replace('"', "`")
    return account, "SELECT " + recent


ACCOUNT_COLUMNS = ("_id", "id", "_version", "owner", "balance")
TRANSFER_COLUMNS = ("_id", "id", "_version", "src", "dst", "amount", "seq")


def _nested(account: dict[str, Any], recent: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(recent) == 10
    account["recent"] = recent
    return account


async def raw_asyncpg(target: common.Target, db: af.Database, page: int) -> tuple[Read, Any]:
    pool = await common.asyncpg_pool(target, 1)
    account_sql, recent_sql = raw_sql(db, "$1", page)

    async def read(owner: str) -> Any:
        async with pool.acquire() as conn:
            rows = [
                _nested(dict(account), list(map(dict, await conn.fetch(recent_sql, account[0]))))
                for account in await conn.fetch(account_sql, owner)
            ]
        assert len(rows) == page
        return rows

    return read, pool.close


async def raw_asyncmy(target: common.Target, db: af.Database, page: int) -> tuple[Read, Any]:
    pool = await common.asyncmy_pool(target, 1)
    account_sql, recent_sql = raw_sql(db, "%s", page)

    async def read(owner: str) -> Any:
        rows = []
        async with pool.acquire() as conn, conn.cursor() as cursor:
            await cursor.execute(account_sql, (owner,))
            for account in await cursor.fetchall():
                await cursor.execute(recent_sql, (account[0],))
                recent = [
                    dict(zip(TRANSFER_COLUMNS, r, strict=True)) for r in await cursor.fetchall()
                ]
                rows.append(_nested(dict(zip(ACCOUNT_COLUMNS, account, strict=True)), recent))
        assert len(rows) == page
        return rows

    async def close() -> None:
        pool.close()
        await pool.wait_closed()

    return read, close


async def raw_sqlite(target: common.Target, db: af.Database, page: int) -> tuple[Read, Any]:
    conn = sqlite3.connect(target.sqlite_path, isolation_level=None, check_same_thread=False)
    account_sql, recent_sql = raw_sql(db, "?", page)

    def fetch(sql: str, param: Any) -> list[Any]:
        return conn.execute(sql, (param,)).fetchall()

    async def read(owner: str) -> Any:
        # (One thread hop per statement, as async code on sqlite3 does it.)
        rows = []
        for account in await asyncio.to_thread(fetch, account_sql, owner):
            recent = await asyncio.to_thread(fetch, recent_sql, account[0])
            recent = [dict(zip(TRANSFER_COLUMNS, r, strict=True)) for r in recent]
            rows.append(_nested(dict(zip(ACCOUNT_COLUMNS, account, strict=True)), recent))
        assert len(rows) == page
        return rows

    async def close() -> None:
        conn.close()

    return read, close


def _models(db: af.Database) -> tuple[Any, Any]:
    """ORM classes over the tables ``seed`` migrated (their Core tables:
    ``Model.__table__``)."""
    from sqlalchemy import BigInteger, ForeignKey, Integer, String
    from sqlalchemy.orm import DeclarativeBase, mapped_column, relationship

    layout = db.layout(SCHEMA)
    accounts = layout.table("accounts").identifier.parts
    transfers = layout.table("transfers").identifier.parts
    account_pk = ".".join([*accounts, "_id"])

    class Base(DeclarativeBase):
        pass

    class Account(Base):
        __tablename__ = accounts[-1]
        __table_args__ = {"schema": sa.schema_of(accounts)}
        pk = mapped_column("_id", sa.internal_id(), primary_key=True)
        id = mapped_column(String(64))
        version = mapped_column("_version", Integer)
        owner = mapped_column(String(255))
        balance = mapped_column(BigInteger)

    class Transfer(Base):
        __tablename__ = transfers[-1]
        __table_args__ = {"schema": sa.schema_of(transfers)}
        pk = mapped_column("_id", sa.internal_id(), primary_key=True)
        id = mapped_column(String(64))
        version = mapped_column("_version", Integer)
        src = mapped_column(BigInteger, ForeignKey(account_pk))
        dst = mapped_column(BigInteger, ForeignKey(account_pk))
        amount = mapped_column(BigInteger)
        seq = mapped_column(BigInteger)
        src_account = relationship(Account, foreign_keys=[src])
        dst_account = relationship(Account, foreign_keys=[dst])

    return Account, Transfer


def sqlalchemy_core(engine: Any, models: tuple[Any, Any], page: int) -> Read:
    from sqlalchemy import bindparam, select

    a, t = (model.__table__ for model in models)
    s, d = a.alias("s"), a.alias("d")
    accounts = (
        select(a.c._id, a.c.id, a.c._version, a.c.owner, a.c.balance)
        .where(a.c.owner >= bindparam("owner"))
        .order_by(a.c.owner)
        .limit(page)
    )
    recent = (
        select(
            t.c._id,
            t.c.id,
            t.c._version,
            s.c.id.label("src"),
            d.c.id.label("dst"),
            t.c.amount,
            t.c.seq,
        )
        .join(s, s.c._id == t.c.src)
        .join(d, d.c._id == t.c.dst)
        .where(t.c.src == bindparam("src"))
        .order_by(t.c.seq.desc())
        .limit(10)
    )

    async def read(owner: str) -> Any:
        async with engine.connect() as conn:
            rows = []
            for account in await conn.execute(accounts, {"owner": owner}):
                found = await conn.execute(recent, {"src": account._id})
                rows.append(_nested(account._asdict(), [r._asdict() for r in found]))
        assert len(rows) == page
        return rows

    return read


def sqlalchemy_orm(engine: Any, models: tuple[Any, Any], page: int) -> Read:
    from sqlalchemy import select
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import joinedload

    account, transfer = models
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    referenced = [
        joinedload(transfer.src_account).load_only(account.id),
        joinedload(transfer.dst_account).load_only(account.id),
    ]

    async def read(owner: str) -> Any:
        async with sessions() as session:
            found = await session.scalars(
                select(account).where(account.owner >= owner).order_by(account.owner).limit(page)
            )
            rows = []
            for a in found.all():
                recent = await session.scalars(
                    select(transfer)
                    .where(transfer.src == a.pk)
                    .order_by(transfer.seq.desc())
                    .limit(10)
                    .options(*referenced)
                )
                transfers = recent.all()
                assert len(transfers) == 10 and transfers[0].src_account.id == a.id
                rows.append((a, transfers))
        assert len(rows) == page
        return rows

    return read


RAW = {"postgresql": raw_asyncpg, "mysql": raw_asyncmy, "sqlite": raw_sqlite}


async def timed(read: Read, owners: Sequence[str]) -> float:
    started = time.perf_counter()
    for owner in owners:
        await read(owner)
    return len(owners) / (time.perf_counter() - started)


VARIANTS = ("join", "two-retrieves", "raw", "sqlalchemy-core", "sqlalchemy-orm")
RATIOS = [("join", other) for other in VARIANTS[1:]]


async def run_backend(
    dialect: str, page: int, reads: int, rounds: int, tmp: Path
) -> dict[str, Any] | None:
    async with common.target(dialect, tmp) as target:
        if target is None:
            return None
        async with af.connect(target.url, pool_size=2) as db:
            await seed(db)
            raw, close = await RAW[dialect](target, db, page)
            engine = await sa.engine(target, pool_size=1)
            models = _models(db)
            try:
                rng = random.Random(1)
                owners = [common.owner(rng.randrange(ACCOUNTS - page + 1)) for _ in range(reads)]
                variants = dict(
                    zip(
                        VARIANTS,
                        [
                            aiofragno_read(db, page),
                            aiofragno_two_reads(db, page),
                            raw,
                            sqlalchemy_core(engine, models, page),
                            sqlalchemy_orm(engine, models, page),
                        ],
                        strict=True,
                    )
                )
                for read in variants.values():
                    await timed(read, owners[:100])  # warm-up
                rates = await common.interleaved(
                    {name: partial(timed, read, owners) for name, read in variants.items()}, rounds
                )
            finally:
                await close()
                await engine.dispose()
    return {
        "reads_per_s": {n: statistics.median(r) for n, r in rates.items()},
        "rounds": rates,
        "ratios": {f"{a} / {b}": common.round_ratios(rates, a, b) for a, b in RATIOS},
    }


SMALL, LARGE = 100, 600
COUNTED = ("join", "raw")


async def measured(dialect: str, url: str, page: int, variant: str, reads: int) -> None:
    """``reads`` reads of ``variant`` on seeded data (the process callgrind counts)."""
    target = common.Target(dialect, url)
    async with af.connect(url, pool_size=2) as db:
        await db.migrate(SCHEMA)
        if variant == "join":
            read, close = aiofragno_read(db, page), None
        else:
            read, close = await RAW[dialect](target, db, page)
        owners = [common.owner(i % (ACCOUNTS - page + 1)) for i in range(reads)]
        try:
            for owner in owners:
                await read(owner)
        finally:
            if close is not None:
                await close()


def count_instructions(dialect: str, url: str, page: int, variant: str, reads: int) -> int:
    """Total client instructions callgrind counts for :func:`measured`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, "-m", "benchmarks.join_reads", "--measure", variant,
            "--backend", dialect, "--url", url, "--accounts", str(page), "--reads", str(reads),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(common.ROOT)}
        subprocess.run(command, env=env, check=True, capture_output=True, cwd=common.ROOT)
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if summary is None:
            raise RuntimeError(f"no summary line in {out}")
        return int(summary[1])


async def instructions(args: argparse.Namespace, backends: Sequence[str]) -> None:
    results: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-joins-") as tmp:
        for dialect in backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is None:
                    continue
                async with af.connect(target.url, pool_size=2) as db:
                    await seed(db)
                per_read = {}
                for variant in COUNTED:
                    small, large = (
                        count_instructions(dialect, target.url, args.accounts, variant, n)
                        for n in (SMALL, LARGE)
                    )
                    per_read[variant] = round((large - small) / (LARGE - SMALL))
                    print(f"{dialect} {variant}: {per_read[variant]} instructions per read")
                results[dialect] = per_read
    common.write_json(
        args.json or common.default_json_path("join_reads-instructions"),
        {
            "benchmark": "join_reads --instructions",
            "accounts_per_read": args.accounts,
            "what": "client instructions per read (callgrind; driver included, server "
            f"excluded): ({LARGE}-read run - {SMALL}-read run) / {LARGE - SMALL}",
            "results": results,
            "machine": common.machine_info({}),
        },
    )


async def main(args: argparse.Namespace) -> None:
    if args.measure is not None:
        await measured(args.backend, args.url, args.accounts, args.measure, args.reads)
        return
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    if args.instructions:
        await instructions(args, backends)
        return
    results = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-joins-") as tmp:
        for dialect in backends:
            result = await run_backend(dialect, args.accounts, args.reads, args.rounds, Path(tmp))
            if result is not None:
                results[dialect] = result
    common.print_table(
        ["backend", *(f"{n}/s" for n in VARIANTS)],
        [[d, *(f"{r['reads_per_s'][n]:.0f}" for n in VARIANTS)] for d, r in results.items()],
    )
    print()
    common.print_table(
        ["backend", *(f"{a} / {b}" for a, b in RATIOS)],
        [[d, *map(common.ratio_cell, r["ratios"].values())] for d, r in results.items()],
    )
    common.write_json(
        args.json or common.default_json_path("join_reads"),
        {
            "benchmark": "join_reads",
            "accounts_per_read": args.accounts,
            "reads": args.reads,
            "rounds": args.rounds,
            "results": results,
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=["all", *common.BACKENDS])
    parser.add_argument("--accounts", type=int, default=1, help="accounts per read")
    parser.add_argument("--reads", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--measure", choices=COUNTED, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    asyncio.run(main(parser.parse_args()))
