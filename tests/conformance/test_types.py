"""The value codec through the schema layer, on every backend and runtime:
every column type round-trips exactly (edge values included) through units of
work, and values a backend cannot store exactly are refused with
ValidationError before anything reaches the database."""

from __future__ import annotations

import datetime as dt
import enum
import math
import struct
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target

pytestmark = pytest.mark.anyio

UTC = dt.UTC
MIB = bytes(range(256)) * 4096  # 1 MiB, every byte value

TYPES = af.Schema(
    "types",
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
    ),
)
COLUMNS = list(TYPES.tables["v"].columns)

LARGE_JSON = {"rows": [{"n": i, "s": "é" * 50, "ok": i % 2 == 0} for i in range(5000)]}

# (column, value): each is written alone in a row, read back and compared.
EDGE_VALUES: list[tuple[str, Any]] = [
    ("i", -(2**31)),
    ("i", 2**31 - 1),
    ("i", 0),
    ("b", -(2**63)),
    ("b", 2**63 - 1),
    ("b", -1),
    ("d", Decimal("12345678901234567890.123456789")),
    ("d", Decimal("1e-20")),
    ("d", Decimal("-0.000000000000000000000000000001")),
    ("d", Decimal("99999999999999999999999999999999999.999999999999999999999999999999")),
    ("d", Decimal("-1.5")),
    ("d", Decimal(0)),
    ("f", True),
    ("f", False),
    ("j", {}),
    ("j", []),
    ("j", LARGE_JSON),
    ("j", {"nested": {"list": [1, 2.5, None, True, False, "é✓😀"], "empty": {}}}),
    ("j", {"big": 2**63 - 1, "small": 1e-20, "neg": -(2**53)}),
    ("j", "just a string"),
    ("j", 0),
    ("j", False),
    ("bin", b""),
    ("bin", b"\x00"),
    ("bin", MIB),
    ("day", dt.date(2024, 2, 29)),
    ("day", dt.date(2000, 2, 29)),
    ("day", dt.date(1900, 3, 1)),
    ("day", dt.date(1970, 1, 1)),
    ("day", dt.date(1000, 1, 1)),
    ("day", dt.date(9999, 12, 30)),  # date.max: see test_extreme_dates_and_timestamps
    ("ts", dt.datetime(2024, 2, 29, 23, 59, 59, 999000, tzinfo=UTC)),
    ("ts", dt.datetime(1970, 1, 1, tzinfo=UTC)),
    ("ts", dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
    ("ts", dt.datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)),
    ("ts", dt.datetime(1000, 1, 1, tzinfo=UTC)),
    ("ts", dt.datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
    ("ts", dt.datetime(2024, 2, 29, 5, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))),
    ("ts", dt.datetime(2024, 3, 1, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=-11)))),
    ("s", ""),
    ("s", "é✓😀 combining e\u0301"),
    ("s", 'it\'s "quoted" \\ back\\slash %s $1 ? -- ;'),
    ("s", "😀" * 255),
    ("s", " padded  "),
    ("t", "x" * 100_000),
    ("t", "line one\nline two\r\n\ttabbed"),
    ("vc", "abcdefgh"),
    ("vc", "éééééééé"),
    ("vc", "😀" * 8),
]
MICROSECOND_VALUES: list[tuple[str, Any]] = [
    ("ts", dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)),
    ("ts", dt.datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC)),
    ("ts", dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
]


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


async def migrated(db: af.Database, spaces: Namespaces, schema: af.Schema = TYPES) -> str:
    namespace = spaces.use(db, schema).namespace
    await db.migrate(schema, namespace=namespace)
    return namespace


