"""The raw SQL layer on every backend and runtime: round trips, transactions,
errors, concurrency and cancellation against real databases."""

from __future__ import annotations

import datetime as dt
import enum
import json
import random
from decimal import Decimal
from typing import Any

import anyio
import pytest

import aiofragno as af
from tests.conformance.conftest import Tables
from tests.conftest import Target

pytestmark = pytest.mark.anyio

# Per dialect: the column types used for the value round trip.
COLUMN_TYPES = {
    "postgresql": {
        "i": "bigint",
        "t": "text",
        "b": "bytea",
        "flag": "boolean",
        "f": "double precision",
        "d": "numeric",
        "ts": "timestamptz",
        "day": "date",
        "j": "jsonb",
    },
    "sqlite": {
        "i": "integer",
        "t": "text",
        "b": "blob",
        "flag": "integer",
        "f": "real",
        "d": "text",
        "ts": "text",
        "day": "text",
        "j": "text",
    },
    "mysql": {
        "i": "bigint",
        "t": "longtext",
        "b": "longblob",
        "flag": "boolean",
        "f": "double",
        "d": "decimal(65,30)",
        "ts": "datetime(6)",
        "day": "date",
        "j": "json",
    },
}


async def make_table(db: af.Database, tables: Tables, columns: dict[str, str]) -> af.Identifier:
    table = tables.new()
    body = ", ".join(
        f"{db._engine.compiler.quote_identifier(name)} {kind}" for name, kind in columns.items()
    )
    suffix = " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin" if db.name == "mysql" else ""
    # Table DDL assembled from trusted test constants only.
    await db.execute(
        af.sql(
            "CREATE TABLE {t} (" + body.replace("{", "{{").replace("}", "}}") + ")" + suffix,
            t=table,
        )
    )
    return table


async def insert(db: af.Database, table: af.Identifier, values: dict[str, Any]) -> af.QueryResult:
    names = list(values)
    columns = af.Fragment.join([af.sql("{c}", c=af.Identifier(n)) for n in names])
    holes = af.Fragment.join([af.sql("{v}", v=values[n]) for n in names])
    return await db.execute(
        af.sql("INSERT INTO {t} ({c}) VALUES ({v})", t=table, c=columns, v=holes)
    )


def as_decimal(value: Any) -> Decimal:
    return Decimal(value) if isinstance(value, str) else value


def as_datetime(value: Any) -> dt.datetime:
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else value


def as_date(value: Any) -> dt.date:
    return dt.date.fromisoformat(value) if isinstance(value, str) else value


EDGE_VALUES = [
    {
        "i": 2**63 - 1,
        "t": "emoji 🦀 combining e\u0301 and 'quotes' \"double\" \\ backslash",
        "b": b"\x00\x01binary\x00\xff",
        "flag": True,
        "f": 1.5e-300,
        "d": Decimal("12345678901234567890.123456789"),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC),
        "day": dt.date(2024, 2, 29),
        "j": {"nested": [1, 2.5, None, True, "é"], "empty": {}},
    },
    {
        "i": -(2**63),
        "t": "",
        "b": b"",
        "flag": False,
        "f": -0.0,
        "d": Decimal("-0.000000000000000000001"),
        "ts": dt.datetime(1999, 12, 31, 22, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        "day": dt.date(1, 1, 1) if False else dt.date(1970, 1, 1),
        "j": [],
    },
]


# Long texts full of characters a string literal must escape (the MySQL
# backend writes every value into the statement as a literal itself).
LONG_TEXTS = {
    "specials": "\\ ' \" \n \r \x1a %s %% ; é 🦀 " * 8,
    "backslashes": "\\" * 99 + "'",
    "json": json.dumps({"k": ['v "q" \\ \'', "\n"] * 10}),
    "nul": "\x00 x \x00" * 30,
}


@pytest.mark.parametrize("text", LONG_TEXTS.values(), ids=LONG_TEXTS.keys())
async def test_long_text_round_trip(db: af.Database, tables: Tables, text: str) -> None:
    if "\x00" in text and db._engine.adapter.storage.text_rejects_nul:
        pytest.skip("this database's text cannot hold NUL (rejected before the database)")
    table = await make_table(db, tables, {"t": COLUMN_TYPES[db.name]["t"]})
    await insert(db, table, {"t": text})
    assert (
        await db.fetch_value(af.sql("SELECT {c} FROM {t}", c=af.Identifier("t"), t=table)) == text
    )
    found = af.sql(
        "SELECT COUNT(*) FROM {t} WHERE {c} = {v}", t=table, c=af.Identifier("t"), v=text
    )
    assert await db.fetch_value(found) == 1


