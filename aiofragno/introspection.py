"""Introspection: the tables a database has, read from its own catalog.

``await db.inspect()`` returns :class:`LiveTable` objects — columns (with the
aiofragno types stored that way), indexes and references — as plain frozen
data; migrations compare them with a declaration
(:mod:`aiofragno.schema_diff`). Each dialect says how its catalog is read
(:class:`~aiofragno.driver.CatalogSql`: PostgreSQL's ``pg_catalog``, MySQL's
``information_schema``, SQLite's ``pragma_*`` functions) and how it spells
types; :class:`TypeMap` turns the spellings back into aiofragno's types,
from the same :attr:`DdlSpec.types <aiofragno.driver.DdlSpec.types>` table
that migrations write them from, so a type added there is read back with no
other change.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .driver import CatalogSql, DdlSpec
from .errors import MigrationError
from .ownership import owner_key
from .settings_table import SETTINGS_TABLE, read_settings_like
from .sql import sql_using

if TYPE_CHECKING:
    from .session import Session

# DdlSpec.types keys that are not column types a user declares.
_INTERNAL_KINDS = frozenset(
    {"json_document", "external_id", "versionstamp", "version", "reference"}
)
# Stands for {n} while a parametrized type is respelled.
_SENTINEL = "918273645"


@dataclass(frozen=True, slots=True)
class LiveColumn:
    """One column as the database has it.

    ``sql_type``: the type as the catalog reports it, lower case (e.g.
    ``character varying(20)``, ``bigint(20)``); ``types``: the aiofragno
    column types stored exactly that way on this database, in declaration
    order of the dialect's type table (several where they share one SQL type:
    ``string`` and ``text`` are both ``text`` on PostgreSQL; empty where none
    is); ``default``: the default's SQL text as the catalog reports it (None:
    no default)."""

    name: str
    sql_type: str
    types: tuple[str, ...]
    nullable: bool
    default: str | None


@dataclass(frozen=True, slots=True)
class LiveIndex:
    """An index (a unique or primary key constraint's too). ``columns`` holds
    None for an indexed expression."""

    name: str
    columns: tuple[str | None, ...]
    unique: bool
    primary: bool = False


@dataclass(frozen=True, slots=True)
class LiveReference:
    """A foreign key: ``columns`` of this table reference ``to_columns`` of
    ``to_table`` (in ``to_schema``; None where the catalog does not say,
    SQLite; ``to_columns`` empty: its primary key, named by none, SQLite).
    ``name`` is None where the catalog keeps none (SQLite).

    Read where a SQLite table is rebuilt, which restates its keys (not
    compared): ``actions``, its ``ON UPDATE``/``ON DELETE`` clauses other
    than the default; ``restatable``, False where the table's definition may
    say more of its keys than the catalog does (``DEFERRABLE``)."""

    name: str | None
    columns: tuple[str, ...]
    to_schema: str | None
    to_table: str
    to_columns: tuple[str, ...]
    actions: str = field(default="", compare=False)
    restatable: bool = field(default=True, compare=False)


@dataclass(frozen=True, slots=True)
class LiveTable:
    """A table as the database has it. ``table`` is the declared name when
    it was inspected for a namespace (else None); ``schema`` is its database
    schema (None: the default one)."""

    name: str
    schema: str | None
    columns: tuple[LiveColumn, ...]
    indexes: tuple[LiveIndex, ...] = ()
    references: tuple[LiveReference, ...] = ()
    table: str | None = None

    def column(self, name: str) -> LiveColumn | None:
        """The column called ``name`` (compared ignoring case, as SQLite and
        MySQL compare column names), or None."""
        folded = name.lower()
        return next((c for c in self.columns if c.name.lower() == folded), None)


@dataclass(frozen=True, slots=True)
class TypeMap:
    """One dialect's SQL types in one spelling, and the aiofragno types each
    stores: built from :attr:`DdlSpec.types` and
    :attr:`CatalogSql.type_spellings`."""

    spellings: tuple[tuple[re.Pattern[str], str], ...]
    exact: Mapping[str, tuple[str, ...]]
    # (pattern of a parametrized type, logical kind), e.g. varchar({n}).
    sized: tuple[tuple[re.Pattern[str], str], ...] = field(default=())

    @classmethod
    def of(cls, spec: DdlSpec) -> TypeMap:
        catalog = catalog_of(spec)
        spellings = tuple((re.compile(p), r) for p, r in catalog.type_spellings)
        exact: dict[str, tuple[str, ...]] = {}
        sized: list[tuple[re.Pattern[str], str]] = []
        for kind, text in spec.types.items():
            if kind in _INTERNAL_KINDS:
                continue
            if "{n}" in text:
                spelled = _respell(spellings, text.replace("{n}", _SENTINEL))
                pattern = re.escape(spelled).replace(_SENTINEL, r"(\d+)")
                sized.append((re.compile(pattern), kind))
            else:
                key = _respell(spellings, text)
                exact[key] = (*exact.get(key, ()), kind)
        return cls(spellings, exact, tuple(sized))

    def spell(self, sql_type: str) -> str:
        """``sql_type`` in the one spelling both sides are compared in."""
        return _respell(self.spellings, sql_type)

    def types(self, sql_type: str) -> tuple[str, ...]:
        """The aiofragno types stored as ``sql_type``."""
        spelled = self.spell(sql_type)
        found = list(self.exact.get(spelled, ()))
        for pattern, kind in self.sized:
            match = pattern.fullmatch(spelled)
            if match:
                found.append(f"{kind}({match.group(1)})")
        return tuple(found)


def _respell(spellings: Iterable[tuple[re.Pattern[str], str]], sql_type: str) -> str:
    text = " ".join(sql_type.lower().split())
    for pattern, replacement in spellings:
        text = pattern.sub(replacement, text)
    return text


def catalog_of(spec: DdlSpec) -> CatalogSql:
    if spec.catalog is None:
        raise MigrationError(
            "this dialect does not say how to read its catalog (DdlSpec.catalog), so its "
            "tables cannot be inspected or compared with a declaration"
        )
    return spec.catalog


class Inspector:
    """Reads tables through one session (see :func:`inspect_tables`)."""

    def __init__(self, session: Session, compile: Any, spec: DdlSpec) -> None:
        self.session = session
        self.compile = compile
        self.catalog = catalog_of(spec)
        self.type_map = TypeMap.of(spec)

    async def _rows(self, template: str, **params: Any) -> list[Mapping[str, Any]]:
        result = await self.session.execute(self.compile(sql_using(template, **params)))
        return list(result.rows)

    async def table_names(self, schema: str | None) -> list[str]:
        """The tables of ``schema`` (None: the default one)."""
        return [str(r["name"]) for r in await self._rows(self.catalog.tables, schema=schema)]

    async def table(
        self, schema: str | None, name: str, *, declared: str | None = None
    ) -> LiveTable | None:
        """Table ``name`` of ``schema``, or None when there is no such table."""
        where = {"schema": schema, "table": name}
        columns = tuple(self._column(r) for r in await self._rows(self.catalog.columns, **where))
        if not columns:
            return None
        indexes = _indexes(await self._rows(self.catalog.indexes, **where))
        references = _references(await self._rows(self.catalog.references, **where))
        return LiveTable(name, schema, columns, indexes, references, declared)

    def _column(self, row: Mapping[str, Any]) -> LiveColumn:
        sql_type = " ".join(_text(row["sql_type"]).lower().split())
        default = row["default_value"]
        if default is not None:
            default = _text(default)
            if default == self.catalog.null_default:
                default = None
        return LiveColumn(
            name=_text(row["name"]),
            sql_type=sql_type,
            types=self.type_map.types(sql_type),
            nullable=bool(row["is_nullable"]),
            default=default,
        )


def _text(value: Any) -> str:
    # (Some MySQL servers hand catalog text over as bytes.)
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _indexes(rows: list[Mapping[str, Any]]) -> tuple[LiveIndex, ...]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(_text(row["name"]), []).append(row)
    return tuple(
        LiveIndex(
            name,
            tuple(None if r["column_name"] is None else _text(r["column_name"]) for r in parts),
            bool(parts[0]["is_unique"]),
            bool(parts[0]["is_primary"]),
        )
        for name, parts in grouped.items()
    )


def _references(rows: list[Mapping[str, Any]]) -> tuple[LiveReference, ...]:
    # A key's rows follow each other; each starts at position 1 (SQLite
    # keeps no names to tell them apart).
    grouped: list[list[Mapping[str, Any]]] = []
    for row in rows:
        if int(row["position"]) == 1 or not grouped:
            grouped.append([])
        grouped[-1].append(row)
    return tuple(
        LiveReference(
            None if parts[0]["name"] is None else _text(parts[0]["name"]),
            tuple(_text(r["column_name"]) for r in parts),
            None if parts[0]["to_schema"] is None else _text(parts[0]["to_schema"]),
            _text(parts[0]["to_table"]),
            ()
            if any(r["to_column"] is None for r in parts)
            else tuple(_text(r["to_column"]) for r in parts),
            _actions(parts[0]),
            not parts[0].get("maybe_deferrable"),
        )
        for parts in grouped
    )


def _actions(row: Mapping[str, Any]) -> str:
    """A key's ``ON UPDATE``/``ON DELETE`` clauses, where the catalog says
    (SQLite), but for the default (NO ACTION)."""
    clauses = [
        f" ON {event} {_text(row[column])}"
        for event, column in (("UPDATE", "on_update"), ("DELETE", "on_delete"))
        if row.get(column) not in (None, "NO ACTION")
    ]
    return "".join(clauses)


@dataclass(frozen=True, slots=True)
class LiveSchema:
    """What :meth:`Database.inspect <aiofragno.Database.inspect>` returns:
    the tables of ``namespace`` (None: every table of the default schema)."""

    namespace: str | None
    tables: tuple[LiveTable, ...]

    def table(self, name: str) -> LiveTable | None:
        """The table declared as ``name`` (for a namespace) or named ``name``
        in the database, compared ignoring case; None if there is none."""
        folded = name.lower()
        return next(
            (t for t in self.tables if (t.table or t.name).lower() == folded),
            None,
        )


async def inspect_database(
    session: Session, compile: Any, spec: DdlSpec, namespace: str | None
) -> LiveSchema:
    """The live tables: those migrations recorded for ``namespace`` (keyed by
    their declared names; none before its first migration), or, for None,
    every table of the default schema (aiofragno's own included)."""
    inspector = Inspector(session, compile, spec)
    if namespace is None:
        names = await inspector.table_names(None)
        found = [await inspector.table(None, name) for name in names]
    else:
        found = [
            await inspector.table(schema, name, declared=table)
            for table, schema, name in await _recorded_tables(inspector, namespace)
        ]
    return LiveSchema(namespace, tuple(t for t in found if t is not None))


async def _recorded_tables(
    inspector: Inspector, namespace: str
) -> list[tuple[str, str | None, str]]:
    """(declared table, schema, name) of each table recorded for ``namespace``
    (see :mod:`aiofragno.ownership`)."""
    if await inspector.table(None, SETTINGS_TABLE) is None:
        return []
    prefix = owner_key(namespace, "")
    records = await read_settings_like(inspector.session, inspector.compile, f"{prefix}%")
    tables = []
    for key, value in records:
        if key.startswith(prefix):  # (LIKE takes "_" in the namespace for any character)
            data = json.loads(value)
            tables.append((key[len(prefix) :], data["schema"], data["name"]))
    return sorted(tables)
