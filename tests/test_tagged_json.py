"""Tagged JSON (outbox payloads, cursors): every supported value comes back
exactly, whichever branch of the encoder it takes."""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from decimal import Decimal

import pytest

from aiofragno import tagged_json
from aiofragno.schema import RowId


class Text(str):
    pass


class Number(int):
    pass


def test_round_trip_of_every_kind() -> None:
    value = {
        "s": "plain",
        "f": 1.5,
        "t": True,
        "n": None,
        "small": 2**53 - 1,
        "big": 2**53,
        "negative_big": -(2**70),
        "when": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC),
        "day": dt.date(2024, 2, 29),
        "money": Decimal("1.10"),
        "raw": b"\x00\xffbytes",
        "list": [1, "two", [3.0, None]],
        "nested": {"a": {"b": [Decimal("0.1")]}},
        "dollar": {"$dt": "not a tag"},
        "time": dt.time(23, 59, 59, 999999),
        "aware_time": dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
        "uuid": uuid.UUID("0190a4c1-7e3b-7c2d-9f00-123456789abc"),
    }
    assert tagged_json.loads(tagged_json.dumps(value)) == value


def test_floats_come_back_bit_for_bit() -> None:
    floats = [-0.0, 0.0, 5e-324, -2.225073858507201e-308, 1.7976931348623157e308, 0.1, 1 / 3]
    back = tagged_json.loads(tagged_json.dumps(floats))
    assert [struct.pack("<d", f) for f in back] == [struct.pack("<d", f) for f in floats]


def test_a_sub_second_utc_offset_keeps_its_instant() -> None:
    """(Python 3.11's fromisoformat reads "+00:00:00.000001" as UTC.)"""
    odd = dt.timezone(dt.timedelta(microseconds=1))
    value = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=odd)
    back = tagged_json.loads(tagged_json.dumps(value))
    assert back == value and back.utcoffset() == dt.timedelta(0)


def test_subclasses_take_the_general_path() -> None:
    text = tagged_json.dumps({"id": RowId("0190-abc", 3, 7), "t": Text("x"), "n": Number(2**60)})
    assert tagged_json.loads(text) == {"id": "0190-abc", "t": "x", "n": 2**60}


def test_bool_is_not_an_int_and_tuples_become_lists() -> None:
    assert tagged_json.dumps([True, False, 1]) == "[true,false,1]"
    assert tagged_json.loads(tagged_json.dumps((1, (2, 3)))) == [1, [2, 3]]


def test_object_keys_must_be_str() -> None:
    """Not converted: json writes True as "true", str() as "True", so a key
    would not read back as written (and not alike in a row and a payload)."""
    for key in (1, True, None, 1.5):
        with pytest.raises(TypeError, match="keys must be str"):
            tagged_json.dumps({"x": {key: "value"}})


def test_unknown_types_are_refused() -> None:
    with pytest.raises(TypeError, match="set"):
        tagged_json.dumps({"x": {1, 2}})


def test_loads_many_decodes_like_loads_one_by_one() -> None:
    texts: list[str | bytes | None] = [
        tagged_json.dumps({"money": Decimal("1.10"), "n": 1}),
        None,
        b'{"plain": [1, 2]}',
        tagged_json.dumps({"dollar": {"$dt": "not a tag"}}),
        "[]",
        None,
    ]
    expected = [None if t is None else tagged_json.loads(t) for t in texts]
    assert tagged_json.loads_many(texts) == expected
    assert tagged_json.loads_many([None, None]) == [None, None]
    assert tagged_json.loads_many([]) == []


@pytest.mark.parametrize("bad", ["", "1, 2", '{"a": 1', "nul"])
def test_loads_many_fails_on_a_bad_text_as_loads_does(bad: str) -> None:
    # "1, 2" is two values once joined into an array: the count gives it away.
    with pytest.raises(ValueError) as many:
        tagged_json.loads_many(['{"ok": 1}', bad, "[3]"])
    with pytest.raises(ValueError) as one:
        tagged_json.loads(bad)
    assert str(many.value) == str(one.value)
