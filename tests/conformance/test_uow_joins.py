"""Joins in the retrieval phase (``find(..., join=...)``): references followed
both ways and nested, per-parent order and limit, filters on joined
columns with keyset cursors, exact values through the join, one round trip
per retrieve, and joins refused at the call (before any SQL) when they name
what the schema does not have.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from functools import partial
from typing import Any

import pytest

import aiofragno as af
from aiofragno.session import Session
from aiofragno.uow.catalog import ShapeCache
from tests.conformance.uow_env import Env, MakeEnv, seed_accounts

pytestmark = pytest.mark.anyio


def plain(row: dict[str, Any], *joins: str) -> dict[str, Any]:
    """``row`` without its joins."""
    return {k: v for k, v in row.items() if k not in joins}


async def seed_transfers(shop: Env) -> dict[str, af.RowId]:
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    a, b, c = ids["alice"], ids["bob"], ids["carol"]
    await shop.create(
        "transfers",
        *(
            {"src": src, "dst": dst, "amount": amount}
            for src, dst, amount in [(a, b, 5), (a, c, 7), (a, b, 7), (a, b, 1), (b, a, 3)]
        ),
    )
    await shop.create("people", {"email": "a@x", "account": a}, {"email": "z@x", "account": None})
    return ids


async def test_joins_both_ways_nested(shop: Env) -> None:
    await seed_transfers(shop)

    async def unit(uow: af.UnitOfWork) -> Any:
        accounts = uow.find(
            "accounts",
            order_by="owner",
            join={
                "outgoing": af.many(
                    "transfers",
                    by="src",
                    order_by=("amount", "desc"),
                    limit=2,
                    join={"to": af.one("dst")},
                ),
                "incoming": af.many(
                    "transfers", by="dst", where=af.c.amount > 1, order_by="amount", limit=1
                ),
            },
        )
        people = uow.find("people", order_by="email", join={"acct": af.one("account")})
        everything = uow.find("transfers", join={"from": af.one("src")})
        plain_accounts = uow.find("accounts")
        await uow.retrieve()
        return accounts.result, people.result, everything.result, plain_accounts.result

    accounts, people, transfers, plain_accounts = await shop.run(unit)
    by_id = {row["id"]: row for row in plain_accounts}
    assert [r["owner"] for r in accounts] == ["alice", "bob", "carol"]
    alice, bob, carol = accounts
    # Per parent: in the join's order (amount desc, ties newest first, as the
    # order's last direction), at most 2.
    assert [(t["amount"], t["to"]["owner"]) for t in alice["outgoing"]] == [
        (7, "bob"),
        (7, "carol"),
    ]
    assert [t["amount"] for t in bob["outgoing"]] == [3]
    assert carol["outgoing"] == [] and carol["incoming"] == [plain(transfers[1], "from")]
    assert [t["amount"] for t in bob["incoming"]] == [5]  # (1 is filtered out)
    assert [t["amount"] for t in alice["incoming"]] == [3]
    # Joined rows are the rows a plain find gives, nested (each a dict of its own).
    assert plain(alice, "outgoing", "incoming") == by_id[alice["id"]]
    assert alice["outgoing"][1]["to"] == {**by_id[carol["id"]]}
    # The same row joined twice: equal dicts, not the same one (no identity map).
    assert transfers[0]["from"] == transfers[2]["from"] == by_id[alice["id"]]
    assert transfers[0]["from"] is not transfers[2]["from"]
    assert [p["acct"] for p in people] == [by_id[alice["id"]], None]  # NULL reference: None
    # Joined RowIds carry version and table: usable with check=True.
    to_carol = alice["outgoing"][1]["to"]["id"]
    assert to_carol.version == 0 and to_carol.table is carol["id"].table

    async def bump(uow: af.UnitOfWork) -> None:
        uow.update("accounts", to_carol, {"balance": 1}, check=True)

    await shop.run(bump)
    with pytest.raises(af.ConcurrencyConflict):
        await shop.run(bump, retry=af.NoRetry())


async def test_filter_on_joined_columns_pages_with_cursor(shop: Env) -> None:
    """A where on a one-join keeps the rows whose joined row matches; the
    root's limit and cursor count those rows only."""
    await seed_transfers(shop)

    async def page(uow: af.UnitOfWork, after: str | None) -> af.FindResult:
        rows = uow.find(
            "transfers",
            order_by="amount",
            limit=2,
            after=after,
            join={"source": af.one("src", where=af.c.owner == "alice"), "target": af.one("dst")},
        )
        await uow.retrieve()
        return rows.result

    seen: list[tuple[int, str, str]] = []
    cursor = None
    for _ in range(3):
        rows = await shop.run(lambda uow, after=cursor: page(uow, after))
        seen += [(r["amount"], r["source"]["owner"], r["target"]["owner"]) for r in rows]
        cursor = rows.cursor
        if cursor is None:
            break
    assert seen == [
        (1, "alice", "bob"),
        (5, "alice", "bob"),
        (7, "alice", "carol"),
        (7, "alice", "bob"),
    ]
    assert cursor is None

    # A where on a many filters its lists only; find_first takes joins too.
    async def nested(uow: af.UnitOfWork) -> list[int]:
        rows = uow.find(
            "accounts",
            join={"sent": af.many("transfers", by="src", where={"amount": 7})},
        )
        first = uow.find_first(
            "transfers",
            where=af.c.amount < 7,
            order_by=("amount", "desc"),
            join={"source": af.one("src", where=af.c.owner.starts_with("b"))},
        )
        await uow.retrieve()
        assert first.result is not None and first.result["source"]["owner"] == "bob"
        return sorted(len(r["sent"]) for r in rows.result)

    assert await shop.run(nested) == [0, 0, 2]