async def test_long_text_round_trip_without_backslash_escapes(
    db: af.Database, tables: Tables
) -> None:
    """Under MySQL's NO_BACKSLASH_ESCAPES a backslash is an ordinary character
    in a literal; values must still arrive unchanged."""
    if db.name != "mysql":
        pytest.skip("NO_BACKSLASH_ESCAPES is a MySQL sql_mode")
    table = await make_table(db, tables, {"t": COLUMN_TYPES[db.name]["t"]})
    async with db.transaction() as tx:  # one connection, so the session mode holds
        mode = await tx.fetch_value(af.sql("SELECT @@SESSION.sql_mode"))
        await tx.execute(af.sql("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'"))
        try:
            for text in LONG_TEXTS.values():
                await tx.execute(af.sql("INSERT INTO {t} VALUES ({v})", t=table, v=text))
                got = af.sql(
                    "SELECT {c} FROM {t} WHERE {c} = {v}", t=table, c=af.Identifier("t"), v=text
                )
                assert await tx.fetch_value(got) == text
        finally:
            await tx.execute(af.sql("SET SESSION sql_mode = {m}", m=mode))


@pytest.mark.parametrize("values", EDGE_VALUES, ids=["max", "min"])
async def test_value_round_trip(db: af.Database, tables: Tables, values: dict[str, Any]) -> None:
    table = await make_table(db, tables, COLUMN_TYPES[db.name])
    await insert(db, table, {**values, "j": af.Json(values["j"])})
    row = await db.fetch_one(af.sql("SELECT * FROM {t}", t=table))
    assert row is not None
    assert row["i"] == values["i"]
    assert row["t"] == values["t"]
    assert bytes(row["b"]) == values["b"]
    assert bool(row["flag"]) is values["flag"]
    assert row["f"] == values["f"]
    assert as_decimal(row["d"]) == values["d"]
    got_ts = as_datetime(row["ts"])
    assert got_ts == values["ts"]
    assert got_ts.utcoffset() == dt.timedelta(0)
    assert as_date(row["day"]) == values["day"]
    assert json.loads(row["j"]) == values["j"]


async def test_null_round_trip(db: af.Database, tables: Tables) -> None:
    columns = {name: kind for name, kind in COLUMN_TYPES[db.name].items()}
    table = await make_table(db, tables, columns)
    await insert(db, table, dict.fromkeys(columns))
    row = await db.fetch_one(af.sql("SELECT * FROM {t}", t=table))
    assert row is not None
    assert set(row.values()) == {None}


async def test_nul_bytes_in_text(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"t": COLUMN_TYPES[db.name]["t"]})
    if db.name == "postgresql":
        with pytest.raises(af.ValidationError, match="NUL"):
            await insert(db, table, {"t": "a\x00b"})
        assert await db.fetch(af.sql("SELECT * FROM {t}", t=table)) == []
    else:
        await insert(db, table, {"t": "a\x00b"})
        assert await db.fetch_value(af.sql("SELECT t FROM {t}", t=table)) == "a\x00b"


INJECTIONS = [
    "'; DROP TABLE victims; --",
    '"; DROP TABLE victims; --',
    "` ; DROP TABLE victims; --",
    "1 OR 1=1",
    "\\'; DROP TABLE victims; --",
    "%s %% $1 ? {x}",
]


async def test_sql_injection_in_values_is_stored_verbatim(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"t": COLUMN_TYPES[db.name]["t"]})
    for payload in INJECTIONS:
        await insert(db, table, {"t": payload})
    rows = await db.fetch(af.sql("SELECT t FROM {t} WHERE t IN {p}", t=table, p=INJECTIONS))
    assert sorted(r["t"] for r in rows) == sorted(INJECTIONS)
    assert (
        await db.fetch_value(
            af.sql("SELECT count(*) FROM {t} WHERE t = {p}", t=table, p="1 OR 1=1")
        )
        == 1
    )


async def test_sql_injection_in_identifiers_is_a_name(db: af.Database, tables: Tables) -> None:
    for evil in ['x"; DROP TABLE victims; --', "x`; DROP TABLE victims; --"]:
        table = tables.new()
        weird = af.Identifier(evil)
        await db.execute(af.sql("CREATE TABLE {t} ({c} integer)", t=table, c=weird))
        await db.execute(af.sql("INSERT INTO {t} ({c}) VALUES ({v})", t=table, c=weird, v=7))
        row = await db.fetch_one(af.sql("SELECT {c} FROM {t}", t=table, c=weird))
        assert row is not None and row[evil] == 7


