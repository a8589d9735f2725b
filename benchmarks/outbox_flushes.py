"""Why the outbox costs PostgreSQL throughput at concurrency: its commits
cannot share WAL flushes.

Every outbox writer holds the version counter's row lock until its COMMIT has
flushed the WAL (that is what makes versionstamps gap-free and commit-ordered,
DESIGN.md), so outbox units commit one after another, each waiting for a flush
of its own; without the outbox, commits that arrive together share one flush
(group commit). This runs the transfer variants ``aiofragno``,
``aiofragno+outbox`` and ``raw`` at ``--concurrency`` on PostgreSQL twice:
with durable commits (the server's default), then with ``synchronous_commit =
off`` set on the benchmark database alone (COMMIT returns before the flush,
so the lock is held only in memory), interleaved in ``--rounds`` as in
``benchmarks.transfer``. Per variant and setting: units/s, WAL flushes per
unit (``pg_stat_wal.wal_sync`` — server-wide, so run it on a quiet server),
this process's and the server's CPU per unit, and the ratios to ``raw``.

    python -m benchmarks.outbox_flushes [--units 6000] [--rounds 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common
from .cpu_meter import server_commands
from .transfer import VARIANTS, Measured, Variant, run

NAMES = ("aiofragno", "aiofragno+outbox", "raw")
SETTINGS = ("on", "off")
WAL_SYNC = "SELECT wal_sync FROM pg_stat_wal"
# Backends publish their WAL statistics at most once a second.
STATS_DELAY = 1.1


async def _wal_syncs(admin: af.Database) -> int:
    await asyncio.sleep(STATS_DELAY)
    return await admin.fetch_value(af.sql(WAL_SYNC), int)


async def _set_commit(admin: af.Database, database: str, setting: str | None) -> None:
    """``synchronous_commit`` for new sessions of ``database`` (None: the default)."""
    name = af.Identifier(database)
    if setting is None:
        await admin.execute(af.sql("ALTER DATABASE {d} RESET synchronous_commit", d=name))
    else:  # (a SET takes no parameters; the value comes from SETTINGS)
        statement = f"ALTER DATABASE {{d}} SET synchronous_commit = {setting}"
        await admin.execute(af.sql(statement, d=name))


async def _measure(
    target: common.Target, admin: af.Database, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One setting's runs: each variant ``--units`` units in ``--rounds``."""
    variants: list[Variant] = [
        v for v in (make(target) for make in VARIANTS["postgresql"]) if v.name in NAMES
    ]
    server = server_commands("postgresql", target.parsed.host)
    per_round = -(-args.units // args.rounds)
    try:
        for v in variants:
            await v.open(admin)  # (after the setting: it applies to new sessions)
            await common.reset(admin)
            await run(v, common.plan(300, seed=-1), args.concurrency)
        measured = {v.name: Measured(v.name, v.driver) for v in variants}
        flushes = dict.fromkeys(measured, 0)
        for r in range(args.rounds):
            work = common.plan(per_round, seed=r)
            for v in variants if r % 2 == 0 else variants[::-1]:
                await common.reset(admin)
                before = await _wal_syncs(admin)
                seconds, latencies, conflicts, cpu = await run(v, work, args.concurrency, server)
                flushes[v.name] += await _wal_syncs(admin) - before
                await common.verify(admin, len(work), outbox=v.outbox)
                measured[v.name].add(len(work), seconds, latencies, conflicts, cpu)
    finally:
        for v in variants:
            with contextlib.suppress(Exception):
                await v.close()
    rows = []
    for name, m in measured.items():
        summary = m.summary()
        rows.append(
            {
                "variant": name,
                "units_per_s": summary["units_per_s"],
                "wal_flushes_per_unit": round(flushes[name] / m.units, 3),
                "client_cpu_us_per_unit": summary["cpu_us_per_unit"],
                "server_cpu_us_per_unit": summary["server_cpu_us_per_unit"],
                "conflicts": m.conflicts,
            }
        )
    raw = next(row["units_per_s"] for row in rows if row["variant"] == "raw")
    for row in rows:
        row["vs_raw"] = round(row["units_per_s"] / raw, 3)
    return rows


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_flushes")
    parser.add_argument("--units", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        async with common.target("postgresql", Path(tmp)) as target:
            if target is None:
                raise SystemExit(1)
            database = target.parsed.database
            admin = await af.connect(target.url, pool_size=1)
            try:
                await common.prepare(admin)
                server = await common.server_info(admin)
                for setting in SETTINGS:
                    await _set_commit(admin, database, setting)
                    results[setting] = await _measure(target, admin, args)
            finally:
                with contextlib.suppress(af.Error):
                    await _set_commit(admin, database, None)
                await admin.close()
    for setting, rows in results.items():
        print(
            f"\npostgresql, concurrency {args.concurrency}, synchronous_commit = {setting}: "
            f"{args.units} units per variant in {args.rounds} rounds"
        )
        common.print_table(
            ["variant", "units/s", "/ raw", "WAL flushes/unit", "client CPU us", "server CPU us"],
            [
                [
                    r["variant"],
                    r["units_per_s"],
                    r["vs_raw"],
                    r["wal_flushes_per_unit"],
                    r["client_cpu_us_per_unit"],
                    r["server_cpu_us_per_unit"],
                ]
                for r in rows
            ],
        )
    common.write_json(
        args.json or common.default_json_path("outbox_flushes"),
        {
            "benchmark": "outbox_flushes",
            "config": {"units": args.units, "rounds": args.rounds, "concurrency": args.concurrency},
            "machine": common.machine_info({"postgresql": server}),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
