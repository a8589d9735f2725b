"""Schema declarations and naming strategies, without a database: every invalid
declaration raises SchemaError; physical names are deterministic, distinct and
within the identifier limit; custom strategies plug in."""

from __future__ import annotations

import datetime as dt
import enum
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

import aiofragno as af
from aiofragno.naming import Layout, SchemaNaming, SuffixNaming, resolve_naming, shorten
from aiofragno.schema import new_external_id, tables_in_dependency_order

C = af.Column


class Level(enum.IntEnum):
    LOW = 1


T = af.Table
S = af.Schema

INVALID: dict[str, Callable[[], Any]] = {
    # names
    "schema name empty": lambda: S(""),
    "schema name starts with a digit": lambda: S("1shop"),
    "schema name with a dash": lambda: S("my-shop"),
    "schema name not a str": lambda: S(5),  # type: ignore[arg-type]
    "schema name reserved prefix": lambda: S("_shop"),
    "schema name 64 chars": lambda: S("s" * 64),
    "table name with a space": lambda: T("my table"),
    "table name with a quote": lambda: T('a"b'),
    "table name reserved prefix": lambda: T("_internal"),
    "table name 64 chars": lambda: T("t" * 64),
    "table name not a str": lambda: T(None),  # type: ignore[arg-type]
    "table name non-ascii": lambda: T("tablé"),
    "column name with a dot": lambda: C("a.b", "string"),
    "column name reserved prefix": lambda: C("_version", "integer"),
    "column name _id": lambda: C("_id", "bigint"),
    "column name 64 chars": lambda: C("c" * 64, "string"),
    "column name empty": lambda: C("", "string"),
    "index name with a semicolon": lambda: af.Index("i;drop", ["a"]),
    "index name reserved prefix": lambda: af.Index("_i", ["a"]),
    "reference name bad": lambda: af.Reference("1ref", "t"),
    "reference target bad": lambda: af.Reference("ref", "bad-table"),
    # types
    "unknown type": lambda: C("a", "double"),
    "type misspelt": lambda: C("a", "String"),
    "type reference as a string": lambda: C("a", "reference"),
    "bare varchar without length": lambda: C("a", "varchar"),
    "type not a str": lambda: C("a", int),  # type: ignore[arg-type]
    "varchar(0)": lambda: af.varchar(0),
    "varchar(-1)": lambda: af.varchar(-1),
    "varchar(16384)": lambda: af.varchar(16384),
    "varchar('10')": lambda: af.varchar("10"),  # type: ignore[arg-type]
    "varchar(True)": lambda: af.varchar(True),
    "varchar(2.5)": lambda: af.varchar(2.5),  # type: ignore[arg-type]
    "bare enum without values": lambda: C("a", "enum"),
    "enum()": lambda: af.enum(),
    "enum value twice": lambda: af.enum("a", "b", "a"),
    "enum value not a str": lambda: af.enum("a", 1),  # type: ignore[arg-type]
    "enum of an int enum": lambda: af.enum(Level),
    "enum value with NUL": lambda: af.enum("a\x00"),
    "enum value with a lone surrogate": lambda: af.enum("\ud800"),
    "enum value of 256 characters": lambda: af.enum("x" * 256),
    "bare array without items": lambda: C("a", "array"),
    "array of json": lambda: af.array("json"),
    "array of arrays": lambda: af.array(af.array("integer")),  # type: ignore[arg-type]
    "array of bare varchar": lambda: af.array("varchar"),
    "array of an unknown type": lambda: af.array("double"),
    # defaults that do not fit the type
    "bigint default str": lambda: C("a", "bigint", default="0"),
    "smallint default out of range": lambda: C("a", "smallint", default=2**15),
    "float default NaN": lambda: C("a", "float", default=float("nan")),
    "enum default not in the set": lambda: C("a", af.enum("x"), default="y"),
    "time default with a time zone": lambda: C("a", "time", default=dt.time(tzinfo=dt.UTC)),
    "uuid default str": lambda: C("a", "uuid", default=str(uuid.uuid4())),
    "array default with None": lambda: C("a", af.array("integer"), default=[1, None]),
    "bigint default out of range": lambda: C("a", "bigint", default=2**63),
    "integer default out of range": lambda: C("a", "integer", default=2**31),
    "integer default bool": lambda: C("a", "integer", default=True),
    "integer default float": lambda: C("a", "integer", default=1.0),
    "decimal default float": lambda: C("a", "decimal", default=0.1),
    "decimal default NaN": lambda: C("a", "decimal", default=Decimal("NaN")),
    "decimal default Infinity": lambda: C("a", "decimal", default=Decimal("-Infinity")),
    "bool default int": lambda: C("a", "bool", default=1),
    "string default int": lambda: C("a", "string", default=5),
    "string default bytes": lambda: C("a", "string", default=b"x"),
    "varchar default too long": lambda: C("a", af.varchar(3), default="abcd"),
    "binary default str": lambda: C("a", "binary", default="x"),
    "json default not JSON": lambda: C("a", "json", default={1, 2}),
    "json default NaN": lambda: C("a", "json", default=float("nan")),
    "date default datetime": lambda: C("a", "date", default=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
    "date default str": lambda: C("a", "date", default="2024-01-01"),
    "timestamp default naive": lambda: C("a", "timestamp", default=dt.datetime(2024, 1, 1)),
    "timestamp default date": lambda: C("a", "timestamp", default=dt.date(2024, 1, 1)),
    # tables
    "reserved column id": lambda: T("t", C("id", "string")),
    "reserved column id as reference": lambda: S("s", T("t", af.Reference("id", "t"))),
    "column declared twice": lambda: T("t", C("a", "string"), C("a", "bigint")),
    "index declared twice": lambda: T(
        "t", C("a", "string"), af.Index("i", ["a"]), af.Index("i", ["a"], unique=True)
    ),
    "index on unknown column": lambda: T("t", C("a", "string"), af.Index("i", ["b"])),
    "index on hidden _version": lambda: T("t", C("a", "string"), af.Index("i", ["_version"])),
    "index without columns": lambda: af.Index("i", []),
    "index columns as one str": lambda: af.Index("i", "a"),
    "index names a column twice": lambda: af.Index("i", ["a", "a"]),
    "table item not a column": lambda: T("t", "a"),  # type: ignore[arg-type]
    "table item a table": lambda: T("t", T("u")),  # type: ignore[arg-type]
    # schemas
    "table declared twice": lambda: S("s", T("t"), T("t", C("a", "string"))),
    "schema item not a table": lambda: S("s", C("a", "string")),  # type: ignore[arg-type]
    "reference to unknown table": lambda: S("s", T("t", af.Reference("r", "missing"))),
}


@pytest.mark.parametrize("build", INVALID.values(), ids=INVALID.keys())
def test_invalid_declaration_raises_schema_error(build: Callable[[], Any]) -> None:
    with pytest.raises(af.SchemaError):
        build()


def test_schema_error_names_the_table_and_column() -> None:
    with pytest.raises(af.SchemaError, match=r"'owner'.*'accounts'"):
        T("accounts", C("owner", "string"), C("owner", "string"))
    with pytest.raises(af.SchemaError, match=r"'src'.*'transfers'.*'nowhere'"):
        S("shop", T("transfers", af.Reference("src", "nowhere")))


def test_valid_declaration_from_the_design() -> None:
    shop = S(
        "shop",
        T(
            "accounts",
            C("owner", "string"),
            C("balance", "bigint", default=0),
            C("note", "string", nullable=True),
            af.Index("by_owner", ["owner"]),
        ),
        T(
            "transfers",
            af.Reference("src", "accounts"),
            af.Reference("dst", "accounts"),
            C("amount", "bigint"),
        ),
    )
    assert list(shop.tables) == ["accounts", "transfers"]
    accounts = shop.table("accounts")
    assert list(accounts.columns) == ["owner", "balance", "note"]
    assert accounts.columns["balance"].default == 0
    assert accounts.columns["note"].nullable is True
    assert accounts.columns["owner"].nullable is False
    transfers = shop.table("transfers")
    assert transfers.columns["src"].type_name == "reference(accounts)"
    assert [t.name for t in tables_in_dependency_order(shop)] == ["accounts", "transfers"]
    with pytest.raises(af.ValidationError):
        shop.table("nope")
    with pytest.raises(af.ValidationError):
        accounts.column("nope")


def test_every_documented_type_is_accepted_with_a_fitting_default() -> None:
    defaults: dict[str, Any] = {
        "string": "x",
        "text": "x" * 10_000,
        "integer": -(2**31),
        "bigint": 2**63 - 1,
        "decimal": Decimal("12345678901234567890.123456789"),
        "bool": False,
        "json": {"a": [1, None, "b"]},
        "binary": b"\x00\xff",
        "date": dt.date(2024, 2, 29),
        "timestamp": dt.datetime(2024, 2, 29, 12, tzinfo=dt.UTC),
        "smallint": -(2**15),
        "float": -0.0,
        "time": dt.time(23, 59, 59, 999999),
        "uuid": uuid.UUID(int=1),
    }
    columns = [C(f"c_{kind}", kind, default=value) for kind, value in defaults.items()]
    columns.append(C("c_varchar", af.varchar(3), default="abc"))
    columns.append(C("c_enum", af.enum("a", "it's"), default="it's"))
    columns.append(C("c_array", af.array(af.varchar(2)), default=["ab", ""]))
    table = T("t", *columns)
    assert [c.type_name for c in table.columns.values()] == [
        *defaults,
        "varchar(3)",
        "enum('a', \"it's\")",
        "array(varchar(2))",
    ]
    assert table.columns["c_varchar"].length == 3
    assert table.columns["c_enum"].length is None
    # Boundary names are fine: 63 characters, digits and underscores after a letter.
    T("t" * 63, C("c" * 63, "string"), af.Index("i" * 63, ["c" * 63]))
    T("a_1", C("b2_", "string"))


def test_index_may_use_the_external_id() -> None:
    table = T("t", C("a", "string"), af.Index("by_id_a", ["id", "a"], unique=True))
    assert table.indexes["by_id_a"].columns == ("id", "a")


def test_self_reference_and_cycles_are_allowed() -> None:
    schema = S(
        "s",
        T("node", af.Reference("parent", "node", nullable=True)),
        T("a", af.Reference("b", "b", nullable=True)),
        T("b", af.Reference("a", "a", nullable=True)),
    )
    assert {t.name for t in tables_in_dependency_order(schema)} == {"node", "a", "b"}


def _shop(**balance_kwargs: Any) -> af.Schema:
    return S("shop", T("accounts", C("owner", "string"), C("balance", "bigint", **balance_kwargs)))


def test_fingerprint_follows_the_declaration() -> None:
    assert _shop().fingerprint == _shop().fingerprint
    assert _shop().fingerprint != _shop(default=0).fingerprint
    assert _shop(default=0).fingerprint != _shop(default=1).fingerprint
    assert _shop().fingerprint != _shop(nullable=True).fingerprint
    more = S(
        "shop",
        T("accounts", C("owner", "string"), C("balance", "bigint"), af.Index("i", ["owner"])),
    )
    assert more.fingerprint != _shop().fingerprint


# -- naming -------------------------------------------------------------------


def test_suffix_and_schema_naming() -> None:
    shop = S("shop", T("accounts", C("owner", "string"), af.Index("by_owner", ["owner"])))
    suffix = Layout(shop, "shop", SuffixNaming(), 63)
    physical = suffix.table("accounts")
    assert (physical.schema, physical.name) == (None, "accounts_shop")
    assert physical.identifier.parts == ("accounts_shop",)
    assert suffix.index_name("accounts", "by_owner") == "ix_accounts_shop__by_owner"
    assert suffix.db_schemas == []
    per_schema = Layout(shop, "tenant1", SchemaNaming(), 63)
    physical = per_schema.table("accounts")
    assert (physical.schema, physical.name) == ("tenant1", "accounts")
    assert physical.identifier.parts == ("tenant1", "accounts")
    assert per_schema.db_schemas == ["tenant1"]
    with pytest.raises(af.ValidationError):
        per_schema.table("missing")


def test_resolve_naming() -> None:
    assert isinstance(resolve_naming("suffix"), SuffixNaming)
    assert isinstance(resolve_naming("schema"), SchemaNaming)
    custom = SuffixNaming()
    assert resolve_naming(custom) is custom
    with pytest.raises(af.ValidationError):
        resolve_naming("prefix")


@pytest.mark.parametrize("limit", [63, 64])
def test_shorten_is_deterministic_distinct_and_within_the_limit(limit: int) -> None:
    fits = "x" * limit
    assert shorten(fits, limit) == fits
    names = [f"{'a' * 70}{i}" for i in range(200)] + ["b" * 1000, "a" * (limit + 1)]
    short = [shorten(n, limit) for n in names]
    assert all(len(s.encode()) <= limit for s in short)
    assert len(set(short)) == len(names)
    assert short == [shorten(n, limit) for n in names]
    # Long names keep a readable head.
    assert short[0].startswith("a" * 40)
    # Multi-byte text is cut on a character boundary, within the byte limit.
    wide = shorten("é" * 100, limit)
    assert len(wide.encode()) <= limit
    wide.encode().decode()


@pytest.mark.parametrize("naming", [SuffixNaming(), SchemaNaming()], ids=["suffix", "schema"])
def test_long_names_are_shortened_in_the_layout(naming: Any) -> None:
    head = "t" * 60
    schema = S(
        "s",
        T(head + "one", C("c" * 63, "string"), af.Index("i" * 63, ["c" * 63])),
        T(head + "two", af.Reference("r" * 63, head + "one"), af.Index("i" * 63, ["r" * 63])),
    )
    namespace = "n" * 63
    layout = Layout(schema, namespace, naming, 63)
    again = Layout(schema, namespace, naming, 63)
    tables = [layout.table(name) for name in schema.tables]
    names = [(t.schema, t.name) for t in tables]
    assert names == [(t.schema, t.name) for t in (again.table(n) for n in schema.tables)]
    assert len(set(names)) == 2
    for physical in tables:
        assert len(physical.name) <= 63
        assert physical.schema is None or len(physical.schema) <= 63
    indexes = {layout.index_name(t, "i" * 63) for t in schema.tables}
    assert len(indexes) == 2
    assert all(len(name) <= 63 for name in indexes)
    fk = layout.foreign_key_name(head + "two", "r" * 63)
    assert len(fk) <= 63
    assert fk == again.foreign_key_name(head + "two", "r" * 63)


def _colliding_indexes() -> af.Schema:
    # Natural names whose strategies' concatenations meet: user + role_idx,
    # user_role + idx.
    return S(
        "s",
        T("user", C("a", "string"), af.Index("role_idx", ["a"])),
        T("user_role", C("a", "string"), af.Index("idx", ["a"])),
    )


def _index_scopes(layout: Layout) -> list[tuple[Any, str]]:
    """(scope, physical index name) for every declared index; the scope is
    where the database wants index names unique (the table's schema)."""
    out = []
    for table in layout.schema.tables.values():
        physical = layout.table(table.name)
        for index in table.indexes.values():
            out.append((physical.schema, layout.index_name(table.name, index.name)))
    return out


def test_suffix_naming_keeps_index_names_distinct() -> None:
    layout = Layout(_colliding_indexes(), "ns", SuffixNaming(), 63)
    scoped = _index_scopes(layout)
    assert len(set(scoped)) == len(scoped)


def test_schema_naming_keeps_index_names_distinct() -> None:
    layout = Layout(_colliding_indexes(), "ns", SchemaNaming(), 63)
    scoped = _index_scopes(layout)
    assert len(set(scoped)) == len(scoped), scoped


class PrefixNaming:
    """A custom strategy: ``<namespace>__<table>`` in the default schema."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return None, f"{namespace}__{table}"

    def index(self, namespace: str, table: str, index: str) -> str:
        return f"ix__{namespace}__{table}__{index}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk__{namespace}__{table}__{column}"


def test_custom_naming_strategy_in_the_layout() -> None:
    schema = S(
        "s",
        T("a", C("x", "string"), af.Index("by_x", ["x"])),
        T("b", af.Reference("a", "a")),
    )
    layout = Layout(schema, "app", PrefixNaming(), 63)
    assert layout.table("a").name == "app__a"
    assert layout.table("b").schema is None
    assert layout.index_name("a", "by_x") == "ix__app__a__by_x"
    assert layout.foreign_key_name("b", "a") == "fk__app__b__a"
    long = Layout(schema, "n" * 63, PrefixNaming(), 63)
    assert len(long.table("a").name) == 63
    assert long.table("a").name != long.table("b").name


def test_external_ids_are_uuid7() -> None:
    """RFC 9562 version 7: the creation millisecond up front (so ids sort by
    it), the version and variant bits set, the other 74 bits random."""
    before = time.time_ns() // 1_000_000
    ids = [new_external_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # lowercase, canonical dashes
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after
    # Every random position varies: the variant nibble takes all of 8, 9, a, b
    # and the bits around version and variant are not fixed.
    assert {text[19] for text in ids} == set("89ab")
    for position in (15, 16, 17, 20, 35):
        assert len({text[position] for text in ids}) == 16, position


def test_declarations_held_by_a_table_cannot_change() -> None:
    """The Table checked its columns, indexes and drops (names, renames, a
    row type) when it was built: changing one afterwards would make the
    schema say something it never checked, so it raises."""
    amount = af.Column("amount", "bigint")
    owner = af.Reference("owner", "people", nullable=True)
    by_amount = af.Index("by_amount", ["amount"])
    gone = af.Dropped("legacy")
    amount.nullable = True  # (not yet in a table: still being declared)
    table = af.Table("payments", amount, owner, by_amount, gone)
    changes: list[tuple[object, str, object]] = [
        (amount, "nullable", False),
        (amount, "kind", "text"),
        (amount, "default", 1),
        (owner, "to_table", "accounts"),
        (by_amount, "unique", True),
        (by_amount, "columns", ("id",)),
        (gone, "name", "other"),
    ]
    for item, attribute, value in changes:
        before = getattr(item, attribute)
        with pytest.raises(af.SchemaError, match="belongs to a Table and cannot change"):
            setattr(item, attribute, value)
        assert getattr(item, attribute) == before
    assert table.columns["amount"].nullable is True
