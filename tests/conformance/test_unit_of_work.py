"""The unit of work on every backend and runtime: the reference scenarios,
retrieval (where, order, keyset pagination), mutations and optimistic
concurrency, validation, references, retries, hooks, dry runs and the SQL
cache. Every test runs against a real database in a namespace of its own,
dropped afterwards."""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.schema import tables_in_dependency_order
from aiofragno.session import Session

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
        af.Reference("dst", "accounts"),
        af.Column("amount", "bigint"),
    ),
    af.Table(
        "people",
        af.Column("email", "string"),
        af.Reference("account", "accounts", nullable=True),
        af.Index("by_email", ["email"], unique=True),
    ),
)

ITEMS = af.Schema(
    "items",
    af.Table(
        "items",
        af.Column("name", "string"),
        af.Column("qty", "bigint"),
        af.Column("tag", "string", nullable=True),
    ),
    af.Table("others", af.Column("name", "string")),
)

TREE = af.Schema(
    "tree",
    af.Table(
        "nodes",
        af.Column("label", "string"),
        af.Reference("parent", "nodes", nullable=True),
    ),
)

LINKS = af.Schema(
    "links",
    af.Table("targets", af.Column("name", "string")),
    af.Table(
        "links",
        af.Column("label", "string"),
        af.Reference("a", "targets", nullable=True),
        af.Reference("b", "targets", nullable=True),
    ),
)

Unit = Callable[[af.UnitOfWork], Awaitable[Any]]


def new_namespace() -> str:
    return f"ns{uuid.uuid4().hex[:8]}"


async def drop_namespace(db: af.Database, schema: af.Schema, namespace: str) -> None:
    """Drop what ``db.migrate(schema, namespace=namespace)`` created."""
    if db.closed:
        return
    layout = db.layout(schema, namespace)
    if layout.db_schemas:
        for name in layout.db_schemas:
            await db.execute(af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name)))
    else:
        for table in reversed(list(tables_in_dependency_order(schema))):
            await db.execute(
                af.sql("DROP TABLE IF EXISTS {t}", t=layout.table(table.name).identifier)
            )
    await db.execute(
        af.sql(
            "DELETE FROM {t} WHERE {k} LIKE {p}",
            t=af.Identifier("fragno_db_settings"),
            k=af.Identifier("key"),
            p=f"{namespace}.%",
        )
    )


