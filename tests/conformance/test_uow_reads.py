"""Retrieval in the unit of work: count, where expressions (operators, NULL,
IN, starts_with, ids and references), order_by, and typed columns (decimal)
in comparisons and order.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

import pytest

import aiofragno as af
from aiofragno.driver import CompiledQuery
from tests.conformance.uow_env import (
    Env,
    MakeEnv,
    seed_accounts,
)
from tests.conftest import Target

pytestmark = pytest.mark.anyio


async def test_count(items: Env) -> None:
    async def empty(uow: af.UnitOfWork) -> int:
        n = uow.count("items")
        await uow.retrieve()
        return n.result

    assert await items.run(empty) == 0
    await items.create(
        "items",
        *({"name": f"n{i}", "qty": i % 3, "tag": None if i % 2 else "t"} for i in range(10)),
    )
    await items.create("others", {"name": "x"})

    async def counts(uow: af.UnitOfWork) -> list[int]:
        ops = [
            uow.count("items"),
            uow.count("items", where={"qty": 0}),
            uow.count("items", where=af.c.qty > 0),
            uow.count("items", where={"tag": None}),
            uow.count("items", where=af.c.name.in_([])),
            uow.count("others"),
        ]
        await uow.retrieve()
        return [op.result for op in ops]

    result = await items.run(counts)
    assert result == [10, 4, 6, 5, 0, 1]
    assert all(type(n) is int for n in result)


ITEM_ROWS = [
    {"name": "alpha", "qty": 1, "tag": "x"},
    {"name": "beta", "qty": 2, "tag": None},
    {"name": "gamma", "qty": 3, "tag": "y"},
    {"name": "delta", "qty": 4, "tag": None},
    {"name": "omega", "qty": 5, "tag": "x"},
    {"name": "epsilon", "qty": 5, "tag": "z"},
]


WHERE_CASES: list[tuple[str, Any, Callable[[dict[str, Any]], bool]]] = [
    ("eq", af.c.qty == 3, lambda r: r["qty"] == 3),
    ("ne", af.c.qty != 3, lambda r: r["qty"] != 3),
    ("lt", af.c.qty < 3, lambda r: r["qty"] < 3),
    ("le", af.c.qty <= 3, lambda r: r["qty"] <= 3),
    ("gt", af.c.qty > 3, lambda r: r["qty"] > 3),
    ("ge", af.c.qty >= 3, lambda r: r["qty"] >= 3),
    ("str eq", af.c.name == "delta", lambda r: r["name"] == "delta"),
    ("str ne", af.c.name != "delta", lambda r: r["name"] != "delta"),
    (
        "in",
        af.c.name.in_(["alpha", "gamma", "missing"]),
        lambda r: r["name"] in ("alpha", "gamma"),
    ),
    ("in ints", af.c.qty.in_([5, 1]), lambda r: r["qty"] in (1, 5)),
    ("in empty", af.c.qty.in_([]), lambda r: False),
    ("not in empty", ~af.c.qty.in_([]), lambda r: True),
    ("in generator", af.c.qty.in_(q for q in (2, 4)), lambda r: r["qty"] in (2, 4)),
    ("is null", af.c.tag.is_null(), lambda r: r["tag"] is None),
    ("not null", ~af.c.tag.is_null(), lambda r: r["tag"] is not None),
    ("starts_with", af.c.name.starts_with("e"), lambda r: r["name"].startswith("e")),
    ("starts_with empty", af.c.name.starts_with(""), lambda r: True),
    ("and", (af.c.qty > 1) & (af.c.qty < 5), lambda r: 1 < r["qty"] < 5),
    (
        "or",
        (af.c.qty == 1) | (af.c.name == "delta"),
        lambda r: r["qty"] == 1 or r["name"] == "delta",
    ),
    ("not or", ~((af.c.qty == 1) | (af.c.qty == 2)), lambda r: r["qty"] not in (1, 2)),
    (
        "or with null",
        (af.c.tag == "x") | af.c.tag.is_null(),
        lambda r: r["tag"] in ("x", None),
    ),
    (
        "nested",
        ((af.c.qty >= 2) & ~(af.c.tag == "y")) | (af.c.name == "alpha"),
        # (tag = 'y') is NULL for NULL tags, so NOT(...) is NULL: SQL semantics.
        lambda r: (
            (r["qty"] >= 2 and r["tag"] is not None and r["tag"] != "y") or r["name"] == "alpha"
        ),
    ),
    ("dict none", {"tag": None}, lambda r: r["tag"] is None),
    ("dict and", {"tag": "x", "qty": 5}, lambda r: r["tag"] == "x" and r["qty"] == 5),
    ("dict none and value", {"tag": None, "qty": 4}, lambda r: r["tag"] is None and r["qty"] == 4),
    ("empty dict", {}, lambda r: True),
    ("none", None, lambda r: True),
]


async def test_where_expressions(items: Env) -> None:
    await items.create("items", *ITEM_ROWS)
    rows = await items.find("items")
    assert len(rows) == len(ITEM_ROWS)

    async def unit(uow: af.UnitOfWork) -> list[tuple[Any, Any]]:
        ops = [(uow.find("items", where=w), uow.count("items", where=w)) for _, w, _ in WHERE_CASES]
        await uow.retrieve()
        return [(f.result, n.result) for f, n in ops]

    results = await items.run(unit)
    wrong = {}
    for (name, _, predicate), (found, count) in zip(WHERE_CASES, results, strict=True):
        expected = sorted(r["name"] for r in rows if predicate(r))
        got = sorted(r["name"] for r in found)
        if got != expected or count != len(expected):
            wrong[name] = {"expected": expected, "found": got, "count": count}
    assert wrong == {}


async def test_where_on_id_and_references(shop: Env) -> None:
    ids = await seed_accounts(shop, "alice", "bob", "carol")
    await shop.create(
        "transfers",
        {"src": ids["alice"], "dst": ids["bob"], "amount": 1},
        {"src": ids["bob"], "dst": ids["carol"], "amount": 2},
        {"src": ids["carol"], "dst": ids["alice"], "amount": 3},
    )

    async def unit(uow: af.UnitOfWork) -> list[Any]:
        ops = [
            uow.find("accounts", where=af.c.id == ids["bob"]),
            uow.find("accounts", where={"id": str(ids["carol"])}),
            uow.find("accounts", where=af.c.id.in_([ids["alice"], str(ids["carol"])])),
            uow.find("transfers", where={"src": ids["bob"]}),  # RowId with internal id
            uow.find("transfers", where=af.c.dst == str(ids["alice"])),  # external id string
            uow.find("transfers", where=af.c.src.in_([ids["alice"], str(ids["carol"])])),
            uow.find("accounts", where=af.c.id == "no-such-id"),
        ]
        await uow.retrieve()
        return [op.result for op in ops]

    bob, carol, alice_carol, from_bob, to_alice, from_a_c, none = await shop.run(unit)
    assert [r["owner"] for r in bob] == ["bob"]
    assert [r["owner"] for r in carol] == ["carol"]
    assert sorted(r["owner"] for r in alice_carol) == ["alice", "carol"]
    assert [r["amount"] for r in from_bob] == [2]
    assert [r["amount"] for r in to_alice] == [3]
    assert sorted(r["amount"] for r in from_a_c) == [1, 3]
    assert none == []


async def test_starts_with_escapes_like_wildcards(items: Env) -> None:
    names = ["50%_off", "50%off", "50_off", "50xoff", "500", "a!b", "a!!b", "ab", "x\\y", "x\\\\y"]
    await items.create("items", *({"name": n, "qty": 0} for n in names))

    prefixes = ["50%", "50_", "50%_", "a!", "a!!", "x\\", "x\\\\", "5"]

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", where=af.c.name.starts_with(p)) for p in prefixes]
        await uow.retrieve()
        return [sorted(r["name"] for r in op.result) for op in ops]

    got = dict(zip(prefixes, await items.run(unit), strict=True))
    expected = {p: sorted(n for n in names if n.startswith(p)) for p in prefixes}
    assert got == expected


async def test_starts_with_is_case_sensitive(request: pytest.FixtureRequest, items: Env) -> None:
    await items.create(
        "items", *({"name": n, "qty": 0} for n in ["Alpha", "alpha", "ALPHA", "beta"])
    )

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", where=af.c.name.starts_with(p)) for p in ("al", "Al", "AL")]
        await uow.retrieve()
        return [sorted(r["name"] for r in op.result) for op in ops]

    assert await items.run(unit) == [["alpha"], ["Alpha"], ["ALPHA"]]


async def test_starts_with_needs_a_string_column(items: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.find("items", where=af.c.qty.starts_with("1"))
        await uow.retrieve()

    with pytest.raises(af.ValidationError, match=r"items\.qty"):
        await items.run(unit)


async def test_comparing_with_none_is_a_validation_error() -> None:
    with pytest.raises(af.ValidationError, match="is_null"):
        af.c.tag == None  # noqa: B015, E711
    with pytest.raises(af.ValidationError, match="&"):
        bool(af.c.qty == 1)


async def test_order_by(items: Env) -> None:
    await items.create("items", *ITEM_ROWS)

    orders: list[tuple[Any, list[str]]] = [
        ("qty", ["alpha", "beta", "gamma", "delta", "omega", "epsilon"]),
        (("qty", "asc"), ["alpha", "beta", "gamma", "delta", "omega", "epsilon"]),
        # Ties (qty 5) in creation order, in the direction of the order's
        # last column: oldest first ascending, newest first descending.
        (("qty", "desc"), ["epsilon", "omega", "delta", "gamma", "beta", "alpha"]),
        ("name", ["alpha", "beta", "delta", "epsilon", "gamma", "omega"]),
        (("name", "desc"), ["omega", "gamma", "epsilon", "delta", "beta", "alpha"]),
        ([("qty", "desc"), "name"], ["epsilon", "omega", "delta", "gamma", "beta", "alpha"]),
        (
            [("qty", "desc"), ("name", "desc")],
            ["omega", "epsilon", "delta", "gamma", "beta", "alpha"],
        ),
        (
            [("qty", "asc"), ("name", "desc")],
            ["alpha", "beta", "gamma", "delta", "omega", "epsilon"],
        ),
        (["qty", ("name", "asc")], ["alpha", "beta", "gamma", "delta", "epsilon", "omega"]),
        (None, [r["name"] for r in ITEM_ROWS]),
    ]

    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("items", order_by=o) for o, _ in orders]
        await uow.retrieve()
        return [[r["name"] for r in op.result] for op in ops]

    got = await items.run(unit)
    assert got == [expected for _, expected in orders]

    async def first(uow: af.UnitOfWork) -> Any:
        op = uow.find_first("items", where=af.c.qty < 5, order_by=("qty", "desc"))
        none = uow.find_first("items", where={"name": "missing"})
        await uow.retrieve()
        return op.result, none.result

    row, missing = await items.run(first)
    assert row["name"] == "delta" and missing is None

    with pytest.raises(af.ValidationError, match="direction"):
        await items.find("items", order_by=("qty", "up"))


MIXED = af.Schema(
    "mixed",
    af.Table(
        "things",
        af.Column("name", "string"),
        af.Column("price", "decimal"),
        af.Column("at", "timestamp"),
        af.Column("day", "date"),
        af.Column("big", "bigint"),
    ),
)


_T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


THINGS = [
    {
        "name": f"t{i}",
        "price": price,
        "at": _T0 + dt.timedelta(days=days, milliseconds=7 * i),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=days * 3),
        "big": big,
    }
    for i, (price, days, big) in enumerate(
        [
            (Decimal("9"), 5, 2**62),
            (Decimal("10"), -400, -(2**62)),
            (Decimal("100"), 30, 9),
            (Decimal("-1"), 0, 10),
            (Decimal("2.5"), 3000, -1),
            (Decimal("0.125"), -2, 2**53 + 1),
            (Decimal("-20"), 1, 100),
        ]
    )
]


async def test_order_and_compare_decimal(make_env: MakeEnv) -> None:
    env = await make_env(MIXED)
    await env.create("things", *THINGS)
    if env.db.name == "sqlite":
        # Stored as text there: ordering would compare strings ('10' < '9'), so
        # it is refused; equality still works.
        for attempt in (
            lambda: env.find("things", order_by="price"),
            lambda: env.find("things", where=af.c.price > Decimal("9")),
        ):
            with pytest.raises(af.ValidationError, match="stored as text"):
                await attempt()
        rows = await env.find("things", where={"price": Decimal("10.00")})
        assert [r["price"] for r in rows] == [Decimal("10")]
        return
    by_price = [r["name"] for r in sorted(THINGS, key=lambda r: r["price"])]
    rows = await env.find("things", order_by="price")
    assert [r["name"] for r in rows] == by_price
    above = await env.find("things", where=af.c.price > Decimal("9"), order_by="price")
    assert [r["price"] for r in above] == [Decimal("10"), Decimal("100")]
    seen: list[str] = []
    after = None
    while True:
        page = await env.find("things", order_by=("price", "desc"), limit=3, after=after)
        seen.extend(r["name"] for r in page)
        if page.cursor is None:
            break
        after = page.cursor
    assert seen == by_price[::-1]


EVENTS = af.Schema(
    "events",
    af.Table("streams", af.Column("name", "string")),
    af.Table(
        "events",
        af.Reference("stream", "streams"),
        af.Column("seq", "bigint"),
        af.Index("by_stream", ["stream", "seq"]),
    ),
)


async def test_the_newest_page_is_read_by_the_index_not_sorted(make_env: MakeEnv) -> None:
    """``find(order_by=("seq", "desc"), limit=N)`` and a join's newest N per
    parent are read from an index on (stream, seq) backwards, without
    sorting every matching row: their ties (creation order) run newest first
    too, which that index holds after seq on MariaDB and SQLite. With ties
    oldest first, MariaDB sorted all of a stream's rows for every page (124 ms
    for 10 of 200,000 rows, against 0.05 ms). On MariaDB the join under a
    page of streams is read by key, a statement per stream; without a page,
    its rows are numbered. PostgreSQL's index holds no internal id: it
    sorts runs of equal seq only (incremental sort); not checked here."""
    env = await make_env(EVENTS)

    async def seed(uow: af.UnitOfWork) -> None:
        for name in ("a", "b"):
            stream = uow.create("streams", {"name": name})
            for seq in range(100):
                uow.create("events", {"stream": stream, "seq": seq // 2})  # (ties of two)

    await env.run(seed)
    sent: list[Any] = []
    last = af.many("events", by="stream", order_by=("seq", "desc"), limit=3)

    async def newest(uow: af.UnitOfWork) -> Any:
        streams = uow.find("streams", order_by="name", limit=5, join={"last": last})
        unpaged = uow.find("streams", order_by="name", join={"last": last})
        await uow.retrieve()
        page = uow.find(
            "events", where={"stream": streams.result[1]["id"]}, order_by=("seq", "desc"), limit=3
        )
        await uow.retrieve()
        return streams.result, unpaged.result, page.result

    streams, unpaged, page = await env.run(newest, on_query=sent.append)
    order = {row["id"]: row["_id"] for row in await env.raw_rows("events")}

    def seen(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
        return [(row["seq"], order[row["id"]]) for row in rows]

    for n, stream in enumerate(streams):
        newest_three = sorted(
            (
                (r["seq"], order[r["id"]])
                for r in await env.find("events", where={"stream": stream["id"]})
            ),
            reverse=True,
        )[:3]
        assert seen(stream["last"]) == newest_three, stream["name"]
        assert seen(unpaged[n]["last"]) == newest_three
        assert newest_three[0][0] == newest_three[1][0] == 49  # (a tie, newest first)
    assert seen(page) == seen(streams[1]["last"])
    if env.db.name == "postgresql":
        return
    # Each statement reading events by stream and seq, asked how it runs.
    reads = [q for q in sent if re.search(r"FROM [`\"]events", q.sql)]
    numbered = [q for q in reads if "ROW_NUMBER" in q.sql]
    by_index = [q for q in reads if "ROW_NUMBER" not in q.sql and "IN (SELECT" not in q.sql]
    if env.db.name == "mysql":  # the paged join by key, a statement per stream, and the page
        assert len(numbered) == 1 and len(by_index) == 3, [q.sql for q in reads]
    assert await _sorted_by_the_server(env, by_index) == []


async def _sorted_by_the_server(env: Env, queries: list[CompiledQuery]) -> list[Any]:
    """Those of ``queries`` that MariaDB's ``EXPLAIN`` or SQLite's ``EXPLAIN
    QUERY PLAN`` says sort their rows (filesort, TEMP B-TREE), with the plan."""
    sorted_ = []
    engine = env.db._engine
    session = await engine.acquire()
    try:
        for query in queries:
            prefix = "EXPLAIN QUERY PLAN " if env.db.name == "sqlite" else "EXPLAIN "
            (result,) = await session.execute_batch(
                [CompiledQuery(prefix + query.sql, query.parameters)]
            )
            plan = " ".join(str(row.raw[-1]) for row in result.rows)
            if "TEMP B-TREE" in plan or "filesort" in plan:
                sorted_.append((query.sql, plan))
    finally:
        await engine.release(session)
    return sorted_


DIRECTORY = af.Schema(
    "directory",
    af.Table(
        "users",
        af.Column("email", "string"),
        af.Column("tenant", "string"),
        af.Column("slug", "string"),
        af.Column("nick", "string", nullable=True),
        af.Index("by_email", ["email"], unique=True),
        af.Index("by_slug", ["tenant", "slug"], unique=True),
        af.Index("by_nick", ["nick"], unique=True),
    ),
    af.Table(
        "posts",
        af.Reference("author", "users"),
        af.Column("n", "bigint"),
        af.Index("by_author", ["author", "n"], unique=True),
    ),
)


async def test_an_order_by_a_unique_key_is_read_by_its_index(make_env: MakeEnv) -> None:
    """An order whose columns, with those the condition holds to one value,
    include a unique index over NOT NULL columns has no ties, so it is
    ordered by them alone, which that index serves. With the internal id
    after them, MariaDB (whose unique indexes hold no id after their
    columns) read and sorted every matching row for each page: 200,000 rows
    for a page of 10. Pages through such orders see every row once, in
    either direction; a join orders each parent's rows by its key the same
    way; a nullable unique column keeps the tie-break (NULLs repeat)."""
    env = await make_env(DIRECTORY)
    numbers = list(range(300))  # (few rows would make a scan and sort cheaper than the index)
    random.Random(5).shuffle(numbers)  # (creation order unlike any column's)

    async def seed(uow: af.UnitOfWork) -> None:
        for i in numbers:
            user = uow.create(
                "users",
                {
                    "email": f"u{i:03}@x",
                    "tenant": "ab"[i % 2],
                    "slug": f"s{i:03}",
                    "nick": None if i % 3 else f"n{i:03}",
                },
            )
            for n in (5, 1, 3) if i < 4 else ():
                uow.create("posts", {"author": user, "n": n})

    await env.run(seed)
    sent: list[CompiledQuery] = []

    async def pages(**find: Any) -> list[str]:
        rows = await _all_pages(env, env.schema, "users", find, on_query=sent.append)
        return [row["email"] for row in rows]

    emails = [f"u{i:03}@x" for i in range(300)]
    tenant_b = af.c.tenant == "b"
    orders: list[dict[str, Any]] = [
        {"order_by": "email"},
        {"order_by": ("email", "desc")},
        {"where": {"tenant": "a"}, "order_by": "slug"},
        {"where": tenant_b, "order_by": ("slug", "desc")},
    ]
    expected = [emails, emails[::-1], emails[0::2], emails[1::2][::-1]]
    for find, rows, limit in zip(orders, expected, (37, 41, 23, 29), strict=True):
        assert await pages(**find, limit=limit) == rows
    assert all(_order_terms(q.sql) and not _ties_broken(q.sql) for q in sent)
    # First pages of a few rows from a range of the index, which MariaDB
    # reads by the index unless it must sort (given no condition, a table
    # this small is scanned and sorted anyway; 200,000 rows are not).
    sent.clear()
    since, later = af.c.email >= "u100@x", af.c.slug >= "s100"
    ranges = [since, since, (af.c.tenant == "a") & later, tenant_b & later]
    for find, where in zip(orders, ranges, strict=True):
        page = {**find, "where": where, "limit": 3}
        await env.run(partial(_read_from, "users", find=page, after=None), on_query=sent.append)
    unique_orders = list(sent)

    async def with_posts(uow: af.UnitOfWork) -> Any:
        last = af.many("posts", by="author", order_by=("n", "desc"), limit=2)
        users = uow.find("users", order_by="email", limit=3, join={"last": last})
        await uow.retrieve()
        return users.result

    users = await env.run(with_posts, on_query=sent.append)
    assert [[p["n"] for p in user["last"]] for user in users] == [[5, 3]] * 3
    posts = [q for q in sent[len(unique_orders) :] if re.search(r"[`\"]posts", q.sql)]
    assert posts and not any(_ties_broken(q.sql) for q in posts)
    # (Read by key on MariaDB: each a statement of its own, asked below.)
    by_key = [q for q in posts if "IN (SELECT" not in q.sql and "ROW_NUMBER" not in q.sql]

    sent.clear()
    nicks = await env.find("users", order_by="nick")
    # (NULLs first on SQLite and MariaDB, last on PostgreSQL; ties in creation order)
    nulls = [row["email"] for row in nicks if row["nick"] is None]
    assert nulls == [f"u{i:03}@x" for i in numbers if i % 3]
    assert sorted(row["nick"] for row in nicks if row["nick"] is not None) == [
        row["nick"] for row in nicks if row["nick"] is not None
    ]
    if env.db.name == "postgresql":  # (it sorts runs of equal values only: see above)
        return
    assert await _sorted_by_the_server(env, [*unique_orders, *by_key]) == []


def _order_terms(sql: str) -> list[str]:
    """The terms of each ORDER BY in ``sql``."""
    return re.findall(r" ORDER BY (.*?)(?= LIMIT |\)|$)", sql)


def _ties_broken(sql: str) -> bool:
    """Whether an ORDER BY of ``sql`` ends with the internal id."""
    return any(re.search(r"[`\"]_id[`\"]( DESC)?$", terms) for terms in _order_terms(sql))


async def _all_pages(
    env: Env, schema: af.Schema, table: str, find: dict[str, Any], **options: Any
) -> list[dict[str, Any]]:
    """Every row ``find`` (with a ``limit``) reads on ``env``'s Database and
    namespace, page after page through its cursor, a unit per page."""
    rows: list[dict[str, Any]] = []
    after = None
    while True:
        page = await env.db.execute_uow(
            partial(_read_from, table, find=find, after=after),
            schema=schema,
            namespace=env.namespace,
            **options,
        )
        rows += page
        if page.cursor is None:
            return rows
        after = page.cursor


async def _read_from(
    table: str, uow: af.UnitOfWork, *, find: dict[str, Any], after: str | None
) -> Any:
    page = uow.find(table, after=after, **find)
    await uow.retrieve()
    return page.result


def _emails(unique: bool, *more: af.Column) -> af.Schema:
    index = [af.Index("by_email", ["email"], unique=True)] if unique else []
    columns = [af.Column("email", "string"), af.Column("n", "bigint"), *more]
    return af.Schema("dupes", af.Table("u", *columns, *index))


async def test_reads_of_one_shape_share_their_plan_and_no_other(make_env: MakeEnv) -> None:
    """What a find's order, select and joins make of a table is built once
    per shape and kept: reads whose arguments only look alike never share
    it (a list of two names and a (name, direction) pair; the same order
    under conditions that fix other columns, which decides its tie-break;
    joins with another limit or a where), and the kept plans stay bounded
    whatever shapes the caller makes up."""
    env = await make_env(DIRECTORY)

    async def seed(uow: af.UnitOfWork) -> None:
        for i in range(6):
            user = uow.create(
                "users", {"email": f"u{i}@x", "tenant": "ab"[i % 2], "slug": f"s{i}", "nick": None}
            )
            for n in (1, 2, 3):
                uow.create("posts", {"author": user, "n": n})

    await env.run(seed)
    await env.db.migrate(DIRECTORY, namespace=env.namespace)  # (trusts the unique indexes)

    async def find(**kwargs: Any) -> tuple[list[dict[str, Any]], list[str]]:
        sent: list[CompiledQuery] = []

        async def unit(uow: af.UnitOfWork) -> Any:
            rows = uow.find("users", **kwargs)
            await uow.retrieve()
            return rows.result

        rows = await env.run(unit, on_query=sent.append)
        return rows, [q.sql for q in sent]

    for _ in range(2):  # (the second time from the kept plans)
        rows, sql = await find(where={"tenant": "a"}, order_by="slug", limit=2)
        assert [r["slug"] for r in rows] == ["s0", "s2"] and not _ties_broken(sql[-1])
        rows, sql = await find(where=af.c.slug >= "s", order_by="slug", limit=2)
        assert [r["slug"] for r in rows] == ["s0", "s1"] and _ties_broken(sql[-1])
        rows, _ = await find(order_by=("email", "desc"))
        assert [r["email"] for r in rows] == [f"u{i}@x" for i in range(5, -1, -1)]
        with pytest.raises(af.ValidationError, match="desc"):
            await find(order_by=["email", "desc"])  # (two columns, the second no column)
        rows, _ = await find(order_by=["email"], select=["slug"])
        assert rows[0].keys() == {"id", "slug"} and rows[0]["slug"] == "s0"
        rows, _ = await find(order_by=["email"], select=("email",))
        assert rows[0].keys() == {"id", "email"}

    def last(limit: int, **more: Any) -> dict[str, Any]:
        return {"last": af.many("posts", by="author", order_by=("n", "desc"), limit=limit, **more)}

    for _ in range(2):
        for join, ns in [
            (last(2), [3, 2]),
            (last(1), [3]),
            (last(2, where=af.c.n < 3), [2, 1]),
            (last(2), [3, 2]),
        ]:
            rows, _ = await find(order_by="email", limit=2, join=join)
            assert [[p["n"] for p in r["last"]] for r in rows] == [ns, ns]
    cyclic: dict[str, Any] = {}
    cyclic["p"] = af.many("posts", by="author", join={"u": af.one("author", join=cyclic)})
    with pytest.raises(af.ValidationError, match="nest at most"):
        await find(join=cyclic)

    users = env.db._catalog(DIRECTORY, env.namespace).table("users")
    plans, selections = users.plans, users._selections
    plans.capacity = selections.capacity = 50
    names = ["email", "tenant", "slug", "nick"]
    for n in range(200):  # (selects in every order: many shapes)
        random.Random(n).shuffle(names)
        rows, _ = await find(order_by="email", select=list(names[: 1 + n % 4]))
        assert rows[0]["email" if "email" in names[: 1 + n % 4] else "id"]
    assert len(plans) <= 50 and len(selections) <= 50
    # Repeats make no larger key (a select repeated 20,000 times kept that
    # list per plan), and an order naming a column twice is refused (with a
    # select leaving it out, its page deleted the column twice: KeyError).
    for n in (1, 2_000, 20_000):
        rows, _ = await find(order_by="email", select=["slug"] * n)
        assert rows[0].keys() == {"id", "slug"}
    assert max(len(repr(key)) for key in plans) < 200
    with pytest.raises(af.ValidationError, match="more than once"):
        await find(order_by=["email", ("email", "desc")], select=["slug"], limit=2)
    with pytest.raises(af.ValidationError, match="column names are str"):
        await find(select=[["slug"]])
    with pytest.raises(af.ValidationError, match="takes a column name"):
        await find(where=af.c[["slug"]] == "s1")  # type: ignore[index]


async def test_a_unique_index_orders_without_ties_once_a_migration_confirms_it(
    make_env: MakeEnv, url: str, target: Target
) -> None:
    """A declared unique index that the database may lack — its migration
    refused because rows share a key, or not run by this Database — leaves
    an order by its columns its tie-break, so pages read every row, ties in
    creation order. Once a migration (or a dry run with nothing to do)
    finds the database as declared, the order goes without it, until a
    migration of the namespace; a page that meets ties all the same (the
    index dropped by another process) is an error."""
    plain, unique = _emails(False), _emails(True)
    env = await make_env(plain)
    await env.create("u", *({"email": f"e{n % 2}", "n": n} for n in range(6)))
    with pytest.raises(af.MigrationError, match="by_email"):
        await env.db.migrate(unique, namespace=env.namespace)
    sent: list[CompiledQuery] = []

    async def pages(db: af.Database) -> list[int]:
        on = Env(db, unique, env.namespace)
        find = {"order_by": "email", "limit": 2}
        return [row["n"] for row in await _all_pages(on, unique, "u", find, on_query=sent.append)]

    assert await pages(env.db) == [0, 2, 4, 1, 3, 5]
    assert sent and all(_ties_broken(q.sql) for q in sent)

    async def keep_two(uow: af.UnitOfWork) -> None:
        uow.delete_many("u", af.c.n >= 2)

    await env.run(keep_two)
    await env.db.migrate(unique, namespace=env.namespace)
    sent.clear()
    assert await pages(env.db) == [0, 1]
    assert sent and not any(_ties_broken(q.sql) for q in sent)
    # A plan of another schema for the namespace changes nothing: the trust stays.
    later = _emails(True, af.Column("extra", "string", nullable=True))
    assert (await env.db.migration_plan(later, namespace=env.namespace)).steps
    sent.clear()
    assert await pages(env.db) == [0, 1]
    assert sent and not any(_ties_broken(q.sql) for q in sent)
    async with af.connect(url, backend=target.backend) as other:  # (as another process)
        sent.clear()
        assert await pages(other) == [0, 1]
        assert all(_ties_broken(q.sql) for q in sent)
        assert not (await other.migrate(unique, namespace=env.namespace, dry_run=True)).changed
        sent.clear()
        assert await pages(other) == [0, 1]
        assert not any(_ties_broken(q.sql) for q in sent)
        # A migration of the namespace (here: dropping the index) withdraws
        # the confirmation of its Database...
        await env.db.migrate(_emails(False), namespace=env.namespace, allow_drop=True)
        await env.create("u", *({"email": f"e{n % 2}", "n": n} for n in range(2, 6)))
        sent.clear()
        assert await pages(env.db) == [0, 2, 4, 1, 3, 5]
        assert all(_ties_broken(q.sql) for q in sent)
        # ... and another that confirmed it before meets the ties it cannot
        # page through: an error, never a page skipping rows.
        with pytest.raises(af.SchemaError, match="lacks that index"):
            await pages(other)


LONG_TEXT = af.Schema(
    "long_text",
    af.Table(
        "notes",
        af.Column("body", "text"),
        af.Column("title", af.varchar(600)),
        af.Column("short", af.varchar(256)),
        af.Column("name", "string"),
    ),
)


async def test_orders_by_long_text_are_exact_or_refused(make_env: MakeEnv) -> None:
    """Values equal in their first 1,100 characters come in order, page
    after page, each row once, in both directions. MariaDB sorts text,
    binary, JSON and varchar(n) over 256 characters by their first 1,024
    bytes only (max_sort_length; 4 per character), so that such rows came
    in creation order, find_first picked the wrong one and a cursor
    repeated and skipped rows: there every order by those columns is
    refused; varchar(256) and string columns sort whole."""
    env = await make_env(LONG_TEXT)
    tails = ("d", "a", "f", "b", "e", "c")
    await env.create(
        "notes",
        *(
            {"body": "p" * 1100 + t, "title": "p" * 590 + t, "short": "p" * 255 + t, "name": t}
            for t in tails
        ),
    )
    refused = ("body", "title") if env.db.name == "mysql" else ()
    for column in ("body", "title", "short", "name"):
        for direction in ("asc", "desc"):
            expected = sorted(tails, reverse=direction == "desc")
            order = (column, direction)
            if column in refused:
                for find in ({"order_by": order}, {"order_by": order, "limit": 2}):
                    with pytest.raises(
                        af.ValidationError, match="longer than the 1024 bytes this database sorts"
                    ):
                        await env.find("notes", **find)
                continue
            assert [row[column][-1] for row in await env.find("notes", order_by=order)] == expected
            for limit in (1, 2, 4):
                find = {"order_by": order, "limit": limit}
                rows = await _all_pages(env, env.schema, "notes", find)
                assert [row[column][-1] for row in rows] == expected, (column, limit, direction)


JSON_KEYS = af.Schema(
    "json_keys",
    af.Table("t", af.Column("j", "json"), af.Index("by_j", ["j"], unique=True)),
)


async def test_a_unique_json_index_keeps_the_tie_break(make_env: MakeEnv) -> None:
    """JSON values that Python holds equal are distinct keys of a unique
    index (1 and true; [0] and [false]): an order by such an index keeps
    its tie-break, and pages read each row once, never mistaking them for
    a tie the index would rule out. (MariaDB refuses orders by JSON.)"""
    env = await make_env(JSON_KEYS)
    values = [1, True, [0], [False]]
    await env.create("t", *({"j": value} for value in values))
    find = {"order_by": "j", "limit": 1}
    if env.db.name == "mysql":
        with pytest.raises(af.ValidationError, match="this database sorts them by"):
            await _all_pages(env, env.schema, "t", find)
        return
    sent: list[CompiledQuery] = []
    rows = await _all_pages(env, env.schema, "t", find, on_query=sent.append)
    assert sorted(repr(row["j"]) for row in rows) == sorted(map(repr, values))
    assert sent and all(_ties_broken(q.sql) for q in sent)
