"""Which outbox design keeps most of a unit's throughput on MariaDB/MySQL,
and which of them never let a reader skip or reorder an entry? An
experiment on raw asyncmy, no aiofragno code in the measured path.

Each unit is the transfer's mutation phase as aiofragno sends it on MySQL:
one multi-statement round trip of BEGIN, two account updates each followed
by its stale guard, the design's outbox statements, and COMMIT (ROLLBACK for
``--rollbacks`` of the units, ~6% by default, so that readers meet
reservations and entries that never commit). The designs:

- ``no-outbox``: the unit alone, the base of every ratio.
- ``counter``: aiofragno today. The reservation (an upsert of the counter
  row, the new version left in ``@v``) and the entry carrying it, just
  before COMMIT in the same batch, so the counter's row lock is held only
  inside the server, from the reservation to the end of COMMIT. (This is
  already the "one batch" variant: there is no round trip to us in
  between.) Readers poll ``versionstamp > cursor``. Measured here: not
  sound on MariaDB 10.11 — now and then a reader sees version N+1 and not
  yet N, and passes N (a read view is not taken atomically with respect to
  transactions committing meanwhile; InnoDB releases the counter's lock
  right after a transaction leaves the list a read view copies).
- ``counter-locked``: the same writers; a reader first reads the counter's
  value with a shared lock (granted once the writer holding the counter has
  finished), then reads ``cursor < versionstamp <= that version``: every
  version up to it belongs to a transaction that left the list before the
  read view was taken.
- ``counter-late``: the entry inserted first with a stand-in versionstamp,
  then the reservation and an update of the entry by primary key: the lock
  is held for a cheap update instead of the insert of the entry. Readers as
  for ``counter``.
- ``entry-only``: a plain insert with an AUTO_INCREMENT id and no version;
  readers poll ``id > cursor``. Not sound — ids are taken at insert, not at
  commit, so a reader passes ids that commit later — and here as the
  ceiling: no design whose writers insert an entry can do better.
- ``gate``: the entry as in ``entry-only``, preceded by a shared lock on a
  one-row gate table. A reader takes the gate row's exclusive lock (it is
  granted once every writer that holds the shared lock has committed or
  rolled back, and it holds off new writers meanwhile), reads ``MAX(id)``
  as its horizon, commits, and reads ``cursor < id <= horizon``: every id
  at or below the horizon was taken by a writer that has finished.
- ``gate-seq``: the same gate, the version taken from a MariaDB
  ``SEQUENCE`` inside the entry's insert (so the entry carries its
  versionstamp as today; versions have gaps, which the horizon makes
  harmless). MariaDB only.
- ``sealer``: the entry as in ``entry-only``, its version left NULL; one
  sealer connection, every few milliseconds, in one transaction holding a
  seal row, gives the committed unsealed entries (a consistent read sees
  only committed ones) the next versions in id order, rewriting their
  payloads' stand-ins. Readers poll ``versionstamp > cursor``.

Rounds interleave the designs (order reversed every other round) at each
concurrency; ``--readers`` reader connections poll every design's outbox
throughout (``no-outbox`` runs without readers), so a design's ratio
includes what its readers make the writers wait for. Afterwards, per
design: every committed unit has exactly one entry and no rolled-back unit
has one; versions are gap-free (the designs with versions); and every
reader delivered exactly the final table's entries in the final order
(missing ones are skips). Latency to visibility: from the writer's COMMIT
reply to a reader delivering the entry (median and 95th percentile).

``--soak SECONDS`` then runs each of ``--soak-designs`` alone for that long
at the top concurrency, its readers polling every 2 ms, and reports every
entry a reader passed over with the page that passed it. The rates are
skipped with ``--rounds 0``.

    python -m benchmarks.outbox_mariadb_designs [--concurrency 1 16] [--rounds 4]
    python -m benchmarks.outbox_mariadb_designs --rounds 0 --readers 6 --soak 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiofragno as af

from . import _common as common

ACCOUNTS = 1_000
DESIGNS = (
    "no-outbox",
    "counter",
    "counter-locked",
    "counter-late",
    "entry-only",
    "gate",
    "gate-seq",
    "sealer",
)
# Designs whose versions are gap-free (a counter, or the sealer's).
VERSIONED = ("counter", "counter-locked", "counter-late", "sealer")
# Designs whose readers order by versionstamp (else by id).
STAMPED = (*VERSIONED, "gate-seq")
# A transfer unit's payload (2 updates and a create), the versions as stand-ins.
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
HEX = "LPAD(LOWER(HEX(CAST({v} AS UNSIGNED))), 20, '0')"
GUARD = "SET SESSION time_zone = IF(ROW_COUNT() < 1, 'stale', @@SESSION.time_zone)"
WRITES = (
    "BEGIN; UPDATE mdd_accounts SET balance = balance - 1 WHERE id = %s; "
    f"{GUARD}; UPDATE mdd_accounts SET balance = balance + 1 WHERE id = %s; {GUARD}"
)
# (Each design its own counter row: {key}.)
RESERVE = (
    "INSERT INTO mdd_settings (`key`, value) VALUES ('{key}', @v := 1) ON DUPLICATE KEY UPDATE "
    "value = LAST_INSERT_ID(@v := CAST(value AS UNSIGNED) + 1)"
)
_COLUMNS = "(versionstamp, uow_id, payload, created_at, nonce)"
# (Parameters: stand-in, uow_id, payload, nonce; the stand-in is the nonce.)
ENTRY_RESERVED = (
    "INSERT INTO {t} " + _COLUMNS + " VALUES (CONCAT(" + HEX.format(v="@v") + ", '0000'), %s, "
    "REPLACE(%s, %s, " + HEX.format(v="@v") + "), UTC_TIMESTAMP(6), %s)"
)
ENTRY_SEQUENCE = ENTRY_RESERVED.replace("@v", "(@v := NEXTVAL(mdd_sequence))", 1)
ENTRY_STAND_IN = (
    "INSERT INTO {t} " + _COLUMNS + " VALUES (CONCAT(%s, '0000'), %s, %s, UTC_TIMESTAMP(6), %s)"
)
ENTRY_UNVERSIONED = "INSERT INTO {t} " + _COLUMNS + " VALUES (NULL, %s, %s, UTC_TIMESTAMP(6), %s)"
STAMP_LATE = (
    "SET @e = LAST_INSERT_ID(); "
    + RESERVE.format(key="late")
    + "; UPDATE {t} SET versionstamp = CONCAT("
    + HEX.format(v="@v")
    + ", '0000'), payload = REPLACE(payload, nonce, "
    + HEX.format(v="@v")
    + ") WHERE id = @e"
)
# The counter's newest committed version, read with a shared lock: granted
# once the writer holding the counter has committed or rolled back, so every
# version up to it belongs to a finished transaction. (Autocommit: the lock
# ends with the statement.)
COUNTER_HORIZON = (
    "SELECT CONCAT(" + HEX.format(v="value") + ", 'ffff') FROM mdd_settings "
    "WHERE `key` = 'locked' LOCK IN SHARE MODE"
)
GATE_SHARED = "SELECT id FROM mdd_gate WHERE id = 1 LOCK IN SHARE MODE"
GATE_HORIZON = (
    "BEGIN; SELECT id FROM mdd_gate WHERE id = 1 FOR UPDATE; "
    "SELECT COALESCE(MAX({key}), {none}) FROM {t}; COMMIT"
)
SEAL = (
    "UPDATE {t} SET versionstamp = CONCAT(" + HEX.format(v="@s := @s + 1") + ", '0000'), "
    "payload = REPLACE(payload, nonce, " + HEX.format(v="@s") + ") "
    "WHERE versionstamp IS NULL AND id <= %s ORDER BY id"
)


def table(design: str) -> str:
    return "mdd_outbox_" + design.replace("-", "_")


def setup_statements() -> list[str]:
    outboxes = [table(d) for d in DESIGNS if d != "no-outbox"]
    statements = [
        f"DROP TABLE IF EXISTS mdd_accounts, mdd_settings, mdd_gate, {', '.join(outboxes)}",
        "CREATE TABLE mdd_accounts (id int PRIMARY KEY, balance bigint NOT NULL) ENGINE=InnoDB",
        "INSERT INTO mdd_accounts SELECT seq, 0 FROM seq_1_to_1000",
        "CREATE TABLE mdd_settings (id bigint AUTO_INCREMENT PRIMARY KEY, "
        "`key` varchar(255) NOT NULL UNIQUE, value text) ENGINE=InnoDB",
        "INSERT INTO mdd_settings (`key`, value) VALUES ('seal', '0')",
        "CREATE TABLE mdd_gate (id int PRIMARY KEY) ENGINE=InnoDB",
        "INSERT INTO mdd_gate VALUES (1)",
        "DROP SEQUENCE IF EXISTS mdd_sequence",
        "CREATE SEQUENCE mdd_sequence START WITH 1 INCREMENT BY 1 CACHE 1000",
    ]
    for name in outboxes:
        statements.append(
            f"CREATE TABLE {name} (id bigint AUTO_INCREMENT PRIMARY KEY, "
            "versionstamp char(24) UNIQUE, uow_id varchar(255) NOT NULL, payload json NOT NULL, "
            "ref_map json, created_at datetime(6) NOT NULL, nonce char(20) NOT NULL, "
            "KEY (uow_id)) ENGINE=InnoDB"
        )
    return statements


def unit_sql(design: str, commit: bool) -> str:
    """The design's unit as one multi-statement text."""
    t = table(design)
    outbox = {
        "no-outbox": [],
        "counter": [RESERVE.format(key="counter"), ENTRY_RESERVED.format(t=t)],
        "counter-locked": [RESERVE.format(key="locked"), ENTRY_RESERVED.format(t=t)],
        "counter-late": [ENTRY_STAND_IN.format(t=t), STAMP_LATE.format(t=t)],
        "entry-only": [ENTRY_UNVERSIONED.format(t=t)],
        "gate": [GATE_SHARED, ENTRY_UNVERSIONED.format(t=t)],
        "gate-seq": [GATE_SHARED, ENTRY_SEQUENCE.format(t=t)],
        "sealer": [ENTRY_UNVERSIONED.format(t=t)],
    }[design]
    return "; ".join([WRITES, *outbox, "COMMIT" if commit else "ROLLBACK"])


