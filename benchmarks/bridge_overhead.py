"""What the asyncio bridge costs per query.

asyncpg runs natively under asyncio; under trio it runs on the bridge's private
asyncio loop in a helper thread (aiofragno.backends.asyncio_bridge), one thread
hop each way per call. This runs ``db.fetch_value(af.sql("SELECT 1"))`` N times
in a row on one connection under asyncio and under trio, alternating the two for
several rounds, and reports microseconds per query for each (best and median
round) and the difference. It also times the bridge alone (a no-op coroutine,
no database) to separate the hop from the query, and, for context, the same
queries issued by 16 tasks at once over a pool of 16 (wall time per query).
Results go to stdout and ``benchmarks/results/bridge_overhead.json``.

    python benchmarks/bridge_overhead.py [-n 5000] [--rounds 5] [--url URL]

Needs PostgreSQL (default: $AIOFRAGNO_TEST_POSTGRES_URL or
postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio

import aiofragno as af
from aiofragno.backends.asyncio_bridge import AsyncioLoopThread

DEFAULT_URL = os.environ.get(
    "AIOFRAGNO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
RESULTS = Path(__file__).parent / "results" / "bridge_overhead.json"
WARMUP = 200
CONCURRENCY = 16


async def time_queries(url: str, n: int) -> float:
    """Seconds per ``SELECT 1`` over ``n`` sequential queries (after a warm-up)."""
    async with af.connect(url, backend="asyncpg", pool_size=1) as db:
        query = af.sql("SELECT 1")
        for _ in range(WARMUP):
            await db.fetch_value(query)
        started = time.perf_counter()
        for _ in range(n):
            await db.fetch_value(query)
        return (time.perf_counter() - started) / n


async def time_concurrent_queries(url: str, n: int) -> float:
    """Wall seconds per ``SELECT 1`` when CONCURRENCY tasks share ``n`` queries."""
    async with af.connect(url, backend="asyncpg", pool_size=CONCURRENCY) as db:
        query = af.sql("SELECT 1")

        async def worker(count: int) -> None:
            for _ in range(count):
                await db.fetch_value(query)

        async with anyio.create_task_group() as tg:  # warm-up: open every connection
            for _ in range(CONCURRENCY):
                tg.start_soon(worker, WARMUP // CONCURRENCY + 1)
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(CONCURRENCY):
                tg.start_soon(worker, n // CONCURRENCY)
        return (time.perf_counter() - started) / (n // CONCURRENCY * CONCURRENCY)


async def _noop() -> None:
    pass


async def time_bare_hop(n: int) -> float:
    """Seconds per bridge round trip of a coroutine that does nothing."""
    bridge = AsyncioLoopThread()
    try:
        for _ in range(WARMUP):
            await bridge.run(_noop)
        started = time.perf_counter()
        for _ in range(n):
            await bridge.run(_noop)
        return (time.perf_counter() - started) / n
    finally:
        await bridge.stop()


def summary(seconds: list[float]) -> dict[str, Any]:
    micros = [s * 1e6 for s in seconds]
    return {
        "best_us": round(min(micros), 2),
        "median_us": round(statistics.median(micros), 2),
        "rounds_us": [round(m, 2) for m in micros],
    }


def measure(url: str, n: int, rounds: int) -> dict[str, Any]:
    names = ("asyncio", "trio", "bare_hop", "asyncio_concurrent", "trio_concurrent")
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        samples["asyncio"].append(anyio.run(time_queries, url, n, backend="asyncio"))
        samples["trio"].append(anyio.run(time_queries, url, n, backend="trio"))
        samples["bare_hop"].append(anyio.run(time_bare_hop, n, backend="trio"))
        for runtime in ("asyncio", "trio"):
            seconds = anyio.run(time_concurrent_queries, url, n, backend=runtime)
            samples[f"{runtime}_concurrent"].append(seconds)
    native, bridged = summary(samples["asyncio"]), summary(samples["trio"])
    return {
        "benchmark": "bridge_overhead",
        "query": 'db.fetch_value(af.sql("SELECT 1")), asyncpg, pool_size=1, sequential',
        "queries_per_round": n,
        "rounds": rounds,
        "asyncio_native": native,
        "trio_bridge": bridged,
        "bridge_bare_round_trip": summary(samples["bare_hop"]),
        f"concurrency_{CONCURRENCY}_wall_per_query": {
            "asyncio_native": summary(samples["asyncio_concurrent"]),
            "trio_bridge": summary(samples["trio_concurrent"]),
        },
        "overhead_best_us": round(bridged["best_us"] - native["best_us"], 2),
        "overhead_median_us": round(bridged["median_us"] - native["median_us"], 2),
        "ratio_median": round(bridged["median_us"] / native["median_us"], 3),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=5000, help="queries per round (default 5000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per runtime (default 5)")
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL URL")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSON file to write")
    args = parser.parse_args()
    result = measure(args.url, args.n, args.rounds)
    native, bridged = result["asyncio_native"], result["trio_bridge"]
    print(f"{args.n} x SELECT 1 on asyncpg, {args.rounds} rounds (best / median us per query)")
    print(f"  asyncio, native      {native['best_us']:8.1f} / {native['median_us']:8.1f}")
    print(f"  trio, via the bridge {bridged['best_us']:8.1f} / {bridged['median_us']:8.1f}")
    print(
        f"  difference           {result['overhead_best_us']:8.1f} / "
        f"{result['overhead_median_us']:8.1f}   (x{result['ratio_median']} median)"
    )
    hop = result["bridge_bare_round_trip"]
    print(f"  bridge alone (no-op) {hop['best_us']:8.1f} / {hop['median_us']:8.1f}")
    concurrent = result[f"concurrency_{CONCURRENCY}_wall_per_query"]
    print(f"{CONCURRENCY} tasks at once, pool of {CONCURRENCY} (wall us per query)")
    for label, key in (
        ("asyncio, native", "asyncio_native"),
        ("trio, via the bridge", "trio_bridge"),
    ):
        row = concurrent[key]
        print(f"  {label:20s} {row['best_us']:8.1f} / {row['median_us']:8.1f}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
