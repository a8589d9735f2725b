"""References in the unit of work: to rows created in the same unit, by
RowId or external id string, to rows that do not exist, NULL references (and
the SQL cache, whose texts depend on them), and a table referencing itself.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import (
    Env,
    MakeEnv,
    read_account,
    seed_accounts,
)

pytestmark = pytest.mark.anyio


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
