"""The two SQLite backends side by side under asyncio: the stdlib ``sqlite3``
on anyio worker threads ("sqlite") and aiosqlite. Runs are interleaved so that
machine noise hits both alike.

    python -m benchmarks.sqlite_backends [--ops 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import anyio

import aiofragno as af

BACKENDS = ("sqlite", "aiosqlite")


async def reads(db: af.Database, ops: int) -> float:
    query = af.sql("SELECT {v} + 1", v=1)
    started = time.perf_counter()
    for _ in range(ops):
        await db.fetch_value(query)
    return (time.perf_counter() - started) / ops


async def write_transactions(db: af.Database, ops: int) -> float:
    started = time.perf_counter()
    for i in range(ops):
        async with db.transaction() as tx:
            await tx.execute(af.sql("INSERT INTO bench (v) VALUES ({v})", v=i))
            await tx.fetch_value(af.sql("SELECT count(*) FROM bench WHERE v = {v}", v=i))
    return (time.perf_counter() - started) / ops


async def concurrent_reads(db: af.Database, ops: int, concurrency: int = 16) -> float:
    query = af.sql("SELECT {v} + 1", v=1)

    async def worker(n: int) -> None:
        for _ in range(n):
            await db.fetch_value(query)

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker, ops // concurrency)
    return (time.perf_counter() - started) / ops


async def measure(ops: int, rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, dict[str, list[float]]] = {b: {} for b in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for backend in BACKENDS:
                url = f"sqlite:///{Path(tmp) / backend}.db"
                async with af.connect(url, backend=backend, pool_size=4) as db:
                    await db.execute(af.sql("CREATE TABLE IF NOT EXISTS bench (v integer)"))
                    for name, run, n in (
                        ("read_us", reads, ops),
                        ("concurrent_read_us", concurrent_reads, ops),
                        ("write_tx_us", write_transactions, ops // 5),
                    ):
                        seconds = await run(db, n)
                        samples[backend].setdefault(name, []).append(seconds * 1e6)
    return {b: {k: statistics.median(v) for k, v in m.items()} for b, m in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/sqlite_backends.json")
    args = parser.parse_args()
    result = anyio.run(measure, args.ops, args.rounds)
    print(
        f"{'microseconds per operation':32} {'sqlite (threads)':>18} {'aiosqlite':>12} {'ratio':>8}"
    )
    for name in result["sqlite"]:
        a, b = result["sqlite"][name], result["aiosqlite"][name]
        print(f"{name:32} {a:18.1f} {b:12.1f} {b / a:7.2f}x")
    report = {
        "benchmark": "sqlite_backends",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "ops": args.ops,
        "rounds": args.rounds,
        "median_us": result,
    }
    Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