class Env:
    """One migrated schema in a fresh namespace of one database."""

    def __init__(self, db: af.Database, schema: af.Schema, namespace: str) -> None:
        self.db = db
        self.schema = schema
        self.namespace = namespace

    async def run(self, fn: Unit, **options: Any) -> Any:
        return await self.db.execute_uow(
            fn, schema=self.schema, namespace=self.namespace, **options
        )

    def ident(self, table: str) -> af.Identifier:
        return self.db.layout(self.schema, self.namespace).table(table).identifier

    @property
    def catalog(self) -> Any:
        return self.db._catalog(self.schema, self.namespace)

    async def count(self, table: str) -> int:
        value = await self.db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=self.ident(table)))
        return int(value)

    async def raw_rows(self, table: str) -> list[dict[str, Any]]:
        rows = await self.db.fetch(
            af.sql("SELECT * FROM {t} ORDER BY {i}", t=self.ident(table), i=af.Identifier("_id"))
        )
        return [dict(row) for row in rows]

    async def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every stored row (hidden columns included) of every table."""
        return {
            name: [tuple(row.values()) for row in await self.raw_rows(name)]
            for name in self.schema.tables
        }

    async def version(self, table: str, row_id: str) -> int | None:
        value = await self.db.fetch_value(
            af.sql(
                "SELECT {v} FROM {t} WHERE {i} = {x}",
                v=af.Identifier("_version"),
                t=self.ident(table),
                i=af.Identifier("id"),
                x=str(row_id),
            )
        )
        return None if value is None else int(value)

    async def find(self, table: str, **kwargs: Any) -> Any:
        async def unit(uow: af.UnitOfWork) -> Any:
            op = uow.find(table, **kwargs)
            await uow.retrieve()
            return op.result

        return await self.run(unit)

    async def create(self, table: str, *rows: dict[str, Any]) -> list[af.RowId]:
        async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
            return [uow.create(table, values) for values in rows]

        return await self.run(unit)


MakeEnv = Callable[[af.Schema], Awaitable[Env]]


@pytest.fixture
async def make_env(db: af.Database) -> AsyncIterator[MakeEnv]:
    made: list[Env] = []

    async def make(schema: af.Schema) -> Env:
        env = Env(db, schema, new_namespace())
        made.append(env)
        await db.migrate(schema, namespace=env.namespace)
        return env

    yield make
    for env in reversed(made):
        await drop_namespace(db, env.schema, env.namespace)


@pytest.fixture
async def shop(make_env: MakeEnv) -> Env:
    return await make_env(SHOP)


@pytest.fixture
async def items(make_env: MakeEnv) -> Env:
    return await make_env(ITEMS)


async def seed_accounts(env: Env, *owners: str, balance: int = 100) -> dict[str, af.RowId]:
    """Create accounts; return their ids as read back (RowIds with version and
    internal id)."""
    await env.create("accounts", *({"owner": o, "balance": balance} for o in owners))
    rows = await env.find("accounts", where=af.c.owner.in_(owners))
    return {row["owner"]: row["id"] for row in rows}


async def read_account(env: Env, owner: str) -> dict[str, Any] | None:
    rows = await env.find("accounts", where={"owner": owner})
    assert len(rows) <= 1
    return rows[0] if rows else None


def stale(row_id: af.RowId, version: int = 999) -> af.RowId:
    """The same row at a version it does not have."""
    return af.RowId(str(row_id), version, row_id.internal_id)


# -- the reference scenarios --------------------------------------------------


async def test_transfer_scenario_from_the_design(shop: Env) -> None:
    await seed_accounts(shop, "alice", "bob")

    async def transfer(uow: af.UnitOfWork) -> af.RowId:
        a = uow.find_first("accounts", where={"owner": "alice"})
        b = uow.find_first("accounts", where={"owner": "bob"})
        await uow.retrieve()
        acc_a, acc_b = a.result, b.result
        uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - 5}, check=True)
        uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + 5}, check=True)
        return uow.create("transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": 5})

    new_id = await shop.run(transfer)
    assert isinstance(new_id, af.RowId)
    alice, bob = await read_account(shop, "alice"), await read_account(shop, "bob")
    assert alice is not None and bob is not None
    assert (alice["balance"], bob["balance"]) == (95, 105)
    [row] = await shop.find("transfers")
    assert row["id"] == new_id
    assert (row["src"], row["dst"], row["amount"]) == (alice["id"], bob["id"], 5)


async def test_a_unit_inside_a_callers_transaction_commits_on_its_own(shop: Env) -> None:
    """``execute_uow`` does not join a ``db.transaction()`` open in the same
    task: the unit runs and commits on a connection of its own, so rolling
    the caller's transaction back keeps the unit's writes and undoes only the
    caller's. It does wait for the locks the caller's transaction holds
    (on SQLite the unit is refused instead: see the next test)."""
    db = shop.db
    if db._engine.adapter.one_writer:
        pytest.skip("one writer: a unit with writes inside a transaction is refused")
    ids = await seed_accounts(shop, "alice")
    accounts = db.layout(SHOP, shop.namespace).table("accounts").identifier
    with pytest.raises(RuntimeError, match="the caller's"):
        async with db.transaction() as tx:
            # (By the unique id: a record lock only, no InnoDB gap lock that
            # the unit's insert would have to wait for.)
            touch = "UPDATE {t} SET note = 'caller' WHERE id = {id}"
            await tx.execute(af.sql(touch, t=accounts, id=str(ids["alice"])))
            [bob] = await shop.create("accounts", {"owner": "bob"})
            raise RuntimeError("roll back the caller's transaction")
    alice, found = await read_account(shop, "alice"), await read_account(shop, "bob")
    assert alice is not None and alice["note"] is None
    assert found is not None and found["id"] == bob


async def test_writes_inside_a_callers_transaction_are_refused_on_one_writer(
    shop: Env,
) -> None:
    """Where a transaction holds the database's one writer from BEGIN on
    (SQLite), a unit's mutation phase inside a ``db.transaction()`` of the
    same task could only wait for that transaction (until ``busy_timeout``,
    then again on every retry): it is refused at once with WouldDeadlock,
    before anything is written; its reads still run, and the caller's
    transaction goes on and commits."""
    db = shop.db
    if not db._engine.adapter.one_writer:
        pytest.skip("writers do not wait for a transaction that wrote nothing")
    ids = await seed_accounts(shop, "alice")
    accounts = db.layout(SHOP, shop.namespace).table("accounts").identifier
    seen: list[Any] = []

    async def rename(uow: af.UnitOfWork) -> None:
        row = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        seen.append(row.result["id"])
        uow.update("accounts", row.result["id"], {"note": "unit"}, check=True)

    async def read(uow: af.UnitOfWork) -> int:
        count = uow.count("accounts")
        await uow.retrieve()
        return int(count.result)

    started = time.monotonic()
    async with db.transaction() as tx:
        with pytest.raises(af.WouldDeadlock, match=r"db\.transaction\(\) is open"):
            await shop.run(rename)
        assert await shop.run(read) == 1
        touch = "UPDATE {t} SET note = 'caller' WHERE id = {id}"
        await tx.execute(af.sql(touch, t=accounts, id=str(ids["alice"])))
    assert time.monotonic() - started < db.options.busy_timeout
    assert seen == [ids["alice"]]  # the reads ran, once: a refusal is not retried
    alice = await read_account(shop, "alice")
    assert alice is not None and alice["note"] == "caller"
    assert alice["id"].version == ids["alice"].version


async def test_a_task_started_in_a_transaction_writes_units_after_it(shop: Env) -> None:
    """A task started inside a ``db.transaction()`` inherits it; once it has
    ended, the task's units with writes run (not refused as waiting for a
    transaction that is gone, on a one-writer database)."""
    db = shop.db
    ended = anyio.Event()
    created: list[af.RowId] = []

    async def late() -> None:
        await ended.wait()
        created.extend(await shop.create("accounts", {"owner": "late"}))

    async with anyio.create_task_group() as tg:
        async with db.transaction():
            tg.start_soon(late)
        ended.set()
    found = await read_account(shop, "late")
    assert found is not None and found["id"] == created[0]


async def test_version_bump_on_update(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    first = ids["alice"]
    assert first.version == 0
    assert first.internal_id is not None

    async def bump(uow: af.UnitOfWork) -> None:
        row = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        uow.update("accounts", row.result["id"], {"note": "checked"}, check=True)

    await shop.run(bump)
    after_checked = await read_account(shop, "alice")
    assert after_checked is not None
    assert after_checked["id"].version == 1
    assert after_checked["note"] == "checked"

    # Unchecked updates bump the version too, also when given a plain id string.
    async def unchecked(uow: af.UnitOfWork) -> None:
        uow.update("accounts", str(first), {"balance": 7})

    await shop.run(unchecked)
    row = await read_account(shop, "alice")
    assert row is not None
    assert row["id"].version == 2
    assert row["balance"] == 7
    assert row["id"] == first  # the external id never changes
    assert await shop.version("accounts", first) == 2


async def test_stale_update_fails_as_conflict_and_changes_nothing(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob")
    stale_alice = ids["alice"]  # read at version 0

    async def concurrent(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"balance": 50}, check=True)

    await shop.run(concurrent)  # alice is now at version 1
    before = await shop.snapshot()

    async def late(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["bob"], {"balance": 0}, check=True)  # fresh: would apply
        uow.update("accounts", stale_alice, {"balance": 1}, check=True)  # stale
        uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 1})

    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(late, retry=af.NoRetry())
    assert caught.value.attempts == 1
    assert "accounts" in str(caught.value)
    assert await shop.snapshot() == before
    alice = await read_account(shop, "alice")
    assert alice is not None and alice["balance"] == 50 and alice["id"].version == 1


async def test_failed_check_rolls_back_create_in_same_unit(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob")

    async def bump(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"note": "moved on"})

    await shop.run(bump)
    before = await shop.snapshot()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 3})
        uow.create("accounts", {"owner": "carol"})
        uow.check("accounts", ids["alice"])  # still at version 0: stale

    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(unit, retry=af.NoRetry())
    assert await shop.snapshot() == before
    assert await shop.count("transfers") == 0
    assert await read_account(shop, "carol") is None


async def test_conflict_wins_over_an_error_later_in_the_batch(shop: Env) -> None:
    """The mutation phase goes to the database as one batch; a stale check
    early in it is reported as the conflict it is (and retried), even when a
    statement after it fails — the failure may well be a consequence of the
    stale read."""
    ids = await seed_accounts(shop, "alice")
    await shop.create("people", {"email": "taken@example.com"})

    async def bump(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"note": "moved on"})

    await shop.run(bump)
    before = await shop.snapshot()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"balance": 0}, check=True)  # stale
        uow.create("people", {"email": "taken@example.com"})  # unique violation

    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(unit, retry=af.NoRetry())
    assert caught.value.attempts == 1
    assert await shop.snapshot() == before

    async def fresh_unit(uow: af.UnitOfWork) -> None:
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        uow.update("accounts", alice.result["id"], {"balance": 0}, check=True)
        uow.create("people", {"email": "taken@example.com"})

    with pytest.raises(af.UniqueViolation):
        await shop.run(fresh_unit, retry=af.NoRetry())  # not stale: the error is real
    assert await shop.snapshot() == before


class SentBatches:
    """The statements each mutation-phase batch carried to the driver (with
    COMMIT, where the engine checks the results in this process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[list[str]] = []
        execute_batch, commit = Session.execute_batch, Session.commit

        async def spying(self_: Session, queries: Any, stop: Any = None) -> Any:
            if self_.in_transaction:  # (the retrieval phase runs outside one)
                self.batches.append([q.sql for q in queries])
            return await execute_batch(self_, queries, stop)

        async def spying_commit(self_: Session, queries: Any = (), stop: Any = None) -> Any:
            if stop is not None:  # (the writes, checked on the way)
                self.batches.append([q.sql for q in queries])
            return await commit(self_, queries, stop)

        monkeypatch.setattr(Session, "execute_batch", spying)
        monkeypatch.setattr(Session, "commit", spying_commit)

    def combined(self) -> bool:
        """Whether a phase since the last call went out as one statement (a
        failed one is retried statement by statement)."""
        batches, self.batches = self.batches, []
        return any(len(b) == 1 and b[0].startswith("WITH q0 AS") for b in batches)


async def test_independent_operations_travel_as_one_statement(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the database has data-modifying WITH, a phase whose operations
    touch different rows is one statement; the outcome is the same as one
    statement per operation, conflicts included."""
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    sent = SentBatches(monkeypatch)

    async def transfer(uow: af.UnitOfWork) -> af.RowId:
        uow.update("accounts", ids["alice"], {"balance": 90}, check=True)
        uow.update("accounts", ids["bob"], {"balance": 110, "note": None}, check=True)
        uow.check("accounts", ids["carol"])
        return uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 10})

    await shop.run(transfer, retry=af.NoRetry())
    combined = shop.db._engine.adapter.supports_writable_cte
    assert [len(batch) for batch in sent.batches] == [1 if combined else 4]
    assert sent.combined() is combined
    assert (await read_account(shop, "alice") or {})["balance"] == 90
    assert (await read_account(shop, "bob") or {})["balance"] == 110
    assert await shop.version("accounts", ids["alice"]) == 1
    assert await shop.version("accounts", ids["carol"]) == 0  # a check is not a write
    assert await shop.count("transfers") == 1
    before = await shop.snapshot()

    async def pay(uow: af.UnitOfWork, a: af.RowId, b: af.RowId, c: af.RowId) -> None:
        uow.update("accounts", a, {"balance": 0}, check=True)
        uow.update("accounts", b, {"balance": 0}, check=True)
        uow.check("accounts", c)

    async def current(owner: str) -> af.RowId:
        row = await read_account(shop, owner)
        assert row is not None
        return row["id"]  # type: ignore[no-any-return]

    # A stale update between two current operations...
    alice, carol = await current("alice"), await current("carol")
    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(lambda uow: pay(uow, alice, ids["bob"], carol), retry=af.NoRetry())
    assert await shop.snapshot() == before

    # ...and a stale check after two current updates: nothing is written.
    async def touch_carol(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["carol"], {"note": "touched"})

    await shop.run(touch_carol)
    before = await shop.snapshot()
    bob = await current("bob")
    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(lambda uow: pay(uow, alice, bob, carol), retry=af.NoRetry())
    assert await shop.snapshot() == before


async def test_operations_that_depend_on_each_other_run_one_by_one(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row written twice, a reference to a row the unit creates, a delete:
    these run statement by statement, in the order queued."""
    ids = await seed_accounts(shop, "alice", "bob")
    sent = SentBatches(monkeypatch)

    async def twice(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"balance": 1})
        uow.update("accounts", ids["alice"], {"note": "second"})

    await shop.run(twice)
    assert not sent.combined()
    alice = await read_account(shop, "alice")
    assert alice is not None and (alice["balance"], alice["note"]) == (1, "second")
    assert await shop.version("accounts", ids["alice"]) == 2

    async def open_and_pay(uow: af.UnitOfWork) -> None:
        carol = uow.create("accounts", {"owner": "carol"})
        uow.create("transfers", {"src": ids["bob"], "dst": carol, "amount": 5})

    await shop.run(open_and_pay)
    assert not sent.combined()
    assert await shop.count("transfers") == 1

    async def add_person(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("people", {"email": "old@example.com"})

    old = await shop.run(add_person)

    async def close_bob(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"note": "third"})
        uow.delete("people", old)
        uow.create("people", {"email": "bob@example.com"})

    await shop.run(close_bob)
    assert not sent.combined()


async def test_created_ids_returned_in_order(shop: Env) -> None:
    owners = [f"owner{i}" for i in range(7)]

    async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
        return [uow.create("accounts", {"owner": o, "balance": i}) for i, o in enumerate(owners)]

    created = await shop.run(unit)
    assert len(created) == len(owners)
    assert len(set(created)) == len(owners)
    assert all(isinstance(i, af.RowId) for i in created)
    rows = await shop.find("accounts")  # no order_by: creation order
    assert [row["id"] for row in rows] == created
    assert [row["owner"] for row in rows] == owners
    assert [row["balance"] for row in rows] == list(range(len(owners)))
    by_id = {row["id"]: row["owner"] for row in rows}
    assert [by_id[i] for i in created] == owners


async def test_references_to_rows_created_in_the_same_unit(shop: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> tuple[af.RowId, ...]:
        a = uow.create("accounts", {"owner": "alice"})
        b = uow.create("accounts", {"owner": "bob"})
        t = uow.create("transfers", {"src": a, "dst": b, "amount": 9})
        p = uow.create("people", {"email": "a@example.com", "account": a})
        # A row created in this unit can be updated in it, checked at its version.
        uow.update("accounts", a, {"balance": 1}, check=True)
        return a, b, t, p

    a, b, t, p = await shop.run(unit)
    [transfer] = await shop.find("transfers")
    assert transfer["id"] == t
    assert (transfer["src"], transfer["dst"], transfer["amount"]) == (a, b, 9)
    [person] = await shop.find("people")
    assert person["id"] == p and person["account"] == a
    alice = await read_account(shop, "alice")
    assert alice is not None and alice["balance"] == 1 and alice["id"].version == 1
    # The stored references are the rows' internal ids.
    accounts = {row["id"]: row["_id"] for row in await shop.raw_rows("accounts")}
    [raw] = await shop.raw_rows("transfers")
    assert (raw["src"], raw["dst"]) == (accounts[a], accounts[b])
    assert transfer["src"].internal_id == accounts[a]


async def test_count(items: Env) -> None:
    async def empty(uow: af.UnitOfWork) -> int:
        n = uow.count("items")
        await uow.retrieve()
        return n.result

    assert await items.run(empty) == 0
    await items.create(
        "items",
        *({"name": f"n{i}", "qty": i % 3, "tag": None if i % 2 else "t"} for i in range(10)),
    )
    await items.create("others", {"name": "x"})

    async def counts(uow: af.UnitOfWork) -> list[int]:
        ops = [
            uow.count("items"),
            uow.count("items", where={"qty": 0}),
            uow.count("items", where=af.c.qty > 0),
            uow.count("items", where={"tag": None}),
            uow.count("items", where=af.c.name.in_([])),
            uow.count("others"),
        ]
        await uow.retrieve()
        return [op.result for op in ops]

    result = await items.run(counts)
    assert result == [10, 4, 6, 5, 0, 1]
    assert all(type(n) is int for n in result)


async def test_cursor_pagination(items: Env) -> None:
    await items.create("items", *({"name": f"n{i:02}", "qty": i} for i in range(10)))
    seen: list[str] = []
    cursors: list[str | None] = []
    after = None
    for _ in range(10):
        page = await items.find("items", order_by="qty", limit=4, after=after)
        assert isinstance(page, af.FindResult)
        assert len(page) <= 4
        seen.extend(row["name"] for row in page)
        cursors.append(page.cursor)
        if page.cursor is None:
            break
        assert isinstance(page.cursor, str)
        after = page.cursor
    assert seen == [f"n{i:02}" for i in range(10)]
    assert len(cursors) == 3 and cursors[-1] is None
    # Without limit there is no cursor; a last page that is exactly full has none.
    assert (await items.find("items")).cursor is None
    first = await items.find("items", order_by="qty", limit=5)
    second = await items.find("items", order_by="qty", limit=5, after=first.cursor)
    assert [r["qty"] for r in second] == [5, 6, 7, 8, 9]
    assert first.cursor is not None and second.cursor is None


# -- validation ------------------------------------------------------------


async def _c_create_unknown_table(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("nope", {"owner": "x"})


async def _c_find_unknown_table(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("nope")


async def _c_create_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "colour": "red"})


async def _c_update_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"colour": "red"})


