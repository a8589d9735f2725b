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
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from .errors import ValidationError
from .schema import Schema, Table
from .sql import Identifier


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

    table: Table
    schema: str | None
    name: str

    @property
    def identifier(self) -> Identifier:
        return Identifier(self.name) if self.schema is None else Identifier(self.schema, self.name)


class Layout:
    """The physical names of one :class:`Schema` under one namespace, naming
    strategy and identifier limit. Built once per Database and schema."""

    def __init__(self, schema: Schema, namespace: str, naming: NamingStrategy, limit: int) -> None:
        self.schema = schema
        self.namespace = namespace
        self.naming = naming
        self.limit = limit
        self.tables: dict[str, PhysicalTable] = {}
        for table in schema.tables.values():
            db_schema, name = naming.table(namespace, table.name)
            self.tables[table.name] = PhysicalTable(
                table,
                None if db_schema is None else shorten(db_schema, limit),
                shorten(name, limit),
            )

    def table(self, name: str) -> PhysicalTable:
        physical = self.tables.get(name)
        if physical is None:
            self.schema.table(name)  # raises the ValidationError naming the tables
        assert physical is not None
        return physical

    def index_name(self, table: str, index: str) -> str:
        return shorten(self.naming.index(self.namespace, table, index), self.limit)

    def foreign_key_name(self, table: str, column: str) -> str:
        return shorten(self.naming.foreign_key(self.namespace, table, column), self.limit)

    @property
    def db_schemas(self) -> list[str]:
        """Database schemas the tables live in (to be created by migrations)."""
        return sorted({t.schema for t in self.tables.values() if t.schema is not None})


def resolve_naming(naming: str | NamingStrategy) -> NamingStrategy:
    if isinstance(naming, str):
        try:
            return STRATEGIES[naming]
        except KeyError:
            raise ValidationError(
                f"unknown naming strategy {naming!r}; use 'suffix', 'schema' or an object"
            ) from None
    return naming
