"""Unique keys in a unit of work: naming a declared unique index (``on=``
of ``uow.upsert``, the ``where`` of ``uow.check_absent``), rendering a
row's look-up by its key, and telling whether a unique violation was one
on an index the unit counts as a conflict (:class:`UniqueConflicts`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..brief import brief
from ..errors import UniqueViolation, ValidationError
from ..schema import EXTERNAL_ID, Index
from ..sqltext import SqlText
from .catalog import Catalog, TableInfo
from .compiling import Compiling


def unique_index(table: TableInfo, on: Any) -> Index:
    """The declared unique index ``on`` names: its name, or its columns (a
    list or tuple, in any order). Refused with a ValidationError naming the
    table's unique indexes otherwise."""
    indexes = table.table.indexes
    if type(on) is str:
        index = indexes.get(on)
        if index is not None and index.unique and EXTERNAL_ID not in index.columns:
            return index  # (the common case, without the listing errors name)
    unique = [index for index in indexes.values() if index.unique]
    known = ", ".join(f"{i.name} {list(i.columns)}" for i in unique) or "none"
    if isinstance(on, str):
        index = indexes.get(on)
        if index is None:
            raise ValidationError(
                f"table {table.name!r} has no index {on!r}; its unique indexes: {known}"
            )
        if not index.unique:
            raise ValidationError(
                f"index {on!r} of table {table.name!r} is not unique, so it cannot name a row; "
                f"declare it with unique=True, or use one of: {known}"
            )
    elif isinstance(on, list | tuple) and on and all(isinstance(c, str) for c in on):
        found = [i for i in unique if set(i.columns) == set(on) and len(on) == len(i.columns)]
        if not found:
            raise ValidationError(
                f"table {table.name!r} has no unique index on {list(on)}; its unique indexes: "
                f"{known}"
            )
        index = found[0]
    else:
        raise ValidationError(
            f"a unique key on {table.name!r} is named by its index's name or a list of its "
            f"columns, got {brief(on)}"
        )
    if EXTERNAL_ID in index.columns:
        raise ValidationError(
            f"index {index.name!r} of table {table.name!r} includes the id, which aiofragno "
            "generates: a unique key here is made of declared columns"
        )
    return index


def key_values(table: TableInfo, index: Index, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values of ``index``'s columns in ``values``, each one given and
    not None (NULLs never collide in a unique index, so they name no row)."""
    key: dict[str, Any] = {}
    for column in index.columns:
        value = values.get(column)
        if value is None:
            given = "None" if column in values else "no value"
            raise ValidationError(
                f"{table.name}.{column} is part of unique index {index.name!r} and got {given}: "
                "a key names a row only with a value for each of its columns"
            )
        key[column] = value
    return key


def index_for_key(table: TableInfo, where: Any) -> Index:
    """The unique index whose columns are exactly the keys of ``where``."""
    if not isinstance(where, Mapping) or not where:
        raise ValidationError(
            f"a unique key on {table.name!r} is a dict of column values, got {brief(where)}"
        )
    for name in where:
        table.column(name)  # (an unknown column is named as such)
    return unique_index(table, list(where))


def render_key(ctx: Compiling, key: Mapping[str, Any]) -> None:
    """``t.a = ? AND t.b = ? ...``: each value checked and encoded for its column."""
    for i, (name, value) in enumerate(key.items()):
        if i:
            ctx.text(" AND ")
        ctx.text(f"{ctx.table.columns[name].qualified} = ")
        ctx.value(name, value)


def id_by_key(
    catalog: Catalog, table: TableInfo, key: Mapping[str, Any]
) -> tuple[SqlText, list[Any]]:
    """A scalar subquery for the external id of the row holding ``key``, and
    its parameters."""
    ctx = Compiling(catalog, table, build_text=True)
    ctx.text(f"(SELECT {table.columns[EXTERNAL_ID].qualified} FROM {table.sql_name} t WHERE ")
    render_key(ctx, key)
    ctx.text(")")
    return ctx.sql_text(), ctx.params


class UniqueConflicts:
    """The unique indexes on which a violation makes the unit a conflict
    (it runs again under the retry policy) instead of an error. The database
    names the violated index in its message (PostgreSQL, MySQL) or its
    columns (SQLite: ``table.column, ...``), which the dialect's
    ``unique_violation`` pattern finds."""

    __slots__ = ("_catalog", "_columns", "_names")

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._names: set[str] = set()
        self._columns: set[tuple[str, frozenset[str]]] = set()

    def add(self, table: TableInfo, index: Index) -> None:
        layout = self._catalog.layout
        self._names.add(layout.index_name(table.name, index.name))
        physical = layout.table(table.name).identifier.parts[-1]
        self._columns.add((physical, frozenset(index.columns)))

    def match(self, exc: Exception) -> bool:
        """Whether ``exc`` is a violation of one of these indexes."""
        if not self._names or not isinstance(exc, UniqueViolation):
            return False
        named = violated(self._catalog.adapter.sql.unique_violation, str(exc))
        if named is None:
            return False
        if named.get("index") is not None:
            return named["index"] in self._names
        columns = [part.strip() for part in (named.get("columns") or "").split(",")]
        tables = {column.rpartition(".")[0] for column in columns}
        if len(tables) != 1:
            return False
        names = frozenset(column.rpartition(".")[2] for column in columns)
        return (tables.pop(), names) in self._columns


def violated(pattern: str, message: str) -> dict[str, str | None] | None:
    """What ``pattern`` (a dialect's ``unique_violation``) finds in a unique
    violation's ``message``: its last match, since the message may quote the
    duplicate value first (MySQL: "Duplicate entry '<value>' for key
    '<index>'"), and a value can hold anything."""
    matches = list(re.finditer(pattern, message))
    return matches[-1].groupdict() if matches else None
