"""A table's row type (``af.Table(..., row=...)``) is checked against the
declaration when given: every key, every type, nullability, qualifiers
that would make a key optional; and ``aiofragno typegen`` writes row types
that pass that check for every column type."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import enum
import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import (  # noqa: UP035 (typing.List: one of the spellings checked)
    Annotated,
    Any,
    List,
    Literal,
    NotRequired,
    Optional,
    Required,
    TypedDict,
    Union,
)

import pytest
from typing_extensions import ReadOnly, TypeAliasType

import aiofragno as af
from aiofragno.cli import main
from aiofragno.row_types import render_module, row_type_names

EVERY_TYPE = af.Schema(
    "every",
    af.Table(
        "every_type",
        af.Column("s", "string"),
        af.Column("tx", "text", nullable=True),
        af.Column("v", af.varchar(10)),
        af.Column("e", af.enum("new", "it's", 'say "hi"', "naïve")),
        af.Column("si", "smallint"),
        af.Column("i", "integer"),
        af.Column("bi", "bigint", nullable=True),
        af.Column("f", "float"),
        af.Column("d", "decimal"),
        af.Column("b", "bool"),
        af.Column("j", "json", nullable=True),
        af.Column("bin", "binary"),
        af.Column("day", "date"),
        af.Column("at", "timestamp"),
        af.Column("t", "time"),
        af.Column("u", "uuid"),
        af.Column("arr", af.array("integer"), nullable=True),
        af.Column("tags", af.array(af.enum("x", "y"))),
    ),
    af.Table("refs", af.Reference("to", "every_type", nullable=True)),
)


class Accounts(TypedDict):
    id: af.RowId
    owner: str
    balance: int
    note: str | None


def accounts(row: Any) -> af.Table[Any]:
    return af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint"),
        af.Column("note", "string", nullable=True),
        row=row,
    )


def test_a_matching_row_type_is_taken() -> None:
    table = accounts(Accounts)
    assert table.row is Accounts


class OptionalSpelled(TypedDict):
    id: af.RowId
    owner: Annotated[str, "the owner"]
    balance: Required[int]
    note: Optional[str]  # noqa: UP045 (the old spelling is the point)


def test_equivalent_spellings_are_taken() -> None:
    accounts(OptionalSpelled)


class WrongType(TypedDict):
    id: af.RowId
    owner: str
    balance: float
    note: str | None


class NotNullable(TypedDict):
    id: af.RowId
    owner: str
    balance: int
    note: str


class Nullable(TypedDict):
    id: af.RowId
    owner: str | None
    balance: int
    note: str | None


class NoId(TypedDict):
    owner: str
    balance: int
    note: str | None


class IdAsStr(TypedDict):
    id: str
    owner: str
    balance: int
    note: str | None


class Extra(Accounts):
    email: str


class MaybeMissing(TypedDict):
    id: af.RowId
    owner: str
    balance: int
    note: NotRequired[str | None]


class NotTotal(TypedDict, total=False):
    id: af.RowId
    owner: str
    balance: int
    note: str | None


class Unresolved(TypedDict):
    id: af.RowId
    owner: Nowhere  # type: ignore[name-defined]  # noqa: F821
    balance: int
    note: str | None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (WrongType, "'balance' is annotated float, but a read returns int"),
        (NotNullable, "'note' is annotated str, but a read returns str | None"),
        (Nullable, "'owner' is annotated str | None, but a read returns str"),
        (NoId, "missing id"),
        (IdAsStr, "'id' is annotated str, but a read returns RowId"),
        (Extra, "not in a row: email"),
        (MaybeMissing, "make these required: note"),
        (NotTotal, "make these required: balance, id, note, owner"),
        (Unresolved, "annotations do not resolve: name 'Nowhere'"),
        (dict, "expected a TypedDict class"),
        (int, "expected a TypedDict class"),
    ],
)
def test_a_row_type_unlike_the_table_is_refused(row: Any, message: str) -> None:
    with pytest.raises(af.SchemaError, match=message.replace("[", r"\[").replace("]", r"\]")):
        accounts(row)


class Statuses(TypedDict):
    id: af.RowId
    status: Literal["new", "paid"]


class Status(TypedDict):
    id: af.RowId
    status: str


class Paint(enum.StrEnum):
    NEW = "new"
    PAID = "paid"


def test_an_enum_is_a_str_or_a_literal_of_every_declared_value() -> None:
    """A read returns any declared value, as a plain str: a Literal naming
    only some (a row with another would be typed as what it is not), or
    str-Enum members equal to them, is refused."""
    for row in (Statuses, Status):
        af.Table("orders", af.Column("status", af.enum("new", "paid")), row=row)
    with pytest.raises(af.SchemaError, match=r"Literal names other values: \['paid'\]"):
        af.Table("orders", af.Column("status", af.enum("new")), row=Statuses)
    with pytest.raises(af.SchemaError, match=r"its Literal leaves out \['gone'\]"):
        af.Table("orders", af.Column("status", af.enum("new", "paid", "gone")), row=Statuses)
    members = TypedDict("members", {"id": af.RowId, "status": Literal[Paint.NEW, Paint.PAID]})  # noqa: UP013
    with pytest.raises(af.SchemaError, match="Literal names other values"):
        af.Table("orders", af.Column("status", af.enum("new", "paid")), row=members)


Alias = TypeAliasType("Alias", int | None)


@pytest.mark.parametrize(
    "hint",
    [
        Annotated[int, "n"] | None,
        Optional[Annotated[int, "n"]],  # noqa: UP045 (the old spelling is the point)
        Alias,
        ReadOnly[int | None],
        Union[None, int],  # noqa: UP007
    ],
)
def test_a_nullable_column_in_every_spelling(hint: Any) -> None:
    row = TypedDict("row", {"id": af.RowId, "n": hint, "a": List[int]})  # noqa: UP006, UP013
    af.Table(
        "t", af.Column("n", "integer", nullable=True), af.Column("a", af.array("integer")), row=row
    )


def test_a_nullable_json_column_admits_none() -> None:
    """Any type states a json column's shape, but a NULL reads as None."""
    column = af.Column("doc", "json", nullable=True)
    rows: Any = TypedDict  # (rows built from hints: no static type to check)
    for hint in (dict[str, Any] | None, Any, object):
        af.Table("docs", column, row=rows("ok", {"id": af.RowId, "doc": hint}))
    with pytest.raises(af.SchemaError, match="nullable json column"):
        af.Table("docs", column, row=rows("lie", {"id": af.RowId, "doc": dict[str, Any]}))
    af.Table("docs", af.Column("doc", "json"), row=rows("r", {"id": af.RowId, "doc": list[int]}))


