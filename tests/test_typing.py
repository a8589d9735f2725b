"""The public API as a user's type checker sees it: ``mypy --strict`` over
small programs. README-style code must pass, with the types it states
(``assert_type``); each line marked ``# E: <text>`` must be an error whose
message contains ``<text>``, and no other line may be one.

One mypy run over all the programs (in a private cache directory): mypy
takes seconds, not the tests around it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import mypy.api
import pytest

import aiofragno

# README-style use: must type-check under --strict, with these types.
GOOD = """
import decimal
import enum
import ssl
from pathlib import Path
from typing import Any, Literal, TypedDict, assert_type

import aiofragno as af
from aiofragno.naming import NamingStrategy


async def raw_sql(db: af.Database) -> None:
    q = af.sql("SELECT count(*) FROM {t}", t=af.Identifier("accounts_shop"))
    assert_type(await db.fetch(q), list[af.Row])
    assert_type(await db.fetch_one(q), af.Row | None)
    assert_type(await db.fetch_value(q), object)
    assert_type(await db.fetch_value(q, int), int)
    assert_type(await db.execute(q), af.QueryResult)
    async with db.transaction() as tx:
        assert_type(await tx.fetch_value(q, str), str)
        async with tx.stream(q) as in_tx:
            assert_type(await in_tx.next_batch(), list[af.Row])
    async with db.stream(q, batch_size=500) as rows:
        assert_type(rows, af.Rows)
        async for row in rows:
            assert_type(row, af.Row)
    shop = af.Schema("shop", af.Table("accounts", af.Column("owner", "string")))
    async for found in db.stream_find("accounts", order_by="owner", schema=shop):
        assert_type(found, dict[str, Any])
        await tx.execute(af.sql("UPDATE t SET a = {a}", a=1) + af.sql(" WHERE b = {b}", b=2))
    n = await db.fetch_value(q, int)
    print(n + 1)
    if (value := await db.fetch_value(q)) is not None:
        print(str(value))


async def connecting(naming: NamingStrategy) -> None:
    db = await af.connect("sqlite:///app.db")
    assert_type(db, af.Database)
    await af.connect("postgresql://postgres@localhost/app", pool_size=20, command_timeout=None)
    await af.connect("sqlite:///app.db", backend="aiosqlite", acquire_timeout=5, pre_ping=True)
    await af.connect("sqlite:///app.db", naming="suffix", sqlite_timestamps="iso-text")
    await af.connect("postgresql:///app", naming=naming, naive_datetimes="utc", search_path="s")
    await af.connect("postgresql://db.example.com/app", sslmode="verify-full", sslrootcert=Path("ca.pem"))
    await af.connect("mysql://db.example.com/app", ssl_ca="ca.pem", ssl_verify_identity=True)
    await af.connect("postgresql://db/app", ssl=ssl.create_default_context(), application_name="api")
    await af.connect("postgresql://db/app", server_settings={"statement_timeout": "5s"})
    options: af.ConnectOptions = {"outbox": True, "max_idle": None}
    async with af.connect("sqlite:///app.db", **options) as db:
        assert_type(db, af.Database)


async def transfer(uow: af.UnitOfWork) -> af.RowId:
    a = uow.find_first("accounts", where={"owner": "alice"})
    b = uow.find_first("accounts", where=af.c.owner == "bob")
    page = uow.find("accounts", order_by="owner", limit=10)
    n = uow.count("accounts")
    await uow.retrieve()
    acc_a, acc_b = a.result, b.result
    assert_type(acc_a, dict[str, Any] | None)
    assert_type(page.result, af.FindResult)
    assert_type(page.result.cursor, str | None)
    assert_type(n.result, int)
    if acc_a is None or acc_b is None:
        raise LookupError("no such account")
    uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - 5}, check=True)
    return uow.create("transfers", {"src": acc_a["id"], "dst": acc_b["id"], "n": n.result + 1})


async def aggregates(uow: af.UnitOfWork) -> None:
    total = uow.aggregate("accounts", {"n": af.fn.count(), "sum": af.fn.sum("balance")})
    per = uow.aggregate("transfers", {"sent": af.fn.sum("amount")}, group_by=["src"])
    names = uow.find("accounts", where=af.c.owner.istarts_with("a"), select=["owner"])
    meta = uow.find_first("accounts", where=af.c.meta["k"][0] == 1, select=("owner",))
    await uow.retrieve()
    assert_type(total.result, dict[str, Any])
    assert_type(per.result, list[dict[str, Any]])
    assert_type(names.result, af.FindResult)
    assert_type(meta.result, dict[str, Any] | None)


