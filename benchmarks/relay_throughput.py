"""Outbox relay throughput: how fast ``db.outbox.relay`` moves a backlog to a
broker.

Per backend: the outbox is emptied and filled with ``--entries`` entries
(one per transfer unit of ``benchmarks.transfer``, as in
``benchmarks.outbox_read``). Then the whole backlog is relayed, with
``until_caught_up=True`` and batches of ``--batch-size``, to a fresh NATS
JetStream stream (file storage, the server's defaults) for each
``max_in_flight`` of ``--in-flight``, and to a fresh Redis stream key;
``--repeat`` times each. Reported: entries/s (best and median; wall clock,
so load on the machine counts) and this process's CPU per entry (best),
after checking that the broker holds every entry.

    python -m benchmarks.relay_throughput [--backend sqlite] [--entries 20000]
        [--in-flight 1,64,256,1024] [--batch-size 1000] [--repeat 3]

Needs ``pip install 'aiofragno[nats,redis]'`` and the servers at
127.0.0.1:4222 (JetStream on) and 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nats
import redis.asyncio

import aiofragno as af

from . import _common as common
from .outbox_read import fill

NATS_URL = "nats://127.0.0.1:4222"
REDIS_URL = "redis://127.0.0.1:6379/0"


async def relay_to_nats(db: af.Database, entries: int, in_flight: int, batch: int) -> float:
    """Seconds to relay the backlog to a new stream (deleted afterwards)."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await js.add_stream(name=name, subjects=[name])
    try:
        sink = af.NatsSink(NATS_URL, subject=name, max_in_flight=in_flight)
        seconds = await timed(lambda: db.outbox.relay(sink, batch_size=batch, until_caught_up=True))
        stored = (await js.stream_info(name)).state.messages
        if stored != entries:
            raise AssertionError(f"the stream holds {stored} messages, expected {entries}")
        return seconds
    finally:
        await js.delete_stream(name)
        await nc.close()


async def relay_to_redis(db: af.Database, entries: int, batch: int) -> float:
    key = f"bench_{uuid.uuid4().hex[:10]}"
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        sink = af.RedisSink(REDIS_URL, key=key)
        seconds = await timed(lambda: db.outbox.relay(sink, batch_size=batch, until_caught_up=True))
        stored = await client.xlen(key)
        if stored != entries:
            raise AssertionError(f"the stream holds {stored} entries, expected {entries}")
        return seconds
    finally:
        await client.delete(key)
        await client.aclose()


CPU: list[float] = []  # the CPU seconds of each timed() call, in order


async def timed(relay: Callable[[], Any]) -> float:
    wall, cpu = time.perf_counter(), time.process_time()
    await relay()
    CPU.append(time.process_time() - cpu)
    return time.perf_counter() - wall


async def runs(label: str, relay: Callable[[], Any], entries: int, repeat: int) -> dict[str, Any]:
    await relay()  # warm-up: connections, the server's stream code paths
    seconds, cpu = [], []
    for _ in range(repeat):
        seconds.append(await relay())
        cpu.append(CPU[-1])
    rates = [entries / s for s in seconds]
    row = {
        "sink": label,
        "entries_per_s_best": round(max(rates)),
        "entries_per_s_median": round(statistics.median(rates)),
        "cpu_us_per_entry_best": round(min(cpu) / entries * 1e6, 1),
    }
    print(f"  {row}")
    return row


async def bench(
    target: common.Target, entries: int, in_flight: Sequence[int], batch: int, repeat: int
) -> dict[str, Any]:
    async with af.connect(target.url, outbox=True, pool_size=common.POOL_SIZE) as db:
        await common.prepare(db)
        await common.reset(db)
        await fill(db, entries)
        await common.reset(db, outbox=False)
        sinks = [
            (f"nats max_in_flight={n}", lambda n=n: relay_to_nats(db, entries, n, batch))
            for n in in_flight
        ]
        sinks.append(("redis", lambda: relay_to_redis(db, entries, batch)))
        print(f"{target.dialect}:")
        results = [await runs(label, relay, entries, repeat) for label, relay in sinks]
        return {"backend": db.name, "driver": db.backend, "entries": entries, "sinks": results}


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.relay_throughput")
    parser.add_argument("--backend", default="sqlite", choices=[*common.BACKENDS, "all"])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--in-flight", default="1,64,256,1024")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    in_flight = [int(n) for n in args.in_flight.split(",")]
    backends = common.BACKENDS if args.backend == "all" else (args.backend,)
    began = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="aiofragno-bench-") as tmp:
        for dialect in backends:
            async with common.target(dialect, Path(tmp)) as target:
                if target is not None:
                    results.append(
                        await bench(target, args.entries, in_flight, args.batch_size, args.repeat)
                    )
    wall = time.perf_counter() - began
    print(f"\nwall time {wall:.0f}s")
    common.write_json(
        args.json or common.default_json_path("relay_throughput"),
        {
            "benchmark": "relay_throughput",
            "config": {
                "entries": args.entries,
                "in_flight": in_flight,
                "batch_size": args.batch_size,
                "repeat": args.repeat,
            },
            "machine": common.machine_info({}),
            "results": results,
            "wall_seconds": round(wall, 1),
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