def test_a_table_stays_as_its_row_type_was_checked() -> None:
    """The row type, columns and indexes of a table cannot change after the
    check (a Schema holds the same object)."""
    table = accounts(Accounts)
    with pytest.raises(AttributeError):
        table.row = Statuses  # type: ignore[misc]
    with pytest.raises(TypeError):
        table.columns["email"] = af.Column("email", "string")  # type: ignore[index]
    with pytest.raises(TypeError):
        table.indexes["by"] = af.Index("by", ["owner"])  # type: ignore[index]
    assert list(table.columns) == ["owner", "balance", "note"] and table.row is Accounts


ODD = af.Schema(
    "odd",
    af.Table(
        "class",
        af.Column("from", "string"),
        af.Column("None", "integer", nullable=True),
        af.Column("match", af.enum("a", "b")),
        af.Column("datetime", "date"),
        af.Column("at", "timestamp"),
    ),
    af.Table("order_item", af.Column("n", "integer")),
    af.Table("orderItem", af.Reference("async", "class", nullable=True)),
    af.Table("plain", af.Column("type", "string")),
)


def test_typegen_spells_odd_names(tmp_path: Path) -> None:
    """Column names that are keywords get the functional syntax; tables whose
    CamelCase names would collide get distinct names; every class matches."""
    written = render_module(ODD)
    assert 'ClassRow = TypedDict(\n    "ClassRow",' in written
    assert '        "from": str,\n' in written and '"async": RowId | None' in written
    assert "class Row_order_item(TypedDict):" in written and "Row_orderItem" in written
    assert "class PlainRow(TypedDict):\n    id: RowId\n    type: str\n" in written
    with loaded(tmp_path / "odd_rows.py", written) as module:
        for table, name in row_type_names(ODD).items():
            af.Table(table, *ODD.tables[table].columns.values(), row=getattr(module, name))


def test_typegen_writes_row_types_that_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every column type, nullable or not, enum values needing escapes: the
    module ``aiofragno typegen`` writes imports, and each of its classes is
    accepted as ``row=`` of its table."""
    (tmp_path / "declared.py").write_text(
        "from tests.test_row_types import EVERY_TYPE as schema\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "every_rows.py"
    assert main(["typegen", "declared:schema", "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_module(EVERY_TYPE)
    assert main(["typegen", "declared:schema"]) == 0
    assert capsys.readouterr().out == render_module(EVERY_TYPE)

    with loaded(out, out.read_text(encoding="utf-8")) as module:
        for name, table in EVERY_TYPE.tables.items():
            row = getattr(module, "".join(part.title() for part in name.split("_")) + "Row")
            af.Table(name, *table.columns.values(), row=row)
    written = out.read_text(encoding="utf-8")
    assert """    e: Literal["new", "it's", "say \\"hi\\"", "naïve"]\n""" in written
    assert "    j: Any\n" in written and "    arr: list[int] | None\n" in written
    for python_type in (decimal.Decimal, datetime.time, uuid.UUID):
        assert f"{python_type.__module__}.{python_type.__qualname__}" in written


def test_typegen_of_something_else_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["typegen", "tests.test_row_types:accounts"]) == 1
    assert "af.Schema" in capsys.readouterr().err


@contextlib.contextmanager
def loaded(path: Path, source: str) -> Iterator[Any]:
    """``source`` imported as a module, in sys.modules meanwhile
    (get_type_hints resolves a TypedDict's annotations in its module)."""
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[path.stem]
