"""The transactional outbox on every backend and runtime: one entry per
committed unit (gap-free, commit-ordered versionstamps under concurrent,
conflicting load), the payload and ref_map, reading (list, tail, find) and
durable consumers (order, at-least-once redelivery, one worker at a time,
dead letters, halting, transactional handlers).

The outbox tables are shared by every namespace of a database, and these
tests count entries exactly. So on PostgreSQL and MySQL the module works in a
database of its own (created on the server, dropped at the end: others writing
to the shared test database cannot disturb it, nor our load them); SQLite gets
a new file per test. Within that, each test migrates its own namespace, notes
``db.outbox.latest()`` before it writes and only looks at entries after that;
consumers get unique names and start at that point. What a test creates is
dropped or deleted afterwards.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox import Consumer, ConsumerHalted, OutboxEntry
from aiofragno.outbox.tables import CONSUMERS, DEAD_LETTERS, OUTBOX
from aiofragno.schema import tables_in_dependency_order
from aiofragno.session import Session
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target

pytestmark = pytest.mark.anyio

SHOP = af.Schema(
    "shop",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Column("note", "string", nullable=True),
        af.Index("by_owner", ["owner"]),
    ),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("dst", "accounts", nullable=True),
        af.Column("amount", "bigint"),
    ),
)

TYPES = af.Schema(
    "types",
    af.Table("targets", af.Column("label", "string")),
    af.Table(
        "samples",
        af.Column("s", "string"),
        af.Column("i", "integer"),
        af.Column("big", "bigint"),
        af.Column("dec", "decimal"),
        af.Column("flag", "bool"),
        af.Column("doc", "json"),
        af.Column("blob", "binary"),
        af.Column("day", "date"),
        af.Column("at", "timestamp"),
        af.Column("code", af.varchar(12)),
        af.Column("maybe", "string", nullable=True),
        af.Reference("target", "targets", nullable=True),
    ),
)

Unit = Callable[[af.UnitOfWork], Awaitable[Any]]
SETTINGS = af.Identifier("fragno_db_settings")


def version_of(stamp: str) -> int:
    """The commit version of a versionstamp (its first 10 bytes)."""
    return int(stamp[:20], 16)


def at_commit(db: af.Database, entry: OutboxEntry) -> str | None:
    """What ``uow.versionstamp`` holds once the unit of ``entry`` committed:
    its versionstamp under the counter, None under ticks (known later)."""
    return entry.versionstamp if db._engine.outbox_strategy == "counter" else None


def stamp_of(version: int, index: int = 0) -> str:
    return f"{version:020x}{index:04x}"


class Env:
    """One migrated schema in a fresh namespace, on an outbox-enabled Database."""

    def __init__(self, db: af.Database, schema: af.Schema, namespace: str) -> None:
        self.db = db
        self.schema = schema
        self.namespace = namespace
        self.start: str | None = None  # db.outbox.latest() before the test wrote

    async def run(self, fn: Unit, **options: Any) -> Any:
        return await self.db.execute_uow(
            fn, schema=self.schema, namespace=self.namespace, **options
        )

    async def create(self, table: str, *rows: dict[str, Any]) -> list[af.RowId]:
        async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
            return [uow.create(table, values) for values in rows]

        return await self.run(unit)

    async def find(self, table: str, **kwargs: Any) -> Any:
        async def unit(uow: af.UnitOfWork) -> Any:
            op = uow.find(table, **kwargs)
            await uow.retrieve()
            return op.result

        return await self.run(unit)

    async def one_unit_per_row(self, count: int, prefix: str = "u") -> list[str]:
        """``count`` units, each creating one account; returns their uow ids in
        commit order."""
        ids = []
        for n in range(count):
            key = f"{prefix}-{uuid.uuid4().hex}"
            await self.run(lambda uow, n=n: _create_one(uow, f"{prefix}{n}"), idempotency_key=key)
            ids.append(key)
        return ids

    async def entries(self) -> list[OutboxEntry]:
        """Every outbox entry committed since ``start``, in versionstamp order."""
        found: list[OutboxEntry] = []
        after = self.start
        while True:
            page = await self.db.outbox.list(after=after, limit=1000)
            if not page:
                return found
            found.extend(page)
            after = page[-1].versionstamp


async def _create_one(uow: af.UnitOfWork, owner: str) -> af.RowId:
    return uow.create("accounts", {"owner": owner, "balance": 100})


class Cleanup:
    """What a test created in the database, removed at teardown."""

    def __init__(self) -> None:
        self.namespaces: list[tuple[af.Schema, str]] = []
        self.consumers: list[str] = []
        self.statements: list[af.Fragment] = []

    async def run(self, db: af.Database) -> None:
        for statement in reversed(self.statements):
            await db.execute(statement)
        for name in self.consumers:
            for table in (CONSUMERS, DEAD_LETTERS):
                column = "name" if table == CONSUMERS else "consumer"
                await db.execute(
                    af.sql(
                        "DELETE FROM {t} WHERE {c} = {n}",
                        t=af.Identifier(table),
                        c=af.Identifier(column),
                        n=name,
                    )
                )
        for schema, namespace in reversed(self.namespaces):
            layout = db.layout(schema, namespace)
            if layout.db_schemas:
                for name in layout.db_schemas:
                    await db.execute(
                        af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name))
                    )
            else:
                for table in reversed(list(tables_in_dependency_order(schema))):
                    await db.execute(
                        af.sql("DROP TABLE IF EXISTS {t}", t=layout.table(table.name).identifier)
                    )
            await db.execute(
                af.sql(
                    "DELETE FROM {t} WHERE {k} LIKE {p}",
                    t=SETTINGS,
                    k=af.Identifier("key"),
                    p=f"{namespace}.%",
                )
            )


@pytest.fixture
async def url(target: Target, tmp_path: Path, private_databases: PrivateDatabases) -> str:
    """The conformance ``url``, moved to a private database on servers."""
    require_target(target)
    base = target.url(tmp_path)
    if target.dialect == "sqlite":
        return base  # a new file for every test
    return await private_databases.url_for(target, base)


@pytest.fixture(params=["counter", "ticks"])
def strategy(request: pytest.FixtureRequest, target: Target) -> str:
    """Each outbox strategy the target has: both on PostgreSQL."""
    if request.param == "ticks" and target.dialect != "postgresql":
        pytest.skip("the ticks strategy is PostgreSQL's")
    return str(request.param)


@pytest.fixture
async def fresh_db(
    target: Target, tmp_path: Path, private_databases: PrivateDatabases, strategy: str
) -> AsyncIterator[af.Database]:
    """An outbox-enabled Database on a new, empty database."""
    require_target(target)
    base = target.url(tmp_path)
    if target.dialect == "sqlite":
        url = f"sqlite:///{tmp_path}/fresh.db"
    else:
        try:
            url = await private_databases.create(target, base)
        except af.Error as exc:
            pytest.skip(f"needs a new, empty database; cannot create one: {exc}")
    async with af.connect(url, backend=target.backend, outbox=strategy, pool_size=8) as database:
        yield database


@pytest.fixture
async def odb(url: str, target: Target, strategy: str) -> AsyncIterator[af.Database]:
    async with af.connect(url, backend=target.backend, outbox=strategy, pool_size=8) as database:
        yield database


@pytest.fixture
async def cleanup(odb: af.Database) -> AsyncIterator[Cleanup]:
    made = Cleanup()
    yield made
    if not odb.closed:
        await made.run(odb)


MakeEnv = Callable[..., Awaitable[Env]]


@pytest.fixture
async def make_env(odb: af.Database, cleanup: Cleanup) -> MakeEnv:
    async def make(schema: af.Schema, db: af.Database | None = None) -> Env:
        env = Env(db or odb, schema, f"ns{uuid.uuid4().hex[:8]}")
        cleanup.namespaces.append((schema, env.namespace))
        await env.db.migrate(schema, namespace=env.namespace)
        env.start = await odb.outbox.latest()
        return env

    return make


@pytest.fixture
async def shop(make_env: MakeEnv) -> Env:
    return await make_env(SHOP)


@pytest.fixture
def new_consumer(cleanup: Cleanup) -> Callable[..., Awaitable[Consumer]]:
    async def make(env: Env, *, lease: float = 30.0) -> Consumer:
        """A consumer of a unique name whose cursor starts at ``env.start``,
        so that it skips the entries earlier tests left."""
        name = f"test-{uuid.uuid4().hex}"
        cleanup.consumers.append(name)
        await env.db.execute(
            af.sql(
                "INSERT INTO {t} ({n}, {c}) VALUES ({name}, {cursor})",
                t=af.Identifier(CONSUMERS),
                n=af.Identifier("name"),
                c=af.Identifier("cursor"),
                name=name,
                cursor=env.start,
            )
        )
        return env.db.outbox.consumer(name, lease=lease)

    return make


NewConsumer = Callable[..., Awaitable[Consumer]]


# -- concurrent load ----------------------------------------------------------

WRITERS = 16
UNITS_PER_WRITER = 50
ACCOUNTS = 50


async def test_concurrent_conflicting_writers_and_a_live_consumer(
    shop: Env, new_consumer: NewConsumer
) -> None:
    """16 writers x 50 transfer units over 50 accounts (so they conflict and
    retry). Exactly one entry per committed unit, versions contiguous right
    after the starting point, every uow_id unique, each payload the unit that
    committed it; versionstamp order is commit order: replaying the entries in
    versionstamp order gives, per account, an unbroken chain of checked
    versions and balances ending in the stored row. A consumer started during
    the load sees every entry exactly once, in order, never going backwards."""
    db = shop.db
    owners = [f"acct{n}" for n in range(ACCOUNTS)]
    await shop.create("accounts", *({"owner": o, "balance": 1_000} for o in owners))
    initial = {row["owner"]: row["id"] for row in await shop.find("accounts")}
    shop.start = await db.outbox.latest()  # after the seeding unit
    rng = random.Random(20240229)

    expected: dict[str, list[dict[str, Any]]] = {}  # uow_id -> mutations (last attempt)
    hooked: dict[str, str | None] = {}  # uow_id -> uow.versionstamp after commit
    conflicts = 0

    async def transfer(uow: af.UnitOfWork) -> None:
        src, dst = rng.sample(owners, 2)
        a = uow.find_first("accounts", where={"owner": src})
        b = uow.find_first("accounts", where={"owner": dst})
        await uow.retrieve()
        amount = rng.randint(1, 9)
        acc_a, acc_b = a.result, b.result
        uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - amount}, check=True)
        uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + amount}, check=True)
        created = uow.create(
            "transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": amount}
        )
        common = {"schema": "shop", "namespace": shop.namespace}
        expected[uow.uow_id] = [
            {
                "op": "update",
                **common,
                "table": "accounts",
                "external_id": str(acc["id"]),
                "set": {"balance": balance},
                "check_version": acc["id"].version,
            }
            for acc, balance in (
                (acc_a, acc_a["balance"] - amount),
                (acc_b, acc_b["balance"] + amount),
            )
        ] + [
            {
                "op": "create",
                **common,
                "table": "transfers",
                "external_id": str(created),
                "values": {"src": str(acc_a["id"]), "dst": str(acc_b["id"]), "amount": amount},
            }
        ]

    def after_mutation(uow: af.UnitOfWork) -> None:
        assert uow.uow_id not in hooked
        hooked[uow.uow_id] = uow.versionstamp

    def on_conflict(uow: af.UnitOfWork, exc: Exception) -> None:
        nonlocal conflicts
        conflicts += 1

    hooks = af.UowHooks(after_mutation=after_mutation, on_conflict=on_conflict)
    retry = af.ExponentialBackoff(max_retries=200, initial=0.001, maximum=0.02)
    consumer = await new_consumer(shop)
    seen: list[OutboxEntry] = []
    total = WRITERS * UNITS_PER_WRITER
    some_committed = anyio.Event()
    all_seen = anyio.Event()
    stop = False

    async def handle(entry: OutboxEntry) -> None:
        # No assert here: the consumer would take a failure for the handler's.
        seen.append(entry)
        if len(seen) == total:
            all_seen.set()

    async def writer() -> None:
        for _ in range(UNITS_PER_WRITER):
            await shop.run(transfer, retry=retry, hooks=hooks)
            if len(hooked) >= total // 8:
                some_committed.set()

    started_at: list[int] = []

    async def consume() -> None:
        await some_committed.wait()  # start while the load is running
        started_at.append(len(hooked))
        await consumer.run(handle, stop=lambda: stop, poll_interval=0.01, batch_size=50)

    with anyio.fail_after(45):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            async with anyio.create_task_group() as writers:
                for _ in range(WRITERS):
                    writers.start_soon(writer)
            with anyio.move_on_after(10):
                await all_seen.wait()
            stop = True

    entries = await shop.entries()
    assert conflicts > 0, "the load was meant to conflict"
    # One entry per committed unit, nothing else.
    assert len(entries) == total == len(hooked) == len(expected)
    uow_ids = [e.uow_id for e in entries]
    assert len(set(uow_ids)) == total
    assert set(uow_ids) == set(hooked) == set(expected)
    # Gap-free from the first version after the starting point.
    first = 1 if shop.start is None else version_of(shop.start) + 1
    assert [version_of(e.versionstamp) for e in entries] == list(range(first, first + total))
    assert all(e.versionstamp.endswith("0000") for e in entries)
    # Each entry is what its unit committed; the hook saw the same
    # versionstamp (under the counter; under ticks, None: known later).
    for entry in entries:
        assert hooked[entry.uow_id] == at_commit(db, entry)
        version = version_of(entry.versionstamp)
        want = [
            {**m, "versionstamp": stamp_of(version, i)}
            for i, m in enumerate(expected[entry.uow_id])
        ]
        assert entry.payload == {"version": 1, "mutations": want}
        src, dst = want[0]["external_id"], want[1]["external_id"]
        assert entry.ref_map == {"2.src": src, "2.dst": dst}
    # Versionstamp order is commit order: replay the entries.
    versions = {str(row_id): row_id.version for row_id in initial.values()}
    balances = {str(row_id): 1_000 for row_id in initial.values()}
    for entry in entries:
        update_a, update_b, create = entry.mutations
        amount = create["values"]["amount"]
        for update, delta in ((update_a, -amount), (update_b, amount)):
            account = update["external_id"]
            assert update["check_version"] == versions[account], "out of commit order"
            assert update["set"]["balance"] == balances[account] + delta
            versions[account] += 1
            balances[account] += delta
    final = {str(row["id"]): row for row in await shop.find("accounts")}
    assert {k: (r["id"].version, r["balance"]) for k, r in final.items()} == {
        k: (versions[k], balances[k]) for k in versions
    }
    assert sum(balances.values()) == 1_000 * ACCOUNTS
    # The live consumer: started mid-load, never went backwards, saw every
    # entry exactly once, in order.
    assert started_at and started_at[0] < total
    seen_stamps = [e.versionstamp for e in seen]
    assert all(a < b for a, b in itertools.pairwise(seen_stamps))
    assert [e.versionstamp for e in seen] == [e.versionstamp for e in entries]
    assert await consumer.position() == entries[-1].versionstamp
    assert await consumer.lag() == 0


async def test_rolled_back_reservation_leaves_no_gap(shop: Env, cleanup: Cleanup) -> None:
    """A mutation phase that fails after reserving its version (here: a real
    trigger rejects the outbox row) rolls back its writes and its reservation:
    the next unit takes that same version."""
    db = shop.db
    key = f"doomed-{uuid.uuid4().hex}"
    name = f"fail_{shop.namespace}"
    if db.name == "postgresql":
        await db.execute(
            db._engine.raw(
                f'CREATE FUNCTION "{name}"() RETURNS trigger LANGUAGE plpgsql AS $$ '
                f"BEGIN IF NEW.uow_id = '{key}' THEN RAISE EXCEPTION 'injected'; END IF; "
                "RETURN NEW; END $$"
            )
        )
        cleanup.statements.append(db._engine.raw(f'DROP FUNCTION IF EXISTS "{name}"()'))
        await db.execute(
            db._engine.raw(
                f'CREATE TRIGGER "{name}" BEFORE INSERT ON "{OUTBOX}" '
                f'FOR EACH ROW EXECUTE FUNCTION "{name}"()'
            )
        )
        cleanup.statements.append(db._engine.raw(f'DROP TRIGGER IF EXISTS "{name}" ON "{OUTBOX}"'))
    elif db.name == "sqlite":
        await db.execute(
            db._engine.raw(
                f'CREATE TRIGGER "{name}" BEFORE INSERT ON "{OUTBOX}" '
                f"WHEN NEW.uow_id = '{key}' BEGIN SELECT RAISE(ABORT, 'injected'); END"
            )
        )
        cleanup.statements.append(db._engine.raw(f'DROP TRIGGER IF EXISTS "{name}"'))
    else:
        await db.execute(
            db._engine.raw(
                f"CREATE TRIGGER `{name}` BEFORE INSERT ON `{OUTBOX}` FOR EACH ROW BEGIN "
                f"IF NEW.uow_id = '{key}' THEN SIGNAL SQLSTATE '45000' "
                "SET MESSAGE_TEXT = 'injected'; END IF; END"
            )
        )
        cleanup.statements.append(db._engine.raw(f"DROP TRIGGER IF EXISTS `{name}`"))

    before = await db.outbox.latest()
    with pytest.raises(af.Error) as failure:
        await shop.run(lambda uow: _create_one(uow, "doomed"), idempotency_key=key)
    assert not isinstance(failure.value, af.ConcurrencyConflict)
    assert await db.outbox.latest() == before
    assert await shop.find("accounts", where={"owner": "doomed"}) == []

    await shop.run(lambda uow: _create_one(uow, "next"))
    [entry] = await shop.entries()
    expected = 1 if before is None else version_of(before) + 1
    assert version_of(entry.versionstamp) == expected
    assert await db.outbox.find(key) is None


async def test_reads_wait_for_the_writer_holding_the_counter(shop: Env) -> None:
    """On MySQL a read view can miss a transaction that committed just before
    one it sees (measured: ``benchmarks/outbox_mariadb_designs.py``), so
    ``list`` and ``latest`` stop at the counter's version, read under a
    shared lock that waits for the writer holding the counter. Here a
    transaction holds it as a writer does from its reservation to COMMIT,
    having written its entry: both reads wait for it, then include the
    entry."""
    db = shop.db
    if db.name != "mysql":
        pytest.skip("only MySQL's read views need the horizon")
    await shop.run(lambda uow: _create_one(uow, "first"))
    [first] = await shop.entries()
    stamp = f"{version_of(first.versionstamp) + 1:020x}0000"
    got: dict[str, Any] = {}
    held, done = anyio.Event(), anyio.Event()

    async def read() -> None:  # (started outside the transaction, on a connection of its own)
        await held.wait()
        got["latest"] = await db.outbox.latest()
        got["list"] = await db.outbox.list(after=first.versionstamp)
        done.set()

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            async with db.transaction() as tx:
                await tx.execute(
                    af.sql(
                        "UPDATE {t} SET {v} = CAST({v} AS UNSIGNED) + 1 WHERE {k} = {key}",
                        t=af.Identifier("fragno_db_settings"),
                        v=af.Identifier("value"),
                        k=af.Identifier("key"),
                        key="outbox.version",
                    )
                )
                await tx.execute(
                    af.sql(
                        "INSERT INTO {t} ({vs}, {u}, {p}, {c}) "
                        "VALUES ({stamp}, {uow}, {payload}, UTC_TIMESTAMP(6))",
                        t=af.Identifier(OUTBOX),
                        vs=af.Identifier("versionstamp"),
                        u=af.Identifier("uow_id"),
                        p=af.Identifier("payload"),
                        c=af.Identifier("created_at"),
                        stamp=stamp,
                        uow=f"held-{uuid.uuid4().hex}",
                        payload='{"version": 1, "mutations": []}',
                    )
                )
                held.set()
                await anyio.sleep(0.5)
                assert not got, "a read passed the writer holding the counter"
            await done.wait()
    assert got["latest"] == stamp
    assert [entry.versionstamp for entry in got["list"]] == [stamp]


@pytest.mark.parametrize("fault", ["stale-update", "stale-check", "missing-reference"])
async def test_a_failing_operation_undoes_the_phase_and_its_reservation(
    shop: Env, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A phase that fails at one operation — a stale checked update between
    two writes, a stale check after them, a reference to no row — applies
    none of its writes and leaves no entry and no reserved version; a stale
    operation is named in the conflict. On PostgreSQL the phase is first
    tried as one statement committing on its own: the stale operation aborts
    it, the other error makes the phase run again in a transaction, one
    statement at a time, to tell which operation failed."""
    db = shop.db
    await shop.create("accounts", *({"owner": o, "balance": 100} for o in ("a", "b", "c")))
    rows = {r["owner"]: r["id"] for r in await shop.find("accounts")}
    stale = {"stale-update": "b", "stale-check": "c"}.get(fault)

    async def move_on(uow: af.UnitOfWork) -> None:
        uow.update("accounts", rows[stale], {"note": "moved on"})

    if stale is not None:
        await shop.run(move_on)
    before = await db.outbox.latest()
    books = sorted((r["owner"], r["balance"], r["note"]) for r in await shop.find("accounts"))

    async def unit(uow: af.UnitOfWork) -> None:
        uow.update("accounts", rows["a"], {"balance": 90}, check=True)
        uow.update("accounts", rows["b"], {"balance": 110}, check=True)
        uow.check("accounts", rows["c"])
        src = "no-such-account" if fault == "missing-reference" else rows["a"]
        uow.create("transfers", {"src": src, "dst": rows["b"], "amount": 10})

    calls: Counter[str] = Counter()
    for method in ("execute_committing", "begin"):
        original = getattr(Session, method)

        async def spying(self: Session, *args: Any, _name: str = method, _o: Any = original) -> Any:
            calls[_name] += 1
            return await _o(self, *args)

        monkeypatch.setattr(Session, method, spying)
    expected = af.IntegrityError if fault == "missing-reference" else af.ConcurrencyConflict
    with pytest.raises(expected) as failure:
        await shop.run(unit, retry=af.NoRetry())
    alone = db._engine.adapter.commit.plan == "one-committing-statement"
    explicit = not alone or fault == "missing-reference"
    assert calls == Counter(execute_committing=int(alone), begin=int(explicit))
    monkeypatch.undo()
    if stale is not None:
        op = "update" if stale == "b" else "check"
        assert f"{op} on accounts {str(rows[stale])!r}" in str(failure.value)
    after = sorted((r["owner"], r["balance"], r["note"]) for r in await shop.find("accounts"))
    assert after == books
    assert await shop.find("transfers") == []
    assert await db.outbox.latest() == before

    await shop.run(lambda uow: _create_one(uow, "next"))
    latest = await db.outbox.latest()
    assert latest is not None and before is not None
    assert version_of(latest) == version_of(before) + 1


