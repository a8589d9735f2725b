"""Row types: the ``TypedDict`` a table's rows are, checked against the
declaration, and written out for a schema (``aiofragno typegen``).

A table declared with ``row=AccountRow`` is a ``Table[AccountRow]``, and
``uow.find(accounts)`` a ``Find[AccountRow]``: a type checker then knows
each column's type. The rows themselves are the plain dicts a find always
returns; the TypedDict is checked once, when it is given, so that what the
type checker is told is what a read returns:

* its keys are exactly the row's: ``id``, every declared column, and for a
  joined find, each join's name — all required (``total``);
* each key's type is what the codec returns for the column: see
  :data:`PYTHON_TYPES`; ``X | None`` exactly when the column is nullable;
  an ``enum`` may be ``str`` or a ``Literal`` of declared values; a
  ``json`` column may be annotated with any type (its values are whatever
  JSON held);
* a join's key is checked by the join (see
  :func:`aiofragno.uow.joins.check_tree_row`).
"""

from __future__ import annotations

import datetime
import decimal
import json
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, NotRequired, Required, get_args, get_origin

from typing_extensions import ReadOnly, is_typeddict

from .column_types import ArrayType, EnumType
from .errors import SchemaError
from .schema import EXTERNAL_ID, Column, RowId, Schema, Table

PYTHON_TYPES: Mapping[str, type] = {
    "string": str,
    "text": str,
    "varchar": str,
    "enum": str,
    "smallint": int,
    "integer": int,
    "bigint": int,
    "float": float,
    "decimal": decimal.Decimal,
    "bool": bool,
    "binary": bytes,
    "date": datetime.date,
    "timestamp": datetime.datetime,
    "time": datetime.time,
    "uuid": uuid.UUID,
    "reference": RowId,
}
"""The Python type a read returns for each column type (an ``array`` is a
``list`` of its item's type; ``json`` is any JSON value)."""


JoinCheck = Callable[[str, Any], None]
"""Checks the annotation (second argument) of a key that a join adds to a
row; the first argument says where, for messages."""


def check_row_type(
    row: Any, table: Table[Any], joins: Mapping[str, JoinCheck] | None = None, within: str = ""
) -> None:
    """Raise :class:`SchemaError` unless ``row`` is a TypedDict describing
    ``table``'s rows, with a key per join in ``joins`` (see
    :func:`aiofragno.uow.joins.check_tree_row`); ``within`` says where
    ``row`` is (a join of another row type), for messages."""
    where = f"{within}row type {getattr(row, '__qualname__', row)!r} of table {table.name!r}"
    if not is_typeddict(row):
        raise SchemaError(f"{where}: expected a TypedDict class, got {row!r}")
    hints, optional = _hints(row, where)
    if optional:
        raise SchemaError(
            f"{where}: every key of a row is always there; make these required: "
            f"{', '.join(sorted(optional))}"
        )
    joins = joins or {}
    expected = [EXTERNAL_ID, *table.columns, *joins]
    missing = [name for name in expected if name not in hints]
    extra = [name for name in hints if name not in expected]
    if missing or extra:
        parts = [f"missing {', '.join(missing)}"] if missing else []
        parts += [f"not in a row: {', '.join(extra)}"] if extra else []
        raise SchemaError(
            f"{where} does not match the row: {'; '.join(parts)}. "
            f"Its columns are:\n{render_row_type(table, row.__name__)}"
        )
    _check_annotation(where, EXTERNAL_ID, hints[EXTERNAL_ID], RowId, nullable=False)
    for column in table.columns.values():
        _check_column(where, column, hints[column.name])
    for name, check in joins.items():
        check(f"{where}: join {name!r}", hints[name])


def _hints(row: Any, where: str) -> tuple[dict[str, Any], set[str]]:
    """``row``'s resolved annotations, without qualifiers, and its keys
    that may be missing (``total=False`` or ``NotRequired``: seen from the
    annotations too, which ``__optional_keys__`` misses for string
    annotations before Python 3.12)."""
    try:
        hints = typing.get_type_hints(row, include_extras=True)
    except Exception as exc:  # (an unresolved forward reference, say)
        raise SchemaError(f"{where}: its annotations do not resolve: {exc}") from None
    optional = set(row.__optional_keys__)
    for name, hint in hints.items():
        while get_origin(hint) in _QUALIFIERS:
            if get_origin(hint) is NotRequired:
                optional.add(name)
            elif get_origin(hint) is Required:
                optional.discard(name)
            hint = get_args(hint)[0]
        hints[name] = hint
    return hints, optional


