"""Aggregates in the unit of work (``uow.aggregate`` with ``af.fn``): exact
result types on every backend, grouping, NULLs and empty inputs, what is
refused, and the sum of bigints past 64 bits."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import Env, MakeEnv

pytestmark = pytest.mark.anyio

LEDGER = af.Schema(
    "ledger",
    af.Table("owners", af.Column("name", "string")),
    af.Table(
        "entries",
        af.Reference("owner", "owners"),
        af.Column("kind", "string", nullable=True),
        af.Column("qty", "integer", nullable=True),
        af.Column("big", "bigint", default=0),
        af.Column("amount", "decimal", nullable=True),
        af.Column("day", "date", nullable=True),
        af.Column("at", "timestamp", nullable=True),
        af.Column("flag", "bool", default=False),
        af.Column("meta", "json", nullable=True),
        af.Column("blob", "binary", nullable=True),
        af.Column("small", "smallint", default=0),
        af.Column("clock", "time", nullable=True),
    ),
)

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)


@pytest.fixture
async def ledger(make_env: MakeEnv) -> Env:
    return await make_env(LEDGER)


async def _seed(env: Env) -> tuple[af.RowId, af.RowId]:
    ann, bob = await env.create("owners", {"name": "ann"}, {"name": "bob"})
    rows: list[dict[str, Any]] = [
        {"owner": ann, "kind": "a", "qty": 1, "big": 2**62, "day": dt.date(2024, 1, 2)},
        {"owner": ann, "kind": "a", "qty": 2, "big": 2**62, "at": T0},
        {"owner": bob, "kind": "b", "qty": 4, "big": -5, "day": dt.date(2023, 12, 31)},
        {"owner": bob, "kind": None, "qty": None, "big": 7, "at": T0 + dt.timedelta(days=1)},
    ]
    await env.create("entries", *rows)
    return ann, bob


async def test_aggregates_are_exact_and_typed(ledger: Env) -> None:
    await _seed(ledger)

    async def unit(uow: af.UnitOfWork) -> tuple[Any, ...]:
        total = uow.aggregate(
            "entries",
            {
                "n": af.fn.count(),
                "kinds": af.fn.count("kind"),
                "qty": af.fn.sum("qty"),
                "big": af.fn.sum("big"),
                "avg_qty": af.fn.avg("qty"),
                "first_day": af.fn.min("day"),
                "last_at": af.fn.max("at"),
                "min_kind": af.fn.min("kind"),
                "max_big": af.fn.max("big"),
            },
        )
        filtered = uow.aggregate(
            "entries", {"n": af.fn.count(), "q": af.fn.sum("qty")}, af.c.qty > 1
        )
        nothing = uow.aggregate(
            "entries",
            {
                "n": af.fn.count(),
                "s": af.fn.sum("qty"),
                "a": af.fn.avg("qty"),
                "m": af.fn.max("at"),
            },
            where={"kind": "zzz"},
        )
        count = uow.count("entries")  # (combined with the aggregates on PostgreSQL)
        await uow.retrieve()
        return total.result, filtered.result, nothing.result, count.result

    total, filtered, nothing, count = await ledger.run(unit)
    assert total == {
        "n": 4,
        "kinds": 3,
        "qty": 7,
        "big": 2**63 + 2,  # past 64 bits, and still exact
        "avg_qty": Decimal("2.333333333333333333333333333"),
        "first_day": dt.date(2023, 12, 31),
        "last_at": T0 + dt.timedelta(days=1),
        "min_kind": "a",
        "max_big": 2**62,
    }
    assert [type(total[k]) for k in ("n", "qty", "big", "avg_qty")] == [int, int, int, Decimal]
    assert type(total["first_day"]) is dt.date and type(total["last_at"]) is dt.datetime
    assert filtered == {"n": 2, "q": 6}
    assert nothing == {"n": 0, "s": None, "a": None, "m": None}
    assert count == 4


async def test_sums_past_64_bits_run_again_as_halves(ledger: Env) -> None:
    """Where SUM fails past 64 bits (SQLite), an integer sum is one SUM until
    it does; then the retrieve's reads all run again, the sum as two halves:
    exact either way, below -2**63 too, and the other reads' results right."""
    ann, _ = await _seed(ledger)
    await ledger.create("entries", *({"owner": ann, "big": -(2**62)} for _ in range(5)))
    texts: list[str] = []

    async def unit(uow: af.UnitOfWork) -> tuple[Any, ...]:
        fits = uow.aggregate("entries", {"s": af.fn.sum("big")}, {"kind": "b"})
        low = uow.aggregate("entries", {"s": af.fn.sum("big")}, af.c.big < 0)
        qty = uow.aggregate("entries", {"q": af.fn.sum("qty"), "n": af.fn.count()})
        n = uow.count("entries")
        await uow.retrieve()
        return fits.result, low.result, qty.result, n.result

    results = await ledger.run(unit, on_query=lambda q: texts.append(q.sql))
    assert results == ({"s": -5}, {"s": -5 * 2**62 - 5}, {"q": 7, "n": 9}, 9)
    assert all(type(r["s"]) is int for r in results[:2])
    if ledger.db._engine.adapter.sql.int_sum_overflow is None:
        assert len(texts) == 4 and not any(">>" in t for t in texts)
        return
    # The first four failed on the -5 * 2**62 sum; all four again, split.
    assert len(texts) == 8 and not any(">>" in t for t in texts[:4])
    assert [">>" in t for t in texts[4:]] == [True, True, True, False]