def unit_parameters(design: str, keys: tuple[int, int], uow_id: str, nonce: str) -> tuple[Any, ...]:
    payload = PAYLOAD.replace("STAND_IN", nonce)
    if design == "no-outbox":
        return keys
    if design in ("counter", "counter-locked", "gate-seq"):
        return (*keys, uow_id, payload, nonce, nonce)
    if design == "counter-late":
        return (*keys, nonce, uow_id, payload, nonce)
    return (*keys, uow_id, payload, nonce)


async def run_text(conn: Any, text: str, parameters: Sequence[Any] = ()) -> list[list[Any]]:
    """Every statement's rows (a multi-statement text: one result each)."""
    results: list[list[Any]] = []
    async with conn.cursor() as cursor:
        await cursor.execute(text, tuple(parameters) or None)
        while True:
            results.append(list(await cursor.fetchall()) if cursor.description else [])
            if not await cursor.nextset():
                break
    return results


@dataclass
class Ledger:
    """What the writers and readers of one design did over all rounds."""

    committed: dict[str, float] = field(default_factory=dict)  # uow_id -> COMMIT reply time
    rolled_back: set[str] = field(default_factory=set)
    delivered: list[list[tuple[Any, str, float]]] = field(default_factory=list)
    cursors: list[Any] = field(default_factory=list)
    # Per reader: (time, cursor, keys read) of each page.
    pages: list[list[tuple[float, Any, list[Any]]]] = field(default_factory=list)

    @classmethod
    def for_readers(cls, design: str, readers: int) -> Ledger:
        return cls(
            delivered=[[] for _ in range(readers)],
            cursors=["" if design in STAMPED else 0 for _ in range(readers)],
            pages=[[] for _ in range(readers)],
        )


