"""Session state on pooled connections, and values bound whatever the session.

A raw statement can change its connection's session (open a transaction,
change settings, take session locks, create temporary objects); the pool
must never hand that state to the next caller. Every test here uses a pool of
one connection, so the next caller really gets the same connection. And a
value aiofragno binds must be stored exactly, never run as SQL, whatever the
session's sql_mode (MySQL binds values as literals in the statement text).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiofragno as af
from aiofragno.outbox.tables import OUTBOX
from tests.conformance.conftest import Tables
from tests.conformance.namespaces import Namespaces, new_namespace
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


BEGIN_STATEMENTS = {
    "postgresql": ["BEGIN", "START TRANSACTION", "BEGIN ISOLATION LEVEL SERIALIZABLE"],
    "mysql": ["BEGIN", "START TRANSACTION", "SET autocommit = 0", "SET SESSION autocommit = OFF"],
    "sqlite": ["BEGIN", "BEGIN IMMEDIATE", "BEGIN EXCLUSIVE"],
}


async def test_a_raw_begin_outside_a_transaction_is_refused_and_later_writes_commit(
    solo: af.Database, db: af.Database, namespaces: Namespaces
) -> None:
    """A raw statement that leaves its connection in a transaction (BEGIN,
    MySQL's autocommit off) is refused with the transaction rolled back:
    units and raw writes on that connection afterwards commit for real (a
    second Database sees them)."""
    namespace = await migrated(solo, namespaces)
    for n, statement in enumerate(BEGIN_STATEMENTS[solo.name]):
        with pytest.raises(af.ProgrammingError, match=r"db\.transaction\(\)"):
            await solo.execute(af.sql(statement))
        await create_note(solo, namespace, label=f"unit{n}")
        physical = solo.layout(NOTES, namespace).table("notes").identifier
        await solo.execute(
            af.sql(
                "UPDATE {t} SET {b} = {v} WHERE {l} = {u}",
                t=physical,
                b=af.Identifier("body"),
                v=statement,
                l=af.Identifier("label"),
                u=f"unit{n}",
            )
        )
        assert await labels(db, namespace) == sorted(f"unit{i}" for i in range(n + 1))
        bodies = await db.fetch(
            af.sql(
                "SELECT {b} AS b FROM {t} WHERE {b} IS NOT NULL",
                t=physical,
                b=af.Identifier("body"),
            )
        )
        assert len(bodies) == n + 1


async def test_autocommit_off_inside_a_transaction_is_not_left_behind(
    solo: af.Database, db: af.Database, namespaces: Namespaces
) -> None:
    """MySQL: ``SET autocommit = 0`` inside ``db.transaction()`` outlives its
    COMMIT; the next caller's raw writes must still commit."""
    if solo.name != "mysql":
        pytest.skip("autocommit is a MySQL session variable")
    namespace = await migrated(solo, namespaces)
    async with solo.transaction() as tx:
        await tx.execute(af.sql("SET autocommit = 0"))
    await create_note(solo, namespace, label="after")
    physical = solo.layout(NOTES, namespace).table("notes").identifier
    body = af.Identifier("body")
    await solo.execute(af.sql("UPDATE {t} SET {b} = 'raw'", t=physical, b=body))
    assert await labels(db, namespace) == ["after"]
    assert await db.fetch_value(af.sql("SELECT {b} FROM {t}", t=physical, b=body)) == "raw"


# Per dialect: (statement changing the session, probe reading the state back).
# The probe's value before the change is what the next caller must see.
SETTINGS = {
    "postgresql": [
        ("SET search_path = pg_catalog", "SELECT current_setting('search_path')"),
        ("SET TimeZone = 'Asia/Tokyo'", "SELECT current_setting('TimeZone')"),
        (
            "SELECT set_config('TimeZone', 'America/Lima', false)",
            "SELECT current_setting('TimeZone')",
        ),
        # (Long enough never to fire: 1ms cancelled the probe itself under load.)
        ("SET statement_timeout = '16min'", "SELECT current_setting('statement_timeout')"),
        ("SET application_name = 'someone'", "SELECT current_setting('application_name')"),
        (
            "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
            "SELECT current_setting('default_transaction_isolation')",
        ),
        ("SET ROLE pg_read_all_data", "SELECT current_user"),
        (
            "CREATE TEMP TABLE stray (a int)",
            "SELECT count(*) FROM pg_tables WHERE tablename = 'stray'",
        ),
        ("PREPARE stray AS SELECT 1", "SELECT count(*) FROM pg_prepared_statements WHERE from_sql"),
        ("LISTEN stray", "SELECT count(*) FROM pg_listening_channels()"),
        ("DECLARE stray CURSOR WITH HOLD FOR SELECT 1", "SELECT count(*) FROM pg_cursors"),
    ],
    "mysql": [
        ("SET sql_mode = ''", "SELECT @@SESSION.sql_mode"),
        ("SET SESSION sql_mode = 'NO_BACKSLASH_ESCAPES'", "SELECT @@SESSION.sql_mode"),
        ("SET NAMES latin1", "SELECT @@SESSION.character_set_client"),
        ("SET time_zone = '+05:00'", "SELECT @@SESSION.time_zone"),
        ("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SELECT @@SESSION.tx_isolation"),
        ("USE information_schema", "SELECT DATABASE()"),
        ("SET @stray = 1", "SELECT @stray"),
        ("SELECT @stray := 2", "SELECT @stray"),
        ("SELECT 3 INTO @stray", "SELECT @stray"),
        ("CREATE TEMPORARY TABLE stray (a int)", "SELECT COUNT(*) FROM stray"),
    ],
    "sqlite": [
        ("PRAGMA foreign_keys = OFF", "SELECT foreign_keys FROM pragma_foreign_keys"),
        ("PRAGMA ignore_check_constraints = ON", "SELECT * FROM pragma_ignore_check_constraints"),
        ("PRAGMA case_sensitive_like = OFF", "SELECT 'a' LIKE 'A'"),
        ("PRAGMA query_only = ON", "SELECT * FROM pragma_query_only"),
        ("CREATE TEMP TABLE stray (a int)", "SELECT COUNT(*) FROM temp.sqlite_master"),
        (
            "ATTACH ':memory:' AS stray",
            "SELECT COUNT(*) FROM pragma_database_list WHERE name = 'stray'",
        ),
    ],
}
# SQLite ignores these inside a transaction (or refuses them there).
OUTSIDE_ONLY = {"PRAGMA foreign_keys = OFF", "ATTACH ':memory:' AS stray"}
# These take effect when the transaction commits.
AT_COMMIT = {"LISTEN stray"}


# The server's id of the connection, where it has one: a reset keeps it.
CONNECTION_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


async def probe(db: af.Database, sql: str) -> Any:
    try:
        return await db.fetch_value(af.sql(sql))
    except af.ProgrammingError as exc:  # e.g. the temporary table is gone
        return type(exc).__name__


@pytest.mark.parametrize("inside", [False, True], ids=["alone", "in-transaction"])
async def test_session_settings_do_not_outlive_their_connection_use(
    solo: af.Database, inside: bool
) -> None:
    """A session change made by raw SQL lasts as long as the caller holds
    the connection — one statement, or one ``db.transaction()`` — and the
    next caller finds the session as it was after connect."""
    connection_id = CONNECTION_ID.get(solo.name, "SELECT NULL")
    first = await solo.fetch_value(af.sql(connection_id))
    for change, read in SETTINGS[solo.name]:
        if inside and change in OUTSIDE_ONLY:
            continue
        before = await probe(solo, read)
        if inside:
            async with solo.transaction() as tx:
                await tx.execute(af.sql(change))
                if change not in AT_COMMIT:
                    assert await tx.fetch_value(af.sql(read)) != before, change
        else:
            await solo.execute(af.sql(change))
        assert await probe(solo, read) == before, change
    assert await solo.fetch_value(af.sql(connection_id)) == first  # reset, not replaced
    assert solo.stats.session_resets >= len(SETTINGS[solo.name]) - len(OUTSIDE_ONLY)


async def test_statements_with_values_run_alike_after_a_session_reset(solo: af.Database) -> None:
    """A reset drops what the server session held, the driver's prepared
    statements included (MySQL runs each statement with values as one): the
    same statements run on the reset connection as before, every time."""
    connection_id = CONNECTION_ID.get(solo.name, "SELECT NULL")
    first = await solo.fetch_value(af.sql(connection_id))
    statements = [
        af.sql("SELECT {a} AS a", a="x"),
        af.sql("SELECT {a} AS a, {b} AS b", a="y", b="z"),
    ]
    expected = [{"a": "x"}, {"a": "y", "b": "z"}]
    resets = solo.stats.session_resets
    for change, _ in SETTINGS[solo.name]:
        for _ in range(2):
            assert [dict(await solo.fetch_one(s) or {}) for s in statements] == expected
        await solo.execute(af.sql(change))
    assert [dict(await solo.fetch_one(s) or {}) for s in statements] == expected
    assert solo.stats.session_resets - resets == len(SETTINGS[solo.name])
    assert await solo.fetch_value(af.sql(connection_id)) == first  # reset, not replaced


async def test_mysql_a_mode_set_in_a_transaction_applies_to_statements_prepared_before(
    solo: af.Database,
) -> None:
    """MySQL: a statement with values, prepared on the connection before a
    transaction changed the sql_mode, is parsed under the new mode there
    (as its text would be), and under aiofragno's again after the reset."""
    if solo.name != "mysql":
        pytest.skip("sql_mode and prepared statements are MySQL's")
    query = af.sql("SELECT CONCAT({a} || {b}) AS v", a="1", b="0")
    assert await solo.fetch_value(query) == "1"  # (|| is OR)
    async with solo.transaction() as tx:
        assert await tx.fetch_value(query) == "1"
        await tx.execute(af.sql("SET SESSION sql_mode = CONCAT(@@sql_mode, ',PIPES_AS_CONCAT')"))
        assert await tx.fetch_value(query) == "10"
    assert await solo.fetch_value(query) == "1"


async def test_plain_statements_and_units_do_not_reset_the_session(
    solo: af.Database, namespaces: Namespaces
) -> None:
    """The common path costs no reset: units, and raw reads and writes (also
    in a transaction with savepoints), leave the connection as it is."""
    namespace = await migrated(solo, namespaces)
    resets = solo.stats.session_resets
    physical = solo.layout(NOTES, namespace).table("notes").identifier
    label = af.Identifier("label")
    await create_note(solo, namespace, label="a")
    assert await labels(solo, namespace) == ["a"]
    await solo.fetch(af.sql("SELECT * FROM {t} WHERE {l} IN {v}", t=physical, l=label, v=["a"]))
    await solo.execute(af.sql("UPDATE {t} SET {l} = {v}", t=physical, l=label, v="b"))
    async with solo.transaction() as tx:
        if solo.name == "postgresql":  # (ends with the transaction)
            await tx.execute(af.sql("SET LOCAL statement_timeout = '5s'"))
        await tx.fetch(af.sql("SELECT COUNT(*) FROM {t}", t=physical))
        async with tx.transaction():
            await tx.execute(af.sql("DELETE FROM {t}", t=physical))
    await solo.now()
    assert solo.stats.session_resets == resets


async def test_session_locks_are_released_and_the_server_session_kept(
    solo: af.Database, db: af.Database
) -> None:
    """A session-level lock taken by raw SQL is released when the connection
    goes back to the pool; on MySQL the lock naming the server session (see
    ``server_session``) is held again, so ``end_session`` still finds it."""
    key = uuid.uuid4().int % 2**31
    if solo.name == "sqlite":
        pytest.skip("SQLite has no session-level locks")
    if solo.name == "postgresql":
        take = af.sql("SELECT pg_advisory_lock({k})", k=key)
        free = af.sql("SELECT pg_try_advisory_xact_lock({k})", k=key)
    else:
        name = f"stray-{key}"
        take = af.sql("SELECT GET_LOCK({n}, 0)", n=name)
        free = af.sql("SELECT IS_FREE_LOCK({n})", n=name)
    await solo.fetch_value(take)
    async with db.transaction() as tx:
        assert await tx.fetch_value(free) in (True, 1)
    if solo.name == "mysql":
        session = await solo._engine.acquire()
        try:
            server_session = session.connection.server_session
            thread = await session.execute(solo.compile(af.sql("SELECT CONNECTION_ID()")))
        finally:
            await solo._engine.release(session)
        holder = await db.fetch_value(af.sql("SELECT IS_USED_LOCK({s})", s=server_session))
        assert holder == next(iter(thread.rows[0].values()))


async def test_a_search_path_change_does_not_send_outbox_entries_elsewhere(
    url: str, target: Target, db: af.Database
) -> None:
    """PostgreSQL: the outbox tables are found through the session's
    search_path; a raw ``SET search_path`` must not send the next unit's
    entry into another schema's outbox."""
    if db.name != "postgresql":
        pytest.skip("search_path is PostgreSQL's")
    home, other = f"sp{uuid.uuid4().hex[:8]}", f"sp{uuid.uuid4().hex[:8]}"
    namespace = new_namespace()
    schemas = [home, other, *db.layout(NOTES, namespace).db_schemas]
    for name in (home, other):
        await db.execute(af.sql("CREATE SCHEMA {s}", s=af.Identifier(name)))
    try:
        options = {"backend": target.backend, "pool_size": 1, "outbox": True}
        async with af.connect(url, search_path=other, **options) as elsewhere:
            await elsewhere.migrate(NOTES, namespace=namespace)
        async with af.connect(url, search_path=home, **options) as solo:
            await solo.migrate(NOTES, namespace=namespace)
            for way in ("alone", "in-transaction"):
                change = af.sql("SET search_path = {s}", s=af.Identifier(other))
                if way == "alone":
                    await solo.execute(change)
                else:
                    async with solo.transaction() as tx:
                        await tx.execute(change)
                await create_note(solo, namespace, label=way)
        for name, expected in ((home, 2), (other, 0)):
            count = af.sql("SELECT COUNT(*) FROM {t}", t=af.Identifier(name, OUTBOX))
            assert await db.fetch_value(count) == expected, name
    finally:
        for name in schemas:
            await db.execute(af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name)))


