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
import keyword
import types
import typing
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal, NotRequired, Required, get_args, get_origin

import typing_extensions as te
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
_ALIAS_TYPES: tuple[type, ...] = tuple(
    {te.TypeAliasType, getattr(typing, "TypeAliasType", te.TypeAliasType)}
)


def _check_column(where: str, column: Column, hint: Any) -> None:
    if column.kind == "json":
        # Any type: the JSON's shape is the user's to state; but a nullable
        # column's NULL reads as None, whatever the JSON.
        if column.nullable and not _admits_none(hint):
            raise SchemaError(
                f"{where}: {column.name!r} is a nullable json column, which reads as None "
                f"where it is NULL: annotate it {_spell(hint)} | None (or Any)"
            )
        return
    expected: Any = PYTHON_TYPES.get(column.kind)
    if column.kind == "array" and isinstance(column.arg, ArrayType):
        expected = types.GenericAlias(list, PYTHON_TYPES[column.arg.element])
    assert expected is not None, column.kind
    if column.kind == "enum" and isinstance(column.arg, EnumType):
        hint = _enum_as_str(where, column, column.arg, hint)
    _check_annotation(where, column.name, hint, expected, nullable=column.nullable)


def _enum_as_str(where: str, column: Column, enum: EnumType, hint: Any) -> Any:
    """A ``Literal`` of every declared value (``| None``) stands for ``str``:
    a read returns each of them, as a plain ``str`` (never an
    ``enum.Enum`` member, even one equal to it)."""
    literals = [arg for arg in members(hint) if get_origin(arg) is Literal]
    if not literals:
        return hint
    named = [value for literal in literals for value in get_args(literal)]
    unknown = [value for value in named if type(value) is not str or value not in enum.values]
    if unknown:
        raise SchemaError(
            f"{where}: {column.name!r} is {enum}; its Literal names other values: {unknown}"
        )
    left_out = [value for value in enum.values if value not in named]
    if left_out:
        raise SchemaError(
            f"{where}: {column.name!r} is {enum}, and a read may return any of its values; "
            f"its Literal leaves out {left_out}"
        )
    rest = [arg for arg in members(hint) if get_origin(arg) is not Literal]
    return union([str, *rest])


def _check_annotation(where: str, name: str, hint: Any, expected: Any, *, nullable: bool) -> None:
    wanted = union([expected, type(None)]) if nullable else expected
    if set(members(hint)) != set(members(wanted)):
        raise SchemaError(
            f"{where}: {name!r} is annotated {_spell(hint)}, but a read returns {_spell(wanted)}"
        )


def members(hint: Any) -> list[Any]:
    """The types a hint allows, each as :func:`plain` spells it (a union's
    members, or the hint itself)."""
    hint = plain(hint)
    if get_origin(hint) in (typing.Union, types.UnionType):
        return [plain(member) for member in get_args(hint)]
    return [hint]


def plain(hint: Any) -> Any:
    """``hint`` without what does not change the type: ``Annotated``
    metadata, a type alias's name (``TypeAliasType``, the ``type``
    statement), ``typing.List`` for ``list`` — at any depth."""
    while True:
        if isinstance(hint, _ALIAS_TYPES):
            hint = getattr(hint, "__value__")  # noqa: B009 (typed as object)
        elif get_origin(hint) is Annotated:
            hint = get_args(hint)[0]
        else:
            break
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return union(plain(arg) for arg in args)
    if origin is list and args:
        return types.GenericAlias(list, tuple(plain(arg) for arg in args))
    return hint


def _admits_none(hint: Any) -> bool:
    return any(member in (type(None), Any, object) for member in members(hint))


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
    """The TypedDict source for ``table``'s rows, named ``name`` (by
    default :func:`row_type_name`): ``class <name>(TypedDict):``, or
    ``<name> = TypedDict("<name>", {...})`` where a column's name is a
    Python keyword (``class``, ``from``), which the class syntax cannot
    spell."""
    name = name or row_type_name(table.name)
    keys = [("id", "RowId")]
    for column in table.columns.values():
        nullable = column.nullable and column.kind != "json"  # (Any holds None)
        keys.append((column.name, _spell_column(column) + (" | None" if nullable else "")))
    if any(keyword.iskeyword(key) for key, _ in keys):
        # (Names are letters, digits and _: quoted as they are.)
        items = "".join(f'\n        "{key}": {spelled},' for key, spelled in keys)
        return f'{name} = TypedDict(\n    "{name}",\n    {{{items}\n    }},\n)'
    return "\n".join([f"class {name}(TypedDict):", *(f"    {k}: {t}" for k, t in keys)])


def render_module(schema: Schema) -> str:
    """A module of row types for every table of ``schema`` (what
    ``aiofragno typegen`` writes), each named by :func:`row_type_names`."""
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
    names = row_type_names(schema)
    classes = [render_row_type(table, names[table.name]) for table in schema.tables.values()]
    return "\n".join(header) + "\n\n\n" + "\n\n\n".join(classes) + "\n"


def row_type_name(table_name: str) -> str:
    """``order_items`` -> ``OrderItemsRow``."""
    return "".join(part[:1].upper() + part[1:] for part in table_name.split("_")) + "Row"


def row_type_names(schema: Schema) -> dict[str, str]:
    """Each table's row type name in a module of them all: its
    :func:`row_type_name`, unless two tables share it (``order_item`` and
    ``orderItem``) — then each of those is ``Row_<table name>`` (distinct,
    since table names are, and never a CamelCase name, which has no ``_``)."""
    names = {table: row_type_name(table) for table in schema.tables}
    taken = Counter(names.values())
    return {table: f"Row_{table}" if taken[name] > 1 else name for table, name in names.items()}


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