async def test_a_phase_and_its_entry_reach_the_database_in_one_call(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the outbox on, a transfer's mutation phase — two checked updates,
    a check, a create, the entry and COMMIT — is one call on the connection
    on every backend, so the outbox counter's row lock is never held across
    a round trip to us: PostgreSQL's one statement committing on its own,
    MySQL's one multi-statement batch (a stale guard after each checked
    operation), SQLite's one thread hop. And it commits what it says."""
    db = shop.db
    await shop.create("accounts", *({"owner": o, "balance": 100} for o in ("a", "b", "c")))
    rows = {r["owner"]: r["id"] for r in await shop.find("accounts")}
    before = await db.outbox.latest()
    calls: Counter[str] = Counter()
    counting = False
    for method in ("execute", "execute_batch", "commit", "execute_committing"):
        original = getattr(Session, method)

        async def spying(self: Session, *args: Any, _name: str = method, _o: Any = original) -> Any:
            if counting:
                calls[_name] += 1
            return await _o(self, *args)

        monkeypatch.setattr(Session, method, spying)

    def start_counting(uow: af.UnitOfWork) -> None:
        nonlocal counting
        counting = True

    async def unit(uow: af.UnitOfWork) -> af.RowId:
        uow.update("accounts", rows["a"], {"balance": 90}, check=True)
        uow.update("accounts", rows["b"], {"balance": 110}, check=True)
        uow.check("accounts", rows["c"])
        return uow.create("transfers", {"src": rows["a"], "dst": rows["b"], "amount": 10})

    created = await shop.run(unit, hooks=af.UowHooks(before_mutation=start_counting))
    counting = False
    assert sum(calls.values()) == 1, calls
    balances = {r["owner"]: r["balance"] for r in await shop.find("accounts")}
    assert balances == {"a": 90, "b": 110, "c": 100}
    assert [str(t["id"]) for t in await shop.find("transfers")] == [str(created)]
    latest = await db.outbox.latest()
    assert latest is not None and before is not None
    assert version_of(latest) == version_of(before) + 1