async def relaying(db: af.Database) -> None:
    sink: af.BrokerSink = af.NatsSink("nats://127.0.0.1:4222", subject="shop", max_in_flight=64)
    assert_type(await db.outbox.relay(sink, until_caught_up=True), int)
    await db.outbox.relay(af.RedisSink(key="shop"), batch_size=500, after=None)
    by_table = af.NatsSink(subject=lambda e: f"shop.{e.mutations[0]['table']}", stream="SHOP")
    await db.outbox.relay(by_table, stop=lambda: False)


def declaring() -> af.Schema:
    class Status(enum.StrEnum):
        NEW = "new"

    return af.Schema("orders", af.Table("orders",
        af.Column("status", af.enum(Status), default="new"),
        af.Column("kind", af.enum("a", "b"), nullable=True),
        af.Column("tags", af.array(af.varchar(20)), nullable=True),
        af.Column("codes", af.array(af.enum("x")), nullable=True),
        af.Column("ratio", "float"),
    ))


class AccountRow(TypedDict):
    id: af.RowId
    owner: str
    balance: int
    kind: Literal["a", "b"] | None


class TransferRow(TypedDict):
    id: af.RowId
    src: af.RowId
    amount: decimal.Decimal


class TransferWithSource(TransferRow):
    source: AccountRow


class AccountWithTransfers(AccountRow):
    transfers: list[TransferWithSource]


typed_accounts = af.Table(
    "accounts",
    af.Column("owner", "string"),
    af.Column("balance", "bigint"),
    af.Column("kind", af.enum("a", "b"), nullable=True),
    row=AccountRow,
)
typed_transfers = af.Table(
    "transfers", af.Reference("src", "accounts"), af.Column("amount", "decimal"), row=TransferRow
)
typed_shop = af.Schema("shop", typed_accounts, typed_transfers)
assert_type(typed_accounts, af.Table[AccountRow])
plain: af.Table = af.Table("plain", af.Column("n", "integer"))
assert_type(plain, af.Table[dict[str, Any]])


async def typed_rows(db: af.Database, uow: af.UnitOfWork) -> None:
    page = uow.find(typed_accounts, where={"owner": "alice"}, limit=10)
    first = uow.find_first(typed_accounts, order_by="owner")
    picked = uow.find(typed_accounts, select=["owner"])
    by_name = uow.find("accounts")
    tree = uow.find(
        typed_accounts,
        join={"transfers": af.many(typed_transfers, by="src", join={"source": af.one("src")})},
        row=AccountWithTransfers,
    )
    await uow.retrieve()
    assert_type(page, af.Find[AccountRow])
    assert_type(page.result, af.FindResult[AccountRow])
    assert_type(page.result[0]["balance"], int)
    assert_type(page.result[0]["kind"], Literal["a", "b"] | None)
    assert_type(first.result, AccountRow | None)
    assert_type(picked.result, af.FindResult)
    assert_type(by_name.result[0], dict[str, Any])
    assert_type(tree.result[0]["transfers"][0]["amount"], decimal.Decimal)
    assert_type(tree.result[0]["transfers"][0]["source"]["owner"], str)
    uow.update(typed_accounts, page.result[0]["id"], {"balance": 1}, check=True)
    uow.create(typed_transfers, {"src": page.result[0]["id"], "amount": 1})
    uow.delete_many(typed_transfers, af.c.amount < 0)
    async for row in db.stream_find(typed_accounts, schema=typed_shop):
        assert_type(row, AccountRow)
"""

# Each marked line must be an error containing the marker's text.
BAD = """
from typing import TypedDict

import aiofragno as af


async def raw_sql(db: af.Database, tx: af.Transaction) -> None:
    await db.fetch("SELECT 1")  # E: "str"; expected "Fragment"
    await db.execute(123)  # E: "int"; expected "Fragment"
    await db.fetch_one("SELECT 1")  # E: expected "Fragment"
    db.stream("SELECT 1")  # E: expected "Fragment"
    await db.fetch_value("SELECT 1")  # E: No overload variant of "fetch_value" of "Queries"
    await tx.execute("DELETE FROM t")  # E: expected "Fragment"
    print((await db.fetch_value(af.sql("SELECT 1"))) + 1)  # E: "object" and "int"
    (await db.fetch_value(af.sql("SELECT 1"), int)).upper()  # E: "int" has no attribute "upper"


