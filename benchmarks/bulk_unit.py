"""How long one unit of work with very many writes takes to commit, per backend.

One unit creates ``--creates`` rows (default 100,000) on a Database without
the outbox, and one creates ``--outbox-creates`` rows (default 60,000; an
outbox entry holds at most 65,536 mutations) with it. Each round runs both
on every backend, interleaved; reported: the median seconds per unit and
creates per second, and the ratio of each backend's time to SQLite's.

    python -m benchmarks.bulk_unit [--backend all] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

import aiofragno as af

from . import _common as common

ITEMS = af.Schema(
    "bulk",
    af.Table("items", af.Column("name", "string"), af.Column("n", "bigint")),
)


async def one_unit(url: str, creates: int, *, outbox: bool) -> float:
    """Seconds from execute_uow to its return, for a unit of ``creates``
    creates in a namespace of its own (dropped afterwards)."""
    async with af.connect(url, outbox=outbox, pool_size=2) as db:
        namespace = f"bulk{uuid.uuid4().hex[:8]}"
        await db.migrate(ITEMS, namespace=namespace)

        async def unit(uow: af.UnitOfWork) -> None:
            for i in range(creates):
                uow.create("items", {"name": f"item{i}", "n": i})

        try:
            started = time.perf_counter()
            await db.execute_uow(unit, schema=ITEMS, namespace=namespace)
            return time.perf_counter() - started
        finally:
            table = db.layout(ITEMS, namespace).table("items").identifier
            await db.execute(af.sql("DROP TABLE {t}", t=table))
            if db.name == "postgresql":
                await db.execute(af.sql("DROP SCHEMA {s}", s=af.Identifier(namespace)))


async def measure(dialects: Sequence[str], rounds: int, sizes: dict[bool, int]) -> dict[str, Any]:
    seconds: dict[str, dict[bool, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {}
        for dialect in dialects:
            async with common.target(dialect, Path(tmp)) as target:
                if target is not None:
                    urls[dialect] = target.url
        for _ in range(rounds):
            for dialect, url in urls.items():
                for outbox, creates in sizes.items():
                    elapsed = await one_unit(url, creates, outbox=outbox)
                    seconds.setdefault(dialect, {}).setdefault(outbox, []).append(elapsed)
                    print(
                        f"  {dialect:10} outbox={outbox!s:5} {creates:7,} creates: {elapsed:6.2f} s"
                    )
    return {d: {str(o): times for o, times in by.items()} for d, by in seconds.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk_unit")
    parser.add_argument("--backend", default="all", help="sqlite,postgresql,mysql or all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=100_000)
    parser.add_argument("--outbox-creates", type=int, default=60_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    dialects = (
        ["sqlite", "postgresql", "mysql"] if args.backend == "all" else args.backend.split(",")
    )
    sizes = {False: args.creates, True: args.outbox_creates}
    seconds = anyio.run(measure, dialects, args.rounds, sizes)
    rows = []
    medians = {d: {o: statistics.median(t) for o, t in by.items()} for d, by in seconds.items()}
    for dialect, by in medians.items():
        for outbox, median in by.items():
            creates = sizes[outbox == "True"]
            base = medians.get("sqlite", {}).get(outbox)
            ratio = f"{median / base:.2f}" if base else "-"
            rows.append(
                [
                    dialect,
                    outbox,
                    f"{creates:,}",
                    f"{median:.2f}",
                    f"{creates / median:,.0f}",
                    ratio,
                ]
            )
    print()
    common.print_table(
        ["backend", "outbox", "creates", "median s", "creates/s", "time / SQLite's"], rows
    )
    common.write_json(
        args.json or common.default_json_path("bulk_unit"),
        {
            "benchmark": "bulk_unit",
            "rounds": args.rounds,
            "creates": sizes,
            "seconds": seconds,
            "median_seconds": medians,
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    main()
