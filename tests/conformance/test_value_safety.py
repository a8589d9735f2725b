"""Hostile values on every backend and runtime: each is stored exactly — the
row and the outbox entry read back equal to it — or refused with
ValidationError, with nothing written and no entry. Never silently changed
(PostgreSQL's driver writes a decimal past numeric's range as 0), never
amplified (a 13-character decimal written out as 100 MB of text), never a raw
Python exception (RecursionError, OverflowError, TypeError).

Through the unit of work (an outbox-enabled Database, so that the entry is
checked too) and through raw ``af.sql`` where the value reaches the driver.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

import aiofragno as af
from aiofragno.brief import brief
from aiofragno.json_check import MAX_DEPTH
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target

pytestmark = pytest.mark.anyio

UTC = dt.UTC

VALUES = af.Schema(
    "values",
    af.Table(
        "v",
        af.Column("d", "decimal", nullable=True),
        af.Column("j", "json", nullable=True),
        af.Column("ts", "timestamp", nullable=True),
        af.Column("s", "text", nullable=True),
        af.Column("n", "bigint", default=0),
    ),
)


class Refused(Exception):
    """What :func:`store` returns for a value refused with ValidationError."""


class Store:
    """VALUES migrated in a namespace of an outbox-enabled Database."""

    def __init__(self, db: af.Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace
        self.table = db.layout(VALUES, namespace).table("v").identifier

    async def run(self, fn: Any, **options: Any) -> Any:
        return await self.db.execute_uow(fn, schema=VALUES, namespace=self.namespace, **options)

    async def count(self) -> int:
        return int(await self.db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=self.table)))

    async def store(self, column: str, value: Any) -> tuple[Any, Any] | Refused:
        """Create a row with ``value`` in ``column``: (the value read back,
        the value in the outbox entry), or Refused — after checking that
        the ValidationError came before anything was written."""
        key = f"vs-{uuid.uuid4().hex}"
        before = await self.count()

        async def create(uow: af.UnitOfWork) -> af.RowId:
            return uow.create("v", {column: value})

        try:
            row_id = await self.run(create, idempotency_key=key)
        except af.ValidationError as exc:
            assert await self.count() == before, f"{column}={brief(value)}: rows were written"
            assert await self.db.outbox.find(key) is None, f"{column}={brief(value)}: an entry"
            return Refused(str(exc))

        async def read(uow: af.UnitOfWork) -> Any:
            op = uow.find_first("v", where={"id": row_id})
            await uow.retrieve()
            return op.result[column]

        entry = await self.db.outbox.find(key)
        assert entry is not None, "a committed create must have its entry"
        [mutation] = entry.mutations
        return await self.run(read), mutation["values"][column]


@pytest.fixture
async def store(url: str, target: Target, tmp_path: Any) -> AsyncIterator[Store]:
    async with af.connect(url, backend=target.backend, pool_size=2, outbox=True) as db:
        spaces = Namespaces(db)
        namespace = spaces.use(db, VALUES).namespace
        await db.migrate(VALUES, namespace=namespace)
        try:
            yield Store(db, namespace)
        finally:
            await spaces.drop()


def same(expected: Any, got: Any) -> bool:
    """An exact round trip: equal, of the same type (a Decimal stays one)."""
    return type(got) is type(expected) and got == expected


async def exact_or_refused(
    store: Store, column: str, values: list[Any], *, refused: list[Any] = ()
) -> None:
    """Each of ``values`` round-trips exactly through the row and the entry,
    or is refused; each of ``refused`` is refused. Collects every problem."""
    problems = []
    for value in [*values, *refused]:
        outcome = await store.store(column, value)
        label = f"{column}={brief(value)}"
        if isinstance(outcome, Refused):
            continue
        if any(value is r for r in refused):
            problems.append(f"{label}: accepted ({brief(outcome[0])}), must be refused")
            continue
        row, entry = outcome
        expected = Decimal(value) if column == "d" else value
        if not same(expected, row):
            problems.append(f"{label}: the row reads back {brief(row)}")
        if not same(expected, entry):
            problems.append(f"{label}: the entry carries {brief(entry)}")
    assert not problems, problems


# -- decimals -------------------------------------------------------------------


async def test_decimals_are_exact_or_refused(store: Store) -> None:
    """Beyond what any backend's decimal column holds (PostgreSQL numeric:
    131072 digits before the point, 16383 after; SQLite keeps the same
    bound; MySQL decimal(65,30)), a decimal is refused — PostgreSQL's driver
    wrote 1E+131072 as 0 while the entry kept it. Exact values written with
    huge exponents (zeros, trailing zeros) are stored as the number they are."""
    fits_somewhere = [
        Decimal("1E+131071"),
        Decimal("-9.5E+131070"),
        Decimal("1E-16383"),
        Decimal("1E+40"),
        Decimal("1E-31"),
    ]
    equal_to_small = [
        Decimal("0E+1000000"),
        Decimal("-0E-1000000"),
        Decimal("1." + "0" * 20000),
        Decimal("123.45" + "0" * 17000),
        Decimal("5" + "0" * 50 + "E-50"),
    ]
    never = [
        Decimal("1E+131072"),
        Decimal("-9E+131072"),
        10**131072,
        Decimal("1E+100000000"),
        Decimal("1E+2000000000"),
        Decimal("1E+999999999999999999"),
        Decimal("1E-16384"),
        Decimal("1E-1000000"),
        Decimal("-1E-999999999999999999"),
        Decimal("NaN"),
        Decimal("sNaN"),
        Decimal("Infinity"),
        Decimal("-Infinity"),
    ]
    await exact_or_refused(store, "d", [*fits_somewhere, *equal_to_small], refused=never)
    for value in equal_to_small:
        assert not isinstance(await store.store("d", value), Refused), value


async def test_huge_exponents_cost_no_memory(store: Store) -> None:
    """A 13-character decimal must not become 100 MB of text (SQLite stores
    decimals as text, MySQL's driver writes them out): the unit that takes
    (or refuses) it allocates little, whatever the exponent."""
    for value in [
        Decimal("1E+100000000"),
        Decimal("-1E+2000000000"),
        Decimal("0E+2000000000"),
        Decimal("0E-2000000000"),
        Decimal("1E-2000000000"),
    ]:
        tracemalloc.start()
        try:
            await store.store("d", value)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 * 2**20, f"{value}: {peak / 2**20:.1f} MiB"


async def test_raw_decimals_are_exact_or_refused(store: Store) -> None:
    """The same through raw af.sql into the decimal column: what the
    database's numeric type cannot hold exactly is refused before the driver
    (PostgreSQL's wrote it as 0, MySQL's writes it out positionally), also
    inside a PostgreSQL array; NaN and infinities only where the type holds
    them (PostgreSQL), a signalling NaN nowhere."""
    db = store.db
    values = [
        Decimal("1E+131072"),
        Decimal("1E+100000000"),
        Decimal("1E-1000000"),
        Decimal("0E+1000000"),
        Decimal("1." + "0" * 20000),
        Decimal("12.5"),
        Decimal("NaN"),
        Decimal("Infinity"),
        Decimal("sNaN"),
    ]
    problems = []
    for value in values:
        external_id = uuid.uuid4().hex
        insert = af.sql(
            "INSERT INTO {t} (id, d, n, _version) VALUES ({i}, {d}, 0, 0)",
            t=store.table,
            i=external_id,
            d=value,
        )
        try:
            await db.execute(insert)
        except af.ValidationError:
            continue
        except af.Error as exc:
            problems.append(f"{value!s:.40}: {type(exc).__name__} {exc!s:.80}")
            continue
        stored = await db.fetch_value(
            af.sql("SELECT d FROM {t} WHERE id = {i}", t=store.table, i=external_id)
        )
        back = Decimal(stored)  # (SQLite hands decimal text back as text)
        if value.is_nan():  # (NaN equals nothing, and comparing sNaN raises)
            exact = back.is_nan() and back.is_snan() == value.is_snan()
        else:
            exact = back == value
        if not exact:
            problems.append(f"{value!s:.40}: stored as {stored!s:.40}")
    if db.name == "postgresql":
        try:
            got = await db.fetch_value(
                af.sql("SELECT CAST({a} AS numeric[])", a=[Decimal("1E+131072")])
            )
            problems.append(f"array: stored as {got!r:.40}")
        except af.ValidationError:
            pass
    assert not problems, problems


# -- JSON -----------------------------------------------------------------------


def nested(depth: int, leaf: Any = 1, *, key: str | None = None) -> Any:
    """``leaf`` inside ``depth`` levels: lists, or one-key objects."""
    value = leaf
    for _ in range(depth):
        value = [value] if key is None else {key: value}
    return value


async def test_json_nesting_is_bounded(store: Store) -> None:
    """A json value nests at most the database's limit (64 levels; 26 on
    MySQL/MariaDB, whose JSON type holds 31 and whose outbox entry and dead
    letter put a value 5 levels down): up to it, the row and the entry hold
    it; past it — or nested thousands deep, where encoding hit Python's
    recursion limit — a ValidationError. A one-key object with a key
    starting with $ counts three levels (the entry escapes it so)."""
    limit = store.db._engine.adapter.storage.json_max_depth
    assert limit <= MAX_DEPTH
    fits = [nested(limit), nested(limit, key="k"), nested(limit // 3, key="$k")]
    for value in fits:
        outcome = await store.store("j", value)
        assert not isinstance(outcome, Refused), outcome
        assert outcome == (value, value)
    too_deep = [
        nested(limit + 1),
        nested(limit + 1, key="k"),
        nested(limit // 3 + 1, key="$k"),
        nested(900),
        nested(5000, key="k"),
    ]
    for value in too_deep:
        assert isinstance(await store.store("j", value), Refused)


async def test_json_keys_must_be_str(store: Store) -> None:
    """json writes True as "true" in the row, tagged JSON as "True" in the
    entry: a key that is not a str would not read back as written anywhere."""
    for value in [{1: "a"}, {"x": {True: 1}}, [{None: 1}], {"x": [{1.5: 2}]}, {(1, 2): 3}]:
        assert isinstance(await store.store("j", value), Refused), value
    with pytest.raises(af.ValidationError, match="keys must be str"):
        await store.db.fetch_value(af.sql("SELECT {j} AS j", j=af.Json({"x": {True: 1}})))


async def test_raw_json_is_bounded_and_refuses_what_json_cannot_hold(store: Store) -> None:
    """Raw dict and af.Json values: nesting past 64 levels, keys that are not
    str, values JSON has no form for and circular ones are ValidationErrors."""
    loop: list[Any] = []
    loop.append(loop)
    bad = [
        nested(MAX_DEPTH + 1, key="k"),
        af.Json(nested(MAX_DEPTH + 1)),
        af.Json(nested(3000)),
        {"k": {2: "x"}},
        af.Json([{"k": {1, 2}}]),
        af.Json({"x": float("nan")}),
        af.Json(loop),
        {"k": "lone \udc80 surrogate"},
    ]
    for value in bad:
        with pytest.raises(af.ValidationError):
            store.db.compile(af.sql("SELECT {j} AS j", j=value))
    ok = nested(MAX_DEPTH, key="k")
    assert store.db.compile(af.sql("SELECT {j} AS j", j=ok)).parameters


# -- text -------------------------------------------------------------------------


async def test_lone_surrogates_are_refused(store: Store) -> None:
    """A str with a lone surrogate is no Unicode text: no database stores it.
    A ValidationError before the driver (which failed with a generic error,
    or took it as a query problem)."""
    for column, value in [("s", "a\ud800b"), ("j", {"k": "\udfff"}), ("j", {"\ud800": 1})]:
        assert isinstance(await store.store(column, value), Refused), (column, value)
    with pytest.raises(af.ValidationError, match="surrogate"):
        await store.db.fetch_value(af.sql("SELECT {s} AS s", s="x\udc80"))


# -- timestamps ------------------------------------------------------------------


class NoOffset(dt.tzinfo):
    """A tzinfo that cannot tell its offset: Python calls its datetimes naive."""

    def utcoffset(self, when: dt.datetime | None) -> None:
        return None

    def dst(self, when: dt.datetime | None) -> None:
        return None

    def tzname(self, when: dt.datetime | None) -> str:
        return "somewhere"


class BadOffset(dt.tzinfo):
    def utcoffset(self, when: dt.datetime | None) -> Any:
        return 3600  # not a timedelta

    def dst(self, when: dt.datetime | None) -> None:
        return None


EDGE_INSTANTS = [
    dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-1))),
    dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=1))),
    dt.datetime(9999, 12, 31, 23, 30, tzinfo=dt.timezone(-dt.timedelta(hours=23, minutes=59))),
    dt.datetime(1, 1, 1, 0, 30, tzinfo=dt.timezone(dt.timedelta(hours=23, minutes=59))),
]
NO_INSTANT = [
    dt.datetime(2024, 5, 1, 12, tzinfo=NoOffset()),
    dt.datetime(2024, 5, 1, 12, tzinfo=BadOffset()),
]


async def test_timestamps_without_a_utc_instant_are_refused(store: Store) -> None:
    """A datetime whose UTC conversion leaves datetime's range (OverflowError
    before), or whose tzinfo gives no offset (taken as the machine's local
    time before), is refused; the same wall times with offsets that stay in
    range are stored as their instant."""
    for value in EDGE_INSTANTS + NO_INSTANT:
        assert isinstance(await store.store("ts", value), Refused), value
    fine = dt.datetime(9999, 12, 31, 22, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    outcome = await store.store("ts", fine)
    assert not isinstance(outcome, Refused), outcome
    row, entry = outcome
    assert row == fine and entry == fine


async def test_naive_by_tzinfo_is_refused_even_as_utc(url: str, target: Target) -> None:
    """naive_datetimes="utc" takes datetimes without a tzinfo as UTC, not
    ones whose tzinfo names a zone it cannot tell: those are refused too."""
    async with af.connect(url, backend=target.backend, naive_datetimes="utc") as db:
        encode = db._engine.codec.encoder("timestamp")
        assert encode(dt.datetime(2024, 5, 1)) is not None
        with pytest.raises(af.ValidationError, match="utcoffset"):
            encode(dt.datetime(2024, 5, 1, tzinfo=NoOffset()))


async def test_raw_timestamps_without_an_instant_are_refused(store: Store) -> None:
    """The same for raw af.sql parameters, and on PostgreSQL the first and
    last date and datetime, which its driver writes as -infinity/infinity."""
    db = store.db
    bad: list[Any] = EDGE_INSTANTS + NO_INSTANT
    if db.name == "postgresql":
        bad += [dt.date.max, dt.date.min, dt.datetime.max, dt.datetime.min.replace(tzinfo=UTC)]
    problems = []
    for value in bad:
        try:
            db.compile(af.sql("SELECT {v} AS v", v=value))
        except af.ValidationError:
            continue
        except Exception as exc:  # (any other exception is the defect)
            problems.append(f"{value!r}: {type(exc).__name__}: {exc}")
            continue
        problems.append(f"{value!r}: accepted")
    assert not problems, problems


# -- reads: order_by and cursors --------------------------------------------------


@pytest.mark.parametrize(
    "order_by",
    [
        {"n": "desc"},
        5,
        ("n", "desc", "extra"),
        [["n", "desc", 1]],
        [("n",)],
        [5],
        [(5, "asc")],
        [("n", ["desc"])],
        [("n", "DESC")],
        [None],
        {"n"},
        b"n",
    ],
    ids=repr,
)
async def test_order_by_of_a_wrong_shape_is_refused(store: Store, order_by: Any) -> None:
    """Anything but a column, a (column, 'asc'|'desc') pair or a list of those
    is a ValidationError saying so (a dict was taken for its keys, others
    raised TypeError/ValueError/AttributeError)."""

    async def unit(uow: af.UnitOfWork) -> None:
        uow.find("v", order_by=order_by)

    with pytest.raises(af.ValidationError, match="order"):
        await store.run(unit)


def cursor_of(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


async def test_garbage_cursors_are_refused(store: Store) -> None:
    """A cursor is a user's string: any garbage — nested past the JSON
    decoder's recursion, the wrong shape, huge numbers, values of the wrong
    type for the order's column — is a ValidationError before any SQL."""
    created = await store.store("n", 1)
    assert not isinstance(created, Refused)

    async def first_page(uow: af.UnitOfWork) -> str | None:
        op = uow.find("v", order_by="n", limit=1)
        await uow.retrieve()
        return op.result.cursor

    await store.store("n", 2)
    good = await store.run(first_page)
    assert good is not None
    key = json.loads(base64.urlsafe_b64decode(good + "=" * (-len(good) % 4)))["k"]
    garbage: list[Any] = [
        cursor_of("[" * 100_000 + "]" * 100_000),
        cursor_of('{"k":' * 5000 + "1" + "}" * 5000),
        cursor_of('{"$obj": 5}'),
        cursor_of('{"$int": "' + "9" * 5000 + '"}'),
        cursor_of("9" * 5000),
        cursor_of(f'{{"k":"{key}","v":[1, {2**70}]}}'),
        cursor_of(f'{{"k":"{key}","v":[1, true]}}'),
        cursor_of(f'{{"k":"{key}","v":[1, 1.5]}}'),
        cursor_of(f'{{"k":"{key}","v":["one", 1]}}'),
        cursor_of(f'{{"k":"{key}","v":[{2**70}, 1]}}'),
        cursor_of(f'{{"k":"{key}","v":[[[[1]]], 1]}}'),
        cursor_of(f'{{"k":"{key}","v":[]}}'),
        cursor_of(f'{{"k":"{key}","v":{{}}}}'),
        "not base64 at all!",
        "\udc80",
        5,
        b"bytes",
        ["a", "list"],
    ]
    problems = []
    for cursor in garbage:

        async def unit(uow: af.UnitOfWork, cursor: Any = cursor) -> None:
            uow.find("v", order_by="n", limit=1, after=cursor)
            await uow.retrieve()

        try:
            await store.run(unit)
        except af.ValidationError:
            continue
        except Exception as exc:  # (any other exception is the defect)
            problems.append(f"{cursor!r:.60}: {type(exc).__name__}: {exc!s:.80}")
            continue
        problems.append(f"{cursor!r:.60}: accepted")
    assert not problems, problems