async def test_mysql_strict_mode_and_charset_hold_for_the_next_caller(
    solo: af.Database, tables: Tables
) -> None:
    """MySQL: after ``SET sql_mode = ''`` or ``SET NAMES latin1`` by raw SQL,
    the next caller still gets strict mode (an oversize value is an error,
    not truncated) and utf8mb4 (multi-byte text stored exactly)."""
    if solo.name != "mysql":
        pytest.skip("sql_mode and SET NAMES are MySQL's")
    table = tables.new()
    await solo.execute(
        af.sql(
            "CREATE TABLE {t} (v varchar(3)) DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin", t=table
        )
    )
    for change in ("SET sql_mode = ''", "SET NAMES latin1"):
        await solo.execute(af.sql(change))
        with pytest.raises(af.DataError):
            await solo.execute(af.sql("INSERT INTO {t} VALUES ({v})", t=table, v="toolong"))
        await solo.execute(af.sql("INSERT INTO {t} VALUES ({v})", t=table, v="é€😀"))
        stored = await solo.fetch(af.sql("SELECT v FROM {t}", t=table))
        assert [row["v"] for row in stored] == ["é€😀"], change
        await solo.execute(af.sql("DELETE FROM {t}", t=table))


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
    if db._engine.adapter.storage.text_rejects_nul:
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