# -- what gets an entry -------------------------------------------------------


async def test_outbox_disabled_writes_nothing(
    db: af.Database, odb: af.Database, make_env: MakeEnv
) -> None:
    """The reference's case, and no version is reserved either: the next
    outbox-enabled unit takes the version right after the last one."""
    env = await make_env(SHOP, db)  # the conformance `db`: outbox off
    assert not db.options.outbox
    key = f"off-{uuid.uuid4().hex}"
    [row_id] = await env.run(lambda uow: _create_many(uow, [{"owner": "a"}]), idempotency_key=key)
    await env.run(lambda uow: _touch(uow, row_id))
    assert await db.outbox.latest() == env.start
    assert await env.entries() == []
    assert await db.outbox.find(key) is None

    await odb.execute_uow(lambda uow: _touch(uow, row_id), schema=SHOP, namespace=env.namespace)
    [entry] = await odb.outbox.list(after=env.start)
    assert version_of(entry.versionstamp) == (version_of(env.start) if env.start else 0) + 1


async def _create_many(uow: af.UnitOfWork, rows: list[dict[str, Any]]) -> list[af.RowId]:
    return [uow.create("accounts", values) for values in rows]


async def _touch(uow: af.UnitOfWork, row_id: af.RowId) -> None:
    uow.update("accounts", row_id, {"note": "touched"})


