"""Memory and speed of ``db.stream`` against ``db.fetch`` on large results.

Each backend reads generated rows ``(x bigint, label text 'row-<x>')`` —
PostgreSQL ``generate_series``, SQLite a recursive CTE, MariaDB its Sequence
engine (``seq_1_to_<n>``) — three ways, each in a process of its own:

* ``stream``: ``async with db.stream(query) as rows`` over ``--rows`` rows
  (default 10M), summing x;
* ``fetch``: ``db.fetch(query)`` of ``--fetch-rows`` (default 1M: what fits
  comfortably; the stream's 10M would need ten times its memory);
* with ``--tracemalloc``, both again over ``--fetch-rows`` rows with
  tracemalloc on (its peak counts every Python allocation, the driver's
  buffers and threads included; it slows the run, so rows/s come from the
  runs without it).

Reported per run: rows, seconds, rows/s, and the process's peak resident
memory over the read (``VmHWM`` reset after connecting, minus the resident
memory then) — what the read itself needed.

    python -m benchmarks.stream_memory [--rows 10000000] [--fetch-rows 1000000]
        [--batch-size 1000] [--backends sqlite,aiosqlite,asyncpg,asyncmy]
        [--runtime asyncio] [--tracemalloc] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

import aiofragno as af

from . import _common as common

DIALECTS = {"sqlite": "sqlite", "aiosqlite": "sqlite", "asyncpg": "postgresql", "asyncmy": "mysql"}


def query(dialect: str, n: int) -> af.Fragment:
    if dialect == "postgresql":
        return af.sql(
            "SELECT x, 'row-' || x AS label FROM generate_series(1, {n}::bigint) AS x", n=n
        )
    if dialect == "mysql":
        # (MariaDB's Sequence engine: a table of 1..n, produced as it is read.)
        return af.sql(
            "SELECT seq AS x, CONCAT('row-', seq) AS label FROM {t}",
            t=af.Identifier(f"seq_1_to_{n}"),
        )
    return af.sql(
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "
        "SELECT x, 'row-' || x AS label FROM c",
        n=n,
    )


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path("/proc/self/clear_refs").write_text("5")


async def _measure(
    url: str, backend: str, mode: str, n: int, batch: int, traced: bool
) -> dict[str, Any]:
    async with af.connect(url, backend=backend, pool_size=1) as db:
        q = query(db.name, n)
        await db.fetch(query(db.name, 10))  # (a warm connection and statement)
        rss = _status("VmRSS")
        _reset_peak()
        if traced:
            tracemalloc.start()
        started = time.perf_counter()
        count = total = 0
        if mode == "stream":
            async with db.stream(q, batch_size=batch) as rows:
                async for row in rows:
                    count += 1
                    total += row["x"]
        else:
            fetched = await db.fetch(q)
            count = len(fetched)
            total = sum(row["x"] for row in fetched)
            del fetched
        seconds = time.perf_counter() - started
        traced_peak = tracemalloc.get_traced_memory()[1] if traced else None
        tracemalloc.stop()
        peak = _status("VmHWM")
    assert count == n and total == n * (n + 1) // 2, (count, total)
    return {
        "backend": backend,
        "mode": mode,
        "rows": n,
        "batch_size": batch if mode == "stream" else None,
        "tracemalloc": traced,
        "seconds": round(seconds, 3),
        "rows_per_s": None if traced else round(n / seconds),
        "rss_before_mb": round(rss / 2**20, 1),
        "rss_growth_mb": round((peak - rss) / 2**20, 1),
        "tracemalloc_peak_mb": None if traced_peak is None else round(traced_peak / 2**20, 2),
    }


def _child(argv: Sequence[str]) -> None:
    url, backend, mode, n, batch, traced, runtime = argv
    result = anyio.run(
        _measure, url, backend, mode, int(n), int(batch), traced == "1", backend=runtime
    )
    print(json.dumps({**result, "runtime": runtime}))


def _run(
    url: str, backend: str, mode: str, n: int, batch: int, traced: bool, runtime: str
) -> dict[str, Any]:
    arguments = [url, backend, mode, str(n), str(batch), "1" if traced else "0", runtime]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.stream_memory", "--child", *arguments],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--fetch-rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--backends", default="sqlite,aiosqlite,asyncpg,asyncmy")
    parser.add_argument("--runtime", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--json", type=Path, default=common.default_json_path("stream_memory"))
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child)
        return
    results = []
    servers: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            dialect = DIALECTS[backend]
            url = common.DEFAULT_URLS.get(dialect, f"sqlite:///{tmp}/stream.db")
            runs = [("stream", args.rows, False), ("fetch", args.fetch_rows, False)]
            if args.tracemalloc:
                runs += [("stream", args.fetch_rows, True), ("fetch", args.fetch_rows, True)]
            for mode, n, traced in runs:
                result = _run(url, backend, mode, n, args.batch_size, traced, args.runtime)
                results.append(result)
                print(json.dumps(result), file=sys.stderr)
            if dialect != "sqlite":
                servers[dialect] = anyio.run(_server_info, url)
    common.print_table(list(results[0]), [list(result.values()) for result in results])
    common.write_json(
        args.json,
        {
            "config": {
                "rows": args.rows,
                "fetch_rows": args.fetch_rows,
                "batch_size": args.batch_size,
                "runtime": args.runtime,
            },
            "machine": common.machine_info(servers),
            "results": results,
        },
    )


async def _server_info(url: str) -> dict[str, Any]:
    async with af.connect(url) as db:
        return await common.server_info(db)


if __name__ == "__main__":
    main()
