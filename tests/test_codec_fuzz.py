"""Fuzzing every public entry point that takes values, for every dialect's
storage profile, with hostile values: the only exception allowed is
ValidationError (no TypeError, OverflowError, RecursionError, ValueError...).

A value accepted for a row must also go into its outbox entry, as the same
value. No database is needed: values are checked and encoded when queued
(reads: when compiled), before any SQL, and raw parameters when compiled;
tests/conformance/test_value_safety.py takes the same kinds of values
through the real drivers.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import sqlite3
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiofragno as af
from aiofragno import tagged_json
from aiofragno.codec import ValueCodec, as_queued
from aiofragno.dialects import mysql, postgresql, sqlite
from aiofragno.driver import DialectAdapter, QueryCompiler
from aiofragno.naming import Layout, SchemaNaming, SuffixNaming
from aiofragno.outbox.writer import entry_values
from aiofragno.schema import RowId, TableIdentity
from aiofragno.uow.catalog import Catalog
from aiofragno.uow.unit import UnitOfWork
from aiofragno.url import Options

SCHEMA = af.Schema(
    "fuzz",
    af.Table("targets", af.Column("name", "string")),
    af.Table(
        "v",
        af.Column("i", "integer", nullable=True),
        af.Column("b", "bigint", nullable=True),
        af.Column("d", "decimal", nullable=True),
        af.Column("f", "bool", nullable=True),
        af.Column("j", "json", nullable=True),
        af.Column("bin", "binary", nullable=True),
        af.Column("day", "date", nullable=True),
        af.Column("ts", "timestamp", nullable=True),
        af.Column("s", "string", nullable=True),
        af.Column("t", "text", nullable=True),
        af.Column("vc", af.varchar(8), nullable=True),
        af.Reference("ref", "targets", nullable=True),
        af.Column("sm", "smallint", nullable=True),
        af.Column("fl", "float", nullable=True),
        af.Column("u", "uuid", nullable=True),
        af.Column("en", af.enum("a", "b", ""), nullable=True),
        af.Column("tm", "time", nullable=True),
    ),
    af.Table(  # (PostgreSQL only: elsewhere every use is refused)
        "arrays",
        af.Column("ints", af.array("smallint"), nullable=True),
        af.Column("floats", af.array("float"), nullable=True),
        af.Column("names", af.array(af.enum("a", "b")), nullable=True),
        af.Column("stamps", af.array("timestamp"), nullable=True),
    ),
    af.Table(  # (pages are ordered by NOT NULL columns)
        "pages",
        af.Column("n", "bigint"),
        af.Column("s", "string"),
        af.Column("ts", "timestamp"),
        af.Column("day", "date"),
        af.Column("f", "bool"),
        af.Reference("ref", "targets"),
    ),
)
COLUMNS = [*SCHEMA.tables["v"].columns, "id"]


def _catalog(adapter: DialectAdapter, compiler: QueryCompiler, naive: str, naming: Any) -> Catalog:
    layout = Layout(SCHEMA, "ns", naming, adapter.max_identifier_length)
    codec = ValueCodec(adapter.storage, naive_datetimes=naive)
    return Catalog(layout, compiler, codec, adapter, {})


PROFILES: dict[str, Catalog] = {
    "postgresql": _catalog(
        postgresql.ADAPTER, postgresql.create_compiler(), "reject", SchemaNaming()
    ),
    "mysql": _catalog(mysql.ADAPTER, mysql.create_compiler(), "utc", SuffixNaming()),
    "sqlite-epoch-ms": _catalog(
        sqlite.adapter(Options(), sqlite3.sqlite_version_info),
        sqlite.create_compiler(),
        "reject",
        SuffixNaming(),
    ),
    "sqlite-iso-text": _catalog(
        sqlite.adapter(Options(sqlite_timestamps="iso-text"), sqlite3.sqlite_version_info),
        sqlite.create_compiler(),
        "utc",
        SuffixNaming(),
    ),
}
catalogs = pytest.mark.parametrize("catalog", PROFILES.values(), ids=PROFILES)


class NoOffset(dt.tzinfo):
    def utcoffset(self, when: dt.datetime | None) -> None:
        return None

    def dst(self, when: dt.datetime | None) -> None:
        return None


class WrongOffset(dt.tzinfo):
    def __init__(self, offset: Any) -> None:
        self.offset = offset

    def utcoffset(self, when: dt.datetime | None) -> Any:
        return self.offset

    def dst(self, when: dt.datetime | None) -> None:
        return None


def test_a_queued_value_copies_its_containers_and_shares_what_they_hold() -> None:
    """The outbox entry describes a json or array value as it was queued:
    its lists and dicts are copied, what they hold (validated, unchanging)
    is not rebuilt — a datetime whose tzinfo takes constructor arguments
    made ``copy.deepcopy`` fail with a TypeError, for a valid value (found
    by the array fuzz below on PostgreSQL)."""
    stamp = dt.datetime(2026, 1, 1, tzinfo=WrongOffset(dt.timedelta(days=-1, seconds=60)))
    value = {"a": [stamp, [1, 2]], "b": (3, [4])}
    queued = as_queued(value)
    assert queued == value and queued["a"][0] is stamp
    value["a"][1].append(9)
    value["b"][1].append(9)
    assert queued == {"a": [stamp, [1, 2]], "b": (3, [4])}
    assert as_queued(bytearray(b"x")) == b"x"


class Deep(list[Any]):
    """``[value]``: ``value`` nested ``depth`` levels (lists, or one-key
    objects), shown briefly (hypothesis's printer would recurse too deep)."""

    def __init__(self, depth: int, key: Any) -> None:
        value: Any = 1
        for _ in range(depth):
            value = [value] if key is None else {key: value}
        super().__init__([value])
        self.depth = depth
        self.key = key

    def __repr__(self) -> str:
        return f"Deep({self.depth}, {self.key!r})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


_OTHER_TABLE = TableIdentity("elsewhere", "other", ("elsewhere_other",))


class HugeInt(int):
    """An int too long for repr() (over 4300 digits), shown briefly so that
    hypothesis can print an example holding one."""

    def __repr__(self) -> str:
        return f"HugeInt(<{self.bit_length()} bits>)"


huge_ints = st.sampled_from(
    [2**63, -(2**63) - 1, 2**64, 2**31, HugeInt(10**5000), HugeInt(-(10**5000))]
)
decimals = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.builds(
        lambda sign, digits, exponent: Decimal((sign, tuple(digits), exponent)),
        st.integers(0, 1),
        st.lists(st.integers(0, 9), min_size=1, max_size=40),
        st.integers(-(10**17), 10**17) | st.integers(-20000, 140000),
    ),
    st.sampled_from([Decimal("sNaN"), Decimal("-0"), Decimal("0E+999999999999999999")]),
)
offsets = st.one_of(
    st.timedeltas(-dt.timedelta(hours=23, minutes=59), dt.timedelta(hours=23, minutes=59)),
    st.sampled_from([dt.timedelta(hours=24), dt.timedelta(hours=-24), 3600, "1h"]),
)
tzinfos = st.one_of(
    st.none(),
    st.just(dt.UTC),
    st.timedeltas(-dt.timedelta(hours=23, minutes=59), dt.timedelta(hours=23, minutes=59)).map(
        dt.timezone
    ),
    st.timezones(),
    st.just(NoOffset()),
    offsets.map(WrongOffset),
)
datetimes = st.one_of(
    st.datetimes(timezones=tzinfos),
    st.sampled_from([dt.datetime.min, dt.datetime.max]).flatmap(
        lambda edge: tzinfos.map(lambda tz: edge.replace(tzinfo=tz))
    ),
)
texts = st.one_of(
    st.text(),
    st.sampled_from(["\ud800", "a\udc80b", "\x00", "a\x00b", "\u2028", "é" * 300, "x" * 300]),
    st.sampled_from(["a", "b", ""]),  # (the enum's values)
)
row_ids = st.builds(
    RowId,
    st.text(max_size=40),
    st.none() | st.integers() | huge_ints | st.booleans(),
    st.none() | st.integers() | huge_ints,
    st.sampled_from([None, _OTHER_TABLE]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    huge_ints,
    st.floats(),
    texts,
    st.binary(max_size=40),
    decimals,
    st.dates(),
    datetimes,
    st.times(timezones=tzinfos),
    offsets.map(lambda offset: dt.time(12, tzinfo=WrongOffset(offset))),
    st.sampled_from([-0.0, 2**53, 2**53 + 1, 10**400, 2**15, -(2**15) - 1]),
    st.timedeltas(),
    st.uuids(),
    row_ids,
    st.sampled_from([object(), {1, 2}, frozenset(), bytearray(b"x"), memoryview(b"y")]),
)
json_keys = st.one_of(
    st.text(max_size=5), st.sampled_from(["$dec", "$obj", "$x"]), st.integers(), st.booleans()
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(json_keys | st.none() | st.floats(), children, max_size=4),
    ),
    max_leaves=12,
) | st.builds(Deep, st.integers(0, 3000), st.sampled_from([None, "k", "$k", 1]))
columns = st.one_of(st.sampled_from(COLUMNS), st.text(max_size=6), st.integers(), st.none())
order_bys = st.one_of(
    st.none(),
    columns,
    st.tuples(columns, st.sampled_from(["asc", "desc", "DESC", None, 1])),
    st.lists(
        st.one_of(
            columns,
            st.tuples(columns, st.sampled_from(["asc", "desc", ["desc"]])),
            st.lists(columns, max_size=3),
        ),
        max_size=3,
    ),
    st.dictionaries(columns, st.sampled_from(["asc", "desc"]), max_size=2),
    values,
)