async def test_check_only_and_retrieval_only_units_write_no_entry(shop: Env) -> None:
    [row_id] = await shop.create("accounts", {"owner": "a"})
    [row] = await shop.find("accounts")
    shop.start = await shop.db.outbox.latest()

    async def check_only(uow: af.UnitOfWork) -> None:
        uow.check("accounts", row["id"])

    async def read_only(uow: af.UnitOfWork) -> int:
        n = uow.count("accounts")
        await uow.retrieve()
        return n.result

    async def nothing(uow: af.UnitOfWork) -> None:
        return None

    stamps: list[str | None] = []
    hooks = af.UowHooks(after_mutation=lambda uow: stamps.append(uow.versionstamp))
    await shop.run(check_only, hooks=hooks)
    assert stamps == [None]  # committed, but no entry
    assert await shop.run(read_only) == 1
    await shop.run(nothing)

    async def create(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "dry"})

    await shop.run(create, dry_run=True)
    assert await shop.entries() == []

    async def check_and_update(uow: af.UnitOfWork) -> None:
        uow.check("accounts", row["id"])
        uow.update("accounts", row_id, {"note": "n"})

    await shop.run(check_and_update)
    [entry] = await shop.entries()
    [mutation] = entry.mutations  # the check is not a write
    assert mutation["op"] == "update"
    assert mutation["set"] == {"note": "n"}
    assert mutation["versionstamp"] == entry.versionstamp
    assert "check_version" not in mutation


async def test_mutation_i_carries_versionstamp_index_i(shop: Env) -> None:
    [a, b] = await shop.create("accounts", {"owner": "a"}, {"owner": "b"})
    rows = {r["owner"]: r["id"] for r in await shop.find("accounts")}
    shop.start = await shop.db.outbox.latest()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.check("accounts", rows["b"])  # not a write: takes no index
        c = uow.create("accounts", {"owner": "c"})
        uow.update("accounts", rows["a"], {"balance": 5}, check=True)
        uow.create("transfers", {"src": c, "dst": a, "amount": 1})
        uow.delete("accounts", b)
        uow.update("accounts", c, {"note": "x"})

    await shop.run(unit)
    [entry] = await shop.entries()
    version = version_of(entry.versionstamp)
    assert entry.versionstamp == stamp_of(version, 0)
    assert [m["op"] for m in entry.mutations] == ["create", "update", "create", "delete", "update"]
    assert [m["versionstamp"] for m in entry.mutations] == [stamp_of(version, i) for i in range(5)]
    assert entry.mutations[1]["check_version"] == rows["a"].version
    assert entry.mutations[3]["external_id"] == str(b)
    assert set(entry.mutations[3]) == {
        "op",
        "schema",
        "namespace",
        "table",
        "external_id",
        "versionstamp",
    }


