"""Every read of one ``retrieve()`` sees one snapshot of the database: a
joined tree (its find and each join's read, separate statements where the
reads are not combined into one) and the reads queued beside it.

Writers keep an invariant in each of their units — an account's balance is
the sum of the amounts of its outgoing transfers — by creating, deleting
and re-pointing transfers while they move the balances; readers run joined
finds concurrently and check the invariant on every result. A reader whose
reads saw different moments would find a balance that does not add up, or
a transfer whose account the join did not find.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.driver import CompiledQuery
from aiofragno.session import Session
from tests.conformance.uow_env import Env, reads_combine, write_after_first_read

pytestmark = pytest.mark.anyio

OWNERS = ("a", "b", "c", "d")
WRITES_PER_WRITER = 60
WRITERS = 2


async def seed(shop: Env) -> list[af.RowId]:
    return await shop.create("accounts", *({"owner": owner, "balance": 0} for owner in OWNERS))


def writer(shop: Env, seed_value: int) -> Any:
    """A unit that changes transfers and moves the balances with them, in
    the same unit: create one, delete one, or move one to another account."""
    rng = random.Random(seed_value)

    async def unit(uow: af.UnitOfWork) -> None:
        accounts = uow.find("accounts")
        transfers = uow.find("transfers")
        await uow.retrieve()
        by_id = {str(row["id"]): row for row in accounts.result}
        balance = {key: row["balance"] for key, row in by_id.items()}
        choice = rng.random()
        if choice < 0.4 or not transfers.result:
            src, dst = rng.sample(list(by_id), 2)
            amount = rng.randint(1, 9)
            uow.create(
                "transfers", {"src": by_id[src]["id"], "dst": by_id[dst]["id"], "amount": amount}
            )
            balance[src] += amount
        elif choice < 0.6:
            gone = rng.choice(transfers.result)
            uow.delete("transfers", gone["id"], check=True)
            balance[str(gone["src"])] -= gone["amount"]
        else:
            moved = rng.choice(transfers.result)
            old = str(moved["src"])
            new = rng.choice([key for key in by_id if key != old])
            uow.update("transfers", moved["id"], {"src": by_id[new]["id"]}, check=True)
            balance[old] -= moved["amount"]
            balance[new] += moved["amount"]
        for key, row in by_id.items():
            if balance[key] != row["balance"]:
                uow.update("accounts", row["id"], {"balance": balance[key]}, check=True)
            else:
                uow.check("accounts", row["id"])

    return unit


async def read_trees(uow: af.UnitOfWork) -> tuple[Any, Any, Any]:
    """Both directions of the reference, and an independent read, in one retrieve."""
    accounts = uow.find(
        "accounts",
        join={"out": af.many("transfers", by="src", join={"to": af.one("dst")})},
    )
    transfers = uow.find(
        "transfers", join={"from": af.one("src", join={"out": af.many("transfers", by="src")})}
    )
    total = uow.aggregate("transfers", {"sum": af.fn.sum("amount")})
    await uow.retrieve()
    return accounts.result, transfers.result, total.result


def check_trees(accounts: Any, transfers: Any, total: Any) -> None:
    """The writers' invariant, on each part of one retrieve's results."""
    assert len(accounts) == len(OWNERS)
    for account in accounts:
        assert account["balance"] == sum(t["amount"] for t in account["out"]), account
        for transfer in account["out"]:
            assert transfer["to"] is not None
    balances = {str(a["id"]): a["balance"] for a in accounts}
    outgoing: dict[str, int] = defaultdict(int)
    for transfer in transfers:
        source = transfer["from"]
        assert source is not None
        assert str(source["id"]) == str(transfer["src"])
        # The joined account as the transfers read it, and as the accounts read it.
        assert source["balance"] == sum(t["amount"] for t in source["out"])
        assert source["balance"] == balances[str(source["id"])]
        outgoing[str(source["id"])] += transfer["amount"]
    for key, balance in balances.items():
        assert outgoing[key] == balance
    assert (total["sum"] or 0) == sum(balances.values())


async def test_joined_reads_see_one_snapshot_under_concurrent_writers(shop: Env) -> None:
    await seed(shop)
    done = anyio.Event()
    results: list[int] = []

    async def write(n: int) -> None:
        unit = writer(shop, n)
        for _ in range(WRITES_PER_WRITER):
            await shop.run(unit, retry=af.ExponentialBackoff(max_retries=1000))

    async def read() -> None:
        while not done.is_set():
            check_trees(*await shop.run(read_trees))
            results.append(1)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(read)
        async with anyio.create_task_group() as writers:
            for n in range(WRITERS):
                writers.start_soon(write, n)
        done.set()
    check_trees(*await shop.run(read_trees))
    assert len(results) > 10  # (the readers ran while the writers did)


# Values enough that a find and its joins, each binding them, are too many
# for one statement on PostgreSQL (32767), where reads otherwise combine.
WIDE = 12_000


@pytest.mark.parametrize("wide", [False, True], ids=["tree", "too-wide-to-combine"])
async def test_a_write_between_two_reads_of_a_retrieve_is_not_seen(
    shop: Env, monkeypatch: pytest.MonkeyPatch, wide: bool
) -> None:
    """Deterministically: a unit that commits after the tree's first read has
    run, before its join's, changes neither — the join still finds the
    account the find's transfer names, at the balance it had, and the
    attempt is no conflict. (PostgreSQL reads a tree in one statement,
    unless its reads bind too many values to combine.)"""
    a, b, c, _ = await seed(shop)
    [t] = await shop.create("transfers", {"src": a, "dst": b, "amount": 4})

    async def set_balance(uow: af.UnitOfWork) -> None:
        uow.update("accounts", a, {"balance": 4})

    await shop.run(set_balance)

    async def move(uow: af.UnitOfWork) -> None:
        uow.update("transfers", t, {"src": c, "dst": c})
        uow.update("accounts", a, {"balance": 0})
        uow.update("accounts", c, {"balance": 4})
        uow.delete("accounts", b)

    async def read(uow: af.UnitOfWork) -> Any:
        where = af.c.amount.in_(range(WIDE)) if wide else None
        found = uow.find_first(
            "transfers", where, join={"to": af.one("dst"), "from": af.one("src")}
        )
        await uow.retrieve()
        return found.result

    raced = write_after_first_read(monkeypatch, shop, move)
    conflicts = shop.db.stats.conflicts
    row = await shop.run(read)
    assert row is not None
    # (Too wide: a find and its two joins, each binding WIDE values.)
    fits = not wide or shop.db._engine.adapter.capabilities.max_parameters >= 3 * WIDE
    one_statement = reads_combine(shop.db) and fits
    assert raced == ([] if one_statement else [True])
    assert (row["to"]["owner"], row["from"]["owner"], row["from"]["balance"]) == ("b", "a", 4)
    assert shop.db.stats.conflicts == conflicts


async def test_a_retrieve_reads_beside_an_open_write_transaction(shop: Env) -> None:
    """The snapshot takes no write lock (SQLite: a deferred BEGIN, outside
    the write gate): a joined retrieve runs, and sees the state before it,
    while another transaction holds its writes uncommitted."""
    a, b, _, _ = await seed(shop)
    await shop.create("transfers", {"src": a, "dst": b, "amount": 3})
    accounts = shop.ident("accounts")
    async with shop.db.transaction() as tx:
        await tx.execute(
            af.sql(
                "UPDATE {t} SET {c} = 99 WHERE {i} = {a}",
                t=accounts,
                c=af.Identifier("balance"),
                i=af.Identifier("id"),
                a=str(a),
            )
        )
        with anyio.fail_after(5):
            found = await shop.run(read_trees, retry=af.NoRetry())
    assert {row["owner"]: row["balance"] for row in found[0]}["a"] == 0


async def test_a_join_read_by_key_after_its_page_sees_the_pages_snapshot(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB reads a join's newest rows per parent by key, a statement per
    parent, in a second batch once the page is in (see aiofragno.uow.joins):
    a unit that commits between those statements is not seen by any of them.
    Elsewhere the same write comes between the tree's statements, or not at
    all (PostgreSQL: one statement), with the same result."""
    a, b, _, _ = await seed(shop)
    for src, amount in ((a, 1), (a, 2), (b, 3), (b, 4)):
        await shop.create("transfers", {"src": src, "dst": src, "amount": amount})

    async def newer(uow: af.UnitOfWork) -> None:
        for src in (a, b):
            uow.create("transfers", {"src": src, "dst": src, "amount": 100})

    async def read(uow: af.UnitOfWork) -> Any:
        last = af.many("transfers", by="src", order_by=("amount", "desc"), limit=2)
        found = uow.find("accounts", order_by="owner", limit=2, join={"last": last})
        await uow.retrieve()
        return found.result

    raced = write_after_first_read(monkeypatch, shop, newer)
    rows = await shop.run(read)
    assert raced == ([] if shop.db._engine.adapter.sql.rows_array is not None else [True])
    assert [[t["amount"] for t in row["last"]] for row in rows] == [[2, 1], [4, 3]]
    monkeypatch.undo()
    if not raced:
        await shop.run(newer)
    rows = await shop.run(read)
    assert [[t["amount"] for t in row["last"]] for row in rows] == [[100, 2], [100, 4]]


