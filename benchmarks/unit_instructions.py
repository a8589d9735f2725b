"""Client instructions per operation, counted by callgrind: a measure of
aiofragno's own cost on each backend (driver included, server excluded) that
does not move with the machine's load, so two versions of the code can be
compared on a busy machine.

    python -m benchmarks.unit_instructions [--backend postgresql] [--outbox]
                                           [--workload transfer ...]
                                           [--tree DIR ...] [--json PATH]
                                           [--cpu CONCURRENCY [--rounds N]]

For each ``--tree`` (a checkout or ``git archive`` of aiofragno; default: this
one) and each ``--workload`` it runs the workload twice under ``valgrind
--tool=callgrind``, with ``SMALL`` and ``LARGE`` operations, and reports
(total instructions of the large run - of the small run) / (LARGE - SMALL):
start-up, connecting and migrating cancel out. Each workload runs its
operations one after another on one task, through aiofragno's public API
only (so it runs on older versions of the code as well), or through the
driver alone (``raw-*``, the floor aiofragno's own cost adds to):

* ``transfer``: a unit of work between two accounts (2 reads, 2 checked
  updates, 1 insert);
* ``read-unit``: a unit of work with one ``find_first`` and no writes;
* ``fetch-one`` / ``raw-read``: one row by owner, through ``db.fetch_one``
  / the driver's pool and a statement with one parameter (``raw-read-prepared``:
  on asyncmy, with its statement cache, which runs that statement prepared);
* ``transaction`` / ``raw-transaction``: ``db.transaction()`` running a
  SELECT, an UPDATE and an INSERT / the same statements between the
  driver's BEGIN and COMMIT;
* ``upsert`` / ``raw-upsert``: the unit of ``benchmarks.upsert_mix`` (two
  upserts by a unique name, one creating its row, one updating a row made
  earlier) through ``db.execute_uow`` / its hand-written ``raw`` variant
  (on SQLite too: sqlite3 on a worker thread).

With ``--cpu C`` it measures client CPU time instead (``time.process_time``
of the client process, so the server's share and other load on the machine
do not count, though a busy machine still adds some noise): each workload's
operations run on ``C`` concurrent tasks over a pool of ``C`` connections,
after a warm-up, in a process of its own per measurement; ``--rounds``
rounds, each running every tree and workload once, in alternating order.
The median per workload and tree is reported, in microseconds per operation,
and the median over rounds of raw / aiofragno for each workload whose
``raw-`` counterpart ran too (``raw-read`` for ``fetch-one`` and
``read-unit``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

SMALL, LARGE = 100, 600
CPU_OPERATIONS, CPU_WARM_UP = 3000, 300
URLS = {
    "sqlite": None,  # a file in a temporary directory
    # (The test suite's servers, by the same variables.)
    "postgresql": os.environ.get(
        "AIOFRAGNO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
    ),
    "mysql": os.environ.get("AIOFRAGNO_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}
WORKLOADS = (
    "transfer",
    "read-unit",
    "fetch-one",
    "raw-read",
    "raw-read-prepared",
    "transaction",
    "raw-transaction",
    "upsert",
    "raw-upsert",
)
Operation = Callable[[], Awaitable[object]]
# The driver alone doing what a workload does (or its reads).
RAW_OF = {
    "fetch-one": "raw-read",
    "read-unit": "raw-read",
    "transaction": "raw-transaction",
    "upsert": "raw-upsert",
}


def shop_schema() -> Any:
    import aiofragno as af

    return af.Schema(
        "unitinstr",
        af.Table("accounts", af.Column("owner", "string"), af.Column("balance", "bigint")),
        af.Table(
            "transfers",
            af.Reference("src", "accounts"),
            af.Reference("dst", "accounts"),
            af.Column("amount", "bigint"),
        ),
    )


async def workload(
    backend: str, name: str, operations: int, outbox: bool, concurrency: int = 0
) -> float | None:
    """``operations`` of workload ``name`` on one task (run under callgrind by
    :func:`count`); with ``concurrency``, spread over that many tasks after a
    warm-up, and their client CPU seconds returned (see :func:`cpu_run`)."""
    import aiofragno as af

    shop = shop_schema()
    with tempfile.TemporaryDirectory() as tmp:
        url = URLS[backend] or f"sqlite:///{tmp}/unitinstr.db"
        async with af.connect(url, outbox=outbox, pool_size=max(concurrency, 1)) as db:
            namespace = f"unitinstr{os.getpid()}"
            try:
                if name.endswith("upsert"):
                    return await upserts(db, backend, url, namespace, name, operations,
                                         concurrency)  # fmt: skip
                return await measured(db, backend, shop, namespace, url, name, operations,
                                      concurrency)  # fmt: skip
            finally:
                await drop_namespace(db, shop, namespace)


async def measured(
    db: Any, backend: str, shop: Any, namespace: str, url: str, name: str, operations: int,
    concurrency: int,
) -> float | None:  # fmt: skip
    """:func:`workload`'s measurement, in ``namespace`` (migrated here)."""
    import aiofragno as af

    await db.migrate(shop, namespace=namespace)

    async def open_accounts(uow: Any) -> None:
        uow.create("accounts", {"owner": "a", "balance": 1_000_000})
        uow.create("accounts", {"owner": "b", "balance": 1_000_000})

    await db.execute_uow(open_accounts, schema=shop, namespace=namespace)
    # The tables' quoted names, as SQL text.
    layout = db.layout(shop, namespace)
    tables = {
        table: db.compile(af.sql("{t}", t=layout.table(table).identifier)).sql
        for table in ("accounts", "transfers")
    }
    if name.startswith("raw-"):
        prepared = name.endswith("-prepared")
        raw = await RAW[backend].open(url, max(concurrency, 1), prepared=prepared)
        try:
            method = name.removeprefix("raw-").removesuffix("-prepared")
            operation = getattr(raw, method.replace("-", "_"))
            return await run(functools.partial(operation, tables), operations, concurrency)
        finally:
            await raw.close()
    operation = aiofragno_operation(db, shop, namespace, tables, name)
    return await run(operation, operations, concurrency)


