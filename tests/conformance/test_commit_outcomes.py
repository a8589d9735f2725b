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

import anyio
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

    def __init__(self, db: af.Database, namespace: str, *, outbox: bool | None = None) -> None:
        self.db = db
        self.namespace = namespace
        # Units' outbox= (None: the Database's), and whether they write entries.
        self.outbox = outbox
        self.writes_entries = db.options.outbox if outbox is None else outbox

    def ident(self, table: str) -> af.Identifier:
        return self.db.layout(SHOP, self.namespace).table(table).identifier

    async def run(self, fn: Any, **options: Any) -> Any:
        return await self.db.execute_uow(
            fn, schema=SHOP, namespace=self.namespace, outbox=self.outbox, **options
        )

    async def balance(self, owner: str) -> int:
        query = af.sql(
            "SELECT balance FROM {t} WHERE owner = {o}", t=self.ident("accounts"), o=owner
        )
        return int(await self.db.fetch_value(query))

    async def transfers(self) -> int:
        return int(
            await self.db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=self.ident("transfers")))
        )

    async def entries(self, uow_id: str) -> list[af.OutboxEntry]:
        entry = await self.db.outbox.find(uow_id)
        return [] if entry is None else [entry]

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
def client_gone_during_commit_batch(before: str | None = None) -> Any:
    """The next batch that ends with COMMIT on an asyncmy connection is sent,
    then the client drops its socket while the server still runs the batch
    (a sleep after BEGIN — or before the first statement containing
    ``before`` — keeps it busy until the client is gone, so the reply to the
    sleep is the first that cannot be written); the call fails
    as a lost connection once the server has had time to finish the batch."""
    from aiofragno.backends import asyncmy as backend

    original = backend.AsyncmyConnection.execute_batch
    fault = Fault()

    async def execute_batch(self: Any, queries: Any, stop: Any = None) -> Any:
        if not fault.armed or not queries or queries[-1].sql != "COMMIT":
            return await original(self, queries, stop)
        fault.armed = False
        fault.fired += 1
        lead = self._begin.take() or ()
        texts = [q.sql for q in queries]
        at = next((i for i, t in enumerate(texts) if before in t), 0) if before else 0
        text = ";\n".join([*lead, *texts[:at], "DO SLEEP(0.3)", *texts[at:]])
        parameters = tuple(p for q in queries for p in q.parameters)
        await self._raw._execute_command(3, backend._bind(text, parameters))  # COM_QUERY
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


async def test_version_reserved_by_a_batch_whose_client_is_gone(target: Target, url: str) -> None:
    """The batch that commits a unit also reserves its outbox version, and
    the entry's insert reads that version back from the session. When the
    client is gone the server still commits the batch, so the version the
    entry gets must be the one reserved — also when the reservation creates
    the counter row (here deleted first, on a database of its own). The
    look-up finds the entry; the versions stay contiguous."""
    if target.dialect != "mysql":
        pytest.skip("the one-batch mutation phase is MySQL's")
    name = f"aiofragno_gone_{uuid.uuid4().hex[:10]}"
    async with af.connect(url, backend=target.backend, pool_size=1) as admin:
        await admin.execute(admin._engine.raw(f"CREATE DATABASE `{name}`"))
        try:
            private = url.rsplit("/", 1)[0] + f"/{name}"
            async with af.connect(private, backend=target.backend, outbox=True) as db:
                await db.migrate(SHOP)
                await db.execute(
                    af.sql(
                        "DELETE FROM fragno_db_settings WHERE {k} = 'outbox.version'",
                        k=af.Identifier("key"),
                    )
                )
                shop = Shop(db, "shop")
                reservation = "ON DUPLICATE KEY UPDATE"
                with client_gone_during_commit_batch(before=reservation) as fault:
                    hooks = af.UowHooks(before_mutation=fault.arm)
                    await shop.run(_seed, hooks=hooks, idempotency_key="first")
                assert fault.fired == 1, "the fault was not injected"
                await shop.run(debit(10), idempotency_key="second")
                entries = await db.outbox.list()
                assert [(e.uow_id, e.versionstamp[:20]) for e in entries] == [
                    ("first", f"{1:020x}"),
                    ("second", f"{2:020x}"),
                ]
                assert [m["versionstamp"][:20] for m in entries[0].mutations] == [f"{1:020x}"] * 2
        finally:
            await admin.execute(admin._engine.raw(f"DROP DATABASE IF EXISTS `{name}`"))


