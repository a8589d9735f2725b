"""``aiofragno demo``: a tour on the embedded SQLite default (or ``--url``).

Declares a schema, migrates it, opens accounts, runs concurrent transfers that
conflict and are retried, then lets an outbox consumer catch up — and checks
that money was conserved and every committed unit left exactly one outbox
entry.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from .database import Database, connect
from .schema import Column, Index, Reference, Schema, Table, tables_in_dependency_order
from .settings_table import settings_names
from .sql import Identifier, sql
from .uow import ExponentialBackoff, UnitOfWork, UowHooks
from .uow.expr import c

SHOP = Schema(
    "shop",
    Table(
        "accounts",
        Column("owner", "string"),
        Column("balance", "bigint", default=0),
        Index("by_owner", ["owner"], unique=True),
    ),
    Table(
        "transfers",
        Reference("src", "accounts"),
        Reference("dst", "accounts"),
        Column("amount", "bigint"),
    ),
)
ACCOUNTS = 50
OPENING_BALANCE = 1_000


class Progress:
    """A progress bar through rich when it is installed, plain lines otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        try:
            from rich.progress import Progress as RichProgress
        except ImportError:
            self._rich: Any = None
            print(f"{label}: {total} units")
            return
        self._rich = RichProgress(transient=False)
        self._task = self._rich.add_task(label, total=total)
        self._rich.start()

    def advance(self) -> None:
        self.done += 1
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done)
        elif self.done % max(1, self.total // 4) == 0:
            print(f"  {self.done}/{self.total}")

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()


async def open_accounts(db: Database, namespace: str | None = None) -> None:
    async def open_all(uow: UnitOfWork) -> None:
        for i in range(ACCOUNTS):
            uow.create("accounts", {"owner": f"user{i:02}", "balance": OPENING_BALANCE})

    await db.execute_uow(open_all, schema=SHOP, namespace=namespace)


async def transfer(uow: UnitOfWork) -> None:
    src, dst = random.sample(range(ACCOUNTS), 2)
    a = uow.find_first("accounts", where=c.owner == f"user{src:02}")
    b = uow.find_first("accounts", where={"owner": f"user{dst:02}"})
    await uow.retrieve()
    acc_a, acc_b = a.result, b.result
    if acc_a is None or acc_b is None:
        raise LookupError("an account of the transfer does not exist")
    amount = random.randint(1, 50)
    uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - amount}, check=True)
    uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + amount}, check=True)
    uow.create("transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": amount})


async def run_transfers(
    db: Database, units: int, concurrency: int, namespace: str | None = None
) -> tuple[int, float]:
    conflicts = 0

    def count_conflict(uow: UnitOfWork, exc: Exception) -> None:
        nonlocal conflicts
        conflicts += 1

    hooks = UowHooks(on_conflict=count_conflict)
    retry = ExponentialBackoff(max_retries=50, initial=0.002, maximum=0.05)
    limiter = anyio.CapacityLimiter(concurrency)
    progress = Progress(units, f"transfers (concurrency {concurrency})")

    async def one() -> None:
        async with limiter:
            await db.execute_uow(
                transfer, schema=SHOP, namespace=namespace, retry=retry, hooks=hooks
            )
        progress.advance()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(units):
            tg.start_soon(one)
    progress.close()
    return conflicts, time.perf_counter() - started


async def summary(db: Database, namespace: str | None) -> tuple[int, int, list[dict[str, Any]]]:
    async def read(uow: UnitOfWork) -> tuple[int, int, list[dict[str, Any]]]:
        accounts = uow.find("accounts", order_by=("balance", "desc"))
        transfers = uow.count("transfers")
        await uow.retrieve()
        rows = accounts.result
        return sum(r["balance"] for r in rows), transfers.result, rows[:3]

    result: tuple[int, int, list[dict[str, Any]]] = await db.execute_uow(
        read, schema=SHOP, namespace=namespace
    )
    return result


async def run_demo(url: str | None, *, units: int = 400, concurrency: int = 16) -> None:
    """The tour on a temporary SQLite file, or on ``url`` in a namespace of its
    own that is dropped afterwards (so it can run against any database)."""
    with tempfile.TemporaryDirectory(prefix="aiofragno-demo-") as tmp:
        namespace = "shop" if url is None else f"demo{random.getrandbits(32):08x}"
        async with connect(url or f"sqlite:///{Path(tmp) / 'demo.db'}", outbox=True) as db:
            try:
                await tour(db, units, concurrency, namespace)
            finally:
                if url is not None:
                    await drop_namespace(db, namespace)


async def drop_namespace(db: Database, namespace: str, schema: Schema = SHOP) -> None:
    """Drop what migrating ``schema`` into ``namespace`` made: its tables
    (those that reference others first), its database schema (PostgreSQL)
    and its migration's settings rows."""
    layout = db.layout(schema, namespace)
    for table in reversed(list(tables_in_dependency_order(schema))):
        await db.execute(sql("DROP TABLE IF EXISTS {t}", t=layout.table(table.name).identifier))
    for db_schema in layout.db_schemas:
        await db.execute(sql("DROP SCHEMA IF EXISTS {s}", s=Identifier(db_schema)))
    names = settings_names()
    await db.execute(
        sql("DELETE FROM {t} WHERE {k} LIKE {p}", t=names["t"], k=names["k"], p=f"{namespace}.%")
    )


async def tour(db: Database, units: int, concurrency: int, namespace: str) -> None:
    print(f"aiofragno demo on {db.url.describe()} (backend {db.backend})\n")
    print(f"1. migration SQL for schema 'shop' (namespace {namespace!r}):")
    for statement in await db.migration_sql(SHOP, namespace=namespace):
        print("   " + statement.replace("\n", "\n   ") + ";")
    result = await db.migrate(SHOP, namespace=namespace)
    print(f"   migrated: schema version {result.version}\n")
    start = await db.outbox.latest()
    await open_accounts(db, namespace)
    print(f"2. opened {ACCOUNTS} accounts with {OPENING_BALANCE} each\n")
    print(f"3. {units} transfers, each reading two accounts and updating both with a version check")
    conflicts, seconds = await run_transfers(db, units, concurrency, namespace)
    print(
        f"   done in {seconds:.2f}s ({units / seconds:.0f} units/s); {conflicts} conflicts retried\n"
    )
    total, transfers, top = await summary(db, namespace)
    expected = ACCOUNTS * OPENING_BALANCE
    print(
        f"4. money conserved: {total} == {expected}: {total == expected}; transfer rows: {transfers}"
    )
    print("   richest: " + ", ".join(f"{r['owner']}={r['balance']}" for r in top) + "\n")
    await outbox_tour(db, start, units)


async def outbox_tour(db: Database, start: str | None, units: int) -> None:
    consumer = db.outbox.consumer(f"demo-{random.getrandbits(32):08x}")
    stamps: list[str] = []

    async def handle(entry: Any) -> None:
        stamps.append(entry.versionstamp)

    lag = await consumer.lag()
    delivered = await consumer.run(handle, until_caught_up=True, batch_size=500)
    mine = [s for s in stamps if start is None or s > start]
    contiguous = all(int(b[:20], 16) == int(a[:20], 16) + 1 for a, b in itertools.pairwise(mine))
    print(
        f"5. outbox: consumer caught up from lag {lag}: {delivered} entries delivered in commit order"
    )
    print(
        f"   {len(mine)} entries for {units + 1} committed units; versions contiguous: {contiguous}"
    )
    print(f"   last versionstamp {stamps[-1] if stamps else None}; lag now {await consumer.lag()}")
