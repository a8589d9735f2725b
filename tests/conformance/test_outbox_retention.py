"""Outbox retention and opt-outs on every backend and runtime: prune keeps
what consumers have not passed and the window, deletes a prefix whose
horizon makes older cursors fail loudly (list, tail, consumers), never
holds writers up (a writer commits while a batch's transaction is open),
and stays right under concurrent writers and a consumer; tables and units
that opt out of the outbox.

Pruning deletes entries of the whole database, so every test gets a new,
empty database (a new file on SQLite).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import aiofragno as af
from aiofragno.outbox.retention import delete_in
from aiofragno.outbox.tables import CONSUMERS, UNIT_KEYS
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target

pytestmark = pytest.mark.anyio

SHOP = af.Schema(
    "shop",
    af.Table("accounts", af.Column("owner", "string")),
    af.Table("audit", af.Column("note", "string"), outbox=False),
)


@pytest.fixture
async def odb(
    target: Target, tmp_path: Path, private_databases: PrivateDatabases
) -> AsyncIterator[af.Database]:
    """An outbox-enabled Database on a new, empty database, SHOP migrated."""
    require_target(target)
    url = await private_databases.fresh_url(target, target.url(tmp_path), tmp_path)
    async with af.connect(url, backend=target.backend, outbox=True, pool_size=8) as database:
        await database.migrate(SHOP)
        yield database


async def create(db: af.Database, owner: str, **options: object) -> af.UnitOfWork:
    """One unit creating one account; the unit (for its versionstamp)."""
    done: list[af.UnitOfWork] = []

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": owner})
        done.append(uow)

    await db.execute_uow(unit, schema=SHOP, **options)  # type: ignore[arg-type]
    return done[-1]


async def stamps(db: af.Database) -> list[str]:
    return [entry.versionstamp for entry in await db.outbox.list(limit=10_000)]


async def add_consumer(db: af.Database, cursor: str | None) -> af.Consumer:
    name = f"c-{uuid.uuid4().hex[:12]}"
    await db.execute(
        af.sql(
            "INSERT INTO {t} ({n}, {c}) VALUES ({name}, {cursor})",
            t=af.Identifier(CONSUMERS),
            n=af.Identifier("name"),
            c=af.Identifier("cursor"),
            name=name,
            cursor=cursor,
        )
    )
    return db.outbox.consumer(name)


async def test_prune_keeps_what_consumers_need_and_the_window(odb: af.Database) -> None:
    for n in range(30):
        await create(odb, f"o{n}")
    written = await stamps(odb)
    consumer = await add_consumer(odb, written[19])

    assert await odb.outbox.prune(keep_last=5, keep_for=0, batch_size=4) == 20
    assert await odb.outbox.horizon() == written[19]
    assert await stamps(odb) == written[20:]  # nothing past the consumer's cursor

    delivered: list[str] = []

    async def handle(entry: af.OutboxEntry) -> None:
        delivered.append(entry.versionstamp)

    assert await consumer.run(handle, until_caught_up=True) == 10
    assert delivered == written[20:]
    # The consumer is through: now the count window holds.
    assert await odb.outbox.prune(keep_last=5, keep_for=0, batch_size=4) == 5
    assert await stamps(odb) == written[25:]
    # The age window: every entry is younger than an hour.
    assert await odb.outbox.prune(keep_last=0, keep_for=3600) == 0
    # A consumer that has delivered nothing yet holds everything back.
    await add_consumer(odb, None)
    assert await odb.outbox.prune(keep_last=0, keep_for=0) == 0
    assert await stamps(odb) == written[25:]


async def test_cursors_older_than_the_horizon_are_refused(odb: af.Database) -> None:
    for n in range(6):
        await create(odb, f"o{n}")
    written = await stamps(odb)
    assert await odb.outbox.horizon() is None
    assert await odb.outbox.prune(keep_last=2, keep_for=0) == 4
    horizon = written[3]

    with pytest.raises(af.OutboxCursorPruned) as refused:
        await odb.outbox.list(after=written[2])
    assert (refused.value.cursor, refused.value.horizon) == (written[2], horizon)
    with pytest.raises(af.OutboxCursorPruned):
        await odb.outbox.list(after="0" * 24)
    with pytest.raises(af.OutboxCursorPruned):
        async for _ in odb.outbox.tail(after=written[0], poll_interval=0.01):
            pytest.fail("tail yielded an entry after a pruned cursor")
    # At or past the horizon, and from the start, reads go on.
    assert [e.versionstamp for e in await odb.outbox.list(after=horizon)] == written[4:]
    assert [e.versionstamp for e in await odb.outbox.list(after=written[4])] == written[5:]
    assert [e.versionstamp for e in await odb.outbox.list()] == written[4:]
    # A consumer whose cursor predates the horizon (say, restored from a backup).
    stale = await add_consumer(odb, written[1])
    with pytest.raises(af.OutboxCursorPruned):
        await stale.run(lambda entry: anyio.lowlevel.checkpoint(), until_caught_up=True)
    assert await stale.position() == written[1]


async def test_run_pruner_prunes_until_cancelled(odb: af.Database) -> None:
    for n in range(4):
        await create(odb, f"o{n}")
    written = await stamps(odb)
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: odb.outbox.run_pruner(every=0.01, keep_last=1, keep_for=0))
        with anyio.fail_after(10):
            while await odb.outbox.horizon() != written[2]:  # noqa: ASYNC110 (polls the database)
                await anyio.sleep(0.01)
        await create(odb, "later")
        with anyio.fail_after(10):
            while await odb.outbox.horizon() != written[3]:  # noqa: ASYNC110 (polls the database)
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert len(await stamps(odb)) == 1


async def test_prune_arguments_are_checked(odb: af.Database) -> None:
    for bad in (
        {"keep_last": -1},
        {"keep_last": True},
        {"keep_for": -1},
        {"keep_for": float("nan")},
        {"batch_size": 0},
    ):
        with pytest.raises(af.ValidationError):
            await odb.outbox.prune(**bad)  # type: ignore[arg-type]
    with pytest.raises(af.ValidationError):
        await odb.outbox.run_pruner(every=0)


async def test_a_writer_commits_while_a_prune_batch_is_open(
    odb: af.Database, target: Target
) -> None:
    if target.dialect == "sqlite":
        pytest.skip("SQLite has one writer: a unit waits for the batch's transaction to end")
    for n in range(5):
        await create(odb, f"o{n}")
    written = await stamps(odb)
    await odb.outbox.prune(keep_last=5)  # (creates the horizon row: nothing goes)
    async with odb.transaction(isolation="read committed") as tx:
        assert await delete_in(odb._engine, tx, written[2]) == 3
        with anyio.fail_after(10):  # (blocked, it would wait for the COMMIT below)
            await create(odb, "while pruning")
            await create(odb, "key while pruning", idempotency_key=f"k-{uuid.uuid4().hex}")
    now = await stamps(odb)
    assert now[:2] == [written[3], written[4]] and len(now) == 4 and now[2] > written[-1]
    assert await odb.outbox.horizon() == written[2]


async def test_prune_under_concurrent_writers_and_a_consumer(odb: af.Database) -> None:
    """Writers, a consumer and a pruner at once: the consumer receives every
    entry, in order, none twice (nothing it had not passed was deleted, and
    it never met the horizon); the count window holds at the end."""
    consumer = await add_consumer(odb, None)
    await create(odb, "first")
    received: list[str] = []
    writers_done = anyio.Event()
    keep_last = 7

    async def handle(entry: af.OutboxEntry) -> None:
        received.append(entry.versionstamp)

    async def write(worker: int) -> None:
        for n in range(25):
            await create(odb, f"w{worker}-{n}")

    pruned = 0

    async def prune_meanwhile() -> None:
        nonlocal pruned
        while not writers_done.is_set():
            pruned += await odb.outbox.prune(keep_last=keep_last, keep_for=0, batch_size=3)
            # The window held (entries are only ever added meanwhile).
            assert pruned == 0 or len(await stamps(odb)) >= keep_last
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(prune_meanwhile)
        tg.start_soon(
            lambda: consumer.run(handle, stop=lambda: writers_done.is_set(), poll_interval=0.01)
        )
        async with anyio.create_task_group() as writers:
            for worker in range(4):
                writers.start_soon(write, worker)
        writers_done.set()
    await consumer.run(handle, until_caught_up=True)
    pruned += await odb.outbox.prune(keep_last=keep_last, keep_for=0)

    versions = [int(stamp[:20], 16) for stamp in received]
    assert versions == list(range(1, 102))  # all 101, in order, none twice
    left = await stamps(odb)
    assert left == received[-keep_last:]
    assert await odb.outbox.horizon() == received[-keep_last - 1]
    assert pruned == len(received) - keep_last  # each deletion counted once


async def test_tables_and_units_out_of_the_outbox(odb: af.Database) -> None:
    before = await odb.outbox.latest()

    async def audit_only(uow: af.UnitOfWork) -> af.UnitOfWork:
        uow.create("audit", {"note": "seen"})
        return uow

    async def both(uow: af.UnitOfWork) -> af.UnitOfWork:
        uow.create("audit", {"note": "paid"})
        uow.create("accounts", {"owner": "ann"})
        return uow

    unit = await odb.execute_uow(audit_only, schema=SHOP)
    assert unit.versionstamp is None
    assert await odb.outbox.latest() == before
    unit = await odb.execute_uow(both, schema=SHOP)
    [entry] = await odb.outbox.list(after=before)
    # (Under ticks the versionstamp is given after COMMIT: the key names the entry.)
    assert entry.uow_id == unit.uow_id and unit.versionstamp in (None, entry.versionstamp)
    [mutation] = entry.mutations
    assert (mutation["table"], mutation["values"], mutation["versionstamp"]) == (
        "accounts",
        {"owner": "ann"},
        entry.versionstamp,
    )
    # Per unit, either way.
    skipped = await create(odb, "quiet", outbox=False)
    assert skipped.versionstamp is None
    assert await odb.outbox.latest() == entry.versionstamp


async def test_units_without_an_entry_keep_their_idempotency_key(odb: af.Database) -> None:
    async def audit_only(uow: af.UnitOfWork) -> None:
        uow.create("audit", {"note": "once"})

    key = f"k-{uuid.uuid4().hex}"
    await odb.execute_uow(audit_only, schema=SHOP, idempotency_key=key)
    with pytest.raises(af.AlreadyApplied):
        await odb.execute_uow(audit_only, schema=SHOP, idempotency_key=key)
    other = f"k-{uuid.uuid4().hex}"
    await create(odb, "quiet", outbox=False, idempotency_key=other)
    with pytest.raises(af.AlreadyApplied):
        await create(odb, "quiet", outbox=False, idempotency_key=other)
    keys = await odb.fetch(
        af.sql(
            "SELECT {k} FROM {t} WHERE {k} IN {keys}",
            k=af.Identifier("key"),
            t=af.Identifier(UNIT_KEYS),
            keys=[key, other],
        )
    )
    assert sorted(row["key"] for row in keys) == sorted([key, other])
    audit = odb.layout(SHOP).table("audit").identifier
    assert await odb.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=audit), int) == 1


async def test_prune_frees_the_keys_of_the_entries_it_deletes(odb: af.Database) -> None:
    """A keyed unit's key lives as long as its entry: the entries prune
    deletes take their keys' rows with them (a key can then be used again),
    the entries it keeps and keyed units without an entry keep theirs."""
    old, kept, quiet = (f"k-{uuid.uuid4().hex}" for _ in range(3))
    await create(odb, "old", idempotency_key=old)
    await create(odb, "quiet", idempotency_key=quiet, outbox=False)
    await create(odb, "kept", idempotency_key=kept)
    assert await odb.outbox.prune(keep_last=1, keep_for=0) == 1

    keys = await odb.fetch(
        af.sql("SELECT {k} FROM {t}", k=af.Identifier("key"), t=af.Identifier(UNIT_KEYS))
    )
    assert sorted(row["key"] for row in keys) == sorted([kept, quiet])
    await create(odb, "old again", idempotency_key=old)
    for key, outbox in ((kept, True), (quiet, False)):
        with pytest.raises(af.AlreadyApplied):
            await create(odb, "twice", idempotency_key=key, outbox=outbox)


async def test_a_unit_can_turn_the_outbox_on(target: Target, tmp_path: Path) -> None:
    require_target(target)
    if target.dialect != "sqlite":
        pytest.skip("the per-unit switch is the same code on every backend")
    async with af.connect(target.url(tmp_path), backend=target.backend) as db:
        await db.migrate(SHOP)
        assert (await create(db, "plain")).versionstamp is None
        unit = await create(db, "announced", outbox=True)
        [entry] = await db.outbox.list()
        assert entry.versionstamp == unit.versionstamp
        with pytest.raises(af.ValidationError):
            await create(db, "bad", outbox="yes")
