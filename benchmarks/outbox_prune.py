"""Outbox pruning: the cost per deleted entry, and what it does to writers.

Per backend and batch size: the outbox is filled with ``--entries`` entries
(one-row units at concurrency 16), then ``db.outbox.prune(keep_last=0,
keep_for=0, batch_size=...)`` deletes them all while one writer commits
units back to back. Reported: wall and client-CPU microseconds per deleted
entry, and the writer's commit latency p50/p99 during the prune against the
same writer alone just before (wall clock: load on the machine counts).

Runs in a database of its own (``aiofragno_bench_prune``; SQLite: a
temporary file), since pruning deletes every database-wide entry.

    python -m benchmarks.outbox_prune [--backend all] [--entries 10000] [--batch-sizes 100,1000,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common

DATABASE = "aiofragno_bench_prune"
FILL_CONCURRENCY = 16
EVENTS = af.Schema("prune_bench", af.Table("events", af.Column("n", "bigint")))


def url_for(dialect: str, tmp: Path) -> str:
    if dialect == "sqlite":
        return f"sqlite:///{tmp}/prune.db"
    return common.DEFAULT_URLS[dialect].rsplit("/", 1)[0] + "/" + DATABASE


async def one_event(db: af.Database, n: int) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("events", {"n": n})

    await db.execute_uow(unit, schema=EVENTS)


async def fill(db: af.Database, entries: int) -> None:
    numbers = iter(range(entries))

    async def worker() -> None:
        for n in numbers:
            await one_event(db, n)

    async with asyncio.TaskGroup() as tg:
        for _ in range(FILL_CONCURRENCY):
            tg.create_task(worker())


async def write_while(db: af.Database, running: asyncio.Event | None, count: int) -> list[float]:
    """Commit latencies (ms) of units back to back: while ``running`` is
    not set, or ``count`` of them."""
    latencies: list[float] = []
    while (running is None and len(latencies) < count) or (
        running is not None and not running.is_set()
    ):
        started = time.perf_counter()
        await one_event(db, -1)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def bench(db: af.Database, entries: int, batch_size: int) -> dict[str, Any]:
    await db.outbox.prune(keep_last=0, keep_for=0)  # (an empty outbox to start)
    await fill(db, entries)
    present = await db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=common.OUTBOX_TABLE), int)
    alone = await write_while(db, None, 200)
    done = asyncio.Event()
    writer = asyncio.create_task(write_while(db, done, 0))
    wall, cpu = time.perf_counter(), time.process_time()
    deleted = await db.outbox.prune(keep_last=0, keep_for=0, batch_size=batch_size)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done.set()
    during = await writer
    return {
        "backend": db.name,
        "batch_size": batch_size,
        "entries_present": present,
        "deleted": deleted,
        "batches": -(-deleted // batch_size),
        "wall_us_per_entry": round(wall / deleted * 1e6, 2),
        "client_cpu_us_per_entry": round(cpu / deleted * 1e6, 2),
        "entries_per_s": round(deleted / wall),
        "writer_alone_ms_p50": round(common.percentile(alone, 50), 2),
        "writer_alone_ms_p99": round(common.percentile(alone, 99), 2),
        "writer_during_prune_commits": len(during),
        "writer_during_prune_ms_p50": round(common.percentile(during, 50), 2),
        "writer_during_prune_ms_p99": round(common.percentile(during, 99), 2),
    }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_prune")
    parser.add_argument("--backend", default="all", choices=[*common.BACKENDS, "all"])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--batch-sizes", default="100,1000,5000")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    sizes = [int(size) for size in args.batch_sizes.split(",")]
    results: list[dict[str, Any]] = []
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        for dialect in backends:
            url = url_for(dialect, Path(tmp))
            try:
                await common.ensure_database(url)
            except af.Error as exc:
                print(f"skipping {dialect}: {exc}")
                continue
            async with af.connect(url, outbox=True, pool_size=common.POOL_SIZE) as db:
                await db.migrate(EVENTS)
                servers[dialect] = await common.server_info(db)
                for size in sizes:
                    results.append(await bench(db, args.entries, size))
                    print(results[-1])
    common.print_table(
        ["backend", "batch", "deleted", "us/entry", "CPU us/entry", "writer p99 alone/during ms"],
        [
            [
                r["backend"],
                r["batch_size"],
                r["deleted"],
                r["wall_us_per_entry"],
                r["client_cpu_us_per_entry"],
                f"{r['writer_alone_ms_p99']} / {r['writer_during_prune_ms_p99']}",
            ]
            for r in results
        ],
    )
    common.write_json(
        args.json or common.default_json_path("outbox_prune"),
        {
            "benchmark": "outbox_prune",
            "config": {"entries": args.entries, "batch_sizes": sizes},
            "machine": common.machine_info(servers),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
