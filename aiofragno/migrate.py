"""Migrations: make the database match a :class:`~aiofragno.Schema`.

``await db.migrate(schema)`` compares the declaration with what the database
has (:mod:`aiofragno.introspection`, every time; the comparison is
:mod:`aiofragno.schema_diff`) and adds what is missing: the internal
settings table, database schemas, tables, columns and indexes, and the
internal columns of a table that lost them (:mod:`aiofragno.internal_columns`).
It never drops or alters anything that exists, so a later version of a schema
migrates forward with its data kept, and a column dropped by hand is added
again (self-healing). Every other difference is reported before anything
runs: one that would make reads or writes fail (a retyped, re-nulled or
removed NOT NULL column, a changed index or reference) raises
:class:`~aiofragno.errors.MigrationError` listing them all; one that is safe to
leave (a changed default, a removed nullable column, a plain index no longer
declared) is logged as a warning and listed in
:attr:`MigrationResult.differences`. It is idempotent, holds a migration
lock (PostgreSQL advisory lock, MySQL ``GET_LOCK``, SQLite's write lock) so
concurrent migrators run one after the other, and runs in one transaction
where the database has transactional DDL (PostgreSQL, SQLite). On MySQL each DDL statement commits on
its own; an interrupted migration is completed by the next run.

The lock is waited for at most ``lock_timeout`` seconds, and so (PostgreSQL,
MySQL) is each table lock the DDL needs: a migration never queues for ever
behind another one or a long transaction (see :mod:`aiofragno.migration_lock`).

The settings table ``fragno_db_settings`` records ``<namespace>.schema_version``
(bumped whenever the declaration changes), ``<namespace>.schema_hash``, and
which declared table each physical table is (:mod:`aiofragno.ownership`):
before changing anything, a migration refuses a table that belongs to another
namespace's table or is not aiofragno's (unless ``adopt=True``).

DDL text reaches the driver through the compiler's ``escape_text``, so a name
or a default holding ``%``, ``$1`` or ``?`` is stored exactly as declared.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from . import internal_columns, migration_lock, ownership
from .codec import ValueCodec
from .driver import CompiledQuery, DdlSpec, QueryCompiler
from .errors import Error, LockTimeout, MigrationError
from .introspection import Inspector, LiveTable
from .naming import Layout, PhysicalTable
from .outbox import tables as outbox_tables
from .schema import (
    EXTERNAL_ID,
    INTERNAL_ID,
    VERSION,
    Column,
    Index,
    Reference,
    tables_in_dependency_order,
)
from .schema_diff import (
    Differ,
    Difference,
    MissingColumn,
    MissingExternalIdKey,
    MissingIndex,
    MissingInternalColumn,
    MissingTable,
)
from .settings_table import SETTINGS_TABLE as SETTINGS_TABLE
from .settings_table import read_setting, write_setting
from .sql import Identifier, sql, sql_using

if TYPE_CHECKING:
    from .session import Session

logger = logging.getLogger("aiofragno")


@dataclass
class MigrationResult:
    """What a migration did: the statements it ran (empty when the database
    already matched) and the namespace's schema version afterwards."""

    namespace: str
    version: int
    statements: list[str] = field(default_factory=list)
    # How the database differed from the declaration before the migration
    # (:mod:`aiofragno.schema_diff`): what it added, and what it left
    # because it is safe to leave (each also logged as a warning).
    differences: list[Difference] = field(default_factory=list)

    @property
    def left(self) -> list[Difference]:
        """The differences the migration reported and left as they are."""
        return [d for d in self.differences if not d.additive]

    @property
    def changed(self) -> bool:
        return bool(self.statements)