EXACT = af.Schema(
    "exact",
    af.Table(
        "vaults",
        af.Column("d", "decimal", nullable=True),
        af.Column("b", "bigint", nullable=True),
        af.Column("bin", "binary", nullable=True),
        af.Column("ts", "timestamp", nullable=True),
        af.Column("j", "json", nullable=True),
        af.Column("f", "bool", nullable=True),
        af.Column("day", "date", nullable=True),
    ),
    af.Table("keys", af.Reference("vault", "vaults"), af.Column("n", "bigint")),
)


async def test_values_stay_exact_through_joins(make_env: MakeEnv) -> None:
    env = await make_env(EXACT)
    micro = env.db._engine.adapter.storage.timestamp != "epoch-ms"
    values = {
        "d": Decimal("12345678901234567890.123456789"),
        "b": 2**63 - 1,
        "bin": bytes(range(256)),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 123456 if micro else 123000, tzinfo=dt.UTC),
        "j": {"n": 2**60, "f": 0.5, "t": True, "s": "é", "l": [None]},
        "f": True,
        "day": dt.date(9999, 12, 30),
    }
    nulls = dict.fromkeys(values)
    full, empty = await env.create("vaults", values, {**nulls, "f": False})
    await env.create("keys", {"vault": full, "n": -(2**63)}, {"vault": empty, "n": 0})

    async def unit(uow: af.UnitOfWork) -> Any:
        keys = uow.find("keys", order_by="n", join={"safe": af.one("vault")})
        vaults = uow.find("vaults", join={"keys": af.many("keys", by="vault")})
        await uow.retrieve()
        return keys.result, vaults.result

    keys, vaults = await env.run(unit)
    expected = [{"id": full, **values}, {"id": empty, **nulls, "f": False}]
    for key, want in zip(keys, expected, strict=True):
        assert key["safe"] == want
        for name, value in want.items():
            assert type(key["safe"][name]) is type(value), name
    assert keys[0]["n"] == -(2**63)
    by_vault = {v["id"]: v["keys"] for v in vaults}
    assert [k["n"] for k in by_vault[full]] == [-(2**63)]
    assert [plain(k, "safe") for k in keys] == [*by_vault[full], *by_vault[empty]]