async def _seed(uow: af.UnitOfWork) -> None:
    uow.create("accounts", {"owner": "alice", "balance": 100})
    uow.create("accounts", {"owner": "bob", "balance": 100})


# -- 2/3. idempotency keys: a unit applied once per key --------------------------


@pytest.fixture(
    params=[(True, None), (False, None), (True, False)],
    ids=["outbox", "no-outbox", "outbox-off-per-unit"],
)
async def keyed_shop(
    request: pytest.FixtureRequest, url: str, target: Target
) -> AsyncIterator[Shop]:
    """A seeded namespace on a Database with the outbox on or off (a key
    then records itself in a table of its own), or on with units that turn
    it off (``execute_uow(outbox=False)``: their keys go to that table too)."""
    outbox, per_unit = request.param
    async with af.connect(url, backend=target.backend, pool_size=4, outbox=outbox) as db:
        namespaces = Namespaces(db)
        namespace = namespaces.use(db, SHOP).namespace
        try:
            await db.migrate(SHOP, namespace=namespace)
            await db.execute_uow(_seed, schema=SHOP, namespace=namespace)
            yield Shop(db, namespace, outbox=per_unit)
        finally:
            await namespaces.drop()


def new_key() -> str:
    # Keys are unique in the database, across tests and runs.
    return f"key-{uuid.uuid4()}"


async def test_a_key_applies_a_unit_once(keyed_shop: Shop) -> None:
    """A second unit with a key that already committed writes nothing and
    raises AlreadyApplied (naming the first unit's outbox entry, with the
    outbox on) — also when it would write something else entirely."""
    shop = keyed_shop
    key = new_key()
    await shop.run(debit(10), idempotency_key=key)
    with pytest.raises(af.AlreadyApplied) as raised:
        await shop.run(debit(25), idempotency_key=key)
    assert raised.value.idempotency_key == key
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1
    if shop.writes_entries:
        [entry] = await shop.entries(key)
        assert raised.value.versionstamp == entry.versionstamp
    else:
        assert raised.value.versionstamp is None
    # A unit with another key is not affected.
    await shop.run(debit(5), idempotency_key=new_key())
    assert await shop.balance("alice") == 85


async def test_concurrent_units_with_one_key(keyed_shop: Shop) -> None:
    """Eight tasks run a unit with the same key at once: exactly one commits,
    every other raises AlreadyApplied, and the effects are there once."""
    shop = keyed_shop
    key = new_key()
    outcomes: list[Any] = []
    retry = af.ExponentialBackoff(max_retries=50, initial=0.001, maximum=0.02)

    async def one() -> None:
        try:
            outcomes.append(await shop.run(debit(10), idempotency_key=key, retry=retry))
        except af.AlreadyApplied as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert sum(not isinstance(o, af.AlreadyApplied) for o in outcomes) == 1, outcomes
    assert len(outcomes) == 8
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1
    if shop.writes_entries:
        assert len(await shop.entries(key)) == 1


@pytest.fixture
async def entry_shop(outbox_db: af.Database) -> AsyncIterator[Shop]:
    """A seeded namespace on a Database with the outbox on, whose units
    choose per call whether they write an entry (``Shop.run(outbox=...)``)."""
    namespaces = Namespaces(outbox_db)
    namespace = namespaces.use(outbox_db, SHOP).namespace
    try:
        await outbox_db.migrate(SHOP, namespace=namespace)
        await outbox_db.execute_uow(_seed, schema=SHOP, namespace=namespace)
        yield Shop(outbox_db, namespace)
    finally:
        await namespaces.drop()


@pytest.mark.parametrize("entry_first", [True, False], ids=["entry-first", "key-row-first"])
async def test_one_key_across_units_with_and_without_an_entry(
    entry_shop: Shop, entry_first: bool
) -> None:
    """A key is one key whatever the unit writes: a unit that writes an
    outbox entry and one that writes none (``outbox=False``, or a table out
    of the outbox) share it — the second raises AlreadyApplied, in either
    order, and is not applied."""
    shop, key = entry_shop, new_key()
    first, second = (True, False) if entry_first else (False, True)
    await shop.db.execute_uow(
        debit(10), schema=SHOP, namespace=shop.namespace, idempotency_key=key, outbox=first
    )
    with pytest.raises(af.AlreadyApplied) as raised:
        await shop.db.execute_uow(
            debit(25), schema=SHOP, namespace=shop.namespace, idempotency_key=key, outbox=second
        )
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1
    entries = await shop.entries(key)
    assert len(entries) == (1 if entry_first else 0)
    assert raised.value.versionstamp == (entries[0].versionstamp if entries else None)


