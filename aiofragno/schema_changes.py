"""Declared changes of existing tables, planned step by step (expand and
contract): renames, widened types, nullability, defaults, new indexes built
online, and drops.

Nothing here is guessed from names: a column or index is renamed only when
its declaration says ``renamed_from=``, dropped only when the table declares
``af.Dropped(...)`` or the migration is given ``allow_drop=``. Of the
differences :mod:`aiofragno.schema_diff` finds, :meth:`TableChanges.claim`
takes those that are such changes; the others stay what they were (added,
left, or refused).

* Types are only widened in place, losslessly: smallint → integer →
  bigint, varchar(n) → varchar(m > n), string or text. Anything else goes
  through a new column, a backfill and a switch (docs/schemas.md).
* A column becomes NOT NULL only when no row holds NULL, or after the rows
  that do are given the column's declared ``backfill`` value.
* A new index on an existing table is built online where the database can
  (PostgreSQL ``CREATE INDEX CONCURRENTLY``, outside the transaction;
  MariaDB ``ALGORITHM=INPLACE, LOCK=NONE``); a new unique index is refused
  up front, naming duplicate values, if rows already share a key.
* Where a column cannot be altered in place (SQLite), the table is rebuilt
  as SQLite documents it: a new table, rows copied, the old one dropped, the
  new one renamed, its indexes made again, foreign keys checked — in the
  migration's transaction, with foreign key enforcement off meanwhile.
* A column keeps its foreign key when it is renamed, and a dropped one
  takes its key with it: in the statement that drops it, or (SQLite, which
  cannot drop a key in place) by a rebuild without the key first.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .errors import ValidationError
from .internal_columns import check_foreign_keys, kept_constraints, live_definition
from .introspection import LiveColumn, LiveIndex, LiveReference, LiveTable
from .migration_plan import PlanAction
from .ownership import owner_key
from .schema import EXTERNAL_ID, INTERNAL_ID, VERSION, Column, Index
from .schema_diff import (
    EXTERNAL_ID_INDEX,
    DefaultChanged,
    Difference,
    NullabilityChanged,
    RemovedColumn,
    RemovedIndex,
    TypeChanged,
)
from .settings_table import SETTINGS_TABLE, delete_setting, write_setting
from .sql import Fragment, Identifier, sql

if TYPE_CHECKING:
    from .migrate import Migrator
    from .naming import PhysicalTable

# True: every column and index a declared table no longer has may be
# dropped; or the "table.column" / "table.index" names that may.
AllowDrop = bool | Collection[str]

_INTEGERS = {"smallint": 1, "integer": 2, "bigint": 3}
# What a string column holds at most on the database that limits it (MySQL).
_STRING_CHARS = 255
# Examples of duplicate keys named when a unique index is refused.
_EXAMPLES = 5


def widening(live: LiveColumn, column: Column) -> str | None:
    """``"widen_integer"`` or ``"widen_text"`` when ``column``'s type holds
    every value of ``live``'s without loss; None otherwise."""
    for stored in live.types:
        kind, _, size = stored.partition("(")
        length = int(size.rstrip(")")) if size.rstrip(")").isdigit() else None
        if kind in _INTEGERS and column.kind in _INTEGERS:
            if _INTEGERS[kind] < _INTEGERS[column.kind]:
                return "widen_integer"
        elif kind == "varchar" and length is not None:
            if column.kind == "text" or (
                column.kind == "varchar" and isinstance(column.arg, int) and column.arg > length
            ):
                return "widen_text"
            if column.kind == "string" and length <= _STRING_CHARS:
                return "widen_text"
        elif kind == "string" and column.kind == "text":
            return "widen_text"
    return None


def check_allow_drop(allow_drop: object) -> None:
    """``allow_drop`` is a bool or a collection of ``"table.name"`` strings."""
    if isinstance(allow_drop, bool):
        return
    if (
        isinstance(allow_drop, str | bytes)
        or not isinstance(allow_drop, Collection)
        or not all(isinstance(n, str) and n.count(".") == 1 for n in allow_drop)
    ):
        raise ValidationError(
            "allow_drop must be True, False or a collection of 'table.name' strings (the "
            f"columns and indexes that may be dropped), got {allow_drop!r:.100}"
        )


