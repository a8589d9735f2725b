"""Names on every backend and runtime: a name or default holding placeholder
or quote characters is stored and used exactly as declared; every physical
table belongs to one namespace's table (collisions, someone else's table,
system schemas and aiofragno's own tables are refused); and a migration never
waits for ever for a lock."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.migration_lock import MIGRATION_LOCK_KEY
from aiofragno.sql import sql_using
from tests.conformance.namespaces import (
    SETTINGS,
    Namespaces,
    column_names,
    new_namespace,
    setting,
    table_count,
)
from tests.conftest import Target

pytestmark = pytest.mark.anyio


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


async def rows_of(db: af.Database, schema: af.Schema, ns: str, table: str) -> list[dict[str, Any]]:
    async def fn(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find(table, order_by="v")
        await uow.retrieve()
        return list(op.result)

    return await db.execute_uow(fn, schema=schema, namespace=ns)


# -- names and defaults are text ----------------------------------------------

# Everything a later step could take for a placeholder (MySQL's driver
# formats with %, PostgreSQL statements are renumbered when joined) or for
# the end of a quoted name or literal.
HOSTILE = "%s %% $1 ? :a ' \" ` \\"
DEFAULTS = [
    "100%",
    "100%%",
    "%s",
    "%(a)s",
    "$1",
    "?",
    ":a",
    "it's",
    "a\\b",
    "\\'; --",
    '"`',
    HOSTILE,
]


class HostileNaming:
    """Physical names full of that text. Tables ``one`` and ``three`` differ
    only in ``$1`` / ``$3``: renumbering a statement on ``one`` by two
    parameters without skipping quoted names would make it one on ``three``."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        marker = "$1" if table == "one" else "$3"
        return None, f"{namespace}_t{marker} {HOSTILE.replace('$1 ', '')}"

    def index(self, namespace: str, table: str, index: str) -> str:
        return f"ix_{namespace}_{table}_{index} {HOSTILE}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk_{namespace}_{table}_{column} {HOSTILE}"


def hostile_schema(*, with_defaults: bool) -> af.Schema:
    defaults = [
        af.Column(f"d{i}", "string", default=value)
        for i, value in enumerate(DEFAULTS)
        if with_defaults
    ]
    return af.Schema(
        "hostile",
        af.Table("one", af.Column("v", "string"), af.Index("by_v", ["v"], unique=True), *defaults),
        af.Table(
            "three",
            af.Column("v", "string"),
            af.Reference("one", "one", nullable=True),
            af.Index("by_v", ["v"], unique=True),
            *defaults,
        ),
    )


async def test_names_defaults_and_values_holding_placeholder_text_are_kept_exactly(
    db: af.Database, url: str, target: Target, spaces: Namespaces
) -> None:
    v1, v2 = hostile_schema(with_defaults=False), hostile_schema(with_defaults=True)
    async with af.connect(url, backend=target.backend, naming=HostileNaming()) as custom:
        layout = spaces.use(custom, v1)
        ns = layout.namespace
        await custom.migrate(v1, namespace=ns)
        # Every name was created as declared: nothing is left to do.
        assert await custom.migration_sql(v1, namespace=ns) == []
        for name in ("one", "three"):
            assert await table_count(db, layout.table(name)) == 1

        async def write(uow: af.UnitOfWork) -> tuple[af.RowId, af.RowId]:
            # (On PostgreSQL one statement: "one"'s part is renumbered.)
            three = uow.create("three", {"v": f"three {HOSTILE}"})
            return three, uow.create("one", {"v": f"one {HOSTILE}"})

        three, one = await custom.execute_uow(write, schema=v1, namespace=ns)

        async def read(uow: af.UnitOfWork) -> tuple[list[Any], list[Any]]:
            # (On PostgreSQL one statement too, with parameters to renumber.)
            a = uow.find("three", where=af.c.v != HOSTILE)
            b = uow.find("one", where=af.c.v != HOSTILE)
            await uow.retrieve()
            return list(a.result), list(b.result)

        threes, ones = await custom.execute_uow(read, schema=v1, namespace=ns)
        assert [(r["id"], r["v"]) for r in threes] == [(three, f"three {HOSTILE}")]
        assert [(r["id"], r["v"]) for r in ones] == [(one, f"one {HOSTILE}")]

        # Columns added to rows that exist take the declared defaults, exactly.
        await custom.migrate(v2, namespace=ns)
        assert await custom.migration_sql(v2, namespace=ns) == []
        expected = {f"d{i}": value for i, value in enumerate(DEFAULTS)}
        for table in ("one", "three"):
            [row] = await rows_of(custom, v2, ns, table)
            assert {k: row[k] for k in expected} == expected
        # So does a row inserted without them, in raw SQL.
        await custom.execute(
            af.sql(
                "INSERT INTO {t} ({id}, {v}) VALUES ({i}, {value})",
                t=layout.table("one").identifier,
                id=af.Identifier("id"),
                v=af.Identifier("v"),
                i="raw-row",
                value=HOSTILE,
            )
        )
        raw = [r for r in await rows_of(custom, v2, ns, "one") if r["id"] == "raw-row"]
        assert [{k: r[k] for k in expected} for r in raw] == [expected]

        async def link(uow: af.UnitOfWork) -> None:
            uow.update("three", three, {"one": one})

        await custom.execute_uow(link, schema=v2, namespace=ns)
        [row] = await rows_of(custom, v2, ns, "three")
        assert row["one"] == one


