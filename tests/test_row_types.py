"""A table's row type (``af.Table(..., row=...)``) is checked against the
declaration when given: every key, every type, nullability, qualifiers
that would make a key optional; and ``aiofragno typegen`` writes row types
that pass that check for every column type."""

from __future__ import annotations

import datetime
import decimal
import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional, Required, TypedDict

import pytest

import aiofragno as af
from aiofragno.cli import main
from aiofragno.row_types import render_module

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


def test_an_enum_is_a_str_or_a_literal_of_declared_values() -> None:
    for row in (Statuses, Status):
        af.Table("orders", af.Column("status", af.enum("new", "paid", "gone")), row=row)
    with pytest.raises(af.SchemaError, match=r"Literal names other values: \['paid'\]"):
        af.Table("orders", af.Column("status", af.enum("new")), row=Statuses)


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

    spec = importlib.util.spec_from_file_location("every_rows", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["every_rows"] = module
    try:  # (get_type_hints resolves the annotations in the module)
        spec.loader.exec_module(module)
        for name, table in EVERY_TYPE.tables.items():
            row = getattr(module, "".join(part.title() for part in name.split("_")) + "Row")
            af.Table(name, *table.columns.values(), row=row)
    finally:
        del sys.modules["every_rows"]
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