async def connecting(url: str) -> None:
    await af.connect(url, pool_sise=3)  # E: Unexpected keyword argument "pool_sise"
    await af.connect(url, ssl="yes")  # E: Argument "ssl" to "connect" has incompatible type
    await af.connect(url, pool_size="3")  # E: "pool_size" to "connect" has incompatible type "str"; expected "int"
    await af.connect(url, acquire_timeout=None)  # E: "acquire_timeout" to "connect" has incompatible type "None"
    await af.connect(url, naming="suffixes")  # E: "naming" to "connect" has incompatible type "Literal['suffixes']"
    await af.connect(url, sqlite_timestamps="iso")  # E: "sqlite_timestamps" to "connect" has incompatible type "Literal['iso']"
    await af.connect(url, backend=1)  # E: "backend" to "connect" has incompatible type "int"


async def reads(uow: af.UnitOfWork) -> None:
    first = uow.find_first("accounts")
    n = uow.count("accounts")
    await uow.retrieve()
    first.result["id"]  # E: "dict[str, Any] | None" is not indexable
    n.result + "1"  # E: Unsupported operand types for + ("int" and "str")
    uow.aggregate("accounts", {"n": "count"})  # E: expected "str": "AggregateFn"
    uow.aggregate("accounts", {"n": af.fn.count()}, group_by="owner").result["n"]  # E: No overload variant of "__getitem__"
    af.fn.sum()  # E: Missing positional argument "column"


async def relaying(db: af.Database) -> None:
    af.NatsSink("nats://127.0.0.1:4222")  # E: Missing named argument "subject"
    af.RedisSink(key="k", max_in_flight=8)  # E: Unexpected keyword argument "max_in_flight"
    await db.outbox.relay(object())  # E: Argument 1 to "relay" of "OutboxReader" has incompatible type "object"
    af.enum(1)  # E: Argument 1 to "enum" has incompatible type "int"
    af.array(5)  # E: Argument 1 to "array" has incompatible type "int"
    await db.outbox.relay(af.RedisSink(key="k"), after=1)  # E: "after" to "relay" of "OutboxReader" has incompatible type "int"


class Row(TypedDict):
    id: af.RowId
    balance: int


typed = af.Table("accounts", af.Column("balance", "bigint"), row=Row)


async def typed_reads(uow: af.UnitOfWork) -> None:
    page = uow.find(typed)
    first = uow.find_first(typed)
    await uow.retrieve()
    page.result[0]["owner"]  # E: TypedDict "Row" has no key "owner"
    page.result[0]["balance"].upper()  # E: "int" has no attribute "upper"
    first.result["balance"]  # E: Value of type "Row | None" is not indexable
    uow.find(typed, row=Row)  # E: No overload variant of "find" of "UnitOfWork"
"""

MARK = re.compile(r"#\s*E:\s*(.+)$")
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*)$")


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], str]:
    """mypy --strict's errors for GOOD and BAD, by (file, line), on the
    aiofragno these tests import: a checkout's comes first on mypy's path; an
    installed one (CI's wheel runs) is found in site-packages, which mypy
    refuses to have on its path."""
    tmp = tmp_path_factory.mktemp("typing")
    for name, text in (("good", GOOD), ("bad", BAD)):
        (tmp / f"{name}.py").write_text(textwrap.dedent(text))
    source_root = Path(aiofragno.__file__).resolve().parent.parent
    on_path = "" if source_root.name == "site-packages" else f"mypy_path = {source_root}\n"
    config = tmp / "mypy.ini"
    config.write_text(
        "[mypy]\n"
        "strict = True\n"
        "python_version = 3.11\n"
        f"cache_dir = {tmp / 'cache'}\n"
        f"{on_path}"
        # aiofragno itself is checked by CI's own mypy run: report only the programs.
        "[mypy-aiofragno.*]\n"
        "follow_imports = silent\n"
    )
    out, err, status = mypy.api.run(
        ["--config-file", str(config), str(tmp / "good.py"), str(tmp / "bad.py")]
    )
    assert status in (0, 1), f"mypy failed to run:\n{out}\n{err}"
    errors: dict[tuple[str, int], str] = {}
    for line in out.splitlines():
        match = ERROR.match(line)
        if match:
            key = (Path(match["file"]).stem, int(match["line"]))
            errors[key] = errors.get(key, "") + match["message"]
    return errors


def test_readme_style_code_type_checks(mypy_errors: dict[tuple[str, int], str]) -> None:
    good = {line: message for (file, line), message in mypy_errors.items() if file == "good"}
    assert good == {}


def test_misuse_is_a_type_error(mypy_errors: dict[tuple[str, int], str]) -> None:
    lines = textwrap.dedent(BAD).splitlines()
    expected = {
        number: match[1].strip()
        for number, text in enumerate(lines, start=1)
        if (match := MARK.search(text))
    }
    bad = {line: message for (file, line), message in mypy_errors.items() if file == "bad"}
    assert set(bad) == set(expected), (bad, expected)
    for number, text in expected.items():
        assert text in bad[number], (lines[number - 1], bad[number])
