"""Typed rows: tables declared with ``row=`` (a TypedDict) and given as
objects wherever a table name is taken — the same statements, rows and
outbox entries as by name — joined finds with a declared row type, and
refusals before any SQL: a table object that is not the unit schema's own,
a row type that does not describe the join tree.

What the type checker sees is tested in tests/test_typing.py; the checks
of a row type against its table in tests/test_row_types.py."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest

import aiofragno as af
from aiofragno.schema import Table
from tests.conformance.uow_env import (
    Env,
    MakeEnv,
    Unit,
    entry_numbered,
    reads_combine,
    write_after_first_read,
)

pytestmark = pytest.mark.anyio


class AccountRow(TypedDict):
    id: af.RowId
    owner: str
    balance: int
    note: str | None


class TransferRow(TypedDict):
    id: af.RowId
    src: af.RowId
    dst: af.RowId
    amount: int


class TransferTo(TransferRow):
    to: AccountRow


class AccountWithOutgoing(AccountRow):
    outgoing: list[TransferTo]


def account_columns() -> list[Any]:
    return [
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Column("note", "string", nullable=True),
        af.Index("by_owner", ["owner"], unique=True),
    ]


accounts = af.Table("accounts", *account_columns(), row=AccountRow)
transfers = af.Table(
    "transfers",
    af.Reference("src", "accounts"),
    af.Reference("dst", "accounts"),
    af.Column("amount", "bigint"),
    row=TransferRow,
)
TYPED = af.Schema("typed", accounts, transfers)


@pytest.fixture
async def typed(make_outbox_env: MakeEnv) -> Env:
    return await make_outbox_env(TYPED)


class Recorded:
    """Runs units, keeping each one's outbox versionstamp."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.stamps: list[str] = []

    async def run(self, unit: Unit) -> Any:
        units: list[af.UnitOfWork] = []

        async def run(uow: af.UnitOfWork) -> Any:
            units.append(uow)
            return await unit(uow)

        value = await self.env.run(run)
        if units[-1].versionstamp is not None:
            self.stamps.append(units[-1].versionstamp)
        return value

    async def tables_written(self) -> list[list[str]]:
        """Per recorded entry, its mutations' operations and tables."""
        written = []
        for stamp in self.stamps:
            entry = await entry_numbered(self.env.db, stamp)
            written.append([f"{m['op']} {m['table']}" for m in entry.mutations])
        return written


async def test_table_objects_stand_for_their_names(typed: Env) -> None:
    """Every operation takes the table object and does what it does by name:
    the same rows read, the same rows written, the same outbox entries."""
    recorded = Recorded(typed)

    async def write(uow: af.UnitOfWork) -> list[af.RowId]:
        a = uow.create(accounts, {"owner": "alice", "balance": 10})
        rest = uow.create_many(accounts, [{"owner": "bob"}, {"owner": "carol", "note": "x"}])
        uow.create(transfers, {"src": a, "dst": rest[0], "amount": 3})
        return [a, *rest]

    alice, bob, carol = await recorded.run(write)

    async def read(uow: af.UnitOfWork) -> Any:
        ops = (
            uow.find(accounts, order_by="owner"),
            uow.find("accounts", order_by="owner"),
            uow.find_first(accounts, where={"owner": "carol"}),
            uow.count(accounts, af.c.balance == 0),
            uow.aggregate(transfers, {"sum": af.fn.sum("amount")}),
        )
        await uow.retrieve()
        return [op.result for op in ops]

    by_object, by_name, first, zero, total = await typed.run(read)
    assert by_object == by_name and [r["owner"] for r in by_object] == ["alice", "bob", "carol"]
    assert first == by_name[2] and first["note"] == "x"
    assert zero == 2 and total == {"sum": 3}

    async def change(uow: af.UnitOfWork) -> af.Upserted:
        found = uow.find_first(accounts, where={"owner": "alice"})
        held = uow.find_first(transfers)
        await uow.retrieve()
        assert found.result is not None and held.result is not None
        uow.update(accounts, found.result["id"], {"balance": 11}, check=True)
        uow.check(transfers, held.result["id"])
        uow.check_absent(accounts, {"owner": "dave"})
        uow.update_many(accounts, af.c.owner.in_(["bob", "carol"]), {"balance": 5})
        uow.delete_many(transfers, af.ALL)
        return uow.upsert(accounts, {"owner": "erin", "balance": 1}, on="by_owner")

    upserted = await recorded.run(change)
    assert upserted.created

    async def drop(uow: af.UnitOfWork) -> None:
        uow.delete(accounts, carol)

    await recorded.run(drop)
    rows = await typed.find("accounts", order_by="owner")
    assert [(r["owner"], r["balance"]) for r in rows] == [("alice", 11), ("bob", 5), ("erin", 1)]
    assert [r["id"] for r in rows[:2]] == [alice, bob]
    assert await typed.count("transfers") == 0
    assert await recorded.tables_written() == [
        ["create accounts", "create_many accounts", "create transfers"],
        ["update accounts", "update_many accounts", "delete_many transfers", "create accounts"],
        ["delete accounts"],
    ]


