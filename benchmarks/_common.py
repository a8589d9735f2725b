"""Shared pieces of the benchmarks: where each database is, the transfer
workload's schema, data and unit of work, the retry policy every variant uses,
statistics, machine information and JSON output.

Each server backend runs in its own database (``aiofragno_bench``, created on
first use) so that resetting tables and truncating the outbox between runs
never touches what the test suite keeps in ``test``. SQLite runs in a
temporary file. Override with ``AIOFRAGNO_BENCH_POSTGRES_URL`` /
``AIOFRAGNO_BENCH_MYSQL_URL``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.demo import SHOP
from aiofragno.outbox import ticks
from aiofragno.url import DatabaseURL, parse_url

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = ("sqlite", "postgresql", "mysql")
BENCH_DATABASE = "aiofragno_bench"
DEFAULT_URLS = {
    "postgresql": os.environ.get(
        "AIOFRAGNO_BENCH_POSTGRES_URL", f"postgresql://postgres@127.0.0.1:5432/{BENCH_DATABASE}"
    ),
    "mysql": os.environ.get(
        "AIOFRAGNO_BENCH_MYSQL_URL", f"mysql://root@127.0.0.1:3306/{BENCH_DATABASE}"
    ),
}
# The demo's schema: accounts(owner unique, balance) and transfers(src, dst, amount).
SCHEMA = SHOP
ACCOUNTS = 1_000
OUTBOX_TABLE = af.Identifier("fragno_db_outbox")
VERSIONS_TABLE = af.Identifier("fragno_db_outbox_versions")
OPENING_BALANCE = 1_000
# Connections per pool, for every variant (aiofragno's default pool_size).
POOL_SIZE = 10
# SQLite: the busy_timeout aiofragno sets (Options.busy_timeout), in seconds.
SQLITE_BUSY_TIMEOUT = 5.0


def owner(i: int) -> str:
    return f"user{i:04}"


# -- where the databases are ---------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One database to benchmark: its dialect and aiofragno URL."""

    dialect: str  # "sqlite" | "postgresql" | "mysql"
    url: str

    @property
    def parsed(self) -> DatabaseURL:
        return parse_url(self.url)

    @property
    def sqlite_path(self) -> str:
        return self.parsed.database


async def ensure_database(url: str) -> None:
    """Create ``url``'s database on its server if it does not exist yet."""
    parsed = parse_url(url)
    name = parsed.database
    if parsed.dialect == "postgresql":
        server = url.rsplit("/", 1)[0] + "/postgres"
        async with af.connect(server, pool_size=1) as db:
            exists = await db.fetch_value(
                af.sql("SELECT 1 FROM pg_database WHERE datname = {n}", n=name)
            )
            if not exists:
                await db.execute(af.sql("CREATE DATABASE {n}", n=af.Identifier(name)))
    elif parsed.dialect == "mysql":
        server = url.rsplit("/", 1)[0] + "/"
        async with af.connect(server, pool_size=1) as db:
            exists = await db.fetch_value(
                af.sql("SELECT 1 FROM information_schema.schemata WHERE schema_name = {n}", n=name)
            )
            if not exists:
                await db.execute(af.sql("CREATE DATABASE {n}", n=af.Identifier(name)))


def asyncmy_options(url: str) -> dict[str, Any]:
    """Keyword arguments for asyncmy's connect / create_pool to ``url``, in
    autocommit mode (the raw variants send their own BEGIN)."""
    parsed = parse_url(url)
    return {
        "host": parsed.host,
        "port": parsed.port or 3306,
        "user": parsed.username,
        "password": parsed.password or "",
        "db": parsed.database,
        "autocommit": True,
    }


async def asyncpg_pool(target: Target, size: int = POOL_SIZE) -> Any:
    """An asyncpg pool on ``target`` of ``size`` connections, opened now,
    that sends nothing on release (its default reset query would be one more
    round trip per checkout, which aiofragno does not make either)."""
    import asyncpg

    url = target.parsed

    async def no_reset(conn: Any) -> None:
        pass

    return await asyncpg.create_pool(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        database=url.database,
        min_size=size,
        max_size=size,
        reset=no_reset,
    )


async def asyncmy_pool(target: Target, size: int = POOL_SIZE, **options: Any) -> Any:
    """An asyncmy pool on ``target`` of ``size`` connections (utf8mb4,
    autocommit), opened now."""
    import asyncmy

    return await asyncmy.create_pool(
        **asyncmy_options(target.url), charset="utf8mb4", minsize=size, maxsize=size, **options
    )


@contextlib.asynccontextmanager
async def target(dialect: str, tmpdir: Path) -> AsyncIterator[Target | None]:
    """The Target for ``dialect`` (None, with a message, when its server is down)."""
    if dialect == "sqlite":
        path = tmpdir / "bench.db"
        yield Target("sqlite", f"sqlite:///{path}")
        return
    url = DEFAULT_URLS[dialect]
    try:
        await ensure_database(url)
    except af.Error as exc:
        print(f"skipping {dialect}: {exc}", file=sys.stderr)
        yield None
        return
    yield Target(dialect, url)


