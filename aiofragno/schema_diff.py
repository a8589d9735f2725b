"""Drift: how a declared table differs from the table the database has.

:func:`diff_table` compares one declared table (its physical layout) with
what :mod:`aiofragno.introspection` read, and returns typed
:class:`Difference` objects. Each knows whether it is ``additive`` — a
missing table, column, internal column or index, which a migration adds on
its own — or a change a migration does not make on its own (a retyped,
removed or re-nulled column, a changed default, index or reference), which
``migrate()`` reports with :class:`~aiofragno.errors.MigrationError` before
it runs anything.

Types are compared in one spelling (:class:`~aiofragno.introspection.TypeMap`),
defaults as values of the column's type (PostgreSQL's ``'0'::integer`` is
``0``, MariaDB's ``'2024-01-01 00:00:00.000000'`` is that instant), so a
table aiofragno created never differs from its declaration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import ClassVar

from .driver import CatalogSql
from .introspection import LiveColumn, LiveReference, LiveTable, TypeMap
from .naming import Layout, PhysicalTable
from .schema import EXTERNAL_ID, INTERNAL_ID, VERSION, Column, Reference

# The unique index that makes a re-added external id unique (declared index
# names never start with "_": it cannot be one of them).
EXTERNAL_ID_INDEX = "_external_id"
# The columns of ours, and the DdlSpec.types entry each is stored as (_id
# as what references store).
INTERNAL_COLUMNS = {INTERNAL_ID: "reference", EXTERNAL_ID: "external_id", VERSION: "version"}


@dataclass(frozen=True, slots=True)
class Difference:
    """One way a live table differs from its declaration: ``table`` (the
    declared name) in ``physical`` (the database's), the column or index
    ``name`` (None: the whole table), what was ``declared`` and what the
    database has (``live``), as text. ``additive``: ``migrate()`` applies it
    on its own. ``safe``: left as it is, no read or write of the declared
    table fails (a changed default: aiofragno writes the declared one; a
    column no longer declared that is nullable or has a default; a plain
    index no longer declared), so ``migrate()`` reports it
    (:attr:`MigrationResult.differences
    <aiofragno.migrate.MigrationResult.differences>`, and a warning on the
    ``aiofragno`` logger) and goes on. The others are ``blocking``:
    ``migrate()`` raises :class:`~aiofragno.errors.MigrationError` listing
    them, before it changes anything."""

    table: str
    physical: str
    name: str | None = None
    declared: str | None = None
    live: str | None = None
    safe: bool = False

    additive: ClassVar[bool] = False
    what: ClassVar[str] = "difference"

    @property
    def blocking(self) -> bool:
        return not (self.additive or self.safe)

    def __str__(self) -> str:
        where = f"table {self.table!r} ({self.physical})"
        subject = f"{self.what} {self.name!r}" if self.name is not None else self.what
        return f"{where}: {subject}: declared {self.declared}, database has {self.live}"


@dataclass(frozen=True, slots=True)
class MissingTable(Difference):
    additive: ClassVar[bool] = True
    what: ClassVar[str] = "missing table"


@dataclass(frozen=True, slots=True)
class MissingColumn(Difference):
    additive: ClassVar[bool] = True
    what: ClassVar[str] = "missing column"


@dataclass(frozen=True, slots=True)
class MissingInternalColumn(Difference):
    """``_id``, ``id`` or ``_version`` is gone: re-added, existing rows
    given a value (a new internal id, a new external id, version 0)."""

    additive: ClassVar[bool] = True
    what: ClassVar[str] = "missing internal column"


@dataclass(frozen=True, slots=True)
class MissingIndex(Difference):
    additive: ClassVar[bool] = True
    what: ClassVar[str] = "missing index"


@dataclass(frozen=True, slots=True)
class RemovedColumn(Difference):
    """A column the declaration no longer has (its data would be lost)."""

    what: ClassVar[str] = "column not declared"


@dataclass(frozen=True, slots=True)
class TypeChanged(Difference):
    what: ClassVar[str] = "column type"


@dataclass(frozen=True, slots=True)
class NullabilityChanged(Difference):
    what: ClassVar[str] = "column nullability"


@dataclass(frozen=True, slots=True)
class DefaultChanged(Difference):
    what: ClassVar[str] = "column default"


@dataclass(frozen=True, slots=True)
class IndexChanged(Difference):
    what: ClassVar[str] = "index"


@dataclass(frozen=True, slots=True)
class RemovedIndex(Difference):
    what: ClassVar[str] = "index not declared"


@dataclass(frozen=True, slots=True)
class ReferenceChanged(Difference):
    what: ClassVar[str] = "reference of column"


@dataclass(frozen=True, slots=True)
class PrimaryKeyChanged(Difference):
    """The table's primary key is not ``_id`` alone (a table to adopt keyed
    by a column of its own)."""

    what: ClassVar[str] = "primary key"


@dataclass(frozen=True, slots=True)
class MissingExternalIdKey(Difference):
    """``id`` is not unique (its constraint dropped by hand): the unique
    index is created again (which fails, changing nothing, if ids repeat)."""

    additive: ClassVar[bool] = True
    what: ClassVar[str] = "unique key of column"


class Differ:
    """Compares declared tables of one layout with live ones, in one
    dialect's spelling of types and defaults."""

    def __init__(
        self,
        layout: Layout,
        types: dict[str, str],
        type_map: TypeMap,
        catalog: CatalogSql,
        *,
        column_type: Callable[[Column], str],
        default_literal: Callable[[Column], str | None],
        backslash_escapes: bool,
    ) -> None:
        self.layout = layout
        self.types = types
        self.type_map = type_map
        self.column_type = column_type
        self.default_literal = default_literal
        self.casts = None if catalog.default_casts is None else re.compile(catalog.default_casts)
        self.backslash_escapes = backslash_escapes

    def diff_table(self, physical: PhysicalTable, live: LiveTable | None) -> list[Difference]:
        """Every difference of ``live`` (None: no such table) from ``physical``."""
        name, where = physical.table.name, str(physical)
        if live is None:
            return [MissingTable(name, where)]
        found: list[Difference] = []
        for internal, kind in INTERNAL_COLUMNS.items():
            found += self._internal(name, where, internal, kind, live.column(internal))
        declared = physical.table.columns
        for column in declared.values():
            found += self._column(name, where, column, live.column(column.name))
        known = {c.lower() for c in (*INTERNAL_COLUMNS, *declared)}
        found += [
            RemovedColumn(
                name,
                where,
                c.name,
                "nothing",
                _column_text(c),
                safe=c.nullable or c.default is not None,
            )
            for c in live.columns
            if c.name.lower() not in known
        ]
        found += self._references(physical, live)
        found += self._indexes(physical, live)
        return found

    def _internal(
        self, name: str, where: str, column: str, kind: str, live: LiveColumn | None
    ) -> list[Difference]:
        if live is None:
            return [MissingInternalColumn(name, where, column, self.types[kind], "nothing")]
        expected = self.type_map.spell(self.types[kind])
        if self.type_map.spell(live.sql_type) != expected:
            return [TypeChanged(name, where, column, expected, live.sql_type)]
        if live.nullable:
            return [NullabilityChanged(name, where, column, "NOT NULL", "NULL")]
        return []

    def _column(
        self, name: str, where: str, column: Column, live: LiveColumn | None
    ) -> list[Difference]:
        sql_type = self.column_type(column)
        if live is None:
            return [MissingColumn(name, where, column.name, column.type_name, "nothing")]
        found: list[Difference] = []
        if self.type_map.spell(live.sql_type) != self.type_map.spell(sql_type):
            declared = f"{column.type_name} ({sql_type})"
            found.append(TypeChanged(name, where, column.name, declared, _type_text(live)))
        literal = self.default_literal(column)
        # A NOT NULL column whose default has no SQL literal is added nullable
        # (and filled) when the table exists: either is the declaration's.
        client_default = column.default is not None and literal is None
        if live.nullable != column.nullable and not (client_default and live.nullable):
            found.append(
                NullabilityChanged(
                    name, where, column.name, _null(column.nullable), _null(live.nullable)
                )
            )
        if not client_default and not self._same_default(column.kind, literal, live.default):
            declared = literal or "no default"
            have = live.default or "no default"
            found.append(DefaultChanged(name, where, column.name, declared, have, safe=True))
        return found

    def _same_default(self, kind: str, declared: str | None, live: str | None) -> bool:
        a, b = self._default_value(declared), self._default_value(live)
        if a == b:
            return True
        if a is None or b is None:
            return False
        same = _SAME_VALUE.get(kind)
        return same is not None and same(a, b)

    def _default_value(self, text: str | None) -> str | None:
        """The value a default's SQL text stands for, as text."""
        if text is None:
            return None
        text = text.strip()
        if self.casts is not None:
            text = self.casts.sub("", text)
        while text.startswith("(") and text.endswith(")"):
            text = text[1:-1].strip()
        if len(text) >= 2 and text[0] == text[-1] == "'":
            text = text[1:-1].replace("''", "'")
            if self.backslash_escapes:
                text = re.sub(r"\\(.)", r"\1", text)
        return text

    def _references(self, physical: PhysicalTable, live: LiveTable) -> list[Difference]:
        name, where = physical.table.name, str(physical)
        by_column = {ref.columns[0].lower(): ref for ref in live.references if ref.columns}
        found: list[Difference] = []
        for column in physical.table.columns.values():
            ref = by_column.get(column.name.lower())
            if not isinstance(column, Reference):
                if ref is not None:
                    found.append(
                        ReferenceChanged(name, where, column.name, "no reference", _ref_text(ref))
                    )
                continue
            target = self.layout.table(column.to_table)
            declared = f"{target}.{INTERNAL_ID}"
            if ref is None:
                if live.column(column.name) is not None:
                    found.append(ReferenceChanged(name, where, column.name, declared, "none"))
                continue
            same_table = ref.to_table.lower() == target.name.lower() and (
                target.schema is None
                or ref.to_schema is None
                or ref.to_schema.lower() == target.schema.lower()
            )
            if not same_table or [c.lower() for c in ref.to_columns] != [INTERNAL_ID]:
                found.append(ReferenceChanged(name, where, column.name, declared, _ref_text(ref)))
        return found

    def _indexes(self, physical: PhysicalTable, live: LiveTable) -> list[Difference]:
        table = physical.table
        name, where = table.name, str(physical)
        by_name = {index.name.lower(): index for index in live.indexes}
        found = self._keys(name, where, live)
        declared_names = {self.layout.index_name(name, EXTERNAL_ID_INDEX).lower()}
        for index in table.indexes.values():
            index_name = self.layout.index_name(name, index.name)
            declared_names.add(index_name.lower())
            declared = _index_text(index.columns, index.unique)
            have = by_name.get(index_name.lower())
            if have is None:
                found.append(MissingIndex(name, where, index.name, declared, "nothing"))
            elif [(c or "").lower() for c in have.columns] != [
                c.lower() for c in index.columns
            ] or (have.unique != index.unique):
                found.append(
                    IndexChanged(
                        name, where, index.name, declared, _index_text(have.columns, have.unique)
                    )
                )
        # Indexes named as this table's declared ones are named, no longer declared.
        prefix = self.layout.naming.index(self.layout.namespace, name, "").lower()
        found += [
            RemovedIndex(
                name,
                where,
                index.name,
                "nothing",
                _index_text(index.columns, index.unique),
                # (A unique one still refuses rows; a plain one only costs.)
                safe=not index.unique,
            )
            for index in live.indexes
            if index.name.lower().startswith(prefix) and index.name.lower() not in declared_names
        ]
        return found

    def _keys(self, name: str, where: str, live: LiveTable) -> list[Difference]:
        """The primary key is ``_id`` (SQLite's ``INTEGER PRIMARY KEY`` is the
        rowid, listed as no index), and ``id`` has a unique index of its own."""
        found: list[Difference] = []
        for index in live.indexes:
            columns = [(c or "").lower() for c in index.columns]
            if index.primary and columns != [INTERNAL_ID]:
                have = _index_text(index.columns, unique=False)
                found.append(PrimaryKeyChanged(name, where, None, f"({INTERNAL_ID})", have))
        unique_ids = [
            i for i in live.indexes if i.unique and [(c or "").lower() for c in i.columns] == ["id"]
        ]
        if live.column(EXTERNAL_ID) is not None and not unique_ids:
            found.append(MissingExternalIdKey(name, where, EXTERNAL_ID, "unique", "not unique"))
        return found


