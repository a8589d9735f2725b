"""Choosing columns: ``find(..., select=[...])`` and ``find_first``. Only the
asked columns are read; the id (a RowId with its version) always comes, so a
checked update works; order columns left out still page by cursor."""

from __future__ import annotations

from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import Env, seed_accounts

pytestmark = pytest.mark.anyio


async def test_select_reads_only_the_asked_columns(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    await shop.create("transfers", {"src": ids["alice"], "dst": ids["bob"], "amount": 7})
    statements: list[af.CompiledQuery] = []

    async def unit(uow: af.UnitOfWork) -> tuple[Any, ...]:
        owners = uow.find("accounts", order_by="owner", select=["owner", "id", "owner"])
        first = uow.find_first("accounts", {"owner": "bob"}, select=("balance",))
        src = uow.find_first("transfers", select=["src"])
        everything = uow.find("accounts", af.c.owner == "carol")
        last = uow.find_first("accounts", order_by=("owner", "desc"), select=["balance"])
        await uow.retrieve()
        return owners.result, first.result, src.result, everything.result, last.result

    owners, first, src, everything, last = await shop.run(unit, on_query=statements.append)
    assert last == {"id": ids["carol"], "balance": 100}  # (ordered by a column not read)
    assert owners == [{"id": ids[o], "owner": o} for o in ("alice", "bob", "carol")]
    assert [type(r["id"]) for r in owners] == [af.RowId] * 3
    assert first == {"id": ids["bob"], "balance": 100}
    assert src == {"id": src["id"], "src": ids["alice"]} and isinstance(src["src"], af.RowId)
    assert set(everything[0]) == {"id", "owner", "balance", "note"}
    selected = [q.sql.split(" FROM ")[0] for q in statements]
    # (The balance is not read for the owners, the owner not for the balance.)
    assert "balance" not in selected[0] and "note" not in selected[0]
    assert "owner" not in selected[1] and "balance" in selected[1]
    assert "owner" not in selected[4]

    async def pay(uow: af.UnitOfWork) -> None:
        bob = uow.find_first("accounts", {"owner": "bob"}, select=["balance"])
        await uow.retrieve()
        row = bob.result
        assert row is not None
        uow.update("accounts", row["id"], {"balance": row["balance"] + 1}, check=True)

    await shop.run(pay)
    assert (await shop.find("accounts", where={"owner": "bob"}))[0]["balance"] == 101


async def test_select_pages_by_columns_it_leaves_out(shop: Env) -> None:
    await seed_accounts(shop, *(f"o{i}" for i in range(5)))

    async def page(uow: af.UnitOfWork, after: str | None) -> af.FindResult:
        op = uow.find(
            "accounts", order_by=("owner", "desc"), limit=2, after=after, select=["balance"]
        )
        await uow.retrieve()
        return op.result

    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        rows = await shop.run(lambda uow, after=cursor: page(uow, after))
        seen.extend(rows)
        cursor = rows.cursor
        if cursor is None:
            break
    assert [set(r) for r in seen] == [{"id", "balance"}] * 5
    everything = await shop.find("accounts", order_by=("owner", "desc"))
    assert [r["id"] for r in seen] == [r["id"] for r in everything]


async def test_select_refuses_what_is_no_column(shop: Env) -> None:
    cases: list[tuple[Any, str]] = [
        (["nope"], "nope"),
        (["_version"], "internal"),
        ("owner", "list of column names"),
        ([3], "str"),
    ]

    async def unit(uow: af.UnitOfWork) -> None:
        for select, match in cases:
            with pytest.raises(af.ValidationError, match=match):
                uow.find("accounts", select=select)
            with pytest.raises(af.ValidationError, match=match):
                uow.find_first("accounts", select=select)

    await shop.run(unit)
