"""Outbox catch-up rate: how fast a reader pages through a backlog.

Per backend: the outbox is emptied and filled with ``--entries`` entries, one
per transfer unit of ``benchmarks.transfer`` (3 mutations: 2 checked updates
and 1 create), written at concurrency 16 with ``outbox=True``. Then the whole
backlog is read with ``db.outbox.list(after, limit=1000)``, page after page,
``--repeat`` times; reported: entries/s (best and median; wall clock, so load
on the machine counts) and this process's CPU per entry (best), against the
50,000 entries/s target. For attribution the same pages are also read as plain rows
(``db.fetch`` of the same SELECT, no payload decoding into OutboxEntry).

    python -m benchmarks.outbox_read [--backend all] [--entries 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.outbox.ticks import sources

from . import _common as common
from ._common import SCHEMA, Backoff

TARGET = 50_000
PAGE = 1_000
FILL_CONCURRENCY = 16


async def fill(db: af.Database, entries: int) -> float:
    """``entries`` transfer units at FILL_CONCURRENCY; returns seconds."""
    work = iter(common.plan(entries, seed=11))
    policy = Backoff()

    async def worker() -> None:
        for lo, hi, amount in work:
            await db.execute_uow(common.transfer_unit(lo, hi, amount), schema=SCHEMA, retry=policy)

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(FILL_CONCURRENCY):
            tg.create_task(worker())
    return time.perf_counter() - started


async def read_entries(db: af.Database) -> int:
    """The whole backlog through ``db.outbox.list``; returns entries read."""
    after, total = None, 0
    while True:
        page = await db.outbox.list(after, limit=PAGE)
        total += len(page)
        if len(page) < PAGE:
            return total
        after = page[-1].versionstamp


async def read_rows(db: af.Database) -> int:
    """The same pages as plain rows (no OutboxEntry, no JSON decoding)."""
    vs = af.Identifier("versionstamp")
    columns = af.sql(
        "{a}, {b}, {c}, {d}, {e}",
        a=vs,
        b=af.Identifier("uow_id"),
        c=af.Identifier("payload"),
        d=af.Identifier("ref_map"),
        e=af.Identifier("created_at"),
    )
    # Under ticks, the entries with their versions: the ticked source.
    table = sources(db._engine)[1] if db._engine.outbox_strategy == "ticks" else common.OUTBOX_TABLE
    after, total = "", 0
    while True:
        rows = await db.fetch(
            af.sql(
                "SELECT {cols} FROM {t} WHERE {vs} > {after} ORDER BY {vs} LIMIT {n}",
                cols=columns,
                t=table,
                vs=vs,
                after=after,
                n=PAGE,
            )
        )
        total += len(rows)
        if len(rows) < PAGE:
            return total
        after = rows[-1]["versionstamp"]


async def timed(
    read: Callable[[af.Database], Awaitable[int]], db: af.Database, want: int
) -> tuple[float, float]:
    """(entries/s, this process's CPU microseconds per entry) of one full read."""
    wall, cpu = time.perf_counter(), time.process_time()
    got = await read(db)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if got != want:
        raise AssertionError(f"read {got} entries, expected {want}")
    return want / wall, cpu / want * 1e6


async def bench(
    target: common.Target, entries: int, repeat: int, outbox: bool | str
) -> dict[str, Any]:
    async with af.connect(target.url, outbox=outbox, pool_size=common.POOL_SIZE) as db:  # type: ignore[arg-type]
        await common.prepare(db)
        await common.reset(db)
        fill_s = await fill(db, entries)
        await common.reset(db, outbox=False)  # vacuum/checkpoint; keeps the outbox
        await timed(read_entries, db, entries)  # warm-up
        entry_runs = [await timed(read_entries, db, entries) for _ in range(repeat)]
        row_runs = [await timed(read_rows, db, entries) for _ in range(repeat)]
        entry_rates, row_rates = [r for r, _ in entry_runs], [r for r, _ in row_runs]
        sample = await db.outbox.list(limit=PAGE)
        mean_payload = statistics.mean(len(json.dumps(e.payload, default=str)) for e in sample)
        return {
            "backend": db.name,
            "driver": db.backend,
            "outbox": db._engine.outbox_strategy,
            "entries": entries,
            "fill_units_per_s": round(entries / fill_s, 1),
            "mean_payload_json_chars": round(mean_payload),
            "entries_per_s_best": round(max(entry_rates)),
            "entries_per_s_median": round(statistics.median(entry_rates)),
            "rows_per_s_best": round(max(row_rates)),
            "rows_per_s_median": round(statistics.median(row_rates)),
            "entries_cpu_us_per_entry": round(min(c for _, c in entry_runs), 2),
            "rows_cpu_us_per_entry": round(min(c for _, c in row_runs), 2),
            "target": TARGET,
        }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_read")
    parser.add_argument("--backend", default="all", choices=[*common.BACKENDS, "all"])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--outbox", default="true", choices=["true", "counter", "ticks"], help="the strategy"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    outbox: bool | str = True if args.outbox == "true" else args.outbox
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    began = time.perf_counter()
    results = []
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        for dialect in backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is None:
                    continue
                results.append(await bench(target, args.entries, args.repeat, outbox))
                print(f"{dialect}: {results[-1]}")
    print(
        f"\noutbox catch-up, {args.entries} entries, pages of {PAGE} (best / median of {args.repeat})"
    )
    common.print_table(
        [
            "backend",
            "list() entries/s",
            "median",
            "CPU us/entry",
            "rows only/s",
            "median",
            "CPU us/row",
            "target",
        ],
        [
            [
                r["backend"],
                r["entries_per_s_best"],
                r["entries_per_s_median"],
                r["entries_cpu_us_per_entry"],
                r["rows_per_s_best"],
                r["rows_per_s_median"],
                r["rows_cpu_us_per_entry"],
                f">= {TARGET:,}",
            ]
            for r in results
        ],
    )
    wall = time.perf_counter() - began
    print(f"\nwall time {wall:.0f}s")
    common.write_json(
        args.json or common.default_json_path("outbox_read"),
        {
            "benchmark": "outbox_read",
            "config": {"entries": args.entries, "page": PAGE, "repeat": args.repeat},
            "machine": common.machine_info(servers),
            "results": results,
            "wall_seconds": round(wall, 1),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