async def test_concurrent_units_with_one_key_with_and_without_an_entry(
    entry_shop: Shop,
) -> None:
    """Eight tasks run a unit with one key at once, half of them writing an
    outbox entry and half not: exactly one commits."""
    shop, key = entry_shop, new_key()
    outcomes: list[Any] = []
    retry = af.ExponentialBackoff(max_retries=50, initial=0.001, maximum=0.02)

    async def one(outbox: bool) -> None:
        try:
            outcomes.append(
                await shop.db.execute_uow(
                    debit(10),
                    schema=SHOP,
                    namespace=shop.namespace,
                    idempotency_key=key,
                    outbox=outbox,
                    retry=retry,
                )
            )
        except af.AlreadyApplied as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i % 2 == 0)
    assert sum(not isinstance(o, af.AlreadyApplied) for o in outcomes) == 1, outcomes
    assert len(outcomes) == 8
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1
    assert len(await shop.entries(key)) <= 1


class LostBeforeServer:
    """Makes the next COMMIT of a mutation phase (the message that would
    commit it, whichever form it takes) fail as a lost connection before
    anything of it is sent: the server never commits, and the client cannot
    tell that from a lost reply."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from aiofragno.session import Session

        self.armed = False
        self.fired = 0
        original = Session._committing
        fault = self

        async def committing(session: Any, operation: Any) -> Any:
            if not fault.armed:
                return await original(session, operation)
            fault.armed = False
            fault.fired += 1
            operation.close()  # (never sent)

            async def lost() -> None:
                raise af.ConnectionLost("connection lost (injected, before COMMIT was sent)")

            return await original(session, lost())

        monkeypatch.setattr(Session, "_committing", committing)

    def arm(self, uow: af.UnitOfWork | None = None) -> None:
        if not self.fired:
            self.armed = True


async def test_reused_key_with_a_lost_commit_is_not_reported_done(
    keyed_shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key committed earlier; a later unit with the same key loses its
    COMMIT before it reaches the server. Its look-up finds the key's record
    — the earlier call's, not its own — so it must not report success (it
    wrote nothing): AlreadyApplied, and nothing of it in the database."""
    shop = keyed_shop
    key = new_key()
    await shop.run(debit(10), idempotency_key=key)
    fault = LostBeforeServer(monkeypatch)
    with pytest.raises(af.AlreadyApplied):
        await shop.run(debit(25), idempotency_key=key, hooks=af.UowHooks(before_mutation=fault.arm))
    assert fault.fired == 1, "the fault was not injected"
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1