def _null(nullable: bool) -> str:
    return "NULL" if nullable else "NOT NULL"


def _type_text(column: LiveColumn) -> str:
    if not column.types:
        return column.sql_type
    return f"{' or '.join(column.types)} ({column.sql_type})"


def _column_text(column: LiveColumn) -> str:
    return f"{_type_text(column)} {_null(column.nullable)}"


def _index_text(columns: Iterable[str | None], unique: bool) -> str:
    names = ", ".join("(expression)" if c is None else c for c in columns)
    return f"{'unique ' if unique else ''}({names})"


def _ref_text(ref: LiveReference) -> str:
    target = f"{ref.to_schema}.{ref.to_table}" if ref.to_schema else ref.to_table
    return f"a reference to {target}({', '.join(ref.to_columns)})"


def _same_number(a: str, b: str) -> bool:
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def _same_bool(a: str, b: str) -> bool:
    truth = {"true": True, "1": True, "false": False, "0": False}
    x, y = truth.get(a.lower()), truth.get(b.lower())
    return x is not None and x == y


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


def _instant(text: str) -> datetime | date:
    text = text.strip()
    if re.fullmatch(r"\d{4}-\d\d-\d\d", text):
        return date.fromisoformat(text)
    # PostgreSQL writes an offset as +00: ISO wants +00:00.
    text = re.sub(r"([+-]\d\d)$", r"\1:00", text)
    return datetime.fromisoformat(text)


def _same_time(a: str, b: str) -> bool:
    try:
        return _instant(a) == _instant(b)
    except (ValueError, TypeError):
        return _same_number(a, b)  # (SQLite's epoch milliseconds)


# How two default values of one column type are compared once their text
# differs (easy to extend: a new type with several spellings of one value).
_SAME_VALUE: dict[str, Callable[[str, str], bool]] = {
    "integer": _same_number,
    "bigint": _same_number,
    "decimal": _same_number,
    "bool": _same_bool,
    "json": _same_json,
    "date": _same_time,
    "timestamp": _same_time,
}