async def test_in_lists(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"i": COLUMN_TYPES[db.name]["i"]})
    for i in range(5):
        await insert(db, table, {"i": i})

    async def ids(op: str, values: list[int]) -> list[int]:
        q = af.sql("SELECT i FROM {t} WHERE i " + op + " {v} ORDER BY i", t=table, v=values)
        return [r["i"] for r in await db.fetch(q)]

    assert await ids("IN", [1, 3, 99]) == [1, 3]
    assert await ids("NOT IN", [1, 3]) == [0, 2, 4]
    assert await ids("IN", []) == []
    assert await ids("NOT IN", []) == [0, 1, 2, 3, 4]


async def test_rows_affected_and_insert_id(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"i": COLUMN_TYPES[db.name]["i"], "t": "varchar(20)"})
    for i in range(3):
        await insert(db, table, {"i": i, "t": "same"})
    # Matched rows, even where the value does not change (MySQL FOUND_ROWS).
    result = await db.execute(af.sql("UPDATE {t} SET t = {v}", t=table, v="same"))
    assert result.rows_affected == 3
    result = await db.execute(af.sql("DELETE FROM {t} WHERE i > {v}", t=table, v=0))
    assert result.rows_affected == 2
    assert result.rows == []
    result = await db.execute(af.sql("SELECT * FROM {t}", t=table))
    assert result.rows_affected == 1


async def test_rows_and_counts_are_the_same_at_every_run(db: af.Database, tables: Tables) -> None:
    # asyncpg learns at a statement's first run whether it returns rows and
    # runs it through a public call of that kind afterwards; a text over
    # 15 KiB is prepared afresh every time.
    table = await make_table(db, tables, {"i": COLUMN_TYPES[db.name]["i"], "t": "varchar(20)"})
    for i in range(3):
        await insert(db, table, {"i": i, "t": "same"})
    long_comment = "/* " + "x" * 16 * 1024 + " */ "
    statements: list[tuple[af.Fragment, list[int], int]] = [
        (af.sql("SELECT i FROM {t} ORDER BY i", t=table), [0, 1, 2], 3),
        (af.sql(long_comment + "SELECT i FROM {t} WHERE i > {v}", t=table, v=0), [1, 2], 2),
        (af.sql("SELECT i FROM {t} WHERE i > {v}", t=table, v=99), [], 0),
        (af.sql("UPDATE {t} SET t = {v}", t=table, v="same"), [], 3),
        (af.sql("UPDATE {t} SET t = t WHERE i > 0", t=table), [], 2),  # no parameters
        (af.sql(long_comment + "UPDATE {t} SET t = {v}", t=table, v="same"), [], 3),
        (af.sql("DELETE FROM {t} WHERE i > {v}", t=table, v=99), [], 0),
    ]
    if db._engine.adapter.capabilities.supports_returning:
        statements += [
            (
                af.sql("UPDATE {t} SET t = {v} WHERE i > 0 RETURNING i", t=table, v="same"),
                [1, 2],
                2,
            ),
            (af.sql("DELETE FROM {t} WHERE i > {v} RETURNING i", t=table, v=99), [], 0),
        ]
    for statement, rows, count in statements:
        for _ in range(3):
            result = await db.execute(statement)
            assert (sorted(r["i"] for r in result.rows), result.rows_affected) == (rows, count)


async def test_insert_id_for_generated_keys(db: af.Database, tables: Tables) -> None:
    table = tables.new()
    key = {
        "postgresql": "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        "sqlite": "INTEGER PRIMARY KEY",
        "mysql": "bigint AUTO_INCREMENT PRIMARY KEY",
    }[db.name]
    await db.execute(af.sql("CREATE TABLE {t} (k " + key + ", v integer)", t=table))
    first = await db.execute(af.sql("INSERT INTO {t} (v) VALUES ({v})", t=table, v=1))
    second = await db.execute(af.sql("INSERT INTO {t} (v) VALUES ({v})", t=table, v=2))
    if db._engine.adapter.capabilities.supports_returning:
        returned = await db.fetch_value(
            af.sql("INSERT INTO {t} (v) VALUES (3) RETURNING k", t=table)
        )
        assert returned == 3
    if db.name == "postgresql":
        assert first.insert_id is None  # PostgreSQL reports keys through RETURNING only
    else:
        assert (first.insert_id, second.insert_id) == (1, 2)
    update = await db.execute(af.sql("UPDATE {t} SET v = 5", t=table))
    assert update.insert_id is None


async def test_rows_are_mappings(db: af.Database) -> None:
    row = await db.fetch_one(af.sql("SELECT 1 AS a, {x} AS b", x="two"))
    assert row is not None
    assert dict(row) == {"a": 1, "b": "two"}
    assert list(row) == ["a", "b"]
    assert row == {"a": 1, "b": "two"}
    assert "a" in row and "c" not in row
    with pytest.raises(KeyError):
        row["c"]
    assert await db.fetch_one(af.sql("SELECT 1 AS a WHERE 1 = 0")) is None
    assert await db.fetch_value(af.sql("SELECT 1 AS a WHERE 1 = 0")) is None


