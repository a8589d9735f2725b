"""How each dialect's catalog spellings of types map back to aiofragno's
types (the spellings of servers not in CI too: older MySQL display widths,
MySQL 8 without them), and how defaults compare as values."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

import aiofragno as af
from aiofragno.dialects import mysql, postgresql, sqlite
from aiofragno.driver import DdlSpec
from aiofragno.introspection import LiveColumn, LiveTable, TypeMap
from aiofragno.naming import Layout, SuffixNaming
from aiofragno.schema_diff import DefaultChanged, Differ

PG = postgresql.ADAPTER.ddl
MY = mysql.ADAPTER.ddl
LITE = sqlite._BASE.ddl


@pytest.mark.parametrize(
    ("spec", "sql_type", "types"),
    [
        (PG, "character varying(20)", ("varchar(20)",)),
        (PG, "timestamp with time zone", ("timestamp",)),
        (PG, "text", ("string", "text", "enum")),
        (PG, "uuid", ("uuid",)),
        (PG, "smallint", ("smallint",)),
        (PG, "double precision", ("float",)),
        (PG, "numeric", ("decimal",)),
        (PG, "boolean", ("bool",)),
        (PG, "jsonb", ("json",)),
        (PG, "json", ()),  # (the outbox's documents: no column type)
        (MY, "bigint(20)", ("bigint",)),
        (MY, "bigint", ("bigint",)),
        (MY, "int(11)", ("integer",)),
        (MY, "tinyint(1)", ("bool",)),
        (MY, "tinyint(4)", ()),
        (MY, "varchar(255)", ("string", "enum", "varchar(255)")),
        (MY, "binary(16)", ("uuid",)),
        (MY, "time(6)", ("time",)),
        (MY, "datetime(6)", ("timestamp",)),
        (MY, "decimal(65,30)", ("decimal",)),
        (MY, "json", ("text", "json")),  # MySQL's json; MariaDB says longtext
        (LITE, "VARCHAR(12)", ("varchar(12)",)),
        (LITE, "blob", ("binary", "uuid")),
        (LITE, "bigint", ()),
    ],
)
def test_catalog_spellings_map_back_to_column_types(
    spec: DdlSpec, sql_type: str, types: tuple[str, ...]
) -> None:
    assert TypeMap.of(spec).types(sql_type) == types


def _differ(spec: DdlSpec, table: af.Table, *, quote_backslash: bool = False) -> Differ:
    layout = Layout(af.Schema("s", table), "ns", SuffixNaming(), 63)
    type_map = TypeMap.of(spec)
    assert spec.catalog is not None

    def column_type(column: af.Column) -> str:
        return spec.types[column.kind].replace("{n}", str(column.length))

    def literal(column: af.Column) -> str | None:
        return None if column.default is None else f"'{column.default}'"

    return Differ(
        layout,
        dict(spec.types),
        type_map,
        spec.catalog,
        column_type=column_type,
        default_literal=literal,
        backslash_escapes=quote_backslash,
    )


@pytest.mark.parametrize(
    ("kind", "default", "live", "same"),
    [
        ("bigint", 5, "'5'::bigint", True),
        ("bigint", 5, "(5)", True),
        ("decimal", Decimal("0.250"), "0.25", True),
        (
            "timestamp",
            dt.datetime(2024, 2, 29, 12, tzinfo=dt.UTC),
            "'2024-02-29 12:00:00+00'::timestamp with time zone",
            True,
        ),
        (
            "timestamp",
            dt.datetime(2024, 2, 29, 12, tzinfo=dt.UTC),
            "'2024-02-29 13:00:00+00'::timestamp with time zone",
            False,
        ),
        ("json", None, None, True),
        ("bigint", 5, "'6'::bigint", False),
    ],
)
def test_defaults_compare_as_values(
    kind: str, default: object, live: str | None, same: bool
) -> None:
    column = af.Column("c", kind, nullable=True, default=default)
    differ = _differ(PG, af.Table("t", column))
    table = LiveTable(
        "t_ns",
        None,
        (
            LiveColumn("_id", "bigint", (), False, None),
            LiveColumn("id", "character varying(64)", (), False, None),
            LiveColumn("_version", "integer", (), False, "0"),
            LiveColumn("c", PG.types[kind], (), True, live),
        ),
    )
    found = [d for d in differ.diff_table(differ.layout.table("t"), table) if d.name == "c"]
    assert len(found) == (0 if same else 1)
    assert all(isinstance(d, DefaultChanged) and d.safe for d in found)