async def test_internal_writes_are_excluded(
    shop: Env, make_env: MakeEnv, new_consumer: NewConsumer
) -> None:
    """Only units of work write entries: not migrations, raw SQL,
    transactions, settings, consumer cursors or dead letters."""
    db = shop.db
    [row_id] = await shop.create("accounts", {"owner": "a"})
    [mine] = await shop.entries()
    latest = mine.versionstamp

    await make_env(TYPES)  # another migration
    table = db.layout(SHOP, shop.namespace).table("accounts").identifier
    await db.execute(af.sql("UPDATE {t} SET {c} = {v}", t=table, c=af.Identifier("note"), v="raw"))
    async with db.transaction() as tx:
        await tx.execute(
            af.sql("UPDATE {t} SET {c} = {v}", t=table, c=af.Identifier("note"), v="tx")
        )
    key = f"{shop.namespace}.noop"
    await db.execute(
        af.sql(
            "INSERT INTO {t} ({k}, {v}) VALUES ({key}, {value})",
            t=SETTINGS,
            k=af.Identifier("key"),
            v=af.Identifier("value"),
            key=key,
            value="1",
        )
    )
    consumer = await new_consumer(shop)

    async def fail(entry: OutboxEntry) -> None:
        raise ValueError("no")

    await consumer.run(fail, until_caught_up=True, max_attempts=1)
    assert len(await consumer.dead_letters()) == 1
    assert await consumer.position() == latest

    assert await db.outbox.latest() == latest
    assert [e.versionstamp for e in await shop.entries()] == [latest]
    assert mine.mutations[0]["external_id"] == str(row_id)


# -- the payload ----------------------------------------------------------------


async def test_payload_round_trip_of_every_column_type(make_env: MakeEnv) -> None:
    env = await make_env(TYPES)
    db = env.db
    [target] = await env.create("targets", {"label": "t"})
    env.start = await db.outbox.latest()
    values = {
        "s": "emoji 🦀, e\u0301, 'quotes' \"double\" \\ backslash",
        "i": -(2**31),
        "big": 2**63 - 1,  # beyond 2**53: JSON readers would round it
        "dec": Decimal("12345678901234567890.10"),  # trailing zero kept
        "flag": True,
        "doc": {
            "$dt": "not a date",  # looks like a type tag
            "nested": [{"$int": "1"}, {"$bytes": "eA=="}, 1.5, None, False],
            "big": 2**60,
            "text": "é✓",
        },
        "blob": b"\x00\x01binary\xff",
        "day": date(2024, 2, 29),
        "at": datetime(2024, 2, 29, 23, 59, 59, 123000, tzinfo=timezone(timedelta(hours=2))),
        "code": "exactly12chr",
        "maybe": None,
        "target": target,
    }
    changes = {
        "s": "",
        "i": 2**31 - 1,
        "big": -(2**63),
        "dec": Decimal("-0.000000000000000000001"),
        "flag": False,
        "doc": {"$dt": "2020-01-01T00:00:00+00:00"},  # a single-key dict, not a datetime
        "blob": b"",
        "day": date(1970, 1, 1),
        "at": datetime(1999, 12, 31, 23, 0, tzinfo=UTC),
        "maybe": "now set",
        "target": None,
    }
    [sample] = await env.create("samples", values)

    async def update(uow: af.UnitOfWork) -> None:
        uow.update("samples", sample, changes)

    await env.run(update)
    [created, updated] = await env.entries()
    got = created.mutations[0]["values"]
    assert got == {**values, "target": str(target)}
    assert {k: type(v) for k, v in got.items()} == {
        **{k: type(v) for k, v in values.items()},
        "target": str,
    }
    assert str(got["dec"]) == "12345678901234567890.10"  # exactly, not 12345678901234567890.1
    assert got["at"].utcoffset() == timedelta(hours=2)
    assert created.ref_map == {"0.target": str(target)}

    set_ = updated.mutations[0]["set"]
    assert set_ == changes
    assert {k: type(v) for k, v in set_.items()} == {k: type(v) for k, v in changes.items()}
    assert str(set_["dec"]) == str(changes["dec"])
    assert updated.ref_map is None  # a reference set to None refers to nothing
    # What was stored matches what the payload says.
    [row] = await env.find("samples")
    for name, value in changes.items():
        assert row[name] == value, name


@pytest.mark.parametrize(
    ("column", "given", "stored"),
    [
        pytest.param(
            "at",
            datetime(2024, 1, 1, 12, 0),  # naive: means UTC with naive_datetimes="utc"
            datetime(2024, 1, 1, 12, 0, tzinfo=UTC),
            id="naive-datetime",
        ),
        pytest.param("dec", 5, Decimal(5), id="int-for-decimal"),
        pytest.param("code", "plain", "plain", id="string"),
    ],
)
async def test_payload_carries_the_stored_value(
    url: str,
    target: Target,
    make_env: MakeEnv,
    column: str,
    given: Any,
    stored: Any,
) -> None:
    """Values the codec accepts in a convenient form travel as what was
    stored: a consumer must not have to guess the time zone of a naive
    datetime, or get an int for a decimal column."""
    async with af.connect(
        url, backend=target.backend, outbox=True, naive_datetimes="utc", pool_size=2
    ) as db:
        env = await make_env(TYPES, db)
        values = {
            "s": "s",
            "i": 1,
            "big": 1,
            "dec": Decimal("1.5"),
            "flag": True,
            "doc": {},
            "blob": b"",
            "day": date(2024, 1, 1),
            "at": datetime(2024, 1, 1, tzinfo=UTC),
            "code": "c",
        }
        await env.create("samples", {**values, column: given})
        [row] = await env.find("samples")
        assert row[column] == stored
        assert type(row[column]) is type(stored)
        [entry] = await env.entries()
        sent = entry.mutations[0]["values"][column]
        assert sent == stored
        assert type(sent) is type(stored)
        assert getattr(sent, "tzinfo", None) == getattr(stored, "tzinfo", None)


async def test_ref_map_entries(shop: Env) -> None:
    """The reference's case: a reference written in mutation i under column c
    is listed as "i.c" -> the referenced row's external id, however the
    reference was given (RowId read back, RowId just created, id string)."""
    [alice] = await shop.create("accounts", {"owner": "alice"})
    [read_back] = await shop.find("accounts")  # carries version and internal id
    assert read_back["id"].internal_id is not None
    shop.start = await shop.db.outbox.latest()

    async def unit(uow: af.UnitOfWork) -> af.RowId:
        bob = uow.create("accounts", {"owner": "bob"})
        uow.create("transfers", {"src": read_back["id"], "dst": bob, "amount": 1})
        uow.create("transfers", {"src": str(alice), "dst": None, "amount": 2})
        return bob

    bob = await shop.run(unit)
    [entry] = await shop.entries()
    assert entry.ref_map == {"1.src": str(alice), "1.dst": str(bob), "2.src": str(alice)}
    assert entry.mutations[1]["values"] == {"src": str(alice), "dst": str(bob), "amount": 1}
    assert entry.mutations[2]["values"] == {"src": str(alice), "dst": None, "amount": 2}

    transfer = (await shop.find("transfers", where={"amount": 2}))[0]["id"]

    async def repoint(uow: af.UnitOfWork) -> None:
        uow.update("transfers", transfer, {"dst": bob})

    await shop.run(repoint)
    second = (await shop.entries())[-1]
    assert second.ref_map == {"0.dst": str(bob)}

    await shop.run(lambda uow: _touch(uow, alice))
    assert (await shop.entries())[-1].ref_map is None  # no reference, no map


# -- reading ------------------------------------------------------------------