class Ddl:
    """Renders DDL for one dialect (quoting through the dialect's compiler)."""

    def __init__(self, spec: DdlSpec, compiler: QueryCompiler, codec: ValueCodec) -> None:
        self.spec = spec
        self.quote = compiler.quote_identifier
        # DDL has no parameters: all of it is text, and must stay text.
        self.escape = compiler.escape_text
        self.codec = codec

    def name(self, identifier: Identifier) -> str:
        return ".".join(self.quote(part) for part in identifier.parts)

    def column_type(self, column: Column) -> str:
        kind = "reference" if isinstance(column, Reference) else column.kind
        return self.spec.type_sql(kind, column.arg)

    def column(self, column: Column, *, nullable: bool | None = None) -> str:
        null = column.nullable if nullable is None else nullable
        text = f"{self.quote(column.name)} {self.column_type(column)}{'' if null else ' NOT NULL'}"
        default = self.default(column)
        return text if default is None else f"{text} DEFAULT {default}"

    def default(self, column: Column) -> str | None:
        """The column's default as a SQL literal, or None (also when it cannot
        be written as a portable literal; it is then applied by the client)."""
        if column.default is None:
            return None
        return literal(self.codec.encoder(column.kind, column.arg)(column.default), self.spec)

    def references(self, column: Reference, layout: Layout) -> str:
        target = layout.table(column.to_table)
        return f"REFERENCES {self.name(target.identifier)} ({self.quote(INTERNAL_ID)})"

    def create_table(self, physical: PhysicalTable, layout: Layout) -> str:
        table = physical.table
        lines = [
            f"{self.quote(INTERNAL_ID)} {self.spec.primary_key}",
            f"{self.quote(EXTERNAL_ID)} {self.spec.types['external_id']} NOT NULL UNIQUE",
            f"{self.quote(VERSION)} {self.spec.types['version']} NOT NULL DEFAULT 0",
            *(self.column(c) for c in table.columns.values()),
        ]
        for column in table.columns.values():
            if isinstance(column, Reference):
                fk = self.quote(layout.foreign_key_name(table.name, column.name))
                lines.append(
                    f"CONSTRAINT {fk} FOREIGN KEY ({self.quote(column.name)}) {self.references(column, layout)}"
                )
        body = ",\n  ".join(lines)
        return (
            f"CREATE TABLE {self.name(physical.identifier)} (\n  {body}\n){self.spec.table_options}"
        )

    def add_column(self, physical: PhysicalTable, column: Column, layout: Layout) -> list[str]:
        """ALTER statements adding ``column``. A NOT NULL column whose default has
        no portable literal is added nullable and filled by the caller."""
        table = self.name(physical.identifier)
        nullable = column.nullable or self.default(column) is None
        definition = f"ALTER TABLE {table} ADD COLUMN {self.column(column, nullable=nullable)}"
        if not isinstance(column, Reference):
            return [definition]
        if self.spec.add_column_references:
            return [f"{definition} {self.references(column, layout)}"]
        fk = self.quote(layout.foreign_key_name(physical.table.name, column.name))
        return [
            f"{definition}, ADD CONSTRAINT {fk} FOREIGN KEY ({self.quote(column.name)}) "
            f"{self.references(column, layout)}"
        ]

    def create_index(self, physical: PhysicalTable, index: Index, layout: Layout) -> str:
        name = self.quote(layout.index_name(physical.table.name, index.name))
        columns = ", ".join(self.quote(c) for c in index.columns)
        unique = "UNIQUE " if index.unique else ""
        # PostgreSQL puts an index in its table's schema; the name is unqualified.
        return f"CREATE {unique}INDEX {name} ON {self.name(physical.identifier)} ({columns})"