async def test_errors_about_hostile_values_are_validation_errors(store: Store) -> None:
    """What the fuzzer (tests/test_codec_fuzz.py) found: the error about a
    bad value must not fail itself — an int too long for repr() (ValueError
    before), a list nested past the recursion limit (RecursionError), a
    range comparison on an unknown column (KeyError)."""
    huge = 10**5000
    deep = nested(5000)

    def queues(uow: af.UnitOfWork) -> list[Any]:
        return [
            lambda: uow.create("v", {"n": huge}),
            lambda: uow.create("v", {"s": huge}),
            lambda: uow.create("v", {huge: 1}),
            lambda: uow.find("v", where=af.c.nope > 1).compile(uow._catalog),
            lambda: uow.find("v", where=af.c[huge] == 1).compile(uow._catalog),
            lambda: uow.find("v", order_by=[deep]),
            lambda: uow.find("v", order_by="n", limit=huge),
            lambda: uow.update("v", af.RowId("x", huge), {"n": 1}, check=True),
        ]

    async def unit(uow: af.UnitOfWork) -> list[str]:
        problems = []
        for number, queue in enumerate(queues(uow)):
            try:
                queue()
            except af.ValidationError:
                continue
            except Exception as exc:  # (any other exception is the defect)
                problems.append(f"{number}: {type(exc).__name__}: {exc!s:.80}")
                continue
            problems.append(f"{number}: accepted")
        uow.mutations.clear()  # (nothing to write)
        return problems

    assert await store.run(unit) == []
    if store.db.name == "postgresql":
        with pytest.raises(af.ValidationError):
            store.db.compile(af.sql("SELECT {a}", a=deep))


