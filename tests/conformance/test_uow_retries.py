"""Retries of a unit after a conflict: exhausting the policy, custom
policies, the unit's id across attempts, and the hooks around each attempt.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import (
    Env,
    RecordingPolicy,
    read_account,
    seed_accounts,
    stale,
)

pytestmark = pytest.mark.anyio


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