def literal(value: Any, spec: DdlSpec) -> str | None:
    """``value`` (already encoded for storage) as a SQL literal, or None when
    there is no literal form that every dialect reads the same way."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, datetime):
        value = value.isoformat(sep=" ")
    elif isinstance(value, date):
        value = value.isoformat()
    if not isinstance(value, str):
        return None
    escaped = value.replace("'", "''")
    if spec.backslash_escapes:
        escaped = escaped.replace("\\", "\\\\")
    return f"'{escaped}'"


class Migrator:
    """Plans and applies one migration on one session (connection)."""

    def __init__(
        self, session: Session, compile: Any, layout: Layout, ddl: Ddl, codec: ValueCodec
    ) -> None:
        self.session = session
        self.compile = compile
        self.layout = layout
        self.ddl = ddl
        self.codec = codec
        self.statements: list[str] = []

    async def fetch_names(self, template: str, **params: Any) -> set[str]:
        result = await self.session.execute(self.compile(sql_using(template, **params)))
        return {row["name"] for row in result.rows}

    async def run(self, statement: str, *, dry_run: bool) -> None:
        self.statements.append(statement)
        if not dry_run:
            await self.session.execute(CompiledQuery(self.ddl.escape(statement)))

    async def plan_table(
        self,
        physical: PhysicalTable,
        live: LiveTable | None,
        differences: list[Difference],
        *,
        dry_run: bool,
    ) -> None:
        """Apply the additive ``differences`` of ``physical`` from ``live``."""
        table = physical.table
        kinds = {type(d) for d in differences}
        fresh = MissingTable in kinds
        if fresh:
            await self.run(self.ddl.create_table(physical, self.layout), dry_run=dry_run)
        elif MissingInternalColumn in kinds:
            assert live is not None
            # (A rebuilt table is created from the declaration, without indexes.)
            fresh = await internal_columns.heal(self, physical, live, dry_run=dry_run)
        if MissingExternalIdKey in kinds and not fresh:
            await internal_columns.unique_external_ids(self, physical, dry_run=dry_run)
        missing = {str(d.name) for d in differences if isinstance(d, MissingColumn)}
        for column in table.columns.values():
            if not fresh and column.name in missing:
                await self.add_column(physical, column, dry_run=dry_run)
        unindexed = {str(d.name) for d in differences if isinstance(d, MissingIndex)}
        for index in table.indexes.values():
            if fresh or index.name in unindexed:
                await self.run(self.ddl.create_index(physical, index, self.layout), dry_run=dry_run)

    async def add_column(self, physical: PhysicalTable, column: Column, *, dry_run: bool) -> None:
        for statement in self.ddl.add_column(physical, column, self.layout):
            await self.run(statement, dry_run=dry_run)
        if column.default is not None and self.ddl.default(column) is None and not dry_run:
            # No portable literal: fill existing rows through a bound parameter.
            value = self.codec.encoder(column.kind, column.arg)(column.default)
            fill = sql(
                "UPDATE {t} SET {c} = {v} WHERE {c} IS NULL",
                t=physical.identifier,
                c=Identifier(column.name),
                v=value,
            )
            await self.session.execute(self.compile(fill))


def settings_table_sql(ddl: Ddl) -> str:
    spec = ddl.spec
    return (
        f"CREATE TABLE IF NOT EXISTS {ddl.quote(SETTINGS_TABLE)} (\n"
        f"  {ddl.quote('id')} {spec.primary_key},\n"
        f"  {ddl.quote('key')} {spec.types['varchar'].replace('{n}', '255')} NOT NULL UNIQUE,\n"
        f"  {ddl.quote('value')} {spec.types['text']} NOT NULL\n"
        f"){spec.table_options}"
    )


async def migrate(
    session: Session,
    compile: Any,
    layout: Layout,
    ddl: Ddl,
    codec: ValueCodec,
    *,
    dry_run: bool,
    lock_timeout: float,
    adopt: bool = False,
) -> MigrationResult:
    """Bring the database in line with ``layout`` on ``session`` (see the module
    docstring). The caller provides the session and ends its transaction."""
    spec = ddl.spec
    async with migration_lock.held(session, compile, spec, lock_timeout):
        try:
            return await _migrate(
                session, compile, layout, ddl, codec, dry_run=dry_run, adopt=adopt
            )
        except MigrationError:
            raise
        except LockTimeout as exc:
            raise migration_lock.timed_out(lock_timeout, exc, layout.namespace) from exc
        except Error as exc:
            raise MigrationError(f"migrating namespace {layout.namespace!r} failed: {exc}") from exc


async def _migrate(
    session: Session,
    compile: Any,
    layout: Layout,
    ddl: Ddl,
    codec: ValueCodec,
    *,
    dry_run: bool,
    adopt: bool,
) -> MigrationResult:
    spec = ddl.spec
    for table in layout.schema.tables.values():  # (a type the database lacks: before any DDL)
        for column in table.columns.values():
            ddl.column_type(column)
    migrator = Migrator(session, compile, layout, ddl, codec)
    inspector = Inspector(session, compile, spec)
    settings = await migrator.fetch_names(spec.columns_sql, schema=None, table=SETTINGS_TABLE)
    tables = [layout.table(table.name) for table in tables_in_dependency_order(layout.schema)]
    live = {
        physical.table.name: await inspector.table(physical.schema, physical.name)
        for physical in tables
    }
    # Before anything is changed: a table of another's is never touched, and
    # a change migrate() does not make on its own is reported, all at once.
    pending = await ownership.check(
        session,
        compile,
        spec,
        layout,
        {name: set() if t is None else {c.name for c in t.columns} for name, t in live.items()},
        recorded=bool(settings),
        adopt=adopt,
    )
    differences = _drift(layout, ddl, inspector, tables, live)
    found = [d for per_table in differences.values() for d in per_table]
    if not settings:
        await migrator.run(settings_table_sql(ddl), dry_run=dry_run)
    await _internal_tables(migrator, dry_run=dry_run)
    for db_schema in layout.db_schemas:
        if spec.create_schema_sql and not await _schema_exists(migrator, db_schema):
            statement = spec.create_schema_sql.replace("{schema}", ddl.name(Identifier(db_schema)))
            await migrator.run(statement, dry_run=dry_run)
    for physical in tables:
        name = physical.table.name
        await migrator.plan_table(physical, live[name], differences[name], dry_run=dry_run)
    if not dry_run:
        await ownership.record(session, compile, pending)
    result = await _record_version(
        migrator, has_settings=bool(settings) or not dry_run, dry_run=dry_run
    )
    result.differences = found
    return result


def _drift(
    layout: Layout,
    ddl: Ddl,
    inspector: Inspector,
    tables: list[PhysicalTable],
    live: dict[str, LiveTable | None],
) -> dict[str, list[Difference]]:
    """Each table's differences from ``live``; :class:`MigrationError` for
    those migrate() refuses, a warning for those it leaves."""
    differ = Differ(
        layout,
        dict(ddl.spec.types),
        inspector.type_map,
        inspector.catalog,
        column_type=ddl.column_type,
        default_literal=ddl.default,
        backslash_escapes=ddl.spec.backslash_escapes,
    )
    differences = {p.table.name: differ.diff_table(p, live[p.table.name]) for p in tables}
    found = [d for per_table in differences.values() for d in per_table]
    _refuse_drift(layout, found)
    for difference in found:
        if not difference.additive:
            logger.warning(
                "migrating namespace %r, left as it is: %s", layout.namespace, difference
            )
    return differences


def _refuse_drift(layout: Layout, differences: list[Difference]) -> None:
    """:class:`MigrationError` listing every difference migrate() does not
    apply on its own, and every column it cannot add."""
    refused = [d for d in differences if d.blocking or _unaddable(layout, d)]
    if not refused:
        return
    listed = "\n  ".join(_unaddable(layout, d) or str(d) for d in refused)
    error = MigrationError(
        f"migrate() changed nothing in namespace {layout.namespace!r}; it does not make "
        f"these changes on its own:\n  {listed}\nChange the declaration, or the database "
        "by hand (keeping the data you need), then migrate again."
    )
    error.differences = tuple(refused)
    raise error


def _unaddable(layout: Layout, difference: Difference) -> str | None:
    """Why ``difference``, a missing column, cannot be added (None: it can,
    or it is no missing column)."""
    if not isinstance(difference, MissingColumn):
        return None
    column = layout.table(difference.table).table.columns[str(difference.name)]
    if column.nullable or column.default is not None:
        return None
    return (
        f"cannot add column {column.name!r} to table {difference.table!r}: it is NOT NULL "
        "without a default, and existing rows would have no value; give it a default or make "
        "it nullable"
    )


async def _internal_tables(migrator: Migrator, *, dry_run: bool) -> None:
    """The bookkeeping tables (:mod:`aiofragno.outbox.tables`), and the
    outbox's version counter row (pre-created so that reserving a version
    always updates an existing row)."""
    spec, quote = migrator.ddl.spec, migrator.ddl.quote
    for table, statement in outbox_tables.create_statements(spec, quote):
        columns = await migrator.fetch_names(spec.columns_sql, schema=None, table=table)
        if not columns:
            await migrator.run(statement, dry_run=dry_run)
            if table == outbox_tables.OUTBOX:
                await migrator.run(outbox_tables.uow_index_statement(quote), dry_run=dry_run)
        elif table == outbox_tables.OUTBOX:
            await _upgrade_outbox(migrator, columns, dry_run=dry_run)
    await _outbox_ticks(migrator, dry_run=dry_run)
    if (
        not dry_run
        and await read_setting(migrator.session, migrator.compile, outbox_tables.VERSION_KEY)
        is None
    ):
        # Continue after the newest entry, should the counter row have been lost.
        latest = await migrator.session.execute(
            migrator.compile(
                sql(
                    "SELECT MAX({v}) AS v FROM {t}",
                    v=Identifier("versionstamp"),
                    t=outbox_tables.OUTBOX_ID,
                )
            )
        )
        stamp = latest.rows[0]["v"]
        version = "0" if stamp is None else str(int(stamp[:20], 16))
        await write_setting(migrator.session, migrator.compile, outbox_tables.VERSION_KEY, version)


async def _upgrade_outbox(migrator: Migrator, columns: set[str], *, dry_run: bool) -> None:
    """Bring an outbox table made by an earlier layout up to date: the
    ``nonce`` column, and a unique index on ``uow_id`` in place of the plain one."""
    spec, quote = migrator.ddl.spec, migrator.ddl.quote
    if "nonce" not in columns:
        await migrator.run(outbox_tables.nonce_column_statement(spec, quote), dry_run=dry_run)
    indexes = await migrator.fetch_names(spec.indexes_sql, schema=None, table=outbox_tables.OUTBOX)
    if outbox_tables.UOW_INDEX not in indexes:
        await _refuse_duplicate_keys(migrator)
        await migrator.run(outbox_tables.uow_index_statement(quote), dry_run=dry_run)
    if outbox_tables.OLD_UOW_INDEX in indexes:
        statement = outbox_tables.old_uow_index_drop_statement(spec, quote)
        await migrator.run(statement, dry_run=dry_run)


async def _outbox_ticks(migrator: Migrator, *, dry_run: bool) -> None:
    """What the outbox's "ticks" strategy adds, where the dialect has it
    (:attr:`DdlSpec.outbox_ticks_sql <aiofragno.driver.DdlSpec.outbox_ticks_sql>`),
    to a new outbox table or one made by an earlier layout, until its
    ``xid`` column exists (the statements are idempotent)."""
    spec = migrator.ddl.spec
    if not spec.outbox_ticks_sql:
        return
    columns = await migrator.fetch_names(spec.columns_sql, schema=None, table=outbox_tables.OUTBOX)
    if "xid" in columns:
        return
    for statement in spec.outbox_ticks_sql:
        await migrator.run(statement, dry_run=dry_run)


async def _refuse_duplicate_keys(migrator: Migrator) -> None:
    """Before ``uow_id`` becomes unique: entries that share one can only be
    sorted out by whoever wrote them."""
    uow_id = Identifier("uow_id")
    query = sql(
        "SELECT {u} AS u FROM {t} GROUP BY {u} HAVING COUNT(*) > 1 ORDER BY {u} LIMIT 5",
        u=uow_id,
        t=outbox_tables.OUTBOX_ID,
    )
    keys = [row["u"] for row in (await migrator.session.execute(migrator.compile(query))).rows]
    if keys:
        raise MigrationError(
            f"the outbox holds several entries for each of the unit of work ids {keys!r} "
            "(units that ran more than once with one idempotency_key), so uow_id cannot "
            "become unique; keep one entry per uow_id (delete or rename the others, after "
            "your consumers have seen them), then migrate again"
        )


async def _schema_exists(migrator: Migrator, db_schema: str) -> bool:
    result = await migrator.session.execute(
        migrator.compile(
            sql("SELECT 1 FROM information_schema.schemata WHERE schema_name = {s}", s=db_schema)
        )
    )
    return bool(result.rows)


async def _record_version(
    migrator: Migrator, *, has_settings: bool, dry_run: bool
) -> MigrationResult:
    layout = migrator.layout
    ns = layout.namespace
    session, compile = migrator.session, migrator.compile
    stored_hash = version_text = None
    if has_settings:
        stored_hash = await read_setting(session, compile, f"{ns}.schema_hash")
        version_text = await read_setting(session, compile, f"{ns}.schema_version")
    version = int(version_text or 0)
    fingerprint = layout.schema.fingerprint
    # Only a changed declaration is a new version: self-healing is not.
    if stored_hash != fingerprint:
        version += 1
        if not dry_run:
            await write_setting(session, compile, f"{ns}.schema_version", str(version))
            await write_setting(session, compile, f"{ns}.schema_hash", fingerprint)
    return MigrationResult(ns, version, migrator.statements)