TREE = af.Schema(
    "tree",
    af.Table("nodes", af.Column("label", "string"), af.Reference("parent", "nodes", nullable=True)),
)


def children(depth: int) -> af.Many:
    """Children of children, ``depth`` levels."""
    below = {"kids": children(depth - 1)} if depth > 1 else None
    return af.many("nodes", by="parent", order_by="label", join=below)


async def test_self_reference_nested_to_the_bound(make_env: MakeEnv) -> None:
    env = await make_env(TREE)

    async def build(uow: af.UnitOfWork) -> None:
        parent = None
        for level in range(5):
            for label in ("b", "a"):
                node = uow.create("nodes", {"label": f"{level}{label}", "parent": parent})
            parent = node  # the "a" one has children

    await env.run(build)

    async def unit(uow: af.UnitOfWork) -> Any:
        with pytest.raises(af.ValidationError, match="at most 4 levels"):
            uow.find("nodes", join={"kids": children(5)})
        rows = uow.find(
            "nodes", where={"parent": None}, order_by="label", join={"kids": children(4)}
        )
        await uow.retrieve()
        return rows.result

    def labels(rows: list[dict[str, Any]]) -> list[Any]:
        return [(r["label"], labels(r["kids"])) if "kids" in r else r["label"] for r in rows]

    assert labels(await env.run(unit)) == [
        ("0a", [("1a", [("2a", [("3a", ["4a", "4b"]), ("3b", [])]), ("2b", [])]), ("1b", [])]),
        ("0b", []),
    ]


