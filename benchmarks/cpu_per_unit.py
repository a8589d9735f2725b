"""Python CPU per transfer unit, without I/O.

``db.execute_uow(fn, schema=..., dry_run=True)`` runs the transfer unit of
``benchmarks.transfer`` with no database call: the unit of work is built, its
2 reads and 3 writes are checked, encoded and compiled (SQL text from the
cache keyed by operation shape). A dry run's reads return nothing, so the unit
uses rows decoded beforehand. Decoding is measured apart: N result rows through
``db._catalog(schema).table("accounts").decode(values)``; a unit decodes 2.

Times are CPU time of this process (``time.process_time``), so other load on
the machine does not count. Reported per dialect (the compilers differ), best
of ``--repeat`` runs, in microseconds: compile + encode per unit, decode per row, and their sum per
unit (1 dry run + 2 decodes), against the 50 microsecond target.

    python -m benchmarks.cpu_per_unit [--backend all] [-n 20000] [--repeat 5] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.schema import new_external_id

from . import _common as common
from ._common import ACCOUNTS, SCHEMA, owner

TARGET_US = 50.0


async def measure(db: af.Database, n: int, repeat: int, profile: bool) -> dict[str, Any]:
    table = db._catalog(SCHEMA).table("accounts")
    values = [
        (i + 1, new_external_id(), 3, owner(i), common.OPENING_BALANCE) for i in range(ACCOUNTS)
    ]
    rows = {i: table.decode(v) for i, v in enumerate(values)}
    work = common.plan(n, seed=7)
    units = [common.transfer_unit(lo, hi, amount, rows) for lo, hi, amount in work]

    async def dry_runs() -> float:
        started = time.process_time()
        for fn in units:
            await db.execute_uow(fn, schema=SCHEMA, dry_run=True)
        return time.process_time() - started

    def decodes() -> float:
        decode = table.decode
        batch = values * max(1, n // len(values))
        started = time.process_time()
        for v in batch:
            decode(v)
        return (time.process_time() - started) / len(batch) * n

    await dry_runs()  # warm the SQL cache and the code paths
    compile_s = min([await dry_runs() for _ in range(repeat)])
    decode_s = min(decodes() for _ in range(repeat))
    if profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await dry_runs()
        profiler.disable()
        print(f"\n{db.name}: cProfile of {n} dry-run units (tottime, top 20)")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
    compile_us = compile_s / n * 1e6
    decode_us = decode_s / n * 1e6
    return {
        "backend": db.name,
        "compile_encode_us_per_unit": round(compile_us, 2),
        "decode_us_per_row": round(decode_us, 3),
        "total_us_per_unit": round(compile_us + 2 * decode_us, 2),
        "sql_cache_entries": len(db._catalog(SCHEMA).sql_cache),
        "target_us": TARGET_US,
    }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_per_unit")
    parser.add_argument("--backend", default="all", choices=[*common.BACKENDS, "all"])
    parser.add_argument("-n", type=int, default=20_000, help="units per timed run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    results = []
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        for dialect in backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is None:
                    continue
                async with af.connect(target.url, pool_size=1) as db:
                    results.append(await measure(db, args.n, args.repeat, args.profile))
    print(f"\nPython CPU per transfer unit, no I/O (best of {args.repeat} x {args.n} units)")
    common.print_table(
        ["backend", "compile+encode us/unit", "decode us/row", "total us/unit", "target"],
        [
            [
                r["backend"],
                r["compile_encode_us_per_unit"],
                r["decode_us_per_row"],
                r["total_us_per_unit"],
                f"< {TARGET_US:g}",
            ]
            for r in results
        ],
    )
    common.write_json(
        args.json or common.default_json_path("cpu_per_unit"),
        {
            "benchmark": "cpu_per_unit",
            "config": {"units": args.n, "repeat": args.repeat},
            "machine": common.machine_info({}),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