async def test_group_by(ledger: Env) -> None:
    ann, bob = await _seed(ledger)

    async def unit(uow: af.UnitOfWork) -> tuple[Any, ...]:
        by_kind = uow.aggregate(
            "entries", {"n": af.fn.count(), "qty": af.fn.sum("qty")}, group_by="kind"
        )
        by_owner = uow.aggregate(
            "entries", {"big": af.fn.sum("big")}, af.c.big > 0, group_by=["owner", "flag"]
        )
        none = uow.aggregate("entries", {"n": af.fn.count()}, {"kind": "zzz"}, group_by="kind")
        distinct = uow.aggregate("entries", {}, group_by=["kind"])
        by_day = uow.aggregate("entries", {"n": af.fn.count()}, group_by="day")
        await uow.retrieve()
        return by_kind.result, by_owner.result, none.result, distinct.result, by_day.result

    by_kind, by_owner, none, distinct, by_day = await ledger.run(unit)
    assert by_day == [  # (group values decoded as in rows: dates, on SQLite's text too)
        {"day": dt.date(2023, 12, 31), "n": 1},
        {"day": dt.date(2024, 1, 2), "n": 1},
        {"day": None, "n": 2},
    ]
    assert by_kind == [
        {"kind": "a", "n": 2, "qty": 3},
        {"kind": "b", "n": 1, "qty": 4},
        {"kind": None, "n": 1, "qty": None},  # (None last, on every backend)
    ]
    # (Ordered by the owners' ids, as strings.)
    assert by_owner == sorted(
        [{"owner": ann, "flag": False, "big": 2**63}, {"owner": bob, "flag": False, "big": 7}],
        key=lambda g: str(g["owner"]),
    )
    owner = next(g["owner"] for g in by_owner if g["owner"] == ann)
    assert isinstance(owner, af.RowId) and owner.internal_id is not None
    assert none == []
    assert distinct == [{"kind": "a"}, {"kind": "b"}, {"kind": None}]


async def test_decimal_aggregates(ledger: Env) -> None:
    """Exact past a float's and a default decimal context's digits, on every
    backend (SQLite's, stored as text, through aiofragno's own functions)."""
    ann, bob = await _seed(ledger)
    big = Decimal("12345678901234567890123456.123456789")
    await ledger.create(
        "entries",
        *({"owner": ann, "kind": "d", "amount": a} for a in (big, Decimal("0.000000001"))),
        {"owner": bob, "kind": "d", "amount": Decimal("-9.5")},
        {"owner": bob, "kind": "d", "amount": Decimal("10")},  # (text order: "10" < "9.5")
    )

    async def unit(uow: af.UnitOfWork) -> Any:
        aggregates = {
            "s": af.fn.sum("amount"),
            "a": af.fn.avg("amount"),
            "lo": af.fn.min("amount"),
            "hi": af.fn.max("amount"),
        }
        one = uow.aggregate("entries", aggregates, {"kind": "d"})
        small = uow.aggregate("entries", aggregates, af.c.owner == bob)
        none = uow.aggregate("entries", aggregates, {"kind": "zzz"})
        await uow.retrieve()
        return one.result, small.result, none.result

    one, small, none = await ledger.run(unit)
    assert one == {
        "s": Decimal("12345678901234567890123456.623456790"),
        "a": Decimal("3086419725308641972530864.156"),  # (28 significant digits)
        "lo": Decimal("-9.5"),
        "hi": big,
    }
    assert small == {"s": Decimal("0.5"), "a": Decimal("0.25"), "lo": Decimal("-9.5"), "hi": 10}
    assert all(type(v) is Decimal for v in (*one.values(), *small.values()))
    assert none == dict.fromkeys(("s", "a", "lo", "hi"))


