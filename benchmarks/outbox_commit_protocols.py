"""How should a unit's outbox entry reach COMMIT on PostgreSQL? An
experiment on raw asyncpg, no aiofragno code in the measured path.

Every outbox writer holds the counter row's lock from its reservation until
its COMMIT is durable. ``reserve`` (aiofragno's protocol for a phase
that does not combine into one statement) sends the
reservation and the entry as one statement, waits for the reply, then sends
COMMIT: the lock is held across a round trip and, when the client is busy,
across the event loop's turnaround. ``stamp`` inserts the entry with a
stand-in versionstamp inside the write statement and sends the reservation
plus COMMIT as one simple-query message, so the lock is held only inside the
server. asyncpg's simple-query call
returns no rows, so a unit that must learn its versionstamp (aiofragno's
``uow.versionstamp``) needs one more round trip after COMMIT (``stamp``);
``stamp-blind`` skips it, as an upper bound. ``alone`` is what aiofragno
does for a phase that combines: the write, the reservation and the entry as
one statement outside any transaction, which commits on its own — one round
trip, and the lock held only inside the server. (Sound because a lost
connection's server session is ended before the executor looks for the
unit's entry: :mod:`aiofragno.server_sessions`.)

Each unit (but ``alone``): BEGIN, one account update, the protocol's outbox
statements, COMMIT — at ``--tasks`` connections, with ``--client-us`` of CPU
burned before every statement to stand in for the rest of a real unit's
client work (which is what delays the COMMIT under load). Rounds interleave
the protocols. Afterwards the versions are checked gap-free and every
payload carries its own version.

    python -m benchmarks.outbox_commit_protocols [--tasks 16] [--client-us 250]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.url import parse_url

from . import _common as common

ACCOUNTS = 1_000
# A payload of the transfer unit's size, its versionstamps as stand-ins.
PAYLOAD = (
    '{"version":1,"mutations":['
    + ",".join(
        '{"op":"update","schema":"shop","namespace":"shop","table":"accounts",'
        '"external_id":"01a22fd9-6ecc-7db6-9d28-cbe4f6e72889",'
        f'"versionstamp":"STAND_IN{i:04x}","set":{{"balance":995}},"check_version":3}}'
        for i in range(3)
    )
    + "]}"
)
SETUP = """
DROP TABLE IF EXISTS bench_protocol_outbox, bench_protocol_counter, bench_protocol_accounts;
CREATE TABLE bench_protocol_accounts (id int PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO bench_protocol_accounts SELECT g, 0 FROM generate_series(1, 1000) g;
CREATE TABLE bench_protocol_counter (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE bench_protocol_outbox (
  id bigserial PRIMARY KEY,
  versionstamp varchar(24) COLLATE "C" NOT NULL UNIQUE,
  uow_id varchar(255) NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL);
CREATE INDEX bench_protocol_outbox_uow ON bench_protocol_outbox (uow_id);
"""
TEARDOWN = "DROP TABLE bench_protocol_outbox, bench_protocol_counter, bench_protocol_accounts"
UPDATE = "UPDATE bench_protocol_accounts SET balance = balance + 1 WHERE id = $1"
_VERSION = "lpad(to_hex(CAST(value AS BIGINT)), 20, '0')"
_RESERVE = (
    "INSERT INTO bench_protocol_counter (key, value) VALUES ('v', '1') ON CONFLICT (key) "
    "DO UPDATE SET value = CAST(CAST(bench_protocol_counter.value AS BIGINT) + 1 AS TEXT) "
    "RETURNING value"
)
RESERVE_AND_INSERT = (
    f"WITH reserved AS ({_RESERVE}), v AS (SELECT {_VERSION} AS h FROM reserved) "
    "INSERT INTO bench_protocol_outbox (versionstamp, uow_id, payload, created_at) "
    "SELECT REPLACE($1, $2, v.h), $3, CAST(REPLACE($4, $2, v.h) AS jsonb), now() FROM v "
    "RETURNING versionstamp"
)
# The stand-in travels in a transaction-local setting, so the COMMIT message
# needs no parameters (the simple-query protocol has none).
UPDATE_AND_INSERT = (
    "WITH w AS (UPDATE bench_protocol_accounts SET balance = balance + 1 WHERE id = $1 "
    "RETURNING 1) INSERT INTO bench_protocol_outbox (versionstamp, uow_id, payload, created_at) "
    "SELECT set_config('bench_protocol.stand_in', $2, true) || '0000', $3, "
    "CAST($4 AS jsonb), now() FROM w"
)
# 1 / count(*) fails the transaction if the entry was not found.
STAMP_AND_COMMIT = (
    f"WITH reserved AS ({_RESERVE}), v AS (SELECT {_VERSION} AS h FROM reserved), "
    "s AS (UPDATE bench_protocol_outbox SET versionstamp = v.h || '0000', "
    "payload = CAST(REPLACE(CAST(payload AS text), "
    "current_setting('bench_protocol.stand_in'), v.h) AS jsonb) FROM v "
    "WHERE versionstamp = current_setting('bench_protocol.stand_in') || '0000' RETURNING 1) "
    "SELECT 1 / count(*) FROM s; COMMIT"
)
LOOKUP = "SELECT versionstamp FROM bench_protocol_outbox WHERE uow_id = $1"
# The write, the reservation and the entry as one statement outside a
# transaction: it commits on its own, so the lock is held only in the server.
ALONE = (
    "WITH w AS (UPDATE bench_protocol_accounts SET balance = balance + 1 WHERE id = $5 "
    f"RETURNING 1), reserved AS ({_RESERVE}), v AS (SELECT {_VERSION} AS h FROM reserved), "
    "e AS (INSERT INTO bench_protocol_outbox (versionstamp, uow_id, payload, created_at) "
    "SELECT REPLACE($1, $2, v.h), $3, CAST(REPLACE($4, $2, v.h) AS jsonb), now() FROM v "
    "RETURNING versionstamp) SELECT (SELECT count(*) FROM w), (SELECT versionstamp FROM e)"
)

Unit = Callable[[Any, int, Callable[[], None]], Awaitable[None]]


def _entry() -> tuple[str, str, str]:
    stand_in = os.urandom(10).hex()
    return stand_in, "u" + stand_in, PAYLOAD.replace("STAND_IN", stand_in)


async def no_outbox(conn: Any, key: int, work: Callable[[], None]) -> None:
    work()
    await conn.execute("BEGIN")
    work()
    await conn.execute(UPDATE, key)
    work()
    await conn.execute("COMMIT")


async def reserve(conn: Any, key: int, work: Callable[[], None]) -> None:
    stand_in, uow_id, payload = _entry()
    work()
    await conn.execute("BEGIN")
    work()
    await conn.execute(UPDATE, key)
    work()
    await conn.fetchval(RESERVE_AND_INSERT, stand_in + "0000", stand_in, uow_id, payload)
    work()
    await conn.execute("COMMIT")


async def _stamp(conn: Any, key: int, work: Callable[[], None], learn: bool) -> None:
    stand_in, uow_id, payload = _entry()
    work()
    await conn.execute("BEGIN")
    work()
    await conn.execute(UPDATE_AND_INSERT, key, stand_in, uow_id, payload)
    work()
    await conn.execute(STAMP_AND_COMMIT)
    if learn:
        work()
        await conn.fetchval(LOOKUP, uow_id)


async def stamp(conn: Any, key: int, work: Callable[[], None]) -> None:
    await _stamp(conn, key, work, learn=True)


async def stamp_blind(conn: Any, key: int, work: Callable[[], None]) -> None:
    await _stamp(conn, key, work, learn=False)


async def alone(conn: Any, key: int, work: Callable[[], None]) -> None:
    stand_in, uow_id, payload = _entry()
    work()
    await conn.fetchrow(ALONE, stand_in + "0000", stand_in, uow_id, payload, key)


PROTOCOLS: dict[str, Unit] = {
    "no-outbox": no_outbox,
    "reserve": reserve,
    "stamp": stamp,
    "stamp-blind": stamp_blind,
    "alone": alone,
}


def burner(microseconds: float) -> Callable[[], None]:
    def work() -> None:
        end = time.perf_counter() + microseconds / 1e6
        while time.perf_counter() < end:
            pass

    return work


async def rate(
    pool: Any, unit: Unit, tasks: int, seconds: float, work: Callable[[], None]
) -> float:
    count = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        async with pool.acquire() as conn:
            while time.perf_counter() < stop:
                await unit(conn, random.randint(1, ACCOUNTS), work)
                count += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return count / seconds


async def verify(conn: Any) -> int:
    stamps = [
        r[0]
        for r in await conn.fetch(
            "SELECT versionstamp FROM bench_protocol_outbox ORDER BY versionstamp"
        )
    ]
    versions = [int(s[:20], 16) for s in stamps]
    if versions != list(range(1, len(versions) + 1)):
        raise AssertionError("outbox versions have a gap or a duplicate")
    stale = await conn.fetchval(
        "SELECT count(*) FROM bench_protocol_outbox "
        "WHERE strpos(CAST(payload AS text), substr(versionstamp, 1, 20) || '0002') = 0"
    )
    if stale:
        raise AssertionError(f"{stale} payloads do not carry their entry's version")
    return len(versions)


async def measure(args: argparse.Namespace) -> dict[str, Any] | None:
    import asyncpg

    async with common.target("postgresql", Path(".")) as target:
        if target is None:
            return None
        async with af.connect(target.url, pool_size=1) as admin:
            server = await common.server_info(admin)
        url = parse_url(target.url)
        pool = await asyncpg.create_pool(
            host=url.host,
            port=url.port,
            user=url.username,
            database=url.database,
            min_size=args.tasks,
            max_size=args.tasks,
        )
        try:
            await pool.execute(SETUP)
            work = burner(args.client_us)
            rounds: dict[str, list[float]] = {name: [] for name in PROTOCOLS}
            for _ in range(args.rounds):
                for name, unit in PROTOCOLS.items():
                    rounds[name].append(await rate(pool, unit, args.tasks, args.seconds, work))
            async with pool.acquire() as conn:
                entries = await verify(conn)
            await pool.execute(TEARDOWN)
        finally:
            await pool.close()
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    return {
        "units_per_s_median": {name: round(v) for name, v in medians.items()},
        "units_per_s_rounds": {name: [round(v) for v in vs] for name, vs in rounds.items()},
        "ratio_to_no_outbox": {
            name: round(v / medians["no-outbox"], 2) for name, v in medians.items()
        },
        "entries_verified": entries,
        "server": server,
    }


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_commit_protocols")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--client-us", type=float, default=250.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = await measure(args)
    if result is None:
        print("PostgreSQL is not reachable: nothing measured")
        return
    common.print_table(
        ["protocol", "units/s (median)", "/ no-outbox", "rounds"],
        [
            [
                name,
                result["units_per_s_median"][name],
                result["ratio_to_no_outbox"][name],
                " ".join(map(str, result["units_per_s_rounds"][name])),
            ]
            for name in PROTOCOLS
        ],
    )
    print(f"verified {result['entries_verified']} entries: gap-free, payloads stamped")
    common.write_json(
        args.json
        or common.default_json_path(f"outbox_commit_protocols-c{args.tasks}-{args.client_us:g}us"),
        {
            "benchmark": "outbox_commit_protocols",
            "config": {k: getattr(args, k) for k in ("tasks", "client_us", "rounds", "seconds")},
            "machine": common.machine_info({"postgresql": result.pop("server")}),
            "results": result,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