class TableChanges:
    """The declared changes of one table whose live form is ``original``."""

    def __init__(
        self,
        migrator: Migrator,
        physical: PhysicalTable,
        original: LiveTable | None,
        allow_drop: AllowDrop,
        former: PhysicalTable | None = None,
        renamed: Mapping[tuple[str, str], PhysicalTable] | None = None,
    ) -> None:
        self.migrator = migrator
        # Where the table is now, when it is to be renamed to ``physical``;
        # and every table so renamed, by its former key (references follow).
        self.former = former
        self.renamed = renamed or {}
        self.physical = physical
        self.table = physical.table
        self.original = original
        self.allow_drop = allow_drop
        self.handled: list[Difference] = []
        # (kind, name in the database, new name, the declared index)
        self.renames: list[tuple[str, str, str, Index | None]] = []
        # declared column name -> its name in the database now
        self.live_names: dict[str, str] = {}
        self.alterations: dict[str, set[str]] = {}
        # Columns whose NULLs get the declared backfill before NOT NULL.
        self.backfills: set[str] = set()
        self.drops: list[Difference] = []
        self.live = None if original is None else self._renamed(original)

    # -- renames ------------------------------------------------------------

    def _renamed(self, live: LiveTable) -> LiveTable:
        """``live`` as it is once the declared renames are made."""
        columns = list(live.columns)
        new_names: dict[str, str] = {}
        for column in self.table.columns.values():
            self.live_names[column.name] = column.name
            old = column.renamed_from
            have = None if old is None else live.column(old)
            if have is None or old is None:
                continue
            if live.column(column.name) is not None:
                self._refuse(
                    f"column {column.name!r} is declared renamed_from={old!r}, but the database "
                    f"has both; drop one of them by hand (or af.Dropped the old), then migrate"
                )
                continue
            columns[columns.index(have)] = replace(have, name=column.name)
            new_names[have.name.lower()] = column.name
            self.live_names[column.name] = have.name
            self.renames.append(("column", have.name, column.name, None))
        indexes = [
            replace(i, columns=tuple(c and new_names.get(c.lower(), c) for c in i.columns))
            for i in live.indexes
        ]
        layout = self.migrator.layout
        by_name = {i.name.lower(): n for n, i in enumerate(indexes)}
        # (Index names hold the table's: a renamed table's are renamed too.)
        old_table = self.table.name if self.former is None else self.former.table.renamed_from
        assert old_table is not None
        ours: list[tuple[str, str, Index | None]] = [(EXTERNAL_ID_INDEX, EXTERNAL_ID_INDEX, None)]
        ours += [(i.renamed_from or i.name, i.name, i) for i in self.table.indexes.values()]
        if self.former is not None:
            # (And those no longer declared: named after the table's new name,
            # the diff finds them as the table's, to drop or to report.)
            ours += [(n, n, None) for n in self._undeclared_indexes(indexes, old_table, ours)]
        for was, name, index in ours:
            old = layout.index_name(old_table, was)
            new = layout.index_name(self.table.name, name)
            at = by_name.get(old.lower())
            if at is None or old == new:
                continue
            if new.lower() in by_name:
                self._refuse(
                    f"index {name!r} is to be renamed from {old!r}, but the database has both; "
                    "drop one of them, then migrate"
                )
                continue
            self.renames.append(("index", indexes[at].name, new, index))
            indexes[at] = replace(indexes[at], name=new)
        references = tuple(self._followed(r, new_names) for r in live.references)
        return replace(live, columns=tuple(columns), indexes=tuple(indexes), references=references)

    def _undeclared_indexes(
        self, indexes: Sequence[LiveIndex], table: str, declared: Sequence[tuple[str, str, Any]]
    ) -> list[str]:
        """The names, as declared, of the indexes of ``table`` (named as its
        own: see :meth:`Layout.index_name`) that ``declared`` (was, name, _)
        does not rename."""
        layout = self.migrator.layout
        prefix = layout.naming.index(layout.namespace, table, "").lower()
        taken = {layout.index_name(table, was).lower() for was, _, _ in declared}
        found = []
        for index in indexes:
            name = index.name
            if not name.lower().startswith(prefix) or name.lower() in taken:
                continue
            was = name[len(prefix) :]
            if layout.index_name(table, was).lower() == name.lower():  # (not shortened)
                found.append(was)
        return found

    def _followed(self, reference: LiveReference, new_names: Mapping[str, str]) -> LiveReference:
        """``reference`` as it is once the declared renames are made: its
        columns renamed (``new_names``: old name in lower case -> new; every
        database keeps a key on a column it renames), and the table it points
        to."""
        columns = tuple(new_names.get(c.lower(), c) for c in reference.columns)
        reference = replace(reference, columns=columns)
        for key, physical in self.renamed.items():
            schema, name = key
            if reference.to_table.lower() == name and (
                reference.to_schema is None
                or physical.schema is None
                or reference.to_schema.lower() == schema
            ):
                return replace(reference, to_table=physical.name)
        return reference

    def plan_renames(self) -> None:
        m, ddl = self.migrator, self.migrator.ddl
        table = ddl.name(self.physical.identifier)
        if self.former is not None:
            was = str(self.former.table.renamed_from)
            # (No table: the title reads "rename table old -> new".)
            m.step("rename table", None, f"{was} -> {self.table.name}", locks=True)
            m.run(
                f"ALTER TABLE {ddl.name(self.former.identifier)} RENAME TO {ddl.quote(self.physical.name)}"
            )
            key = owner_key(m.layout.namespace, was)
            m.act(
                f"-- {SETTINGS_TABLE}: delete {key} (the table is recorded under its new name)",
                _deleter(m, key),
            )
        for kind, old, new, index in self.renames:
            m.step(f"rename {kind}", self.table.name, f"{old} -> {new}", locks=True)
            if kind == "column":
                m.run(f"ALTER TABLE {table} RENAME COLUMN {ddl.quote(old)} TO {ddl.quote(new)}")
            elif ddl.spec.rename_index_sql is not None:
                m.run(
                    ddl.spec.rename_index_sql.replace("{index}", self._index(old))
                    .replace("{table}", table)
                    .replace("{new}", ddl.quote(new))
                )
            else:
                for statement in self._drop_index_sql(old):
                    m.run(statement)
                if index is not None:
                    m.run(ddl.create_index(self.physical, index, m.layout))
                else:  # (the unique index a healed table's ids got)
                    m.run(
                        f"CREATE UNIQUE INDEX {ddl.quote(new)} ON {table} ({ddl.quote(EXTERNAL_ID)})"
                    )

    # -- what the differences are -----------------------------------------

    def claim(self, differences: Iterable[Difference]) -> None:
        """Take the differences of this table that are declared changes."""
        declared = self.table.columns
        for d in differences:
            column = declared.get(str(d.name)) if d.name is not None else None
            live = None if column is None or self.live is None else self.live.column(column.name)
            change: str | None = None
            if column is not None and live is not None:
                if isinstance(d, TypeChanged):
                    change = widening(live, column)
                elif isinstance(d, NullabilityChanged):
                    change = "null" if column.nullable else "not_null"
                elif isinstance(d, DefaultChanged):
                    has_default = self.migrator.ddl.default(column) is not None
                    change = "set_default" if has_default else "drop_default"
            if change is not None and column is not None:
                self.alterations.setdefault(column.name, set()).add(change)
                self.handled.append(d)
            elif isinstance(d, RemovedColumn | RemovedIndex) and self._may_drop(d):
                self.drops.append(d)
                self.handled.append(d)

    def _may_drop(self, d: Difference) -> bool:
        name = str(d.name)
        if isinstance(d, RemovedColumn):
            declared = {n.lower() for n in self.table.dropped}
        else:
            layout = self.migrator.layout
            declared = {
                layout.index_name(self.table.name, n).lower() for n in self.table.dropped_indexes
            }
        if name.lower() in declared or self.allow_drop is True:
            return True
        allowed = () if isinstance(self.allow_drop, bool) else self.allow_drop
        layout, prefix = self.migrator.layout, f"{self.table.name.lower()}."
        names = {a.lower()[len(prefix) :] for a in allowed if a.lower().startswith(prefix)}
        # (An index by its name in the database, or as it would be declared.)
        if isinstance(d, RemovedIndex):
            names |= {layout.index_name(self.table.name, n).lower() for n in names}
        return name.lower() in names

    # -- alterations ----------------------------------------------------------

    async def plan_alterations(self) -> None:
        """Plan the claimed column changes: in place where the dialect has a
        statement for each, else by rebuilding the table — as also where a
        column to drop has a foreign key the database cannot drop in place
        (:attr:`DdlSpec.drop_foreign_key_sql`: SQLite), which the rebuilt
        table is made without."""
        unkeyed = [] if self.migrator.ddl.spec.drop_foreign_key_sql else self._keys_of_drops()
        if not self.alterations and not unkeyed:
            return
        templates = self.migrator.ddl.spec.alter_column_sql
        for name, changes in self.alterations.items():
            if "not_null" in changes:
                await self._check_no_nulls(self.table.columns[name])
        if not unkeyed and all(
            _template(c) in templates for cs in self.alterations.values() for c in cs
        ):
            for name, changes in self.alterations.items():
                self._alter_in_place(self.table.columns[name], changes)
        else:
            self._rebuild(unkeyed)

    async def _check_no_nulls(self, column: Column) -> None:
        m = self.migrator
        nulls = await m.count(
            sql(
                "SELECT COUNT(*) AS n FROM {t} WHERE {c} IS NULL",
                t=self._now.identifier,
                c=Identifier(self.live_names[column.name]),
            )
        )
        if nulls and column.backfill is None:
            self._refuse(
                f"column {column.name!r} cannot become NOT NULL: {nulls} rows hold NULL; declare "
                "backfill=<value> on the column (written into those rows first), or give them "
                "values, then migrate again"
            )
        elif nulls:
            self.backfills.add(column.name)

    def _alter_in_place(self, column: Column, changes: set[str]) -> None:
        m, ddl = self.migrator, self.migrator.ddl
        spec = ddl.spec
        rewrites = bool(changes & spec.rewriting_changes)
        m.step("alter column", self.table.name, column.name, locks=True, rewrites=rewrites)
        if column.name in self.backfills:
            m.fill(self.physical, column, column.backfill, "its backfill")
        default = ddl.default(column)
        statements: list[str] = []
        for change in sorted(changes, key=_ORDER.index):
            template = spec.alter_column_sql.get(_template(change))
            if template is None:
                continue
            statement = (
                template.replace("{table}", ddl.name(self.physical.identifier))
                .replace("{column}", ddl.quote(column.name))
                .replace("{type}", ddl.column_type(column))
                .replace("{definition}", ddl.column(column))
                .replace("{default}", default or "NULL")
            )
            if statement not in statements:  # (MySQL restates the whole column each time)
                statements.append(statement)
        for statement in statements:
            m.run(statement)

    def _rebuild(self, unkeyed: Collection[LiveReference] = ()) -> None:
        """SQLite's documented table rebuild (see the module docstring). The
        columns the declaration does not have are kept as they are, with
        their foreign keys and UNIQUE constraints — but for ``unkeyed``, the
        keys of the columns the migration drops (after the rebuild, by ``DROP
        COLUMN``, which a key on the column would refuse)."""
        m, ddl, live = self.migrator, self.migrator.ddl, self.live
        assert live is not None
        quote = ddl.quote
        unkeyed_columns = {c.lower() for k in unkeyed for c in k.columns}
        dropped = [n for key, n in self._dropped_columns().items() if key in unkeyed_columns]
        subject = ", ".join([*self.alterations, *(f"{n} (reference dropped)" for n in dropped)])
        m.step("rebuild table", self.table.name, subject, locks=True, rewrites=True)
        for name in sorted(self.backfills):
            column = self.table.columns[name]
            m.fill(self.physical, column, column.backfill, "its backfill")
        ours = {n.lower() for n in (INTERNAL_ID, EXTERNAL_ID, VERSION, *self.table.columns)}
        kept = [c for c in live.columns if c.name.lower() not in ours]
        left = {c.name.lower() for c in kept}
        constraints, problems = kept_constraints(ddl, live, left, unkeyed)
        for problem in problems:
            self._refuse(f"cannot rebuild the table ({subject}): {problem}")
        extra = [*(live_definition(ddl.quote, c) for c in kept), *constraints]
        new = quote(f"{self.physical.name}__aiofragno_new")
        m.run(ddl.create_table(self.physical, m.layout, name=new, extra=extra))
        names = ", ".join(
            quote(n)
            for n in (
                INTERNAL_ID,
                EXTERNAL_ID,
                VERSION,
                *self.table.columns,
                *(c.name for c in kept),
            )
        )
        table = ddl.name(self.physical.identifier)
        m.run(f"INSERT INTO {new} ({names}) SELECT {names} FROM {table}")
        m.run(f"DROP TABLE {table}")
        m.run(f"ALTER TABLE {new} RENAME TO {quote(self.physical.name)}")
        for index in live.indexes:
            if index.primary or index.name.lower().startswith("sqlite_autoindex"):
                continue
            if None in index.columns:
                self._refuse(
                    f"cannot rebuild the table ({subject}): its index {index.name!r} is on an "
                    "expression; drop it first, then migrate"
                )
                continue
            m.run(_create_index(ddl.quote, table, index))
        check_foreign_keys(m, self.table.name)

    # -- indexes ----------------------------------------------------------------

    async def plan_new_index(self, index: Index) -> None:
        """A new index on the existing table: duplicates refused first (a
        unique one), built online where the database can."""
        m, ddl = self.migrator, self.migrator.ddl
        spec = ddl.spec
        if index.unique:
            await self._check_duplicates(index)
        name = m.layout.index_name(self.table.name, index.name)
        if spec.online_index_sql is None:
            m.step("create index", self.table.name, index.name, locks=True)
            m.run(ddl.create_index(self.physical, index, m.layout))
            return
        m.step("create index", self.table.name, index.name, online=True)
        if spec.invalid_index_sql is not None:
            m.act(
                f"-- drop index {name} if an interrupted build left it invalid",
                lambda: self._drop_invalid(name),
            )
        m.run(
            spec.online_index_sql.replace("{unique}", "UNIQUE " if index.unique else "")
            .replace("{index}", ddl.quote(name))
            .replace("{table}", ddl.name(self.physical.identifier))
            .replace("{columns}", ", ".join(ddl.quote(c) for c in index.columns))
        )

    async def _drop_invalid(self, name: str) -> None:
        m, spec = self.migrator, self.migrator.ddl.spec
        assert spec.invalid_index_sql is not None and spec.drop_index_online_sql is not None
        query = sql(spec.invalid_index_sql, schema=self.physical.schema, index=name)
        if (await m.session.execute(m.compile(query))).rows:
            drop = spec.drop_index_online_sql.replace("{index}", self._index(name))
            await m.execute(PlanAction(drop))

    async def _check_duplicates(self, index: Index) -> None:
        m = self.migrator
        columns = [Identifier(self.live_names.get(c, c)) for c in index.columns]
        listed = _join([sql("{c}", c=c) for c in columns])
        query = sql(
            "SELECT {cols}, COUNT(*) AS n FROM {t} WHERE {present} GROUP BY {cols} "
            "HAVING COUNT(*) > 1 ORDER BY COUNT(*) DESC LIMIT {limit}",
            cols=listed,
            t=self._now.identifier,
            present=_join([sql("{c} IS NOT NULL", c=c) for c in columns], " AND "),
            limit=_EXAMPLES,
        )
        rows = (await m.session.execute(m.compile(query))).rows
        if rows:
            examples = "; ".join(
                ", ".join(f"{c}={row[self.live_names.get(c, c)]!r}" for c in index.columns)
                + f" ({row['n']} rows)"
                for row in rows
            )
            self._refuse(
                f"unique index {index.name!r} of table {self.table.name!r} cannot be built: rows "
                f"share its key, e.g. {examples}; make them unique, then migrate again"
            )

    # -- drops ------------------------------------------------------------------

    def plan_drops(self) -> None:
        """Drop the declared (or allowed) indexes, then columns; each drop is
        recorded in the settings table. The foreign keys on a column to drop
        are dropped in the column's own statement: without transactional DDL
        (MySQL) the key and the column go together or not at all. Only where
        the database keeps an index for each key and an index to drop may be
        that key's, the key goes with the index, in its statement (then the
        column, no longer checked, goes in a later one; should that fail,
        migrating again goes on from there). Where the database cannot drop
        a key in place, the table was rebuilt without it
        (:meth:`plan_alterations`)."""
        m, ddl = self.migrator, self.migrator.ddl
        table = ddl.name(self.physical.identifier)
        ordered = sorted(self.drops, key=lambda d: isinstance(d, RemovedColumn))
        # (Run before the first index drop: the foreign keys that would lose their index.)
        keep_keys = self._foreign_key_indexes(
            {str(d.name).lower() for d in ordered if not isinstance(d, RemovedColumn)},
            set(self._dropped_columns()),
        )
        loose_keys = self._key_drops()
        for d in ordered:
            name, column = str(d.name), isinstance(d, RemovedColumn)
            what = "column" if column else "index"
            rewrites = column and "drop_column" in ddl.spec.rewriting_changes
            m.step(
                f"drop {what}",
                self.table.name,
                name,
                locks=True,
                rewrites=rewrites,
                destructive=column,
            )
            if column:
                clauses = [*_taken(loose_keys, name), f"DROP COLUMN {ddl.quote(name)}"]
                m.run(f"ALTER TABLE {table} {', '.join(clauses)}")
            else:
                for statement in keep_keys:
                    m.run(statement)
                keep_keys = []
                keys = _taken(loose_keys, self._key_index_column(name))
                for statement in self._drop_index_sql(name, keys):
                    m.run(statement)
            key = f"{m.layout.namespace}.dropped:{self.table.name}.{name}"
            record = json.dumps({"kind": what, "was": d.live}, ensure_ascii=False)
            m.act(f"-- {SETTINGS_TABLE}: {key} = {record}", _recorder(m, key, record))

    def _foreign_key_indexes(self, dropped: set[str], dropped_columns: set[str]) -> list[str]:
        """Where the database keeps an index for each foreign key
        (:attr:`DdlSpec.foreign_keys_need_an_index`): an index of their own,
        named as the key, for the keys on a column that indexes ``dropped``
        begin with and no other index will — not one the database has and
        keeps, nor a declared one, which the migration makes before its
        drops — unless the column goes too (``dropped_columns``; names in
        lower case)."""
        ddl, live = self.migrator.ddl, self.live
        if live is None or not dropped or not ddl.spec.foreign_keys_need_an_index:
            return []
        firsts = {i.name.lower(): (i.columns[0] or "").lower() for i in live.indexes if i.columns}
        losing = {column for name, column in firsts.items() if name in dropped}
        losing -= {column for name, column in firsts.items() if name not in dropped}
        losing -= {index.columns[0].lower() for index in self.table.indexes.values()}
        losing -= dropped_columns
        table = ddl.name(self.physical.identifier)
        statements: dict[str, str] = {}  # (one index serves every key on its column)
        for key in live.references:
            column = key.columns[0].lower() if len(key.columns) == 1 else None
            if key.name is not None and column in losing and column not in statements:
                statements[column] = (
                    f"CREATE INDEX {ddl.quote(key.name)} ON {table} ({ddl.quote(key.columns[0])})"
                )
        return list(statements.values())

    def _key_drops(self) -> dict[str, set[str]]:
        """The clause dropping each foreign key on a column the migration
        drops, and the key's columns (lower case); none where the database
        cannot drop keys in place (the rebuild left them behind, and only
        there does a key have no name)."""
        template = self.migrator.ddl.spec.drop_foreign_key_sql
        if template is None:
            return {}
        quote = self.migrator.ddl.quote
        return {
            template.replace("{name}", quote(key.name)): {c.lower() for c in key.columns}
            for key in self._keys_of_drops()
            if key.name is not None
        }

    def _key_index_column(self, index: str) -> str | None:
        """The column index ``index`` begins with, where the database may
        keep it for a foreign key on that column and refuses to drop it while
        the key is there (:attr:`DdlSpec.foreign_keys_need_an_index`)."""
        if self.live is None or not self.migrator.ddl.spec.foreign_keys_need_an_index:
            return None
        found = next((i for i in self.live.indexes if i.name.lower() == index.lower()), None)
        return None if found is None or not found.columns else found.columns[0]

    def _keys_of_drops(self) -> list[LiveReference]:
        """The foreign keys on a column the migration drops."""
        dropped = self._dropped_columns()
        keys = () if self.live is None else self.live.references
        return [k for k in keys if any(c.lower() in dropped for c in k.columns)]

    def _dropped_columns(self) -> dict[str, str]:
        """The columns the migration drops: lower case -> name."""
        return {
            str(d.name).lower(): str(d.name) for d in self.drops if isinstance(d, RemovedColumn)
        }

    # -- helpers ----------------------------------------------------------------

    @property
    def _now(self) -> PhysicalTable:
        """The table as it is called while planning (before its rename)."""
        return self.physical if self.former is None else self.former

    def _index(self, name: str) -> str:
        """Index ``name``, qualified by the table's schema (PostgreSQL)."""
        schema = self.physical.schema
        return self.migrator.ddl.name(
            Identifier(name) if schema is None else Identifier(schema, name)
        )

    def _drop_index_sql(self, name: str, keys: Sequence[str] = ()) -> list[str]:
        """The statements dropping index ``name`` after ``keys`` (clauses
        dropping the foreign keys it may serve): one ALTER TABLE where the
        database has a clause for the index (:attr:`DdlSpec.drop_index_clause`),
        so that a failure leaves both."""
        ddl = self.migrator.ddl
        table = ddl.name(self.physical.identifier)
        index = self._index(name)
        clause = ddl.spec.drop_index_clause
        if keys and clause is not None:
            return [f"ALTER TABLE {table} {', '.join([*keys, clause.replace('{index}', index)])}"]
        alone = ddl.spec.drop_index_sql.replace("{index}", index).replace("{table}", table)
        return [*(f"ALTER TABLE {table} {key}" for key in keys), alone]

    def _refuse(self, why: str) -> None:
        self.migrator.refusals.append(f"table {self.table.name!r} ({self.physical}): {why}")


