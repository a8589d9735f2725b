"""What the outbox's version floor costs PostgreSQL commits.

Since the floor (:attr:`SqlSnippets.outbox_version_floor
<aiofragno.driver.SqlSnippets.outbox_version_floor>`, docs/outbox.md "The
outbox across a failover"), the counter's reservation evaluates the
server's timeline once per unit — ``pg_walfile_name(pg_current_wal_insert_lsn())``
— and takes ``GREATEST`` of it and the counter. (Under ticks the unit's own
statements are unchanged: the tick evaluates it once per batch.)

Two measures, interleaved in ``--rounds`` (order reversed every other round):

* the transfer unit (``benchmarks/_common.py``) with ``outbox="counter"``,
  at each ``--concurrency``: ``floor`` as shipped, ``before`` the same
  Database with the floor taken out of its dialect (the statement before
  the floor, byte for byte); units/s and the per-round ratio;
* the floor expression alone, evaluated ``--evaluations`` times in one
  statement, against a constant: server nanoseconds per evaluation.

    python -m benchmarks.outbox_version_floor [--units 2000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.dialects.postgresql import OUTBOX_VERSION_FLOOR

from . import _common as common


def without_floor(db: af.Database) -> None:
    """``db``'s outbox statements as before the floor (before any unit
    compiled them)."""
    engine = db._engine
    sql = dataclasses.replace(engine.adapter.sql, outbox_version_floor=None)
    engine.adapter = dataclasses.replace(engine.adapter, sql=sql)
    engine._outbox_statements = None


def units_run(
    db: af.Database, plan: list[tuple[int, int, int]], concurrency: int
) -> Callable[[], Awaitable[float]]:
    async def run() -> float:
        await common.reset(db)
        queue = iter(plan)

        async def worker() -> None:
            for lo, hi, amount in queue:
                await db.execute_uow(common.transfer_unit(lo, hi, amount), schema=common.SCHEMA)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        await common.verify(db, len(plan), outbox=True)
        return len(plan) / elapsed

    return run


def expression_run(db: af.Database, expression: str, n: int) -> Callable[[], Awaitable[float]]:
    statement = db._engine.raw(f"SELECT sum({expression}) FROM generate_series(1, {n})")

    async def run() -> float:
        started = time.perf_counter()
        await db.fetch_value(statement)
        return n / (time.perf_counter() - started)  # evaluations per second

    return run


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with (
        af.connect(url, outbox="counter", pool_size=common.POOL_SIZE) as floor,
        af.connect(url, outbox="counter", pool_size=common.POOL_SIZE) as before,
    ):
        without_floor(before)
        await common.prepare(floor)
        plan = common.plan(args.units, seed=7)
        for concurrency in args.concurrency:
            runs = {
                "floor": units_run(floor, plan, concurrency),
                "before": units_run(before, plan, concurrency),
            }
            for run in runs.values():  # warm-up
                await run()
            rates = await common.interleaved(runs, args.rounds)
            results[f"transfer c={concurrency}"] = {
                "units_per_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                "floor_over_before": common.round_ratios(rates, "floor", "before"),
            }
        n = args.evaluations
        runs = {
            "floor": expression_run(floor, OUTBOX_VERSION_FLOOR, n),
            "constant": expression_run(floor, "CAST(0 AS bigint)", n),
        }
        rates = await common.interleaved(runs, args.rounds)
        ns = {k: [1e9 / r for r in v] for k, v in rates.items()}
        added = [f - c for f, c in zip(ns["floor"], ns["constant"], strict=True)]
        results["floor expression"] = {
            "ns_per_evaluation": round(statistics.median(added), 1),
            "range": [round(min(added), 1), round(max(added), 1)],
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--evaluations", type=int, default=200_000)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 16]
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    async def go() -> tuple[dict[str, Any], dict[str, Any]] | None:
        async with common.target("postgresql", Path(".")) as target:
            if target is None:
                return None
            async with af.connect(target.url, pool_size=1) as admin:
                server = await common.server_info(admin)
            return await measure(target.url, args), server

    measured = asyncio.run(go())
    if measured is None:
        return
    results, server = measured
    rows = [
        [
            name,
            result["units_per_s"]["floor"],
            result["units_per_s"]["before"],
            common.ratio_cell(result["floor_over_before"]),
        ]
        for name, result in results.items()
        if name.startswith("transfer")
    ]
    common.print_table(["workload", "floor units/s", "before units/s", "floor/before"], rows)
    expression = results["floor expression"]
    print(f"\nthe floor expression: {expression['ns_per_evaluation']} ns per evaluation")
    common.write_json(
        args.json or common.default_json_path("outbox_version_floor"),
        {
            "benchmark": "outbox_version_floor",
            "arguments": vars(args),
            "machine": common.machine_info({"postgresql": server}),
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