class Reader:
    """One reader connection polling one design's outbox, resuming at the
    ledger's cursor; an idle poll sleeps ``idle`` seconds."""

    def __init__(self, conn: Any, design: str, ledger: Ledger, index: int, idle: float) -> None:
        self.conn, self.design, self.ledger, self.index, self.idle = (
            conn,
            design,
            ledger,
            index,
            idle,
        )
        self.t = table(design)

    async def poll(self) -> int:
        """Deliver one page; how many entries it had."""
        cursor = self.ledger.cursors[self.index]
        if self.design == "counter-locked":
            found = (await run_text(self.conn, COUNTER_HORIZON))[0]
            text = f"SELECT versionstamp, uow_id FROM {self.t} WHERE versionstamp > %s "
            text += "AND versionstamp <= %s ORDER BY versionstamp LIMIT 1000"
            horizon = found[0][0] if found else ""
            rows = (await run_text(self.conn, text, (cursor, horizon)))[0]
        elif self.design in VERSIONED:
            text = f"SELECT versionstamp, uow_id FROM {self.t} WHERE versionstamp > %s "
            text += "ORDER BY versionstamp LIMIT 1000"
            rows = (await run_text(self.conn, text, (cursor,)))[0]
        elif self.design in ("gate", "gate-seq"):
            key, none = ("id", "0") if self.design == "gate" else ("versionstamp", "''")
            horizon_sql = GATE_HORIZON.format(t=self.t, key=key, none=none)
            horizon = (await run_text(self.conn, horizon_sql))[2][0][0]
            text = f"SELECT {key}, uow_id FROM {self.t} WHERE {key} > %s AND {key} <= %s "
            text += f"ORDER BY {key} LIMIT 1000"
            rows = (await run_text(self.conn, text, (cursor, horizon)))[0]
        else:
            text = f"SELECT id, uow_id FROM {self.t} WHERE id > %s ORDER BY id LIMIT 1000"
            rows = (await run_text(self.conn, text, (cursor,)))[0]
        now = time.perf_counter()
        self.ledger.pages[self.index].append((now, cursor, [key for key, _ in rows]))
        self.ledger.delivered[self.index] += [(key, uow_id, now) for key, uow_id in rows]
        if rows:
            self.ledger.cursors[self.index] = rows[-1][0]
        return len(rows)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if await self.poll() < 1000:
                await asyncio.sleep(self.idle)