# The order a column's changes are made in.
_ORDER = ["widen_integer", "widen_text", "null", "drop_default", "set_default", "not_null"]


def _template(change: str) -> str:
    """The DdlSpec.alter_column_sql key a change is made with."""
    return "type" if change.startswith("widen") else change


def _create_index(quote: Any, table: str, index: LiveIndex) -> str:
    columns = ", ".join(quote(c) for c in index.columns if c is not None)
    unique = "UNIQUE " if index.unique else ""
    return f"CREATE {unique}INDEX {quote(index.name)} ON {table} ({columns})"


def _taken(keys: dict[str, set[str]], column: str | None) -> list[str]:
    """The clauses of ``keys`` (clause -> its key's columns, lower case) of
    the keys on ``column``, taken out of ``keys``: each key is dropped once."""
    taken = [clause for clause, columns in keys.items() if column and column.lower() in columns]
    for clause in taken:
        del keys[clause]
    return taken


def _join(parts: list[Any], separator: str = ", ") -> Fragment:
    return Fragment.join(parts, separator)


def _recorder(m: Migrator, key: str, value: str) -> Any:
    async def record() -> None:
        await write_setting(m.session, m.compile, key, value)

    return record


def _deleter(m: Migrator, key: str) -> Any:
    async def delete() -> None:
        await delete_setting(m.session, m.compile, key)

    return delete