def _batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of statements of each batch sessions send from now on
    (a batch: one round trip where the driver sends it at once)."""
    batches: list[int] = []
    execute_batch = Session.execute_batch

    async def spying(self_: Session, queries: Any, stop: Any = None) -> Any:
        batches.append(len(queries))
        return await execute_batch(self_, queries, stop)

    monkeypatch.setattr(Session, "execute_batch", spying)
    return batches


async def test_one_round_trip_per_retrieve(shop: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    await seed_transfers(shop)
    batches = _batch_sizes(monkeypatch)

    async def unit(uow: af.UnitOfWork) -> int:
        rows = uow.find(
            "accounts",
            join={"out": af.many("transfers", by="src", limit=1, join={"to": af.one("dst")})},
        )
        n = uow.count("transfers")
        await uow.retrieve()
        return len(rows.result) + n.result

    assert await shop.run(unit) == 8
    assert len(batches) == 1
    if shop.db._engine.adapter.sql.rows_array is not None:  # one statement (too many reads
        assert batches == [1]  # for MySQL's union: aiofragno.uow.combine_reads)


class _SlyInt(int):
    """An int whose text and arithmetic lie: a limit is written into the
    statement, so only its value may reach it."""

    def __repr__(self) -> str:
        return "1; DROP TABLE accounts"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __add__(self, other: object) -> Any:
        return "1) OR (1=1"


async def test_limits_are_written_as_digits(shop: Env) -> None:
    """A find's and a join's limits go into the SQL as their digits (an int
    subclass's text cannot reach it); the join embeds its parent's page
    without the one more row that only tells of a next page; the cache of
    statement texts, keyed by those limits now, stays bounded."""
    ids = await seed_transfers(shop)
    texts: list[str] = []

    async def page(uow: af.UnitOfWork) -> af.FindResult:
        rows = uow.find(
            "accounts",
            order_by="owner",
            limit=_SlyInt(2),
            join={"last": af.many("transfers", by="src", order_by="amount", limit=_SlyInt(1))},
        )
        await uow.retrieve()
        return rows.result

    rows = await shop.run(page, on_query=lambda q: texts.append(q.sql))
    assert [(r["owner"], [t["amount"] for t in r["last"]]) for r in rows] == [
        ("alice", [1]),
        ("bob", [3]),
    ]
    assert rows.cursor is not None and rows[0]["last"][0]["src"] == ids["alice"]
    (find,) = [text for text in texts if "transfers" not in text]
    joined = [text for text in texts if "transfers" in text]
    assert not any("DROP" in text or "OR (1=1" in text for text in texts)
    # The find reads one more row (is there a next page?).
    assert re.findall(r"LIMIT ([^\s)]+)", find) == ["3"]
    if len(joined) == 1:  # the join's embedded copy of the find reads the page only
        assert sorted(re.findall(r"LIMIT ([^\s)]+)", joined[0])) == ["1", "2"]
    else:  # (MariaDB: read by key, a statement per account of the page)
        assert [re.findall(r"LIMIT ([^\s)]+)", text) for text in joined] == [["1"], ["1"]]

    cache: ShapeCache[str] = ShapeCache()
    cache.capacity = 3
    for n in range(10):
        cache[("find", n)] = f"SELECT {n}"
    assert list(cache) == [("find", 7), ("find", 8), ("find", 9)]


def _bad_joins() -> list[tuple[str, dict[str, Any], dict[str, Any], str]]:
    """(table, find kwargs, join, message) that must be refused at the call."""
    return [
        ("transfers", {}, {"x": af.one("nope")}, "has no column 'nope'"),
        ("transfers", {"select": ["amount"]}, {"x": af.one("src")}, "leave out select="),
        ("transfers", {}, {"x": af.one("amount")}, "is no reference"),
        ("transfers", {}, {"x": af.one(5)}, "column names are str"),  # type: ignore[arg-type]
        ("accounts", {}, {"x": af.many("transfers", by=5)}, "by= names"),  # type: ignore[arg-type]
        ("accounts", {}, {"x": af.many(["transfers"], by="src")}, "or its af.Table, got list"),  # type: ignore[arg-type]
        ("transfers", {}, {"x": af.one("_id")}, "internal"),
        ("accounts", {}, {"x": af.many("nope", by="src")}, "has no table 'nope'"),
        ("accounts", {}, {"x": af.many("transfers", by="amount")}, "no reference to 'accounts'"),
        ("transfers", {}, {"x": af.many("transfers", by="src")}, "no reference to 'transfers'"),
        ("accounts", {}, {"x": af.many("transfers", by="src", limit=0)}, "positive int"),
        ("accounts", {}, {"x": af.many("transfers", by="src", limit=True)}, "positive int"),
        ("accounts", {}, {"x": af.many("transfers", by="src", limit="3")}, "positive int"),
        ("accounts", {}, {"x": af.many("transfers", by="src", order_by="nope")}, "no column"),
        ("accounts", {}, {"owner": af.many("transfers", by="src")}, "name of a column"),
        ("accounts", {}, {"x; DROP": af.many("transfers", by="src")}, "join names"),
        ("accounts", {}, {"x": "transfers"}, "must be af.one"),
        ("transfers", {}, {"x": af.one("src", where=af.c.balance == "1")}, "expected a int"),
        ("transfers", {}, {"x": af.one("src", where=af.c.nope == 1)}, "has no column 'nope'"),
        ("accounts", {}, {"x": af.many("transfers", by="src", where={"amount": 1.5})}, "int"),
        (
            "accounts",
            {},
            {"x": af.many("transfers", by="src", join={"y": af.one("dst", where={"owner": 3})})},
            "expected a str",
        ),
        ("accounts", {}, {"x": af.many("transfers", by="src", join=["y"])}, "dict of name"),
        ("people", {"where": {"email": 5}}, {"x": af.one("account")}, "expected a str"),
    ]


async def test_bad_joins_are_refused_at_the_call(shop: Env) -> None:
    queries: list[Any] = []

    async def unit(uow: af.UnitOfWork) -> None:
        for table, kwargs, join, message in _bad_joins():
            with pytest.raises(af.ValidationError, match=message):
                uow.find(table, join=join, **kwargs)
            with pytest.raises(af.ValidationError, match=message):
                uow.find_first(table, join=join, **kwargs)
        await uow.retrieve()  # nothing was queued

    await shop.run(unit, on_query=queries.append)
    assert queries == []


async def test_statements_are_cached_by_shape_never_by_value(shop: Env) -> None:
    """A join's statement text is cached by the tree's shape: other values
    (hostile ones too) reuse the text and bind as parameters, never reaching
    it; each other shape — the join's condition, its limit, its order, a
    reference given by external id rather than a RowId read here (looked
    up by a subquery) — has a text of its own and finds its own rows; and
    the cache stays within its bound."""
    await seed_transfers(shop)
    # (RowIds read here: they carry internal ids, which the text binds
    # directly where the database never reuses them.)
    ids = {row["owner"]: row["id"] for row in await shop.find("accounts")}
    a, b, c = ids["alice"], ids["bob"], ids["carol"]
    trusted = shop.catalog.table("transfers").columns["dst"].trusts_internal_ids
    hostile = "'; DROP TABLE accounts; --"

    async def read(owner: str, join: Any) -> tuple[list[Any], list[str]]:
        texts: list[str] = []

        async def unit(uow: af.UnitOfWork) -> Any:
            rows = uow.find("accounts", where=af.c.owner >= owner, order_by="owner", join=join)
            await uow.retrieve()
            return rows.result

        rows = await shop.run(unit, on_query=lambda q: texts.append(q.sql))
        return [(r["owner"], [t["amount"] for t in r["out"]]) for r in rows], texts

    def out(**options: Any) -> dict[str, Any]:
        return {"out": af.many("transfers", by="src", **options)}

    # The same shape with other values: the same text.
    above_4 = out(where=af.c.amount > 4, order_by="amount")
    found, texts = await read("a", above_4)
    assert found == [("alice", [5, 7, 7]), ("bob", []), ("carol", [])]
    found, again = await read(hostile, out(where=af.c.amount > 6, order_by="amount"))
    assert found == [("alice", [7, 7]), ("bob", []), ("carol", [])]
    assert again == texts
    assert all("DROP" not in text for text in texts)

    # Other shapes: each its own text and its own rows.
    shapes = {
        "less": (out(where=af.c.amount < 4, order_by="amount"), [[1], [3], []]),
        "limit 1": (out(where=af.c.amount > 4, order_by="amount", limit=1), [[5], [], []]),
        "limit 2": (out(where=af.c.amount > 4, order_by="amount", limit=2), [[5, 7], [], []]),
        "desc": (out(where=af.c.amount > 4, order_by=("amount", "desc")), [[7, 7, 5], [], []]),
        "no where": (out(order_by="amount"), [[1, 5, 7, 7], [3], []]),
        "by RowId": (out(where={"dst": b}, order_by="amount"), [[1, 5, 7], [], []]),
        "by id": (out(where={"dst": str(b)}, order_by="amount"), [[1, 5, 7], [], []]),
        "to carol": (out(where={"dst": c}, order_by="amount"), [[7], [], []]),
    }
    joined = {texts[0]}
    for name, (join, expected) in shapes.items():
        found, texts = await read("a", join)
        assert [amounts for _, amounts in found] == expected, name
        # ("to carol": the shape of "by RowId", another value; "by id" is
        # looked up, as the RowId is where internal ids are not trusted.)
        if name != "to carol" and (name != "by id" or trusted):
            assert texts[0] not in joined, name
        joined.add(texts[0])
    assert str(a) not in "".join(joined) and str(b) not in "".join(joined)

    # Bounded: a page size or a per-parent limit from user input cannot grow it.
    cache = shop.catalog.sql_cache
    cache.capacity = 6
    cache.clear()
    try:
        for limit in range(1, 30):
            found, _ = await read("a", out(order_by="amount", limit=limit))
            assert found[0] == ("alice", [1, 5, 7, 7][:limit])
            assert len(cache) <= 6
    finally:
        del cache.capacity


async def test_a_limited_join_with_joins_of_its_own_under_a_page(shop: Env) -> None:
    """A page of accounts (a limit, or find_first), each with its largest
    transfers and, nested, the account each went to: the same rows as the
    find without a limit, whatever the find's condition — the nested read
    embeds the find's, with its values (MariaDB numbers such a join's rows
    under the page, not by key: its joins need its rows in one statement;
    under find_first it takes the row's key in that statement)."""
    ids = await seed_transfers(shop)
    largest = af.many(
        "transfers", by="src", order_by=("amount", "desc"), limit=2, join={"to": af.one("dst")}
    )

    def shape(row: dict[str, Any]) -> tuple[str, list[tuple[int, str]]]:
        return row["owner"], [(t["amount"], t["to"]["owner"]) for t in row["out"]]

    async def unit(uow: af.UnitOfWork, where: Any, limit: int | None) -> Any:
        first = uow.find_first("accounts", where, order_by="owner", join={"out": largest})
        page = uow.find("accounts", where, order_by="owner", limit=limit, join={"out": largest})
        await uow.retrieve()
        return first.result, page.result

    alice = ("alice", [(7, "bob"), (7, "carol")])  # (ties newest first)
    conditions = [(None, True), ({"note": None}, True), (af.c.owner >= "a", True)]
    for where, from_alice in [*conditions, (af.c.owner == "bob", False)]:
        whole = await shop.run(partial(unit, where=where, limit=None))
        paged = await shop.run(partial(unit, where=where, limit=2))
        assert [shape(r) for r in paged[1]] == [shape(r) for r in whole[1]][:2], where
        assert shape(paged[0]) == shape(whole[0]) == shape(whole[1][0])
        assert (shape(whole[1][0]) == alice) is from_alice
        assert whole[1][0]["out"][0]["src"] == ids["alice" if from_alice else "bob"]


async def test_a_join_under_a_page_of_one_row_travels_with_it(
    shop: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``find_first`` or a page of one row, each with its account's newest
    transfers: the rows of the same join without a limit on the find,
    page after page, for a find that finds nothing too. On MariaDB the join
    takes that row's key from the find's read within its own statement, so
    the retrieve is one batch, one round trip, as elsewhere."""
    await seed_transfers(shop)
    newest = af.many("transfers", by="src", where=af.c.amount > 1, order_by="amount", limit=2)

    def shape(row: dict[str, Any] | None) -> Any:
        return row and (row["owner"], [(t["amount"], t["dst"]) for t in row["out"]])

    async def unit(uow: af.UnitOfWork, where: Any, after: str | None) -> Any:
        first = uow.find_first("accounts", where, order_by="owner", join={"out": newest})
        page = uow.find(
            "accounts", where, order_by="owner", limit=1, after=after, join={"out": newest}
        )
        await uow.retrieve()
        return first.result, page.result

    whole = await shop.find("accounts", order_by="owner", join={"out": newest})
    assert [len(row["out"]) for row in whole] == [2, 1, 0]
    batches = _batch_sizes(monkeypatch)
    texts: list[str] = []
    seen, after = [], None
    while True:
        first, page = await shop.run(
            partial(unit, where=None, after=after), on_query=lambda q: texts.append(q.sql)
        )
        assert shape(first) == shape(whole[0])
        seen += page
        if page.cursor is None:
            break
        after = page.cursor
    assert [shape(row) for row in seen] == [shape(row) for row in whole]
    nothing = await shop.run(partial(unit, where={"owner": "nobody"}, after=None))
    assert nothing == (None, [])
    assert len(batches) == len(seen) + 1  # (one per unit)
    if shop.db.name == "mysql":
        joined = [text for text in texts if "transfers" in text]
        assert joined and all("= (SELECT p.k FROM" in text for text in joined)
