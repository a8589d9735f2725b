"""The SQLite thread hop alone: the upsert mix's thread work (``BEGIN
IMMEDIATE``, two upserts with RETURNING, ``COMMIT`` on one sqlite3
connection) from 16 tasks queued on one lock, handed to a thread through
``asyncio.to_thread`` and through the per-connection worker thread of
aiofragno's SQLite backend, in interleaved rounds. Same statements, same
connection: only the hop differs.

    python -m benchmarks.sqlite_hop [--units 3000] [--rounds 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiofragno.backends.sqlite import _Worker

TASKS = 16
KEYS = 500
UPSERT = (
    "INSERT INTO t (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET "
    "value = excluded.value, version = t.version + 1 RETURNING name, value, version"
)
Hop = Callable[[int], Awaitable[object]]


def open_database(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("CREATE TABLE t (name TEXT PRIMARY KEY, value INT, version INT DEFAULT 1)")
    return connection


def unit_work(connection: sqlite3.Connection) -> Callable[[int], object]:
    def work(n: int) -> object:
        connection.execute("BEGIN IMMEDIATE")
        rows = [connection.execute(UPSERT, (f"k{(n + i) % KEYS}", n)).fetchone() for i in (0, 1)]
        connection.execute("COMMIT")
        return rows

    return work


async def units_per_second(hop: Hop, units: int) -> float:
    lock = asyncio.Lock()
    numbers = iter(range(units))

    async def task() -> None:
        for n in numbers:
            async with lock:
                await hop(n)

    started = time.perf_counter()
    await asyncio.gather(*(task() for _ in range(TASKS)))
    return units / (time.perf_counter() - started)


async def main(units: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        connection = open_database(os.path.join(directory, "hop.db"))
        work = unit_work(connection)
        worker = _Worker()
        hops: dict[str, Hop] = {
            "asyncio.to_thread": lambda n: asyncio.to_thread(work, n),
            "aiofragno worker": lambda n: worker.run(lambda: work(n)),
        }
        results: dict[str, list[float]] = {name: [] for name in hops}
        try:
            for _ in range(rounds):
                for name, hop in hops.items():
                    results[name].append(await units_per_second(hop, units))
        finally:
            worker.stop()
            connection.close()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    measured = asyncio.run(main(args.units, args.rounds))
    for name, rates in measured.items():
        print(
            f"{name:20} units/s median {statistics.median(rates):7.0f}  rounds {[round(r) for r in rates]}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "sqlite_hop",
                    "units": args.units,
                    "rounds": args.rounds,
                    "tasks": TASKS,
                    "python": platform.python_version(),
                    "load_average": os.getloadavg(),
                    "units_per_second": measured,
                },
                indent=2,
            )
        )
