"""Read replicas: the read throughput one replica adds on the transfer read
mix, and what keeping each task's commit position costs the writes.

A private primary and a replica of it, on this machine: with ``--dialect
postgresql`` (the default) a hot standby streaming from the primary
(``tests/pg_replication.py``: copies of one ``initdb`` cluster); with
``--dialect mysql`` a MariaDB GTID replica (``tests/mariadb_replication.py``:
``mariadb-install-db``, ``CHANGE MASTER ... MASTER_USE_GTID``). The read mix is the transfer unit's retrieval phase (two accounts
of 1,000 by owner, one unit of work; ``benchmarks/_common.py``), run by
``--concurrency`` tasks for ``--units`` units per variant:

* ``primary``: every unit on the primary alone (no replicas configured);
* ``primary+replica``: half the tasks read on the primary, half with
  ``reads="replica"`` (the two servers share the load: the gain);
* ``replica``: every unit with ``reads="replica"`` (the routing's cost
  against the primary alone).

Then the writes: serial transfer units (read two accounts, update both,
insert a transfer) with and without a replica configured — with one, each
commit is followed by one round trip on the connection still held, reading
the commit position (``pg_current_wal_insert_lsn()``; MariaDB
``@@gtid_binlog_pos``); without, nothing. Variants are interleaved in
``--rounds`` rounds; reported: units/s, and the ratios' median and range
over the rounds. JSON in ``benchmarks/results/``.

Both servers and this client share the machine's cores, so the gain here
is a floor: on hosts of their own the replica adds its whole CPU.

    python -m benchmarks.replica_reads [--dialect postgresql|mysql] [--units 2000]
        [--concurrency 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofragno as af
from tests.mariadb_replication import MariaDBPair
from tests.pg_replication import ReplicationPair
from tests.server_watchdog import children

from . import _common as common

SCHEMA = common.SCHEMA
Unit = Callable[[af.UnitOfWork], Awaitable[Any]]


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) of server ``pid``'s processes so far
    (those running now: the benchmark keeps its connections open)."""
    ticks = 0
    for process in (pid, *children(pid)):
        try:
            fields = Path(f"/proc/{process}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # (ended meanwhile)
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Pair:
    """A primary and its replica: their URLs and main processes."""

    primary_url: str
    replica_url: str
    pids: dict[str, int]


@contextmanager
def started_pair(dialect: str) -> Iterator[Pair]:
    if dialect == "mysql":
        mariadb = MariaDBPair.create_blocking()
        try:
            servers = {"primary": mariadb.primary, "replica": mariadb.replica}
            pids = {name: s._process.pid for name, s in servers.items() if s._process}
            yield Pair(mariadb.url(mariadb.primary), mariadb.url(mariadb.replica), pids)
        finally:
            mariadb.close()
        return
    pg = ReplicationPair.create_blocking(synchronous=False)
    try:
        pids = pg.pids()
        yield Pair(
            pg.primary.url, pg.standby.url, {"primary": pids["primary"], "replica": pids["standby"]}
        )
    finally:
        pg.close()


def read_unit(lo: int, hi: int) -> Unit:
    async def fn(uow: af.UnitOfWork) -> None:
        a = uow.find_first("accounts", where={"owner": common.owner(lo)})
        b = uow.find_first("accounts", where={"owner": common.owner(hi)})
        await uow.retrieve()
        if a.result is None or b.result is None:
            raise LookupError("an account of the read mix does not exist")

    return fn


async def run_reads(
    db: af.Database, units: int, concurrency: int, replica_share: float, seed: int
) -> float:
    """Units/s of ``units`` read units by ``concurrency`` tasks, the first
    ``replica_share`` of the tasks with ``reads="replica"``."""
    rng = random.Random(seed)
    work = [tuple(sorted(rng.sample(range(common.ACCOUNTS), 2))) for _ in range(units)]
    per_task = units // concurrency
    on_replica = round(concurrency * replica_share)

    async def worker(index: int) -> None:
        reads = "replica" if index < on_replica else "primary"
        for lo, hi in work[index * per_task : (index + 1) * per_task]:
            await db.execute_uow(read_unit(lo, hi), schema=SCHEMA, reads=reads)

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return per_task * concurrency / (time.perf_counter() - started)


async def run_writes(db: af.Database, units: int, seed: int) -> float:
    """Units/s of ``units`` transfer units, one at a time."""
    started = time.perf_counter()
    for lo, hi, amount in common.plan(units, seed):
        await db.execute_uow(common.transfer_unit(lo, hi, amount), schema=SCHEMA)
    return units / (time.perf_counter() - started)


async def bench(args: argparse.Namespace, pair: Pair) -> dict[str, Any]:
    primary_url, replica_url, pids = pair.primary_url, pair.replica_url, pair.pids
    async with (
        af.connect(primary_url, pool_size=common.POOL_SIZE) as alone,
        af.connect(primary_url, pool_size=common.POOL_SIZE, replicas=[replica_url]) as paired,
    ):
        # (Prepared through the paired Database: this task's commit position
        # then covers the accounts, and the tasks it starts inherit it.)
        await common.prepare(paired)
        # (A replica unit after the writes waits for the replica to have them.)
        await paired.execute_uow(read_unit(0, 1), schema=SCHEMA, reads="replica")
        reads: dict[str, list[float]] = {"primary": [], "primary+replica": [], "replica": []}
        # Server CPU microseconds per read unit, by variant and server.
        cpu: dict[str, dict[str, list[float]]] = {
            name: {server: [] for server in pids} for name in reads
        }
        writes: dict[str, list[float]] = {"no replicas": [], "one replica": []}
        variants = [
            ("primary", alone, 0.0),
            ("primary+replica", paired, 0.5),
            ("replica", paired, 1.0),
        ]
        for db in (alone, paired):  # warm-up
            await run_reads(db, args.units // 4, args.concurrency, 1.0, seed=0)
        for round in range(args.rounds):
            order = variants if round % 2 == 0 else variants[::-1]
            for name, db, share in order:
                before = {server: server_cpu(pid) for server, pid in pids.items()}
                reads[name].append(
                    await run_reads(db, args.units, args.concurrency, share, seed=round + 1)
                )
                for server, pid in pids.items():
                    used = server_cpu(pid) - before[server]
                    cpu[name][server].append(used / args.units * 1e6)
            pairs = [("no replicas", alone), ("one replica", paired)]
            for name, db in pairs if round % 2 == 0 else pairs[::-1]:
                writes[name].append(await run_writes(db, args.writes, seed=round + 1))
        stats = paired.stats.as_dict()
    return {"reads": reads, "server_cpu_us_per_read": cpu, "writes": writes, "paired_stats": stats}


def ratios(runs: dict[str, list[float]], name: str, base: str) -> dict[str, float]:
    per_round = [a / b for a, b in zip(runs[name], runs[base], strict=True)]
    return {
        "median": statistics.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
    }


def report(result: dict[str, Any]) -> dict[str, Any]:
    reads, writes = result["reads"], result["writes"]
    rows = []
    for name, runs in reads.items():
        ratio = ratios(reads, name, "primary")
        rows.append(
            [
                f"reads: {name}",
                f"{sum(runs) / len(runs):.0f}",
                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})",
            ]
        )
    for name, runs in writes.items():
        ratio = ratios(writes, name, "no replicas")
        rows.append(
            [
                f"serial writes: {name}",
                f"{sum(runs) / len(runs):.0f}",
                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})",
            ]
        )
    common.print_table(["variant", "units/s", "ratio (median, range)"], rows)
    print()
    common.print_table(
        ["read variant", "primary CPU us/unit", "replica CPU us/unit"],
        [
            [name, *(f"{statistics.median(values):.0f}" for values in servers.values())]
            for name, servers in result["server_cpu_us_per_read"].items()
        ],
    )
    return {
        "read_ratios": {name: ratios(reads, name, "primary") for name in reads},
        "write_ratios": {name: ratios(writes, name, "no replicas") for name in writes},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", choices=["postgresql", "mysql"], default="postgresql")
    parser.add_argument("--units", type=int, default=2000, help="read units per run")
    parser.add_argument("--writes", type=int, default=300, help="serial write units per run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()
    with started_pair(args.dialect) as pair:
        result = asyncio.run(bench(args, pair))
    summary = report(result)
    name = "replica_reads" if args.dialect == "postgresql" else "replica_reads_mariadb"
    common.write_json(
        common.default_json_path(name) if args.json is None else Path(args.json),
        {
            "benchmark": "replica_reads",
            "arguments": vars(args),
            "machine": common.machine_info({}),
            **result,
            **summary,
        },
    )


if __name__ == "__main__":
    main()
