"""Optimistic concurrency in the unit of work: a checked update, delete or
check of a row at a version it no longer has is a ConcurrencyConflict, and
nothing of the unit is written, even when a later statement fails too.

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
