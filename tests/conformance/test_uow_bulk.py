"""Bulk writes on every backend and runtime: ``create_many``,
``update_many`` and ``delete_many`` (counts, versions, values through the
codec), their statements cut to bounded sizes and still atomic, the checked
variants conflicting when the matched rows change between the unit's
retrieval and its mutation phase, the outbox entry listing every row
written, and hostile input refused before anything is written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import aiofragno as af
import aiofragno.uow.bulk as bulk
from tests.conformance.uow_env import ITEMS, SHOP, Env, MakeEnv, Unit, entry_numbered
from tests.conformance.uow_env import stale as stale_row
from tests.conftest import Target

pytestmark = pytest.mark.anyio


async def _rows(env: Env, table: str = "items") -> dict[str, tuple[Any, ...]]:
    """name -> (qty, tag, version) of every row."""
    found = await env.find(table)
    return {row["name"]: (row["qty"], row["tag"], row["id"].version) for row in found}


async def _seed(env: Env, n: int) -> list[af.RowId]:
    async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
        return uow.create_many("items", [{"name": f"n{i}", "qty": i} for i in range(n)])

    ids: list[af.RowId] = await env.run(unit)
    return ids


async def test_create_update_delete_many(items: Env) -> None:
    ids = await _seed(items, 5)
    assert len(set(ids)) == 5
    assert {(uuid.UUID(i).version, uuid.UUID(i).variant) for i in ids} == {(7, uuid.RFC_4122)}
    found = await items.find("items")
    assert [(row["id"], row["name"], row["qty"], row["tag"]) for row in found] == [
        (ids[i], f"n{i}", i, None) for i in range(5)
    ]

    async def update(uow: af.UnitOfWork) -> af.BulkWrite:
        # Read with another read (one combined statement on PostgreSQL).
        written = uow.update_many("items", af.c.qty >= 2, {"tag": "big", "qty": 7})
        first = uow.find_first("items", where={"name": "n0"})
        await uow.retrieve()
        assert first.result is not None and written.count == 3
        return written

    written = await items.run(update)
    assert written.count == written.result == 3
    assert written.ids == ids[2:]
    assert await _rows(items) == {
        "n0": (0, None, 0),
        "n1": (1, None, 0),
        **{f"n{i}": (7, "big", 1) for i in (2, 3, 4)},
    }

    async def delete(uow: af.UnitOfWork) -> af.BulkWrite:
        return uow.delete_many("items", {"tag": None})

    assert (await items.run(delete)).count == 2

    async def nothing(uow: af.UnitOfWork) -> af.BulkWrite:
        return uow.update_many("items", {"name": "absent"}, {"qty": 1})

    assert (await items.run(nothing)).count == 0

    async def everything(uow: af.UnitOfWork) -> af.BulkWrite:
        return uow.delete_many("items", af.ALL)

    assert (await items.run(everything)).count == 3
    assert await items.count("items") == 0


async def test_statements_are_bounded_and_the_unit_stays_atomic(
    items: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chunk limit of 9 parameters: 2 rows per INSERT (4 parameters each),
    # 6 ids per UPDATE; and of 45 bytes of text: a row with a long name alone.
    monkeypatch.setattr(bulk, "CHUNK_PARAMETERS", 9)
    monkeypatch.setattr(bulk, "CHUNK_BYTES", 45)
    statements: list[af.CompiledQuery] = []

    async def seed(uow: af.UnitOfWork) -> list[af.RowId]:
        rows = [{"name": f"n{i}", "qty": i} for i in range(10)]
        return uow.create_many("items", [*rows[:4], {"name": "x" * 44, "qty": -1}, *rows[4:]])

    ids = await items.run(seed, on_query=statements.append)
    assert [len(query.parameters) // 4 for query in statements] == [2, 2, 1, 2, 2, 2]
    await items.run(lambda uow: _delete_one(uow, ids[4]))
    del ids[4]
    statements.clear()

    async def update(uow: af.UnitOfWork) -> af.BulkWrite:
        return uow.update_many("items", af.ALL, {"qty": 5})

    assert (await items.run(update, on_query=statements.append)).count == 10
    # The read of the rows; per chunk of ids its UPDATE and the check after it.
    assert len(statements) == 1 + 2 * 2
    assert max(len(query.parameters) for query in statements) <= 9

    # A delete whose second chunk finds no row for an id fails (an id given
    # as a str, never read: RowNotFound, as for delete), and its first chunk
    # is rolled back with it.
    async def gone(uow: af.UnitOfWork) -> None:
        uow.delete_many("items", rows=[*ids[:9], "no-such-row"])

    with pytest.raises(af.RowNotFound):
        await items.run(gone, retry=af.NoRetry())
    assert {qty for qty, _, version in (await _rows(items)).values()} == {5}
    assert await items.count("items") == 10


async def _delete_one(uow: af.UnitOfWork, row_id: af.RowId) -> None:
    uow.delete("items", row_id)


async def test_checked_update_conflicts_when_a_matched_row_changed(items: Env) -> None:
    await _seed(items, 3)
    attempts: list[int] = []

    async def concurrent(uow: af.UnitOfWork) -> None:
        if len(attempts) == 1:  # between the first attempt's retrieval and its writes

            async def bump(other: af.UnitOfWork) -> None:
                other.update_many("items", {"name": "n1"}, {"qty": 100})

            await items.run(bump)

    async def unit(uow: af.UnitOfWork) -> af.BulkWrite:
        attempts.append(1)
        found = uow.find("items", where=af.c.qty < 50)
        await uow.retrieve()
        return uow.update_many("items", rows=found.result, values={"tag": "low"}, check=True)

    written = await items.run(unit, hooks=af.UowHooks(before_mutation=concurrent))
    assert len(attempts) == 2
    assert written.count == 2  # n1 no longer matches
    assert await _rows(items) == {"n0": (0, "low", 1), "n1": (100, None, 1), "n2": (2, "low", 1)}


async def test_checked_where_conflicts_when_a_new_row_matches(items: Env) -> None:
    await _seed(items, 2)
    attempts: list[int] = []

    async def concurrent(uow: af.UnitOfWork) -> None:
        if len(attempts) == 1:
            await items.create("items", {"name": "late", "qty": 1})

    async def unit(uow: af.UnitOfWork) -> af.BulkWrite:
        attempts.append(1)
        return uow.delete_many("items", af.c.qty < 10, check=True)

    written = await items.run(unit, hooks=af.UowHooks(before_mutation=concurrent))
    assert len(attempts) == 2
    assert written.count == 3
    assert await items.count("items") == 0


async def test_unchecked_update_conflicts_only_when_a_row_is_gone(items: Env) -> None:
    ids = await _seed(items, 3)
    attempts: list[int] = []

    async def concurrent(uow: af.UnitOfWork) -> None:
        if len(attempts) == 1:

            async def change(other: af.UnitOfWork) -> None:
                other.update("items", ids[0], {"qty": 50})  # still written over
                other.delete("items", ids[1])  # gone: the listed rows would be wrong

            await items.run(change)

    async def unit(uow: af.UnitOfWork) -> af.BulkWrite:
        attempts.append(1)
        return uow.update_many("items", af.ALL, {"tag": "seen"})

    written = await items.run(unit, hooks=af.UowHooks(before_mutation=concurrent))
    assert len(attempts) == 2
    assert written.ids == [ids[0], ids[2]]
    assert await _rows(items) == {"n0": (50, "seen", 2), "n2": (2, "seen", 1)}


async def test_create_many_references_and_dry_run(shop: Env) -> None:
    statements: list[af.CompiledQuery] = []

    async def accounts(uow: af.UnitOfWork) -> list[af.RowId]:
        return uow.create_many("accounts", [{"owner": "a"}, {"owner": "b", "balance": 5}])

    _, b = await shop.run(accounts)
    [a_read] = await shop.find("accounts", where={"owner": "a"})

    async def transfers(uow: af.UnitOfWork) -> list[af.RowId]:
        # A RowId read (internal id), a str (looked up), one created in this unit.
        c = uow.create("accounts", {"owner": "c"})
        return uow.create_many(
            "transfers",
            [
                {"src": a_read["id"], "dst": str(b), "amount": 1},
                {"src": c, "dst": a_read["id"], "amount": 2},
            ],
        )

    await shop.run(transfers, dry_run=True, on_query=statements.append)
    assert len(statements) == 2 and await shop.count("transfers") == 0
    await shop.run(transfers)
    owners = {row["id"]: row["owner"] for row in await shop.find("accounts")}
    moved = [
        (owners[row["src"]], owners[row["dst"]], row["amount"])
        for row in await shop.find("transfers")
    ]
    assert moved == [("a", "b", 1), ("c", "a", 2)]


@pytest.fixture
async def outbox_items(make_outbox_env: MakeEnv) -> Env:
    return await make_outbox_env(ITEMS)


async def _entry(env: Env, unit: Unit) -> tuple[Any, af.OutboxEntry]:
    """What ``unit`` returns, and its outbox entry (found by the
    versionstamp the counter strategy gives it at commit)."""
    units: list[af.UnitOfWork] = []

    async def run(uow: af.UnitOfWork) -> Any:
        units.append(uow)
        return await unit(uow)

    value = await env.run(run)
    stamp = units[-1].versionstamp
    assert stamp is not None
    return value, await entry_numbered(env.db, stamp)


async def test_outbox_entry_lists_every_row_written(outbox_items: Env) -> None:
    env = outbox_items

    async def seed(uow: af.UnitOfWork) -> list[af.RowId]:
        return uow.create_many("items", [{"name": f"n{i}", "qty": i} for i in range(3)])

    ids, created = await _entry(env, seed)
    [read] = await env.find("items", where={"name": "n2"})

    # A stale checked bulk write stops the phase (each plan, with its entry):
    # nothing written, no entry.
    async def stale(uow: af.UnitOfWork) -> None:
        uow.update_many("items", rows=[ids[0]], values={"qty": 1})
        uow.delete_many("items", rows=[stale_row(read["id"])], check=True)

    with pytest.raises(af.ConcurrencyConflict):
        await env.run(stale, retry=af.NoRetry())

    async def unit(uow: af.UnitOfWork) -> None:
        uow.update_many("items", rows=[read], values={"tag": "x", "qty": 9}, check=True)
        uow.delete_many("items", af.c.qty < 2)

    _, written = await _entry(env, unit)
    # (After, not next: other writers share this database's outbox.)
    assert written.versionstamp > created.versionstamp
    common = {"schema": "items", "namespace": env.namespace, "table": "items"}
    [one] = created.payload["mutations"]
    assert one == {
        "op": "create_many",
        **common,
        "versionstamp": created.versionstamp,
        "rows": [
            {"external_id": str(ids[i]), "values": {"name": f"n{i}", "qty": i, "tag": None}}
            for i in range(3)
        ],
    }
    stamp = written.versionstamp[:20]
    assert written.payload["mutations"] == [
        {
            "op": "update_many",
            **common,
            "versionstamp": f"{stamp}0000",
            "external_ids": [str(ids[2])],
            "set": {"tag": "x", "qty": 9},
            "check_versions": [0],
        },
        {
            "op": "delete_many",
            **common,
            "versionstamp": f"{stamp}0001",
            "external_ids": [str(ids[0]), str(ids[1])],
        },
    ]

    # create_many stores a row's values as create does (big ints tagged, ...).
    big = {"name": "big", "qty": 2**60, "tag": "\u00e9"}

    async def both(uow: af.UnitOfWork) -> None:
        uow.create("items", big)
        uow.create_many("items", [big, {"name": "small", "qty": -(2**53)}])

    _, last = await _entry(env, both)
    single, many = last.payload["mutations"]
    assert single["values"] == big
    assert [row["values"] for row in many["rows"]] == [
        big,
        {"name": "small", "qty": -(2**53), "tag": None},
    ]


async def test_hostile_input_is_refused_before_anything_is_written(make_env: MakeEnv) -> None:
    env = await make_env(SHOP)
    await env.create("accounts", {"owner": "a"})
    [row] = await env.find("accounts")
    before = await env.snapshot()
    unversioned = str(row["id"])
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
        ("update_many", ("accounts",), {"values": {"note": "x"}}, "needs where="),
        ("delete_many", ("accounts", {}), {}, "af.ALL for every row"),
        ("delete_many", ("accounts", None), {}, "af.ALL for every row"),
        ("update_many", ("accounts", af.ALL), {}, "needs values="),
        ("update_many", ("accounts", af.ALL, {}), {}, "at least one column"),
        ("update_many", ("accounts", af.ALL, {"nope": 1}), {}, "nope"),
        ("update_many", ("accounts", af.ALL, {"id": "x"}), {}, "cannot be written"),
        ("update_many", ("accounts", af.ALL, {"_version": 1}), {}, "internal"),
        ("update_many", ("accounts", af.ALL, {"balance": "1"}), {}, "balance"),
        ("update_many", ("accounts", af.ALL, {"owner": None}), {}, "NOT NULL"),
        ("update_many", ("accounts", af.ALL, ["balance"]), {}, "dict of column values"),
        ("delete_many", ("accounts", {"nope": 1}), {}, "nope"),
        ("delete_many", ("accounts",), {"rows": [unversioned], "check": True}, "version"),
        ("delete_many", ("accounts",), {"rows": [row, row]}, "twice"),
        ("delete_many", ("accounts",), {"rows": row}, "list of rows"),
        ("delete_many", ("accounts", af.ALL), {"rows": [row]}, "not both"),
        ("delete_many", ("accounts", af.ALL), {"check": 1}, "bool"),
        ("delete_many", ("transfers",), {"rows": [row["id"]]}, "RowId of"),
        ("create_many", ("accounts", {"owner": "a"}), {}, "list of dicts"),
        ("create_many", ("accounts", [{"owner": "a"}, ["owner"]]), {}, "dict of column"),
        ("create_many", ("accounts", [{"owner": "a"}, {"ownr": "b"}]), {}, "ownr"),
        ("create_many", ("accounts", [{"owner": "a"}, {"balance": 1}]), {}, "required"),
        ("create_many", ("accounts", [{"owner": "a", "balance": 2**63}]), {}, "balance"),
        ("create_many", ("accounts", [{"owner": "a", "_id": 1}]), {}, "internal"),
        ("create_many", ("accounts", [{"owner": "a", "id": "x"}]), {}, "cannot be written"),
    ]
    for method, args, kwargs, message in calls:

        async def unit(uow: af.UnitOfWork) -> None:
            uow.create("accounts", {"owner": "before"})
            getattr(uow, method)(*args, **kwargs)  # noqa: B023

        with pytest.raises(af.ValidationError, match=message):
            await env.run(unit)
    assert await env.snapshot() == before


@pytest.mark.slow
async def test_a_hundred_thousand_rows_in_one_unit(items: Env, target: Target) -> None:
    if target.dialect != "postgresql" or target.runtime != "asyncio":
        pytest.skip("a load test: PostgreSQL under asyncio only")
    ids = await _seed(items, 100_000)

    async def update(uow: af.UnitOfWork) -> af.BulkWrite:
        return uow.update_many("items", af.c.qty >= 0, {"tag": "all"}, check=True)

    assert (await items.run(update)).ids == ids
    assert (
        await items.db.fetch_value(
            af.sql(
                "SELECT count(*) FROM {t} WHERE {v} = 1",
                t=items.ident("items"),
                v=af.Identifier("_version"),
            )
        )
        == 100_000
    )