async def _c_where_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where={"colour": "red"})
    await uow.retrieve()


async def _c_expr_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.count("accounts", where=af.c.colour == "red")
    await uow.retrieve()


async def _c_order_unknown_column(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", order_by=("colour", "asc"))


async def _c_create_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "balance": "ten"})


async def _c_update_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"owner": 5})


async def _c_where_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c.balance == "ten")
    await uow.retrieve()


async def _c_in_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c.balance.in_([1, "two"]))
    await uow.retrieve()


async def _c_reference_wrong_type(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("transfers", {"src": 12, "dst": ids["bob"], "amount": 1})


async def _c_bool_for_bigint(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"balance": True})


async def _c_missing_required(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"balance": 3})


async def _c_misspelled_required(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"ownr": "x"})  # the typo is the error, not the missing owner


async def _c_column_name_not_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {5: 1})  # type: ignore[dict-item]


async def _c_set_not_null_to_none(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"owner": None})


async def _c_check_update_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", str(ids["alice"]), {"balance": 1}, check=True)


async def _c_check_update_without_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", af.RowId(str(ids["alice"])), {"balance": 1}, check=True)


async def _c_check_delete_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.delete("accounts", str(ids["alice"]), check=True)


async def _c_check_op_with_str(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.check("accounts", str(ids["alice"]))  # type: ignore[arg-type]


async def _c_create_writes_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "id": "mine"})


async def _c_update_writes_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"id": "mine"})


async def _c_create_writes_internal_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.create("accounts", {"owner": "x", "_id": 12345})


async def _c_update_writes_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"_version": 0})


