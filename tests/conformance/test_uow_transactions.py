"""A unit's transaction and the caller's: a unit does not join a
``db.transaction()`` open in its task (and is refused where it could only
wait for it), and a unit that only reads opens no transaction.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.session import Session
from tests.conformance.uow_env import (
    SHOP,
    Env,
    read_account,
    seed_accounts,
)

pytestmark = pytest.mark.anyio


async def test_a_unit_inside_a_callers_transaction_commits_on_its_own(shop: Env) -> None:
    """``execute_uow`` does not join a ``db.transaction()`` open in the same
    task: the unit runs and commits on a connection of its own, so rolling
    the caller's transaction back keeps the unit's writes and undoes only the
    caller's. It does wait for the locks the caller's transaction holds
    (on SQLite the unit is refused instead: see the next test)."""
    db = shop.db
    if db._engine.adapter.capabilities.one_writer:
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
    if not db._engine.adapter.capabilities.one_writer:
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