RAW_HOSTILE: list[Any] = [
    2**63,
    2**64,
    -(2**63) - 1,
    10**5000,
    float("nan"),
    float("inf"),
    bytearray(b"x"),
    b"\x00",
    dt.timedelta(days=999999999),
    dt.time(1, tzinfo=NoOffset()),
    uuid.UUID(int=1),
    {1, 2},
    [1, [2]],
    (1, 2),
    [],
    ["a\x00"],
    [Decimal("1E+131072")],
    nested(100),
    dt.date(1, 1, 1),
    Decimal("-0"),
    {"a": [1, {"b": None}]},
    af.Json(10**20),
    af.RowId("x", 1, 2),
]


async def test_raw_values_raise_only_aiofragno_errors(store: Store) -> None:
    """Any value given to raw af.sql either runs or fails with an aiofragno
    error (the driver's own translated), never a bare Python exception; and
    what SQLite would change is refused: NaN (stored as NULL) and integers
    beyond 64 bits."""
    db = store.db
    problems = []
    for value in RAW_HOSTILE:
        try:
            await db.fetch_value(af.sql("SELECT {v} AS v", v=value))
        except af.Error:
            continue
        except Exception as exc:  # (any other exception is the defect)
            problems.append(f"{brief(value)}: {type(exc).__name__}: {exc!s:.80}")
    assert not problems, problems
    if db.name == "sqlite":
        for value in (float("nan"), 2**63, -(2**63) - 1):
            with pytest.raises(af.ValidationError):
                await db.fetch_value(af.sql("SELECT {v} AS v", v=value))