RAW_NAMES = ["rate_%", "rate_%%", "r%s", "r%(a)s", "r$1", "r?", "r:a", "r'q", 'r"q', "r`q", "r\\q"]


async def test_raw_names_and_literals_reach_the_database_as_written(db: af.Database) -> None:
    made: list[af.Identifier] = []
    try:
        for text in RAW_NAMES:
            table = af.Identifier(f"{text}_{new_namespace()}")
            made.append(table)
            column = af.Identifier(f"c_{text}")
            await db.execute(af.sql("CREATE TABLE {t} ({c} integer)", t=table, c=column))
            await db.execute(af.sql("INSERT INTO {t} ({c}) VALUES (7)", t=table, c=column))
            assert await catalog_tables(db, table.parts[0]) == [table.parts[0]], text
            assert await db.fetch_value(af.sql("SELECT {c} FROM {t}", t=table, c=column)) == 7
            # (A backslash in a literal of one's own SQL means what the
            # database says: an escape on MySQL.)
            literal = text.replace("'", "''").replace("\\", "")
            row = await db.fetch_one(af.sql(f"SELECT '{literal}' AS a, {{v}} AS b", v=text))
            assert row is not None
            assert (row["a"], row["b"]) == (literal.replace("''", "'"), text)
    finally:
        for table in made:
            await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=table))


async def catalog_tables(db: af.Database, name: str) -> list[str]:
    """The tables of the current schema named exactly ``name`` (by the catalog)."""
    if db.name == "sqlite":
        query = af.sql("SELECT name FROM sqlite_master WHERE type = 'table' AND name = {n}", n=name)
    else:
        current = "current_schema()" if db.name == "postgresql" else "DATABASE()"
        query = af.sql(
            "SELECT table_name AS name FROM information_schema.tables "
            f"WHERE table_schema = {current} AND table_name = {{n}}",
            n=name,
        )
    # (MySQL's catalog compares names ignoring case: compare here.)
    return [row["name"] for row in await db.fetch(query) if row["name"] == name]


# -- every physical table is one namespace's table ----------------------------


def colliding() -> tuple[af.Schema, str, af.Schema, str]:
    """Two declarations that suffix naming makes one table: ``orders`` in
    namespace ``eu_<u>`` and ``orders_eu`` in ``<u>`` are ``orders_eu_<u>``."""
    u = new_namespace()
    first = af.Schema("first", af.Table("orders", af.Column("amount", "bigint")))
    second = af.Schema("second", af.Table("orders_eu", af.Column("note", "string", nullable=True)))
    return first, f"eu_{u}", second, u


async def test_tables_that_collide_are_refused_in_one_process(
    url: str, target: Target, spaces: Namespaces
) -> None:
    first, first_ns, second, second_ns = colliding()
    async with af.connect(url, backend=target.backend, naming="suffix") as db:
        spaces.use(db, first, first_ns)

        async def fn(uow: af.UnitOfWork) -> None:
            uow.find("orders_eu")
            await uow.retrieve()

        message = rf"'orders_eu' of namespace '{second_ns}'.*'orders' of namespace '{first_ns}'"
        with pytest.raises(af.SchemaError, match=message):
            db.layout(second, second_ns)
        # Units and migrations of that layout are refused alike, before any SQL.
        with pytest.raises(af.SchemaError, match=message):
            await db.execute_uow(fn, schema=second, namespace=second_ns)
        with pytest.raises(af.SchemaError, match=message):
            await db.migrate(second, namespace=second_ns)


