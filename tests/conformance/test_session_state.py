"""Session state on pooled connections, and values bound whatever the session.

A raw statement can change its connection's session (open a transaction,
change settings, take session locks, create temporary objects); the pool
must never hand that state to the next caller. Every test here uses a pool of
one connection, so the next caller really gets the same connection. And a
value aiofragno binds must be stored exactly, never run as SQL, whatever the
session's sql_mode (MySQL binds values as literals in the statement text).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.conftest import Tables
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target

pytestmark = pytest.mark.anyio

NOTES = af.Schema(
    "notes",
    af.Table(
        "notes",
        af.Column("label", "string"),
        af.Column("body", "text", nullable=True),
        af.Column("blob", "binary", nullable=True),
    ),
)


@pytest.fixture
async def solo(url: str, target: Target) -> AsyncIterator[af.Database]:
    """A Database with a pool of one connection: every call reuses it."""
    async with af.connect(url, backend=target.backend, pool_size=1) as database:
        yield database


@pytest.fixture
async def namespaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


async def migrated(db: af.Database, namespaces: Namespaces) -> str:
    namespace = namespaces.use(db, NOTES).namespace
    await db.migrate(NOTES, namespace=namespace)
    return namespace


async def create_note(db: af.Database, namespace: str, **values: Any) -> af.RowId:
    async def unit(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("notes", {"label": "x", **values})

    result: af.RowId = await db.execute_uow(unit, schema=NOTES, namespace=namespace)
    return result


async def labels(db: af.Database, namespace: str) -> list[str]:
    """The notes' labels, read on a connection of ``db``."""

    async def unit(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("notes")
        await uow.retrieve()
        return sorted(row["label"] for row in op.result)

    result: list[str] = await db.execute_uow(unit, schema=NOTES, namespace=namespace)
    return result


# --- values: stored exactly, never run as SQL ---------------------------------

SENTINEL = "{sentinel}"
HOSTILE = [
    "plain",
    "it's",
    "\\",
    "ends with a backslash \\",
    "\\'; DROP TABLE {sentinel}; -- ",
    "'); DROP TABLE {sentinel}; -- ",
    "\\\\'' OR 1=1; DROP TABLE {sentinel}; -- ",
    '"double" \\" quotes',
    "NUL \x00 byte",
    "ctrl-z \x1a and \\Z",
    "percent %s %% %(x)s",
    "multi-byte é€😀 \u202e",
    "\u7e17' OR 1=1; DROP TABLE {sentinel}; -- ",
    "\n\r\t",
    "",
]


def payloads(db: af.Database, sentinel: str) -> list[str]:
    texts = [text.replace(SENTINEL, sentinel) for text in HOSTILE]
    if db.adapter.storage.text_rejects_nul:
        texts = [text for text in texts if "\x00" not in text]
    return texts


def blob(text: str) -> bytes:
    return text.encode() + b"\x00\xff\\'\x1a"


async def hostile_table(db: af.Database, tables: Tables) -> tuple[af.Identifier, af.Identifier]:
    """A table for payloads, and a sentinel table that must survive them."""
    table, sentinel = tables.new(), tables.new("sentinel")
    columns = {
        "postgresql": "id bigserial PRIMARY KEY, v text, b bytea",
        "mysql": "id bigint AUTO_INCREMENT PRIMARY KEY, v longtext, b longblob",
        "sqlite": "id integer PRIMARY KEY, v text, b blob",
    }[db.name]
    suffix = " DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin" if db.name == "mysql" else ""
    await db.execute(af.sql("CREATE TABLE {t} (" + columns + ")" + suffix, t=table))
    await db.execute(af.sql("CREATE TABLE {t} (a int)", t=sentinel))
    return table, sentinel


async def assert_stored_exactly(
    db: af.Database, table: af.Identifier, sentinel: af.Identifier, texts: list[str]
) -> None:
    rows = await db.fetch(af.sql("SELECT v, b FROM {t} ORDER BY id", t=table))
    assert [row["v"] for row in rows] == texts
    assert [bytes(row["b"]) for row in rows] == [blob(text) for text in texts]
    assert await db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=sentinel)) == 0


SESSION_MODES = {"mysql": ["", "NO_BACKSLASH_ESCAPES"]}


async def test_hostile_values_are_stored_exactly_whatever_the_sql_mode(
    db: af.Database, tables: Tables
) -> None:
    """Quotes, backslashes, NUL, ``\\x1a``, multi-byte characters and SQL
    payloads in text and binary values are stored exactly and never run, also
    under MySQL's NO_BACKSLASH_ESCAPES (set in the transaction that binds)."""
    table, sentinel = await hostile_table(db, tables)
    texts = payloads(db, sentinel.parts[0])
    insert = "INSERT INTO {t} (v, b) VALUES ({v}, {b})"
    for mode in SESSION_MODES.get(db.name, [None]):
        async with db.transaction() as tx:
            if mode is not None:
                await tx.execute(
                    af.sql("SET SESSION sql_mode = {m}", m=f"STRICT_ALL_TABLES,{mode}")
                )
            for text in texts:
                await tx.execute(af.sql(insert, t=table, v=text, b=blob(text)))
                found = af.sql(
                    "SELECT COUNT(*) FROM {t} WHERE v = {v} AND b = {b}",
                    t=table,
                    v=text,
                    b=blob(text),
                )
                assert await tx.fetch_value(found) >= 1, (mode, text)
        await assert_stored_exactly(db, table, sentinel, texts)
        await db.execute(af.sql("DELETE FROM {t}", t=table))


