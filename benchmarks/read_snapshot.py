"""What one snapshot per ``retrieve()`` costs (aiofragno.uow.snapshot).

A unit reading a joined tree — 20 accounts, each with its outgoing
transfers and each transfer's destination account: three reads — where the
reads are several statements (MySQL, SQLite) runs them in a read-only
transaction whose BEGIN and ROLLBACK travel in the same batch. Variants:
``snapshot`` (as aiofragno runs) and ``separate`` (the same batch without
BEGIN and ROLLBACK: each read its own snapshot, as before). PostgreSQL is
left out: it reads the tree in one statement either way.

Interleaved in rounds (every other round in reverse order), one unit at a
time; reported: units/s per variant and the ratio snapshot/separate per
round (median and range); JSON in ``benchmarks/results/``.

    python -m benchmarks.read_snapshot [--backend all] [--units 300] [--rounds 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
import aiofragno.uow.executor as executor
from aiofragno.driver import CompiledQuery, QueryResult
from aiofragno.session import Session
from aiofragno.uow.snapshot import read_in_snapshot

from . import _common as common

SCHEMA = af.Schema(
    "read_snapshot_bench",
    af.Table("accounts", af.Column("owner", "string")),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("dst", "accounts"),
        af.Column("amount", "bigint"),
    ),
)
ACCOUNTS = 20
TRANSFERS = 60


async def separate(
    session: Session, begin: Sequence[str], queries: Sequence[CompiledQuery]
) -> list[QueryResult]:
    """The reads without their snapshot (the batch as it was before)."""
    return await read_in_snapshot(session, (), queries)


async def tree(uow: af.UnitOfWork) -> int:
    found = uow.find(
        "accounts",
        join={"out": af.many("transfers", by="src", join={"to": af.one("dst")})},
    )
    await uow.retrieve()
    return len(found.result)


async def seed(uow: af.UnitOfWork) -> None:
    ids = [uow.create("accounts", {"owner": f"o{i:02}"}) for i in range(ACCOUNTS)]
    for i in range(TRANSFERS):
        src, dst = ids[i % ACCOUNTS], ids[(i * 7 + 1) % ACCOUNTS]
        uow.create("transfers", {"src": src, "dst": dst, "amount": i})


def timed(db: af.Database, reader: Callable[..., Any], units: int) -> Callable[[], Any]:
    async def run() -> float:
        executor.read_in_snapshot = reader  # type: ignore[assignment]
        try:
            started = time.perf_counter()
            for _ in range(units):
                await db.execute_uow(tree, schema=SCHEMA, namespace="snapbench")
            return units / (time.perf_counter() - started)
        finally:
            executor.read_in_snapshot = read_in_snapshot

    return run


async def bench(dialect: str, units: int, rounds: int, tmp: Path) -> dict[str, Any] | None:
    async with common.target(dialect, tmp) as target:
        if target is None:
            return None
        async with af.connect(target.url, pool_size=2) as db:
            layout = db.layout(SCHEMA, "snapbench")
            for name in ("transfers", "accounts"):
                await db.execute(
                    af.sql("DROP TABLE IF EXISTS {t}", t=layout.table(name).identifier)
                )
            # (The tables dropped: their records go too, for migrate to
            # make them again.)
            await db.migrate(af.Schema("read_snapshot_bench"), namespace="snapbench")
            await db.execute(
                af.sql(
                    "DELETE FROM {t} WHERE {k} LIKE 'snapbench.%'",
                    t=af.Identifier("fragno_db_settings"),
                    k=af.Identifier("key"),
                )
            )
            await db.migrate(SCHEMA, namespace="snapbench")
            await db.execute_uow(seed, schema=SCHEMA, namespace="snapbench")
            runs = {
                "snapshot": timed(db, read_in_snapshot, units),
                "separate": timed(db, separate, units),
            }
            rates = await common.interleaved(runs, rounds)
            server = await common.server_info(db)
    ratio = common.round_ratios(rates, "snapshot", "separate")
    return {"rates": rates, "snapshot_over_separate": ratio, "server": server}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=["all", "sqlite", "mysql"])
    parser.add_argument("--units", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    dialects = ["sqlite", "mysql"] if args.backend == "all" else [args.backend]
    results: dict[str, Any] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in dialects:
            result = await bench(dialect, args.units, args.rounds, Path(tmp))
            if result is None:
                continue
            results[dialect] = result
            median = {k: sorted(v)[len(v) // 2] for k, v in result["rates"].items()}
            rows.append(
                [
                    dialect,
                    median["snapshot"],
                    median["separate"],
                    common.ratio_cell(result["snapshot_over_separate"]),
                ]
            )
    common.print_table(["backend", "snapshot u/s", "separate u/s", "snapshot/separate"], rows)
    servers = {d: r["server"] for d, r in results.items()}
    common.write_json(
        args.json or common.default_json_path("read_snapshot"),
        {
            "benchmark": "read_snapshot",
            "units": args.units,
            "rounds": args.rounds,
            "results": results,
            "machine": common.machine_info(servers),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