async def drop_namespace(db: Any, shop: Any, namespace: str) -> None:
    """Drop what :func:`workload` created in ``namespace`` (its tables, its
    schema on PostgreSQL, its migration's settings), also after a failure:
    each run has a namespace of its own, which nothing else would drop."""
    import aiofragno as af

    layout = db.layout(shop, namespace)
    drops = [af.sql("DROP TABLE IF EXISTS {t}", t=layout.table(name).identifier)
             for name in ("transfers", "accounts")]  # fmt: skip
    drops += [af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(schema))
              for schema in layout.db_schemas]  # fmt: skip
    drops.append(af.sql("DELETE FROM {t} WHERE {k} LIKE {p}", t=af.Identifier("fragno_db_settings"),
                        k=af.Identifier("key"), p=f"{namespace}.%"))  # fmt: skip
    for drop in drops:
        try:
            await db.execute(drop)
        except af.Error as exc:  # (say so, and drop the rest)
            print(f"could not clean up: {exc}", file=sys.stderr)


async def upserts(
    db: Any, backend: str, url: str, namespace: str, name: str, operations: int, concurrency: int
) -> float | None:
    """:func:`workload` for ``upsert`` and ``raw-upsert``: the units of
    ``benchmarks.upsert_mix`` (the measured tree's), each creating one key
    and updating one of ten made by the first units."""
    import itertools

    import aiofragno as af
    from benchmarks import _common, upsert_mix

    await db.migrate(upsert_mix.SCHEMA, namespace=namespace)
    identifier = db.layout(upsert_mix.SCHEMA, namespace).table("counters").identifier
    table = db.compile(af.sql("{t}", t=identifier)).sql
    close = None
    if name == "upsert":
        unit = upsert_mix.aiofragno_unit(db, namespace)
    else:
        target = _common.Target(backend, url)
        unit, close = await upsert_mix.raw_unit(target, table, max(concurrency, 1))
    numbers = itertools.count()

    async def operation() -> object:
        i = next(numbers)
        return await unit([(f"new{i}", i), (f"k{i % 10}", i)])

    try:
        return await run(operation, operations, concurrency)
    finally:
        if close is not None:
            await close()
        # (Its namespace's schema and settings go with drop_namespace.)
        await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=identifier))


