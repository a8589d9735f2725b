"""The unit of work's writes on every backend and runtime: the reference
transfer scenario, creates (their ids, in order), updates (versions, NULLs),
deletes, and integrity errors that leave nothing written.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import pytest

import aiofragno as af
from tests.conformance.uow_env import (
    Env,
    read_account,
    seed_accounts,
)

pytestmark = pytest.mark.anyio


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
