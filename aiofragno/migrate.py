"""Migrations: make the database match a :class:`~aiofragno.Schema`.

``await db.migrate(schema)`` compares the declaration with what the database
has (:mod:`aiofragno.introspection`, every time; the comparison is
:mod:`aiofragno.schema_diff`), makes a plan of every step
(:mod:`aiofragno.migration_plan`; a :class:`Migrator` records the steps, and
nothing runs while it plans), then runs that plan. The plan adds what is
missing: the internal settings table, database schemas, tables, columns and
indexes, and the internal columns of a table that lost them
(:mod:`aiofragno.internal_columns`) — so a later version of a schema migrates
forward with its data kept, and a column dropped by hand is added again
(self-healing). It changes what exists only as the declaration says
(:mod:`aiofragno.schema_changes`: renames, lossless widening, nullability,
defaults, drops, new indexes built online). Every other difference is
reported before anything runs: one that would make reads or writes fail (a
retyped or removed NOT NULL column, a changed index or reference) raises
:class:`~aiofragno.errors.MigrationError` listing them all, with every
declared change that cannot be made (NULLs and no backfill, duplicate keys
for a unique index); one that is safe to leave (a removed nullable column, a
plain index no longer declared) is logged as a warning and listed in
:attr:`MigrationResult.differences`. It is idempotent, holds a migration
lock (PostgreSQL advisory lock, MySQL ``GET_LOCK``, SQLite's write lock) so
concurrent migrators run one after the other, and runs in one transaction
where the database has transactional DDL (PostgreSQL, SQLite; PostgreSQL's
online index builds follow the commit, :func:`run_online`). On MySQL each
DDL statement commits on its own: progress is recorded step by step, a
failure says where it stopped, and the next run completes it
(:func:`run_plan`).

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

import contextlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from . import internal_columns, migration_lock, ownership
from .codec import ValueCodec
from .driver import CompiledQuery, DdlSpec, QueryCompiler
from .errors import Error, LockTimeout, MigrationError
from .introspection import Inspector, LiveTable
from .migration_plan import (
    MigrationPlan,
    PlanAction,
    PlanStep,
    Runner,
    database_state,
    refuse_stale,
    shown_value,
)
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
from .schema_changes import AllowDrop, TableChanges
from .schema_diff import (
    Differ,
    Difference,
    IndexChanged,
    MissingColumn,
    MissingExternalIdKey,
    MissingIndex,
    MissingInternalColumn,
    MissingTable,
    RemovedColumn,
    RemovedIndex,
    TypeChanged,
)
from .settings_table import SETTINGS_TABLE as SETTINGS_TABLE
from .settings_table import read_setting, write_setting
from .sql import Fragment, Identifier, sql, sql_using

if TYPE_CHECKING:
    from .session import Session

logger = logging.getLogger("aiofragno")


@dataclass
class MigrationResult:
    """What a migration did: the statements it ran (empty when the database
    already matched), the namespace's schema version afterwards, and the
    :class:`~aiofragno.migration_plan.MigrationPlan` it ran."""

    namespace: str
    version: int
    statements: list[str] = field(default_factory=list)
    # How the database differed from the declaration before the migration
    # (:mod:`aiofragno.schema_diff`): what it added or changed as declared,
    # and what it left because it is safe to leave (each also logged as a
    # warning).
    differences: list[Difference] = field(default_factory=list)
    plan: MigrationPlan | None = None
    # The differences that were declared changes, made by the plan.
    planned: list[Difference] = field(default_factory=list)

    @property
    def left(self) -> list[Difference]:
        """The differences the migration reported and left as they are."""
        return [d for d in self.differences if not d.additive and d not in self.planned]

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

    def create_table(
        self,
        physical: PhysicalTable,
        layout: Layout,
        *,
        name: str | None = None,
        extra: Sequence[str] = (),
    ) -> str:
        """CREATE TABLE for ``physical`` (called ``name``, already quoted,
        if given), with the column definitions ``extra`` after the declared."""
        table = physical.table
        lines = [
            f"{self.quote(INTERNAL_ID)} {self.spec.primary_key}",
            f"{self.quote(EXTERNAL_ID)} {self.spec.types['external_id']} NOT NULL UNIQUE",
            f"{self.quote(VERSION)} {self.spec.types['version']} NOT NULL DEFAULT 0",
            *(self.column(c) for c in table.columns.values()),
            *extra,
        ]
        for column in table.columns.values():
            if isinstance(column, Reference):
                fk = self.quote(layout.foreign_key_name(table.name, column.name))
                lines.append(
                    f"CONSTRAINT {fk} FOREIGN KEY ({self.quote(column.name)}) {self.references(column, layout)}"
                )
        body = ",\n  ".join(lines)
        target = name or self.name(physical.identifier)
        return f"CREATE TABLE {target} (\n  {body}\n){self.spec.table_options}"

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
    """Makes one migration's plan on one session (connection): the steps are
    recorded (:meth:`step`, :meth:`run`, :meth:`act`) and only run by
    :func:`run_plan`. Reads made while planning see the database as it is."""

    def __init__(
        self, session: Session, compile: Any, layout: Layout, ddl: Ddl, codec: ValueCodec
    ) -> None:
        self.session = session
        self.compile = compile
        self.layout = layout
        self.ddl = ddl
        self.codec = codec
        self.steps: list[PlanStep] = []
        # Why a change cannot be planned: raised together before anything runs.
        self.refusals: list[str] = []

    async def fetch_names(self, template: str, **params: Any) -> set[str]:
        result = await self.session.execute(self.compile(sql_using(template, **params)))
        return {row["name"] for row in result.rows}

    async def count(self, query: Fragment) -> int:
        return int((await self.session.execute(self.compile(query))).rows[0]["n"])

    def step(
        self,
        what: str,
        table: str | None = None,
        subject: str | None = None,
        *,
        locks: bool = False,
        rewrites: bool = False,
        destructive: bool = False,
        online: bool = False,
    ) -> None:
        """Start a step; :meth:`run` and :meth:`act` add to it."""
        self.steps.append(PlanStep(what, table, subject, (), locks, rewrites, destructive, online))

    def run(self, statement: str) -> None:
        """Add ``statement`` (DDL text) to the current step."""
        self._add(PlanAction(statement))

    def act(self, comment: str, runner: Runner) -> None:
        """Add a bound statement or a data check, shown as ``comment``."""
        self._add(PlanAction(comment, runner))

    def _add(self, action: PlanAction) -> None:
        if not self.steps:
            self.step("change")
        last = self.steps[-1]
        self.steps[-1] = replace(last, actions=(*last.actions, action))

    async def execute(self, action: PlanAction) -> None:
        await execute_action(self.session, self.ddl, action)

    async def plan_table(
        self,
        physical: PhysicalTable,
        live: LiveTable | None,
        differences: list[Difference],
        changes: TableChanges,
    ) -> None:
        """Plan the ``differences`` of ``physical`` from ``live`` (as it is
        after the renames of ``changes``, which are planned first)."""
        table = physical.table
        name = table.name
        kinds = {type(d) for d in differences}
        fresh = MissingTable in kinds
        changes.plan_renames()
        if fresh:
            self.step("create table", name)
            self.run(self.ddl.create_table(physical, self.layout))
        elif MissingInternalColumn in kinds:
            assert live is not None
            # (A rebuilt table is created from the declaration, without indexes.)
            fresh = internal_columns.heal(self, physical, live)
        if MissingExternalIdKey in kinds and not fresh:
            self.step("add unique key", name, EXTERNAL_ID, locks=True)
            internal_columns.unique_external_ids(self, physical)
        missing = {str(d.name) for d in differences if isinstance(d, MissingColumn)}
        for column in table.columns.values():
            if not fresh and column.name in missing:
                self.add_column(physical, column)
        if not fresh:
            await changes.plan_alterations()
        unindexed = {str(d.name) for d in differences if isinstance(d, MissingIndex)}
        for index in table.indexes.values():
            if fresh:
                self.step("create index", name, index.name)
                self.run(self.ddl.create_index(physical, index, self.layout))
            elif index.name in unindexed:
                await changes.plan_new_index(index)
        if not fresh:
            changes.plan_drops()

    def add_column(self, physical: PhysicalTable, column: Column) -> None:
        self.step("add column", physical.table.name, column.name, locks=True)
        for statement in self.ddl.add_column(physical, column, self.layout):
            self.run(statement)
        if column.default is not None and self.ddl.default(column) is None:
            # No portable literal: fill existing rows through a bound parameter.
            self.fill(physical, column, column.default, "its default")

    def fill(self, physical: PhysicalTable, column: Column, value: Any, what: str) -> None:
        """Write ``value`` (bound) into the rows whose ``column`` is NULL."""
        encoded = self.codec.encoder(column.kind, column.arg)(value)
        fill = sql(
            "UPDATE {t} SET {c} = {v} WHERE {c} IS NULL",
            t=physical.identifier,
            c=Identifier(column.name),
            v=encoded,
        )

        async def update() -> None:
            await self.session.execute(self.compile(fill))

        # The value is in the comment, so in the plan's id: a plan reviewed
        # with one value is refused for a declaration with another.
        self.act(
            f"-- UPDATE {physical} SET {column.name} = <{what} {shown_value(value)}, bound> "
            f"WHERE {column.name} IS NULL",
            update,
        )


async def execute_action(session: Session, ddl: Ddl, action: PlanAction) -> None:
    if action.runner is not None:
        await action.runner()
    else:
        await session.execute(CompiledQuery(ddl.escape(action.sql)))


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
    lock_timeout: float,
    transactional: bool,
    execute: bool = True,
    adopt: bool = False,
    allow_drop: AllowDrop = False,
    expected: MigrationPlan | None = None,
) -> MigrationResult:
    """Plan, and (``execute``) run, the migration of ``layout`` on ``session``
    (see the module docstring), under the migration lock; with ``expected``,
    only if the plan made now is that one. Steps built ``online`` outside
    the transaction are left to :func:`run_online` (the caller ends the
    transaction first). The caller provides the session and ends its
    transaction (``transactional``: the DDL is part of it)."""
    spec = ddl.spec
    async with migration_lock.held(session, compile, spec, lock_timeout):
        try:
            migrator, plan, result = await _plan(
                session, compile, layout, ddl, codec, adopt, allow_drop
            )
            if expected is not None:
                refuse_stale(expected, plan)
            if execute:
                await run_plan(
                    migrator, plan, transactional=transactional, lock_timeout=lock_timeout
                )
            return result
        except MigrationError:
            raise
        except LockTimeout as exc:
            raise migration_lock.timed_out(lock_timeout, exc, layout.namespace) from exc
        except Error as exc:
            raise MigrationError(f"migrating namespace {layout.namespace!r} failed: {exc}") from exc


async def _plan(
    session: Session,
    compile: Any,
    layout: Layout,
    ddl: Ddl,
    codec: ValueCodec,
    adopt: bool,
    allow_drop: AllowDrop,
) -> tuple[Migrator, MigrationPlan, MigrationResult]:
    spec = ddl.spec
    for table in layout.schema.tables.values():  # (a type the database lacks: before any DDL)
        for column in table.columns.values():
            ddl.column_type(column)
    migrator = Migrator(session, compile, layout, ddl, codec)
    inspector = Inspector(session, compile, spec)
    settings = await migrator.fetch_names(spec.columns_sql, schema=None, table=SETTINGS_TABLE)
    tables = [layout.table(table.name) for table in tables_in_dependency_order(layout.schema)]
    live: dict[str, LiveTable | None] = {}
    moved: dict[str, PhysicalTable] = {}  # declared name -> where it is now, to be renamed
    for physical in tables:
        live[physical.table.name] = await _live_table(
            migrator, inspector, physical, moved, recorded=bool(settings)
        )
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
    renamed = {former.key: p for p in tables if (former := moved.get(p.table.name))}
    changes = {
        p.table.name: TableChanges(
            migrator, p, live[p.table.name], allow_drop, moved.get(p.table.name), renamed
        )
        for p in tables
    }
    differences = _drift(layout, ddl, inspector, tables, changes)
    found = [d for per_table in differences.values() for d in per_table]
    if not settings:
        migrator.step("create aiofragno table", None, SETTINGS_TABLE)
        migrator.run(settings_table_sql(ddl))
    await _internal_tables(migrator, has_settings=bool(settings))
    for db_schema in layout.db_schemas:
        if spec.create_schema_sql and not await _schema_exists(migrator, db_schema):
            statement = spec.create_schema_sql.replace("{schema}", ddl.name(Identifier(db_schema)))
            migrator.step("create database schema", None, db_schema)
            migrator.run(statement)
    for physical in tables:
        name = physical.table.name
        await migrator.plan_table(physical, changes[name].live, differences[name], changes[name])
    planned = [d for c in changes.values() for d in c.handled]
    _refuse(layout, [d for d in found if d not in planned], migrator.refusals)
    stored = await _stored_version(migrator, has_settings=bool(settings))
    version = _plan_records(migrator, pending, stored)
    state = database_state(sorted(live.items()), sorted(settings), stored)
    # Steps built outside the transaction run after its commit: listed so.
    outside = [s.online and spec.online_outside_transaction for s in migrator.steps]
    steps = [s for s, o in zip(migrator.steps, outside, strict=True) if not o]
    steps += [s for s, o in zip(migrator.steps, outside, strict=True) if o]
    plan = MigrationPlan(layout.namespace, version, state, tuple(steps))
    planned = [d for c in changes.values() for d in c.handled]
    return (
        migrator,
        plan,
        MigrationResult(
            layout.namespace, version, plan.statements, found, plan=plan, planned=planned
        ),
    )


async def _live_table(
    migrator: Migrator,
    inspector: Inspector,
    physical: PhysicalTable,
    moved: dict[str, PhysicalTable],
    *,
    recorded: bool,
) -> LiveTable | None:
    """``physical`` as the database has it — or, when it is declared
    ``renamed_from`` a table of the namespace that is still there under its
    former name, that table (noted in ``moved``, to be renamed)."""
    live = await inspector.table(physical.schema, physical.name)
    former = migrator.layout.former(physical.table)
    if former is None:
        return live
    was = await inspector.table(former.schema, former.name)
    if was is None:
        return live
    where = f"table {physical.table.name!r} is declared renamed_from={former.table.renamed_from!r}"
    if live is not None:
        migrator.refusals.append(
            f"{where}, but the database has both {former} and {physical}; drop one of them "
            "(keeping the data you need), then migrate again"
        )
        return live
    key = ownership.owner_key(migrator.layout.namespace, str(former.table.renamed_from))
    record = await read_setting(migrator.session, migrator.compile, key) if recorded else None
    if record is None or json.loads(record).get("name", "").lower() != former.name.lower():
        migrator.refusals.append(
            f"{where}: {former} is not that table of namespace {migrator.layout.namespace!r} "
            f"(no record {key!r} of it in {SETTINGS_TABLE}); aiofragno renames only its own tables"
        )
        return live
    moved[physical.table.name] = former
    return was


async def run_plan(
    migrator: Migrator, plan: MigrationPlan, *, transactional: bool, lock_timeout: float
) -> None:
    """Run the steps of ``plan`` not built online outside the transaction.
    Without transactional DDL (MySQL), progress is recorded after each step
    (settings key ``<namespace>.migration_progress``) and a failure says
    which step stopped the migration: the steps before it stay applied, and
    migrating again plans (and runs) only what is left."""
    spec = migrator.ddl.spec
    steps = [s for s in plan.steps if not (s.online and spec.online_outside_transaction)]
    key = f"{plan.namespace}.migration_progress"
    for number, step in enumerate(steps, 1):
        try:
            for action in step.actions:
                await migrator.execute(action)
        except Error as exc:
            if transactional:
                raise
            progress = _progress(plan, number - 1, len(steps), f"failed at: {step.title}")
            with contextlib.suppress(Error):
                await write_setting(migrator.session, migrator.compile, key, progress)
            why = exc
            if isinstance(exc, LockTimeout):
                why = migration_lock.timed_out(lock_timeout, exc, plan.namespace)
            raise MigrationError(
                f"migrating namespace {plan.namespace!r} stopped at step {number} of "
                f"{len(steps)} ({step.title}): {why}. {_applied(number - 1)} "
                f"(this database has no transactional DDL; recorded in {SETTINGS_TABLE} under "
                f"{key!r}); fix the cause and migrate again: it carries on from there"
            ) from exc
        # (The records come last; the final progress is written after them.)
        if not transactional and (step.what != "record" or number == len(steps)):
            await write_setting(
                migrator.session, migrator.compile, key, _progress(plan, number, len(steps), "")
            )


def _applied(steps: int) -> str:
    return f"Steps 1 to {steps} are applied" if steps else "No step was applied"


def _progress(plan: MigrationPlan, done: int, of: int, note: str) -> str:
    return json.dumps({"plan": plan.id, "done": done, "of": of, "note": note})


async def run_online(session: Session, ddl: Ddl, plan: MigrationPlan, lock_timeout: float) -> None:
    """Run the steps of ``plan`` built online outside any transaction
    (PostgreSQL's ``CREATE INDEX CONCURRENTLY``), holding the online builds'
    lock, which the caller holds since before the migration's transaction
    (:func:`~aiofragno.migration_lock.held_outside_transaction`). A build
    that fails is cleaned up: the invalid index it leaves is dropped, and
    the error says why it failed."""
    spec = ddl.spec
    steps = [s for s in plan.steps if s.online and spec.online_outside_transaction]
    if not steps:
        return
    try:
        await _build_online(session, ddl, plan, steps, lock_timeout)
    except MigrationError:
        raise
    except LockTimeout as exc:
        raise migration_lock.timed_out(lock_timeout, exc, plan.namespace) from exc
    except Error as exc:
        raise MigrationError(
            f"migrating namespace {plan.namespace!r}: the online index builds failed (the "
            f"steps before them are applied): {exc}; migrate again"
        ) from exc


async def _build_online(
    session: Session,
    ddl: Ddl,
    plan: MigrationPlan,
    steps: list[PlanStep],
    lock_timeout: float,
) -> None:
    for step in steps:
        try:
            for action in step.actions:
                await execute_action(session, ddl, action)
        except Error as exc:
            # (An online build starts by dropping what an interrupted one
            # left: the same cleans up after this one.)
            cleanup = step.actions[0].runner
            if cleanup is not None:
                with contextlib.suppress(Error):
                    await cleanup()
            if isinstance(exc, LockTimeout):
                raise migration_lock.timed_out(lock_timeout, exc, plan.namespace) from exc
            raise MigrationError(
                f"migrating namespace {plan.namespace!r}: building {step.title} failed "
                f"(the invalid index it left was dropped; the steps before it are "
                f"applied): {exc}; fix the cause and migrate again"
            ) from exc


def _drift(
    layout: Layout,
    ddl: Ddl,
    inspector: Inspector,
    tables: list[PhysicalTable],
    changes: dict[str, TableChanges],
) -> dict[str, list[Difference]]:
    """Each table's differences from its live table (as renamed); the
    declared changes among them are claimed by ``changes``; a warning for
    those migrate() leaves."""
    differ = Differ(
        layout,
        dict(ddl.spec.types),
        inspector.type_map,
        inspector.catalog,
        column_type=ddl.column_type,
        default_literal=ddl.default,
        backslash_escapes=ddl.spec.backslash_escapes,
    )
    differences = {p.table.name: differ.diff_table(p, changes[p.table.name].live) for p in tables}
    for name, found in differences.items():
        changes[name].claim(found)
    handled = {d for c in changes.values() for d in c.handled}
    for difference in (d for found in differences.values() for d in found):
        if not (difference.additive or difference.blocking or difference in handled):
            logger.warning(
                "migrating namespace %r, left as it is: %s", layout.namespace, difference
            )
    return differences


def _refuse(layout: Layout, differences: list[Difference], refusals: list[str]) -> None:
    """:class:`MigrationError` listing every difference migrate() does not
    make (``differences`` less those planned), every column it cannot add,
    and every declared change it cannot make (``refusals``), before
    anything runs."""
    refused = [d for d in differences if d.blocking or _unaddable(layout, d)]
    if not refused and not refusals:
        return
    listed = "\n  ".join([*(_unaddable(layout, d) or _explained(d) for d in refused), *refusals])
    error = MigrationError(
        f"migrate() changed nothing in namespace {layout.namespace!r}; it does not make "
        f"these changes on its own:\n  {listed}\nChange the declaration (declare the change: "
        "see docs/schemas.md, Evolving a schema), or the database by hand (keeping the data "
        "you need), then migrate again."
    )
    error.differences = tuple(refused)
    raise error


def _explained(difference: Difference) -> str:
    """``difference`` and the declared way to make it, where there is one."""
    if isinstance(difference, TypeChanged):
        how = (
            "only lossless widening is done in place; for another type add a new column, "
            "backfill it, switch to it, then af.Dropped the old one"
        )
    elif isinstance(difference, RemovedColumn | RemovedIndex):
        how = "to drop it, declare af.Dropped(...) or pass allow_drop="
    elif isinstance(difference, IndexChanged):
        how = "declare the new index under a new name and af.Dropped(..., index=True) the old"
    else:
        return str(difference)
    return f"{difference} ({how})"


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


async def _internal_tables(migrator: Migrator, *, has_settings: bool) -> None:
    """The bookkeeping tables (:mod:`aiofragno.outbox.tables`), and the
    outbox's version counter row (pre-created so that reserving a version
    always updates an existing row)."""
    spec, quote = migrator.ddl.spec, migrator.ddl.quote
    for table, statement in outbox_tables.create_statements(spec, quote):
        columns = await migrator.fetch_names(spec.columns_sql, schema=None, table=table)
        if not columns:
            migrator.step("create aiofragno table", None, table)
            migrator.run(statement)
            if table == outbox_tables.OUTBOX:
                migrator.run(outbox_tables.uow_index_statement(quote))
        elif table == outbox_tables.OUTBOX:
            await _upgrade_outbox(migrator, columns)
    await _outbox_ticks(migrator)
    if (
        not has_settings
        or await read_setting(migrator.session, migrator.compile, outbox_tables.VERSION_KEY) is None
    ):
        migrator.step("record", None, outbox_tables.VERSION_KEY)
        migrator.act(
            f"-- {outbox_tables.VERSION_KEY}: after the newest outbox entry, unless recorded",
            lambda: _outbox_counter(migrator),
        )


async def _outbox_counter(migrator: Migrator) -> None:
    if await read_setting(migrator.session, migrator.compile, outbox_tables.VERSION_KEY):
        return
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


async def _upgrade_outbox(migrator: Migrator, columns: set[str]) -> None:
    """Bring an outbox table made by an earlier layout up to date: the
    ``nonce`` column, and a unique index on ``uow_id`` in place of the plain one."""
    spec, quote = migrator.ddl.spec, migrator.ddl.quote
    if "nonce" not in columns:
        migrator.step("add column", None, f"{outbox_tables.OUTBOX}.nonce", locks=True)
        migrator.run(outbox_tables.nonce_column_statement(spec, quote))
    indexes = await migrator.fetch_names(spec.indexes_sql, schema=None, table=outbox_tables.OUTBOX)
    if outbox_tables.UOW_INDEX not in indexes:
        await _refuse_duplicate_keys(migrator)
        migrator.step("create index", None, outbox_tables.UOW_INDEX, locks=True)
        migrator.run(outbox_tables.uow_index_statement(quote))
    if outbox_tables.OLD_UOW_INDEX in indexes:
        migrator.step("drop index", None, outbox_tables.OLD_UOW_INDEX, locks=True)
        migrator.run(outbox_tables.old_uow_index_drop_statement(spec, quote))


async def _outbox_ticks(migrator: Migrator) -> None:
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
    migrator.step("add outbox ticks", None, outbox_tables.OUTBOX)
    for statement in spec.outbox_ticks_sql:
        migrator.run(statement)


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


async def _stored_version(migrator: Migrator, *, has_settings: bool) -> tuple[str | None, int]:
    """The namespace's recorded schema hash and version."""
    if not has_settings:
        return None, 0
    ns, session, compile = migrator.layout.namespace, migrator.session, migrator.compile
    stored_hash = await read_setting(session, compile, f"{ns}.schema_hash")
    version_text = await read_setting(session, compile, f"{ns}.schema_version")
    return stored_hash, int(version_text or 0)


