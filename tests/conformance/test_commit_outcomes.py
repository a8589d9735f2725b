"""A unit of work is applied once, or reported as ambiguous — never half, never
twice, never reported failed when it may have committed.

Each test forces one way a mutation phase can end badly — a client that is
gone while the server still runs its batch, a lost COMMIT whose look-up
cannot reach the server, a reused idempotency key, a write to a row that is
not there — on real servers, and checks what the database holds afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target

pytestmark = pytest.mark.anyio

SHOP = af.Schema(
    "shop",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Index("by_owner", ["owner"], unique=True),
    ),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Column("amount", "bigint"),
    ),
)


class Shop:
    """A migrated namespace of SHOP with two accounts, and a way to look."""

    def __init__(self, db: af.Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    def ident(self, table: str) -> af.Identifier:
        return self.db.layout(SHOP, self.namespace).table(table).identifier

    async def run(self, fn: Any, **options: Any) -> Any:
        return await self.db.execute_uow(fn, schema=SHOP, namespace=self.namespace, **options)

    async def balance(self, owner: str) -> int:
        query = af.sql("SELECT balance FROM {t} WHERE owner = {o}", t=self.ident("accounts"), o=owner)
        return int(await self.db.fetch_value(query))

    async def transfers(self) -> int:
        return int(await self.db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=self.ident("transfers"))))

    async def entries(self, uow_id: str) -> list[af.OutboxEntry]:
        return [e for e in await self.db.outbox.list(limit=10_000) if e.uow_id == uow_id]

    async def set_balance(self, owner: str, balance: int) -> None:
        """A concurrent writer's update, bumping the row's version."""

        async def write(uow: af.UnitOfWork) -> None:
            row = uow.find_first("accounts", where={"owner": owner})
            await uow.retrieve()
            uow.update("accounts", row.result["id"], {"balance": balance})

        await self.run(write)


@pytest.fixture
async def shop(db: af.Database, url: str, target: Target) -> AsyncIterator[Shop]:
    namespaces = Namespaces(db)
    namespace = namespaces.use(db, SHOP).namespace
    try:
        await db.migrate(SHOP, namespace=namespace)

        async def seed(uow: af.UnitOfWork) -> None:
            uow.create("accounts", {"owner": "alice", "balance": 100})
            uow.create("accounts", {"owner": "bob", "balance": 100})

        await db.execute_uow(seed, schema=SHOP, namespace=namespace)
        yield Shop(db, namespace)
    finally:
        await namespaces.drop()


@pytest.fixture
async def outbox_db(url: str, target: Target) -> AsyncIterator[af.Database]:
    async with af.connect(url, backend=target.backend, pool_size=4, outbox=True) as database:
        yield database


def debit(amount: int, *, stale_first: Shop | None = None) -> Any:
    """A unit taking ``amount`` from alice, checked, and recording a transfer.
    With ``stale_first``, another writer changes alice between this unit's
    read and its mutation phase, on the first attempt only."""
    attempts = 0

    async def unit(uow: af.UnitOfWork) -> int:
        nonlocal attempts
        attempts += 1
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        row = alice.result
        if stale_first is not None and attempts == 1:
            await stale_first.set_balance("alice", 50)
        uow.update("accounts", row["id"], {"balance": row["balance"] - amount}, check=True)
        uow.create("transfers", {"src": row["id"], "amount": amount})
        return attempts

    return unit


# -- 1. a batch the server runs after its client has gone ---------------------


class Fault:
    """A fault that fires once, on the next chance after it is armed (from a
    ``before_mutation`` hook: the unit's own mutation phase, not another's)."""

    def __init__(self) -> None:
        self.armed = False
        self.fired = 0

    def arm(self, uow: af.UnitOfWork | None = None) -> None:
        if not self.fired:
            self.armed = True


@contextlib.contextmanager
def client_gone_during_commit_batch() -> Any:
    """The next batch that ends with COMMIT on an asyncmy connection is sent,
    then the client drops its socket while the server still runs the batch
    (a sleep after BEGIN keeps it busy until the client is gone, so the
    reply to the sleep is the first that cannot be written); the call fails
    as a lost connection once the server has had time to finish the batch."""
    from aiofragno.backends import asyncmy as backend

    original = backend.AsyncmyConnection.execute_batch
    fault = Fault()

    async def execute_batch(self: Any, queries: Any, stop: Any = None) -> Any:
        if not fault.armed or not queries or queries[-1].sql != "COMMIT":
            return await original(self, queries, stop)
        fault.armed = False
        fault.fired += 1
        lead, self._begin = self._begin, []
        text = ";\n".join([*lead, "DO SLEEP(0.3)", *(q.sql for q in queries)])
        parameters = tuple(p for q in queries for p in q.parameters)
        await self._raw._execute_command(3, backend._bind(self._raw, text, parameters))  # COM_QUERY
        await asyncio.sleep(0.1)
        self._raw._transport.abort()
        await asyncio.sleep(1.5)  # the server runs the batch to its end meanwhile
        raise ConnectionResetError(errno.ECONNRESET, "connection reset by the test")

    backend.AsyncmyConnection.execute_batch = execute_batch  # type: ignore[method-assign]
    try:
        yield fault
    finally:
        backend.AsyncmyConnection.execute_batch = original  # type: ignore[method-assign]


async def test_stale_write_stops_the_batch_when_the_client_is_gone(
    target: Target, outbox_db: af.Database
) -> None:
    """MySQL/MariaDB with the outbox on send a unit's writes, their stale
    guards, the outbox entry and COMMIT as one batch. When the client is gone
    the server still runs that batch, and ROW_COUNT() after an UPDATE that
    matched nothing is -1 there: the guard must still stop the batch before
    the other writes, the entry and COMMIT. The unit then runs again and is
    applied once, on the fresh balance."""
    if target.dialect != "mysql":
        pytest.skip("the one-batch guarded mutation phase is MySQL's")
    namespaces = Namespaces(outbox_db)
    namespace = namespaces.use(outbox_db, SHOP).namespace
    try:
        await outbox_db.migrate(SHOP, namespace=namespace)
        shop = Shop(outbox_db, namespace)
        await shop.run(lambda uow: _seed(uow))
        key = f"gone-{uuid.uuid4()}"
        with client_gone_during_commit_batch() as fault:
            hooks = af.UowHooks(before_mutation=fault.arm)
            attempts = await shop.run(debit(10, stale_first=shop), idempotency_key=key, hooks=hooks)
        assert fault.fired == 1, "the fault was not injected"
        assert attempts == 2, "the stale first attempt must not count as committed"
        assert await shop.balance("alice") == 40  # 50 (the other writer's) - 10, once
        assert await shop.transfers() == 1
        [entry] = await shop.entries(key)
        [update, create] = entry.payload["mutations"]
        assert update["set"] == {"balance": 40}
        assert create["op"] == "create"
    finally:
        await namespaces.drop()


async def _seed(uow: af.UnitOfWork) -> None:
    uow.create("accounts", {"owner": "alice", "balance": 100})
    uow.create("accounts", {"owner": "bob", "balance": 100})
