"""Naming strategies: where a schema's tables live in the database.

A *namespace* (by default the schema's name) keeps the tables of several
schemas apart in one database:

* ``suffix`` — table ``accounts`` of namespace ``shop`` is ``accounts_shop``
  in the default schema (the default on SQLite and MySQL);
* ``schema`` — it is ``shop.accounts``: one PostgreSQL schema per namespace
  (the default on PostgreSQL).

Physical names longer than the database allows are shortened
deterministically: the head of the name, ``_``, and 8 hex digits of its SHA-1,
so different long names stay different and the same name always maps alike.
Pass any object with the :class:`NamingStrategy` methods as ``naming=`` to use
your own scheme.

A suffix can make two declarations one table (``orders`` in namespace
``eu_west`` and ``orders_eu`` in ``west`` are both ``orders_eu_west``), and
so can a custom strategy. Every physical table belongs to one (namespace,
table): :class:`PhysicalNames` refuses a second claim in one process, and
migrations refuse one recorded in the database (:mod:`aiofragno.ownership`).
Names are compared ignoring case, as SQLite (and MySQL on some systems) do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import SchemaError, ValidationError
from .schema import Schema, Table
from .sql import Identifier

# The servers' own schemas (PostgreSQL) and databases (MySQL, MariaDB), refused
# as namespaces and database schemas on every dialect: a namespace that works
# on one database works on all. (PostgreSQL reserves every "pg_" name.)
SYSTEM_SCHEMAS = frozenset({"information_schema", "mysql", "performance_schema", "sys"})


def check_not_system_schema(name: str, what: str) -> None:
    """A :class:`ValidationError` if ``name`` is a system schema or database."""
    folded = name.lower()
    if folded in SYSTEM_SCHEMAS or folded.startswith("pg_"):
        raise ValidationError(
            f"{what} {name!r} is reserved for the database's own catalog (information_schema, "
            "pg_*, mysql, performance_schema, sys, in any case); choose another name"
        )


def physical_key(schema: str | None, name: str) -> tuple[str, str]:
    """What makes two physical tables one: (schema or "", name), ignoring case."""
    return (schema or "").lower(), name.lower()


class NamingStrategy(Protocol):
    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        """(database schema or None for the default one, table name)."""
        ...

    def index(self, namespace: str, table: str, index: str) -> str: ...

    def foreign_key(self, namespace: str, table: str, column: str) -> str: ...


def shorten(name: str, limit: int) -> str:
    """``name`` if it fits in ``limit`` bytes, else a deterministic shorter one."""
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    head = name.encode()[: limit - 9].decode(errors="ignore")
    return f"{head}_{digest}"


@dataclass(frozen=True, slots=True)
class SuffixNaming:
    """``<table>_<namespace>`` in the default schema."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return None, f"{table}_{namespace}"

    def index(self, namespace: str, table: str, index: str) -> str:
        # Index names are global to a SQLite database: include the table. The
        # prefix keeps them apart from the database's own (<table>_pkey), "__"
        # (never in declared names) keeps table and index apart.
        return f"ix_{table}_{namespace}__{index}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk_{table}_{namespace}__{column}"


@dataclass(frozen=True, slots=True)
class SchemaNaming:
    """``<namespace>.<table>``: one database schema per namespace."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return namespace, table

    def index(self, namespace: str, table: str, index: str) -> str:
        return f"ix_{table}__{index}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk_{table}__{column}"


STRATEGIES: dict[str, NamingStrategy] = {"suffix": SuffixNaming(), "schema": SchemaNaming()}


@dataclass(frozen=True, slots=True)
class PhysicalTable:
    """Where one declared table lives: its database schema (None: the default)
    and name, already shortened to the dialect's limit."""

    table: Table[Any]
    schema: str | None
    name: str

    @property
    def identifier(self) -> Identifier:
        return Identifier(self.name) if self.schema is None else Identifier(self.schema, self.name)

    @property
    def key(self) -> tuple[str, str]:
        return physical_key(self.schema, self.name)

    def __str__(self) -> str:
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


