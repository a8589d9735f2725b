"""Introspection and drift on every backend and runtime: what ``db.inspect``
reads back for a migrated schema, every kind of difference ``migrate()``
refuses (with nothing changed) or reports and leaves, internal columns
healed with rows present, and a table that is not aiofragno's adopted only
when asked to."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

import aiofragno as af
from aiofragno.introspection import LiveSchema
from aiofragno.naming import Layout, PhysicalTable
from aiofragno.schema_diff import (
    DefaultChanged,
    IndexChanged,
    MissingInternalColumn,
    NullabilityChanged,
    ReferenceChanged,
    RemovedColumn,
    RemovedIndex,
    TypeChanged,
)
from tests.conformance.namespaces import Namespaces, column_names, setting, table_count

pytestmark = pytest.mark.anyio

UTC = dt.UTC


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


def every_type() -> af.Schema:
    """Every column type, with and without defaults, nullable or not, with
    indexes and references."""
    return af.Schema(
        "every",
        af.Table(
            "owners",
            af.Column("name", "string"),
            af.Column("bio", "text", nullable=True),
            af.Column("code", af.varchar(12), default="it's \\ so"),
            af.Column("small", "integer", default=-1),
            af.Column("big", "bigint", default=2**62),
            af.Column("rate", "decimal", default=Decimal("0.25")),
            af.Column("active", "bool", default=True),
            af.Column("off", "bool", default=False),
            af.Column("prefs", "json", default={"theme": "it's dark"}),
            af.Column("avatar", "binary", default=b"\x89PNG\x00'"),
            af.Column("born", "date", default=dt.date(2000, 2, 29)),
            af.Column("since", "timestamp", default=dt.datetime(2024, 2, 29, 12, tzinfo=UTC)),
            af.Column("seen", "timestamp", nullable=True),
            af.Column("tiny", "smallint", default=-7),
            af.Column("ratio", "float", default=0.5),
            af.Column("key", "uuid", nullable=True),
            af.Column("mood", af.enum("calm", "it's odd"), default="calm"),
            af.Column("wake", "time", default=dt.time(6, 30, 0, 250)),
            af.Index("by_name", ["name"]),
            af.Index("by_code", ["code", "name"], unique=True),
        ),
        af.Table(
            "pets",
            af.Reference("owner", "owners"),
            af.Reference("vet", "owners", nullable=True),
            af.Column("name", "string"),
            af.Index("by_owner", ["owner", "name"], unique=True),
        ),
    )


async def run(db: af.Database, schema: af.Schema, ns: str, fn: Any) -> Any:
    return await db.execute_uow(fn, schema=schema, namespace=ns)


async def rows_of(db: af.Database, schema: af.Schema, ns: str, table: str) -> list[dict[str, Any]]:
    async def fn(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find(table)
        await uow.retrieve()
        return list(op.result)

    return await run(db, schema, ns, fn)


async def execute(db: af.Database, template: str, **names: Any) -> None:
    await db.execute(af.sql(template, **names))


# -- introspection ------------------------------------------------------------


async def test_a_migrated_schema_inspects_back_exactly_and_shows_no_drift(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = every_type()
    layout = spaces.use(db, schema)
    ns = layout.namespace
    await db.migrate(schema, namespace=ns)
    again = await db.migrate(schema, namespace=ns)
    assert (again.statements, again.differences) == ([], [])

    live = await db.inspect(namespace=ns)
    assert isinstance(live, LiveSchema) and live.namespace == ns
    assert sorted(t.table or "" for t in live.tables) == ["owners", "pets"]
    for table in schema.tables.values():
        found = live.table(table.name)
        assert found is not None and found.name == layout.table(table.name).name
        assert [c.name for c in found.columns] == ["_id", "id", "_version", *table.columns]
        for column in table.columns.values():
            have = found.column(column.name)
            assert have is not None
            expected = "bigint" if isinstance(column, af.Reference) else column.type_name
            assert expected in have.types or column.kind in have.types, (column.name, have)
            assert have.nullable == column.nullable or column.kind == "binary", column.name
        for index in table.indexes.values():
            [have_index] = [
                i for i in found.indexes if i.name == layout.index_name(table.name, index.name)
            ]
            assert (have_index.columns, have_index.unique) == (index.columns, index.unique)
        assert any(i.columns == ("id",) and i.unique for i in found.indexes)
    owners = live.table("owners")
    assert owners is not None and owners.column("small") is not None
    assert owners.column("bio").default is None  # type: ignore[union-attr]
    assert owners.column("small").default is not None  # type: ignore[union-attr]
    pets = live.table("pets")
    assert pets is not None
    targets = {ref.columns: (ref.to_table.lower(), ref.to_columns) for ref in pets.references}
    owner_table = layout.table("owners").name.lower()
    assert targets == {("owner",): (owner_table, ("_id",)), ("vet",): (owner_table, ("_id",))}

    # Without a namespace: every table of the default schema, by its own name.
    everything = await db.inspect()
    assert everything.table("fragno_db_settings") is not None
    if layout.table("owners").schema is None:
        assert everything.table(layout.table("owners").name) is not None
    assert (await db.inspect(namespace="never_migrated")).tables == ()


async def test_arrays_show_no_drift(db: af.Database, spaces: Namespaces) -> None:
    """PostgreSQL's array columns (the only backend with them) read back as
    declared: a second migrate finds nothing to do."""
    if db.name != "postgresql":
        pytest.skip("array columns are PostgreSQL's")
    schema = af.Schema(
        "arrays",
        af.Table(
            "tags",
            af.Column("names", af.array("string")),
            af.Column("scores", af.array("bigint"), nullable=True),
            af.Column("days", af.array("date"), nullable=True),
        ),
    )
    ns = spaces.use(db, schema).namespace
    await db.migrate(schema, namespace=ns)
    again = await db.migrate(schema, namespace=ns)
    assert (again.statements, again.differences) == ([], [])


async def test_inspect_reads_tables_aiofragno_did_not_make(db: af.Database) -> None:
    suffix = uuid.uuid4().hex[:8]
    parent, child = af.Identifier(f"ip_{suffix}"), af.Identifier(f"ic_{suffix}")
    await execute(
        db,
        "CREATE TABLE {p} (a integer NOT NULL, b varchar(10) NOT NULL DEFAULT 'x', "
        "PRIMARY KEY (a, b))",
        p=parent,
    )
    try:
        await execute(
            db,
            "CREATE TABLE {c} (x integer, y varchar(10), n bigint, "
            "CONSTRAINT {k} FOREIGN KEY (x, y) REFERENCES {p} (a, b))",
            c=child,
            p=parent,
            k=af.Identifier(f"k_{suffix}"),
        )
        await execute(
            db, "CREATE UNIQUE INDEX {i} ON {c} (n, x)", i=af.Identifier(f"u_{suffix}"), c=child
        )
        live = await db.inspect()
        found_parent, found_child = live.table(f"ip_{suffix}"), live.table(f"ic_{suffix}")
        assert found_parent is not None and found_child is not None
        assert [(c.name, c.nullable) for c in found_parent.columns] == [("a", False), ("b", False)]
        b = found_parent.column("b")
        assert b is not None and "varchar(10)" in b.types and "x" in (b.default or "")
        assert any(i.primary and set(i.columns) == {"a", "b"} for i in found_parent.indexes)
        [unique] = [i for i in found_child.indexes if i.name == f"u_{suffix}"]
        assert (unique.columns, unique.unique, unique.primary) == (("n", "x"), True, False)
        [ref] = found_child.references
        assert (ref.columns, ref.to_table, ref.to_columns) == (
            ("x", "y"),
            f"ip_{suffix}",
            ("a", "b"),
        )
        n = found_child.column("n")
        # (SQLite keeps the type as written; MariaDB writes a display width.)
        assert n is not None and n.sql_type.startswith("bigint") and n.nullable
    finally:
        await execute(db, "DROP TABLE IF EXISTS {c}", c=child)
        await execute(db, "DROP TABLE IF EXISTS {p}", p=parent)


# -- drift ----------------------------------------------------------------------


def _v1() -> af.Schema:
    return af.Schema(
        "app",
        af.Table(
            "accounts",
            af.Column("owner", "string"),
            af.Column("balance", "bigint", default=0),
            af.Column("note", "string", nullable=True),
            af.Column("code", "string", default="x"),
            af.Column("legacy", "string"),
            af.Column("spare", "string", nullable=True),
            af.Column("hint", "string", default="h"),
            af.Index("by_owner", ["owner"]),
            af.Index("by_code", ["code"], unique=True),
            af.Index("by_note", ["note"]),
            af.Index("by_legacy", ["legacy"], unique=True),
        ),
        af.Table("banks", af.Column("name", "string")),
        af.Table("cards", af.Reference("account", "accounts"), af.Column("bank", "bigint")),
    )


def _v2() -> af.Schema:
    """Every kind of change migrate() does not make on its own."""
    return af.Schema(
        "app",
        af.Table(
            "accounts",
            af.Column("owner", "string", nullable=True),  # NOT NULL -> NULL
            af.Column("balance", "string", default="0"),  # bigint -> string
            af.Column("note", "string"),  # NULL -> NOT NULL (no default)
            af.Column("code", "string", default="y"),  # default (safe)
            # "legacy" (NOT NULL, no default) and "spare" (nullable) removed
            af.Column("hint", "string", default="h"),
            af.Index("by_owner", ["owner"], unique=True),  # uniqueness
            af.Index("by_code", ["code", "owner"], unique=True),  # columns
            # "by_note" (plain: safe) and "by_legacy" (unique) removed
        ),
        af.Table("banks", af.Column("name", "string")),
        af.Table(
            "cards",
            af.Reference("account", "banks"),  # another table
            af.Reference("bank", "banks"),  # a column that had no reference
        ),
        af.Table("extra", af.Column("x", "string")),  # would be added
    )


async def test_every_kind_of_drift_is_reported_and_nothing_is_changed(
    db: af.Database, spaces: Namespaces
) -> None:
    v1, v2 = _v1(), _v2()
    layout = spaces.use(db, v2)
    ns = layout.namespace
    spaces.use(db, v1, ns)
    assert (await db.migrate(v1, namespace=ns)).version == 1

    async def seed(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("accounts", {"owner": "alice", "legacy": "l"})

    alice = await run(db, v1, ns, seed)
    accounts = layout.table("accounts")
    before = await db.inspect(namespace=ns)
    for attempt in (db.migration_sql, db.migrate):
        with pytest.raises(af.MigrationError) as info:
            await attempt(v2, namespace=ns)
        message = str(info.value)
        expected = [
            f"table 'accounts' ({accounts}): column type 'balance': declared string (",
            "column 'note' cannot become NOT NULL: 1 rows hold NULL; declare backfill=",
            "column not declared 'legacy': declared nothing, database has ",
            "index 'by_owner': declared unique (owner), database has (owner)",
            "index 'by_code': declared unique (code, owner), database has unique (code)",
            "index not declared 'ix_",
            "reference of column 'account': declared ",
            "reference of column 'bank': declared ",
        ]
        for part in expected:
            assert part in message, (part, message)
        kinds = {(type(d), d.name) for d in info.value.differences}
        # (Making "owner" nullable is a declared change: not refused.)
        assert "'owner'" not in message
        assert {
            (TypeChanged, "balance"),
            (RemovedColumn, "legacy"),
            (IndexChanged, "by_owner"),
            (IndexChanged, "by_code"),
            (ReferenceChanged, "account"),
            (ReferenceChanged, "bank"),
        } <= kinds
        assert all(d.blocking for d in info.value.differences)
        # What is safe to leave is not listed; nothing was changed or recorded.
        assert "'code': declared 'y'" not in message and "'spare'" not in message
        assert "by_note" not in message and "by_legacy" in message
    assert await db.inspect(namespace=ns) == before
    assert await table_count(db, layout.table("extra")) == 0
    assert await setting(db, f"{ns}.schema_version") == ["1"]
    [row] = await rows_of(db, v1, ns, "accounts")
    assert (row["id"], row["owner"], row["legacy"]) == (alice, "alice", "l")


async def test_safe_differences_are_reported_and_left(db: af.Database, spaces: Namespaces) -> None:
    v1 = _v1()
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    accounts = v1.tables["accounts"]
    safe = af.Schema(
        "app",
        af.Table(
            "accounts",
            *(c for n, c in accounts.columns.items() if n not in ("spare", "code")),
            af.Column("code", "string", default="y"),
            *(i for n, i in accounts.indexes.items() if n != "by_note"),
        ),
        v1.tables["banks"],
        v1.tables["cards"],
    )
    spaces.use(db, safe, ns)
    result = await db.migrate(safe, namespace=ns)
    assert result.version == 2
    left = {(type(d), d.name) for d in result.left}
    assert left == {
        (RemovedColumn, "spare"),
        (RemovedIndex, layout.index_name("accounts", "by_note")),
    }
    # A changed default is a declared change, made (not left).
    assert {(type(d), d.name) for d in result.planned} == {(DefaultChanged, "code")}
    assert not any(d.blocking for d in result.differences)

    async def write(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("accounts", {"owner": "bob", "legacy": "z"})

    bob = await run(db, safe, ns, write)
    [row] = await rows_of(db, safe, ns, "accounts")
    assert (row["id"], row["code"]) == (bob, "y")  # the declared default, written by aiofragno


async def test_a_column_retyped_by_hand_is_reported(db: af.Database, spaces: Namespaces) -> None:
    schema = af.Schema("app", af.Table("t", af.Column("n", "bigint", nullable=True)))
    layout = spaces.use(db, schema)
    ns = layout.namespace
    await db.migrate(schema, namespace=ns)
    physical = layout.table("t")
    await execute(
        db, "ALTER TABLE {t} DROP COLUMN {c}", t=physical.identifier, c=af.Identifier("n")
    )
    await execute(
        db,
        "ALTER TABLE {t} ADD COLUMN {c} varchar(40)",
        t=physical.identifier,
        c=af.Identifier("n"),
    )
    with pytest.raises(af.MigrationError) as info:
        await db.migrate(schema, namespace=ns)
    assert f"table 't' ({physical}): column type 'n': declared bigint (" in str(info.value)
    assert "varchar(40)" in str(info.value) or "character varying(40)" in str(info.value)
    diff_types = {TypeChanged, NullabilityChanged, IndexChanged, ReferenceChanged}
    assert all(not cls.additive for cls in diff_types)


# -- internal columns ---------------------------------------------------------


async def _drop_what_the_database_lets_go(
    db: af.Database, physical: PhysicalTable, columns: tuple[str, ...]
) -> set[str]:
    """Drop each of ``columns`` where the database allows it (SQLite keeps a
    primary key and a unique column); return those dropped."""
    dropped = set()
    for column in columns:
        try:
            await execute(
                db,
                "ALTER TABLE {t} DROP COLUMN {c}",
                t=physical.identifier,
                c=af.Identifier(column),
            )
        except af.Error:
            continue
        dropped.add(column)
    return dropped


async def test_missing_internal_columns_are_healed_with_rows_kept(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = af.Schema(
        "app", af.Table("notes", af.Column("text", "string"), af.Column("n", "integer", default=0))
    )
    layout = spaces.use(db, schema)
    ns = layout.namespace
    await db.migrate(schema, namespace=ns)

    async def seed(uow: af.UnitOfWork) -> None:
        uow.create("notes", {"text": "one", "n": 1})
        uow.create("notes", {"text": "two", "n": 2})

    await run(db, schema, ns, seed)
    physical = layout.table("notes")
    dropped = await _drop_what_the_database_lets_go(db, physical, ("_version", "id", "_id"))
    assert "_version" in dropped

    planned = await db.migrate(schema, namespace=ns, dry_run=True)
    assert {d.name for d in planned.differences if isinstance(d, MissingInternalColumn)} == dropped
    healed = await db.migrate(schema, namespace=ns)
    assert healed.changed and healed.version == 1
    assert {"_id", "id", "_version"} <= await column_names(db, physical)
    assert (await db.migrate(schema, namespace=ns)).differences == []

    rows = sorted(await rows_of(db, schema, ns, "notes"), key=lambda r: r["n"])
    assert [(r["text"], r["n"]) for r in rows] == [("one", 1), ("two", 2)]
    assert len({r["id"] for r in rows}) == 2 and all(r["id"].version == 0 for r in rows)

    async def edit(uow: af.UnitOfWork) -> af.RowId:
        uow.update("notes", rows[0]["id"], {"text": "uno"})
        return uow.create("notes", {"text": "three"})

    three = await run(db, schema, ns, edit)
    after = {r["id"]: r for r in await rows_of(db, schema, ns, "notes")}
    assert after[rows[0]["id"]]["text"] == "uno" and after[rows[0]["id"]]["id"].version == 1
    assert after[three]["text"] == "three" and set(after) == {*(r["id"] for r in rows), three}


# -- someone else's table -----------------------------------------------------


async def _foreign_table(db: af.Database, layout: Layout) -> PhysicalTable:
    physical = layout.table("people")
    if physical.schema is not None:
        await execute(db, "CREATE SCHEMA {s}", s=af.Identifier(physical.schema))
    await execute(
        db,
        "CREATE TABLE {t} ({a} varchar(40) NOT NULL, {b} integer)",
        t=physical.identifier,
        a=af.Identifier("name"),
        b=af.Identifier("age"),
    )
    # More rows than one statement gives new ids to (internal_columns._CHUNK).
    people = [("ann", 31), ("bo", None), *((f"p{n}", n) for n in range(299))]
    values = af.Fragment.join(af.sql("({n}, {a})", n=name, a=age) for name, age in people)
    await execute(
        db,
        "INSERT INTO {t} ({a}, {b}) VALUES {values}",
        t=physical.identifier,
        a=af.Identifier("name"),
        b=af.Identifier("age"),
        values=values,
    )
    return physical


async def test_someone_elses_table_is_refused_unless_adopted(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = af.Schema(
        "app",
        af.Table(
            "people",
            af.Column("name", af.varchar(40)),
            af.Column("age", "integer", nullable=True),
            af.Index("by_name", ["name"]),
        ),
    )
    layout = spaces.use(db, schema)
    ns = layout.namespace
    physical = await _foreign_table(db, layout)
    with pytest.raises(af.MigrationError) as info:
        await db.migrate(schema, namespace=ns)
    message = str(info.value)
    assert "not an aiofragno table" in message and str(physical) in message
    assert "adopt=True" in message
    assert await column_names(db, physical) == {"name", "age"}

    adopted = await db.migrate(schema, namespace=ns, adopt=True)
    assert {d.name for d in adopted.differences if isinstance(d, MissingInternalColumn)} == {
        "_id",
        "id",
        "_version",
    }
    assert (await db.migrate(schema, namespace=ns)).differences == []
    rows = {r["name"]: r for r in await rows_of(db, schema, ns, "people")}
    assert len(rows) == 301 and (rows["ann"]["age"], rows["bo"]["age"]) == (31, None)
    assert all(r["id"].version == 0 and len(r["id"]) == 36 for r in rows.values())
    assert len({r["id"] for r in rows.values()}) == 301

    async def edit(uow: af.UnitOfWork) -> af.RowId:
        uow.update("people", rows["bo"]["id"], {"age": 7})
        return uow.create("people", {"name": "cy"})

    cy = await run(db, schema, ns, edit)
    after = {r["name"]: r for r in await rows_of(db, schema, ns, "people")}
    assert (after["bo"]["age"], after["cy"]["id"]) == (7, cy)
    live = await db.inspect(namespace=ns)
    people = live.table("people")
    assert people is not None
    assert any(i.name == layout.index_name("people", "by_name") for i in people.indexes)


async def test_a_lost_unique_key_on_id_is_restored(db: af.Database, spaces: Namespaces) -> None:
    schema = af.Schema("app", af.Table("notes", af.Column("text", "string")))
    layout = spaces.use(db, schema)
    ns = layout.namespace
    await db.migrate(schema, namespace=ns)
    physical = layout.table("notes")
    notes = (await db.inspect(namespace=ns)).table("notes")
    assert notes is not None
    [key] = [i for i in notes.indexes if i.columns == ("id",)]
    for statement in ("ALTER TABLE {t} DROP CONSTRAINT {i}", "ALTER TABLE {t} DROP INDEX {i}"):
        try:
            await execute(db, statement, t=physical.identifier, i=af.Identifier(key.name))
            break
        except af.Error:
            continue
    else:
        pytest.skip(f"{db.name} cannot drop a UNIQUE constraint")
    healed = await db.migrate(schema, namespace=ns)
    assert [type(d).__name__ for d in healed.differences] == ["MissingExternalIdKey"]
    assert (await db.migrate(schema, namespace=ns)).differences == []
    notes = (await db.inspect(namespace=ns)).table("notes")
    assert notes is not None and any(i.columns == ("id",) and i.unique for i in notes.indexes)


async def test_a_table_keyed_by_a_column_of_its_own_is_not_adopted(
    db: af.Database, spaces: Namespaces
) -> None:
    schema = af.Schema("app", af.Table("codes", af.Column("code", af.varchar(20))))
    layout = spaces.use(db, schema)
    physical = layout.table("codes")
    if physical.schema is not None:
        await execute(db, "CREATE SCHEMA {s}", s=af.Identifier(physical.schema))
    await execute(
        db, "CREATE TABLE {t} (code varchar(20) NOT NULL PRIMARY KEY)", t=physical.identifier
    )
    with pytest.raises(af.MigrationError) as info:
        await db.migrate(schema, namespace=layout.namespace, adopt=True)
    assert f"table 'codes' ({physical}): primary key: declared (_id), database has (code)" in str(
        info.value
    )
    assert await column_names(db, physical) == {"code"}


async def test_an_adopted_table_keeps_the_foreign_keys_of_its_undeclared_columns(
    db: af.Database, spaces: Namespaces
) -> None:
    """Adopting rebuilds the table on SQLite (it cannot add a primary key):
    a column the declaration leaves out keeps its foreign key."""
    teams = af.Table("teams", af.Column("title", "string"))
    first = af.Schema("app", teams)
    ns = spaces.use(db, first).namespace
    await db.migrate(first, namespace=ns)

    async def make_team(uow: af.UnitOfWork) -> None:
        uow.create("teams", {"title": "t"})

    await run(db, first, ns, make_team)
    [team] = await rows_of(db, first, ns, "teams")
    schema = af.Schema("app", teams, af.Table("people", af.Column("name", af.varchar(40))))
    layout = spaces.use(db, schema, ns)
    physical = layout.table("people")
    names = {c: af.Identifier(c) for c in ("id", "name", "team", "_id")}
    await execute(
        db,
        "CREATE TABLE {t} ({name} varchar(40) NOT NULL, {team} bigint, "
        "FOREIGN KEY ({team}) REFERENCES {teams} ({_id}))",
        t=physical.identifier,
        teams=layout.table("teams").identifier,
        **{k: v for k, v in names.items() if k != "id"},
    )
    await db.migrate(schema, namespace=ns, adopt=True)

    async def insert(name: str, team_id: int) -> None:
        await db.execute(
            af.sql(
                "INSERT INTO {t} ({id}, {name}, {team}) VALUES ({v1}, {v2}, {v3})",
                t=physical.identifier,
                v1=f"id-{name}",
                v2=name,
                v3=team_id,
                **{k: v for k, v in names.items() if k != "_id"},
            )
        )

    await insert("ann", team["id"].internal_id)
    with pytest.raises(af.IntegrityError):
        await insert("bo", team["id"].internal_id + 1000)
    assert {r["name"] for r in await rows_of(db, schema, ns, "people")} == {"ann"}


async def test_sqlite_rebuilds_restate_kept_keys_as_written_or_refuse(
    db: af.Database, spaces: Namespaces
) -> None:
    """SQLite rebuilds a table to adopt it and to change a column: the
    columns it keeps as they are keep a key to the parent's primary key
    named by no column, its ON DELETE action, and a UNIQUE constraint a key
    of the table points at; a key the catalog cannot describe exactly (the
    table says DEFERRABLE) makes the migration a refusal, nothing changed."""
    if db.name != "sqlite":
        pytest.skip("only SQLite rebuilds tables")
    teams = af.Table("teams", af.Column("title", "string"))
    ns = spaces.use(db, af.Schema("app", teams)).namespace
    await db.migrate(af.Schema("app", teams), namespace=ns)

    async def make_team(uow: af.UnitOfWork) -> None:
        uow.create("teams", {"title": "t"})

    await run(db, af.Schema("app", teams), ns, make_team)
    [team] = await rows_of(db, af.Schema("app", teams), ns, "teams")
    team_id = team["id"].internal_id
    people = lambda nullable: af.Table("people", af.Column("name", "text", nullable=nullable))  # noqa: E731
    layout = spaces.use(db, af.Schema("app", teams, people(False)), ns)
    table = layout.table("people").identifier
    await execute(
        db,
        "CREATE TABLE {t} (name text NOT NULL, team bigint REFERENCES {teams} ON DELETE CASCADE, "
        "code text UNIQUE, mentor text REFERENCES {t} (code))",
        t=table,
        teams=layout.table("teams").identifier,
    )

    async def insert(name: str, team: int | None, code: str, mentor: str | None) -> None:
        await db.execute(
            af.sql(
                "INSERT INTO {t} (id, name, team, code, mentor) VALUES ({i}, {n}, {team}, {c}, {m})",
                t=table,
                i=f"id-{name}",
                n=name,
                team=team,
                c=code,
                m=mentor,
            )
        )

    for version, nullable in enumerate((False, True)):  # adopted, then a column changed
        await db.migrate(af.Schema("app", teams, people(nullable)), namespace=ns, adopt=True)
        await insert(f"a{version}", team_id, f"c{version}", None)
        await insert(f"b{version}", None, f"d{version}", f"c{version}")
        for dangling in ((team_id + 99, "x", None), (None, "y", "nobody")):
            with pytest.raises(af.IntegrityError):
                await insert("z", *dangling)
        with pytest.raises(af.IntegrityError):  # (the code is still unique)
            await insert("z", None, f"c{version}", None)
    count = af.sql("SELECT COUNT(*) FROM {t}", t=table)
    assert await db.fetch_value(count) == 4
    await db.execute(af.sql("UPDATE {t} SET mentor = NULL", t=table))
    await db.execute(af.sql("DELETE FROM {t}", t=layout.table("teams").identifier))
    assert await db.fetch_value(count) == 2  # (ON DELETE CASCADE)

    pets = af.Schema("app", teams, people(True), af.Table("pets", af.Column("name", "text")))
    pets_layout = spaces.use(db, pets, ns)
    pets_table = pets_layout.table("pets").identifier
    await execute(
        db,
        "CREATE TABLE {t} (name text, owner bigint REFERENCES {teams} DEFERRABLE INITIALLY DEFERRED)",
        t=pets_table,
        teams=layout.table("teams").identifier,
    )
    with pytest.raises(af.MigrationError, match="DEFERRABLE"):
        await db.migrate(pets, namespace=ns, adopt=True)
    assert await column_names(db, pets_layout.table("pets")) == {"name", "owner"}