async def test_streaming_a_table_object(typed: Env) -> None:
    await typed.create("accounts", *({"owner": f"o{i:02}"} for i in range(25)))
    seen = [
        row["owner"]
        async for row in typed.db.stream_find(
            accounts, order_by="owner", schema=TYPED, namespace=typed.namespace, page_size=7
        )
    ]
    assert seen == [f"o{i:02}" for i in range(25)]
    with pytest.raises(af.ValidationError, match="page_size must be a positive int"):
        async for _ in typed.db.stream_find(accounts, schema=TYPED, page_size=0):
            pass


async def test_joined_rows_with_their_declared_type(typed: Env) -> None:
    a, b = await typed.create("accounts", {"owner": "alice"}, {"owner": "bob"})
    await typed.create("transfers", {"src": a, "dst": b, "amount": 4})

    async def unit(uow: af.UnitOfWork) -> Any:
        op = uow.find(
            accounts,
            order_by="owner",
            join={"outgoing": af.many(transfers, by="src", join={"to": af.one("dst")})},
            row=AccountWithOutgoing,
        )
        first = uow.find_first(
            transfers, join={"to": af.one("dst", where={"owner": "bob"})}, row=TransferTo
        )
        await uow.retrieve()
        return op.result, first.result

    tree, first = await typed.run(unit)
    assert [r["owner"] for r in tree] == ["alice", "bob"]
    assert tree[1]["outgoing"] == []
    (sent,) = tree[0]["outgoing"]
    assert sent["amount"] == 4 and sent["to"]["owner"] == "bob"
    assert first is not None and first["to"]["owner"] == "bob"
    assert set(first) == set(TransferTo.__annotations__) | {"id"}


class TransferWithoutJoin(TransferRow):
    pass


class TransferToMaybe(TransferRow):
    to: AccountRow | None


class TransferToWrong(TransferRow):
    to: TransferRow


class AccountWithOne(AccountRow):
    outgoing: TransferRow


@pytest.mark.parametrize(
    ("table", "join", "row", "message"),
    [
        (transfers, {"to": af.one("dst")}, TransferWithoutJoin, "missing to"),
        (transfers, {"to": af.one("dst")}, AccountRow, "missing src, dst, amount, to"),
        (
            transfers,
            {"to": af.one("dst")},
            TransferToWrong,
            "join 'to': row type 'TransferRow' of table 'accounts'",
        ),
        (accounts, {"outgoing": af.many(transfers, by="src")}, AccountWithOne, "list["),
        (accounts, {"outgoing": af.many("transfers", by="src")}, AccountRow, "missing outgoing"),
    ],
)
async def test_a_row_type_unlike_the_tree_is_refused_before_any_sql(
    typed: Env, table: Table[Any], join: Any, row: Any, message: str
) -> None:
    queries: list[Any] = []

    async def unit(uow: af.UnitOfWork) -> None:
        uow.find(table, join=join, row=row)
        await uow.retrieve()

    with pytest.raises(af.SchemaError, match=f".*{message.replace('[', '.')}"):
        await typed.run(unit, on_query=queries.append)
    assert queries == []


