"""Outbox readers woken by commits (PostgreSQL LISTEN/NOTIFY), under both
runtimes: a tail and a consumer with a 30 s poll interval get a new entry
at once; the listening connection killed on the server is replaced and
nothing committed meanwhile is missed; the wake-up statement for other
writers. Elsewhere readers poll (the outbox tests cover that).

Each test gets a new database: notifications are per database, and the
listener is found in ``pg_stat_activity`` by its database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox.push import wake_statement
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target

pytestmark = pytest.mark.anyio

SHOP = af.Schema("shop", af.Table("accounts", af.Column("owner", "string")))
LONG_POLL = 30.0
# Far below LONG_POLL, far above a notification's delivery.
PROMPT = 10.0


@pytest.fixture
async def odb(
    target: Target, tmp_path: Path, private_databases: PrivateDatabases
) -> AsyncIterator[af.Database]:
    require_target(target)
    if target.dialect != "postgresql":
        pytest.skip("only PostgreSQL notifies readers; elsewhere they poll")
    url = await private_databases.fresh_url(target, target.url(tmp_path), tmp_path)
    async with af.connect(url, backend=target.backend, outbox=True, pool_size=4) as database:
        await database.migrate(SHOP)
        yield database


async def create(db: af.Database, owner: str) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": owner})

    await db.execute_uow(unit, schema=SHOP)


async def listeners(db: af.Database) -> list[int]:
    rows = await db.fetch(
        af.sql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %' AND pid <> pg_backend_pid()"
        )
    )
    return [row["pid"] for row in rows]


async def until_listening(db: af.Database, besides: list[int] = []) -> list[int]:  # noqa: B006
    with anyio.fail_after(PROMPT):
        while not (pids := [p for p in await listeners(db) if p not in besides]):  # noqa: ASYNC110 (polls the server)
            await anyio.sleep(0.02)
    return pids


class Tail:
    """``db.outbox.tail`` with a long poll interval, in a task, collecting owners."""

    def __init__(self, db: af.Database) -> None:
        self.db = db
        self.owners: list[str] = []
        self.arrived = anyio.Event()

    async def run(self, after: str | None) -> None:
        async for entry in self.db.outbox.tail(after=after, poll_interval=LONG_POLL):
            self.owners.append(entry.mutations[0]["values"]["owner"])
            self.arrived.set()
            self.arrived = anyio.Event()

    async def until(self, count: int) -> None:
        with anyio.fail_after(PROMPT):
            while len(self.owners) < count:
                await self.arrived.wait()


async def test_a_tail_is_woken_by_a_commit(odb: af.Database) -> None:
    tail = Tail(odb)
    async with anyio.create_task_group() as tg:
        tg.start_soon(tail.run, None)
        await until_listening(odb)
        for n in range(3):
            await create(odb, f"o{n}")
            await tail.until(n + 1)
        tg.cancel_scope.cancel()
    assert tail.owners == ["o0", "o1", "o2"]
    # The listening connection closes with the tail.
    with anyio.fail_after(PROMPT):
        while await listeners(odb):  # noqa: ASYNC110 (polls the server)
            await anyio.sleep(0.02)


async def test_a_killed_listener_is_replaced_and_nothing_is_missed(odb: af.Database) -> None:
    tail = Tail(odb)
    async with anyio.create_task_group() as tg:
        tg.start_soon(tail.run, None)
        [first] = await until_listening(odb)
        await create(odb, "before")
        await tail.until(1)
        await odb.fetch(af.sql("SELECT pg_terminate_backend({pid})", pid=first))
        # Committed while nobody listens: found by the read after listening again.
        await create(odb, "while down 1")
        await create(odb, "while down 2")
        await tail.until(3)
        await until_listening(odb, besides=[first])
        await create(odb, "after")
        await tail.until(4)
        tg.cancel_scope.cancel()
    assert tail.owners == ["before", "while down 1", "while down 2", "after"]


async def test_a_consumer_is_woken_by_a_commit(odb: af.Database) -> None:
    consumer = odb.outbox.consumer("woken")
    owners: list[str] = []
    handled = anyio.Event()

    async def handle(entry: af.OutboxEntry) -> None:
        owners.append(entry.mutations[0]["values"]["owner"])
        handled.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: consumer.run(handle, poll_interval=LONG_POLL, stop=handled))
        await until_listening(odb)
        await create(odb, "paid")
        with anyio.fail_after(PROMPT):
            await handled.wait()
    # (The run returned by itself, its cursor moved past the entry.)
    assert owners == ["paid"]
    assert await consumer.lag() == 0


async def test_the_wake_statement_wakes_readers_at_commit(odb: af.Database) -> None:
    """For writers other than the entry's insert: the statement notifies
    the listeners, once its transaction commits (and not if it rolls back)."""
    statement = wake_statement(odb._engine.adapter)
    assert statement is not None
    woken = anyio.Event()
    listener = await odb._engine.open_listener("fragno_db_outbox", woken.set)
    assert listener is not None
    try:
        with pytest.raises(RuntimeError):
            async with odb.transaction() as tx:
                await tx.execute(odb._engine.raw(statement.sql))
                raise RuntimeError("roll back")
        with anyio.move_on_after(0.3):
            await woken.wait()
        assert not woken.is_set()
        async with odb.transaction() as tx:
            await tx.execute(odb._engine.raw(statement.sql))
        with anyio.fail_after(PROMPT):
            await woken.wait()
    finally:
        await odb._engine.close_listener(listener)


async def test_a_wake_statement_on_postgresql_only(db: af.Database, target: Target) -> None:
    statement = wake_statement(db._engine.adapter)
    assert (statement is not None) == (target.dialect == "postgresql")