async def test_list_pages_with_after_and_limit(shop: Env) -> None:
    uow_ids = await shop.one_unit_per_row(7)
    everything = await shop.db.outbox.list(after=shop.start, limit=100)
    assert [e.uow_id for e in everything] == uow_ids
    pages = []
    after = shop.start
    while page := await shop.db.outbox.list(after=after, limit=3):
        pages.append(page)
        after = page[-1].versionstamp
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [e for p in pages for e in p] == everything
    stamps = [e.versionstamp for e in everything]
    assert stamps == sorted(stamps) and len(set(stamps)) == 7
    # The reference's case: after the first, limit 1 -> the second.
    assert await shop.db.outbox.list(after=stamps[0], limit=1) == [everything[1]]
    assert await shop.db.outbox.list(after=stamps[-1]) == []
    assert len(await shop.db.outbox.list(after=shop.start, limit=10_000)) == 7
    if shop.start is None:
        assert await shop.db.outbox.list() == everything
    for entry in everything:
        assert entry.created_at.tzinfo is not None


@pytest.mark.parametrize("limit", [0, -1, 10_001, "10", 1.5, True, None])
async def test_list_limit_validation(odb: af.Database, limit: Any) -> None:
    with pytest.raises(af.ValidationError):
        await odb.outbox.list(limit=limit)


@pytest.mark.parametrize(
    "after",
    ["", "xyz", "0" * 23, "0" * 25, "A" * 24, "g" * 24, " " + "0" * 23, 5, b"0" * 24],
)
async def test_list_malformed_after(odb: af.Database, after: Any) -> None:
    with pytest.raises(af.ValidationError):
        await odb.outbox.list(after=after)
    with pytest.raises(af.ValidationError):
        await odb.outbox.tail(after=after).__anext__()


async def test_find_by_uow_id_and_idempotency_key(shop: Env) -> None:
    key = f"order-{uuid.uuid4().hex}"
    [row_id] = await shop.run(lambda uow: _create_many(uow, [{"owner": "k"}]), idempotency_key=key)
    seen: list[str] = []

    async def unit(uow: af.UnitOfWork) -> None:
        seen.append(uow.uow_id)
        uow.update("accounts", row_id, {"note": "n"})

    await shop.run(unit)
    found = await shop.db.outbox.find(key)
    assert found is not None
    assert found.uow_id == key
    assert found.mutations[0]["external_id"] == str(row_id)
    other = await shop.db.outbox.find(seen[0])
    assert other is not None and other.mutations[0]["set"] == {"note": "n"}
    assert await shop.entries() == [found, other]
    assert await shop.db.outbox.find(f"missing-{uuid.uuid4().hex}") is None
    now = await shop.db.now()
    assert found.created_at.tzinfo is not None
    assert abs(found.created_at - now) < timedelta(minutes=1)


async def test_tail_follows_new_entries(shop: Env) -> None:
    send, receive = anyio.create_memory_object_stream[OutboxEntry](100)

    async def follow() -> None:
        async for entry in shop.db.outbox.tail(after=shop.start, poll_interval=0.01):
            await send.send(entry)

    async def next_ids(n: int) -> list[str]:
        with anyio.fail_after(10):
            return [(await receive.receive()).uow_id for _ in range(n)]

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        first = await shop.one_unit_per_row(3, "a")
        assert await next_ids(3) == first
        await anyio.sleep(0.05)  # the tail is now idle, polling
        second = await shop.one_unit_per_row(2, "b")
        assert await next_ids(2) == second
        tg.cancel_scope.cancel()
    with pytest.raises(anyio.WouldBlock):
        receive.receive_nowait()  # nothing delivered twice
    # A tail from the middle starts after that entry.
    entries = await shop.entries()
    tail = shop.db.outbox.tail(after=entries[2].versionstamp, batch_size=1)
    assert [await tail.__anext__() for _ in range(2)] == entries[3:]
    await tail.aclose()


# -- consumers ----------------------------------------------------------------


async def test_consumer_lag_and_position(shop: Env, new_consumer: NewConsumer) -> None:
    fresh = shop.db.outbox.consumer(f"never-ran-{uuid.uuid4().hex}")
    assert await fresh.position() is None
    consumer = await new_consumer(shop)
    assert await consumer.position() == shop.start
    assert await consumer.lag() == 0
    await shop.one_unit_per_row(4)
    entries = await shop.entries()
    assert await consumer.lag() == 4
    assert await fresh.lag() >= 4
    got: list[str] = []

    async def handle(entry: OutboxEntry) -> None:
        got.append(entry.uow_id)

    assert await consumer.run(handle, until_caught_up=True, batch_size=3) == 4
    assert got == [e.uow_id for e in entries]
    assert await consumer.position() == entries[-1].versionstamp
    assert await consumer.lag() == 0
    assert await consumer.run(handle, until_caught_up=True) == 0
    await shop.one_unit_per_row(1)
    assert await consumer.lag() == 1


MODES = pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])