async def test_sql_text_is_refused_before_it_is_sent(db: af.Database) -> None:
    """Only af.sql fragments are queries (so values stay bound parameters): a
    str or anything else is a ValidationError that says how to write it, and
    nothing reaches the database — a transaction it was sent in goes on."""
    wrap = r"got (str|int): wrap the SQL in af\.sql\(\.\.\.\)"
    for method in (db.fetch, db.fetch_one, db.fetch_value, db.execute):
        with pytest.raises(af.ValidationError, match=wrap):
            await method("SELECT 1")  # type: ignore[arg-type, call-overload]
    with pytest.raises(af.ValidationError, match=wrap):
        await db.execute(123)  # type: ignore[arg-type]
    async with db.transaction() as tx:
        with pytest.raises(af.ValidationError, match=wrap):
            await tx.execute("SELECT 1")  # type: ignore[arg-type]
        assert await tx.fetch_value(af.sql("SELECT 1")) == 1


async def test_fetch_value_of_a_type(db: af.Database, tables: Tables) -> None:
    """fetch_value(query, kind) returns the value when it is a ``kind`` and
    raises UnexpectedType (naming what came, never the value) when it is not."""
    table = await make_table(db, tables, {"i": "integer"})
    await insert(db, table, {"i": 7})
    count = await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table), int)
    assert (count, type(count)) == (1, int)
    assert await db.fetch_value(af.sql("SELECT {v}", v="x"), str) == "x"
    async with db.transaction() as tx:
        assert await tx.fetch_value(af.sql("SELECT i FROM {t}", t=table), int) == 7
    cases = [
        (af.sql("SELECT i FROM {t} WHERE i = 8", t=table), "got no row"),
        (af.sql("SELECT NULL"), "got NULL"),
        (af.sql("SELECT {v}", v="secret-value"), "got a str"),
    ]
    for query, got in cases:
        with pytest.raises(af.UnexpectedType, match=rf"fetch_value\(query, int\) {got}") as info:
            await db.fetch_value(query, int)
        assert isinstance(info.value, TypeError)
        assert "secret-value" not in str(info.value)
    assert await db.fetch_value(af.sql("SELECT NULL")) is None  # without a type: anything


async def test_transaction_commits(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"i": "integer"})
    async with db.transaction() as tx:
        await insert(db, table, {"i": 1})  # db.* inside the block joins the transaction
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
        assert await tx.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 2
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 2


async def test_a_transaction_used_after_it_ended_is_refused(
    db: af.Database, tables: Tables
) -> None:
    """Its connection went back to the pool when it ended: a statement on
    the handle afterwards raises TransactionClosed, and sends nothing."""
    table = await make_table(db, tables, {"i": "integer"})
    async with db.transaction() as tx:
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
    with pytest.raises(af.TransactionClosed, match="has ended"):
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
    with pytest.raises(af.TransactionClosed):
        async with tx.transaction():  # a savepoint of it
            pass
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 1


async def test_a_task_started_in_a_transaction_leaves_it_when_it_ends(
    db: af.Database, tables: Tables
) -> None:
    """A task started inside ``db.transaction()`` inherits it (the context
    is copied); once the transaction has ended, the task's queries and
    transactions are its own — not a savepoint of the ended transaction on a
    connection that is back in the pool."""
    table = await make_table(db, tables, {"i": "integer"})
    ended = anyio.Event()
    seen: list[Any] = []

    async def late() -> None:
        await ended.wait()
        async with db.transaction() as own:
            seen.append(own)
            await own.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
        seen.append(await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)))

    async with anyio.create_task_group() as tg:
        async with db.transaction() as tx:
            tg.start_soon(late)
            await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
        ended.set()
    assert seen[0] is not tx
    assert seen[1] == 2


async def test_transaction_rolls_back_on_exception(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"i": "integer"})
    with pytest.raises(ZeroDivisionError):
        async with db.transaction() as tx:
            await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
            1 / 0  # noqa: B018
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 0


async def test_nested_transaction_is_a_savepoint(db: af.Database, tables: Tables) -> None:
    table = await make_table(db, tables, {"i": "integer"})
    async with db.transaction() as tx:
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
        with pytest.raises(RuntimeError):
            async with db.transaction():
                await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
                raise RuntimeError("undo only the inner block")
        async with tx.transaction():
            await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (3)", t=table))
            async with tx.transaction():
                await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (4)", t=table))
    rows = await db.fetch(af.sql("SELECT i FROM {t} ORDER BY i", t=table))
    assert [r["i"] for r in rows] == [1, 3, 4]