async def seal(conn: Any, design_table: str) -> int:
    """One sealing transaction: the committed unsealed entries get the next
    versions in id order. How many it sealed."""
    texts = await run_text(
        conn,
        "BEGIN; SELECT value FROM mdd_settings WHERE `key` = 'seal' FOR UPDATE; "
        f"SELECT COALESCE(MAX(id), 0) FROM {design_table} WHERE versionstamp IS NULL",
    )
    last, top = int(texts[1][0][0]), texts[2][0][0]
    if not top:
        await run_text(conn, "COMMIT")
        return 0
    async with conn.cursor() as cursor:
        await cursor.execute(
            f"SET @s = %s; {SEAL.format(t=design_table)}; "
            "UPDATE mdd_settings SET value = @s WHERE `key` = 'seal'; COMMIT",
            (last, top),
        )
        counts = [cursor.rowcount]
        while await cursor.nextset():
            counts.append(cursor.rowcount)
    return int(counts[1])  # (the SEAL update's)


async def sealer(conn: Any, design_table: str, stop: asyncio.Event, idle: float) -> None:
    while not stop.is_set():
        await seal(conn, design_table)
        await asyncio.sleep(idle)


@dataclass
class Connections:
    writers: list[Any]
    readers: list[Any]
    sealer: Any