async def test_migrate_refuses_a_table_another_namespace_migrated(
    url: str, target: Target, spaces: Namespaces
) -> None:
    first, first_ns, second, second_ns = colliding()
    async with (
        af.connect(url, backend=target.backend, naming="suffix") as one,
        af.connect(url, backend=target.backend, naming="suffix") as other,
    ):
        mine = spaces.use(one, first, first_ns).table("orders")
        theirs = spaces.use(other, second, second_ns).table("orders_eu")
        assert mine.identifier == theirs.identifier
        await one.migrate(first, namespace=first_ns)
        before = await column_names(one, mine)
        with pytest.raises(af.MigrationError) as info:
            await other.migrate(second, namespace=second_ns)
        message = str(info.value)
        for part in (
            f"'orders_eu' of namespace '{second_ns}'",
            f"'orders' of namespace '{first_ns}'",
        ):
            assert part in message
        assert mine.name in message
        # Nothing was changed or recorded for the refused namespace.
        assert await column_names(one, mine) == before
        assert await setting(one, f"{second_ns}.schema_version") == []
        with pytest.raises(af.MigrationError):
            await other.migration_sql(second, namespace=second_ns)


async def test_migrate_leaves_a_table_that_is_not_aiofragnos_alone(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = af.Schema("s", af.Table("things", af.Column("x", "string", nullable=True)))
    layout = spaces.use(db, schema)
    physical = layout.table("things")
    if physical.schema is not None:
        await db.execute(af.sql("CREATE SCHEMA {s}", s=af.Identifier(physical.schema)))
    await db.execute(
        af.sql("CREATE TABLE {t} ({c} integer)", t=physical.identifier, c=af.Identifier("legacy"))
    )
    for attempt in (db.migration_sql, db.migrate):
        with pytest.raises(af.MigrationError) as info:
            await attempt(schema, namespace=layout.namespace)
        message = str(info.value)
        assert "not an aiofragno table" in message
        assert f"'things' of namespace '{layout.namespace}'" in message
        assert str(physical) in message
    assert await column_names(db, physical) == {"legacy"}
    assert await setting(db, f"{layout.namespace}.schema_version") == []


async def test_tables_migrated_before_ownership_was_recorded_are_adopted(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = af.Schema("s", af.Table("things", af.Column("v", "string")))
    ns = spaces.use(db, schema).namespace
    key = f"{ns}.table:things"
    await db.migrate(schema, namespace=ns)
    [record] = await setting(db, key)
    assert {k: json.loads(record)[k] for k in ("namespace", "table")} == {
        "namespace": ns,
        "table": "things",
    }

    async def fn(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("things", {"v": "kept"})

    row_id = await db.execute_uow(fn, schema=schema, namespace=ns)
    # As a version without ownership records left the database:
    await db.execute(
        af.sql("DELETE FROM {t} WHERE {k} = {key}", t=SETTINGS, k=af.Identifier("key"), key=key)
    )
    result = await db.migrate(schema, namespace=ns)
    assert not result.changed
    assert await setting(db, key) == [record]
    assert [r["id"] for r in await rows_of(db, schema, ns, "things")] == [row_id]


SYSTEM_SCHEMAS = [
    "information_schema",
    "PG_CATALOG",
    "pg_toast",
    "mysql",
    "performance_schema",
    "sys",
]


async def test_system_schemas_are_no_namespaces(db: af.Database) -> None:
    async def fn(uow: af.UnitOfWork) -> None:
        uow.find("t")
        await uow.retrieve()

    schema = af.Schema("s", af.Table("t", af.Column("v", "string")))
    for name in SYSTEM_SCHEMAS:
        with pytest.raises(af.ValidationError, match=f"'{name}' is reserved"):
            db.layout(schema, name)
        with pytest.raises(af.ValidationError, match=f"'{name}' is reserved"):
            await db.migrate(schema, namespace=name)
        with pytest.raises(af.ValidationError, match=f"'{name}' is reserved"):
            await db.execute_uow(fn, schema=schema, namespace=name)
    # A schema's name is its namespace by default.
    with pytest.raises(af.ValidationError, match="'mysql' is reserved"):
        await db.migrate(af.Schema("mysql", af.Table("t")))


async def test_a_namespace_ending_in_a_newline_is_refused(db: af.Database) -> None:
    with pytest.raises(af.SchemaError, match="bad namespace name"):
        db.layout(af.Schema("s", af.Table("t")), "shop\n")


async def test_aiofragnos_own_tables_are_no_declared_tables(
    db: af.Database, url: str, target: Target
) -> None:
    schema = af.Schema("s", af.Table("fragno_db"))
    async with af.connect(url, backend=target.backend, naming="suffix") as suffixed:
        for ns in ("settings", "outbox"):
            with pytest.raises(af.SchemaError, match=f"'fragno_db_{ns}', which is aiofragno's own"):
                suffixed.layout(schema, ns)
    if db.name != "postgresql":
        return
    # Namespace "public" is the default schema: its table fragno_db_settings
    # would be the settings table (found by migrate, which resolves the schema).
    own = af.Schema("s", af.Table("fragno_db_settings"))
    async with af.connect(url, backend=target.backend, naming="schema") as schemas:
        with pytest.raises(af.MigrationError, match="which is aiofragno's own"):
            await schemas.migrate(own, namespace="public")
    assert await setting(db, "public.schema_version") == []


# -- a migration never waits for ever for a lock ------------------------------


async def test_migrate_gives_up_when_another_migration_holds_the_lock(
    db: af.Database, spaces: Namespaces
) -> None:
    spec = db._engine.adapter.ddl
    if spec.migration_lock_sql is None:
        pytest.skip("SQLite's migration lock is its write lock, bounded by busy_timeout")
    schema = af.Schema("s", af.Table("t", af.Column("v", "string")))
    layout = spaces.use(db, schema)
    hold = sql_using(spec.migration_lock_sql, key=MIGRATION_LOCK_KEY, seconds=30)
    async with db.transaction() as tx:
        # Another migrator: it holds the lock until its transaction (PostgreSQL)
        # or its release (MySQL) ends.
        assert (await tx.fetch_one(hold) or {}).get("taken") in (1, True)
        try:
            started = time.monotonic()
            with anyio.fail_after(30), pytest.raises(af.MigrationError) as info:
                await db.migrate(schema, namespace=layout.namespace, lock_timeout=0.5)
            waited = time.monotonic() - started
        finally:
            if spec.migration_unlock_sql:
                await tx.execute(sql_using(spec.migration_unlock_sql, key=MIGRATION_LOCK_KEY))
    assert "another migration holds the migration lock" in str(info.value)
    assert "lock_timeout=0.5" in str(info.value)
    assert 0.4 <= waited < 10
    assert await table_count(db, layout.table("t")) == 0
    # Once it is free, the migration runs.
    assert (await db.migrate(schema, namespace=layout.namespace, lock_timeout=0.5)).changed


async def test_migrate_gives_up_on_a_table_a_transaction_holds(
    db: af.Database, url: str, target: Target, spaces: Namespaces
) -> None:
    """DDL queued behind a long transaction's table lock would hold up every
    statement on that table: a migration waits for it ``lock_timeout`` at most."""
    if db.name == "sqlite":
        pytest.skip("SQLite's DDL takes the write lock, bounded by busy_timeout")
    v1 = af.Schema("s", af.Table("t", af.Column("a", "string", nullable=True)))
    v2 = af.Schema(
        "s",
        af.Table("t", af.Column("a", "string", nullable=True), af.Column("b", "bigint", default=0)),
    )
    layout = spaces.use(db, v1)
    physical = layout.table("t")
    await db.migrate(v1, namespace=layout.namespace)
    # One connection, so the check below sees the migration's own session.
    async with af.connect(url, backend=target.backend, pool_size=1) as migrator:
        async with db.transaction() as tx:
            await tx.fetch(af.sql("SELECT * FROM {t}", t=physical.identifier))
            with anyio.fail_after(30), pytest.raises(af.MigrationError) as info:
                await migrator.migrate(v2, namespace=layout.namespace, lock_timeout=1)
        assert "waited lock_timeout=1 s for a lock" in str(info.value)
        assert "b" not in await column_names(db, physical)
        if db.name == "mysql":
            # The session's lock wait is back to what new connections have.
            restored = "SELECT @@SESSION.lock_wait_timeout = @@GLOBAL.lock_wait_timeout AS same"
            assert await migrator.fetch_value(migrator._engine.raw(restored)) == 1
        await migrator.migrate(v2, namespace=layout.namespace, lock_timeout=1)
    assert "b" in await column_names(db, physical)