_QUALIFIERS = (Annotated, NotRequired, Required, ReadOnly)


def _check_column(where: str, column: Column, hint: Any) -> None:
    if column.kind == "json":
        return  # (any type: the JSON's shape is the user's to state)
    expected: Any = PYTHON_TYPES.get(column.kind)
    if column.kind == "array" and isinstance(column.arg, ArrayType):
        expected = types.GenericAlias(list, PYTHON_TYPES[column.arg.element])
    assert expected is not None, column.kind
    if column.kind == "enum" and isinstance(column.arg, EnumType):
        hint = _enum_as_str(where, column, column.arg, hint)
    _check_annotation(where, column.name, hint, expected, nullable=column.nullable)


def _enum_as_str(where: str, column: Column, enum: EnumType, hint: Any) -> Any:
    """A ``Literal`` of declared values (``| None``) stands for ``str``."""
    literals = [arg for arg in members(hint) if get_origin(arg) is Literal]
    for literal in literals:
        unknown = [value for value in get_args(literal) if value not in enum.values]
        if unknown:
            raise SchemaError(
                f"{where}: {column.name!r} is {enum}; its Literal names other values: {unknown}"
            )
    if not literals:
        return hint
    rest = [arg for arg in members(hint) if get_origin(arg) is not Literal]
    return union([str, *rest])


def _check_annotation(where: str, name: str, hint: Any, expected: Any, *, nullable: bool) -> None:
    wanted = union([expected, type(None)]) if nullable else expected
    if set(members(hint)) != set(members(wanted)):
        raise SchemaError(
            f"{where}: {name!r} is annotated {_spell(hint)}, but a read returns {_spell(wanted)}"
        )


def members(hint: Any) -> list[Any]:
    if get_origin(hint) in (typing.Union, types.UnionType):
        return list(get_args(hint))
    return [hint]


def union(items: Iterable[Any]) -> Any:
    return typing.Union[tuple(items)]  # noqa: UP007 (a runtime-built union)


def _spell(hint: Any) -> str:
    if len(members(hint)) > 1:
        return " | ".join(map(_spell, members(hint)))
    if isinstance(hint, type) and not get_args(hint):
        return "None" if hint is type(None) else hint.__qualname__
    return repr(hint).replace("typing.", "").replace("NoneType", "None")


# -- writing row types -------------------------------------------------------


def render_row_type(table: Table[Any], name: str | None = None) -> str:
    """The TypedDict source for ``table``'s rows (``class <name>(TypedDict):``;
    by default the table's name in CamelCase + ``Row``)."""
    lines = [f"class {name or row_type_name(table.name)}(TypedDict):", "    id: RowId"]
    for column in table.columns.values():
        spelled = _spell_column(column)
        nullable = column.nullable and column.kind != "json"  # (Any holds None)
        lines.append(f"    {column.name}: {spelled}{' | None' if nullable else ''}")
    return "\n".join(lines)


def render_module(schema: Schema) -> str:
    """A module of row types for every table of ``schema`` (what
    ``aiofragno typegen`` writes)."""
    header = [
        f'"""Row types of schema {schema.name!r}, written by aiofragno typegen."""',
        "",
        "from __future__ import annotations",
        "",
        "import datetime",
        "import decimal",
        "import uuid",
        "from typing import Any, Literal, TypedDict",
        "",
        "from aiofragno import RowId",
    ]
    classes = [render_row_type(table) for table in schema.tables.values()]
    return "\n".join(header) + "\n\n\n" + "\n\n\n".join(classes) + "\n"


def row_type_name(table_name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in table_name.split("_")) + "Row"


def _spell_column(column: Column) -> str:
    if column.kind == "json":
        return "Any"
    if column.kind == "enum" and isinstance(column.arg, EnumType):
        values = (json.dumps(value, ensure_ascii=False) for value in column.arg.values)
        return f"Literal[{', '.join(values)}]"
    if column.kind == "array" and isinstance(column.arg, ArrayType):
        return f"list[{_spell_type(PYTHON_TYPES[column.arg.element])}]"
    return _spell_type(PYTHON_TYPES[column.kind])


def _spell_type(python_type: type) -> str:
    module = python_type.__module__
    if module in ("builtins",) or python_type is RowId:
        return python_type.__qualname__
    return f"{module}.{python_type.__qualname__}"