async def round_of(
    connections: Connections,
    design: str,
    tasks: int,
    seconds: float,
    ledger: Ledger,
    args: argparse.Namespace,
) -> float:
    """Units per second of ``design`` at ``tasks`` connections for ``seconds``."""
    texts = {commit: unit_sql(design, commit) for commit in (True, False)}
    count = 0
    stop_at = time.perf_counter() + seconds

    async def writer(conn: Any) -> None:
        nonlocal count
        while time.perf_counter() < stop_at:
            keys = tuple(sorted(random.sample(range(1, ACCOUNTS + 1), 2)))
            nonce = os.urandom(10).hex()
            uow_id = "u" + nonce
            commit = random.random() >= args.rollbacks
            await run_text(conn, texts[commit], unit_parameters(design, keys, uow_id, nonce))
            if commit:
                ledger.committed[uow_id] = time.perf_counter()
            else:
                ledger.rolled_back.add(uow_id)
            count += 1

    stop = asyncio.Event()
    background: list[asyncio.Task[None]] = []
    if design != "no-outbox":
        for index, conn in enumerate(connections.readers):
            reader = Reader(conn, design, ledger, index, args.idle_ms / 1000)
            background.append(asyncio.create_task(reader.run(stop)))
        if design == "sealer":
            background.append(
                asyncio.create_task(
                    sealer(connections.sealer, table(design), stop, args.idle_ms / 1000)
                )
            )
    started = time.perf_counter()
    await asyncio.gather(*(writer(conn) for conn in connections.writers[:tasks]))
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*background)
    return count / elapsed


async def catch_up(connections: Connections, design: str, ledger: Ledger) -> None:
    """With the writers stopped: seal what is left, and let every reader
    read to the end."""
    if design == "sealer":
        while await seal(connections.sealer, table(design)):
            pass
    for index, conn in enumerate(connections.readers):
        reader = Reader(conn, design, ledger, index, 0)
        while await reader.poll():
            pass


def latency(ledger: Ledger, deliveries: list[tuple[Any, str, float]]) -> list[float]:
    """Milliseconds from each committed unit's COMMIT reply to its delivery."""
    return [
        (at - ledger.committed[uow_id]) * 1000
        for _, uow_id, at in deliveries
        if uow_id in ledger.committed
    ]


def summary(waits: list[float]) -> dict[str, float | None]:
    if not waits:
        return {"median_ms": None, "p95_ms": None}
    return {
        "median_ms": round(statistics.median(waits), 2),
        "p95_ms": round(common.percentile(waits, 95), 2),
    }


async def verify(conn: Any, design: str, ledger: Ledger) -> dict[str, Any]:
    """The final table against the writers' and the readers' records."""
    t = table(design)
    key = "versionstamp" if design in STAMPED else "id"
    rows = (await run_text(conn, f"SELECT {key}, uow_id, payload FROM {t} ORDER BY {key}"))[0]
    final = [uow_id for _, uow_id, _ in rows]
    problems: list[str] = []
    if len(set(final)) != len(final):
        problems.append("a unit has two entries")
    if set(final) != set(ledger.committed):
        problems.append(
            f"{len(set(ledger.committed) - set(final))} committed units without an entry, "
            f"{len(set(final) & ledger.rolled_back)} rolled-back units with one"
        )
    if design in VERSIONED:
        if any(stamp is None for stamp, _, _ in rows):
            problems.append("unsealed entries left")
        else:
            versions = [int(stamp[:20], 16) for stamp, _, _ in rows]
            if versions != list(range(1, len(versions) + 1)):
                problems.append("versions have a gap or a duplicate")
    if design in STAMPED and any(
        stamp is None or stamp[:20] + "0002" not in payload for stamp, _, payload in rows
    ):
        problems.append("a payload does not carry its entry's version")
    readers = []
    for delivered in ledger.delivered:
        got = [uow_id for _, uow_id, _ in delivered]
        missing = len(set(final) - set(got))
        readers.append(
            {
                "delivered": len(got),
                "skipped": missing,
                "in_final_order": got == final,
            }
        )
        if got != final:
            problems.append(f"a reader skipped {missing} entries or read them out of order")
    return {"entries": len(final), "readers": readers, "problems": problems, "sound": not problems}


