"""The statements a unit sends: none without operations, one per phase
where its operations can be combined (one by one where they depend on each
other), every one seen by ``on_query``, none in a dry run, and their SQL
text cached by shape.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import aiofragno as af
from aiofragno.session import Session
from tests.conformance.uow_env import (
    Env,
    RecordingPolicy,
    SentBatches,
    Unit,
    read_account,
    reads_combine,
    seed_accounts,
    stale,
)

pytestmark = pytest.mark.anyio


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
    combined = shop.db._engine.adapter.capabilities.supports_writable_cte
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


async def test_no_ops_means_no_query(shop: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    acquired = 0
    original = shop.db._engine.acquire

    async def counting_acquire() -> Session:
        nonlocal acquired
        acquired += 1
        return await original()

    monkeypatch.setattr(shop.db._engine, "acquire", counting_acquire)
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
    assert statements == [] and acquired == 0 and hooked == []


def _read_batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The statements of each batch the sessions run from now on."""
    batches: list[list[str]] = []
    original = Session.execute_batch

    async def spying(self_: Session, queries: Any, stop: Any = None) -> Any:
        batches.append([q.sql for q in queries])
        return await original(self_, queries, stop)

    monkeypatch.setattr(Session, "execute_batch", spying)
    return batches


async def test_reads_of_one_retrieve_travel_as_one_statement(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the dialect has arrays of rows, the reads queued for one
    ``retrieve()`` are one statement (MySQL's union takes fewer reads, of
    bounded rows: see the next test); every read's result is what it would
    be on its own: order (by NULLs and ties too), pages, references, NULLs,
    counts, no rows."""
    ids = await seed_accounts(shop, "alice", "bob", "carol", "dave")

    async def seed(uow: af.UnitOfWork) -> None:
        uow.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 7})
        uow.create("people", {"email": "e@example.com"})  # (account: NULL)
        for n, account in enumerate([ids["bob"], None, ids["bob"], ids["alice"]]):
            uow.create("people", {"email": f"p{n}@example.com", "account": account})

    await shop.run(seed)
    reads: list[Callable[[af.UnitOfWork], Any]] = [
        lambda uow: uow.find("accounts", order_by=("owner", "desc"), limit=2),
        lambda uow: uow.find_first("accounts", where={"owner": "carol"}),
        lambda uow: uow.count("accounts", where=af.c.balance >= 100),
        lambda uow: uow.find("transfers", where={"src": ids["alice"]}),
        lambda uow: uow.find("people"),
        lambda uow: uow.find_first("accounts", where={"owner": "nobody"}),
        lambda uow: uow.find("accounts", where={"owner": "nobody"}),
        lambda uow: uow.find("people", order_by=("account", "desc")),
        lambda uow: uow.find("people", order_by="account"),
        lambda uow: uow.find("accounts", order_by=["balance", ("owner", "desc")], limit=3),
    ]

    async def one_by_one(uow: af.UnitOfWork) -> list[Any]:
        results = []
        for read in reads:
            op = read(uow)
            await uow.retrieve()
            results.append(op.result)
        return results

    alone = await shop.run(one_by_one)
    batches = _read_batches(monkeypatch)

    async def together(uow: af.UnitOfWork) -> list[Any]:
        ops = [read(uow) for read in reads]
        await uow.retrieve()
        return [op.result for op in ops]

    both = await shop.run(together)
    dialect = shop.db._engine.adapter.sql
    if dialect.rows_array is not None:
        assert [len(batch) for batch in batches] == [1]
    else:  # (one batch, the reads in a snapshot: aiofragno.uow.snapshot)
        [batch] = batches
        begin = list(dialect.read_snapshot)
        assert batch[: len(begin)] == begin and batch[-1] == "ROLLBACK"
        assert len(batch) == len(begin) + len(reads) + 1
    assert both == alone
    assert [row["owner"] for row in both[0]] == ["dave", "carol"]
    assert both[0].cursor == alone[0].cursor and both[0].cursor is not None
    assert both[1]["id"] == ids["carol"] and both[1]["id"].internal_id is not None
    assert both[2] == 4
    assert [(t["src"], t["dst"], t["amount"]) for t in both[3]] == [(ids["alice"], ids["bob"], 7)]
    assert both[4][0]["account"] is None
    assert both[5] is None and both[6] == []


async def test_a_few_bounded_reads_unite_and_more_go_as_a_batch(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MySQL unites a retrieve's reads only while they are few, of few rows
    and columns (aiofragno.uow.combine_reads); more go as the batch. Either
    way each read's result is what it would be on its own."""
    ids = await seed_accounts(shop, "alice", "bob", "carol", "dave")

    async def seed(uow: af.UnitOfWork) -> None:
        for n, account in enumerate([ids["bob"], None, ids["bob"], ids["alice"]]):
            uow.create("people", {"email": f"p{n}@example.com", "account": account})

    await shop.run(seed)
    few: list[Callable[[af.UnitOfWork], Any]] = [
        lambda uow: uow.find("accounts", order_by=["balance", ("owner", "desc")], limit=3),
        lambda uow: uow.find_first("people", order_by=("account", "desc")),
        lambda uow: uow.count("people", where={"account": None}),
        lambda uow: uow.find(
            "accounts",
            where={"owner": "bob"},
            limit=1,
            join={"people": af.many("people", by="account", order_by="email", limit=5)},
        ),
    ]
    more = [*few, lambda uow: uow.find("people", order_by="email")]  # (no limit)

    async def together(reads: list[Callable[[af.UnitOfWork], Any]], uow: af.UnitOfWork) -> Any:
        ops = [read(uow) for read in reads]
        await uow.retrieve()
        return [op.result for op in ops]

    async def one_by_one(uow: af.UnitOfWork) -> list[Any]:
        return [(await together([read], uow))[0] for read in more]

    alone = await shop.run(one_by_one)
    batches = _read_batches(monkeypatch)
    assert await shop.run(functools.partial(together, few)) == alone[: len(few)]
    assert await shop.run(functools.partial(together, more)) == alone
    if shop.db._engine.adapter.capabilities.unites_reads:
        [[united], batch] = batches
        assert united.startswith("(SELECT 0 AS q")
        # (The reads, the join's one more, the snapshot's two statements, ROLLBACK.)
        assert len(batch) == len(more) + 4
    elif reads_combine(shop.db):
        assert [len(batch) for batch in batches] == [1, 1]


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
    acquired = 0
    original = shop.db._engine.acquire

    async def counting_acquire() -> Session:
        nonlocal acquired
        acquired += 1
        return await original()

    monkeypatch.setattr(shop.db._engine, "acquire", counting_acquire)
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
    assert acquired == 0
    monkeypatch.undo()
    assert await shop.snapshot() == before

    # Validation still happens in a dry run.
    async def bad(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": 1})

    with pytest.raises(af.ValidationError, match=r"accounts\.owner"):
        await shop.run(bad, dry_run=True)


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