async def test_a_connection_lost_before_the_reads_by_key_reads_all_again(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MariaDB: the connection is killed after the page's batch, before the
    batch reading its join by key. The retrieve reads everything again on
    a new connection, from a new snapshot; ``on_query`` is told each
    statement once, as it is for the reads of one batch."""
    if shop.db.name != "mysql":
        pytest.skip("reads by key: MariaDB and MySQL")
    a, b, _, _ = await seed(shop)
    for src, amount in ((a, 1), (a, 2), (b, 3), (b, 4)):
        await shop.create("transfers", {"src": src, "dst": src, "amount": amount})
    original = Session.execute_batch
    killed: list[int] = []

    async def execute_batch(self: Session, queries: Any, stop: Any = None) -> Any:
        if not killed and queries[-1].sql == "ROLLBACK" and "transfers" in queries[0].sql:
            (row,) = (await original(self, [CompiledQuery("SELECT CONNECTION_ID()")]))[0].rows
            killed.append(int(row.raw[0]))
            await shop.db.execute(af.sql(f"KILL CONNECTION {killed[0]}"))
        return await original(self, queries, stop)

    monkeypatch.setattr(Session, "execute_batch", execute_batch)
    told: list[CompiledQuery] = []

    async def read(uow: af.UnitOfWork) -> Any:
        last = af.many("transfers", by="src", order_by=("amount", "desc"), limit=2)
        found = uow.find("accounts", order_by="owner", limit=2, join={"last": last})
        await uow.retrieve()
        return [[t["amount"] for t in row["last"]] for row in found.result]

    assert await shop.run(read, on_query=told.append) == [[2, 1], [4, 3]]
    assert killed
    by_key = [q for q in told if "transfers" in q.sql]
    assert len(by_key) == len({q.parameters[0] for q in by_key}) == 2  # (one per account, once)
