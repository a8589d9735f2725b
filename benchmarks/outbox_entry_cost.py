"""What writing an outbox entry costs MariaDB/MySQL itself, with no aiofragno
code and almost no client work on the measured path.

One asyncmy connection loops a transfer-shaped transaction sent as one
multi-statement round trip (BEGIN, 2 updates, 1 insert, COMMIT) in these
shapes: alone; with a plain INSERT of an outbox-sized entry (the cheapest
entry there is: no version counter); with the counter's reservation (an
upsert) before that plain INSERT; with the entry taking the reserved version
from the session (``LAST_INSERT_ID()``, aiofragno since 191c201); with the
entry reading it back from the counter row (a subquery, aiofragno before);
the stale guards after each update alone, and with the entry (aiofragno's
outbox phase since b24a64a); and the entry with COMMIT in a second round
trip after the writes (aiofragno's outbox phase before that: no guards);
and, MariaDB only, the phase as one compound statement (``BEGIN NOT ATOMIC
... END``, the guards as ``IF ... SIGNAL``), alone and with the entry inside
or after it: one result to read instead of one per statement. (Tried in
aiofragno and dropped: less client CPU, but more server CPU in the real
phase, and at concurrency 16 fewer units/s.)
Shapes interleave in ``--rounds`` (order reversed every other round).

Reported per shape, as medians over the rounds, in microseconds per
transaction: wall time, this process's CPU (the driver's work) and the
server's CPU (read from ``/proc``, see ``cpu_meter``), the CPU each adds to
"no entry" (paired by round), the rate against "no entry", and the CPU
ratio (no entry's client + server CPU over the shape's): on a machine whose
cores the client and the server share, the most throughput a unit with that
entry can keep of one without it.

    python -m benchmarks.outbox_entry_cost [--units 1000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.dialects import mysql

from . import _common as common
from .cpu_meter import CpuSample, server_commands

SETUP = [
    "DROP TABLE IF EXISTS cost_accounts, cost_transfers, cost_outbox, cost_settings",
    "CREATE TABLE cost_accounts (id bigint AUTO_INCREMENT PRIMARY KEY, "
    "ext varchar(64) UNIQUE, balance bigint, version int) ENGINE=InnoDB",
    "CREATE TABLE cost_transfers (id bigint AUTO_INCREMENT PRIMARY KEY, ext varchar(64) UNIQUE, "
    "src bigint, dst bigint, amount bigint, version int, KEY (src), KEY (dst)) ENGINE=InnoDB",
    "CREATE TABLE cost_outbox (id bigint AUTO_INCREMENT PRIMARY KEY, "
    "versionstamp char(24) NOT NULL UNIQUE, uow_id varchar(255) NOT NULL, payload json NOT NULL, "
    "ref_map json, created_at datetime(6) NOT NULL, KEY (uow_id)) ENGINE=InnoDB",
    "CREATE TABLE cost_settings (id bigint AUTO_INCREMENT PRIMARY KEY, "
    "`key` varchar(255) NOT NULL UNIQUE, value text) ENGINE=InnoDB",
    "INSERT INTO cost_accounts (ext, balance, version) VALUES ('a', 1000, 0), ('b', 1000, 0)",
    "INSERT INTO cost_settings (`key`, value) VALUES ('outbox.version', '0')",
]
UNIT = (
    "BEGIN; UPDATE cost_accounts SET balance = balance - 1, version = version + 1 WHERE id = 1; "
    "UPDATE cost_accounts SET balance = balance + 1, version = version + 1 WHERE id = 2; "
    "INSERT INTO cost_transfers (ext, src, dst, amount, version) VALUES (%s, 1, 2, 1, 0)"
)
RESERVE = (
    "; INSERT INTO cost_settings (`key`, value) VALUES ('outbox.version', '1') "
    "ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(CAST(value AS UNSIGNED) + 1)"
)
ENTRY = (
    "; INSERT INTO cost_outbox (versionstamp, uow_id, payload, ref_map, created_at) "
    "VALUES ({stamp}, %s, {payload}, NULL, UTC_TIMESTAMP(6))"
)
FROM_SESSION = "LPAD(LOWER(HEX(IF(ROW_COUNT() = 1, 1, LAST_INSERT_ID()))), 20, '0')"
FROM_ROW = (
    "(SELECT LPAD(LOWER(HEX(CAST(value AS UNSIGNED))), 20, '0') "
    "FROM cost_settings WHERE `key` = 'outbox.version')"
)


def _entry(version: str | None) -> str:
    if version is None:
        return ENTRY.format(stamp="%s", payload="%s")
    # The stand-in swapped for the version, as aiofragno's entry does.
    swap = f"REPLACE(%s, %s, {version})"
    return ENTRY.format(stamp=swap, payload=swap)


# Where a shape's text is cut into two round trips (aiofragno's outbox phase
# before b24a64a: the writes, then the entry with COMMIT).
NEXT_TRIP = "; -- next round trip --\n"
# aiofragno's stale guard after a write (CommitPlanChoice.stale_guard).
GUARD = "; " + mysql.ADAPTER.commit.stale_guard.after_write.format(message="'stale'")  # type: ignore[union-attr]
GUARDED = UNIT.replace("WHERE id = 1;", "WHERE id = 1" + GUARD + ";").replace(
    "WHERE id = 2;", "WHERE id = 2" + GUARD + ";"
)
# MariaDB's anonymous compound statement: the guards as IF ... SIGNAL, the
# whole phase one statement with one result (where the batch has one per
# statement).
SIGNAL = "; IF ROW_COUNT() = 0 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'stale'; END IF"
BLOCK = "BEGIN; BEGIN NOT ATOMIC " + UNIT.removeprefix("BEGIN; ").replace(
    "WHERE id = 1;", "WHERE id = 1" + SIGNAL + ";"
).replace("WHERE id = 2;", "WHERE id = 2" + SIGNAL + ";")

# name -> (SQL, what its entry binds: None (no entry), "plain" or "swap")
SHAPES: dict[str, tuple[str, str | None]] = {
    "no entry": (UNIT, None),
    "plain entry": (UNIT + _entry(None), "plain"),
    "reserve + plain entry": (UNIT + RESERVE + _entry(None), "plain"),
    "reserve + entry, version from session": (UNIT + RESERVE + _entry(FROM_SESSION), "swap"),
    "reserve + entry, version from counter row": (UNIT + RESERVE + _entry(FROM_ROW), "swap"),
    "guarded, no entry": (GUARDED, None),
    "guarded + reserve + entry from session": (GUARDED + RESERVE + _entry(FROM_SESSION), "swap"),
    "block: guarded, no entry": (BLOCK + "; END", None),
    "block: guarded + reserve + entry from session": (
        BLOCK + RESERVE + _entry(FROM_SESSION) + "; END",
        "swap",
    ),
    "block: guarded, then reserve + entry from session": (
        BLOCK + "; END" + RESERVE + _entry(FROM_SESSION),
        "swap",
    ),
    "2 round trips: unit, then reserve + entry from session": (
        UNIT + NEXT_TRIP + RESERVE[2:] + _entry(FROM_SESSION),
        "swap",
    ),
}


def _payload() -> str:
    """A transfer unit's payload: 2 updates and a create, ~700 characters."""
    mutation = {"op": "update", "schema": "shop", "namespace": "shop", "table": "accounts"}
    updates = [
        {**mutation, "external_id": os.urandom(8).hex(), "versionstamp": "0" * 24,
         "set": {"balance": 1000 + i, "note": None}, "check_version": 6}
        for i in range(2)
    ]  # fmt: skip
    create = {
        **mutation,
        "op": "create",
        "table": "transfers",
        "external_id": os.urandom(8).hex(),
        "versionstamp": "0" * 24,
        "values": {"src": "a" * 20, "dst": "b" * 20, "amount": 17},
    }
    return json.dumps({"version": 1, "mutations": [*updates, create]})