def skips(ledger: Ledger, rows: list[tuple[Any, str]]) -> list[dict[str, Any]]:
    """Each entry a reader never delivered: the page that passed it, and
    how long after that page its writer had COMMIT's reply."""
    found = []
    for index, delivered in enumerate(ledger.delivered):
        got = {uow_id for _, uow_id, _ in delivered}
        for key, uow_id in rows:
            if uow_id in got:
                continue
            page = next(
                (p for p in ledger.pages[index] if p[1] < key and p[2] and p[2][-1] > key),
                None,
            )
            committed = ledger.committed.get(uow_id)
            found.append(
                {
                    "reader": index,
                    "missed": key,
                    "page_cursor": None if page is None else page[1],
                    "page_read": None if page is None else page[2],
                    "commit_reply_after_page_ms": None
                    if page is None or committed is None
                    else round((committed - page[0]) * 1000, 2),
                }
            )
    return found


async def soak(connections: Connections, design: str, args: argparse.Namespace) -> dict[str, Any]:
    """One long round of ``design`` at the top concurrency, its readers
    polling every 2 ms: how many entries each reader passed over."""
    ledger = Ledger.for_readers(design, len(connections.readers))
    soak_args = argparse.Namespace(**{**vars(args), "idle_ms": 2.0})
    top = len(connections.writers)
    rate = await round_of(connections, design, top, args.soak, ledger, soak_args)
    await catch_up(connections, design, ledger)
    report = await verify(connections.writers[0], design, ledger)
    key = "versionstamp" if design in STAMPED else "id"
    rows = (await run_text(connections.writers[0], f"SELECT {key}, uow_id FROM {table(design)}"))[0]
    return {
        "seconds": args.soak,
        "units_per_s": round(rate),
        "entries": report["entries"],
        "deliveries": sum(r["delivered"] for r in report["readers"]),
        "skipped": sum(r["skipped"] for r in report["readers"]),
        "problems": report["problems"],
        "skips": skips(ledger, sorted(rows)),
    }


