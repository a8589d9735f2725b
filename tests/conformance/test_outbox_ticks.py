"""The outbox's "ticks" strategy (PostgreSQL, both runtimes): what readers
see while writers commit, roll back, conflict and run long; ticking from
several readers; serializable units. The counter-and-ticks conformance of
the whole outbox is in test_outbox.py (parametrized by strategy)."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiofragno as af
from aiofragno.outbox import OutboxEntry
from aiofragno.outbox.tables import TICKS
from aiofragno.outbox.ticks import TICK_INTERVAL, tick
from aiofragno.outbox.versionstamp import version_of
from aiofragno.outbox.writer import entry_values
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target

pytestmark = pytest.mark.anyio

SCHEMA = af.Schema(
    "ticks",
    af.Table("events", af.Column("n", "bigint")),
    af.Table("hot", af.Column("label", "string"), af.Column("total", "bigint", default=0)),
)
HOT_ROWS = 4
# One unit in FAIL_EVERY fails at COMMIT (a deferred trigger), after its
# entry was inserted: about 6%.
FAIL_EVERY = 16
# Eight writers on four rows conflict a lot: retry until through.
PATIENT = af.ExponentialBackoff(max_retries=100)
LIMIT = 60  # seconds: a hang fails the test instead of blocking the suite


@pytest.fixture
async def url(target: Target, tmp_path: Path, private_databases: PrivateDatabases) -> str:
    require_target(target)
    if target.dialect != "postgresql":
        pytest.skip("the ticks strategy is PostgreSQL's")
    return await private_databases.url_for(target, target.url(tmp_path))


class Env:
    """SCHEMA migrated in a fresh namespace of the module's database, on a
    Database writing under ticks."""

    def __init__(self, db: af.Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace
        self.start: str | None = None

    async def run(self, fn: Any, **options: Any) -> Any:
        return await self.db.execute_uow(fn, schema=SCHEMA, namespace=self.namespace, **options)

    def table(self, name: str) -> af.Identifier:
        return self.db.layout(SCHEMA, self.namespace).table(name).identifier


@pytest.fixture
async def env(url: str, target: Target) -> AsyncIterator[Env]:
    async with af.connect(url, backend=target.backend, outbox="ticks", pool_size=12) as db:
        namespace = f"t{uuid.uuid4().hex[:8]}"
        made = Env(db, namespace)
        await db.migrate(SCHEMA, namespace=namespace)
        made.start = await db.outbox.latest()
        try:
            yield made
        finally:
            for name in ("events", "hot"):
                await db.execute(af.sql("DROP TABLE IF EXISTS {t} CASCADE", t=made.table(name)))


async def _fail_at_commit(env: Env) -> None:
    """Events whose n is a multiple of FAIL_EVERY fail their unit at COMMIT,
    after its outbox entry was written (a deferred constraint trigger)."""
    function = af.Identifier(f"{env.namespace}_fail")
    await env.db.execute(
        af.sql(
            "CREATE OR REPLACE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'rejected at commit' USING ERRCODE = 'check_violation'; END $$",
            f=function,
        )
    )
    await env.db.execute(
        af.sql(
            "CREATE CONSTRAINT TRIGGER reject AFTER INSERT ON {t} DEFERRABLE INITIALLY DEFERRED "
            f"FOR EACH ROW WHEN (NEW.n % {FAIL_EVERY} = 0) EXECUTE FUNCTION {{f}}()",
            t=env.table("events"),
            f=function,
        )
    )


def event(n: int) -> Any:
    """A unit creating event ``n``."""

    async def create(uow: af.UnitOfWork) -> None:
        uow.create("events", {"n": n})

    return create


class Reader:
    """Polls ``db.outbox.list`` from a cursor and checks every page against
    what it passed: nothing at or behind the cursor, consecutive versions."""

    def __init__(self, db: af.Database, start: str | None) -> None:
        self.db = db
        self.cursor = start
        self.seen: list[OutboxEntry] = []

    async def poll(self) -> int:
        page = await self.db.outbox.list(after=self.cursor, limit=50)
        expected = 1 if self.cursor is None else version_of(self.cursor) + 1
        versions = [version_of(e.versionstamp) for e in page]
        assert versions == list(range(expected, expected + len(page))), (
            f"after {self.cursor}: {versions[:5]}... is not the next run of versions"
        )
        if page:
            self.seen += page
            self.cursor = page[-1].versionstamp
        return len(page)


async def test_readers_see_a_gap_free_commit_ordered_run_under_load(
    env: Env, url: str, target: Target
) -> None:
    """Eight writers commit units that each create an event and update one
    of four hot rows (so they conflict, and retry), about 6% of them
    rejected at COMMIT after their entry was written, while two readers on
    Databases of their own poll (and tick). Every reader sees one run of
    consecutive versions, never an entry behind its cursor; at the end,
    exactly the committed units, once each, nothing of a rejected one; and
    the units updating one hot row in the order they committed (each saw
    the version the one before it wrote)."""
    await _fail_at_commit(env)

    async def seed(uow: af.UnitOfWork) -> list[af.RowId]:
        return [uow.create("hot", {"label": f"h{i}"}) for i in range(HOT_ROWS)]

    await env.run(seed)
    start = await env.db.outbox.latest()
    hot = await env.db.fetch(af.sql("SELECT id FROM {t} ORDER BY id", t=env.table("hot")))
    numbers = itertools.count(1)
    committed: set[str] = set()
    rejected: set[str] = set()
    units_per_writer = 20

    def unit(n: int) -> Any:
        async def transfer(uow: af.UnitOfWork) -> str:
            rows = uow.find("hot", {"label": f"h{n % HOT_ROWS}"})
            await uow.retrieve()
            [row] = rows.result
            uow.create("events", {"n": n})
            uow.update("hot", row["id"], {"total": row["total"] + 1}, check=True)
            return uow.uow_id

        return transfer

    async def writer() -> None:
        for _ in range(units_per_writer):
            n = next(numbers)
            key = f"{env.namespace}-{n}"
            try:
                await env.run(unit(n), idempotency_key=key, retry=PATIENT)
            except af.CheckViolation:
                rejected.add(key)
            else:
                committed.add(key)

    writing = True
    async with (
        af.connect(url, backend=target.backend, pool_size=2) as one,
        af.connect(url, backend=target.backend, pool_size=2) as other,
    ):
        readers = [Reader(one, start), Reader(other, start)]

        async def read(reader: Reader) -> None:
            while writing:
                await reader.poll()
            # Caught up: past the last tick that versions every commit.
            await tick(reader.db._engine, wait=True)
            while await reader.poll():
                pass

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                for reader in readers:
                    tg.start_soon(read, reader)
                async with anyio.create_task_group() as writers:
                    for _ in range(8):
                        writers.start_soon(writer)
                writing = False
    assert len(rejected) == units_per_writer * 8 // FAIL_EVERY
    for reader in readers:
        keys = [e.uow_id for e in reader.seen]
        assert len(keys) == len(set(keys)) == len(committed)
        assert set(keys) == committed
        assert [e.versionstamp for e in reader.seen] == [e.versionstamp for e in readers[0].seen]
    # Commit order on each hot row: the checked versions rise with the versionstamps.
    by_row: dict[str, list[int]] = {}
    for entry in readers[0].seen:
        update = entry.mutations[1]
        by_row.setdefault(update["external_id"], []).append(update["check_version"])
    assert len(by_row) == len(hot)
    for checked in by_row.values():
        assert checked == sorted(checked) and len(set(checked)) == len(checked)


async def test_a_long_transaction_does_not_hold_back_later_commits(
    env: Env, url: str, target: Target
) -> None:
    """An entry whose transaction stays open does not stall the ones that
    commit after it began: they are versioned and read meanwhile; it gets
    the next version once it commits — after the cursor, not behind it."""
    db = env.db
    engine = db._engine
    values = entry_values(
        engine.codec,
        uow_id=f"{env.namespace}-long",
        nonce="0" * 32,
        schema=SCHEMA.name,
        namespace=env.namespace,
        writes=[],
    )
    with anyio.fail_after(LIMIT):
        # (On a Database of its own: in this task, db's reads would join it.)
        async with (
            af.connect(url, backend=target.backend, pool_size=1) as elsewhere,
            elsewhere.transaction() as long,
        ):
            # The long transaction writes its entry first (the writer's statement).
            for query in engine.outbox_statements.queries(values):
                await long.session.execute(query)
            for n in range(3):
                await env.run(event(n))
            entries = await db.outbox.list(after=env.start)
            assert len(entries) == 3  # read while the long transaction is open
            cursor = entries[-1].versionstamp
        # (Its entry did not come through execute_uow: a reader ticks for
        # it once its last tick is TICK_INTERVAL old.)
        await anyio.sleep(TICK_INTERVAL)
        [last] = await db.outbox.list(after=cursor)
    assert last.uow_id == f"{env.namespace}-long"
    assert version_of(last.versionstamp) == version_of(cursor) + 1


async def test_ticks_from_two_readers_at_once(env: Env, url: str, target: Target) -> None:
    """While one reader holds the ticker's lock, another's tick is skipped
    (None), or waits for it with ``wait``. Two readers ticking in a loop
    while eight writers commit version every entry once, between them."""
    db = env.db
    for n in range(3):
        await env.run(event(n))
    ticks_sql = db._engine.adapter.sql.outbox_ticks
    assert ticks_sql is not None
    async with (
        af.connect(url, backend=target.backend, pool_size=1) as one,
        af.connect(url, backend=target.backend, pool_size=1) as other,
    ):
        waited: list[int | None] = []

        async def wait_for_it() -> None:
            waited.append(await tick(other._engine, wait=True))

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg, one.transaction() as holder:
                await holder.fetch(one._engine.raw(ticks_sql.lock))
                assert await tick(other._engine) is None  # the lock is taken: skipped
                tg.start_soon(wait_for_it)
                await anyio.sleep(0.2)
                assert waited == []  # waiting for the holder
        assert waited == [3]

        versioned: list[int] = []
        writing = True

        async def ticker(reader: af.Database) -> None:
            while writing:
                versioned.append(await tick(reader._engine) or 0)
                await anyio.lowlevel.checkpoint()

        async def writer(w: int) -> None:
            for n in range(10):
                await env.run(event(100 * w + n))

        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ticker, one)
                tg.start_soon(ticker, other)
                async with anyio.create_task_group() as writers:
                    for w in range(8):
                        writers.start_soon(writer, w)
                writing = False
        versioned.append(await tick(one._engine, wait=True) or 0)
    assert sum(versioned) == 80
    entries = await db.outbox.list(after=env.start, limit=1000)
    first = version_of(entries[0].versionstamp)
    assert [version_of(e.versionstamp) for e in entries] == list(range(first, first + 83))
    # Prune keeps the newest tick only (the one the next tick reads), and
    # what it numbered reads on unchanged.
    ticks = af.sql("SELECT COUNT(*) FROM {t}", t=af.Identifier(TICKS))
    assert await db.fetch_value(ticks, int) > 1
    await db.outbox.prune(keep_last=10_000)
    assert await db.fetch_value(ticks, int) == 1
    await env.run(event(999))
    after = await db.outbox.list(after=entries[-1].versionstamp)
    assert [version_of(e.versionstamp) for e in after] == [first + 83]


async def test_a_read_sees_its_units_while_a_tick_of_its_own_is_under_way(
    env: Env, url: str, target: Target
) -> None:
    """A unit committed through a Database is in that Database's next read
    even while another of its tasks is ticking: that tick may have begun
    after the unit committed and not finished yet, so the read waits for
    the lock and ticks rather than reading around it (it used to read
    without the unit: a tail reader, a relay or ``latest()`` running
    beside one another each missed the newest units now and then)."""
    db = env.db
    ticks_sql = db._engine.adapter.sql.outbox_ticks
    assert ticks_sql is not None
    waiting = af.sql(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    await env.run(event(1))
    read: list[OutboxEntry] = []

    async def reader() -> None:
        read.extend(await db.outbox.list(after=env.start))

    async with af.connect(url, backend=target.backend, pool_size=2) as other:
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg, other.transaction() as holder:
                await holder.fetch(other._engine.raw(ticks_sql.lock))
                # A tick of db's begins after the unit, and waits for the lock.
                tg.start_soon(lambda: tick(db._engine, wait=True))
                for _ in range(LIMIT * 100):
                    if await other.fetch_value(waiting, int):
                        break
                    await anyio.sleep(0.01)
                tg.start_soon(reader)
                await anyio.sleep(0.2)
                assert read == []  # waiting for the lock, not reading around it
    assert [entry.mutations[0]["values"] for entry in read] == [{"n": 1}]


async def test_serializable_units_do_not_conflict_over_the_outbox(env: Env) -> None:
    """Under ticks, serializable units on disjoint rows share nothing in
    the outbox (no counter row, no table lock): run at once, none fails
    with a serialization conflict, and each leaves its entry."""

    async def seed(uow: af.UnitOfWork) -> list[af.RowId]:
        return [uow.create("hot", {"label": f"s{i}"}) for i in range(8)]

    rows = await env.run(seed)
    start = await env.db.outbox.latest()
    conflicts: list[Exception] = []
    hooks = af.UowHooks(on_conflict=lambda uow, exc: conflicts.append(exc))

    async def bump(row: af.RowId) -> None:
        for total in range(1, 6):

            async def unit(uow: af.UnitOfWork, total: int = total) -> None:
                uow.update("hot", row, {"total": total})
                uow.create("events", {"n": total})

            await env.run(unit, isolation="serializable", hooks=hooks)

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(bump, row)
    assert conflicts == []
    entries = await env.db.outbox.list(after=start, limit=1000)
    assert len(entries) == 40


async def test_migrate_upgrades_an_outbox_from_before_ticks(
    target: Target, tmp_path: Path, private_databases: PrivateDatabases
) -> None:
    """An outbox table made before ticks (no ``xid``, ``versionstamp`` NOT
    NULL, no ticks tables) with a counter entry in it: migrate adds what
    ticks need; units then write under ticks, and their versions follow the
    counter's entry without a gap; the counter still writes on the new layout."""
    require_target(target)
    if target.dialect != "postgresql":
        pytest.skip("the ticks strategy is PostgreSQL's")
    url = await private_databases.create(target, target.url(tmp_path))
    async with af.connect(url, backend=target.backend, outbox="counter") as db:
        await db.migrate(SCHEMA)
        for statement in (
            "DROP TABLE fragno_db_outbox_ticks",
            "DROP TABLE fragno_db_outbox_versions",
            "ALTER TABLE fragno_db_outbox DROP COLUMN xid",
            "ALTER TABLE fragno_db_outbox ALTER COLUMN versionstamp SET NOT NULL",
        ):
            await db.execute(db._engine.raw(statement))
        await db.execute_uow(event(1), schema=SCHEMA)
        planned = await db.migrate(SCHEMA, dry_run=True)
        assert any("ADD COLUMN IF NOT EXISTS" in s for s in planned.statements)
        await db.migrate(SCHEMA)
        assert (await db.migrate(SCHEMA, dry_run=True)).statements == []
    async with af.connect(url, backend=target.backend, outbox=True) as db:
        assert db._engine.outbox_strategy == "ticks"
        await db.execute_uow(event(2), schema=SCHEMA)
        await db.execute_uow(event(3), schema=SCHEMA)
        # (Read once, which ticks, before the counter's writers start.)
        assert len(await db.outbox.list()) == 3
    async with af.connect(url, backend=target.backend, outbox="counter") as db:
        await db.execute_uow(event(4), schema=SCHEMA)
        entries = await db.outbox.list()
    assert [version_of(e.versionstamp) for e in entries] == [1, 2, 3, 4]
    assert [e.mutations[0]["values"]["n"] for e in entries] == [1, 2, 3, 4]


async def test_reading_inside_a_transaction_does_not_tick(url: str, target: Target) -> None:
    """A read in the caller's transaction does not tick (that would take a
    second connection, which a pool of one only frees when the transaction
    ends): it reads what has been ticked, and the next read outside ticks."""
    async with af.connect(url, backend=target.backend, outbox="ticks", pool_size=1) as db:
        await db.migrate(SCHEMA, namespace="inside")
        start = await db.outbox.latest()
        await db.execute_uow(event(1), schema=SCHEMA, namespace="inside")
        with anyio.fail_after(LIMIT):
            async with db.transaction():
                assert await db.outbox.list(after=start) == []
                assert await db.outbox.find("no-such-unit") is None
            [entry] = await db.outbox.list(after=start)
        assert entry.mutations[0]["values"] == {"n": 1}