def _parameters(entry: str | None, payload: str) -> tuple[Any, ...]:
    transfer, uow_id, stand_in = os.urandom(8).hex(), os.urandom(12).hex(), os.urandom(10).hex()
    if entry is None:
        return (transfer,)
    if entry == "plain":
        return (transfer, stand_in + "0000", uow_id, payload)
    return (transfer, stand_in + "0000", stand_in, uow_id, payload, stand_in)


@dataclass(frozen=True)
class Sample:
    """One run of a shape, in microseconds per transaction."""

    wall: float
    client: float
    server: float | None  # None when the server is not on this machine

    @property
    def server_us(self) -> float:
        assert self.server is not None
        return self.server


async def _loop(
    cursor: Any, shape: str, units: int, payload: str, server: tuple[str, ...]
) -> Sample:
    """``units`` runs of ``shape``."""
    statements, entry = SHAPES[shape]
    trips = (statements + "; COMMIT").split(NEXT_TRIP)
    before, started = CpuSample.take(server), time.perf_counter()
    for _ in range(units):
        parameters = _parameters(entry, payload)
        for sql in trips:
            count = sql.count("%s")
            await cursor.execute(sql, parameters[:count])
            parameters = parameters[count:]
            while await cursor.nextset():
                pass
    wall = time.perf_counter() - started
    used = before.until(CpuSample.take(server))
    server_us = None if used.server is None else used.server / units * 1e6
    return Sample(wall / units * 1e6, (used.loop + used.threads) / units * 1e6, server_us)


