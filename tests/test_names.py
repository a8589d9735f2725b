"""Names, without a database: validation leaves no way around it (a final
newline), system schemas are no namespaces, and no two declared tables — in
one layout or in several of one Database — become one physical table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import aiofragno as af
from aiofragno.naming import Layout, PhysicalNames, SuffixNaming
from aiofragno.outbox.versionstamp import check_versionstamp
from aiofragno.ownership import INTERNAL_TABLES

SUFFIX = SuffixNaming()

# A name followed by "\n": Python's "$" matches before a final newline.
NEWLINE_NAMES: dict[str, Callable[[], Any]] = {
    "schema": lambda: af.Schema("shop\n"),
    "table": lambda: af.Table("accounts\n"),
    "column": lambda: af.Column("owner\n", "string"),
    "index": lambda: af.Index("by_owner\n", ["owner"]),
    "reference": lambda: af.Reference("src\n", "accounts"),
    "referenced table": lambda: af.Reference("src", "accounts\n"),
}


@pytest.mark.parametrize("what", NEWLINE_NAMES)
def test_a_name_ending_in_a_newline_is_refused(what: str) -> None:
    with pytest.raises(af.SchemaError, match="bad"):
        NEWLINE_NAMES[what]()


def test_a_versionstamp_ending_in_a_newline_is_refused() -> None:
    stamp = "0" * 24
    assert check_versionstamp(stamp) == stamp
    with pytest.raises(af.ValidationError, match="24 lowercase hex digits"):
        check_versionstamp(stamp + "\n")


SYSTEM_SCHEMAS = [
    "information_schema",
    "INFORMATION_SCHEMA",
    "pg_catalog",
    "pg_toast",
    "Pg_Temp_3",
    "pg_mine",
    "mysql",
    "MySQL",
    "performance_schema",
    "sys",
    "SYS",
]


def schema_of(*tables: str) -> af.Schema:
    return af.Schema("s", *(af.Table(name, af.Column("v", "string")) for name in tables))


@pytest.mark.parametrize("name", SYSTEM_SCHEMAS)
def test_a_system_schema_is_no_namespace(name: str) -> None:
    with pytest.raises(af.ValidationError, match="reserved for the database's own catalog"):
        Layout(schema_of("t"), name, SUFFIX, 63)


class FixedSchema:
    """Puts every table in one database schema."""

    def __init__(self, db_schema: str) -> None:
        self.db_schema = db_schema

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return self.db_schema, table

    def index(self, namespace: str, table: str, index: str) -> str:
        return index

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return column


@pytest.mark.parametrize("name", SYSTEM_SCHEMAS)
def test_a_naming_strategy_cannot_use_a_system_schema(name: str) -> None:
    with pytest.raises(af.ValidationError, match="reserved for the database's own catalog"):
        Layout(schema_of("t"), "shop", FixedSchema(name), 63)


class OneTable:
    """Maps every table to one physical table (a broken custom strategy)."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return None, f"all_{namespace}"

    def index(self, namespace: str, table: str, index: str) -> str:
        return f"ix_{namespace}_{table}_{index}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk_{namespace}_{table}_{column}"


def test_two_tables_of_one_layout_cannot_be_one_table() -> None:
    with pytest.raises(af.SchemaError, match=r"tables 'a' and 'b' of namespace 'ns'.*'all_ns'"):
        Layout(schema_of("a", "b"), "ns", OneTable(), 63)


def test_suffix_names_that_collide_across_layouts_are_refused() -> None:
    names = PhysicalNames(INTERNAL_TABLES)
    # orders in eu_west and orders_eu in west are both orders_eu_west.
    names.claim(Layout(schema_of("orders"), "eu_west", SUFFIX, 63))
    west = Layout(schema_of("orders_eu"), "west", SUFFIX, 63)
    with pytest.raises(af.SchemaError) as info:
        names.claim(west)
    message = str(info.value)
    for part in (
        "'orders_eu' of namespace 'west'",
        "'orders' of namespace 'eu_west'",
        "orders_eu_west",
    ):
        assert part in message
    # Names differing only in case are one table on SQLite (and MySQL on some systems).
    with pytest.raises(af.SchemaError, match="orders_EU_WEST"):
        names.claim(Layout(schema_of("orders"), "EU_WEST", SUFFIX, 63))


def test_the_same_namespace_and_table_may_be_laid_out_again() -> None:
    """A new declaration (or a second Schema object) of the same namespace's
    table is the same table, not a collision."""
    names = PhysicalNames(INTERNAL_TABLES)
    names.claim(Layout(schema_of("orders"), "shop", SUFFIX, 63))
    names.claim(Layout(schema_of("orders", "lines"), "shop", SUFFIX, 63))


@pytest.mark.parametrize(
    ("table", "namespace"), [("fragno_db", "settings"), ("fragno_db", "outbox")]
)
def test_a_declared_table_cannot_be_an_internal_one(table: str, namespace: str) -> None:
    names = PhysicalNames(INTERNAL_TABLES)
    with pytest.raises(af.SchemaError, match=f"'fragno_db_{namespace}', which is aiofragno's own"):
        names.claim(Layout(schema_of(table), namespace, SUFFIX, 63))