async def test_failed_statement_inside_savepoint_keeps_the_transaction(
    db: af.Database, tables: Tables
) -> None:
    table = await make_table(db, tables, {"i": "integer"})
    await db.execute(
        af.sql(
            "CREATE UNIQUE INDEX {n} ON {t} (i)", n=af.Identifier(f"{table.parts[0]}_u"), t=table
        )
    )
    async with db.transaction() as tx:
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
        with pytest.raises(af.UniqueViolation):
            async with tx.transaction():
                await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 2


async def test_concurrent_transactions_serialize_correctly(db: af.Database, tables: Tables) -> None:
    """Read-modify-write under a row lock (or SQLite's single writer): no lost update."""
    table = await make_table(db, tables, {"n": "integer"})
    await insert(db, table, {"n": 0})
    lock = "" if db.name == "sqlite" else " FOR UPDATE"

    async def bump() -> None:
        async with db.transaction() as tx:
            n = await tx.fetch_value(af.sql("SELECT n FROM {t}" + lock, t=table), int)
            await tx.execute(af.sql("UPDATE {t} SET n = {n}", t=table, n=n + 1))

    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(bump)
    assert await db.fetch_value(af.sql("SELECT n FROM {t}", t=table)) == 40


async def test_200_concurrent_queries_over_a_pool_of_5(db: af.Database) -> None:
    assert db._engine._driver.pool.size == (1 if db.url.is_memory else 5)  # type: ignore[attr-defined]
    results: list[int] = []

    async def one(i: int) -> None:
        results.append(await db.fetch_value(af.sql("SELECT {i} + 0 AS v", i=i), int))

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(one, i)
    assert sorted(results) == list(range(200))
    stats = db._engine._driver.pool.stats  # type: ignore[attr-defined]
    assert stats.in_use == 0 and stats.idle <= 5


# The server's id of the connection, where it has one.
CONNECTION_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
SLOW_QUERY = {
    "postgresql": "SELECT pg_sleep(10)",
    "mysql": "SELECT SLEEP(10)",
    # A long recursive count: seconds of CPU in SQLite, interruptible.
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 500000000) "
    "SELECT max(x) FROM c",
}


async def test_cancelling_a_query_leaves_the_pool_usable(db: af.Database) -> None:
    started = anyio.current_time()
    with anyio.move_on_after(0.3) as scope:
        await db.fetch(db._engine.raw(SLOW_QUERY[db.name]))
    assert scope.cancelled_caught
    assert anyio.current_time() - started < 5, "cancellation must not wait for the query"
    # Every connection of the pool still works afterwards.
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(db.fetch_value, af.sql("SELECT 1"))
    assert await db.fetch_value(af.sql("SELECT {v} + 1", v=1)) == 2
    assert await db.is_healthy()


async def test_a_read_cancelled_mid_flight_leaves_no_broken_connection_in_the_pool(
    url: str, target: Target
) -> None:
    """A read cancelled while the server runs it (the read path's usual case:
    an idle connection, taken without a coroutine) does not put its
    connection back as it is: with a pool of one, the next read gets its
    own result, not the cancelled one's, on a connection replaced (the
    server may still be running the statement; on MySQL asyncmy's stream
    is left mid-reply)."""
    async with af.connect(url, backend=target.backend, pool_size=1) as solo:
        connection_id = af.sql(CONNECTION_ID.get(solo.name, "SELECT NULL"))
        first = await solo.fetch_value(connection_id)
        with anyio.move_on_after(0.3) as scope:
            await solo.fetch_one(solo._engine.raw(SLOW_QUERY[solo.name]))
        assert scope.cancelled_caught
        assert await solo.fetch_value(af.sql("SELECT {v} + 1", v=6), int) == 7
        if solo.name in CONNECTION_ID:
            assert await solo.fetch_value(connection_id) != first
        stats = solo._engine._driver.pool.stats  # type: ignore[attr-defined]
        assert (stats.idle, stats.in_use) == (1, 0)


async def test_cancelling_inside_a_transaction_rolls_it_back(
    db: af.Database, tables: Tables
) -> None:
    table = await make_table(db, tables, {"i": "integer"})
    with anyio.move_on_after(0.3):
        async with db.transaction() as tx:
            await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
            await tx.fetch(db._engine.raw(SLOW_QUERY[db.name]))
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 0
    async with db.transaction() as tx:
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 1