async def test_own_commit_lost_before_the_server_runs_again(
    keyed_shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first use of a key whose COMMIT never reached the server: the
    look-up finds no record, the unit runs again and is applied once."""
    shop = keyed_shop
    key = new_key()
    fault = LostBeforeServer(monkeypatch)
    attempts = await shop.run(
        debit(10), idempotency_key=key, hooks=af.UowHooks(before_mutation=fault.arm)
    )
    assert fault.fired == 1, "the fault was not injected"
    assert attempts == 2
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1


@pytest.mark.parametrize(
    "key", [b"bytes", 42, "", "x" * 256, "nul\x00inside", "lone\ud800surrogate"]
)
async def test_bad_idempotency_keys_are_refused(shop: Shop, key: Any) -> None:
    with pytest.raises(af.ValidationError, match="idempotency_key"):
        await shop.run(debit(10), idempotency_key=key)
    with pytest.raises(af.ValidationError, match="idempotency_key"):
        await shop.run(debit(10), idempotency_key=key, dry_run=True)
    assert await shop.balance("alice") == 100


# -- 4. an update or delete whose row is not there -------------------------------


@pytest.mark.parametrize("op", ["update", "delete"])
@pytest.mark.parametrize("first", [True, False], ids=["missing-first", "missing-last"])
async def test_write_to_a_missing_row_writes_nothing(
    keyed_shop: Shop, op: str, first: bool
) -> None:
    """An unchecked update or delete of a row that does not exist (an id
    the unit never read) raises RowNotFound: the unit's other writes are
    rolled back and no outbox entry announces a change that did not
    happen. (Both orders: the combined statement, the guarded batch and
    the statement-by-statement phase all stop at it.)"""
    shop = keyed_shop
    key = new_key()

    async def unit(uow: af.UnitOfWork) -> None:
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        writes = [
            lambda: uow.update("accounts", alice.result["id"], {"balance": 0}),
            lambda: uow.create("transfers", {"src": alice.result["id"], "amount": 1}),
        ]
        missing = (
            (lambda: uow.update("accounts", "no-such-row", {"balance": 1}))
            if op == "update"
            else (lambda: uow.delete("transfers", "no-such-row"))
        )
        for write in [missing, *writes] if first else [*writes, missing]:
            write()

    with pytest.raises(af.RowNotFound, match="no-such-row"):
        await shop.run(unit, retry=af.NoRetry(), idempotency_key=key)
    assert await shop.balance("alice") == 100
    assert await shop.transfers() == 0
    if shop.writes_entries:
        assert await shop.entries(key) == []
    # Nothing recorded the key either: it can still be used.
    await shop.run(debit(10), idempotency_key=key)


async def test_write_to_a_row_deleted_since_it_was_read_runs_again(keyed_shop: Shop) -> None:
    """A row the unit read is deleted by someone else before the unit's
    unchecked update: that is a conflict (the world changed since the unit
    looked), so the unit runs again and sees the row gone. The outbox entry
    has only what the second run committed."""
    shop = keyed_shop
    seen: list[bool] = []

    async def add_victim(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "victim", "balance": 7})

    await shop.run(add_victim)

    async def remove_victim() -> None:
        async def unit(uow: af.UnitOfWork) -> None:
            row = uow.find_first("accounts", where={"owner": "victim"})
            await uow.retrieve()
            uow.delete("accounts", row.result["id"])

        await shop.run(unit)

    async def unit(uow: af.UnitOfWork) -> None:
        victim = uow.find_first("accounts", where={"owner": "victim"})
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        seen.append(victim.result is not None)
        if victim.result is not None:
            if len(seen) == 1:
                await remove_victim()
            uow.update("accounts", victim.result["id"], {"balance": 0})
        uow.update("accounts", alice.result["id"], {"balance": 1})

    key = new_key()
    await shop.run(unit, idempotency_key=key)
    assert seen == [True, False]
    assert await shop.balance("alice") == 1
    if shop.writes_entries:
        [entry] = await shop.entries(key)
        assert [m["set"] for m in entry.mutations] == [{"balance": 1}]


# -- a COMMIT the client stopped waiting for -------------------------------------


async def test_commit_that_times_out_on_the_client_is_settled(
    target: Target, url: str, shop: Shop
) -> None:
    """With ``command_timeout``, the client stops waiting for a statement —
    also for the one that commits the phase (here blocked on a row lock
    another session holds). That statement may still commit on the server,
    so the timeout is an unknown outcome, never a plain QueryCanceled: with
    the outbox on, the executor ends the session, finds no entry, and runs
    the unit again once the lock is free. Applied once."""
    if target.dialect == "sqlite":
        pytest.skip("SQLite has no command_timeout")
    accounts = shop.ident("accounts")
    async with af.connect(
        url, backend=target.backend, pool_size=2, outbox=True, command_timeout=0.5
    ) as timed:
        runs = Shop(timed, shop.namespace)
        attempts: list[int] = []
        key = new_key()

        async def run() -> None:
            attempts.append(await runs.run(debit(10), idempotency_key=key))

        async with anyio.create_task_group() as tg, shop.db.transaction() as holder:
            await holder.fetch(
                af.sql("SELECT 1 FROM {t} WHERE owner = 'alice' FOR UPDATE", t=accounts)
            )
            tg.start_soon(run)
            await anyio.sleep(2.0)  # several timeouts while the lock is held
        assert attempts and attempts[0] >= 2, attempts
    assert await shop.balance("alice") == 90
    assert await shop.transfers() == 1


# -- 10. serializable units with the outbox -------------------------------------


async def test_serializable_units_with_the_outbox_do_not_conflict_on_it(
    target: Target, url: str, shop: Shop
) -> None:
    """Every outbox unit reserves its version from one counter row. A unit
    at "serializable" (or "repeatable read") must not fail as a
    serialization conflict because other outbox units committed after its
    snapshot: 24 units at those levels and 8 at the default one, 16 at a
    time, on rows of their own, all commit without a single conflict, each
    with exactly one outbox entry."""

    async def open_accounts(uow: af.UnitOfWork) -> None:
        for i in range(32):
            uow.create("accounts", {"owner": f"s{i:02}", "balance": 100})

    await shop.run(open_accounts)
    async with af.connect(url, backend=target.backend, pool_size=16, outbox=True) as db:
        runs = Shop(db, shop.namespace)
        keys = [new_key() for _ in range(32)]
        levels: list[Any] = ["serializable", "repeatable read", "serializable", None] * 8
        limit = anyio.Semaphore(16)

        async def pay(i: int) -> None:
            async def unit(uow: af.UnitOfWork) -> None:
                row = uow.find_first("accounts", where={"owner": f"s{i:02}"})
                await uow.retrieve()
                uow.update("accounts", row.result["id"], {"balance": 99}, check=True)
                uow.create("transfers", {"src": row.result["id"], "amount": 1})

            async with limit:
                await runs.run(
                    unit, idempotency_key=keys[i], isolation=levels[i], retry=af.NoRetry()
                )

        async with anyio.create_task_group() as tg:
            for i in range(32):
                tg.start_soon(pay, i)
        assert db.stats.conflicts == 0
        for key in keys:
            assert await db.outbox.find(key) is not None
    assert await shop.transfers() == 32


# -- 9. units with many writes ---------------------------------------------------


@pytest.mark.parametrize("size", [1663, 1664, 1665])
async def test_units_around_the_statement_size_limits_commit(keyed_shop: Shop, size: int) -> None:
    """PostgreSQL combines independent writes into one statement, whose
    select list holds at most 1,664 entries: a unit of any size must still
    commit (in statements of bounded size), on every backend, with its
    outbox entry describing every write."""
    shop = keyed_shop
    key = new_key()

    async def unit(uow: af.UnitOfWork) -> None:
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        uow.update("accounts", alice.result["id"], {"balance": 1}, check=True)
        for i in range(size - 1):
            uow.create("transfers", {"src": alice.result["id"], "amount": i})

    await shop.run(unit, idempotency_key=key)
    assert await shop.transfers() == size - 1
    assert await shop.balance("alice") == 1
    if shop.writes_entries:
        [entry] = await shop.entries(key)
        assert len(entry.mutations) == size
        assert [m["values"]["amount"] for m in entry.mutations[1:]] == list(range(size - 1))


async def test_a_unit_of_many_dependent_writes_commits(keyed_shop: Shop) -> None:
    """2,000 accounts and 2,000 transfers each referencing an account the
    same unit creates, in one unit: committed as a whole, every reference
    right (the writes that depend on earlier ones run after them)."""
    shop = keyed_shop

    async def unit(uow: af.UnitOfWork) -> None:
        for i in range(2000):
            account = uow.create("accounts", {"owner": f"bulk{i:05}", "balance": i})
            uow.create("transfers", {"src": account, "amount": i})

    await shop.run(unit)
    transfers, accounts = shop.ident("transfers"), shop.ident("accounts")
    wrong = await shop.db.fetch_value(
        af.sql(
            "SELECT COUNT(*) FROM {t} JOIN {a} ON {a}._id = {t}.src WHERE {a}.balance <> {t}.amount",
            t=transfers,
            a=accounts,
        )
    )
    assert int(wrong) == 0
    assert await shop.transfers() == 2000


# -- after the commit ------------------------------------------------------------


async def test_a_failing_after_mutation_hook_does_not_unmake_the_commit(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    """``after_mutation`` runs once the unit has committed: what it raises
    is logged, and execute_uow returns the unit's value — reporting a
    failure would invite a second application."""

    def broken(uow: af.UnitOfWork) -> None:
        raise RuntimeError("tracing backend down")

    with caplog.at_level("ERROR", logger="aiofragno"):
        attempts = await shop.run(debit(10), hooks=af.UowHooks(after_mutation=broken))
    assert attempts == 1
    assert await shop.balance("alice") == 90
    assert "tracing backend down" in caplog.text