async def connect(args: argparse.Namespace, count: int) -> list[Any]:
    import asyncmy

    options = common.asyncmy_options(args.url)
    return [await asyncmy.connect(**options) for _ in range(count)]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    top = max(args.concurrency)
    writers = await connect(args, top)
    readers = await connect(args, args.readers)
    (sealer_conn,) = await connect(args, 1)
    connections = Connections(writers, readers, sealer_conn)
    async with af.connect(args.url, pool_size=1) as admin:
        server = await common.server_info(admin)
    try:
        # READ COMMITTED: each statement reads what has committed by then;
        # the sealer's update skips (does not wait for) uncommitted entries.
        for conn in [*readers, sealer_conn]:
            await run_text(conn, "SET SESSION tx_isolation = 'READ-COMMITTED'")
        for statement in setup_statements():
            await run_text(writers[0], statement)
        designs = ("no-outbox", *(d for d in args.designs if d != "no-outbox"))
        ledgers = {d: Ledger.for_readers(d, len(readers)) for d in designs}
        rates: dict[tuple[int, str], list[float]] = {
            (c, d): [] for c in args.concurrency for d in designs
        }
        waits: dict[tuple[int, str], list[float]] = {key: [] for key in rates}
        for n in range(args.rounds):
            for c in args.concurrency:
                for d in designs if n % 2 == 0 else designs[::-1]:
                    ledger = ledgers[d]
                    before = len(ledger.delivered[0])
                    rates[(c, d)].append(
                        await round_of(connections, d, c, args.seconds, ledger, args)
                    )
                    if d != "no-outbox":
                        await catch_up(connections, d, ledger)
                        waits[(c, d)] += latency(ledger, ledger.delivered[0][before:])
        results: dict[str, Any] = {}
        for c in args.concurrency if args.rounds else ():
            base = rates[(c, "no-outbox")]
            per_design: dict[str, Any] = {}
            for d in designs:
                values = rates[(c, d)]
                ratios = [v / b for v, b in zip(values, base, strict=True)]
                per_design[d] = {
                    "units_per_s_rounds": [round(v) for v in values],
                    "units_per_s_median": round(statistics.median(values)),
                    "ratio_to_no_outbox_rounds": [round(r, 3) for r in ratios],
                    "ratio_to_no_outbox_median": round(statistics.median(ratios), 3),
                    "ratio_to_no_outbox_range": [round(min(ratios), 3), round(max(ratios), 3)],
                }
                if d != "no-outbox":
                    per_design[d]["visibility"] = summary(waits[(c, d)])
            results[f"c{c}"] = per_design
        soundness = {d: await verify(writers[0], d, ledgers[d]) for d in designs[1:] if args.rounds}
        soaks = {}
        if args.soak:
            for d in args.soak_designs:
                for statement in setup_statements():
                    await run_text(writers[0], statement)
                soaks[d] = await soak(connections, d, args)
        return {"rates": results, "soundness": soundness, "soak": soaks, "server": server}
    finally:
        for conn in [*writers, *readers, sealer_conn]:
            conn.close()


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_mariadb_designs")
    parser.add_argument("--url", default=common.DEFAULT_URLS["mysql"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--designs", nargs="+", choices=DESIGNS, default=list(DESIGNS))
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--rollbacks", type=float, default=0.06)
    parser.add_argument("--idle-ms", type=float, default=10.0)
    parser.add_argument(
        "--soak", type=float, default=0.0, help="seconds of the soundness soak per design"
    )
    parser.add_argument(
        "--soak-designs", nargs="+", default=["counter", "counter-locked", "gate", "sealer"]
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    await common.ensure_database(args.url)
    result = await measure(args)
    for c, per_design in result["rates"].items():
        print(f"\nconcurrency {c[1:]}")
        common.print_table(
            ["design", "units/s", "/ no-outbox (median)", "range", "visible after ms (p50 / p95)"],
            [
                [
                    d,
                    v["units_per_s_median"],
                    v["ratio_to_no_outbox_median"],
                    "{:.2f}-{:.2f}".format(*v["ratio_to_no_outbox_range"]),
                    ""
                    if "visibility" not in v
                    else f"{v['visibility']['median_ms']} / {v['visibility']['p95_ms']}",
                ]
                for d, v in per_design.items()
            ],
        )
    for d, report in result["soundness"].items():
        verdict = "sound" if report["sound"] else "; ".join(report["problems"])
        print(f"{d}: {report['entries']} entries, {verdict}")
    for d, report in result["soak"].items():
        print(
            f"soak {d}: {report['deliveries']} deliveries by {args.readers} readers, "
            f"{report['skipped']} entries passed over"
        )
    common.write_json(
        args.json or common.default_json_path("outbox_mariadb_designs"),
        {
            "benchmark": "outbox_mariadb_designs",
            "config": {
                k: getattr(args, k)
                for k in (
                    "designs",
                    "concurrency",
                    "rounds",
                    "seconds",
                    "readers",
                    "rollbacks",
                    "idle_ms",
                    "soak",
                    "soak_designs",
                )
            },
            "machine": common.machine_info({"mysql": result.pop("server")}),
            "results": result,
        },
    )


if __name__ == "__main__":
    asyncio.run(main())