async def test_transactions_cancelled_at_any_moment_leave_the_next_one_clean(
    url: str, target: Target
) -> None:
    """Transactions cancelled a moment into their first statement, at random,
    on a pool of one: each next transaction starts clean and commits alone.
    (SQLite's rollback asked whether a transaction was open from the event
    loop's thread while the cancelled BEGIN and INSERT still waited on
    sqlite3's: it skipped the ROLLBACK, the pooled connection kept the
    transaction, and the next BEGIN failed within 35-125 rounds.)"""
    rng = random.Random(0)
    async with af.connect(url, backend=target.backend, pool_size=1) as solo:
        table = af.Identifier(f"cancelled_{rng.randrange(10**9)}")
        await solo.execute(af.sql("CREATE TABLE {t} (i integer)", t=table))
        try:
            kept = 0
            for i in range(300):
                with anyio.move_on_after(rng.random() * 0.003):
                    async with solo.transaction() as tx:
                        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES ({i})", t=table, i=i))
                async with solo.transaction() as tx:
                    await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (-1)", t=table))
                kept += 1
            rows = await solo.fetch(af.sql("SELECT i FROM {t} WHERE i = -1", t=table))
            assert len(rows) == kept == 300
        finally:
            await solo.execute(af.sql("DROP TABLE {t}", t=table))


async def test_a_statement_cancelled_before_it_is_sent_in_a_transaction_is_not_applied(
    db: af.Database, tables: Tables
) -> None:
    """A transaction's statement whose task is already cancelled raises the
    cancellation before it is sent, as a checkpoint would: the caller, told
    it was cancelled, may catch that and go on to commit the rest. (Taking
    the transaction's free lock without checking made SQLite run it in its
    thread and commit it with the rest, and MySQL fail the next statement.)"""
    table = await make_table(db, tables, {"i": "integer"})
    async with db.transaction() as tx:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
        assert scope.cancelled_caught
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (2)", t=table))
    assert await db.fetch(af.sql("SELECT i FROM {t}", t=table)) == [{"i": 2}]


async def test_cancelling_a_commit_batch_before_its_commit_applies_nothing(
    db: af.Database, tables: Tables
) -> None:
    """Statements sent together with COMMIT (one thread hop on SQLite, one
    multi-statement text on MySQL) are cut short by a cancelled caller up to
    the COMMIT, and the transaction is rolled back."""
    table = await make_table(db, tables, {"i": "integer"})
    started = anyio.current_time()
    session = await db._engine.acquire()
    try:
        await session.begin(None)
        with anyio.move_on_after(0.3) as scope:
            await session.commit(
                [
                    db.compile(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table)),
                    db.compile(db._engine.raw(SLOW_QUERY[db.name])),
                ]
            )
        assert scope.cancelled_caught
    finally:
        await db._engine.release(session)
    assert anyio.current_time() - started < 5, "cancellation must not wait for the query"
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 0
    await insert(db, table, {"i": 2})
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 1


async def test_a_commit_batch_stopped_part_way_leaves_the_transaction_open(
    db: af.Database, tables: Tables
) -> None:
    """``Session.commit`` with a stop point: at the stop, no COMMIT, and the
    caller's rollback undoes everything; without one, all of it commits."""
    table = await make_table(db, tables, {"i": "integer"})
    inserts = [
        db.compile(af.sql("INSERT INTO {t} (i) VALUES ({i})", t=table, i=i)) for i in (1, 2, 3)
    ]
    session = await db._engine.acquire()
    try:
        await session.begin(None)
        results = await session.commit(inserts, lambda index, result: index == 1)
        assert [r.rows_affected for r in results] == [1, 1]
        assert session.in_transaction
        await session.rollback()
        assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 0
        await session.begin(None)
        results = await session.commit(inserts, lambda index, result: result.rows_affected != 1)
        assert len(results) == 3 and not session.in_transaction
    finally:
        await db._engine.release(session)
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 3


async def test_errors_are_mapped(db: af.Database, tables: Tables) -> None:
    parent = await make_table(
        db, tables, {"id": "integer PRIMARY KEY", "name": "varchar(5) NOT NULL"}
    )
    child = tables.new()
    await db.execute(
        af.sql(
            "CREATE TABLE {c} (p integer, FOREIGN KEY (p) REFERENCES {t} (id))", c=child, t=parent
        )
    )
    await insert(db, parent, {"id": 1, "name": "a"})
    with pytest.raises(af.UniqueViolation) as unique:
        await insert(db, parent, {"id": 1, "name": "b"})
    assert unique.value.sqlstate is not None and unique.value.sqlstate.startswith("23")
    assert unique.value.__cause__ is not None
    with pytest.raises(af.ForeignKeyViolation):
        await insert(db, child, {"p": 99})
    with pytest.raises(af.NotNullViolation):
        await insert(db, parent, {"id": 2, "name": None})
    with pytest.raises(af.ProgrammingError):
        await db.execute(af.sql("SELEKT 1"))
    with pytest.raises(af.ProgrammingError):
        await db.execute(af.sql("SELECT * FROM {t}", t=af.Identifier("no_such_table_here")))
    if db.name != "sqlite":  # SQLite does not enforce varchar lengths
        with pytest.raises(af.DataError):
            await insert(db, parent, {"id": 3, "name": "much too long"})
    # Nothing of the failed statements was written.
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=parent)) == 1