async def test_mysql_values_do_not_depend_on_a_mode_set_in_the_same_text(
    db: af.Database, tables: Tables
) -> None:
    """MySQL: a raw text that switches to NO_BACKSLASH_ESCAPES before the
    statement holding the values (one multi-statement text) still stores
    them exactly: literals do not depend on the session's backslash mode."""
    if db.name != "mysql":
        pytest.skip("multi-statement texts and sql_mode are MySQL's")
    table, sentinel = await hostile_table(db, tables)
    texts = payloads(db, sentinel.parts[0])
    for text in texts:
        async with db.transaction() as tx:
            await tx.execute(
                af.sql(
                    "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_BACKSLASH_ESCAPES'; "
                    "INSERT INTO {t} (v, b) VALUES ({v}, {b})",
                    t=table,
                    v=text,
                    b=blob(text),
                )
            )
    await assert_stored_exactly(db, table, sentinel, texts)


async def test_hostile_values_through_units_are_stored_exactly(
    solo: af.Database, namespaces: Namespaces, tables: Tables
) -> None:
    """The same payloads through units of work, on a connection whose
    previous user switched MySQL to NO_BACKSLASH_ESCAPES."""
    namespace = await migrated(solo, namespaces)
    sentinel = tables.new("sentinel")
    await solo.execute(af.sql("CREATE TABLE {t} (a int)", t=sentinel))
    texts = payloads(solo, sentinel.parts[0])
    if solo.name == "mysql":
        await solo.execute(af.sql("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'"))
    ids = [
        await create_note(solo, namespace, label=text[:200], body=text, blob=blob(text))
        for text in texts
    ]

    async def read(uow: af.UnitOfWork) -> list[Any]:
        op = uow.find("notes")
        await uow.retrieve()
        by_id = {str(row["id"]): row for row in op.result}
        return [by_id[str(row_id)] for row_id in ids]

    rows = await solo.execute_uow(read, schema=NOTES, namespace=namespace)
    assert [(r["label"], r["body"], bytes(r["blob"])) for r in rows] == [
        (text[:200], text, blob(text)) for text in texts
    ]
    assert await solo.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=sentinel)) == 0


class Shady:
    def __str__(self) -> str:
        return "'); DROP TABLE x; -- "


NOT_ONE_VALUE = [("a", "b"), ["a"], {"a"}, frozenset({"a"}), Shady(), object()]


@pytest.mark.parametrize("value", NOT_ONE_VALUE, ids=lambda v: type(v).__name__)
async def test_values_that_are_not_one_value_are_refused_before_anything_runs(
    db: af.Database, tables: Tables, value: Any
) -> None:
    """Outside ``IN``, a list, tuple or set is one value only where the
    database has arrays (PostgreSQL); elsewhere it, like an object of a type
    the database cannot bind, is a ValidationError when the query is
    compiled — never text the driver escapes on its own."""
    sentinel = tables.new("sentinel")
    await db.execute(af.sql("CREATE TABLE {t} (a int)", t=sentinel))
    query = af.sql("SELECT {v}", v=value)
    if db.name == "postgresql":
        if isinstance(value, tuple | list | set | frozenset):
            return  # arrays: see test_raw_sql
        with pytest.raises(af.ValidationError):
            await db.fetch_value(af.sql("SELECT CAST({v} AS text)", v=value))
    else:
        with pytest.raises(af.ValidationError):
            db.compile(query)
        with pytest.raises(af.ValidationError):
            db.compile(af.sql("SELECT 1 WHERE 'a' IN {v}", v=[value]))
        async with db.transaction() as tx:
            if db.name == "mysql":
                await tx.execute(af.sql("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'"))
            with pytest.raises(af.ValidationError):
                await tx.fetch_value(query)
    assert await db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=sentinel)) == 0


async def test_the_tuple_injection_of_the_report_cannot_run(
    db: af.Database, tables: Tables
) -> None:
    """The reported exploit: a tuple outside IN under NO_BACKSLASH_ESCAPES,
    escaped by the driver with backslashes, ran ``DROP TABLE``."""
    sentinel = tables.new("sentinel")
    await db.execute(af.sql("CREATE TABLE {t} (a int)", t=sentinel))
    payload = f"\\'); DROP TABLE {sentinel.parts[0]}; -- "
    async with db.transaction() as tx:
        if db.name == "mysql":
            await tx.execute(af.sql("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'"))
        with pytest.raises(af.Error):
            await tx.fetch(af.sql("SELECT 1 WHERE 'x' = {v}", v=(payload,)))
    assert await db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=sentinel)) == 0
