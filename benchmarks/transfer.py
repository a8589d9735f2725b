"""The "transfer" benchmark (DESIGN.md, "Targets").

1,000 accounts; each unit reads two random accounts by owner (the retrieval
phase, outside any transaction), then in one transaction updates both with a
version check (``UPDATE ... SET balance = ?, _version = _version + 1 WHERE id
= ? AND _version = ?``; 0 rows = conflict, and the whole unit is retried) and
inserts a transfer row. The same work, written five ways per backend:

* ``aiofragno``: ``db.execute_uow`` (outbox off);
* ``aiofragno+outbox``: the same with ``outbox="counter"`` (the default
  strategy outside PostgreSQL);
* ``aiofragno+ticks`` (PostgreSQL): the same with ``outbox="ticks"``, a task
  ticking every 10 ms beside the workers, as a consumer's polls would;
* ``raw``: hand-written code on the driver alone, sending the same statements
  aiofragno sends (2 SELECTs; BEGIN, 2 checked UPDATEs, 1 INSERT, COMMIT) to
  the same tables, on one pooled connection per attempt: asyncpg with its
  pool (no reset query on release: only the statements above); aiosqlite with
  aiofragno's pragmas (WAL, busy_timeout, foreign_keys), BEGIN IMMEDIATE and an
  asyncio.Lock admitting one writer at a time; asyncmy with its pool,
  FOUND_ROWS, autocommit and explicit begin;
* ``raw+outbox``: ``raw`` plus the unit's outbox entry before COMMIT -- the
  payload built by hand, then the statements aiofragno's outbox writer sends
  (reserve the version, insert the entry), one round trip each: what the
  gap-free, commit-ordered outbox costs hand-written code, so that
  ``aiofragno+outbox`` can be read against it as well as against ``raw``;
* ``sqlalchemy``: the SQLAlchemy 2 asyncio ORM with ``version_id_col`` on the
  same ``_version`` column (select by owner, modify, add, commit; on
  StaleDataError retry), on its async drivers.

On SQLite two more: ``aiofragno-thread`` (aiofragno's default SQLite backend:
sqlite3 on worker threads) and ``raw-thread`` (sqlite3 through
``asyncio.to_thread``, one hop per statement).

Every variant uses the same retry policy (aiofragno's backoff formula), pools
of ``POOL_SIZE`` connections and the same sequence of transfers; every unit
updates its two accounts in account order (no lock-order deadlocks). Per
backend and concurrency: each variant warms up (untimed), then the variants run
in turn, ``--rounds`` times (default 4, ``--units`` split evenly; order reversed
every other round) so that machine noise hits all alike, each run on freshly
reset tables; a run is checked afterwards (money conserved, one transfer row
per unit, and one outbox entry per unit with gap-free versions where the
variant writes them). Results: a table per backend x concurrency (units/s = all units /
all run time; p50/p99 of unit latency including retries; conflicts = retried
attempts; CPU us/unit = this process's CPU time, driver threads included,
server excluded -- steadier than wall time on a busy machine -- split into the
event loop's thread and the other threads, beside the server processes' CPU
when the server runs on this machine: see ``cpu_meter``), the ratios --
overall, and the median and range of the per-round ratios, which pair runs of
the same round -- and JSON in ``benchmarks/results/``.

    python -m benchmarks.transfer --backend sqlite|postgresql|mysql|all \\
        --units 2000 --concurrency 1,16 [--json PATH]
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.codec import utc_now
from aiofragno.outbox.ticks import tick
from aiofragno.schema import new_external_id

from . import _common as common
from . import _sqlalchemy as sa
from ._common import POOL_SIZE, SCHEMA, Backoff, Target, owner
from .cpu_meter import NO_CPU, CpuSample, CpuUsed, server_commands

WARMUP = 100
TICK_EVERY = 0.01


class Conflict(Exception):
    """A checked UPDATE matched no row."""


def driver_conflict(exc: BaseException | None) -> bool:
    """A driver error that means "retry the unit": serialization failure or
    deadlock (PostgreSQL 40001/40P01, MySQL 1213/1205), SQLite busy."""
    if exc is None:
        return False
    if getattr(exc, "sqlstate", None) in ("40001", "40P01"):
        return True
    if getattr(exc, "sqlite_errorcode", None) in (5, 6, 517):
        return True
    args: tuple[Any, ...] = exc.args
    return bool(args) and args[0] in (1213, 1205)


# -- variants --------------------------------------------------------------------


class Variant(abc.ABC):
    """One way of running the transfer unit against one database."""

    name: str
    driver: str
    outbox = False  # writes an outbox entry per unit

    def __init__(self, target: Target) -> None:
        self.target = target
        self.policy = Backoff()

    @abc.abstractmethod
    async def open(self, admin: af.Database) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def ticker(self) -> None:  # noqa: B027 (most variants run nothing beside)
        """What runs beside the workers (the outbox's ticks), if anything."""

    async def transfer(self, lo: int, hi: int, amount: int) -> None:
        """One unit, retried on conflict under ``self.policy``."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.attempt(lo, hi, amount)
                return
            except Exception as exc:
                if not (isinstance(exc, Conflict) or self.is_conflict(exc)):
                    raise
                delay = self.policy.delay(attempt)
                if delay is None:
                    raise
            await asyncio.sleep(delay)

    async def attempt(self, lo: int, hi: int, amount: int) -> None:
        raise NotImplementedError

    def is_conflict(self, exc: Exception) -> bool:
        return driver_conflict(exc)


class Aiofragno(Variant):
    """``outbox``: False, or the strategy: "counter" (``aiofragno+outbox``)
    or "ticks" (``aiofragno+ticks``, PostgreSQL: a task of the same process
    ticks every ``TICK_EVERY`` seconds meanwhile, as a consumer would)."""

    def __init__(self, target: Target, *, outbox: bool | str = False, backend: str | None = None):
        super().__init__(target)
        self.strategy = outbox
        self.outbox = bool(outbox)
        self.backend = backend
        self.name = {False: "aiofragno", "ticks": "aiofragno+ticks"}.get(outbox, "aiofragno+outbox")
        if backend == "sqlite":
            self.name += "-thread"

    async def open(self, admin: af.Database) -> None:
        self.db = await af.connect(
            self.target.url, backend=self.backend, outbox=self.strategy, pool_size=POOL_SIZE
        )
        self.driver = self.db.backend
        # (The ticks' own Database, as a consumer's would be: not the workers' pool.)
        if self.strategy == "ticks":
            self.ticks_db = await af.connect(self.target.url, pool_size=1)

    async def ticker(self) -> None:
        if self.strategy != "ticks":
            return
        while True:
            await tick(self.ticks_db._engine)
            await asyncio.sleep(TICK_EVERY)

    async def close(self) -> None:
        await self.db.close()
        if self.strategy == "ticks":
            await self.ticks_db.close()

    async def transfer(self, lo: int, hi: int, amount: int) -> None:
        await self.db.execute_uow(
            common.transfer_unit(lo, hi, amount), schema=SCHEMA, retry=self.policy
        )


@dataclass(frozen=True)
class Statements:
    """The statements aiofragno sends for the unit, in a driver's placeholder style."""

    select: str
    update: str
    insert: str

    @classmethod
    def build(cls, names: common.Names, placeholder: Callable[[int], str]) -> Statements:
        q, p = names.quote, placeholder
        accounts, transfers = names.qualified(names.accounts), names.qualified(names.transfers)
        columns = ", ".join(f"t.{q(c)}" for c in ("_id", "id", "_version", "owner", "balance"))
        return cls(
            select=f"SELECT {columns} FROM {accounts} t WHERE t.{q('owner')} = {p(1)} "
            f"ORDER BY t.{q('_id')} LIMIT {p(2)}",
            update=f"UPDATE {accounts} SET {q('balance')} = {p(1)}, {q('_version')} = "
            f"{q('_version')} + 1 WHERE {q('id')} = {p(2)} AND {q('_version')} = {p(3)}",
            insert=f"INSERT INTO {transfers} ({q('id')}, {q('src')}, {q('dst')}, {q('amount')}) "
            f"VALUES ({p(1)}, {p(2)}, {p(3)}, {p(4)})",
        )


class Raw(Variant):
    """Hand-written: one connection per attempt; rows are tuples
    (_id, id, _version, owner, balance). Subclasses supply the driver calls.
    With ``outbox``, the unit also writes its outbox entry before COMMIT: the
    payload built by hand, then aiofragno's entry statements (their SQL text,
    taken from the engine's ``outbox_statements``), one round trip each."""

    name = "raw"
    placeholder: Callable[[int], str] = staticmethod(lambda i: "?")

    def __init__(self, target: Target, *, outbox: bool = False) -> None:
        super().__init__(target)
        self.outbox = outbox
        if outbox:
            self.name += "+outbox"

    async def open(self, admin: af.Database) -> None:
        self.sql = Statements.build(common.names(admin), self.placeholder)
        self.entry_statements = admin._engine.outbox_statements
        self.encode_time = admin._engine.codec.encoder("timestamp")
        await self.connect()

    async def attempt(self, lo: int, hi: int, amount: int) -> None:
        async with self.connection() as conn:
            a = await self.fetch_row(conn, self.sql.select, (owner(lo), 2))
            b = await self.fetch_row(conn, self.sql.select, (owner(hi), 2))
            await self.begin(conn)
            try:
                if await self.write(conn, self.sql.update, (a[4] - amount, a[1], a[2])) != 1:
                    raise Conflict(owner(lo))
                if await self.write(conn, self.sql.update, (b[4] + amount, b[1], b[2])) != 1:
                    raise Conflict(owner(hi))
                transfer = new_external_id()
                await self.write(conn, self.sql.insert, (transfer, a[0], b[0], amount))
                if self.outbox:
                    await self.write_entry(conn, a, b, amount, transfer)
                await self.commit(conn)
            except BaseException:
                await self.rollback(conn)
                raise

    async def write_entry(
        self, conn: Any, a: Sequence[Any], b: Sequence[Any], amount: int, transfer: str
    ) -> None:
        stand_in = os.urandom(10).hex()  # the database puts the reserved version in its place
        where = {"schema": SCHEMA.name, "namespace": SCHEMA.name}
        mutations = [
            {
                "op": "update",
                **where,
                "table": "accounts",
                "external_id": row[1],
                "versionstamp": f"{stand_in}000{i}",
                "set": {"balance": balance},
                "check_version": row[2],
            }
            for i, (row, balance) in enumerate(((a, a[4] - amount), (b, b[4] + amount)))
        ]
        mutations.append(
            {
                "op": "create",
                **where,
                "table": "transfers",
                "external_id": transfer,
                "versionstamp": f"{stand_in}0002",
                "values": {"src": a[1], "dst": b[1], "amount": amount},
            }
        )
        queries = self.entry_statements.queries(
            {
                "stamp": stand_in + "0000",
                "stand_in": stand_in,
                "uow_id": str(uuid.uuid4()),
                "payload": json.dumps(
                    {"version": 1, "mutations": mutations}, separators=(",", ":")
                ),
                "refs": json.dumps({"2.src": a[1], "2.dst": b[1]}, separators=(",", ":")),
                "created": self.encode_time(utc_now()),  # (millisecond precision)
                "nonce": os.urandom(16).hex(),
            }
        )
        for sql, params in queries:
            if " RETURNING " in sql:
                await self.fetch_row(conn, sql, params)
            else:
                await self.write(conn, sql, params)

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    def connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    @abc.abstractmethod
    async def fetch_row(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[Any]: ...

    @abc.abstractmethod
    async def write(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        """Run a statement; the rows it matched."""

    @abc.abstractmethod
    async def begin(self, conn: Any) -> None: ...

    @abc.abstractmethod
    async def commit(self, conn: Any) -> None: ...

    @abc.abstractmethod
    async def rollback(self, conn: Any) -> None: ...


class RawAsyncpg(Raw):
    driver = "asyncpg"
    placeholder = staticmethod(lambda i: f"${i}")

    async def connect(self) -> None:
        self.pool = await common.asyncpg_pool(self.target)

    async def close(self) -> None:
        await self.pool.close()

    def connection(self) -> Any:
        return self.pool.acquire()

    async def fetch_row(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        row: Sequence[Any] = await conn.fetchrow(sql, *params)
        return row

    async def write(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        status: str = await conn.execute(sql, *params)  # "UPDATE 1", "INSERT 0 1"
        return int(status.rpartition(" ")[2])

    async def begin(self, conn: Any) -> None:
        await conn.execute("BEGIN")

    async def commit(self, conn: Any) -> None:
        await conn.execute("COMMIT")

    async def rollback(self, conn: Any) -> None:
        if not conn.is_closed():
            await conn.execute("ROLLBACK")


class RawAsyncmy(Raw):
    driver = "asyncmy"
    placeholder = staticmethod(lambda i: "%s")

    async def connect(self) -> None:
        from asyncmy.constants import CLIENT

        self.pool = await common.asyncmy_pool(self.target, client_flag=CLIENT.FOUND_ROWS)

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()

    def connection(self) -> Any:
        return self.pool.acquire()

    async def fetch_row(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        async with conn.cursor() as cursor:
            await cursor.execute(sql, params)
            row: Sequence[Any] = await cursor.fetchone()
            return row

    async def write(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        async with conn.cursor() as cursor:
            matched: int = await cursor.execute(sql, params)
            return matched

    async def begin(self, conn: Any) -> None:
        await conn.begin()

    async def commit(self, conn: Any) -> None:
        await conn.commit()

    async def rollback(self, conn: Any) -> None:
        await conn.rollback()


class RawSqlite(Raw):
    """The SQLite part both SQLite raw variants share: aiofragno's pragmas, a
    queue of connections, BEGIN IMMEDIATE behind a writer lock."""

    def pragmas(self) -> list[str]:
        return [
            f"PRAGMA busy_timeout = {int(common.SQLITE_BUSY_TIMEOUT * 1000)}",
            "PRAGMA foreign_keys = ON",
            "PRAGMA journal_mode = WAL",
        ]

    async def connect(self) -> None:
        self.writer = asyncio.Lock()
        self.idle: asyncio.Queue[Any] = asyncio.Queue()
        for _ in range(POOL_SIZE):
            conn = await self.open_connection()
            for pragma in self.pragmas():
                await self.write(conn, pragma, ())
            self.idle.put_nowait(conn)

    async def open_connection(self) -> Any:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        conn = await self.idle.get()
        try:
            yield conn
        finally:
            self.idle.put_nowait(conn)

    async def begin(self, conn: Any) -> None:
        await self.writer.acquire()
        try:
            await self.write(conn, "BEGIN IMMEDIATE", ())
        except BaseException:
            self.writer.release()
            raise

    async def commit(self, conn: Any) -> None:
        await self.write(conn, "COMMIT", ())
        self.writer.release()

    async def rollback(self, conn: Any) -> None:
        try:
            if conn.in_transaction:
                await self.write(conn, "ROLLBACK", ())
        finally:
            if self.writer.locked():
                self.writer.release()


class RawAiosqlite(RawSqlite):
    driver = "aiosqlite"

    async def open_connection(self) -> Any:
        import aiosqlite

        return await aiosqlite.connect(
            self.target.sqlite_path, isolation_level=None, timeout=common.SQLITE_BUSY_TIMEOUT
        )

    async def close(self) -> None:
        while not self.idle.empty():
            await self.idle.get_nowait().close()

    async def fetch_row(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        rows = await conn.execute_fetchall(sql, params)
        row: Sequence[Any] = rows[0]
        return row

    async def write(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        cursor = await conn.execute(sql, params)
        rowcount: int = cursor.rowcount
        return rowcount


def _fetch_row(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> Any:
    return conn.execute(sql, params).fetchall()[0]


def _write(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
    return conn.execute(sql, params).rowcount


class RawSqliteThread(RawSqlite):
    name = "raw-thread"
    driver = "sqlite3+to_thread"

    async def open_connection(self) -> Any:
        return sqlite3.connect(
            self.target.sqlite_path,
            isolation_level=None,
            timeout=common.SQLITE_BUSY_TIMEOUT,
            check_same_thread=False,
        )

    async def close(self) -> None:
        while not self.idle.empty():
            self.idle.get_nowait().close()

    async def fetch_row(self, conn: Any, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        row: Sequence[Any] = await asyncio.to_thread(_fetch_row, conn, sql, params)
        return row

    async def write(self, conn: Any, sql: str, params: Sequence[Any]) -> int:
        return await asyncio.to_thread(_write, conn, sql, params)


class SqlAlchemy(Variant):
    name = "sqlalchemy"

    async def open(self, admin: af.Database) -> None:
        from sqlalchemy import select
        from sqlalchemy.ext.asyncio import async_sessionmaker
        from sqlalchemy.orm.exc import StaleDataError

        self.stale = StaleDataError
        self.select = select
        self.driver = sa.DRIVERS[self.target.dialect]
        self.Account, self.Transfer = _sqlalchemy_models(common.names(admin))
        self.engine = await sa.engine(self.target)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    async def close(self) -> None:
        await self.engine.dispose()

    async def attempt(self, lo: int, hi: int, amount: int) -> None:
        account, transfer, select = self.Account, self.Transfer, self.select
        async with self.sessions() as session:
            a = (
                await session.execute(select(account).where(account.owner == owner(lo)))
            ).scalar_one()
            b = (
                await session.execute(select(account).where(account.owner == owner(hi)))
            ).scalar_one()
            a.balance -= amount
            b.balance += amount
            session.add(transfer(id=new_external_id(), src=a.pk, dst=b.pk, amount=amount))
            await session.commit()

    def is_conflict(self, exc: Exception) -> bool:
        return isinstance(exc, self.stale) or driver_conflict(getattr(exc, "orig", None))


def _sqlalchemy_models(names: common.Names) -> tuple[Any, Any]:
    """ORM classes over the tables aiofragno migrated; ``_version`` is the
    mapper's version_id_col."""
    from sqlalchemy import BigInteger, Integer, String
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    def schema(parts: tuple[str, ...]) -> dict[str, Any]:
        return {"schema": parts[0] if len(parts) > 1 else None}

    class Base(DeclarativeBase):
        pass

    class Account(Base):
        __tablename__ = names.accounts[-1]
        __table_args__ = schema(names.accounts)
        pk = mapped_column("_id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
        id = mapped_column(String(64))
        version = mapped_column("_version", Integer)
        owner = mapped_column(String(255))
        balance = mapped_column(BigInteger)
        __mapper_args__ = {"version_id_col": version}

    class Transfer(Base):
        __tablename__ = names.transfers[-1]
        __table_args__ = schema(names.transfers)
        pk = mapped_column("_id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
        id = mapped_column(String(64))
        src = mapped_column(BigInteger)
        dst = mapped_column(BigInteger)
        amount = mapped_column(BigInteger)

    return Account, Transfer


def _server_variants(raw: type[Raw], *, ticks: bool) -> list[Callable[[Target], Variant]]:
    return [
        Aiofragno,
        lambda t: Aiofragno(t, outbox="counter"),
        *([lambda t: Aiofragno(t, outbox="ticks")] if ticks else []),
        raw,
        lambda t: raw(t, outbox=True),
        SqlAlchemy,
    ]


VARIANTS: dict[str, list[Callable[[Target], Variant]]] = {
    "sqlite": [
        lambda t: Aiofragno(t, backend="aiosqlite"),
        lambda t: Aiofragno(t, backend="aiosqlite", outbox=True),
        RawAiosqlite,
        lambda t: RawAiosqlite(t, outbox=True),
        SqlAlchemy,
        lambda t: Aiofragno(t, backend="sqlite"),
        RawSqliteThread,
    ],
    "postgresql": _server_variants(RawAsyncpg, ticks=True),
    "mysql": _server_variants(RawAsyncmy, ticks=False),
}
# (label, numerator, denominator, target from DESIGN.md or None)
RATIOS = [
    ("aiofragno/raw", "aiofragno", "raw", 0.9),
    ("aiofragno+outbox/raw", "aiofragno+outbox", "raw", 0.8),
    # What the outbox costs hand-written code, and us against that.
    ("raw+outbox/raw", "raw+outbox", "raw", None),
    ("aiofragno+outbox/raw+outbox", "aiofragno+outbox", "raw+outbox", None),
    # The outbox's strategies against no outbox (PostgreSQL has both).
    ("aiofragno+outbox/aiofragno", "aiofragno+outbox", "aiofragno", None),
    ("aiofragno+ticks/aiofragno", "aiofragno+ticks", "aiofragno", 0.85),
    ("aiofragno/sqlalchemy", "aiofragno", "sqlalchemy", 3.0),
    ("aiofragno-thread/raw-thread", "aiofragno-thread", "raw-thread", 0.9),
]


# -- running ---------------------------------------------------------------------


@dataclass
class Measured:
    variant: str
    driver: str
    seconds: float = 0.0
    cpu: CpuUsed = NO_CPU
    units: int = 0
    conflicts: int = 0
    latencies: list[float] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, units: int, seconds: float, latencies: list[float], conflicts: int, cpu: CpuUsed
    ) -> None:
        """One round's run."""
        self.seconds += seconds
        self.cpu += cpu
        self.units += units
        self.conflicts += conflicts
        self.latencies += latencies
        self.rounds.append(
            {
                "units": units,
                "seconds": round(seconds, 4),
                "units_per_s": round(units / seconds, 1),
                "conflicts": conflicts,
            }
        )

    @property
    def rate(self) -> float:
        return self.units / self.seconds if self.seconds else math.nan

    def _per_unit(self, seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds / self.units * 1e6, 1)

    def summary(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "driver": self.driver,
            "units": self.units,
            "seconds": round(self.seconds, 4),
            "units_per_s": round(self.rate, 1),
            "p50_ms": round(common.percentile(self.latencies, 50) * 1000, 3),
            "p99_ms": round(common.percentile(self.latencies, 99) * 1000, 3),
            "cpu_us_per_unit": self._per_unit(self.cpu.loop + self.cpu.threads),
            "loop_cpu_us_per_unit": self._per_unit(self.cpu.loop),
            "thread_cpu_us_per_unit": self._per_unit(self.cpu.threads),
            "server_cpu_us_per_unit": self._per_unit(self.cpu.server),
            "conflicts": self.conflicts,
            "rounds": self.rounds,
        }


async def run(
    variant: Variant,
    work: Sequence[tuple[int, int, int]],
    concurrency: int,
    server: tuple[str, ...] = (),
) -> tuple[float, list[float], int, CpuUsed]:
    """``work`` by ``concurrency`` workers: (seconds, unit latencies, conflicts,
    CPU used by this process and by the ``server`` processes)."""
    latencies: list[float] = []
    conflicts = variant.policy.conflicts
    units = iter(work)
    clock = time.perf_counter

    async def worker() -> None:
        for lo, hi, amount in units:
            started = clock()
            await variant.transfer(lo, hi, amount)
            latencies.append(clock() - started)

    cpu = CpuSample.take(server)
    started = clock()
    ticker = asyncio.create_task(variant.ticker())
    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
        seconds = clock() - started
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
    return (
        seconds,
        latencies,
        variant.policy.conflicts - conflicts,
        cpu.until(CpuSample.take(server)),
    )


async def bench_target(
    target: Target, args: argparse.Namespace, servers: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    results: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    admin = await af.connect(target.url, pool_size=1)
    variants: list[Variant] = []
    try:
        await common.prepare(admin)
        servers[target.dialect] = await common.server_info(admin)
        variants = [make(target) for make in VARIANTS[target.dialect]]
        if args.variants:
            variants = [v for v in variants if v.name in args.variants]
        for v in variants:
            await v.open(admin)
        per_round = math.ceil(args.units / args.rounds)
        server = server_commands(target.dialect, target.parsed.host)
        for concurrency in args.concurrency:
            for v in variants:  # warm-up: connections, statement caches, code paths
                await common.reset(admin)
                await run(v, common.plan(args.warmup, seed=-1), concurrency)
            measured = {v.name: Measured(v.name, v.driver) for v in variants}
            for r in range(args.rounds):
                work = common.plan(per_round, seed=r)
                for v in variants if r % 2 == 0 else variants[::-1]:
                    await common.reset(admin)
                    gc.collect()
                    seconds, latencies, conflicts, cpu = await run(v, work, concurrency, server)
                    await common.verify(admin, len(work), outbox=v.outbox)
                    measured[v.name].add(len(work), seconds, latencies, conflicts, cpu)
            rows = [m.summary() for m in measured.values()]
            found = report(target, concurrency, per_round * args.rounds, args.rounds, rows)
            results += [{"backend": target.dialect, "concurrency": concurrency, **r} for r in rows]
            ratios += found
    finally:
        for v in variants:
            with contextlib.suppress(Exception):
                await v.close()
        await admin.close()
    return results, ratios


def report(
    target: Target, concurrency: int, units: int, rounds: int, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    print(
        f"\n{target.dialect}, concurrency {concurrency}: {units} units per variant in {rounds} rounds"
    )
    common.print_table(
        [
            "variant",
            "driver",
            "units/s",
            "p50 ms",
            "p99 ms",
            "conflicts",
            "CPU us/unit",
            "loop",
            "threads",
            "server",
        ],
        [
            [
                r["variant"],
                r["driver"],
                r["units_per_s"],
                r["p50_ms"],
                r["p99_ms"],
                r["conflicts"],
                r["cpu_us_per_unit"],
                r["loop_cpu_us_per_unit"],
                r["thread_cpu_us_per_unit"],
                r["server_cpu_us_per_unit"],
            ]
            for r in rows
        ],
    )
    by_name = {r["variant"]: r for r in rows}
    found = []
    for label, top, bottom, goal in RATIOS:
        if top in by_name and bottom in by_name:
            # Paired per round: both runs of a round did the same work, close in time.
            paired = [
                a["units_per_s"] / b["units_per_s"]
                for a, b in zip(by_name[top]["rounds"], by_name[bottom]["rounds"], strict=True)
            ]
            found.append(
                {
                    "backend": target.dialect,
                    "concurrency": concurrency,
                    "ratio": label,
                    "value": round(by_name[top]["units_per_s"] / by_name[bottom]["units_per_s"], 3),
                    "round_median": round(statistics.median(paired), 3),
                    "round_min": round(min(paired), 3),
                    "round_max": round(max(paired), 3),
                    "target": goal,
                }
            )
    for f in found:
        wanted = f" (target >= {f['target']})" if f["target"] else ""
        print(
            f"  {f['ratio']} {f['value']:.2f}{wanted}; per round: median {f['round_median']:.2f}, "
            f"range {f['round_min']:.2f}-{f['round_max']:.2f}"
        )
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.transfer", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backend", default="all", choices=[*common.BACKENDS, "all"])
    parser.add_argument("--units", type=int, default=2000, help="measured units per variant")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated, e.g. 1,16")
    parser.add_argument(
        "--rounds", type=int, default=4, help="interleaved rounds (units split evenly)"
    )
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed units per variant")
    parser.add_argument("--variants", default="", help="comma-separated subset of variant names")
    parser.add_argument(
        "--json", type=Path, default=None, help="default: benchmarks/results/transfer-<date>.json"
    )
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    args.backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    if args.units < args.rounds or args.rounds < 1:
        parser.error("--units must be at least --rounds (>= 1)")
    return args


async def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    began = time.perf_counter()
    results: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        for dialect in args.backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is None:
                    continue
                found, found_ratios = await bench_target(target, args, servers)
                results += found
                ratios += found_ratios
    wall = time.perf_counter() - began
    print("\nratios (units/s over units/s, measured side by side):")
    common.print_table(
        ["backend", "concurrency", "ratio", "value", "round median", "min", "max", "target"],
        [
            [
                r["backend"],
                r["concurrency"],
                r["ratio"],
                r["value"],
                r["round_median"],
                r["round_min"],
                r["round_max"],
                r["target"] or "-",
            ]
            for r in ratios
        ],
    )
    print(f"\nwall time {wall:.0f}s")
    common.write_json(
        args.json or common.default_json_path("transfer"),
        {
            "benchmark": "transfer",
            "config": {
                "backends": list(args.backends),
                "units": args.units,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "concurrency": args.concurrency,
                "pool_size": POOL_SIZE,
                "accounts": common.ACCOUNTS,
                "retry": {k: getattr(Backoff(), k) for k in ("max_retries", "initial", "maximum")},
            },
            "machine": common.machine_info(servers),
            "results": results,
            "ratios": ratios,
            "wall_seconds": round(wall, 1),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