async def test_a_join_to_a_row_that_may_be_missing_may_say_none(typed: Env) -> None:
    """A ``one`` join along a reference that is never NULL may be declared
    ``| None`` or not; the row is there either way."""
    a = (await typed.create("accounts", {"owner": "alice"}))[0]
    await typed.create("transfers", {"src": a, "dst": a, "amount": 1})

    async def unit(uow: af.UnitOfWork) -> Any:
        op = uow.find(transfers, join={"to": af.one("dst")}, row=TransferToMaybe)
        await uow.retrieve()
        return op.result

    (row,) = await typed.run(unit)
    assert row["to"] is not None and row["to"]["owner"] == "alice"


async def test_a_table_object_not_of_the_units_schema_is_refused(typed: Env) -> None:
    """A table object of the same name but another declaration would be read
    through a declaration that is not the table's: refused before any SQL.
    An equal declaration (a copy) stands for the schema's table."""
    other = af.Table("accounts", af.Column("owner", "string"), af.Column("extra", "bigint"))
    copy = af.Table("accounts", *account_columns(), row=AccountRow)
    queries: list[Any] = []

    async def bad_write(uow: af.UnitOfWork) -> None:
        uow.create(other, {"owner": "mallory", "extra": 1})

    async def bad_read(uow: af.UnitOfWork) -> None:
        uow.find(other)

    async def bad_join(uow: af.UnitOfWork) -> None:
        lookalike = af.Table("transfers", af.Reference("src", "accounts"))
        uow.find(accounts, join={"outgoing": af.many(lookalike, by="src")})

    async def bad_after_copies(uow: af.UnitOfWork) -> None:
        # (each copy is compared once, then remembered; a bounded number)
        for _ in range(70):
            uow.find(af.Table("accounts", *account_columns()))
        uow.find(other)

    for unit in (bad_write, bad_read, bad_join, bad_after_copies):
        with pytest.raises(af.ValidationError, match="not the table of that name"):
            await typed.run(unit, on_query=queries.append)
    assert queries == [] and await typed.count("accounts") == 0

    async def good(uow: af.UnitOfWork) -> Any:
        uow.create(copy, {"owner": "alice"})

    await typed.run(good)
    assert [r["owner"] for r in await typed.find("accounts")] == ["alice"]

    async def unknown(uow: af.UnitOfWork) -> None:
        uow.find(af.Table("nowhere", af.Column("x", "bigint")))

    with pytest.raises(af.ValidationError, match="no table 'nowhere'"):
        await typed.run(unknown)


async def test_a_one_join_never_says_none_for_a_row_that_was_there(
    typed: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent unit that re-points a transfer and deletes the account
    it named, committed between the find's read and its join's (separate
    statements on MySQL and SQLite), changes neither: the reads see one
    snapshot (aiofragno.uow.snapshot), so the row's ``to`` is the account
    it named then — never None against its row type (``TransferTo.to:
    AccountRow``), and no conflict."""
    a, b, c = await typed.create(
        "accounts", {"owner": "alice"}, {"owner": "bob"}, {"owner": "carol"}
    )
    [t] = await typed.create("transfers", {"src": a, "dst": b, "amount": 1})

    async def move(uow: af.UnitOfWork) -> None:
        uow.update(transfers, t, {"dst": c})
        uow.delete(accounts, b)

    async def read(uow: af.UnitOfWork) -> Any:
        found = uow.find_first(transfers, join={"to": af.one("dst")}, row=TransferTo)
        await uow.retrieve()
        return found.result

    raced = write_after_first_read(monkeypatch, typed, move)
    conflicts = typed.db.stats.conflicts
    row = await typed.run(read)
    assert raced == ([] if reads_combine(typed.db) else [True])
    assert row is not None and row["to"]["owner"] == "bob"
    assert typed.db.stats.conflicts == conflicts
    dst = [str(r["dst"]) for r in await typed.find("transfers")]
    assert dst == [str(c if raced else b)]  # (the write did commit)