async def create(db: af.Database, ns: str, values: dict[str, Any]) -> af.RowId:
    async def fn(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("v", values)

    return await db.execute_uow(fn, schema=TYPES, namespace=ns)


async def read(db: af.Database, ns: str, row_id: str) -> dict[str, Any]:
    async def fn(uow: af.UnitOfWork) -> dict[str, Any]:
        op = uow.find_first("v", where={"id": row_id})
        await uow.retrieve()
        return op.result

    row = await db.execute_uow(fn, schema=TYPES, namespace=ns)
    assert row is not None, f"row {row_id} not found"
    return row


async def read_all(db: af.Database, ns: str) -> list[dict[str, Any]]:
    async def fn(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find("v")
        await uow.retrieve()
        return list(op.result)

    return await db.execute_uow(fn, schema=TYPES, namespace=ns)


async def count(db: af.Database, ns: str, where: Any = None) -> int:
    async def fn(uow: af.UnitOfWork) -> int:
        op = uow.count("v", where=where)
        await uow.retrieve()
        return op.result

    return await db.execute_uow(fn, schema=TYPES, namespace=ns)


def mismatch(expected: Any, got: Any) -> str | None:
    """Why ``got`` is not an exact round trip of ``expected`` (None if it is)."""
    if isinstance(expected, bytes | bytearray | memoryview):
        expected = bytes(expected)
    if isinstance(expected, dict | list) or expected is None:
        ok = got == expected and type(got) is type(expected)
        return None if ok else f"{got!r:.80} != {expected!r:.80}"
    if type(got) is not type(expected):
        return f"type {type(got).__name__} != {type(expected).__name__} ({got!r:.80})"
    if got != expected:
        return f"{got!r:.80} != {expected!r:.80}"
    if isinstance(expected, dt.datetime) and got.utcoffset() != dt.timedelta(0):
        return f"{got!r} is not in UTC"
    return None


def microseconds_kept(db: af.Database) -> bool:
    return db._engine.adapter.storage.timestamp != "epoch-ms"


async def test_round_trip_every_type_with_edge_values(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    cases = EDGE_VALUES + (MICROSECOND_VALUES if microseconds_kept(db) else [])

    async def write(uow: af.UnitOfWork) -> list[af.RowId]:
        return [uow.create("v", {column: value}) for column, value in cases]

    ids = await db.execute_uow(write, schema=TYPES, namespace=ns)
    rows = {row["id"]: row for row in await read_all(db, ns)}
    assert len(rows) == len(cases)
    problems = []
    for row_id, (column, value) in zip(ids, cases, strict=True):
        row = rows[row_id]
        assert isinstance(row["id"], af.RowId)
        assert row["id"].version == 0
        why = mismatch(value, row[column])
        if why:
            problems.append(f"{column}={value!r:.60}: {why}")
        others = {name: row[name] for name in COLUMNS if name != column}
        if any(v is not None for v in others.values()):
            problems.append(f"{column}={value!r:.60}: other columns not NULL: {others!r:.200}")
    assert not problems, "\n".join(problems)


async def test_reads_retrieved_together_decode_alike(db: af.Database, spaces: Namespaces) -> None:
    """Every edge value read by a find that shares its retrieve() with other
    reads (one statement where the dialect combines them) comes back exactly
    as a find on its own returns it."""
    ns = await migrated(db, spaces)
    cases = EDGE_VALUES + (MICROSECOND_VALUES if microseconds_kept(db) else [])

    async def write(uow: af.UnitOfWork) -> None:
        for column, value in cases:
            uow.create("v", {column: value})

    await db.execute_uow(write, schema=TYPES, namespace=ns)

    async def together(uow: af.UnitOfWork) -> tuple[list[dict[str, Any]], int, Any]:
        rows, n, first = uow.find("v"), uow.count("v"), uow.find_first("v")
        await uow.retrieve()
        return list(rows.result), n.result, first.result

    rows, n, first = await db.execute_uow(together, schema=TYPES, namespace=ns)
    alone = await read_all(db, ns)
    assert n == len(cases) == len(rows) and first == alone[0]
    problems = [
        f"{column}: {why}"
        for got, expected in zip(rows, alone, strict=True)
        for column in COLUMNS
        if (why := mismatch(expected[column], got[column])) is not None
    ]
    assert not problems, "\n".join(problems)


async def test_round_trip_a_full_row_and_single_reads(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    values = {
        "i": -(2**31),
        "b": 2**63 - 1,
        "d": Decimal("12345678901234567890.123456789"),
        "f": True,
        "j": {"k": ["v", 1, None]},
        "bin": MIB,
        "day": dt.date(2024, 2, 29),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 999000, tzinfo=UTC),
        "s": "é✓😀",
        "t": "x" * 70_000,
        "vc": "12345678",
    }
    row_id = await create(db, ns, values)
    row = await read(db, ns, row_id)
    assert set(row) == {"id", *COLUMNS}
    assert row["id"] == row_id
    problems = [f"{c}: {mismatch(v, row[c])}" for c, v in values.items() if mismatch(v, row[c])]
    assert not problems, problems
    empty_id = await create(db, ns, {})
    assert await read(db, ns, empty_id) == {"id": empty_id, **dict.fromkeys(COLUMNS)}


async def test_update_round_trips_edge_values(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    row_id = await create(db, ns, {"b": 1, "s": "x"})
    values = {
        "i": 2**31 - 1,
        "b": -(2**63),
        "d": Decimal("1e-20"),
        "f": False,
        "j": [],
        "bin": b"",
        "day": dt.date(2000, 2, 29),
        "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        "s": "",
        "vc": "😀" * 8,
    }

    async def update(uow: af.UnitOfWork) -> None:
        uow.update("v", row_id, values)

    await db.execute_uow(update, schema=TYPES, namespace=ns)
    row = await read(db, ns, row_id)
    problems = [f"{c}: {mismatch(v, row[c])}" for c, v in values.items() if mismatch(v, row[c])]
    assert not problems, problems
    assert row["id"].version == 1

    async def clear(uow: af.UnitOfWork) -> None:
        uow.update("v", row_id, dict.fromkeys(values))

    await db.execute_uow(clear, schema=TYPES, namespace=ns)
    row = await read(db, ns, row_id)
    assert all(row[c] is None for c in values)


async def test_accepted_input_forms(db: af.Database, spaces: Namespaces) -> None:
    """Values of a related Python type are accepted and come back in the
    column's own type."""
    ns = await migrated(db, spaces)
    row_id = await create(db, ns, {"d": 5, "bin": bytearray(b"\x00ab"), "j": (1, "two")})
    row = await read(db, ns, row_id)
    assert mismatch(Decimal(5), row["d"]) is None
    assert mismatch(b"\x00ab", row["bin"]) is None
    assert row["j"] == [1, "two"]
    other = await create(db, ns, {"bin": memoryview(b"mv")})
    assert mismatch(b"mv", (await read(db, ns, other))["bin"]) is None


async def test_microsecond_timestamps(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    for _, value in MICROSECOND_VALUES:
        if microseconds_kept(db):
            row = await read(db, ns, await create(db, ns, {"ts": value}))
            assert mismatch(value, row["ts"]) is None, (value, row["ts"])
        else:
            with pytest.raises(af.ValidationError, match="sub-millisecond"):
                await create(db, ns, {"ts": value})
    if not microseconds_kept(db):
        assert await count(db, ns) == 0


@pytest.mark.parametrize("profile", ["epoch-ms", "iso-text"])
async def test_sqlite_timestamp_storage_profiles(
    url: str, target: Target, spaces: Namespaces, profile: str
) -> None:
    if target.dialect != "sqlite":
        pytest.skip("SQLite storage profiles")
    ms = dt.datetime(2024, 2, 29, 23, 59, 59, 123000, tzinfo=UTC)
    us = dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)
    before_epoch = dt.datetime(1969, 7, 20, 20, 17, 40, 1000, tzinfo=UTC)
    options: dict[str, Any] = {} if profile == "epoch-ms" else {"sqlite_timestamps": profile}
    async with af.connect(url, backend=target.backend, **options) as db:
        assert db._engine.adapter.storage.timestamp == profile
        ns = spaces.use(db, TYPES).namespace
        ddl = "\n".join(await db.migration_sql(TYPES, namespace=ns))
        column_type = "integer" if profile == "epoch-ms" else "text"
        assert f'"ts" {column_type},' in ddl
        await db.migrate(TYPES, namespace=ns)
        ids = [await create(db, ns, {"ts": v}) for v in (ms, before_epoch)]
        if profile == "epoch-ms":
            with pytest.raises(af.ValidationError, match="sub-millisecond"):
                await create(db, ns, {"ts": us})
            with pytest.raises(af.ValidationError):
                await create(db, ns, {"ts": dt.datetime(2024, 1, 1, 0, 0, 0, 999, tzinfo=UTC)})
        else:
            ids.append(await create(db, ns, {"ts": us}))
        for row_id, value in zip(ids, [ms, before_epoch, us], strict=False):
            assert mismatch(value, (await read(db, ns, row_id))["ts"]) is None
        table = db.layout(TYPES, ns).table("v").identifier
        raw = await db.fetch(af.sql("SELECT typeof(ts) AS kind, ts FROM {t} ORDER BY _id", t=table))
        if profile == "epoch-ms":
            assert [(r["kind"], r["ts"]) for r in raw] == [
                ("integer", 1709251199123),
                ("integer", -14182939999),
            ]
        else:
            assert [r["kind"] for r in raw] == ["text"] * 3
            assert raw[2]["ts"] == "2024-02-29T23:59:59.123456+00:00"

        # Timestamps compare by time in queries, also across the epoch.
        async def after(uow: af.UnitOfWork) -> list[Any]:
            op = uow.find("v", where=af.c.ts > before_epoch, order_by="ts")
            await uow.retrieve()
            return [r["ts"] for r in op.result]

        later = await db.execute_uow(after, schema=TYPES, namespace=ns)
        assert later == ([ms] if profile == "epoch-ms" else [ms, us])


async def test_naive_datetimes_are_rejected_by_default(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    with pytest.raises(af.ValidationError, match="naive"):
        await create(db, ns, {"ts": dt.datetime(2024, 2, 29, 12, 0)})
    row_id = await create(db, ns, {"ts": dt.datetime(2024, 2, 29, 12, 0, tzinfo=UTC)})

    async def find_naive(uow: af.UnitOfWork) -> None:
        uow.find("v", where={"ts": dt.datetime(2024, 2, 29, 12, 0)})
        await uow.retrieve()

    with pytest.raises(af.ValidationError, match="naive"):
        await db.execute_uow(find_naive, schema=TYPES, namespace=ns)

    async def update_naive(uow: af.UnitOfWork) -> None:
        uow.update("v", row_id, {"ts": dt.datetime(2024, 2, 29, 13, 0)})

    with pytest.raises(af.ValidationError, match="naive"):
        await db.execute_uow(update_naive, schema=TYPES, namespace=ns)
    assert await count(db, ns) == 1
    assert (await read(db, ns, row_id))["ts"] == dt.datetime(2024, 2, 29, 12, 0, tzinfo=UTC)


async def test_naive_datetimes_as_utc(url: str, target: Target, spaces: Namespaces) -> None:
    async with af.connect(url, backend=target.backend, naive_datetimes="utc") as db:
        ns = spaces.use(db, TYPES).namespace
        await db.migrate(TYPES, namespace=ns)
        naive = dt.datetime(2024, 2, 29, 12, 30, 15, 250000)
        row_id = await create(db, ns, {"ts": naive})
        got = (await read(db, ns, row_id))["ts"]
        assert got == naive.replace(tzinfo=UTC)
        assert got.utcoffset() == dt.timedelta(0)
        assert await count(db, ns, where={"ts": naive}) == 1
        assert await count(db, ns, where={"ts": naive.replace(tzinfo=UTC)}) == 1


async def test_string_column_lengths(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    # varchar(n): at most n characters, on every backend (SQLite included).
    with pytest.raises(af.ValidationError):
        await create(db, ns, {"vc": "123456789"})
    with pytest.raises(af.ValidationError):
        await create(db, ns, {"vc": "é" * 9})
    row_id = await create(db, ns, {"vc": "é" * 8, "s": "😀" * 255})

    async def grow(uow: af.UnitOfWork) -> None:
        uow.update("v", row_id, {"vc": "x" * 9})

    with pytest.raises(af.ValidationError):
        await db.execute_uow(grow, schema=TYPES, namespace=ns)
    if db.name == "mysql":
        # "string" is varchar(255) on MySQL, so that it can be indexed.
        with pytest.raises(af.ValidationError, match="255"):
            await create(db, ns, {"s": "x" * 256})
        with pytest.raises(af.ValidationError):
            await create(db, ns, {"s": "😀" * 256})
    else:
        long_id = await create(db, ns, {"s": "x" * 10_000})
        assert (await read(db, ns, long_id))["s"] == "x" * 10_000
    assert await count(db, ns) == (1 if db.name == "mysql" else 2)
    row = await read(db, ns, row_id)
    assert (row["vc"], row["s"]) == ("é" * 8, "😀" * 255)


WRONG_TYPES: list[tuple[str, Any]] = [
    ("i", "1"),
    ("i", 1.0),
    ("i", True),
    ("i", Decimal(1)),
    ("i", 2**31),
    ("i", -(2**31) - 1),
    ("b", "9"),
    ("b", 2**63),
    ("b", -(2**63) - 1),
    ("b", 1.5),
    ("d", 1.5),
    ("d", "1.5"),
    ("d", True),
    ("d", Decimal("NaN")),
    ("d", Decimal("sNaN")),
    ("d", Decimal("Infinity")),
    ("f", 1),
    ("f", "true"),
    ("f", 0.0),
    ("j", {1, 2}),
    ("j", object()),
    ("j", float("nan")),
    ("j", {"inf": float("inf")}),
    ("j", b"bytes"),
    ("bin", "text"),
    ("bin", 5),
    ("bin", [1, 2]),
    ("day", dt.datetime(2024, 1, 1, tzinfo=UTC)),
    ("day", "2024-01-01"),
    ("day", 20240101),
    ("ts", dt.date(2024, 1, 1)),
    ("ts", "2024-01-01T00:00:00+00:00"),
    ("ts", 1_700_000_000),
    ("ts", dt.time(12, 0)),
    ("s", 5),
    ("s", b"x"),
    ("s", ["x"]),
    ("t", 1.5),
    ("vc", 12345678),
]


async def test_wrong_python_types_are_rejected(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    row_id = await create(db, ns, {"b": 1})
    missed = []
    for column, value in WRONG_TYPES:
        for op in ("create", "update", "where"):

            async def fn(
                uow: af.UnitOfWork, op: str = op, column: str = column, value: Any = value
            ) -> None:
                if op == "create":
                    uow.create("v", {column: value})
                elif op == "update":
                    uow.update("v", row_id, {column: value})
                else:
                    uow.find("v", where={column: value})
                    await uow.retrieve()

            try:
                await db.execute_uow(fn, schema=TYPES, namespace=ns)
            except af.ValidationError:
                continue
            except Exception as exc:
                missed.append(f"{op} {column}={value!r}: {type(exc).__name__}: {exc}")
            else:
                missed.append(f"{op} {column}={value!r}: accepted")
    assert not missed, "\n".join(missed)
    assert await count(db, ns) == 1
    assert (await read(db, ns, row_id)) == {"id": row_id, **dict.fromkeys(COLUMNS), "b": 1}


async def test_unknown_and_internal_columns_are_rejected(
    db: af.Database, spaces: Namespaces
) -> None:
    ns = await migrated(db, spaces)
    for values in ({"nope": 1}, {"id": "x"}, {"_version": 3}, {"_id": 1}):
        with pytest.raises(af.ValidationError):
            await create(db, ns, values)
    with pytest.raises(af.ValidationError):
        await db.execute_uow(lambda uow: _create_in(uow, "nope"), schema=TYPES, namespace=ns)
    assert await count(db, ns) == 0


async def _create_in(uow: af.UnitOfWork, table: str) -> None:
    uow.create(table, {})


async def test_nul_in_text(db: af.Database, spaces: Namespaces) -> None:
    ns = await migrated(db, spaces)
    value = "before\x00after"
    if db.name == "postgresql":
        for column in ("s", "t", "vc"):
            with pytest.raises(af.ValidationError, match="NUL"):
                await create(db, ns, {column: value[:8]})
        assert await count(db, ns) == 0
    else:
        row_id = await create(db, ns, {"s": value, "t": value, "vc": "a\x00b"})
        row = await read(db, ns, row_id)
        assert (row["s"], row["t"], row["vc"]) == (value, value, "a\x00b")


async def test_nul_in_json(
    request: pytest.FixtureRequest, db: af.Database, spaces: Namespaces
) -> None:
    """A JSON string with U+0000 cannot be stored by PostgreSQL's jsonb: it must
    be refused before the database, like NUL in text; elsewhere it round-trips."""
    ns = await migrated(db, spaces)
    doc = {"k": "a\x00b"}
    try:
        row_id = await create(db, ns, {"j": doc})
    except af.ValidationError:
        assert db.name == "postgresql", "only PostgreSQL cannot store it"
        return
    assert db.name != "postgresql", "PostgreSQL accepted NUL in jsonb"
    assert (await read(db, ns, row_id))["j"] == doc


def _fits_or_refused_problem(value: Any, outcome: Any) -> str | None:
    if isinstance(outcome, af.ValidationError):
        return None
    if isinstance(outcome, BaseException):
        return f"{type(outcome).__name__} instead of ValidationError: {outcome}"
    return mismatch(value, outcome)


async def _round_trip_or_error(db: af.Database, ns: str, column: str, value: Any) -> Any:
    try:
        row_id = await create(db, ns, {column: value})
    except af.Error as exc:
        return exc
    return (await read(db, ns, row_id))[column]


async def test_decimals_beyond_the_storage_are_refused(
    request: pytest.FixtureRequest, db: af.Database, spaces: Namespaces
) -> None:
    """Exactness is the rule: a decimal the column cannot hold is refused with
    ValidationError, never rounded (MySQL decimal(65,30) rounds extra
    fraction digits with only a warning)."""
    ns = await migrated(db, spaces)
    values = [
        Decimal("1e-31"),
        Decimal("0.1234567890123456789012345678901"),
        Decimal("1e40"),
        Decimal("-123456789012345678901234567890123456"),
    ]
    problems = []
    for value in values:
        why = _fits_or_refused_problem(value, await _round_trip_or_error(db, ns, "d", value))
        if why:
            problems.append(f"{value}: {why}")
    assert not problems, problems


async def test_extreme_dates_and_timestamps(
    request: pytest.FixtureRequest, db: af.Database, spaces: Namespaces
) -> None:
    """The first and last representable days and instants: stored as those
    values (never as ±infinity), or refused with ValidationError."""
    ns = await migrated(db, spaces)
    values = [
        ("day", dt.date.min),
        ("day", dt.date.max),
        ("ts", dt.datetime.min.replace(tzinfo=UTC)),
        ("ts", dt.datetime.max.replace(tzinfo=UTC)),
    ]
    problems = []
    for column, value in values:
        why = _fits_or_refused_problem(value, await _round_trip_or_error(db, ns, column, value))
        if why:
            problems.append(f"{column}={value}: {why}")
    if db.name == "postgresql":
        table = db.layout(TYPES, ns).table("v").identifier
        raw = await db.fetch(
            af.sql("SELECT CAST(day AS text) AS day, CAST(ts AS text) AS ts FROM {t}", t=table)
        )
        stored = [v for r in raw for v in (r["day"], r["ts"]) if v and "infinity" in v]
        if stored:
            problems.append(f"stored as {stored}")
    assert not problems, problems


async def test_decimals_compare_by_value(
    request: pytest.FixtureRequest, db: af.Database, spaces: Namespaces
) -> None:
    """Decimal columns order and compare numerically in queries — or, where they
    are stored as text (SQLite), ordering is refused and equality still holds."""
    ns = await migrated(db, spaces)
    for text in ("9", "10", "-1", "2.50", "100.0", "-20"):
        await create(db, ns, {"d": Decimal(text)})
    if db.name == "sqlite":

        async def ordered_read(uow: af.UnitOfWork) -> None:
            uow.find("v", order_by="d")

        with pytest.raises(af.ValidationError, match="stored as text"):
            await db.execute_uow(ordered_read, schema=TYPES, namespace=ns)

        async def count_equal(uow: af.UnitOfWork) -> int:
            op = uow.count("v", where={"d": Decimal("2.5")})
            await uow.retrieve()
            result: int = op.result
            return result

        assert await db.execute_uow(count_equal, schema=TYPES, namespace=ns) == 1
        return

    async def fn(uow: af.UnitOfWork) -> tuple[list[Any], list[Any], int]:
        ordered = uow.find("v", order_by="d")
        above = uow.find("v", where=af.c.d > Decimal(9), order_by=("d", "desc"))
        equal = uow.count("v", where={"d": Decimal("2.5")})
        await uow.retrieve()
        return [r["d"] for r in ordered.result], [r["d"] for r in above.result], equal.result

    ordered, above, equal = await db.execute_uow(fn, schema=TYPES, namespace=ns)
    assert ordered == [Decimal(x) for x in ("-20", "-1", "2.5", "9", "10", "100")]
    assert above == [Decimal(100), Decimal(10)]
    assert equal == 1


async def test_where_uses_the_codec_for_every_type(db: af.Database, spaces: Namespaces) -> None:
    """Values in where clauses are encoded like written values, so a read by
    value finds the row on every backend (epoch-ms timestamps, text dates,
    integer booleans)."""
    ns = await migrated(db, spaces)
    values = {
        "i": -(2**31),
        "b": 2**63 - 1,
        "f": False,
        "day": dt.date(2024, 2, 29),
        "ts": dt.datetime(
            2024, 2, 29, 5, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))
        ),
        "s": "é✓😀",
        "t": "text",
        "vc": "abc",
    }
    await create(db, ns, values)
    await create(db, ns, {})
    for column, value in values.items():
        assert await count(db, ns, where={column: value}) == 1, column
        assert await count(db, ns, where=af.c[column] == value) == 1, column
    same_instant = dt.datetime(2024, 2, 29, 0, 0, tzinfo=UTC)
    assert await count(db, ns, where={"ts": same_instant}) == 1
    assert await count(db, ns, where=af.c.day.is_null()) == 1


async def test_string_equality_is_exact(
    request: pytest.FixtureRequest, db: af.Database, spaces: Namespaces
) -> None:
    """Trailing spaces are part of a string: a query for "a" does not find
    "a ", and a unique index keeps both apart."""
    schema = af.Schema(
        "strings", af.Table("v", af.Column("s", "string"), af.Index("by_s", ["s"], unique=True))
    )
    ns = spaces.use(db, schema).namespace
    await db.migrate(schema, namespace=ns)

    async def write(uow: af.UnitOfWork) -> None:
        uow.create("v", {"s": "a "})
        uow.create("v", {"s": "a"})

    await db.execute_uow(write, schema=schema, namespace=ns)

    async def fn(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("v", where={"s": "a"})
        await uow.retrieve()
        return [r["s"] for r in op.result]

    assert await db.execute_uow(fn, schema=schema, namespace=ns) == ["a"]


# float, uuid, enum, time, smallint (and, on PostgreSQL, arrays) ------------


class Status(enum.StrEnum):
    NEW = "new"
    PAID = "paid"


MORE = af.Schema(
    "moretypes",
    af.Table(
        "v",
        af.Column("fl", "float", nullable=True),
        af.Column("u", "uuid", nullable=True),
        af.Column("e", af.enum(Status), nullable=True),
        af.Column("odd", af.enum("it's", "é✓😀", "a\\b", ""), nullable=True),
        af.Column("tm", "time", nullable=True),
        af.Column("sm", "smallint", nullable=True),
    ),
)
FLOATS = [
    0.0,
    5e-324,  # the smallest subnormal
    -2.225073858507201e-308,  # the largest subnormal
    2.2250738585072014e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    0.1,
    1 / 3,
    2.0**53 + 2,
    123456789.12345678,
]
MORE_VALUES: list[tuple[str, Any]] = [
    *(("fl", value) for value in FLOATS),
    ("u", uuid.UUID(int=0)),
    ("u", uuid.UUID(int=2**128 - 1)),
    ("u", uuid.UUID("0190a4c1-7e3b-7c2d-9f00-123456789abc")),
    ("e", "new"),
    ("odd", "it's"),
    ("odd", "é✓😀"),
    ("odd", "a\\b"),
    ("odd", ""),
    ("tm", dt.time(0, 0)),
    ("tm", dt.time(23, 59, 59, 999999)),
    ("tm", dt.time(12, 0, 0, 1)),
    ("sm", -(2**15)),
    ("sm", 2**15 - 1),
    ("sm", 0),
]


def same_bits(expected: Any, got: Any) -> str | None:
    """``mismatch``, floats compared bit for bit (-0.0 is not 0.0)."""
    if isinstance(expected, float) and type(got) is float:
        same = struct.pack("<d", expected) == struct.pack("<d", got)
        return None if same else f"{got!r} != {expected!r}"
    return mismatch(expected, got)


async def more_uow(
    db: af.Database, ns: str, fn: Any, schema: af.Schema = MORE, **options: Any
) -> Any:
    return await db.execute_uow(fn, schema=schema, namespace=ns, **options)


async def test_more_types_round_trip_exactly_with_their_outbox_entry(
    url: str, target: Target, spaces: Namespaces
) -> None:
    """Every edge value is read back exactly (floats bit for bit) and found
    by equality, and the unit's outbox entry carries it as the same value of
    the same type; an update round-trips too."""
    async with af.connect(url, backend=target.backend, pool_size=2, outbox=True) as db:
        ns = spaces.use(db, MORE).namespace
        await db.migrate(MORE, namespace=ns)
        cases = list(MORE_VALUES)
        if db._engine.adapter.storage.float_negative_zero:
            cases.append(("fl", -0.0))
        key = f"more-{uuid.uuid4()}"

        async def write(uow: af.UnitOfWork) -> list[af.RowId]:
            return [uow.create("v", {column: value}) for column, value in cases]

        ids = await more_uow(db, ns, write, idempotency_key=key)

        async def read(uow: af.UnitOfWork) -> tuple[list[dict[str, Any]], list[int]]:
            rows = uow.find("v")
            found = [uow.count("v", where={column: value}) for column, value in cases]
            await uow.retrieve()
            return list(rows.result), [op.result for op in found]

        rows, found = await more_uow(db, ns, read)
        by_id = {row["id"]: row for row in rows}
        entry = await db.outbox.find(key)
        assert entry is not None
        mutations = entry.payload["mutations"]
        problems = []
        for row_id, (column, value), mutation, n in zip(ids, cases, mutations, found, strict=True):
            for where, got in (
                ("row", by_id[row_id][column]),
                ("entry", mutation["values"][column]),
            ):
                why = same_bits(value, got)
                if why:
                    problems.append(f"{where} {column}={value!r}: {why}")
            # (0.0 and -0.0 are equal: where finds both.)
            if n != (2 if column == "fl" and value == 0.0 and len(cases) > len(MORE_VALUES) else 1):
                problems.append(f"where {column}={value!r} found {n} rows")
        assert not problems, "\n".join(problems)

        target_row = ids[0]

        async def update(uow: af.UnitOfWork) -> None:
            uow.update("v", target_row, {"fl": -1.5e-300, "tm": dt.time(1, 2, 3, 4), "sm": -7})

        await more_uow(db, ns, update)
        row = next(r for r in (await more_uow(db, ns, read))[0] if r["id"] == target_row)
        assert (row["fl"], row["tm"], row["sm"]) == (-1.5e-300, dt.time(1, 2, 3, 4), -7)


async def test_more_types_accepted_input_forms(db: af.Database, spaces: Namespaces) -> None:
    """An int a double holds exactly is a float column's value (read back as
    a float); a StrEnum member is stored as its str."""
    ns = await migrated(db, spaces, MORE)

    async def write(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("v", {"fl": 2**53, "e": Status.PAID, "sm": 3})

    row_id = await more_uow(db, ns, write)

    async def read(uow: af.UnitOfWork) -> dict[str, Any]:
        op = uow.find_first("v", where={"id": row_id})
        await uow.retrieve()
        return op.result

    row = await more_uow(db, ns, read)
    assert type(row["fl"]) is float and row["fl"] == 2.0**53
    assert type(row["e"]) is str and row["e"] == "paid"
    assert row["sm"] == 3


MORE_REFUSED: list[tuple[str, Any]] = [
    ("fl", math.nan),
    ("fl", math.inf),
    ("fl", -math.inf),
    ("fl", True),
    ("fl", "1.5"),
    ("fl", Decimal("1.5")),
    ("fl", 2**53 + 1),  # no double holds it
    ("fl", 10**400),
    ("u", "0190a4c1-7e3b-7c2d-9f00-123456789abc"),
    ("u", b"\x00" * 16),
    ("u", 5),
    ("e", "NEW"),
    ("e", "refunded"),
    ("e", 1),
    ("odd", "a\\\\b"),
    ("tm", dt.time(12, 0, tzinfo=UTC)),
    ("tm", dt.datetime(2024, 1, 1, 12, 0)),
    ("tm", "12:00:00"),
    ("tm", dt.timedelta(hours=1)),
    ("sm", 2**15),
    ("sm", -(2**15) - 1),
    ("sm", True),
    ("sm", 1.0),
]


async def test_more_types_refuse_what_they_cannot_hold(db: af.Database, spaces: Namespaces) -> None:
    """Each hostile value is a ValidationError naming the column, raised
    before anything is written — in a create, an update and a where."""
    ns = await migrated(db, spaces, MORE)
    refused = list(MORE_REFUSED)
    if not db._engine.adapter.storage.float_negative_zero:
        refused.append(("fl", -0.0))  # (MySQL keeps only 0.0)

    async def seed(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("v", {"sm": 1})

    row_id = await more_uow(db, ns, seed)
    for column, value in refused:

        async def write(uow: af.UnitOfWork, column: str = column, value: Any = value) -> None:
            uow.create("v", {"sm": 2})
            uow.create("v", {column: value})

        with pytest.raises(af.ValidationError, match=f"v.{column}"):
            await more_uow(db, ns, write)

        async def change(uow: af.UnitOfWork, column: str = column, value: Any = value) -> None:
            uow.update("v", row_id, {column: value})

        with pytest.raises(af.ValidationError, match=f"v.{column}"):
            await more_uow(db, ns, change)
        with pytest.raises(af.ValidationError):
            await count_in(db, ns, af.c[column] == value)

    async def read(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find("v")
        await uow.retrieve()
        return list(op.result)

    rows = await more_uow(db, ns, read)
    assert [(r["sm"], r["fl"], r["id"].version) for r in rows] == [(1, None, 0)]


async def count_in(db: af.Database, ns: str, where: Any, schema: af.Schema = MORE) -> int:
    async def fn(uow: af.UnitOfWork) -> int:
        op = uow.count("v", where=where)
        await uow.retrieve()
        return op.result

    return await db.execute_uow(fn, schema=schema, namespace=ns)


async def test_more_types_order_alike_everywhere(db: af.Database, spaces: Namespaces) -> None:
    """Floats, times, uuids and smallints compare and order by value on
    every backend (uuids by their bytes, as PostgreSQL orders them)."""
    ns = await migrated(db, spaces, MORE)
    floats = [-1e300, -0.5, 5e-324, 0.25, 3.0, 1e300]
    times = [dt.time(0, 0, 0, 1), dt.time(9, 5), dt.time(10, 0), dt.time(23, 59, 59, 999999)]
    uuids = sorted((uuid.UUID(int=n) for n in (1, 2**64, 2**127, 2**128 - 1, 255)), key=str)

    async def write(uow: af.UnitOfWork) -> None:
        for value in reversed(floats):
            uow.create("v", {"fl": value})
        for value in reversed(times):
            uow.create("v", {"tm": value})
        for value in reversed(uuids):
            uow.create("v", {"u": value})

    await more_uow(db, ns, write)

    async def read(uow: af.UnitOfWork) -> list[list[Any]]:
        ops = [
            uow.find("v", where=af.c[column] > low, order_by=column)
            for column, low in (("fl", -1e301), ("tm", dt.time(0)), ("u", uuid.UUID(int=0)))
        ]
        await uow.retrieve()
        return [[row[c] for row in op.result] for op, c in zip(ops, ("fl", "tm", "u"), strict=True)]

    assert await more_uow(db, ns, read) == [floats, times, uuids]
    assert await count_in(db, ns, af.c.fl < 0) == 2
    assert await count_in(db, ns, af.c.tm >= dt.time(9, 5)) == 3


PAGED = af.Schema(
    "pagedtypes",
    af.Table("v", af.Column("fl", "float"), af.Column("tm", "time"), af.Column("u", "uuid")),
)


async def test_pages_by_float_time_and_uuid(db: af.Database, spaces: Namespaces) -> None:
    """Keyset pages through cursors holding a float, a time and a uuid see
    every row once, in order."""
    ns = await migrated(db, spaces, PAGED)
    rows = [
        (fl, tm, uuid.UUID(int=n))
        for n, (fl, tm) in enumerate(
            [(-0.5, dt.time(1)), (5e-324, dt.time(0, 0, 0, 1)), (5e-324, dt.time(0))] * 2
        )
    ]

    async def write(uow: af.UnitOfWork) -> None:
        for fl, tm, u in rows:
            uow.create("v", {"fl": fl, "tm": tm, "u": u})

    await more_uow(db, ns, write, schema=PAGED)

    async def pages(uow: af.UnitOfWork) -> list[Any]:
        seen: list[Any] = []
        after = None
        while True:
            op = uow.find("v", order_by=["fl", ("tm", "desc"), "u"], limit=2, after=after)
            await uow.retrieve()
            seen += [(row["fl"], row["tm"], row["u"]) for row in op.result]
            if op.result.cursor is None:
                return seen
            after = op.result.cursor

    expected = sorted(rows, key=lambda r: (r[0], -r[1].microsecond - r[1].hour * 10**10, r[2]))
    assert await more_uow(db, ns, pages, schema=PAGED) == expected


async def test_added_columns_of_the_new_types_get_their_defaults(
    db: af.Database, spaces: Namespaces
) -> None:
    """A migration adding NOT NULL columns with defaults fills existing rows
    with them: through a bound parameter, as these have no portable literal
    (an enum's and a smallint's are a string's and an integer's)."""
    ns = await migrated(db, spaces, MORE)

    async def seed(uow: af.UnitOfWork) -> None:
        uow.create("v", {"sm": 1})

    await more_uow(db, ns, seed)
    defaults: dict[str, tuple[Any, Any]] = {
        "fl2": ("float", -2.5e-300),
        "u2": ("uuid", uuid.UUID(int=7)),
        "tm2": ("time", dt.time(1, 2, 3, 4)),
    }
    later = af.Schema(
        "moretypes",
        af.Table(
            "v",
            *MORE.tables["v"].columns.values(),
            *(af.Column(n, kind, default=value) for n, (kind, value) in defaults.items()),
        ),
    )
    await db.migrate(later, namespace=ns)

    async def read(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find("v")
        await uow.retrieve()
        return list(op.result)

    [row] = await more_uow(db, ns, read, schema=later)
    assert {name: row[name] for name in defaults} == {n: v for n, (_, v) in defaults.items()}


async def test_an_enum_value_outside_the_set_reads_as_stored(
    db: af.Database, spaces: Namespaces
) -> None:
    """A value the declaration no longer lists (written by an older version
    of the schema, or by hand) is read back as the str stored."""
    ns = await migrated(db, spaces, MORE)
    wider = af.Schema("moretypes", af.Table("v", af.Column("e", af.enum("new", "gone"))))

    async def write(uow: af.UnitOfWork) -> None:
        uow.create("v", {"e": "gone"})

    await more_uow(db, ns, write, schema=wider)

    async def read(uow: af.UnitOfWork) -> list[Any]:
        op = uow.find("v")
        await uow.retrieve()
        return [row["e"] for row in op.result]

    assert await more_uow(db, ns, read) == ["gone"]


ARRAYS = af.Schema(
    "arraytypes",
    af.Table(
        "v",
        af.Column("ints", af.array("integer"), nullable=True),
        af.Column("small", af.array("smallint"), nullable=True),
        af.Column("names", af.array(af.varchar(3)), nullable=True),
        af.Column("states", af.array(af.enum(Status)), nullable=True),
        af.Column("floats", af.array("float"), nullable=True),
        af.Column("amounts", af.array("decimal"), nullable=True),
        af.Column("ids", af.array("uuid"), nullable=True),
        af.Column("stamps", af.array("timestamp"), nullable=True),
        af.Column("times", af.array("time"), nullable=True),
        af.Column("days", af.array("date"), default=[dt.date(2024, 2, 29)]),
    ),
)
ARRAY_VALUES: list[tuple[str, Any]] = [
    ("ints", []),
    ("ints", [-(2**31), 0, 2**31 - 1]),
    ("small", [-(2**15), 2**15 - 1]),
    ("names", ["", "abc", "é😀'"]),
    ("states", ["new", "paid"]),
    ("floats", [-0.0, 5e-324, 1.7976931348623157e308, 0.1]),
    ("amounts", [Decimal("-1.5"), Decimal("12345678901234567890.123456789")]),
    ("ids", [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)]),
    ("stamps", [dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)]),
    ("times", [dt.time(0), dt.time(23, 59, 59, 999999)]),
]
ARRAYS_REFUSED: list[tuple[str, Any]] = [
    ("ints", [1, None]),  # no NULLs in arrays
    ("ints", [1, "2"]),
    ("ints", [1, True]),
    ("ints", [[1, 2]]),  # no arrays of arrays
    ("ints", [2**31]),
    ("ints", 1),
    ("ints", "12"),
    ("small", [2**15]),
    ("names", ["abcd"]),
    ("names", ["a\x00"]),
    ("states", ["new", "old"]),
    ("floats", [1.0, math.nan]),
    ("floats", [math.inf]),
    ("amounts", [1.5]),
    ("ids", ["0190a4c1-7e3b-7c2d-9f00-123456789abc"]),
    ("stamps", [dt.datetime(2024, 1, 1)]),  # naive
    ("times", [dt.time(1, tzinfo=UTC)]),
]


async def test_arrays_round_trip_on_postgresql_and_are_refused_elsewhere(
    url: str, target: Target, spaces: Namespaces
) -> None:
    """PostgreSQL: a list in, a list out, each item exact and of its type,
    found by equality, carried exactly by the outbox entry; hostile lists
    are ValidationErrors naming the item, with nothing written. Other
    databases have no arrays: migrating such a column is a MigrationError
    before any DDL, using it a ValidationError."""
    async with af.connect(url, backend=target.backend, pool_size=2, outbox=True) as db:
        ns = spaces.use(db, ARRAYS).namespace
        if not db._engine.adapter.storage.arrays:
            with pytest.raises(af.MigrationError, match="no array columns"):
                await db.migrate(ARRAYS, namespace=ns)
            with pytest.raises(af.ValidationError, match="array"):
                await count_in(db, ns, None, ARRAYS)
            return
        await db.migrate(ARRAYS, namespace=ns)
        key = f"arrays-{uuid.uuid4()}"

        async def write(uow: af.UnitOfWork) -> list[af.RowId]:
            return [uow.create("v", {column: value}) for column, value in ARRAY_VALUES]

        ids = await more_uow(db, ns, write, schema=ARRAYS, idempotency_key=key)

        async def read(uow: af.UnitOfWork) -> tuple[list[dict[str, Any]], list[int]]:
            rows = uow.find("v")
            found = [uow.count("v", where={c: v}) for c, v in ARRAY_VALUES[1:]]
            await uow.retrieve()
            return list(rows.result), [op.result for op in found]

        rows, found = await more_uow(db, ns, read, schema=ARRAYS)
        assert found == [1] * (len(ARRAY_VALUES) - 1)
        by_id = {row["id"]: row for row in rows}
        entry = await db.outbox.find(key)
        assert entry is not None
        problems = []
        for row_id, (column, value), mutation in zip(
            ids, ARRAY_VALUES, entry.payload["mutations"], strict=True
        ):
            for where, got in (
                ("row", by_id[row_id][column]),
                ("entry", mutation["values"][column]),
            ):
                if type(got) is not list or len(got) != len(value):
                    problems.append(f"{where} {column}: {got!r}")
                    continue
                problems += [
                    f"{where} {column}[{i}]: {why}"
                    for i, (item, back) in enumerate(zip(value, got, strict=True))
                    if (why := same_bits(item, back))
                ]
            assert by_id[row_id]["days"] == [dt.date(2024, 2, 29)]  # (the default)
        assert not problems, "\n".join(problems)

        for column, value in ARRAYS_REFUSED:

            async def bad(uow: af.UnitOfWork, column: str = column, value: Any = value) -> None:
                uow.create("v", {"ints": [7]})
                uow.create("v", {column: value})

            with pytest.raises(af.ValidationError, match=f"v.{column}"):
                await more_uow(db, ns, bad, schema=ARRAYS)
        assert await count_in(db, ns, None, ARRAYS) == len(ARRAY_VALUES)


async def test_raw_parameters_match_the_stored_form(db: af.Database, spaces: Namespaces) -> None:
    """A raw query's uuid, time, float and enum parameters compare with the
    values the unit of work stored (uuids as 16 bytes, SQLite times as
    fixed-width text)."""
    ns = await migrated(db, spaces, MORE)
    values = {"u": uuid.UUID(int=2**100 + 5), "tm": dt.time(7, 0), "fl": 0.1, "e": Status.PAID}

    async def write(uow: af.UnitOfWork) -> None:
        uow.create("v", values)
        uow.create("v", {"sm": 1})

    await more_uow(db, ns, write)
    table = db.layout(MORE, ns).table("v").identifier
    for column, value in values.items():
        query = af.sql(
            "SELECT count(*) FROM {t} WHERE {c} = {v}", t=table, c=af.Identifier(column), v=value
        )
        assert await db.fetch_value(query) == 1, column