async def test_serialization_failure_is_mapped(db: af.Database, tables: Tables, url: str) -> None:
    if db.name != "postgresql":
        pytest.skip("PostgreSQL serializable isolation produces SQLSTATE 40001")
    table = await make_table(db, tables, {"n": "integer"})
    await insert(db, table, {"n": 0})
    async with db.transaction("serializable") as t1:
        await t1.fetch(af.sql("SELECT * FROM {t}", t=table))
        async with af.connect(url) as other, other.transaction("serializable") as t2:
            await t2.fetch(af.sql("SELECT * FROM {t}", t=table))
            await t2.execute(af.sql("UPDATE {t} SET n = 1", t=table))
        with pytest.raises(af.SerializationFailure) as failure:
            await t1.execute(af.sql("UPDATE {t} SET n = 2", t=table))
    assert failure.value.sqlstate == "40001"
    assert isinstance(failure.value, af.TransactionConflict)


async def test_deadlock_is_mapped(db: af.Database, tables: Tables) -> None:
    if db.name == "sqlite":
        pytest.skip("SQLite has one writer: transactions cannot deadlock")
    table = await make_table(db, tables, {"id": "integer PRIMARY KEY", "n": "integer"})
    await insert(db, table, {"id": 1, "n": 0})
    await insert(db, table, {"id": 2, "n": 0})
    both_locked = anyio.Event()
    first_locks = [anyio.Event(), anyio.Event()]
    outcomes: list[BaseException | None] = []

    async def worker(first: int, second: int, me: int) -> None:
        try:
            async with db.transaction() as tx:
                await tx.execute(
                    af.sql("UPDATE {t} SET n = n + 1 WHERE id = {i}", t=table, i=first)
                )
                first_locks[me].set()
                await first_locks[1 - me].wait()
                both_locked.set()
                await tx.execute(
                    af.sql("UPDATE {t} SET n = n + 1 WHERE id = {i}", t=table, i=second)
                )
            outcomes.append(None)
        except af.Error as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, 1, 2, 0)
        tg.start_soon(worker, 2, 1, 1)
    errors = [e for e in outcomes if e is not None]
    assert len(errors) == 1, outcomes
    assert isinstance(errors[0], af.DeadlockDetected)
    total = await db.fetch_value(af.sql("SELECT sum(n) FROM {t}", t=table))
    assert total == 2  # the survivor's two updates, none of the victim's (MySQL: a Decimal)


async def test_now_is_aware_utc(db: af.Database) -> None:
    now = await db.now()
    assert now.tzinfo is not None and now.utcoffset() == dt.timedelta(0)
    assert abs((now - dt.datetime.now(dt.UTC)).total_seconds()) < 60


async def test_close_is_idempotent_and_use_after_close_is_clear(url: str, target: Any) -> None:
    db = await af.connect(url, backend=target.backend)
    assert await db.is_healthy()
    await db.close()
    await db.close()
    assert not await db.is_healthy()
    with pytest.raises(af.DatabaseClosed, match="closed"):
        await db.fetch(af.sql("SELECT 1"))
    with pytest.raises(af.DatabaseClosed):
        db.transaction()


async def test_async_with_connect(url: str, target: Any) -> None:
    async with af.connect(url, backend=target.backend) as db:
        assert await db.fetch_value(af.sql("SELECT {v}", v="x")) == "x"
    assert db.closed


async def test_pool_timeout(url: str, target: Any) -> None:
    async with af.connect(url, backend=target.backend, pool_size=1, acquire_timeout=0.2) as db:
        holding, done = anyio.Event(), anyio.Event()

        async def hold_the_only_connection() -> None:
            async with db.transaction():
                holding.set()
                await done.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_the_only_connection)
            await holding.wait()
            # This task is outside that transaction, so it needs a connection.
            with pytest.raises(af.PoolTimeout, match="pool_size"):
                await db.fetch(af.sql("SELECT 1"))
            done.set()
        assert await db.fetch_value(af.sql("SELECT 1")) == 1