async def run(operation: Operation, operations: int, concurrency: int) -> float | None:
    """``operations`` of ``operation``: one after another (``concurrency``
    0), or on ``concurrency`` tasks after a warm-up, returning the client CPU
    seconds they took."""
    if not concurrency:
        for _ in range(operations):
            await operation()
        return None

    async def task(count: int) -> None:
        for _ in range(count):
            await operation()

    async def spread(total: int) -> None:
        await asyncio.gather(*(task(total // concurrency) for _ in range(concurrency)))

    await spread(CPU_WARM_UP)
    started = time.process_time()
    await spread(operations)
    return time.process_time() - started


def aiofragno_operation(
    db: Any, shop: Any, namespace: str, tables: dict[str, str], name: str
) -> Operation:
    import aiofragno as af

    accounts, transfers = (af.sql(tables[t]) for t in ("accounts", "transfers"))

    async def transfer(uow: Any) -> None:
        a = uow.find_first("accounts", where={"owner": "a"})
        b = uow.find_first("accounts", where={"owner": "b"})
        await uow.retrieve()
        ra, rb = a.result, b.result
        uow.update("accounts", ra["id"], {"balance": ra["balance"] - 1}, check=True)
        uow.update("accounts", rb["id"], {"balance": rb["balance"] + 1}, check=True)
        uow.create("transfers", {"src": ra["id"], "dst": rb["id"], "amount": 1})

    async def read(uow: Any) -> Any:
        a = uow.find_first("accounts", where={"owner": "a"})
        await uow.retrieve()
        return a.result

    async def fetch_one() -> Any:
        return await db.fetch_one(
            af.sql("SELECT _id, balance FROM {t} WHERE owner = {o}", t=accounts, o="a")
        )

    async def transaction() -> None:
        async with db.transaction() as tx:
            row = await tx.fetch_one(
                af.sql("SELECT _id, balance FROM {t} WHERE owner = {o}", t=accounts, o="a")
            )
            await tx.execute(
                af.sql("UPDATE {t} SET balance = balance - 1 WHERE _id = {i}", t=accounts,
                       i=row["_id"])
            )
            await tx.execute(
                af.sql("INSERT INTO {t} (id, _version, src, dst, amount) "
                       "VALUES ({x}, 1, {i}, {i}, 1)", t=transfers, x=os.urandom(8).hex(),
                       i=row["_id"])
            )  # fmt: skip

    if name == "transfer":
        return lambda: db.execute_uow(transfer, schema=shop, namespace=namespace)
    if name == "read-unit":
        return lambda: db.execute_uow(read, schema=shop, namespace=namespace)
    return {"fetch-one": fetch_one, "transaction": transaction}[name]


class RawAsyncmy:
    """The driver alone: asyncmy's pool, a cursor per statement (with
    ``prepared``, asyncmy's statement cache: its cursors run statements with
    parameters as prepared statements, in the binary protocol)."""

    @classmethod
    async def open(cls, url: str, size: int, prepared: bool = False) -> RawAsyncmy:
        import asyncmy
        from asyncmy.constants import CLIENT

        from aiofragno.url import parse_url

        parsed = parse_url(url)
        self = cls()
        self.pool = await asyncmy.create_pool(
            host=parsed.host, port=parsed.port or 3306, user=parsed.username or "root",
            password=parsed.password or "", db=parsed.database,
            autocommit=True, charset="utf8mb4", client_flag=CLIENT.FOUND_ROWS,
            minsize=size, maxsize=size, **({"stmt_cache_size": 256} if prepared else {}),
        )  # fmt: skip
        return self

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()

    async def read(self, tables: dict[str, str]) -> Any:
        async with self.pool.acquire() as conn, conn.cursor() as cursor:
            await cursor.execute(
                f"SELECT _id, balance FROM {tables['accounts']} WHERE owner = %s", ("a",)
            )
            return await cursor.fetchone()

    async def transaction(self, tables: dict[str, str]) -> None:
        async with self.pool.acquire() as conn:
            await conn.begin()
            async with conn.cursor() as cursor:
                await cursor.execute(
                    f"SELECT _id, balance FROM {tables['accounts']} WHERE owner = %s", ("a",)
                )
                (internal, _) = await cursor.fetchone()
            async with conn.cursor() as cursor:
                await cursor.execute(
                    f"UPDATE {tables['accounts']} SET balance = balance - 1 WHERE _id = %s",
                    (internal,),
                )
            async with conn.cursor() as cursor:
                await cursor.execute(
                    f"INSERT INTO {tables['transfers']} (id, _version, src, dst, amount) "
                    "VALUES (%s, 1, %s, %s, 1)",
                    (os.urandom(8).hex(), internal, internal),
                )
            await conn.commit()


class RawAsyncpg:
    """The driver alone: asyncpg's pool and its ``fetchrow`` / ``execute``."""

    @classmethod
    async def open(cls, url: str, size: int, prepared: bool = False) -> RawAsyncpg:
        # (asyncpg always prepares: ``prepared`` changes nothing.)
        import asyncpg

        self = cls()
        self.pool = await asyncpg.create_pool(url, min_size=size, max_size=size)
        return self

    async def close(self) -> None:
        await self.pool.close()

    async def read(self, tables: dict[str, str]) -> Any:
        async with self.pool.acquire() as conn:
            return await conn.fetchrow(
                f"SELECT _id, balance FROM {tables['accounts']} WHERE owner = $1", "a"
            )

    async def transaction(self, tables: dict[str, str]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT _id, balance FROM {tables['accounts']} WHERE owner = $1", "a"
            )
            await conn.execute(
                f"UPDATE {tables['accounts']} SET balance = balance - 1 WHERE _id = $1",
                row[0],
            )
            await conn.execute(
                f"INSERT INTO {tables['transfers']} (id, _version, src, dst, amount) "
                "VALUES ($1, 1, $2, $2, 1)",
                os.urandom(8).hex(),
                row[0],
            )


RAW: dict[str, Any] = {"mysql": RawAsyncmy, "postgresql": RawAsyncpg}


def count(tree: Path, backend: str, workload: str, operations: int, outbox: bool) -> int:
    """Total instructions callgrind counts for :func:`workload` on ``tree``'s code."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, str(Path(__file__).resolve()), "--run", str(operations),
            "--backend", backend, "--workload", workload, *(["--outbox"] if outbox else []),
        ]  # fmt: skip
        # Run as a script, so that aiofragno comes from ``tree`` alone.
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(command, env=env, check=True, capture_output=True, cwd=tmp)
        summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if summary is None:
            raise RuntimeError(f"no summary line in {out}")
        return int(summary[1])


def cpu_run(tree: Path, backend: str, workload: str, concurrency: int, outbox: bool) -> float:
    """Client CPU microseconds per operation of ``workload`` at
    ``concurrency``, on ``tree``'s code, in a process of its own."""
    command = [
        sys.executable, str(Path(__file__).resolve()), "--run", str(CPU_OPERATIONS),
        "--cpu", str(concurrency), "--backend", backend, "--workload", workload,
        *(["--outbox"] if outbox else []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(command, env=env, check=True, capture_output=True, cwd=tmp, text=True)
    return float(done.stdout.split()[-1]) / CPU_OPERATIONS * 1e6


def cpu_main(args: argparse.Namespace, trees: list[Path], workloads: list[str]) -> None:
    runs = [(tree, name) for tree in trees for name in workloads]
    samples: dict[tuple[Path, str], list[float]] = {run: [] for run in runs}
    for round_ in range(args.rounds):
        for tree, name in runs if round_ % 2 == 0 else reversed(runs):
            samples[tree, name].append(cpu_run(tree, args.backend, name, args.cpu, args.outbox))
    results = []
    for (tree, name), values in samples.items():
        median = statistics.median(values)
        results.append(
            {
                "workload": name,
                "tree": str(tree),
                "cpu_us_per_operation": round(median, 1),
                "samples": [round(v, 1) for v in values],
            }
        )
        print(f"{name} {tree}: {median:.1f} us client CPU per operation ({values})", flush=True)
    # raw / aiofragno within each round (runs close in time share the
    # machine's load), then the median of those.
    for tree in trees:
        for name in workloads:
            raw = RAW_OF.get(name)
            if raw not in workloads:
                continue
            ratios = [r / a for r, a in zip(samples[tree, raw], samples[tree, name], strict=True)]
            ratio = statistics.median(ratios)
            results.append({"workload": name, "tree": str(tree), "raw_over_aiofragno": round(ratio, 2)})
            print(f"{raw} / {name} {tree}: {ratio:.2f} (median of rounds)", flush=True)
    if args.json:
        config = {
            "backend": args.backend, "outbox": args.outbox, "concurrency": args.cpu,
            "operations": CPU_OPERATIONS, "warm_up": CPU_WARM_UP, "rounds": args.rounds,
        }  # fmt: skip
        args.json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")


async def terminable(coroutine: Awaitable[float | None]) -> float | None:
    """``coroutine``, cancelled by SIGTERM (a killed benchmark), so that its
    clean-up still runs."""
    task = asyncio.ensure_future(coroutine)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="postgresql", choices=list(URLS))
    parser.add_argument("--outbox", action="store_true")
    parser.add_argument("--workload", action="append", choices=WORKLOADS)
    parser.add_argument("--tree", action="append", type=Path, help="code to measure")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--cpu", type=int, default=0, metavar="CONCURRENCY")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)  # the measured process
    args = parser.parse_args()
    workloads = args.workload or ["transfer"]
    if args.run is not None:
        measured = workload(args.backend, workloads[0], args.run, args.outbox, args.cpu)
        used = asyncio.run(terminable(measured))
        if used is not None:
            print(used)
        return
    trees = args.tree or [Path(__file__).resolve().parent.parent]
    if args.cpu:
        cpu_main(args, trees, workloads)
        return
    results = []
    for name in workloads:
        for tree in trees:
            started = time.monotonic()
            small, large = (
                count(tree, args.backend, name, n, args.outbox) for n in (SMALL, LARGE)
            )
            per_operation = (large - small) / (LARGE - SMALL)
            results.append(
                {
                    "workload": name,
                    "tree": str(tree),
                    "instructions_per_operation": round(per_operation),
                }
            )
            print(
                f"{name} {tree}: {per_operation:,.0f} instructions per operation "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    if args.json:
        config = {"backend": args.backend, "outbox": args.outbox, "small": SMALL, "large": LARGE}
        args.json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