def refuses_only_with_validation_error(call: Callable[[], Any]) -> Any:
    """``call()``'s result, or None if it raised ValidationError (anything
    else propagates and fails the test)."""
    try:
        return call()
    except af.ValidationError:
        return None


def expression(column: Any, op: str, value: Any, combine: str) -> Any:
    """``af.c[column] <op> value``, alone or combined (&, |, ~)."""
    made = comparison(column, op, value)
    if combine == "&":
        return made & af.c.i.is_null()
    if combine == "|":
        return af.c.s.is_null() | made
    return ~made if combine == "~" else made


def comparison(column: Any, op: str, value: Any) -> Any:
    col = af.c[column]
    if op == "in":
        return col.in_(value if isinstance(value, list | tuple | set) else [value])
    if op == "starts_with":
        return col.starts_with(value)
    if op == "is_null":
        return col.is_null()
    return {
        "==": col.__eq__,
        "!=": col.__ne__,
        "<": col.__lt__,
        "<=": col.__le__,
        ">": col.__gt__,
        ">=": col.__ge__,
    }[op](value)


# AIOFRAGNO_FUZZ_EXAMPLES=2000 hunts harder than a test run has time for.
FUZZ = settings(
    max_examples=int(os.environ.get("AIOFRAGNO_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _uow(catalog: Catalog) -> UnitOfWork:
    async def never(queries: Any) -> Any:
        raise AssertionError("no reads run in these tests")

    return UnitOfWork(never, catalog, "fuzz")


@catalogs
@FUZZ
@given(column=columns, value=values, table=st.sampled_from(["v", "v", "targets", 5, ["v"]]))
def test_create_accepts_or_refuses_and_the_entry_agrees(
    catalog: Catalog, column: Any, value: Any, table: Any
) -> None:
    uow = _uow(catalog)
    created = refuses_only_with_validation_error(lambda: uow.create(table, {column: value}))
    if created is None:
        return
    entry = entry_values(
        catalog.codec, uow_id="u", nonce="n", schema="fuzz", namespace="ns", writes=uow.mutations
    )
    [mutation] = tagged_json.loads(entry["payload"])["mutations"]
    carried = mutation["values"][column]
    info = catalog.table(table).columns[column]
    if value is None:
        assert carried is None
    elif info.kind == "json":
        assert carried == json.loads(json.dumps(value))
    elif info.kind == "decimal":
        assert carried == Decimal(value)
    elif info.kind in ("string", "text", "varchar", "reference", "enum"):
        assert carried == str.__str__(value) and type(carried) is str
    elif info.kind == "float":
        assert type(carried) is float
        assert struct.pack("<d", carried) == struct.pack("<d", float(value))
    elif info.kind == "timestamp" and value.tzinfo is None:  # (accepted as UTC)
        assert carried == value.replace(tzinfo=dt.UTC)
    else:
        assert carried == value


@catalogs
@FUZZ
@given(
    column=st.sampled_from(list(SCHEMA.tables["arrays"].columns)),
    value=st.lists(scalars, max_size=4) | values,
)
def test_arrays_accept_or_refuse_and_the_entry_agrees(
    catalog: Catalog, column: str, value: Any
) -> None:
    """PostgreSQL: a list accepted item by item, carried by the entry as the
    same list; elsewhere always refused."""
    uow = _uow(catalog)
    created = refuses_only_with_validation_error(lambda: uow.create("arrays", {column: value}))
    if created is None:
        return
    assert catalog.codec.storage.arrays
    entry = entry_values(
        catalog.codec, uow_id="u", nonce="n", schema="fuzz", namespace="ns", writes=uow.mutations
    )
    [mutation] = tagged_json.loads(entry["payload"])["mutations"]
    carried = mutation["values"][column]
    if value is None:
        assert carried is None
        return
    assert type(carried) is list and len(carried) == len(value)
    for item, back in zip(value, carried, strict=True):
        assert back is not None and back == item
        if isinstance(back, float):
            assert struct.pack("<d", back) == struct.pack("<d", float(item))


@catalogs
@FUZZ
@given(
    target=values | row_ids,
    column=columns,
    value=values,
    check=st.booleans(),
    write=st.sampled_from(["update", "delete", "check"]),
)
def test_writes_accept_or_refuse(
    catalog: Catalog, target: Any, column: Any, value: Any, check: bool, write: str
) -> None:
    uow = _uow(catalog)
    if write == "update":
        refuses_only_with_validation_error(
            lambda: uow.update("v", target, {column: value}, check=check)
        )
    elif write == "delete":
        refuses_only_with_validation_error(lambda: uow.delete("v", target, check=check))
    else:
        refuses_only_with_validation_error(lambda: uow.check("v", target))
    if uow.mutations:
        entry_values(
            catalog.codec,
            uow_id="u",
            nonce="n",
            schema="fuzz",
            namespace="ns",
            writes=uow.mutations,
        )


@catalogs
@FUZZ
@given(
    where=st.one_of(
        st.none(),
        st.dictionaries(columns, values, max_size=3),
        st.tuples(
            st.just("expression"),
            columns,
            st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in", "starts_with", "is_null"]),
            values,
            st.sampled_from(["", "&", "|", "~"]),
        ),
        values,
    ),
    order_by=order_bys,
    limit=st.none() | st.integers() | huge_ints | st.booleans() | st.floats() | texts,
    after=st.none() | texts | st.binary() | st.integers() | values,
    read=st.sampled_from(["find", "find_first", "count"]),
)
def test_reads_accept_or_refuse(
    catalog: Catalog, where: Any, order_by: Any, limit: Any, after: Any, read: str
) -> None:
    uow = _uow(catalog)

    def queue_and_compile() -> None:
        nonlocal where
        if isinstance(where, tuple) and where[:1] == ("expression",):
            where = expression(*where[1:])
        if read == "find":
            op: Any = uow.find("v", where, order_by, limit, after)
        elif read == "find_first":
            op = uow.find_first("v", where, order_by)
        else:
            op = uow.count("v", where)
        op.compile(catalog)

    refuses_only_with_validation_error(queue_and_compile)


def tagged_or_plain(value: Any) -> str:
    """The tagged JSON of ``value``, or its repr where it has none."""
    try:
        return tagged_json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


cursor_texts = st.one_of(
    st.builds(tagged_or_plain, values),
    st.builds(
        lambda key, v: json.dumps({"k": key, "v": v}),
        st.sampled_from(["KEY", "", "x"]),  # (KEY: the find's own)
        st.lists(
            st.integers()
            | st.sampled_from([2**63, -(2**63) - 1, True, 1.5, "$int"])
            | st.builds(  # (a tag around a value of the wrong type)
                lambda tag, value: {tag: value},
                st.sampled_from(["$uuid", "$time", "$dt", "$date", "$dec", "$bytes"]),
                st.integers() | st.text(max_size=4) | st.none(),
            )
            | st.text(max_size=4)
            | st.none()
            | st.lists(st.integers(), max_size=2),
            max_size=4,
        ),
    ),
    st.integers(0, 200_000).map(lambda n: "[" * n + "]" * n),
    st.text(),
)


@catalogs
@FUZZ
@given(
    text=cursor_texts,
    order_by=st.sampled_from([None, "n", ("s", "desc"), ["ts", "day"], ["f", ("ref", "desc")]]),
)
def test_cursors_accept_or_refuse(catalog: Catalog, text: str, order_by: Any) -> None:
    uow = _uow(catalog)
    key = uow.find("pages", None, order_by, 10)._cursor_key()
    text = text.replace('"KEY"', json.dumps(key))
    cursor = base64.urlsafe_b64encode(text.encode(errors="surrogatepass")).decode().rstrip("=")

    def page() -> None:
        uow.find("pages", None, order_by, 10, cursor).compile(catalog)

    refuses_only_with_validation_error(page)


@catalogs
@FUZZ
@given(value=values, wrap=st.sampled_from(["plain", "json", "in", "not in"]))
def test_raw_parameters_accept_or_refuse(catalog: Catalog, value: Any, wrap: str) -> None:
    if wrap == "json":
        fragment = af.sql("SELECT {v}", v=af.Json(value))
    elif wrap == "plain":
        fragment = af.sql("SELECT {v}", v=value)
    else:
        items = value if isinstance(value, list | tuple) else [value]
        fragment = af.sql(f"SELECT 1 WHERE x {wrap.upper()} {{v}}", v=items)
    refuses_only_with_validation_error(lambda: catalog.compiler.compile(fragment))


@catalogs
@FUZZ
@given(kind=st.sampled_from(sorted(SCHEMA.tables["v"].columns)), value=values)
def test_encoders_accept_or_refuse_and_stay_small(catalog: Catalog, kind: str, value: Any) -> None:
    """Every column encoder; an accepted decimal stays as short as the
    column's bound allows however its exponent was written."""
    column = SCHEMA.tables["v"].columns[kind]
    if column.kind == "reference":
        return
    encode = catalog.codec.encoder(column.kind, column.arg)
    encoded = refuses_only_with_validation_error(lambda: encode(value))
    if encoded is not None and column.kind == "decimal":
        before, after = catalog.codec.storage.decimal_digits
        text = encoded if isinstance(encoded, str) else format(encoded, "f")
        assert len(text) <= before + after + 2