@MODES
async def test_two_workers_of_one_consumer_never_deliver_an_entry_twice(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    await shop.one_unit_per_row(12)
    consumer = await new_consumer(shop)
    twin = shop.db.outbox.consumer(consumer.name)
    delivered: list[str] = []
    by_worker: Counter[str] = Counter()
    last_worker: list[str] = []
    in_flight = 0
    most_in_flight = 0
    stop = {"A": False, "B": False}
    reached = anyio.Event()
    wanted = 0

    def handler(worker: str) -> Callable[..., Awaitable[None]]:
        async def handle(entry: OutboxEntry, tx: Any = None) -> None:
            nonlocal in_flight, most_in_flight
            in_flight += 1
            most_in_flight = max(most_in_flight, in_flight)
            await anyio.sleep(0.002)
            delivered.append(entry.versionstamp)
            by_worker[worker] += 1
            last_worker[:] = [worker]
            in_flight -= 1
            if len(delivered) >= wanted:
                reached.set()

        return handle

    async def work(worker: str, c: Consumer) -> None:
        await c.run(
            handler(worker),
            stop=lambda: stop[worker],
            poll_interval=0.01,
            batch_size=4,
            transactional=transactional,
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            wanted = 20
            tg.start_soon(work, "A", consumer)
            tg.start_soon(work, "B", twin)
            await shop.one_unit_per_row(8, "during")
            await reached.wait()
            # Stop whichever worker holds the lease: the other must take over.
            holder = last_worker[0]
            other = "B" if holder == "A" else "A"
            stop[holder] = True
            await anyio.sleep(0.05)
            reached = anyio.Event()
            wanted = 30
            await shop.one_unit_per_row(10, "after")
            await reached.wait()
            stop[other] = True

    entries = await shop.entries()
    assert delivered == [e.versionstamp for e in entries]
    assert len(delivered) == len(set(delivered)) == 30
    assert most_in_flight == 1
    assert by_worker[other] > 0
    assert await consumer.position() == entries[-1].versionstamp


async def test_transactional_effects_exactly_once_when_the_lease_expires(
    shop: Env, new_consumer: NewConsumer
) -> None:
    """Worker A's handler outlives its lease; worker B may take the consumer
    over and deliver the same entry. With ``transactional=True`` the effects
    still happen once: A's write commits only together with its cursor
    advance, which fails once the lease is B's."""
    await shop.one_unit_per_row(3)
    stamps = [e.versionstamp for e in await shop.entries()]
    consumer = await new_consumer(shop, lease=0.2)
    twin = shop.db.outbox.consumer(consumer.name, lease=0.2)
    table = shop.db.layout(SHOP, shop.namespace).table("transfers").identifier
    accounts = shop.db.layout(SHOP, shop.namespace).table("accounts").identifier
    stop = False
    a_stuck = anyio.Event()
    calls: Counter[str] = Counter()

    async def handle(entry: OutboxEntry, tx: af.Transaction) -> None:
        calls[entry.versionstamp] += 1
        src = await tx.fetch_value(af.sql("SELECT MIN({i}) FROM {t}", i=_ID, t=accounts))
        await tx.execute(
            af.sql(
                "INSERT INTO {t} ({i}, {s}, {a}, {v}) VALUES ({id}, {src}, {n}, 0)",
                t=table,
                i=af.Identifier("id"),
                s=af.Identifier("src"),
                a=af.Identifier("amount"),
                v=af.Identifier("_version"),
                id=entry.versionstamp,
                src=src,
                n=calls[entry.versionstamp],
            )
        )
        if entry.versionstamp == stamps[0] and not a_stuck.is_set():
            a_stuck.set()
            await anyio.sleep(0.5)  # well past the lease

    async def b_after_a() -> None:
        await a_stuck.wait()
        await twin.run(handle, transactional=True, stop=lambda: stop, poll_interval=0.02)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(b_after_a)
            tg.start_soon(
                lambda: consumer.run(
                    handle, transactional=True, stop=lambda: stop, poll_interval=0.02
                )
            )
            # Both runs end once stopped (A after its slow delivery).
            while await consumer.position() != stamps[-1]:  # noqa: ASYNC110 (polls the database)
                await anyio.sleep(0.02)
            stop = True

    rows = await shop.db.fetch(
        af.sql("SELECT {i} FROM {t} ORDER BY {i}", i=af.Identifier("id"), t=table)
    )
    assert [row["id"] for row in rows] == stamps  # each entry's effect exactly once
    assert await consumer.position() == stamps[-1]


_ID = af.Identifier("_id")


class Crash(BaseException):
    """Like KeyboardInterrupt: not an Exception, so not retried."""


@MODES
async def test_handler_raising_base_exception_mid_batch_is_redelivered(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    await shop.one_unit_per_row(5)
    entries = await shop.entries()
    stamps = [e.versionstamp for e in entries]
    consumer = await new_consumer(shop)
    got: list[str] = []

    async def crash_on_third(entry: OutboxEntry, tx: Any = None) -> None:
        if entry.versionstamp == stamps[2]:
            raise Crash
        got.append(entry.versionstamp)

    with pytest.raises(Crash):
        await consumer.run(
            crash_on_third, batch_size=10, poll_interval=0.01, transactional=transactional
        )
    assert got == stamps[:2]
    assert await consumer.position() == stamps[1]  # past the entries that returned
    assert await consumer.lag() == 3

    # A new run (the lease was released, so it need not wait) redelivers the rest.
    again: list[str] = []

    async def record(entry: OutboxEntry, tx: Any = None) -> None:
        again.append(entry.versionstamp)

    assert await consumer.run(record, until_caught_up=True, transactional=transactional) == 3
    assert again == stamps[2:]


@MODES
async def test_handler_cancelled_mid_batch_is_redelivered(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    await shop.one_unit_per_row(5)
    stamps = [e.versionstamp for e in await shop.entries()]
    consumer = await new_consumer(shop)
    got: list[str] = []
    stuck = anyio.Event()

    async def hang_on_third(entry: OutboxEntry, tx: Any = None) -> None:
        if entry.versionstamp == stamps[2]:
            stuck.set()
            await anyio.sleep_forever()
        got.append(entry.versionstamp)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: consumer.run(
                    hang_on_third, batch_size=10, poll_interval=0.01, transactional=transactional
                )
            )
            await stuck.wait()
            tg.cancel_scope.cancel()
    assert got == stamps[:2]
    assert await consumer.position() == stamps[1]

    again: list[str] = []

    async def record(entry: OutboxEntry, tx: Any = None) -> None:
        again.append(entry.versionstamp)

    with anyio.fail_after(10):
        assert await consumer.run(record, until_caught_up=True, transactional=transactional) == 3
    assert again == stamps[2:]


@MODES
async def test_dead_letter_after_n_failures(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    await shop.one_unit_per_row(4)
    entries = await shop.entries()
    bad = entries[1]
    consumer = await new_consumer(shop)
    calls: Counter[str] = Counter()
    got: list[str] = []

    async def handle(entry: OutboxEntry, tx: Any = None) -> None:
        calls[entry.versionstamp] += 1
        if entry.versionstamp == bad.versionstamp:
            raise ValueError(f"cannot handle {entry.uow_id}")
        got.append(entry.versionstamp)

    await consumer.run(
        handle,
        until_caught_up=True,
        max_attempts=3,
        retry_delay=0.001,
        transactional=transactional,
    )
    assert calls[bad.versionstamp] == 3
    assert got == [e.versionstamp for e in entries if e is not bad]
    assert await consumer.position() == entries[-1].versionstamp
    assert await consumer.lag() == 0
    [letter] = await consumer.dead_letters()
    assert letter.consumer == consumer.name
    assert letter.versionstamp == bad.versionstamp
    assert letter.uow_id == bad.uow_id
    assert letter.attempts == 3
    assert letter.error == f"ValueError: cannot handle {bad.uow_id}"
    assert letter.entry["payload"] == bad.payload
    assert letter.entry["versionstamp"] == bad.versionstamp
    assert letter.created_at.tzinfo is not None
    # Another consumer has its own dead letters (none).
    assert await (await new_consumer(shop)).dead_letters() == []


@pytest.mark.parametrize(
    "transactional",
    [
        pytest.param(
            False,
        ),
        True,
    ],
    ids=["plain", "transactional"],
)
async def test_run_returns_the_number_delivered_without_dead_letters(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    """``run`` "returns how many entries were delivered": a dead-lettered
    entry's handler never succeeded, so it is not counted — in both modes."""
    await shop.one_unit_per_row(4)
    bad = (await shop.entries())[1]
    consumer = await new_consumer(shop)

    async def handle(entry: OutboxEntry, tx: Any = None) -> None:
        if entry.versionstamp == bad.versionstamp:
            raise ValueError("no")

    delivered = await consumer.run(
        handle, until_caught_up=True, max_attempts=1, transactional=transactional
    )
    assert len(await consumer.dead_letters()) == 1
    assert delivered == 3


@MODES
async def test_halt_stops_before_the_failing_entry(
    shop: Env, new_consumer: NewConsumer, transactional: bool
) -> None:
    await shop.one_unit_per_row(4)
    entries = await shop.entries()
    bad = entries[2]
    consumer = await new_consumer(shop)
    got: list[str] = []

    async def handle(entry: OutboxEntry, tx: Any = None) -> None:
        if entry.versionstamp == bad.versionstamp:
            raise RuntimeError("broken")
        got.append(entry.versionstamp)

    with pytest.raises(ConsumerHalted) as halted:
        await consumer.run(
            handle,
            on_failure="halt",
            max_attempts=2,
            retry_delay=0.001,
            transactional=transactional,
        )
    assert halted.value.versionstamp == bad.versionstamp
    assert isinstance(halted.value, af.Error)
    assert got == [e.versionstamp for e in entries[:2]]
    assert await consumer.position() == entries[1].versionstamp
    assert await consumer.lag() == 2
    assert await consumer.dead_letters() == []
    # It halts there again, and delivers on once the handler works.
    with pytest.raises(ConsumerHalted):
        await consumer.run(handle, on_failure="halt", max_attempts=1, until_caught_up=True)

    async def fixed(entry: OutboxEntry, tx: Any = None) -> None:
        got.append(entry.versionstamp)

    assert await consumer.run(fixed, until_caught_up=True, transactional=transactional) == 2
    assert got == [e.versionstamp for e in entries]


async def test_transactional_handler_failure_leaves_neither_write_nor_advance(
    shop: Env, new_consumer: NewConsumer
) -> None:
    await shop.one_unit_per_row(3)
    entries = await shop.entries()
    stamps = [e.versionstamp for e in entries]
    consumer = await new_consumer(shop)
    table = shop.db.layout(SHOP, shop.namespace).table("accounts").identifier
    owner = af.Identifier("owner")
    note = af.Identifier("note")
    attempts: Counter[str] = Counter()

    async def handle(entry: OutboxEntry, tx: af.Transaction) -> None:
        attempts[entry.versionstamp] += 1
        # The handler's own write, in the delivery's transaction.
        await tx.execute(
            af.sql(
                "INSERT INTO {t} ({i}, {o}, {b}, {n}, {v}) VALUES ({id}, {who}, 0, {vs}, 0)",
                t=table,
                i=af.Identifier("id"),
                o=owner,
                b=af.Identifier("balance"),
                n=note,
                v=af.Identifier("_version"),
                id=uuid.uuid4().hex,
                who="handled",
                vs=entry.versionstamp,
            )
        )
        if entry.versionstamp == stamps[1] and attempts[entry.versionstamp] <= 2:
            raise RuntimeError("fails after writing")

    async def handled() -> list[str]:
        rows = await shop.db.fetch(
            af.sql(
                "SELECT {n} FROM {t} WHERE {o} = {who} ORDER BY {n}",
                n=note,
                t=table,
                o=owner,
                who="handled",
            )
        )
        return [row["note"] for row in rows]

    with pytest.raises(ConsumerHalted):
        await consumer.run(
            handle, transactional=True, on_failure="halt", max_attempts=1, until_caught_up=True
        )
    assert await handled() == stamps[:1]  # the failed delivery's write is gone
    assert await consumer.position() == stamps[0]  # and the cursor did not move

    # Fails once more, then succeeds within one run: its write is there once.
    assert (
        await consumer.run(handle, transactional=True, until_caught_up=True, retry_delay=0.001) == 2
    )
    assert attempts[stamps[1]] == 3
    assert await handled() == stamps
    assert await consumer.position() == stamps[-1]
    assert await consumer.dead_letters() == []


async def test_consumer_argument_validation(odb: af.Database) -> None:
    consumer = odb.outbox.consumer(f"validation-{uuid.uuid4().hex}")

    async def handle(entry: OutboxEntry) -> None:
        raise AssertionError("never called")

    for bad in ({"batch_size": 0}, {"batch_size": 10_001}, {"max_attempts": 0}):
        with pytest.raises(af.ValidationError):
            await consumer.run(handle, until_caught_up=True, **bad)
    with pytest.raises(af.ValidationError):
        await consumer.run(handle, on_failure="ignore", until_caught_up=True)  # type: ignore[arg-type]
    for name in ("", "x" * 256, 5):
        with pytest.raises(af.ValidationError):
            odb.outbox.consumer(name)  # type: ignore[arg-type]


# -- edges of the versionstamp and its counter -----------------------------------


async def test_unit_with_more_writes_than_versionstamp_indexes(
    target: Target, make_env: MakeEnv
) -> None:
    """A versionstamp has a 2-byte index, so a unit can carry 65,536 outbox
    mutations. One more is bad input: af.ValidationError, nothing written.
    (Dialect-independent core code, and slow: run on one target.)"""
    if str(target) != "sqlite-asyncio":
        pytest.skip("checked in the core; one target is enough")
    env = await make_env(SHOP)

    async def huge(uow: af.UnitOfWork) -> None:
        for n in range(65_537):
            uow.create("accounts", {"owner": f"o{n}"})

    with pytest.raises(af.ValidationError):
        await env.run(huge)
    assert await env.find("accounts", limit=1) == []
    assert await env.entries() == []


async def _delete_counter(db: af.Database) -> None:
    await db.execute(
        af.sql(
            "DELETE FROM {t} WHERE {k} = {key}",
            t=SETTINGS,
            k=af.Identifier("key"),
            key="outbox.version",
        )
    )


async def test_first_reservation_without_a_counter_row_is_version_one(
    fresh_db: af.Database, target: Target, request: pytest.FixtureRequest
) -> None:
    """The writer creates a missing counter row itself (the insert branch of
    its upsert): on an empty outbox the versions are then 1, 2, 3."""
    db = fresh_db
    await db.migrate(SHOP)
    await _delete_counter(db)
    assert await db.outbox.latest() is None
    stamps: list[str | None] = []
    hooks = af.UowHooks(after_mutation=lambda uow: stamps.append(uow.versionstamp))
    for n in range(3):
        await db.execute_uow(lambda uow, n=n: _create_one(uow, f"o{n}"), schema=SHOP, hooks=hooks)
    entries = await db.outbox.list()
    assert [version_of(e.versionstamp) for e in entries] == [1, 2, 3]
    # The payload got the same version as the row, on both branches too.
    assert [e.mutations[0]["versionstamp"] for e in entries] == [e.versionstamp for e in entries]
    # What the unit reports is what it wrote, on both branches of the upsert.
    assert [e.versionstamp for e in entries] == [stamp_of(v) for v in (1, 2, 3)]
    assert stamps == [at_commit(db, e) for e in entries]


async def test_migrate_recreates_a_missing_counter_after_the_last_version(
    fresh_db: af.Database,
) -> None:
    """Migrations are self-healing: a counter row lost while the outbox has
    entries is re-created after the newest one, not at 0."""
    db = fresh_db
    await db.migrate(SHOP)
    for n in range(3):
        await db.execute_uow(lambda uow, n=n: _create_one(uow, f"o{n}"), schema=SHOP)
    await _delete_counter(db)
    await db.migrate(SHOP)
    await db.execute_uow(lambda uow: _create_one(uow, "after"), schema=SHOP)
    assert [version_of(e.versionstamp) for e in await db.outbox.list()] == [1, 2, 3, 4]


async def test_outbox_columns_of_the_general_json_type_still_work(fresh_db: af.Database) -> None:
    """Outbox payloads are stored as ``json_document`` (PostgreSQL: json, kept
    as written, so reading does not print jsonb back to text). Outbox tables
    created before that used the general ``json`` type (jsonb); migrate leaves
    them as they are, and writing and reading must work on them unchanged."""
    db = fresh_db
    types = db._engine.adapter.ddl.types
    if types["json"] == types["json_document"]:
        pytest.skip(f"{db.name} stores outbox payloads as {types['json']} either way")
    await db.migrate(SHOP)
    quote = db._engine.compiler.quote_identifier
    await db.execute(
        db._engine.raw(
            f"ALTER TABLE {quote(OUTBOX)} "
            f"ALTER COLUMN {quote('payload')} TYPE {types['json']}, "
            f"ALTER COLUMN {quote('ref_map')} TYPE {types['json']}"
        )
    )
    await db.migrate(SHOP)

    async def pay(uow: af.UnitOfWork) -> None:
        src = uow.create("accounts", {"owner": "a", "balance": 10})
        uow.create("transfers", {"src": src, "amount": 2**60})

    await db.execute_uow(pay, schema=SHOP, idempotency_key="old-columns")
    (entry,) = await db.outbox.list()
    assert entry == await db.outbox.find("old-columns")
    created = [m["values"] for m in entry.mutations]
    assert created[0]["owner"] == "a"
    assert created[1]["amount"] == 2**60  # a tagged value survives the column
    assert entry.ref_map == {"1.src": created[1]["src"]}
