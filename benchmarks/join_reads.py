"""A read with a join: a page of ``--accounts`` accounts (1: one account)
each with its last 10 transfers (of 100).

aiofragno: ``find("accounts", where=af.c.owner >= o, order_by="owner",
limit=N, join={"recent": af.many("transfers", by="src", order_by=("seq",
"desc"), limit=10)})`` — one round trip (one statement on PostgreSQL).
two-retrieves: aiofragno without a join — the accounts, then a second
retrieve with one find per account (one more round trip). raw:
hand-written code on the driver, as a repository function would do it: the
accounts, then each one's transfers (``WHERE src = ? ORDER BY seq DESC
LIMIT 10``), 1 + N statements on one connection, with the same columns
(references' external ids joined). Interleaved in rounds, one read at a
time; reported: reads/s per variant and the join's ratios to the others
per backend (median over rounds, and their range).

    python -m benchmarks.join_reads [--backend all] [--accounts 1] [--reads 1000] [--rounds 5]
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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common

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
        f't."_id", t."id", t."_version", s."id", d."id", t."amount", t."seq" FROM {transfers} t '
        f'JOIN {accounts} s ON s."_id" = t."src" JOIN {accounts} d ON d."_id" = t."dst" '
        f'WHERE t."src" = {placeholder} ORDER BY t."seq" DESC LIMIT 10'
    )
    if quote("x") == "`x`":
        account, recent = account.replace('"', "`"), recent.replace('"', "`")
    return account, "SELECT " + recent


async def raw_asyncpg(target: common.Target, db: af.Database, page: int) -> tuple[Read, Any]:
    import asyncpg

    url = target.parsed
    conn = await asyncpg.connect(
        host=url.host, port=url.port, user=url.username, database=url.database
    )
    account_sql, recent_sql = raw_sql(db, "$1", page)

    async def read(owner: str) -> Any:
        rows = []
        for account in await conn.fetch(account_sql, owner):
            recent = await conn.fetch(recent_sql, account[0])
            assert len(recent) == 10
            rows.append((account, recent))
        assert len(rows) == page
        return rows

    return read, conn.close


async def raw_asyncmy(target: common.Target, db: af.Database, page: int) -> tuple[Read, Any]:
    import asyncmy

    conn = await asyncmy.connect(**common.asyncmy_options(target.url), charset="utf8mb4")
    account_sql, recent_sql = raw_sql(db, "%s", page)

    async def read(owner: str) -> Any:
        rows = []
        async with conn.cursor() as cursor:
            await cursor.execute(account_sql, (owner,))
            for account in await cursor.fetchall():
                await cursor.execute(recent_sql, (account[0],))
                recent = await cursor.fetchall()
                assert len(recent) == 10
                rows.append((account, recent))
        assert len(rows) == page
        return rows

    async def close() -> None:
        await conn.ensure_closed()

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
            assert len(recent) == 10
            rows.append((account, recent))
        assert len(rows) == page
        return rows

    async def close() -> None:
        conn.close()

    return read, close


RAW = {"postgresql": raw_asyncpg, "mysql": raw_asyncmy, "sqlite": raw_sqlite}


async def timed(read: Read, owners: Sequence[str]) -> float:
    started = time.perf_counter()
    for owner in owners:
        await read(owner)
    return len(owners) / (time.perf_counter() - started)


async def run_backend(
    dialect: str, page: int, reads: int, rounds: int, tmp: Path
) -> dict[str, Any] | None:
    async with common.target(dialect, tmp) as target:
        if target is None:
            return None
        async with af.connect(target.url, pool_size=2) as db:
            await seed(db)
            raw, close = await RAW[dialect](target, db, page)
            rng = random.Random(1)
            owners = [common.owner(rng.randrange(ACCOUNTS - page + 1)) for _ in range(reads)]
            order = [
                ("join", aiofragno_read(db, page)),
                ("two-retrieves", aiofragno_two_reads(db, page)),
                ("raw", raw),
            ]
            for _, read in order:
                await timed(read, owners[:100])  # warm-up
            rates: dict[str, list[float]] = {name: [] for name, _ in order}
            for i in range(rounds):
                for name, read in order if i % 2 == 0 else reversed(order):
                    rates[name].append(await timed(read, owners))
            await close()
    result: dict[str, Any] = {f"{n} reads/s": statistics.median(r) for n, r in rates.items()}
    for other in ("two-retrieves", "raw"):
        ratios = [a / b for a, b in zip(rates["join"], rates[other], strict=True)]
        result[f"join / {other}"] = (statistics.median(ratios), min(ratios), max(ratios))
    return result


async def main(args: argparse.Namespace) -> None:
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    rows = []
    with tempfile.TemporaryDirectory(prefix="aiofragno-joins-") as tmp:
        for dialect in backends:
            result = await run_backend(dialect, args.accounts, args.reads, args.rounds, Path(tmp))
            if result is not None:
                rows.append(
                    [
                        dialect,
                        *(
                            f"{result[f'{n} reads/s']:.0f}"
                            for n in ("join", "two-retrieves", "raw")
                        ),
                        *(
                            "{:.2f} ({:.2f}-{:.2f})".format(*result[f"join / {n}"])
                            for n in ("two-retrieves", "raw")
                        ),
                    ]
                )
    headers = ["backend", "join/s", "two retrieves/s", "raw/s", "join / two", "join / raw"]
    common.print_table(headers, rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=["all", *common.BACKENDS])
    parser.add_argument("--accounts", type=int, default=1, help="accounts per read")
    parser.add_argument("--reads", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