class Layout:
    """The physical names of one :class:`Schema` under one namespace, naming
    strategy and identifier limit. Built once per Database and schema."""

    def __init__(self, schema: Schema, namespace: str, naming: NamingStrategy, limit: int) -> None:
        self.schema = schema
        self.namespace = namespace
        self.naming = naming
        self.limit = limit
        self.tables: dict[str, PhysicalTable] = {}
        check_not_system_schema(namespace, "namespace")
        claimed: dict[tuple[str, str], str] = {}
        for table in schema.tables.values():
            db_schema, name = naming.table(namespace, table.name)
            if db_schema is not None:
                check_not_system_schema(db_schema, f"database schema of table {table.name!r}")
            physical = PhysicalTable(
                table,
                None if db_schema is None else shorten(db_schema, limit),
                shorten(name, limit),
            )
            other = claimed.setdefault(physical.key, table.name)
            if other != table.name:
                raise SchemaError(
                    f"tables {other!r} and {table.name!r} of namespace {namespace!r} would both be "
                    f"the database table {str(physical)!r}; use a naming strategy that keeps "
                    "them apart"
                )
            self.tables[table.name] = physical

    def table(self, name: str) -> PhysicalTable:
        physical = self.tables.get(name)
        if physical is None:
            self.schema.table(name)  # raises the ValidationError naming the tables
        assert physical is not None
        return physical

    def former(self, table: Table[Any]) -> PhysicalTable | None:
        """Where ``table`` lived under the name it is ``renamed_from`` (None:
        it declares no rename)."""
        if table.renamed_from is None:
            return None
        db_schema, name = self.naming.table(self.namespace, table.renamed_from)
        return PhysicalTable(
            table,
            None if db_schema is None else shorten(db_schema, self.limit),
            shorten(name, self.limit),
        )

    def index_name(self, table: str, index: str) -> str:
        return shorten(self.naming.index(self.namespace, table, index), self.limit)

    def foreign_key_name(self, table: str, column: str) -> str:
        return shorten(self.naming.foreign_key(self.namespace, table, column), self.limit)

    @property
    def db_schemas(self) -> list[str]:
        """Database schemas the tables live in (to be created by migrations)."""
        return sorted({t.schema for t in self.tables.values() if t.schema is not None})


class PhysicalNames:
    """The physical tables of one Database's layouts, each claimed by one
    (namespace, table), and the internal tables, claimed by aiofragno: a
    layout that would share a table with another raises :class:`SchemaError`
    before any SQL runs."""

    def __init__(self, internal: Iterable[str]) -> None:
        # Physical key -> (namespace, table); None: an internal table.
        self._owners: dict[tuple[str, str], tuple[str, str] | None] = {
            physical_key(None, name): None for name in internal
        }

    def claim(self, layout: Layout) -> None:
        """Claim ``layout``'s tables, or raise naming the table it would share."""
        claims = {
            physical.key: (layout.namespace, name, physical)
            for name, physical in layout.tables.items()
        }
        for key, (namespace, name, physical) in claims.items():
            if key not in self._owners:
                continue
            owner = self._owners[key]
            if owner is None:
                raise SchemaError(
                    f"table {name!r} of namespace {namespace!r} would be the database table "
                    f"{str(physical)!r}, which is aiofragno's own; use another namespace or "
                    "table name"
                )
            if owner != (namespace, name):
                raise SchemaError(
                    f"table {name!r} of namespace {namespace!r} and table {owner[1]!r} of "
                    f"namespace {owner[0]!r} would both be the database table "
                    f"{str(physical)!r}; use other namespaces, or a naming strategy that keeps "
                    "them apart (e.g. naming='schema' on PostgreSQL)"
                )
        self._owners.update({key: (ns, name) for key, (ns, name, _) in claims.items()})


def resolve_naming(naming: str | NamingStrategy) -> NamingStrategy:
    if isinstance(naming, str):
        try:
            return STRATEGIES[naming]
        except KeyError:
            raise ValidationError(
                f"unknown naming strategy {naming!r}; use 'suffix', 'schema' or an object"
            ) from None
    return naming
