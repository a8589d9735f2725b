"""Commit-to-handler latency of an outbox consumer on PostgreSQL: woken by
LISTEN/NOTIFY (push) against polling every ``poll_interval`` (what readers
did before push; push turned off in-process for those rounds).

A consumer runs with ``poll_interval`` (default 0.5 s, the default of
``Consumer.run``) while a writer commits ``--units`` one-row units, one at
a time, a random 10..60 ms apart (so commits fall at every phase of the
poll). Latency: from ``execute_uow`` returning to the handler receiving the
entry (a notification can arrive before the commit's reply, so a few are
slightly negative). Rounds alternate push and poll; reported p50/p99 over
all rounds of each mode, against the p99 <= 50 ms target.

Runs in a database of its own (``aiofragno_bench_push``).

    python -m benchmarks.outbox_push_latency [--units 200] [--rounds 4] [--poll-interval 0.5] [--runtime asyncio|trio]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import anyio
import anyio.lowlevel

import aiofragno as af
from aiofragno.outbox.push import CommitWaiter

from . import _common as common

DATABASE = "aiofragno_bench_push"
TARGET_P99_MS = 50.0
EVENTS = af.Schema("push_bench", af.Table("events", af.Column("n", "bigint")))


@contextlib.contextmanager
def polling_only() -> Iterator[None]:
    """Readers as before push: they never listen, so every wait lasts the
    poll interval."""

    async def never(self: CommitWaiter, within: float) -> bool:
        return False

    with mock.patch.object(CommitWaiter, "_listen", never):
        yield


async def one_round(db: af.Database, units: int, poll_interval: float, seed: int) -> list[float]:
    """Latencies (ms) of ``units`` commits to one consumer's handler."""
    consumer = db.outbox.consumer(f"latency-{uuid.uuid4().hex[:8]}")
    await consumer.run(lambda entry: anyio.lowlevel.checkpoint(), until_caught_up=True)
    received: dict[str, float] = {}
    all_in = anyio.Event()

    async def handle(entry: af.OutboxEntry) -> None:
        received[entry.uow_id] = time.perf_counter()
        if len(received) == units:
            all_in.set()

    rng = random.Random(seed)
    committed: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: consumer.run(handle, poll_interval=poll_interval, stop=all_in))
        await anyio.sleep(1.0)  # (the consumer has claimed its lease and waits)
        for n in range(units):
            await anyio.sleep(rng.uniform(0.010, 0.060))
            key = f"u-{uuid.uuid4().hex}"

            async def unit(uow: af.UnitOfWork, n: int = n) -> None:
                uow.create("events", {"n": n})

            await db.execute_uow(unit, schema=EVENTS, idempotency_key=key)
            committed[key] = time.perf_counter()
        with anyio.fail_after(poll_interval * 4 + 30):
            await all_in.wait()
    return [(received[key] - at) * 1000 for key, at in committed.items()]


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(common.percentile(latencies, 50), 2),
        "p90_ms": round(common.percentile(latencies, 90), 2),
        "p99_ms": round(common.percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
    }


async def main(args: argparse.Namespace) -> None:
    url = common.DEFAULT_URLS["postgresql"].rsplit("/", 1)[0] + "/" + DATABASE
    await common.ensure_database(url)
    modes: dict[str, list[float]] = {"push": [], "poll": []}
    rounds: list[dict[str, Any]] = []
    async with af.connect(url, outbox=True, pool_size=common.POOL_SIZE) as db:
        await db.migrate(EVENTS)
        servers = {"postgresql": await common.server_info(db)}
        for number in range(args.rounds):
            for mode in ("push", "poll") if number % 2 == 0 else ("poll", "push"):
                with polling_only() if mode == "poll" else contextlib.nullcontext():
                    latencies = await one_round(db, args.units, args.poll_interval, number)
                modes[mode] += latencies
                rounds.append({"round": number, "mode": mode, **summary(latencies)})
                print(rounds[-1])
    results = {mode: {"units": len(values), **summary(values)} for mode, values in modes.items()}
    common.print_table(
        ["mode", "units", "p50 ms", "p90 ms", "p99 ms", "max ms"],
        [[mode, *r.values()] for mode, r in results.items()],
    )
    print(f"target: push p99 <= {TARGET_P99_MS} ms")
    common.write_json(
        args.json or common.default_json_path(f"outbox_push_latency-{args.runtime}"),
        {
            "benchmark": "outbox_push_latency",
            "config": {
                "units_per_round": args.units,
                "rounds": args.rounds,
                "poll_interval": args.poll_interval,
                "runtime": args.runtime,
                "gap_ms": [10, 60],
            },
            "machine": common.machine_info(servers),
            "results": results,
            "target_p99_ms": TARGET_P99_MS,
            "rounds": rounds,
        },
    )


def run(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_push_latency")
    parser.add_argument("--units", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--runtime", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    anyio.run(main, args, backend=args.runtime)


if __name__ == "__main__":
    run()