async def _c_update_writes_internal_id(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.update("accounts", ids["alice"], {"_id": 1})


async def _c_where_on_version(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    uow.find("accounts", where=af.c._version == 0)
    await uow.retrieve()


async def _c_find_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    op = uow.find("accounts")
    op.result  # noqa: B018


async def _c_count_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    op = uow.count("accounts")
    op.result  # noqa: B018


async def _c_find_first_result_early(uow: af.UnitOfWork, ids: dict[str, af.RowId]) -> None:
    first = uow.find_first("accounts", where={"owner": "alice"})
    await uow.retrieve()
    later = uow.find_first("accounts", where={"owner": "bob"})
    assert first.result is not None
    later.result  # noqa: B018  (queued after the last retrieve())


VALIDATION_CASES: list[tuple[Callable[..., Awaitable[None]], str]] = [
    (_c_create_unknown_table, r"'nope'"),
    (_c_find_unknown_table, r"'nope'"),
    (_c_create_unknown_column, r"accounts.*colour"),
    (_c_update_unknown_column, r"accounts.*colour"),
    (_c_where_unknown_column, r"accounts.*colour"),
    (_c_expr_unknown_column, r"accounts.*colour"),
    (_c_order_unknown_column, r"accounts.*colour"),
    (_c_create_wrong_type, r"accounts\.balance"),
    (_c_update_wrong_type, r"accounts\.owner"),
    (_c_where_wrong_type, r"accounts\.balance"),
    (_c_in_wrong_type, r"accounts\.balance"),
    (_c_reference_wrong_type, r"transfers\.src"),
    (_c_bool_for_bigint, r"accounts\.balance"),
    (_c_missing_required, r"accounts\.owner"),
    (_c_misspelled_required, r"accounts.*ownr"),
    (_c_column_name_not_str, r"'accounts'.*column names are str"),
    (_c_set_not_null_to_none, r"accounts\.owner"),
    (_c_check_update_with_str, r"accounts.*version"),
    (_c_check_update_without_version, r"accounts.*version"),
    (_c_check_delete_with_str, r"accounts.*version"),
    (_c_check_op_with_str, r"accounts.*version"),
    (_c_create_writes_id, r"accounts\.id"),
    (_c_update_writes_id, r"accounts\.id"),
    (_c_create_writes_internal_id, r"'_id'.*'accounts'"),
    (_c_update_writes_version, r"'_version'.*'accounts'"),
    (_c_update_writes_internal_id, r"'_id'.*'accounts'"),
    (_c_where_on_version, r"'_version'.*'accounts'"),
    (_c_find_result_early, r"'accounts'.*retrieve\(\)"),
    (_c_count_result_early, r"'accounts'.*retrieve\(\)"),
    (_c_find_first_result_early, r"'accounts'.*retrieve\(\)"),
]


@pytest.mark.parametrize(
    ("case", "message"),
    VALIDATION_CASES,
    ids=[case.__name__.removeprefix("_c_") for case, _ in VALIDATION_CASES],
)
async def test_validation_error_writes_nothing(
    shop: Env, case: Callable[..., Awaitable[None]], message: str
) -> None:
    ids = await seed_accounts(shop, "alice", "bob")
    before = await shop.snapshot()
    statements: list[af.CompiledQuery] = []
    attempts = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal attempts
        attempts += 1
        # Valid writes first: none of them may reach the database.
        uow.create("accounts", {"owner": "carol"})
        uow.update("accounts", ids["bob"], {"balance": 1}, check=True)
        await case(uow, ids)

    with pytest.raises(af.ValidationError, match=message):
        await shop.run(unit, on_query=statements.append)
    assert attempts == 1  # a validation error is not retried
    assert not any(q.sql.lstrip().upper().startswith(("INSERT", "UPDATE")) for q in statements)
    assert await shop.snapshot() == before


async def test_unknown_isolation_level_is_a_validation_error(shop: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "x"})

    with pytest.raises(af.ValidationError, match="isolation"):
        await shop.run(unit, isolation="chaotic")  # type: ignore[arg-type]
    assert await shop.count("accounts") == 0


async def test_function_exception_writes_nothing(shop: Env) -> None:
    calls = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        uow.create("accounts", {"owner": "x"})
        raise LookupError("my own failure")

    with pytest.raises(LookupError, match="my own failure"):
        await shop.run(unit)
    assert calls == 1
    assert await shop.count("accounts") == 0


# -- where, order_by, pagination --------------------------------------------------

ITEM_ROWS = [
    {"name": "alpha", "qty": 1, "tag": "x"},
    {"name": "beta", "qty": 2, "tag": None},
    {"name": "gamma", "qty": 3, "tag": "y"},
    {"name": "delta", "qty": 4, "tag": None},
    {"name": "omega", "qty": 5, "tag": "x"},
    {"name": "epsilon", "qty": 5, "tag": "z"},
]

WHERE_CASES: list[tuple[str, Any, Callable[[dict[str, Any]], bool]]] = [
    ("eq", af.c.qty == 3, lambda r: r["qty"] == 3),
    ("ne", af.c.qty != 3, lambda r: r["qty"] != 3),
    ("lt", af.c.qty < 3, lambda r: r["qty"] < 3),
    ("le", af.c.qty <= 3, lambda r: r["qty"] <= 3),
    ("gt", af.c.qty > 3, lambda r: r["qty"] > 3),
    ("ge", af.c.qty >= 3, lambda r: r["qty"] >= 3),
    ("str eq", af.c.name == "delta", lambda r: r["name"] == "delta"),
    ("str ne", af.c.name != "delta", lambda r: r["name"] != "delta"),
    (
        "in",
        af.c.name.in_(["alpha", "gamma", "missing"]),
        lambda r: r["name"] in ("alpha", "gamma"),
    ),
    ("in ints", af.c.qty.in_([5, 1]), lambda r: r["qty"] in (1, 5)),
    ("in empty", af.c.qty.in_([]), lambda r: False),
    ("not in empty", ~af.c.qty.in_([]), lambda r: True),
    ("in generator", af.c.qty.in_(q for q in (2, 4)), lambda r: r["qty"] in (2, 4)),
    ("is null", af.c.tag.is_null(), lambda r: r["tag"] is None),
    ("not null", ~af.c.tag.is_null(), lambda r: r["tag"] is not None),
    ("starts_with", af.c.name.starts_with("e"), lambda r: r["name"].startswith("e")),
    ("starts_with empty", af.c.name.starts_with(""), lambda r: True),
    ("and", (af.c.qty > 1) & (af.c.qty < 5), lambda r: 1 < r["qty"] < 5),
    (
        "or",
        (af.c.qty == 1) | (af.c.name == "delta"),
        lambda r: r["qty"] == 1 or r["name"] == "delta",
    ),
    ("not or", ~((af.c.qty == 1) | (af.c.qty == 2)), lambda r: r["qty"] not in (1, 2)),
    (
        "or with null",
        (af.c.tag == "x") | af.c.tag.is_null(),
        lambda r: r["tag"] in ("x", None),
    ),
    (
        "nested",
        ((af.c.qty >= 2) & ~(af.c.tag == "y")) | (af.c.name == "alpha"),
        # (tag = 'y') is NULL for NULL tags, so NOT(...) is NULL: SQL semantics.
        lambda r: (
            (r["qty"] >= 2 and r["tag"] is not None and r["tag"] != "y") or r["name"] == "alpha"
        ),
    ),
    ("dict none", {"tag": None}, lambda r: r["tag"] is None),
    ("dict and", {"tag": "x", "qty": 5}, lambda r: r["tag"] == "x" and r["qty"] == 5),
    ("dict none and value", {"tag": None, "qty": 4}, lambda r: r["tag"] is None and r["qty"] == 4),
    ("empty dict", {}, lambda r: True),
    ("none", None, lambda r: True),
]


async def test_where_expressions(items: Env) -> None:
    await items.create("items", *ITEM_ROWS)
    rows = await items.find("items")
    assert len(rows) == len(ITEM_ROWS)

    async def unit(uow: af.UnitOfWork) -> list[tuple[Any, Any]]:
        ops = [(uow.find("items", where=w), uow.count("items", where=w)) for _, w, _ in WHERE_CASES]
        await uow.retrieve()
        return [(f.result, n.result) for f, n in ops]

    results = await items.run(unit)
    wrong = {}
    for (name, _, predicate), (found, count) in zip(WHERE_CASES, results, strict=True):
        expected = sorted(r["name"] for r in rows if predicate(r))
        got = sorted(r["name"] for r in found)
        if got != expected or count != len(expected):
            wrong[name] = {"expected": expected, "found": got, "count": count}
    assert wrong == {}


async def test_where_on_id_and_references(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    await shop.create(
        "transfers",
        {"src": ids["alice"], "dst": ids["bob"], "amount": 1},
        {"src": ids["bob"], "dst": ids["carol"], "amount": 2},
        {"src": ids["carol"], "dst": ids["alice"], "amount": 3},
    )

    async def unit(uow: af.UnitOfWork) -> list[Any]:
        ops = [
            uow.find("accounts", where=af.c.id == ids["bob"]),
            uow.find("accounts", where={"id": str(ids["carol"])}),
            uow.find("accounts", where=af.c.id.in_([ids["alice"], str(ids["carol"])])),
            uow.find("transfers", where={"src": ids["bob"]}),  # RowId with internal id
            uow.find("transfers", where=af.c.dst == str(ids["alice"])),  # external id string
            uow.find("transfers", where=af.c.src.in_([ids["alice"], str(ids["carol"])])),
            uow.find("accounts", where=af.c.id == "no-such-id"),
        ]
        await uow.retrieve()
        return [op.result for op in ops]

    bob, carol, alice_carol, from_bob, to_alice, from_a_c, none = await shop.run(unit)
    assert [r["owner"] for r in bob] == ["bob"]
    assert [r["owner"] for r in carol] == ["carol"]
    assert sorted(r["owner"] for r in alice_carol) == ["alice", "carol"]
    assert [r["amount"] for r in from_bob] == [2]
    assert [r["amount"] for r in to_alice] == [3]
    assert sorted(r["amount"] for r in from_a_c) == [1, 3]
    assert none == []


async def test_starts_with_escapes_like_wildcards(items: Env) -> None:
    names = ["50%_off", "50%off", "50_off", "50xoff", "500", "a!b", "a!!b", "ab", "x\\y", "x\\\\y"]
    await items.create("items", *({"name": n, "qty": 0} for n in names))

    prefixes = ["50%", "50_", "50%_", "a!", "a!!", "x\\", "x\\\\", "5"]

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", where=af.c.name.starts_with(p)) for p in prefixes]
        await uow.retrieve()
        return [sorted(r["name"] for r in op.result) for op in ops]

    got = dict(zip(prefixes, await items.run(unit), strict=True))
    expected = {p: sorted(n for n in names if n.startswith(p)) for p in prefixes}
    assert got == expected


async def test_starts_with_is_case_sensitive(request: pytest.FixtureRequest, items: Env) -> None:
    await items.create(
        "items", *({"name": n, "qty": 0} for n in ["Alpha", "alpha", "ALPHA", "beta"])
    )

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", where=af.c.name.starts_with(p)) for p in ("al", "Al", "AL")]
        await uow.retrieve()
        return [sorted(r["name"] for r in op.result) for op in ops]

    assert await items.run(unit) == [["alpha"], ["Alpha"], ["ALPHA"]]


async def test_starts_with_needs_a_string_column(items: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.find("items", where=af.c.qty.starts_with("1"))
        await uow.retrieve()

    with pytest.raises(af.ValidationError, match=r"items\.qty"):
        await items.run(unit)


async def test_comparing_with_none_is_a_validation_error() -> None:
    with pytest.raises(af.ValidationError, match="is_null"):
        af.c.tag == None  # noqa: B015, E711
    with pytest.raises(af.ValidationError, match="&"):
        bool(af.c.qty == 1)


async def test_order_by(items: Env) -> None:
    await items.create("items", *ITEM_ROWS)

    orders: list[tuple[Any, list[str]]] = [
        ("qty", ["alpha", "beta", "gamma", "delta", "omega", "epsilon"]),
        (("qty", "asc"), ["alpha", "beta", "gamma", "delta", "omega", "epsilon"]),
        # Ties (qty 5) keep creation order in both directions.
        (("qty", "desc"), ["omega", "epsilon", "delta", "gamma", "beta", "alpha"]),
        ("name", ["alpha", "beta", "delta", "epsilon", "gamma", "omega"]),
        (("name", "desc"), ["omega", "gamma", "epsilon", "delta", "beta", "alpha"]),
        ([("qty", "desc"), "name"], ["epsilon", "omega", "delta", "gamma", "beta", "alpha"]),
        (
            [("qty", "desc"), ("name", "desc")],
            ["omega", "epsilon", "delta", "gamma", "beta", "alpha"],
        ),
        (
            [("qty", "asc"), ("name", "desc")],
            ["alpha", "beta", "gamma", "delta", "omega", "epsilon"],
        ),
        (["qty", ("name", "asc")], ["alpha", "beta", "gamma", "delta", "epsilon", "omega"]),
        (None, [r["name"] for r in ITEM_ROWS]),
    ]

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", order_by=o) for o, _ in orders]
        await uow.retrieve()
        return [[r["name"] for r in op.result] for op in ops]

    got = await items.run(unit)
    assert got == [expected for _, expected in orders]

    async def first(uow: af.UnitOfWork) -> Any:
        op = uow.find_first("items", where=af.c.qty < 5, order_by=("qty", "desc"))
        none = uow.find_first("items", where={"name": "missing"})
        await uow.retrieve()
        return op.result, none.result

    row, missing = await items.run(first)
    assert row["name"] == "delta" and missing is None

    with pytest.raises(af.ValidationError, match="direction"):
        await items.find("items", order_by=("qty", "up"))


async def test_keyset_pagination_stable_under_inserts(items: Env) -> None:
    originals = [
        {"name": f"o{i:02}", "qty": q} for i, q in enumerate([7, 3, 3, 9, 1, 3, 5, 5, 8, 2, 6, 3])
    ]
    await items.create("items", *originals)
    order = [("qty", "desc"), ("name", "asc")]

    def key(row: dict[str, Any]) -> tuple[int, str]:
        return (-row["qty"], row["name"])

    seen: list[dict[str, Any]] = []
    inserted_before: list[str] = []
    inserted_after: list[str] = []
    after = None
    for page_number in range(20):
        page = await items.find("items", order_by=order, limit=3, after=after)
        seen.extend(page)
        if page.cursor is None:
            break
        after = page.cursor
        last = page[-1]
        # Between pages: a row sorting before the cursor (never to be seen),
        # one sorting after it (to be seen), and one tied with the cursor row
        # on qty but before it by name (not to be seen).
        before_name, after_name, tied_name = (
            f"b{page_number:02}",
            f"z{page_number:02}",
            f"a{page_number:02}",
        )
        await items.create(
            "items",
            {"name": before_name, "qty": 100 + page_number},
            {"name": after_name, "qty": -1 - page_number},
            {"name": tied_name, "qty": last["qty"]},
        )
        inserted_before += [before_name, tied_name]
        inserted_after.append(after_name)
    else:
        pytest.fail("pagination did not end")

    names = [r["name"] for r in seen]
    assert len(names) == len(set(names)), "a row was returned twice"
    for original in originals:
        assert names.count(original["name"]) == 1, original
    assert not set(inserted_before) & set(names)
    assert set(inserted_after) <= set(names)
    assert [key(r) for r in seen] == sorted(key(r) for r in seen)


async def test_keyset_pagination_through_ties(items: Env) -> None:
    # Few distinct values: pages break inside runs of equal qty; creation
    # order (the internal id) breaks the ties, in both directions.
    qtys = [2, 1, 2, 2, 1, 3, 2, 1, 3, 2, 2]
    await items.create("items", *({"name": f"n{i:02}", "qty": q} for i, q in enumerate(qtys)))
    for direction, sign in (("asc", 1), ("desc", -1)):
        for limit in (1, 2, 3, 4):
            seen: list[str] = []
            after = None
            while True:
                page = await items.find(
                    "items", order_by=("qty", direction), limit=limit, after=after
                )
                seen.extend(r["name"] for r in page)
                if page.cursor is None:
                    break
                after = page.cursor
            expected = [
                f"n{i:02}" for i, _ in sorted(enumerate(qtys), key=lambda p: (sign * p[1], p[0]))
            ]
            assert seen == expected, (direction, limit)


async def test_keyset_pagination_with_where(items: Env) -> None:
    await items.create("items", *({"name": f"n{i:02}", "qty": i} for i in range(20)))
    seen: list[int] = []
    after = None
    while True:
        page = await items.find(
            "items", where=(af.c.qty >= 5) & (af.c.qty != 9), order_by="name", limit=4, after=after
        )
        seen.extend(r["qty"] for r in page)
        if page.cursor is None:
            break
        after = page.cursor
    assert seen == [q for q in range(5, 20) if q != 9]


async def test_pagination_by_nullable_column_is_refused(items: Env) -> None:
    """Keyset pages over a column with NULLs would lose rows: refused up front."""
    for direction in ("asc", "desc"):
        with pytest.raises(af.ValidationError, match=r"items\.tag may be NULL"):
            await items.find("items", order_by=("tag", direction), limit=2)
    # Without a limit there is nothing to page, so ordering by it is fine.
    await items.create("items", {"name": "x", "qty": 1, "tag": None})
    assert [r["name"] for r in await items.find("items", order_by="tag")] == ["x"]


MALFORMED_CURSORS = [
    "",
    "not a cursor!",
    "%%%%",
    base64.urlsafe_b64encode(b"[1, 2, 3]").decode(),
    base64.urlsafe_b64encode(b'{"k": "x"}').decode(),
    base64.urlsafe_b64encode(b"\xff\xfe\x00").decode(),
]


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS, ids=range(len(MALFORMED_CURSORS)))
async def test_malformed_cursor(items: Env, cursor: str) -> None:
    with pytest.raises(af.ValidationError, match="cursor"):
        await items.find("items", order_by="qty", limit=2, after=cursor)


async def test_truncated_cursor(items: Env) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    page = await items.find("items", order_by="qty", limit=2)
    assert page.cursor is not None
    with pytest.raises(af.ValidationError, match="cursor"):
        await items.find(
            "items", order_by="qty", limit=2, after=page.cursor[: len(page.cursor) // 2]
        )


def _tamper(cursor: str, change: Callable[[dict[str, Any]], None]) -> str:
    payload = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    change(payload)
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


TAMPERINGS: list[Any] = [
    pytest.param(lambda p: p.__setitem__("v", ["three", p["v"][1]]), id="wrong-value-type"),
    pytest.param(
        lambda p: p.__setitem__("v", []),
        id="too-few-values",
    ),
    pytest.param(
        lambda p: p.__setitem__("v", [{"$dec": "not a number"}, 1]),
        id="undecodable-tag",
    ),
]


@pytest.mark.parametrize("change", TAMPERINGS)
async def test_tampered_cursor(items: Env, change: Callable[[dict[str, Any]], None]) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    page = await items.find("items", order_by="qty", limit=2)
    assert page.cursor is not None
    with pytest.raises(af.ValidationError):
        await items.find("items", order_by="qty", limit=2, after=_tamper(page.cursor, change))


async def test_cursor_from_another_query(items: Env) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    await items.create("others", *({"name": f"n{i}"} for i in range(5)))
    by_qty = await items.find("items", order_by="qty", limit=2)
    by_name = await items.find("items", order_by="name", limit=2)
    plain = await items.find("items", limit=2)
    assert by_qty.cursor and by_name.cursor and plain.cursor
    misuses = [
        ("items", {"order_by": "name"}, by_qty.cursor),
        ("items", {"order_by": ("qty", "desc")}, by_qty.cursor),
        ("items", {"order_by": ["qty", "name"]}, by_qty.cursor),
        ("items", {"order_by": "qty"}, by_name.cursor),
        ("items", {}, by_qty.cursor),
        ("items", {"order_by": "qty"}, plain.cursor),
        ("others", {}, plain.cursor),
        ("others", {"order_by": "name"}, by_name.cursor),
    ]
    for table, kwargs, cursor in misuses:
        with pytest.raises(af.ValidationError, match="cursor"):
            await items.find(table, limit=2, after=cursor, **kwargs)
    # The right query accepts it.
    rest = await items.find("items", order_by="qty", limit=2, after=by_qty.cursor)
    assert [r["qty"] for r in rest] == [2, 3]


# -- typed columns in where, order_by and cursors -------------------------------

MIXED = af.Schema(
    "mixed",
    af.Table(
        "things",
        af.Column("name", "string"),
        af.Column("price", "decimal"),
        af.Column("at", "timestamp"),
        af.Column("day", "date"),
        af.Column("big", "bigint"),
    ),
)

_T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
THINGS = [
    {
        "name": f"t{i}",
        "price": price,
        "at": _T0 + dt.timedelta(days=days, milliseconds=7 * i),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=days * 3),
        "big": big,
    }
    for i, (price, days, big) in enumerate(
        [
            (Decimal("9"), 5, 2**62),
            (Decimal("10"), -400, -(2**62)),
            (Decimal("100"), 30, 9),
            (Decimal("-1"), 0, 10),
            (Decimal("2.5"), 3000, -1),
            (Decimal("0.125"), -2, 2**53 + 1),
            (Decimal("-20"), 1, 100),
        ]
    )
]


async def test_order_and_compare_decimal(make_env: MakeEnv) -> None:
    env = await make_env(MIXED)
    await env.create("things", *THINGS)
    if env.db.name == "sqlite":
        # Stored as text there: ordering would compare strings ('10' < '9'), so
        # it is refused; equality still works.
        for attempt in (
            lambda: env.find("things", order_by="price"),
            lambda: env.find("things", where=af.c.price > Decimal("9")),
        ):
            with pytest.raises(af.ValidationError, match="stored as text"):
                await attempt()
        rows = await env.find("things", where={"price": Decimal("10.00")})
        assert [r["price"] for r in rows] == [Decimal("10")]
        return
    by_price = [r["name"] for r in sorted(THINGS, key=lambda r: r["price"])]
    rows = await env.find("things", order_by="price")
    assert [r["name"] for r in rows] == by_price
    above = await env.find("things", where=af.c.price > Decimal("9"), order_by="price")
    assert [r["price"] for r in above] == [Decimal("10"), Decimal("100")]
    seen: list[str] = []
    after = None
    while True:
        page = await env.find("things", order_by=("price", "desc"), limit=3, after=after)
        seen.extend(r["name"] for r in page)
        if page.cursor is None:
            break
        after = page.cursor
    assert seen == by_price[::-1]


# -- mutations ---------------------------------------------------------------


async def test_update_to_null_and_back(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")

    async def set_note(value: str | None) -> None:
        async def unit(uow: af.UnitOfWork) -> None:
            row = uow.find_first("accounts", where={"owner": "alice"})
            await uow.retrieve()
            uow.update("accounts", row.result["id"], {"note": value}, check=True)

        await shop.run(unit, retry=af.NoRetry())

    for value in ("a note", None, "another", None):
        await set_note(value)
        row = await read_account(shop, "alice")
        assert row is not None and row["note"] == value
    assert await shop.version("accounts", ids["alice"]) == 4

    async def empty_update(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {})  # only bumps the version

    await shop.run(empty_update)
    assert await shop.version("accounts", ids["alice"]) == 5


async def test_delete_with_and_without_check(shop: Env) -> None:
    ids = await seed_accounts(shop, "a", "b", "c", "d")

    async def bump(uow: af.UnitOfWork) -> None:
        for owner in ("b", "c"):
            uow.update("accounts", ids[owner], {"note": "changed"})

    await shop.run(bump)  # b and c are now at version 1; ids hold version 0
    before = await shop.snapshot()

    async def checked_stale(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", ids["a"], check=True)  # fresh
        uow.delete("accounts", ids["b"], check=True)  # stale

    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(checked_stale, retry=af.NoRetry())
    assert await shop.snapshot() == before

    async def deletes(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", ids["a"], check=True)  # fresh version: deleted
        uow.delete("accounts", ids["c"])  # stale version, unchecked: deleted
        uow.delete("accounts", str(ids["d"]))  # plain id string

    async def missing(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", ids["a"], check=True)
        uow.delete("accounts", "no-such-id")  # unchecked, but there must be a row

    with pytest.raises(af.RowNotFound, match="no-such-id"):
        await shop.run(missing, retry=af.NoRetry())
    assert await shop.snapshot() == before  # the whole unit rolled back

    await shop.run(deletes, retry=af.NoRetry())
    remaining = await shop.find("accounts")
    assert [r["owner"] for r in remaining] == ["b"]

    async def gone(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", ids["a"], check=True)  # already deleted

    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(gone, retry=af.NoRetry())


async def test_check_op(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob", "carol")

    async def fresh(uow: af.UnitOfWork) -> None:
        uow.check("accounts", ids["alice"])
        uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 1})

    await shop.run(fresh, retry=af.NoRetry())
    assert await shop.count("transfers") == 1
    assert await shop.version("accounts", ids["alice"]) == 0  # a check is not a write

    async def only_check(uow: af.UnitOfWork) -> None:
        uow.check("accounts", ids["bob"])

    await shop.run(only_check, retry=af.NoRetry())

    async def bump(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["alice"], {"balance": 0})

    await shop.run(bump)
    before = await shop.snapshot()

    async def stale_check(uow: af.UnitOfWork) -> None:
        uow.update("accounts", ids["bob"], {"balance": 5}, check=True)
        uow.create("transfers", {"src": ids["bob"], "dst": ids["alice"], "amount": 2})
        uow.check("accounts", ids["alice"])

    conflicts: list[Exception] = []
    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(
            stale_check,
            retry=af.NoRetry(),
            hooks=af.UowHooks(on_conflict=lambda uow, exc: conflicts.append(exc)),
        )
    assert caught.value.attempts == 1
    assert len(conflicts) == 1 and "accounts" in str(conflicts[0])
    assert await shop.snapshot() == before

    async def delete_carol(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", ids["carol"])

    await shop.run(delete_carol)

    async def check_deleted(uow: af.UnitOfWork) -> None:
        uow.check("accounts", ids["carol"])  # the version it had

    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(check_deleted, retry=af.NoRetry())


async def test_unique_violation_in_unit_writes_nothing(shop: Env) -> None:
    await shop.create("people", {"email": "taken@example.com"})
    before = await shop.snapshot()

    async def duplicate_of_existing(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "fresh"})
        uow.create("people", {"email": "new@example.com"})
        uow.create("people", {"email": "taken@example.com"})

    calls = 0

    async def counted(uow: af.UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        await duplicate_of_existing(uow)

    with pytest.raises(af.UniqueViolation) as caught:
        await shop.run(counted)
    assert calls == 1  # an integrity error is not a conflict: no retry
    assert isinstance(caught.value, af.IntegrityError)
    assert caught.value.__cause__ is not None
    assert await shop.snapshot() == before

    async def duplicate_within(uow: af.UnitOfWork) -> None:
        uow.create("people", {"email": "twice@example.com"})
        uow.create("people", {"email": "twice@example.com"})

    with pytest.raises(af.UniqueViolation):
        await shop.run(duplicate_within)
    assert await shop.snapshot() == before

    [person] = await shop.find("people")

    async def update_into_duplicate(uow: af.UnitOfWork) -> None:
        other = uow.create("people", {"email": "other@example.com"})
        uow.update("people", other, {"email": "taken@example.com"})

    with pytest.raises(af.UniqueViolation):
        await shop.run(update_into_duplicate)
    assert await shop.snapshot() == before
    assert person["email"] == "taken@example.com"


# -- references -------------------------------------------------------------


async def test_reference_forms(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob")

    async def unit(uow: af.UnitOfWork) -> tuple[af.RowId, ...]:
        a = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        alice = a.result["id"]
        carol = uow.create("accounts", {"owner": "carol"})
        t1 = uow.create("transfers", {"src": alice, "dst": str(ids["bob"]), "amount": 1})
        t2 = uow.create("transfers", {"src": carol, "dst": alice, "amount": 2})
        # The RowId returned by create in this unit as a reference value: no internal id yet.
        assert carol.internal_id is None
        return t1, t2, carol

    t1, t2, carol = await shop.run(unit)
    transfers = {r["id"]: r for r in await shop.find("transfers")}
    assert (transfers[t1]["src"], transfers[t1]["dst"]) == (ids["alice"], ids["bob"])
    assert (transfers[t2]["src"], transfers[t2]["dst"]) == (carol, ids["alice"])
    assert transfers[t1]["src"].internal_id == ids["alice"].internal_id
    assert transfers[t1]["dst"].internal_id == ids["bob"].internal_id

    # Reference values in updates: external id string, and a row read back.
    async def repoint(uow: af.UnitOfWork) -> None:
        uow.update("transfers", t1, {"dst": str(carol)})
        uow.update("transfers", t2, {"src": transfers[t1]["src"]})

    await shop.run(repoint)
    after = {r["id"]: r for r in await shop.find("transfers")}
    assert after[t1]["dst"] == carol
    assert after[t2]["src"] == ids["alice"]


async def test_reference_to_nonexistent_id_string(shop: Env) -> None:
    """A NOT NULL reference to an external id that matches no row: the
    subquery finds nothing, the database refuses NULL, the unit writes nothing."""
    ids = await seed_accounts(shop, "alice")
    before = await shop.snapshot()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "carol"})
        uow.create("transfers", {"src": ids["alice"], "dst": "no-such-account", "amount": 1})

    with pytest.raises(af.IntegrityError) as caught:
        await shop.run(unit)
    # Today every backend reports it as NULL in a NOT NULL column
    # (af.NotNullViolation), not as a missing referenced row.
    assert caught.value.__cause__ is not None
    assert await shop.snapshot() == before


async def test_nullable_reference_to_nonexistent_id_string(shop: Env) -> None:
    before = await shop.snapshot()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("people", {"email": "p@example.com", "account": "no-such-account"})

    try:
        with pytest.raises(af.IntegrityError):
            await shop.run(unit)
    finally:
        stored = await shop.find("people")
    assert await shop.snapshot() == before, stored


async def test_reference_to_nonexistent_internal_id(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    before = await shop.snapshot()
    ghost = af.RowId("ghost", None, 2**40)  # no row has that internal id

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "carol"})
        uow.create("transfers", {"src": ids["alice"], "dst": ghost, "amount": 1})

    with pytest.raises(af.ForeignKeyViolation):
        await shop.run(unit)
    assert await shop.snapshot() == before


@pytest.mark.parametrize("first", ["a", "b"])
async def test_creates_with_their_null_reference_in_another_column(
    make_env: MakeEnv, first: str
) -> None:
    """A create's SQL text depends on which references are NULL and which
    are looked up by external id: {a: None, b: "<id>"} and {a: "<id>",
    b: None} have different texts, and neither may be served the other's
    from the cache (it bound the id string to the internal-id column)."""
    env = await make_env(LINKS)
    [target] = await env.create("targets", {"name": "t"})
    other = "b" if first == "a" else "a"
    by_id = str(target)  # an id string: looked up by external id
    await env.create("links", {"label": "one", first: None, other: by_id})
    await env.create("links", {"label": "two", first: by_id, other: None})
    await env.create("links", {"label": "three", first: target, other: by_id})
    rows = {row["label"]: row for row in await env.find("links")}
    assert (rows["one"][first], rows["one"][other]) == (None, target)
    assert (rows["two"][first], rows["two"][other]) == (target, None)
    assert (rows["three"][first], rows["three"][other]) == (target, target)


@pytest.mark.parametrize("first", ["a", "b"])
async def test_finds_and_updates_with_their_nulls_and_references_in_other_columns(
    make_env: MakeEnv, first: str
) -> None:
    """Finds and updates with the same columns, one run after another on one
    cache: which of them are NULL (IS NULL, or SET ... = NULL) and which
    references are looked up by external id each give the statement another
    text, and none may be served another's from the cache."""
    env = await make_env(LINKS)
    [target] = await env.create("targets", {"name": "t"})
    other = "b" if first == "a" else "a"
    by_id = str(target)
    await env.create(
        "links",
        {"label": "one", first: None, other: target},
        {"label": "two", first: target, other: None},
        {"label": "none", first: None, other: None},
    )

    async def labels(uow: af.UnitOfWork) -> list[list[str]]:
        wheres = [
            {first: None, other: by_id},
            {first: by_id, other: None},
            {first: target, other: None},
            {first: None, other: None},
            {first: None, other: target},
        ]
        finds = [uow.find("links", where=where) for where in wheres]
        wheres[0][other] = "no such id"  # (a dict changed after queuing is not read again)
        await uow.retrieve()
        return [sorted(row["label"] for row in find.result) for find in finds]

    assert await env.run(labels) == [["one"], ["two"], ["two"], ["none"], ["one"]]
    rows = {row["label"]: row for row in await env.find("links")}
    for label, values in (
        ("one", {first: target, other: None}),
        ("two", {first: None, other: by_id}),
    ):

        async def update(
            uow: af.UnitOfWork,
            row_id: af.RowId = rows[label]["id"],
            values: dict[str, Any] = values,
        ) -> None:
            uow.update("links", row_id, values)

        await env.run(update)
    rows = {row["label"]: row for row in await env.find("links")}
    assert (rows["one"][first], rows["one"][other]) == (target, None)
    assert (rows["two"][first], rows["two"][other]) == (None, target)


async def test_self_reference_created_in_same_unit(make_env: MakeEnv) -> None:
    tree = await make_env(TREE)

    async def unit(uow: af.UnitOfWork) -> tuple[af.RowId, af.RowId]:
        root = uow.create("nodes", {"label": "root"})
        child = uow.create("nodes", {"label": "child", "parent": root})
        return root, child

    root, child = await tree.run(unit)

    async def move(uow: af.UnitOfWork) -> af.RowId:
        other = uow.create("nodes", {"label": "other"})
        uow.update("nodes", child, {"parent": str(other)})
        return other

    other = await tree.run(move)
    nodes = {r["label"]: r for r in await tree.find("nodes")}
    assert nodes["root"]["parent"] is None
    assert nodes["child"]["parent"] == other
    assert nodes["other"]["id"] == other and root == nodes["root"]["id"]


# -- retries ---------------------------------------------------------------


async def test_retry_exhaustion_raises_concurrency_conflict(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    calls = 0

    async def always_stale(uow: af.UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        uow.create("accounts", {"owner": f"c{calls}"})
        uow.update("accounts", stale(ids["alice"]), {"balance": 1}, check=True)

    conflicts: list[Exception] = []
    hooks = af.UowHooks(on_conflict=lambda uow, exc: conflicts.append(exc))
    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(
            always_stale,
            retry=af.ExponentialBackoff(max_retries=3, initial=0.001, maximum=0.002),
            hooks=hooks,
        )
    assert caught.value.attempts == 4 and calls == 4 and len(conflicts) == 4
    assert isinstance(caught.value, af.Error)
    assert caught.value.__cause__ is not None
    assert await shop.count("accounts") == 1

    calls = 0
    with pytest.raises(af.ConcurrencyConflict) as no_retry:
        await shop.run(always_stale, retry=af.NoRetry())
    assert no_retry.value.attempts == 1 and calls == 1

    calls = 0
    with pytest.raises(af.ConcurrencyConflict) as default:
        await shop.run(always_stale)  # the default policy: 5 retries
    assert default.value.attempts == 6 and calls == 6
    assert await shop.count("accounts") == 1


class RecordingPolicy:
    """A custom retry policy: retries ``limit`` times without waiting."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.asked: list[int] = []

    def delay(self, attempt: int) -> float | None:
        self.asked.append(attempt)
        return 0.0 if attempt <= self.limit else None


async def test_custom_retry_policy(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    calls = 0

    async def stale_twice(uow: af.UnitOfWork) -> str:
        nonlocal calls
        calls += 1
        row = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        target = stale(ids["alice"]) if calls <= 2 else row.result["id"]
        uow.update("accounts", target, {"balance": row.result["balance"] + 1}, check=True)
        return f"done after {calls}"

    policy = RecordingPolicy(limit=5)
    assert await shop.run(stale_twice, retry=policy) == "done after 3"
    assert policy.asked == [1, 2]
    alice = await read_account(shop, "alice")
    assert alice is not None and alice["balance"] == 101 and alice["id"].version == 1

    calls = 0
    strict = RecordingPolicy(limit=1)
    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(stale_twice, retry=strict)
    assert strict.asked == [1, 2] and caught.value.attempts == 2
    alice = await read_account(shop, "alice")
    assert alice is not None and alice["balance"] == 101


async def test_uow_id_is_stable_across_retries(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    seen: list[str] = []

    async def unit(uow: af.UnitOfWork) -> None:
        seen.append(uow.uow_id)
        row = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        target = stale(ids["alice"]) if len(seen) < 3 else row.result["id"]
        uow.update("accounts", target, {"balance": 0}, check=True)

    await shop.run(unit, retry=RecordingPolicy(limit=5))
    assert len(seen) == 3 and len(set(seen)) == 1
    assert isinstance(seen[0], str) and seen[0]

    first_id = seen[0]
    seen.clear()
    await shop.run(unit, retry=RecordingPolicy(limit=5))
    assert len(set(seen)) == 1 and seen[0] != first_id  # random per unit by default

    seen.clear()
    bob = (await seed_accounts(shop, "bob"))["bob"]

    async def keyed(uow: af.UnitOfWork) -> None:
        seen.append(uow.uow_id)
        target = stale(bob) if len(seen) < 2 else bob
        uow.update("accounts", target, {"balance": 0}, check=True)

    key = f"order-{uuid.uuid4()}"  # (keys are unique in the database: one per test run)
    await shop.run(keyed, retry=RecordingPolicy(limit=5), idempotency_key=key)
    assert seen == [key, key]


# -- execution: statements, transactions, dry runs, hooks, cache ------------------


async def test_no_ops_means_no_query(shop: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    checkouts = 0
    original = shop.db._engine.checkout

    async def counting_checkout() -> Session:
        nonlocal checkouts
        checkouts += 1
        return await original()

    monkeypatch.setattr(shop.db._engine, "checkout", counting_checkout)
    statements: list[af.CompiledQuery] = []
    hooked: list[str] = []

    async def nothing(uow: af.UnitOfWork) -> str:
        await uow.retrieve()
        await uow.retrieve()
        return "nothing"

    hooks = af.UowHooks(
        before_mutation=lambda uow: hooked.append("before"),
        after_mutation=lambda uow: hooked.append("after"),
    )
    assert await shop.run(nothing, on_query=statements.append, hooks=hooks) == "nothing"
    assert statements == [] and checkouts == 0 and hooked == []


async def test_reads_of_one_retrieve_travel_as_one_statement(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the dialect has arrays of rows, the reads queued for one
    ``retrieve()`` are one statement; every read's result is what it would
    be on its own: order, pages, references, NULLs, counts, no rows."""
    ids = await seed_accounts(shop, "alice", "bob", "carol", "dave")

    async def seed(uow: af.UnitOfWork) -> None:
        uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 7})
        uow.create("people", {"email": "e@example.com"})  # (account: NULL)

    await shop.run(seed)
    reads: list[Callable[[af.UnitOfWork], Any]] = [
        lambda uow: uow.find("accounts", order_by=("owner", "desc"), limit=2),
        lambda uow: uow.find_first("accounts", where={"owner": "carol"}),
        lambda uow: uow.count("accounts", where=af.c.balance >= 100),
        lambda uow: uow.find("transfers", where={"src": ids["alice"]}),
        lambda uow: uow.find("people"),
        lambda uow: uow.find_first("accounts", where={"owner": "nobody"}),
        lambda uow: uow.find("accounts", where={"owner": "nobody"}),
    ]

    async def one_by_one(uow: af.UnitOfWork) -> list[Any]:
        results = []
        for read in reads:
            op = read(uow)
            await uow.retrieve()
            results.append(op.result)
        return results

    alone = await shop.run(one_by_one)
    batches: list[list[str]] = []
    original = Session.execute_batch

    async def spying(self_: Session, queries: Any, stop: Any = None) -> Any:
        batches.append([q.sql for q in queries])
        return await original(self_, queries, stop)

    monkeypatch.setattr(Session, "execute_batch", spying)

    async def together(uow: af.UnitOfWork) -> list[Any]:
        ops = [read(uow) for read in reads]
        await uow.retrieve()
        return [op.result for op in ops]

    both = await shop.run(together)
    combined = shop.db._engine.adapter.rows_array_sql is not None
    assert [len(batch) for batch in batches] == [1 if combined else len(reads)]
    assert both == alone
    assert [row["owner"] for row in both[0]] == ["dave", "carol"]
    assert both[0].cursor == alone[0].cursor and both[0].cursor is not None
    assert both[1]["id"] == ids["carol"] and both[1]["id"].internal_id is not None
    assert both[2] == 4
    assert [(t["src"], t["dst"], t["amount"]) for t in both[3]] == [(ids["alice"], ids["bob"], 7)]
    assert both[4][0]["account"] is None
    assert both[5] is None and both[6] == []


async def test_retrieval_only_unit_makes_no_transaction(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_accounts(shop, "alice", "bob")
    begins: list[Any] = []
    original = Session.begin

    async def spying_begin(self: Session, isolation: Any) -> None:
        begins.append(isolation)
        await original(self, isolation)

    monkeypatch.setattr(Session, "begin", spying_begin)
    statements: list[af.CompiledQuery] = []
    hooked: list[str] = []

    async def reads(uow: af.UnitOfWork) -> tuple[int, int]:
        a = uow.find("accounts")
        n = uow.count("accounts", where={"owner": "bob"})
        await uow.retrieve()
        b = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        assert b.result is not None
        return len(a.result), n.result

    hooks = af.UowHooks(before_mutation=lambda uow: hooked.append("before"))
    assert await shop.run(reads, on_query=statements.append, hooks=hooks) == (2, 1)
    assert [q.sql.lstrip().split()[0].upper() for q in statements] == ["SELECT"] * 3
    assert begins == [] and hooked == []

    # ...while a unit with a write runs one transaction (the spy works).
    async def write(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "carol"})

    await shop.run(write, isolation="serializable")
    assert begins == ["serializable"]


async def test_on_query_sees_every_statement(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    statements: list[af.CompiledQuery] = []
    attempts = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal attempts
        attempts += 1
        a = uow.find_first("accounts", where={"owner": "alice"})
        n = uow.count("accounts")
        await uow.retrieve()
        assert n.result == 3
        uow.create("transfers", {"src": a.result["id"], "dst": ids["bob"], "amount": 1})
        uow.update("accounts", ids["bob"], {"balance": 0})
        uow.delete("accounts", ids["carol"])
        uow.check("accounts", a.result["id"] if attempts > 1 else stale(ids["alice"]))

    await shop.run(unit, on_query=statements.append, retry=RecordingPolicy(limit=3))
    kinds = [q.sql.lstrip().split()[0].upper() for q in statements]
    one_attempt = ["SELECT", "SELECT", "INSERT", "UPDATE", "DELETE", "SELECT"]
    assert kinds == one_attempt * 2
    assert all(isinstance(q, af.CompiledQuery) for q in statements)
    assert str(ids["bob"]) in statements[3].parameters
    assert "alice" in statements[0].parameters
    assert await shop.count("transfers") == 1


async def test_dry_run_compiles_without_touching_the_database(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await seed_accounts(shop, "alice", "bob")
    before = await shop.snapshot()
    checkouts = 0
    original = shop.db._engine.checkout

    async def counting_checkout() -> Session:
        nonlocal checkouts
        checkouts += 1
        return await original()

    monkeypatch.setattr(shop.db._engine, "checkout", counting_checkout)
    statements: list[af.CompiledQuery] = []

    async def unit(uow: af.UnitOfWork) -> tuple[Any, ...]:
        everything = uow.find("accounts")
        alice = uow.find_first("accounts", where={"owner": "alice"})
        n = uow.count("accounts")
        await uow.retrieve()
        new = uow.create("accounts", {"owner": "carol"})
        uow.update("accounts", ids["alice"], {"balance": 0}, check=True)
        uow.delete("accounts", ids["bob"])
        uow.check("accounts", stale(ids["bob"]))  # would conflict if run
        return list(everything.result), alice.result, n.result, new

    everything, alice, n, new = await shop.run(unit, dry_run=True, on_query=statements.append)
    assert (everything, alice, n) == ([], None, 0)
    assert isinstance(new, af.RowId)
    kinds = [q.sql.lstrip().split()[0].upper() for q in statements]
    assert kinds == ["SELECT", "SELECT", "SELECT", "INSERT", "UPDATE", "DELETE", "SELECT"]
    assert checkouts == 0
    monkeypatch.undo()
    assert await shop.snapshot() == before

    # Validation still happens in a dry run.
    async def bad(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": 1})

    with pytest.raises(af.ValidationError, match=r"accounts\.owner"):
        await shop.run(bad, dry_run=True)


async def test_hooks(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice")
    events: list[Any] = []
    calls = 0

    async def unit(uow: af.UnitOfWork) -> af.RowId:
        nonlocal calls
        calls += 1
        events.append(("fn", uow.uow_id))
        return uow.create("transfers", {"src": ids["alice"], "dst": ids["alice"], "amount": calls})

    async def before(uow: af.UnitOfWork) -> None:
        events.append(("before", len(uow.mutations)))
        if calls == 1:
            raise af.ConcurrencyConflict("injected by the test")

    async def after(uow: af.UnitOfWork) -> None:
        # Runs after the commit: the row is visible from another connection.
        events.append(("after", await shop.count("transfers")))

    def on_conflict(uow: af.UnitOfWork, exc: Exception) -> None:
        events.append(("conflict", str(exc)))

    hooks = af.UowHooks(before_mutation=before, after_mutation=after, on_conflict=on_conflict)
    created = await shop.run(unit, hooks=hooks, retry=RecordingPolicy(limit=3))
    uow_id = events[0][1]
    assert events == [
        ("fn", uow_id),
        ("before", 1),
        ("conflict", "injected by the test"),
        ("fn", uow_id),
        ("before", 1),
        ("after", 1),
    ]
    [row] = await shop.find("transfers")
    assert row["id"] == created and row["amount"] == 2

    # A conflict injected on every attempt exhausts the policy.
    def inject(uow: af.UnitOfWork) -> None:
        raise af.ConcurrencyConflict("injected every time")

    always = af.UowHooks(before_mutation=inject)
    with pytest.raises(af.ConcurrencyConflict) as caught:
        await shop.run(unit, hooks=always, retry=RecordingPolicy(limit=2))
    assert caught.value.attempts == 3
    assert await shop.count("transfers") == 1

    # Any other exception from a hook ends the unit with nothing written.
    calls = 0

    def boom(uow: af.UnitOfWork) -> None:
        raise RuntimeError("hook failed")

    before_snapshot = await shop.snapshot()
    with pytest.raises(RuntimeError, match="hook failed"):
        await shop.run(unit, hooks=af.UowHooks(before_mutation=boom))
    assert calls == 1
    assert await shop.snapshot() == before_snapshot

    # Hooks may be plain functions as well as coroutines.
    seen: list[str] = []
    sync = af.UowHooks(
        before_mutation=lambda uow: seen.append("before"),
        after_mutation=lambda uow: seen.append("after"),
    )
    await shop.run(unit, hooks=sync)
    assert seen == ["before", "after"]
    assert await shop.count("transfers") == 2


async def test_sql_is_cached_by_shape(shop: Env) -> None:
    owners = [f"o{i}" for i in range(6)]
    ids = await seed_accounts(shop, *owners)
    cache = shop.catalog.sql_cache
    texts: list[list[str]] = []
    params: list[list[tuple[Any, ...]]] = []

    def make(i: int) -> Unit:
        async def unit(uow: af.UnitOfWork) -> None:
            a = uow.find_first("accounts", where={"owner": owners[i]})
            n = uow.count("accounts", where=(af.c.balance > i) & af.c.note.is_null())
            await uow.retrieve()
            assert n.result >= 0
            row = a.result
            uow.update("accounts", row["id"], {"balance": row["balance"] + i}, check=True)
            uow.create("transfers", {"src": row["id"], "dst": ids[owners[0]], "amount": i})

        return unit

    sizes = []
    for i in range(len(owners)):
        statements: list[af.CompiledQuery] = []
        await shop.run(make(i), on_query=statements.append)
        texts.append([q.sql for q in statements])
        params.append([q.parameters for q in statements])
        sizes.append(len(cache))
    assert sizes[0] > 0
    assert sizes == [sizes[0]] * len(owners), sizes
    assert all(t == texts[0] for t in texts)  # same text...
    assert len({p[0] for p in params}) == len(owners)  # ...different parameters
    assert set(texts[-1]) <= set(cache.values())

    # A new shape adds entries; repeating it adds no more.
    async def other_shape(uow: af.UnitOfWork) -> None:
        uow.find("accounts", where=af.c.owner.starts_with("o"), order_by=("balance", "desc"))
        await uow.retrieve()

    await shop.run(other_shape)
    grown = len(cache)
    assert grown > sizes[-1]
    await shop.run(other_shape)
    assert len(cache) == grown
