"""A RowId belongs to the table it came from, on every backend and runtime.

Its internal id and version are another table's numbers anywhere else: a
RowId of another table — of the same schema, or of the same table in another
namespace (tenant) — used as a reference, a write's target or a page's cursor
is refused with ValidationError when queued, before any SQL, and nothing is
written. A RowId of this table from another Database, a plain id string or a
RowId built by hand are found by their external id.
"""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target

pytestmark = pytest.mark.anyio

BANK = af.Schema(
    "bank",
    af.Table("accounts", af.Column("owner", "string")),
    af.Table("cards", af.Column("label", "string")),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("card", "cards", nullable=True),
        af.Column("amount", "bigint"),
    ),
)

Unit = Callable[[af.UnitOfWork], Awaitable[Any]]


class Bank:
    """BANK migrated under one namespace of ``db``."""

    def __init__(self, db: af.Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def run(self, fn: Unit) -> Any:
        return await self.db.execute_uow(fn, schema=BANK, namespace=self.namespace)

    async def seed(self, owners: int = 3) -> dict[str, list[af.RowId]]:
        """``owners`` accounts and as many cards, then a transfer from each
        account; every row as read back (RowIds with internal ids)."""

        async def create(uow: af.UnitOfWork) -> None:
            for n in range(owners):
                uow.create("accounts", {"owner": f"o{n}"})
                uow.create("cards", {"label": f"c{n}"})

        await self.run(create)
        rows = await self.find_all()

        async def transfers(uow: af.UnitOfWork) -> None:
            for account in rows["accounts"]:
                uow.create("transfers", {"src": account["id"], "amount": 1})

        await self.run(transfers)
        return {
            table: [row["id"] for row in found] for table, found in (await self.find_all()).items()
        }

    async def find_all(self) -> dict[str, list[dict[str, Any]]]:
        async def unit(uow: af.UnitOfWork) -> dict[str, list[dict[str, Any]]]:
            ops = {table: uow.find(table) for table in BANK.tables}  # (by internal id)
            await uow.retrieve()
            return {table: list(op.result) for table, op in ops.items()}

        return await self.run(unit)

    async def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, hidden columns included, as plain values."""
        found = await self.find_all()
        return {
            table: sorted(
                tuple((k, str(v), getattr(v, "version", None)) for k, v in sorted(row.items()))
                for row in rows
            )
            for table, rows in found.items()
        }


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


@pytest.fixture
async def banks(db: af.Database, spaces: Namespaces) -> tuple[Bank, Bank]:
    """BANK under two namespaces of one database: the same tables twice, with
    the same internal ids."""
    made = []
    for _ in range(2):
        namespace = spaces.use(db, BANK).namespace
        await db.migrate(BANK, namespace=namespace)
        made.append(Bank(db, namespace))
    return made[0], made[1]


async def refused(bank: Bank, queue: Callable[[af.UnitOfWork], None]) -> af.ValidationError:
    """Run a unit that queues with ``queue``; return the ValidationError it
    raised at the call, after checking that nothing was written."""
    before = await bank.snapshot()
    raised: list[af.ValidationError] = []

    async def unit(uow: af.UnitOfWork) -> None:
        try:
            queue(uow)
        except af.ValidationError as exc:
            raised.append(exc)
            raise

    with pytest.raises(af.ValidationError):
        await bank.run(unit)
    assert raised, "the ValidationError must come from the call that queued the write"
    assert await bank.snapshot() == before
    return raised[0]


async def test_a_reference_refuses_a_row_of_another_table(banks: tuple[Bank, Bank]) -> None:
    """A card's RowId read back carries the card's internal id, which some
    account shares: as a transfer's ``src`` it must not point at that account."""
    bank, _ = banks
    ids = await bank.seed()
    card = ids["cards"][0]
    assert card.internal_id in {a.internal_id for a in ids["accounts"]}
    error = await refused(bank, lambda uow: uow.create("transfers", {"src": card, "amount": 5}))
    assert "transfers.src" in str(error) and "'cards'" in str(error), error
    # A transfer's RowId, a reference read back from a transfer, and a card
    # just created in the same unit: all of other tables than accounts.
    transfer = ids["transfers"][0]
    await refused(bank, lambda uow: uow.create("transfers", {"src": transfer, "amount": 5}))
    rows = await bank.find_all()
    src_of_transfer = rows["transfers"][0]["src"]
    account = ids["accounts"][0]
    await refused(
        bank,
        lambda uow: uow.create("transfers", {"src": account, "card": src_of_transfer, "amount": 5}),
    )

    def fresh_card(uow: af.UnitOfWork) -> None:
        new = uow.create("cards", {"label": "new"})
        uow.create("transfers", {"src": new, "amount": 5})

    await refused(bank, fresh_card)


async def test_a_reference_refuses_the_same_table_of_another_namespace(
    banks: tuple[Bank, Bank],
) -> None:
    """The same schema under two namespaces: an account of one tenant, with
    the internal id of an account of the other, is no account of the other."""
    one, two = banks
    ids_one = await one.seed()
    ids_two = await two.seed()
    theirs = ids_one["accounts"][1]
    assert theirs.internal_id == ids_two["accounts"][1].internal_id
    error = await refused(two, lambda uow: uow.create("transfers", {"src": theirs, "amount": 5}))
    assert one.namespace in str(error) and two.namespace in str(error), error

    def created_elsewhere(uow: af.UnitOfWork) -> None:
        uow.update("transfers", ids_two["transfers"][0], {"src": theirs})

    await refused(two, created_elsewhere)
    # A condition on a reference binds its value the same way.
    with pytest.raises(af.ValidationError, match=r"transfers\.src"):
        await two.run(lambda uow: _find(uow, "transfers", {"src": theirs}))


@pytest.mark.parametrize("write", ["update", "checked update", "delete", "checked delete", "check"])
async def test_a_write_refuses_a_row_id_of_another_table(
    banks: tuple[Bank, Bank], write: str
) -> None:
    """update/delete/check of a table with the RowId of a row of another
    table, or of the same table in another namespace: a ValidationError at
    the call — not a conflict retried until it gives up, nor a silent no-op."""
    one, two = banks
    ids_one = await one.seed()
    ids_two = await two.seed()
    checked = write.startswith("checked") or write == "check"
    strangers = [
        ("accounts", ids_two["cards"][0]),  # another table
        ("accounts", ids_one["accounts"][0]),  # the same table, another namespace
    ]
    if not checked:  # (a RowId decoded from a reference has no version)
        src = (await two.find_all())["transfers"][0]["src"]  # an account's id
        strangers.append(("transfers", src))
    for table, stranger in strangers:

        def queue(uow: af.UnitOfWork, table: str = table, stranger: af.RowId = stranger) -> None:
            if write.endswith("update"):
                values = {"owner": "x"} if table == "accounts" else {"amount": 9}
                uow.update(table, stranger, values, check=checked)
            elif write.endswith("delete"):
                uow.delete(table, stranger, check=checked)
            else:
                uow.check(table, stranger)

        error = await refused(two, queue)
        assert f"{table!r} of namespace {two.namespace!r}" in str(error), error


async def test_row_ids_of_the_right_table_work(
    banks: tuple[Bank, Bank], db: af.Database, url: str, target: Target
) -> None:
    """References by a RowId read back (internal id), returned by create in
    the same unit, decoded from a reference column, as an id string, built
    by hand, unpickled, and read through another Database on the same
    database: each points at its row."""
    bank, _ = banks
    ids = await bank.seed(2)
    account = ids["accounts"][1]
    rows = await bank.find_all()
    decoded = rows["transfers"][1]["src"]
    assert decoded == account and decoded.table is account.table
    async with af.connect(url, backend=target.backend, pool_size=1) as other:
        elsewhere = await other.execute_uow(
            lambda uow: _first(uow, "accounts", str(account)), schema=BANK, namespace=bank.namespace
        )
    assert elsewhere == account and elsewhere.table is not account.table
    sources: list[Any] = [
        account,
        decoded,
        str(account),
        af.RowId(str(account)),
        pickle.loads(pickle.dumps(account)),
        elsewhere,
    ]

    async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
        made = [uow.create("transfers", {"src": src, "amount": 7}) for src in sources]
        fresh = uow.create("accounts", {"owner": "fresh"})
        made.append(uow.create("transfers", {"src": fresh, "amount": 7}))
        uow.check("accounts", elsewhere)
        uow.update("accounts", decoded, {"owner": "renamed"})
        return made

    made = await bank.run(unit)
    found = {row["id"]: row for row in (await bank.find_all())["transfers"]}
    assert [found[m]["src"] for m in made[:-1]] == [account] * len(sources)
    owners = {row["id"]: row["owner"] for row in (await bank.find_all())["accounts"]}
    assert owners[account] == "renamed"
    assert owners[found[made[-1]]["src"]] == "fresh"


async def _find(uow: af.UnitOfWork, table: str, where: dict[str, Any]) -> list[dict[str, Any]]:
    op = uow.find(table, where=where)
    await uow.retrieve()
    return list(op.result)


async def _first(uow: af.UnitOfWork, table: str, external_id: str) -> af.RowId:
    op = uow.find_first(table, where={"id": external_id})
    await uow.retrieve()
    assert op.result is not None
    return op.result["id"]


async def test_a_cursor_of_another_namespace_is_refused(banks: tuple[Bank, Bank]) -> None:
    """A page's cursor is a position in one physical table: the same table of
    another namespace (same schema, same order) refuses it."""
    one, two = banks
    await one.seed()
    await two.seed()

    async def page(bank: Bank, after: str | None) -> af.FindResult:
        async def unit(uow: af.UnitOfWork) -> af.FindResult:
            op = uow.find("accounts", order_by="owner", limit=1, after=after)
            await uow.retrieve()
            return op.result

        return await bank.run(unit)

    first = await page(one, None)
    assert first.cursor is not None
    assert [r["owner"] for r in await page(one, first.cursor)] == ["o1"]
    with pytest.raises(af.ValidationError, match="another table"):
        await page(two, first.cursor)


async def test_a_deleted_rows_id_never_names_a_later_row(banks: tuple[Bank, Bank]) -> None:
    """SQLite gives a deleted row's internal id (its rowid) to the next row
    created: a RowId read before the delete must not then reference the new
    row. The reference fails as one to a missing row, on every backend."""
    bank, _ = banks
    ids = await bank.seed(1)
    [transfer] = ids["transfers"]

    async def delete_newest(uow: af.UnitOfWork) -> None:
        uow.delete("transfers", transfer)
        uow.create("accounts", {"owner": "doomed"})

    await bank.run(delete_newest)
    doomed = next(r["id"] for r in (await bank.find_all())["accounts"] if r["owner"] == "doomed")

    async def replace(uow: af.UnitOfWork) -> None:
        uow.delete("accounts", doomed)

    await bank.run(replace)
    await bank.run(lambda uow: _create(uow, "accounts", {"owner": "newcomer"}))
    newcomer = next(
        r["id"] for r in (await bank.find_all())["accounts"] if r["owner"] == "newcomer"
    )
    if bank.db.name == "sqlite":
        assert newcomer.internal_id == doomed.internal_id  # (what makes the case)
    before = await bank.snapshot()
    with pytest.raises(af.ForeignKeyViolation):
        await bank.run(lambda uow: _create(uow, "transfers", {"src": doomed, "amount": 1}))
    assert await bank.snapshot() == before


async def _create(uow: af.UnitOfWork, table: str, values: dict[str, Any]) -> af.RowId:
    return uow.create(table, values)
