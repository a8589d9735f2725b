"""How long units of work wait across a failover to a promoted standby.

A primary and its standby of our own, named together in one URL
(``host1:port1,host2:port2``; read-write is the default with several hosts):
``--dialect postgresql`` a streaming standby (tests/pg_replication.py),
``--dialect mysql`` a MariaDB GTID replica (tests/mariadb_replication.py,
connected as its user ``app``, who cannot write through ``read_only``).
8 tasks run one-insert units with the outbox on; the primary is lost —
``crash`` (PostgreSQL ``pg_ctl stop -m immediate``, MariaDB SIGKILL:
connections reset) or ``silent`` (a proxy in front of it stops forwarding:
no RST, no reply; found by ``command_timeout`` and ``connect_timeout``, 1 s
each) — and the standby is promoted ``--down`` seconds later (the issue's
2 s; MariaDB: ``STOP SLAVE; RESET SLAVE ALL; read_only=0``). Reported per
round: seconds from the end of the promotion to the first unit that
succeeds after it, from the loss to that unit, units that raised (must be
0), and units applied twice (must be 0).

    python -m benchmarks.failover_recovery [--dialect postgresql|mysql]
        [--fault crash|silent|both] [--replication async|sync] [--rounds 3]
        [--down 2.0] [--json PATH]

(MariaDB's pair replicates asynchronously only.)
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

import aiofragno as af
from tests import mariadb_replication, pg_replication
from tests.faults import Proxy, tcp_proxy
from tests.servers import PrivateServer

from . import _common as common

EVENTS = af.Schema("failover_bench", af.Table("events", af.Column("key", "string")))
WORKERS = 8
AFTER = 1.0  # seconds of load after the promotion


@dataclass(frozen=True)
class Pair:
    """A primary and the server to promote in its place, of either dialect:
    all this benchmark asks of a pair."""

    primary: PrivateServer
    standby: pg_replication.StandbyServer | mariadb_replication.ReplicaServer
    user: str  # the URL up to the hosts: "postgresql://postgres"
    close: Callable[[], None]
    # Until the standby has applied all the primary logged (the migration).
    caught_up: Callable[[], Awaitable[None]] | None = None

    def url(self, *ports: int) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
        return f"{self.user}@{hosts}/test"


def postgresql_pair(replication: str) -> Pair:
    pair = pg_replication.new_pair(synchronous=replication == "sync")
    # (Its standby streams: the migration is replayed within the load's first 0.5 s.)
    return Pair(pair.primary, pair.standby, "postgresql://postgres", pair.close)


def mariadb_pair(replication: str) -> Pair:
    pair = mariadb_replication.new_pair()
    user = f"mysql://{mariadb_replication.USER}"
    return Pair(pair.primary, pair.replica, user, pair.close, pair.caught_up)


PAIRS: dict[str, Callable[[str], Pair]] = {"postgresql": postgresql_pair, "mysql": mariadb_pair}


async def create(uow: af.UnitOfWork, key: str) -> None:
    uow.create("events", {"key": key})


async def stored_keys(url: str) -> list[str]:
    async def fn(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("events")
        await uow.retrieve()
        return [row["key"] for row in op.result]

    async with af.connect(url) as db:
        return await db.execute_uow(fn, schema=EVENTS)


async def one_round(pair: Pair, fault: str, down: float) -> dict[str, Any]:
    async with tcp_proxy("127.0.0.1", pair.primary.port) as proxy:
        url = pair.url(proxy.port, pair.standby.port)
        async with af.connect(
            url, outbox=True, connect_timeout=1, command_timeout=1, pool_size=WORKERS
        ) as db:
            await db.migrate(EVENTS)
            if pair.caught_up is not None:
                await pair.caught_up()
            done, errors, lost_at, promoted = await load(db, pair, proxy, fault, down)
            stats = db.stats
        stored = await stored_keys(pair.url(pair.standby.port))
    first = min(t for t in done.values() if t > promoted)
    return {
        "fault": fault,
        "units": len(done),
        "errors": errors,
        "applied_twice": len(stored) - len(set(stored)),
        # (Asynchronous replication: acknowledged by the primary, never sent on.)
        "acknowledged_lost": len(set(done) - set(stored)),
        "lost_commits_settled": stats.commits_resolved,
        "retries_after_loss": stats.lost_connection_retries,
        "promotion_to_first_success_s": round(first - promoted, 3),
        "loss_to_first_success_s": round(first - lost_at, 3),
    }


async def load(
    db: af.Database, pair: Pair, proxy: Proxy, fault: str, down: float
) -> tuple[dict[str, float], int, float, float]:
    done: dict[str, float] = {}
    errors = 0
    counter = itertools.count()
    promoted = float("inf")
    stop = anyio.Event()

    async def worker() -> None:
        nonlocal errors
        while not stop.is_set():
            key = f"k{next(counter)}"
            try:
                await db.execute_uow(lambda uow, key=key: create(uow, key), schema=EVENTS)
            except af.Error:
                errors += 1
                continue
            done[key] = time.monotonic()

    async with anyio.create_task_group() as tg:
        for _ in range(WORKERS):
            tg.start_soon(worker)
        await anyio.sleep(0.5)
        lost_at = time.monotonic()
        if fault == "silent":
            proxy.stall(True)
        else:
            await pair.primary.stop("crash")
        await anyio.sleep(down)
        await pair.standby.promote()
        promoted = time.monotonic()
        await anyio.sleep(AFTER)
        stop.set()
    return done, errors, lost_at, promoted


async def run(args: argparse.Namespace) -> dict[str, Any]:
    faults = ["crash", "silent"] if args.fault == "both" else [args.fault]
    rounds = []
    for fault, number in itertools.product(faults, range(args.rounds)):
        pair = await anyio.to_thread.run_sync(PAIRS[args.dialect], args.replication)
        try:
            result = await one_round(pair, fault, args.down)
        finally:
            pair.close()
        rounds.append({"round": number + 1, **result})
        print(result)
    return {
        "dialect": args.dialect,
        "replication": args.replication,
        "down_s": args.down,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", choices=list(PAIRS), default="postgresql")
    parser.add_argument("--fault", choices=["crash", "silent", "both"], default="both")
    parser.add_argument("--replication", choices=["async", "sync"], default="async")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--down", type=float, default=2.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.dialect == "mysql" and args.replication != "async":
        parser.error("MariaDB's pair replicates asynchronously only: --replication async")
    results = anyio.run(run, args)
    common.print_table(
        ["fault", "round", "units", "errors", "twice", "promotion→first s", "loss→first s"],
        [
            [
                r["fault"],
                r["round"],
                r["units"],
                r["errors"],
                r["applied_twice"],
                r["promotion_to_first_success_s"],
                r["loss_to_first_success_s"],
            ]
            for r in results["rounds"]
        ],
    )
    name = "mariadb" if args.dialect == "mysql" else args.replication
    path = args.json or common.default_json_path(f"failover_recovery-{name}")
    common.write_json(path, {"machine": common.machine_info({}), **results})


if __name__ == "__main__":
    main()