async def measure(url: str, units: int, rounds: int) -> dict[str, Any]:
    import asyncmy

    parsed = common.parse_url(url)
    server = server_commands("mysql", parsed.host)
    conn = await asyncmy.connect(**common.asyncmy_options(url))
    try:
        async with conn.cursor() as cursor:
            # (No "Unknown table" note from the first DROP ... IF EXISTS.)
            await cursor.execute("SET SESSION sql_notes = 0")
            for statement in SETUP:
                await cursor.execute(statement)
            payload = _payload()
            runs: dict[str, list[Sample]] = {shape: [] for shape in SHAPES}
            for r in range(rounds):
                for shape in SHAPES if r % 2 == 0 else list(SHAPES)[::-1]:
                    runs[shape].append(await _loop(cursor, shape, units, payload, server))
            await cursor.execute(SETUP[0])
            await cursor.execute("SET time_zone = '+00:00'")  # (what the guards set)
    finally:
        conn.close()
    return {shape: _summary(times, runs["no entry"]) for shape, times in runs.items()}


def _summary(times: list[Sample], base: list[Sample]) -> dict[str, Any]:
    """One shape's medians, and what it adds to ``base`` ("no entry") paired by round."""
    median = statistics.median

    def added(pick: Callable[[Sample], float]) -> float:
        return round(median(pick(t) - pick(b) for t, b in zip(times, base, strict=True)), 1)

    wall, client = median(t.wall for t in times), median(t.client for t in times)
    result: dict[str, Any] = {
        "us_best": round(min(t.wall for t in times), 1),
        "us_median": round(wall, 1),
        "rate_vs_no_entry": round(median(b.wall for b in base) / wall, 3),
        "client_cpu_us": round(client, 1),
        "client_cpu_added_us": added(lambda t: t.client),
        "server_cpu_us": None,
        "server_cpu_added_us": None,
        "cpu_ratio_vs_no_entry": None,
    }
    if all(t.server is not None for t in (*times, *base)):
        server = median(t.server_us for t in times)
        base_cpu = median(b.client for b in base) + median(b.server_us for b in base)
        result["server_cpu_us"] = round(server, 1)
        result["server_cpu_added_us"] = added(lambda t: t.server_us)
        result["cpu_ratio_vs_no_entry"] = round(base_cpu / (client + server), 3)
    return result


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_entry_cost")
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    async with common.target("mysql", Path(".")) as target:
        if target is None:
            return
        async with af.connect(target.url, pool_size=1) as admin:
            server = await common.server_info(admin)
        results = await measure(target.url, args.units, args.rounds)
    common.print_table(
        [
            "transaction",
            "us best",
            "us median",
            "rate vs no entry",
            "client CPU us",
            "added",
            "server CPU us",
            "added",
            "CPU ratio",
        ],
        [[shape, *("-" if v is None else v for v in r.values())] for shape, r in results.items()],
    )
    common.write_json(
        args.json or common.default_json_path("outbox_entry_cost"),
        {
            "benchmark": "outbox_entry_cost",
            "config": {"units": args.units, "rounds": args.rounds},
            "machine": common.machine_info({"mysql": server}),
            "results": results,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