# -- the workload --------------------------------------------------------------


@dataclass(frozen=True)
class Names:
    """The physical tables aiofragno migrated, for the hand-written variants."""

    accounts: tuple[str, ...]  # Identifier parts: (schema, table) or (table,)
    transfers: tuple[str, ...]
    quote: Callable[[str], str]

    def qualified(self, parts: tuple[str, ...]) -> str:
        return ".".join(self.quote(p) for p in parts)


def names(db: af.Database) -> Names:
    layout = db.layout(SCHEMA)
    return Names(
        layout.table("accounts").identifier.parts,
        layout.table("transfers").identifier.parts,
        db._engine.compiler.quote_identifier,
    )


async def prepare(db: af.Database) -> None:
    """Migrate the schema and open ``ACCOUNTS`` accounts (once)."""
    await db.migrate(SCHEMA)

    async def count(uow: af.UnitOfWork) -> int:
        n = uow.count("accounts")
        await uow.retrieve()
        result: int = n.result
        return result

    if await db.execute_uow(count, schema=SCHEMA) == ACCOUNTS:
        return
    n = names(db)
    await db.execute(af.sql("DELETE FROM {t}", t=af.Identifier(*n.transfers)))
    await db.execute(af.sql("DELETE FROM {t}", t=af.Identifier(*n.accounts)))

    async def open_accounts(uow: af.UnitOfWork) -> None:
        for i in range(ACCOUNTS):
            uow.create("accounts", {"owner": owner(i), "balance": OPENING_BALANCE})

    await db.execute_uow(open_accounts, schema=SCHEMA)


async def reset(db: af.Database, *, outbox: bool = True) -> None:
    """Balances and versions back to the start; transfers (and outbox) emptied."""
    n = names(db)
    accounts, transfers = af.Identifier(*n.accounts), af.Identifier(*n.transfers)
    await db.execute(
        af.sql(
            "UPDATE {t} SET {b} = {v}, {ver} = 0",
            t=accounts,
            b=af.Identifier("balance"),
            ver=af.Identifier("_version"),
            v=OPENING_BALANCE,
        )
    )
    ticked = [VERSIONS_TABLE] if outbox and db.name == "postgresql" else []
    emptied = [transfers, *([OUTBOX_TABLE] if outbox else []), *ticked]
    for table in emptied:
        verb = "DELETE FROM" if db.name == "sqlite" else "TRUNCATE TABLE"
        await db.execute(af.sql(f"{verb} {{t}}", t=table))
    if db.name == "postgresql":
        for table in (accounts, *emptied):
            await db.execute(af.sql("VACUUM ANALYZE {t}", t=table))
    elif db.name == "sqlite":
        await db.execute(db._engine.raw("PRAGMA wal_checkpoint(TRUNCATE)"))


async def verify(db: af.Database, transfers: int, *, outbox: bool = False) -> None:
    """Money is conserved and every unit inserted exactly one transfer row
    (and, with ``outbox``, one outbox entry, their versions without a gap)."""
    n = names(db)
    total = await db.fetch_value(
        af.sql("SELECT SUM({b}) FROM {t}", b=af.Identifier("balance"), t=af.Identifier(*n.accounts))
    )
    count = af.sql("SELECT COUNT(*) FROM {t}", t=af.Identifier(*n.transfers))
    rows = await db.fetch_value(count, int)
    # (SUM is a Decimal on PostgreSQL and MySQL, an int on SQLite: equal either way.)
    if total != ACCOUNTS * OPENING_BALANCE or rows != transfers:
        raise AssertionError(
            f"workload broken: balance sum {total} (want {ACCOUNTS * OPENING_BALANCE}), "
            f"{rows} transfer rows (want {transfers})"
        )
    if outbox:
        # (Under ticks, entries are versioned by a tick after they commit.)
        await ticks.tick(db._engine, wait=True)
        versionstamp = af.Identifier("versionstamp")
        stamps = await db.fetch(
            af.Fragment.join(
                [
                    af.sql("SELECT {v} FROM {t}", v=versionstamp, t=source)
                    for source in ticks.sources(db._engine)
                ],
                " UNION ALL ",
            )
        )
        versions = sorted(int(row["versionstamp"][:20], 16) for row in stamps)
        if len(versions) != transfers or versions != list(range(versions[0], versions[-1] + 1)):
            raise AssertionError(
                f"outbox broken: {len(versions)} entries (want {transfers}), versions "
                f"{versions[:1]}..{versions[-1:]} not one gap-free run"
            )


