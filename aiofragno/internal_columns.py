"""Re-adding aiofragno's own columns to a table that lacks them.

A table of ours whose ``_version``, ``id`` or ``_id`` was dropped by hand,
and a table adopted with ``migrate(..., adopt=True)``, get them back with a
value for every row that is there:

* ``_version`` — added ``NOT NULL DEFAULT 0``;
* ``_id`` — added as the primary key, numbered by the database (PostgreSQL
  identity, MySQL ``AUTO_INCREMENT``); SQLite cannot add a primary key, so
  the table is rebuilt from the declaration (create, copy with ``_id`` =
  the old ``rowid``, drop, rename) in the migration's transaction;
* ``id`` — added ``NOT NULL DEFAULT ''``, each row given a new external id
  (UUIDv7, bound, 250 rows an ``UPDATE``), then made unique by the index
  ``<index prefix>_external_id``.

Rows keep their data and are read and written by units of work afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from .errors import MigrationError
from .introspection import LiveColumn, LiveReference, LiveTable
from .schema import EXTERNAL_ID, INTERNAL_ID, VERSION, new_external_id
from .schema_diff import EXTERNAL_ID_INDEX
from .sql import Fragment, Identifier, sql

if TYPE_CHECKING:
    from .migrate import Ddl, Migrator
    from .naming import PhysicalTable

# Rows given new external ids by one statement.
_CHUNK = 250


def heal(migrator: Migrator, physical: PhysicalTable, live: LiveTable) -> bool:
    """Plan adding the internal columns ``live`` lacks; True when the table is
    rebuilt from the declaration (its declared columns and no index exist)."""
    ddl = migrator.ddl
    rebuilt = live.column(INTERNAL_ID) is None and not ddl.spec.add_primary_key
    migrator.step("add internal columns", physical.table.name, locks=True, rewrites=rebuilt)
    table = ddl.name(physical.identifier)
    spec = ddl.spec
    if live.column(VERSION) is None:
        statement = (
            f"ALTER TABLE {table} ADD COLUMN {ddl.quote(VERSION)} {spec.types['version']} "
            "NOT NULL DEFAULT 0"
        )
        migrator.run(statement)
    if live.column(INTERNAL_ID) is None:
        if not spec.add_primary_key:
            _rebuild(migrator, physical, live)
            return True
        statement = f"ALTER TABLE {table} ADD COLUMN {ddl.quote(INTERNAL_ID)} {spec.primary_key}"
        migrator.run(statement)
    if live.column(EXTERNAL_ID) is None:
        statement = (
            f"ALTER TABLE {table} ADD COLUMN {ddl.quote(EXTERNAL_ID)} "
            f"{spec.types['external_id']} NOT NULL DEFAULT ''"
        )
        migrator.run(statement)
        _new_external_ids(migrator, physical)
    return False


def _new_external_ids(migrator: Migrator, physical: PhysicalTable) -> None:
    """Give every row a new external id, then make the ids unique."""
    _assign_external_ids(migrator, physical)
    unique_external_ids(migrator, physical)


def unique_external_ids(migrator: Migrator, physical: PhysicalTable) -> None:
    """The unique index on ``id``, for a table whose ids are not unique."""
    ddl = migrator.ddl
    name = ddl.quote(migrator.layout.index_name(physical.table.name, EXTERNAL_ID_INDEX))
    statement = (
        f"CREATE UNIQUE INDEX {name} ON {ddl.name(physical.identifier)} ({ddl.quote(EXTERNAL_ID)})"
    )
    migrator.run(statement)


def _rebuild(migrator: Migrator, physical: PhysicalTable, live: LiveTable) -> None:
    """Where a primary key cannot be added (SQLite): rebuild the table as
    SQLite documents it — the table created from the declaration under a new
    name (the live columns it does not declare kept as they are), the rows
    copied with ``_id`` taken from the ``rowid`` (unique placeholders for
    ``id`` where it is missing, replaced at once), the old table dropped, the
    new one renamed. The kept columns keep their foreign keys and UNIQUE
    constraints, and the rows are checked against the keys.
    (Renaming the old table first would make the other tables' foreign keys
    follow it, and then point at nothing.)"""
    ddl = migrator.ddl
    quote = ddl.quote
    table = ddl.name(physical.identifier)
    new = quote(f"{physical.name}__aiofragno_new")
    ours = {n.lower() for n in (INTERNAL_ID, EXTERNAL_ID, VERSION, *physical.table.columns)}
    kept = [c for c in live.columns if c.name.lower() not in ours]
    constraints, problems = kept_constraints(ddl, live, {c.name.lower() for c in kept})
    migrator.refusals += [f"table {physical.table.name!r} ({physical}): {p}" for p in problems]
    extra = [*(live_definition(quote, c) for c in kept), *constraints]
    migrator.run(ddl.create_table(physical, migrator.layout, name=new, extra=extra))
    copied = [
        quote(c.name) for c in physical.table.columns.values() if live.column(c.name) is not None
    ]
    copied += [quote(c.name) for c in kept]
    if live.column(VERSION) is not None:
        copied.append(quote(VERSION))
    has_id = live.column(EXTERNAL_ID) is not None
    source = quote(EXTERNAL_ID) if has_id else "CAST(rowid AS TEXT)"
    targets = ", ".join([quote(INTERNAL_ID), quote(EXTERNAL_ID), *copied])
    values = ", ".join(["rowid", source, *copied])
    migrator.run(f"INSERT INTO {new} ({targets}) SELECT {values} FROM {table}")
    migrator.run(f"DROP TABLE {table}")
    migrator.run(f"ALTER TABLE {new} RENAME TO {quote(physical.name)}")
    if not has_id:
        _assign_external_ids(migrator, physical)
    check_foreign_keys(migrator, physical.table.name)


def check_foreign_keys(migrator: Migrator, table: str) -> None:
    """After a rebuild of ``table``, where the database checks foreign keys
    by a statement (SQLite): refuse the migration, nothing changed, if a
    row references a missing one."""
    check = migrator.ddl.spec.foreign_key_check_sql
    if check is None:
        return

    async def run() -> None:
        rows = (await migrator.session.execute(migrator.compile(sql(check)))).rows
        if rows:
            raise MigrationError(
                f"rebuilding table {table!r} would leave rows referencing missing ones "
                f"(first: {dict(rows[0])}); nothing was changed. Fix those rows, then migrate again"
            )

    migrator.act(f"-- {check}: no row references a missing one", run)


def live_definition(quote: Callable[[str], str], column: LiveColumn) -> str:
    """A column definition restating ``column`` as the database has it."""
    text = f"{quote(column.name)} {column.sql_type}{'' if column.nullable else ' NOT NULL'}"
    return text if column.default is None else f"{text} DEFAULT {column.default}"


def kept_constraints(
    ddl: Ddl, live: LiveTable, kept: Collection[str], leaving: Collection[LiveReference] = ()
) -> tuple[list[str], list[str]]:
    """The table constraints with which a rebuilt table (SQLite) keeps the
    columns ``kept`` (lower case) as they are: their foreign keys, but for
    ``leaving``, and their UNIQUE constraints; and, for what it cannot
    restate exactly, why (the migration is then refused)."""
    definitions: list[str] = []
    problems: list[str] = []
    for key in live.references:
        if key in leaving or not all(c.lower() in kept for c in key.columns):
            continue
        if not key.restatable:
            problems.append(
                f"the table's definition says DEFERRABLE, and SQLite's catalog does not say of "
                f"which foreign key, so a rebuild cannot keep the one on {', '.join(key.columns)} "
                "as it is; drop or declare that column, or make the change by hand"
            )
            continue
        definitions.append(live_key_definition(ddl, key))
    for index in live.indexes:
        columns = [c for c in index.columns if c is not None]
        if (
            index.unique
            and not index.primary
            and index.name.lower().startswith("sqlite_autoindex")
            and len(columns) == len(index.columns)
            and all(c.lower() in kept for c in columns)
        ):
            definitions.append(f"UNIQUE ({', '.join(ddl.quote(c) for c in columns)})")
    return definitions, problems


def live_key_definition(ddl: Ddl, key: LiveReference) -> str:
    """A table constraint restating foreign key ``key`` as the database has
    it (no column list: the referenced table's primary key)."""
    quote = ddl.quote
    name = "" if key.name is None else f"CONSTRAINT {quote(key.name)} "
    target = Identifier(key.to_table)
    if key.to_schema is not None:
        target = Identifier(key.to_schema, key.to_table)
    to = f" ({', '.join(quote(c) for c in key.to_columns)})" if key.to_columns else ""
    columns = ", ".join(quote(c) for c in key.columns)
    return f"{name}FOREIGN KEY ({columns}) REFERENCES {ddl.name(target)}{to}{key.actions}"


def _assign_external_ids(migrator: Migrator, physical: PhysicalTable) -> None:
    """A new external id for every row: bound values, ``_CHUNK`` rows a
    statement (within SQLite's oldest limit of 999 parameters)."""

    async def assign() -> None:
        await _assign(migrator, physical)

    migrator.act(f"-- UPDATE {physical}: a new external id (UUIDv7) for every row, bound", assign)


async def _assign(migrator: Migrator, physical: PhysicalTable) -> None:
    session, compile = migrator.session, migrator.compile
    internal, external = Identifier(INTERNAL_ID), Identifier(EXTERNAL_ID)
    rows = await session.execute(
        compile(sql("SELECT {i} AS i FROM {t}", i=internal, t=physical.identifier))
    )
    keys = [row["i"] for row in rows.rows]
    for start in range(0, len(keys), _CHUNK):
        chunk = keys[start : start + _CHUNK]
        whens = Fragment.join(
            (sql("WHEN {k} THEN {v}", k=key, v=new_external_id()) for key in chunk), " "
        )
        update = sql(
            "UPDATE {t} SET {e} = CASE {i} {whens} END WHERE {i} IN {keys}",
            t=physical.identifier,
            e=external,
            i=internal,
            whens=whens,
            keys=chunk,
        )
        await session.execute(compile(update))