REFUSED: list[tuple[Any, str]] = [
    (af.fn.sum("meta"), r"entries\.meta is a json column"),
    (af.fn.max("blob"), r"entries\.blob is a binary column"),
    (af.fn.avg("kind"), r"entries\.kind is a string column"),
    (af.fn.min("flag"), r"entries\.flag is a bool column"),
    (af.fn.max("owner"), r"entries\.owner is a reference column"),
    (af.fn.sum("nope"), "nope"),
    (af.fn.count("_id"), "internal"),
    ("sum", "use af.fn.count"),
]


async def test_refused_at_the_call(ledger: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        for aggregate, match in REFUSED:
            with pytest.raises(af.ValidationError, match=match):
                uow.aggregate("entries", {"x": aggregate})

    await ledger.run(unit)


async def test_refused_shapes(ledger: Env) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"aggregates": {}}, "at least one aggregate"),
        ({"aggregates": [af.fn.count()]}, "takes a dict"),
        ({"aggregates": {"kind": af.fn.count()}, "group_by": "kind"}, "name of a group_by"),
        ({"aggregates": {"n": af.fn.count()}, "group_by": "meta"}, "cannot be grouped"),
        ({"aggregates": {"n": af.fn.count()}, "group_by": ["kind", "kind"]}, "twice"),
        ({"aggregates": {"n": af.fn.count()}, "group_by": 3}, "group_by takes"),
        ({"aggregates": {"n": af.fn.count()}, "where": af.c.qty == "1"}, r"entries\.qty"),
    ]
    for kwargs, match in cases:

        async def unit(uow: af.UnitOfWork, kwargs: dict[str, Any] = kwargs) -> None:
            uow.aggregate("entries", **kwargs)
            await uow.retrieve()

        with pytest.raises(af.ValidationError, match=match):
            await ledger.run(unit)
    with pytest.raises(af.ValidationError, match="column name"):
        af.fn.sum(3)  # type: ignore[arg-type]


async def test_dry_run_gives_empty_aggregates(ledger: Env) -> None:
    async def unit(uow: af.UnitOfWork) -> tuple[Any, Any]:
        one = uow.aggregate("entries", {"n": af.fn.count(), "s": af.fn.sum("qty")})
        grouped = uow.aggregate("entries", {"n": af.fn.count()}, group_by="kind")
        await uow.retrieve()
        return one.result, grouped.result

    assert await ledger.run(unit, dry_run=True) == ({"n": 0, "s": None}, [])


async def test_smallint_and_time_columns(ledger: Env) -> None:
    """The smaller column types aggregate as their kin: a smallint sums to an
    int, a time's min and max are times."""
    ann, _ = await _seed(ledger)
    await ledger.create(
        "entries",
        {"owner": ann, "small": 32767, "clock": dt.time(23, 59, 59, 999999)},
        {"owner": ann, "small": 32767, "clock": dt.time(0, 0, 0, 1)},
    )

    async def unit(uow: af.UnitOfWork) -> dict[str, Any]:
        result = uow.aggregate(
            "entries",
            {"s": af.fn.sum("small"), "lo": af.fn.min("clock"), "hi": af.fn.max("clock")},
        )
        await uow.retrieve()
        return result.result

    assert await ledger.run(unit) == {
        "s": 65534,
        "lo": dt.time(0, 0, 0, 1),
        "hi": dt.time(23, 59, 59, 999999),
    }