def plan(units: int, seed: int) -> list[tuple[int, int, int]]:
    """``units`` transfers (lo, hi, amount): two distinct accounts, lo < hi, and
    a non-zero amount moved from lo to hi (negative: the other way). Every
    variant updates lo first, so writers lock rows in one order and never
    deadlock (a deadlock costs PostgreSQL its 1 s deadlock_timeout)."""
    rng = random.Random(seed)
    out = []
    for _ in range(units):
        lo, hi = sorted(rng.sample(range(ACCOUNTS), 2))
        amount = rng.randint(1, 50) * rng.choice((-1, 1))
        out.append((lo, hi, amount))
    return out


def transfer_unit(
    lo: int, hi: int, amount: int, rows: Mapping[int, Mapping[str, Any]] | None = None
) -> Callable[[af.UnitOfWork], Awaitable[None]]:
    """The transfer as an aiofragno unit of work. ``rows`` stands in for the
    reads' results in a dry run (where reads return None)."""

    async def fn(uow: af.UnitOfWork) -> None:
        a = uow.find_first("accounts", where={"owner": owner(lo)})
        b = uow.find_first("accounts", where={"owner": owner(hi)})
        await uow.retrieve()
        ra = a.result if rows is None else rows[lo]
        rb = b.result if rows is None else rows[hi]
        if ra is None or rb is None:
            raise LookupError("an account of the transfer does not exist")
        uow.update("accounts", ra["id"], {"balance": ra["balance"] - amount}, check=True)
        uow.update("accounts", rb["id"], {"balance": rb["balance"] + amount}, check=True)
        uow.create("transfers", {"src": ra["id"], "dst": rb["id"], "amount": amount})

    return fn


class Backoff:
    """The retry policy of every variant (aiofragno's ``ExponentialBackoff``
    formula: equal jitter, doubling), counting the conflicts it is asked about."""

    def __init__(self, max_retries: int = 100, initial: float = 0.002, maximum: float = 0.05):
        self.max_retries, self.initial, self.maximum = max_retries, initial, maximum
        self.conflicts = 0

    def delay(self, attempt: int) -> float | None:
        self.conflicts += 1
        if attempt > self.max_retries:
            return None
        wait = min(self.maximum, self.initial * 2.0 ** (attempt - 1))
        return wait / 2 + random.random() * wait / 2


# -- statistics and output -----------------------------------------------------


async def interleaved(
    runs: Mapping[str, Callable[[], Awaitable[float]]], rounds: int
) -> dict[str, list[float]]:
    """Each run's result (a rate) per round: the runs in turn, every other
    round in reverse order, so that machine noise hits all alike and no run
    always follows the same other."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs.items())
    for i in range(rounds):
        for name, run in order if i % 2 == 0 else reversed(order):
            rates[name].append(await run())
    return rates


def round_ratios(rates: Mapping[str, Sequence[float]], a: str, b: str) -> dict[str, float]:
    """Rate ``a`` over rate ``b`` in the same round: median, min and max over rounds."""
    ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def ratio_cell(r: Mapping[str, float]) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    )
    for row in cells:
        print(
            "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.2f}"
    return str(value)


def default_json_path(name: str) -> Path:
    return RESULTS / f"{name}-{dt.date.today().isoformat()}.json"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


async def server_info(db: af.Database) -> dict[str, Any]:
    """The server's version and the settings that decide commit cost."""
    if db.name == "postgresql":
        settings = (
            "server_version",
            "synchronous_commit",
            "fsync",
            "shared_buffers",
            "wal_sync_method",
        )
        return {s: await db.fetch_value(db._engine.raw(f"SHOW {s}")) for s in settings}
    if db.name == "mysql":
        row = await db.fetch_one(
            db._engine.raw(
                "SELECT VERSION() AS version, @@innodb_flush_log_at_trx_commit AS "
                "innodb_flush_log_at_trx_commit, @@log_bin AS log_bin, @@sync_binlog AS "
                "sync_binlog, @@innodb_buffer_pool_size AS innodb_buffer_pool_size, "
                "@@tx_isolation AS tx_isolation"
            )
        )
        return dict(row) if row is not None else {}
    return {
        "sqlite_version": sqlite3.sqlite_version,
        "journal_mode": await db.fetch_value(db._engine.raw("PRAGMA journal_mode")),
        "synchronous": await db.fetch_value(db._engine.raw("PRAGMA synchronous")),
    }


def _git() -> dict[str, Any]:
    """The library's commit, and what differs from it in the work tree."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout

    try:
        diff = git("diff", "HEAD", "--", "aiofragno")
        return {
            "commit": git("rev-parse", "HEAD").strip(),
            "modified": git("status", "--porcelain", "--", "aiofragno").splitlines(),
            "diff_sha1": hashlib.sha1(diff.encode()).hexdigest() if diff else None,
        }
    except (OSError, subprocess.CalledProcessError):
        return {}


def machine_info(servers: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "aiofragno_git": _git(),
        "load_average": os.getloadavg(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "packages": {
            p: _version(p)
            for p in (
                "aiofragno",
                "asyncpg",
                "aiosqlite",
                "asyncmy",
                "sqlalchemy",
                "anyio",
                "greenlet",
            )
        },
        "servers": dict(servers),
    }
