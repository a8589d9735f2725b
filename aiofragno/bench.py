"""``aiofragno bench``: the "transfer" workload against your database.

    aiofragno bench [--url URL] [--units N] [--concurrency C] [--outbox]
                    [--compare raw,sqlalchemy]

Each unit reads two random accounts of 1,000, moves money between them with
version checks and records a transfer row; conflicts are retried. Prints
units/s, p50/p99 latency and conflicts. ``--compare`` runs the side-by-side
harness of the repository's ``benchmarks/`` folder (hand-written raw-driver
code and the SQLAlchemy ORM), so it works from a checkout only.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

from .database import Database, connect
from .demo import SHOP, Progress, drop_namespace
from .uow import ExponentialBackoff, UnitOfWork, UowHooks
from .uow.expr import c
from .url import parse_url

ACCOUNTS = 1_000
RETRY = ExponentialBackoff(max_retries=100, initial=0.001, maximum=0.05)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--units", type=int, default=2000, help="units to run (default: 2000)")
    parser.add_argument("--concurrency", type=int, default=16, help="units at once (default: 16)")
    parser.add_argument("--outbox", action="store_true", help="write outbox entries too")
    parser.add_argument(
        "--compare",
        metavar="raw,sqlalchemy",
        help="also run hand-written driver code and/or the SQLAlchemy ORM side by side; "
        "needs a checkout of the aiofragno repository (run from its root, with "
        "'pip install aiofragno[bench]'): the harness is not part of the installed package",
    )


async def cmd_bench(args: argparse.Namespace, url: str | None) -> None:
    if args.compare:
        _compare(args, url)
        return
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        url = url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        async with connect(
            url, outbox=args.outbox, pool_size=max(2, min(args.concurrency, 20))
        ) as db:
            await run_bench(db, args.units, args.concurrency)


async def run_bench(db: Database, units: int, concurrency: int) -> None:
    """The workload in a namespace of its own, dropped afterwards (its
    tables, schema and settings): nothing stays in your database."""
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    try:
        await db.migrate(SHOP, namespace=namespace)
        await _run(db, namespace, units, concurrency)
    finally:
        await drop_namespace(db, namespace)


async def _run(db: Database, namespace: str, units: int, concurrency: int) -> None:
    async def open_accounts(uow: UnitOfWork) -> None:
        for i in range(ACCOUNTS):
            uow.create("accounts", {"owner": f"a{i:04}", "balance": 1_000})

    await db.execute_uow(open_accounts, schema=SHOP, namespace=namespace)
    conflicts = 0

    def count(uow: UnitOfWork, exc: Exception) -> None:
        nonlocal conflicts
        conflicts += 1

    latencies: list[float] = []
    limiter = anyio.CapacityLimiter(concurrency)
    progress = Progress(units, f"transfer units on {db.backend} (concurrency {concurrency})")

    async def one() -> None:
        async with limiter:
            started = time.perf_counter()
            await db.execute_uow(
                _transfer,
                schema=SHOP,
                namespace=namespace,
                retry=RETRY,
                hooks=UowHooks(on_conflict=count),
            )
            latencies.append(time.perf_counter() - started)
        progress.advance()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(units):
            tg.start_soon(one)
    seconds = time.perf_counter() - started
    progress.close()
    _report(db, namespace, units, seconds, latencies, conflicts)


async def _transfer(uow: UnitOfWork) -> None:
    lo, hi = sorted(random.sample(range(ACCOUNTS), 2))
    a = uow.find_first("accounts", where=c.owner == f"a{lo:04}")
    b = uow.find_first("accounts", where=c.owner == f"a{hi:04}")
    await uow.retrieve()
    acc_a, acc_b = a.result, b.result
    if acc_a is None or acc_b is None:
        raise LookupError("an account of the transfer does not exist")
    amount = random.randint(1, 10)
    uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - amount}, check=True)
    uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + amount}, check=True)
    uow.create("transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": amount})


def _report(
    db: Database,
    namespace: str,
    units: int,
    seconds: float,
    latencies: list[float],
    conflicts: int,
) -> None:
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    rows: list[tuple[str, Any]] = [
        ("backend", db.backend),
        ("namespace", f"{namespace} (dropped after the run)"),
        ("outbox", db.options.outbox),
        ("units", units),
        ("units/s", f"{units / seconds:,.1f}"),
        ("p50 ms", f"{cuts[49] * 1000:.2f}"),
        ("p99 ms", f"{cuts[98] * 1000:.2f}"),
        ("conflicts retried", conflicts),
    ]
    for name, value in rows:
        print(f"{name:>18}  {value}")


def _compare(args: argparse.Namespace, url: str | None) -> None:
    harness = Path.cwd() / "benchmarks" / "transfer.py"
    if not harness.exists():
        raise FileNotFoundError(
            "--compare runs the raw-driver and SQLAlchemy variants from the repository's "
            "benchmarks/ folder: run it from a checkout of aiofragno"
        )
    dialect = "sqlite" if url is None else parse_url(url).dialect
    compared = set(args.compare.split(","))
    unknown = compared - {"raw", "sqlalchemy"}
    if unknown:
        raise ValueError(f"--compare takes raw and/or sqlalchemy, not {', '.join(sorted(unknown))}")
    variants = {"aiofragno", *compared}
    if args.outbox:  # with the same outbox statements written by hand too
        variants |= {"aiofragno+outbox"} | ({"raw+outbox"} if "raw" in compared else set())
        # (And under ticks, where the harness has that variant: PostgreSQL.)
        variants.add("aiofragno+ticks")
    command = [
        sys.executable, "-m", "benchmarks.transfer", "--backend", dialect,
        "--units", str(args.units), "--concurrency", str(args.concurrency),
        "--variants", ",".join(sorted(variants)),
        "--json", str(Path(tempfile.gettempdir()) / "aiofragno-bench-compare.json"),
    ]  # fmt: skip
    # The harness runs every variant on one database of this server: point it there.
    env = dict(os.environ)
    if url is not None and dialect in ("postgresql", "mysql"):
        env[f"AIOFRAGNO_BENCH_{'POSTGRES' if dialect == 'postgresql' else 'MYSQL'}_URL"] = url
    if subprocess.run(command, env=env).returncode != 0:
        raise RuntimeError("the benchmark harness failed (its output is above)")