async def test_stats_count_units_attempts_and_conflicts(db: af.Database, tables: Tables) -> None:
    schema = af.Schema("statsns", af.Table("t", af.Column("n", "bigint")))
    ns = f"st{tables.new().parts[0][-8:]}"
    physical = db.layout(schema, ns).table("t")
    if physical.schema is None:
        tables.names.append(physical.name)  # dropped by the fixture
    await db.migrate(schema, namespace=ns)
    injected = []

    def conflict_once(uow: af.UnitOfWork) -> None:
        if not injected:
            injected.append(uow.uow_id)
            raise af.ConcurrencyConflict("injected")

    async def create(uow: af.UnitOfWork) -> None:
        uow.create("t", {"n": 1})

    before = db.stats.as_dict()
    await db.execute_uow(
        create, schema=schema, namespace=ns, hooks=af.UowHooks(before_mutation=conflict_once)
    )
    await db.execute_uow(create, schema=schema, namespace=ns)
    after = db.stats.as_dict()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["units"] == 2 and delta["attempts"] == 3 and delta["conflicts"] == 1, delta
    if physical.schema is not None:
        await db.execute(af.sql("DROP SCHEMA {s} CASCADE", s=af.Identifier(physical.schema)))


class _Level(enum.IntEnum):
    HIGH = 7


class _Colour(enum.StrEnum):
    RED = "red"


# Values of every type MySQL binds, and edges of each (see
# aiofragno/backends/asyncmy_prepared.py).
MYSQL_VALUES = [
    "plain", "", "it's \\ 'q' %s é 🦀", "\x00\x1a", 5, -(2**63), 2**64 - 1, 2**70, -(2**70),
    True, False, None, 1.5, -0.0, 1e-300, Decimal("1.25"), Decimal("-0.000"),
    b"\x00\xff", bytearray(b"ab"), memoryview(b"cd"), _Level.HIGH, _Colour.RED,
    dt.datetime(2024, 2, 29, 23, 59, 59, 5), dt.datetime(2020, 1, 1), dt.date(2020, 1, 2),
    dt.time(1, 2, 3, 4), dt.timedelta(days=-1, seconds=5), dt.timedelta(hours=838),
]  # fmt: skip


async def test_mysql_values_bound_mean_what_their_literals_mean(db: af.Database) -> None:
    """MySQL runs a statement with values as a prepared statement (binary
    protocol): each value reads back as its literal in the statement's text
    does — dates, times and intervals as their text, an integer beyond 64
    bits as a DECIMAL — alone and in an expression."""
    if db.name != "mysql":
        pytest.skip("the text protocol's literals are MySQL's")
    from aiofragno.backends.asyncmy import _literal

    for value in MYSQL_VALUES:
        literal = _literal(value)
        for template in ("SELECT {x} AS v", "SELECT CONCAT({x}) AS v", "SELECT {x} = {y} AS v"):
            names = ["x", "y"] if "{y}" in template else ["x"]
            bound = await db.fetch_one(af.sql(template, **dict.fromkeys(names, value)))
            text = await db.fetch_one(af.sql(template.format(x=literal, y=literal)))
            assert bound is not None and text is not None
            assert (type(bound["v"]), bound["v"]) == (type(text["v"]), text["v"]), (value, template)


async def test_mysql_float_columns_read_as_the_value_written(
    db: af.Database, tables: Tables
) -> None:
    """A single-precision FLOAT column read by a statement with values (the
    binary protocol sends the stored number: 0.1 as 0.10000000149011612)
    reads as the shortest decimal that is the stored number."""
    if db.name != "mysql":
        pytest.skip("FLOAT is MySQL's single-precision type")
    table = await make_table(db, tables, {"i": "int", "f": "float", "g": "float(7,2)"})
    written = [(0.1, 3.14), (16777216.0, -1.5), (3.4e38, 0.0), (None, None)]
    for i, (f, g) in enumerate(written):
        await insert(db, table, {"i": i, "f": f, "g": g})
    rows = await db.fetch(af.sql("SELECT f, g FROM {t} WHERE i >= {n} ORDER BY i", t=table, n=0))
    assert [(row["f"], row["g"]) for row in rows] == written


async def test_a_text_the_server_cannot_prepare_runs_as_text(db: af.Database) -> None:
    """Statements with values that MySQL's binary protocol cannot take (two
    statements in one text, a value where the grammar wants a literal) run
    as before, every time; a statement refused for what it says is refused
    as before."""
    if db.name != "mysql":
        pytest.skip("prepared statements with a text fallback are MySQL's")
    for _ in range(3):
        assert await db.fetch_value(af.sql("SELECT {x}; SELECT 2", x=1)) == 1
        # (SHOW takes a literal pattern, never a placeholder.)
        shown = await db.fetch(af.sql("SHOW VARIABLES LIKE {p}", p="sql_mod%"))
        assert [row["Variable_name"] for row in shown] == ["sql_mode"]
        with pytest.raises(af.ProgrammingError) as refused:
            await db.fetch_value(af.sql("SELECT {x} FROM no_such_table_here", x=1))
        assert refused.value.code == "1146"