def _plan_records(
    migrator: Migrator, pending: ownership.Pending, stored: tuple[str | None, int]
) -> int:
    """Plan recording the tables' owners and the schema version; the version
    the namespace is at afterwards. Only a changed declaration is a new
    version: self-healing is not."""
    layout = migrator.layout
    ns, session, compile = layout.namespace, migrator.session, migrator.compile
    stored_hash, version = stored
    fingerprint = layout.schema.fingerprint
    if pending:
        migrator.step("record", None, "table owners")
        migrator.act(
            f"-- {SETTINGS_TABLE}: record the tables of namespace {ns}",
            lambda: ownership.record(session, compile, pending),
        )
    if stored_hash == fingerprint:
        return version
    version += 1

    async def record() -> None:
        await write_setting(session, compile, f"{ns}.schema_version", str(version))
        await write_setting(session, compile, f"{ns}.schema_hash", fingerprint)

    migrator.step("record", None, "schema version")
    # (The declaration's hash in the comment, so in the plan's id: a plan is
    # applied for the declaration it was made for, even where another would
    # change nothing else — a default the client writes, say.)
    migrator.act(
        f"-- {SETTINGS_TABLE}: {ns}.schema_version = {version}, {ns}.schema_hash = {fingerprint}",
        record,
    )
    return version
