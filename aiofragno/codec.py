"""The value codec: one place that checks Python values against logical column
types, encodes them for a dialect's storage, and decodes them back.

Exactness is the rule. Values a backend could only store approximately are
refused with :class:`~aiofragno.errors.ValidationError` rather than changed:
floats for decimals, sub-millisecond timestamps under SQLite's epoch-ms
profile, NUL characters in PostgreSQL text, naive datetimes (unless
``naive_datetimes="utc"``), integers outside the column's range, strings longer
than the column holds, floats that are not finite (every backend alike: MySQL
has no NaN or infinity, and an outbox entry's JSON neither), ``-0.0`` where
the database keeps only ``0.0`` (MySQL), ints that no double holds exactly,
enum values outside the declared set, times with a time zone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from .brief import brief
from .column_types import ArrayType, EnumType, TypeArg
from .driver import StorageProfile
from .errors import ValidationError
from .sql import json_text, unicode_text

Encode = Callable[[Any], Any]
Decode = Callable[[Any], Any]

LOGICAL_TYPES = frozenset(
    {
        "string",
        "text",
        "varchar",
        "smallint",
        "integer",
        "bigint",
        "float",
        "decimal",
        "bool",
        "json",
        "binary",
        "date",
        "timestamp",
        "time",
        "uuid",
        "enum",
        "array",
    }
)
_INT_RANGES = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def _type_error(kind: str, value: Any) -> ValidationError:
    return ValidationError(f"expected a {kind} value, got {type(value).__name__} {brief(value)}")


def _text(max_chars: int | None, reject_nul: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, str):
            raise _type_error("str", value)
        unicode_text(value)
        if max_chars is not None and len(value) > max_chars:
            raise ValidationError(
                f"{len(value)} characters is more than the column holds ({max_chars})"
            )
        if reject_nul and "\x00" in value:
            raise ValidationError(
                "PostgreSQL cannot store NUL (\\x00) in text; use a binary column"
            )
        return value

    return encode


def _integer(kind: str) -> Encode:
    low, high = _INT_RANGES[kind]

    def encode(value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error("int", value)
        if not low <= value <= high:
            raise ValidationError(
                f"{brief(value)} is outside the range of a {kind} column ({low}..{high})"
            )
        return value

    return encode


def _canonical(value: Decimal) -> str:
    """Positional text without trailing fractional zeros, so that equal values
    have equal text (2.50 and 2.5 are both "2.5")."""
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _decimal(as_text: bool, digits: tuple[int, int]) -> Encode:
    before, after = digits

    def encode(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = Decimal(value)
        if not isinstance(value, Decimal):
            hint = " (floats are inexact: pass Decimal(str(x)))" if isinstance(value, float) else ""
            raise ValidationError(f"expected a Decimal value, got {type(value).__name__}{hint}")
        if not value.is_finite():
            raise ValidationError(f"{value} cannot be stored: decimals must be finite")
        value = fit_decimal(value, before, after)
        return _canonical(value) if as_text else value

    return encode


def fit_decimal(value: Decimal, before: int, after: int) -> Decimal:
    """``value`` (finite) if it has at most ``before`` digits before the point
    and ``after`` after it, else the same number written with an exponent
    that fits (``0E+1000000`` is 0, ``1.000E-40000`` is 1), else a
    ValidationError. Works on the digits and exponent, so a short text with a
    huge exponent costs no memory: nothing is written out positionally."""
    _, figures, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if exponent >= -after and len(figures) + exponent <= before:
        return value
    if not any(figures):
        return Decimal(0)
    zeros = len(figures) - len(bytes(figures).rstrip(b"\0"))
    integral = len(figures) + exponent  # (trailing zeros do not change it)
    if exponent + zeros < -after:
        raise ValidationError(
            f"{value!s:.40} has more than {after} digits after the point, which this database's "
            "decimal column cannot hold (it would round them)"
        )
    if integral > before:
        raise ValidationError(
            f"{value!s:.40} has {integral} digits before the point; this database's decimal "
            f"column holds at most {before}"
        )
    # Only trailing zeros after the point went over: drop as many as needed.
    drop = -after - exponent
    return Decimal((value.is_signed(), figures[: len(figures) - drop], -after))


def _bool(as_int: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, bool):
            raise _type_error("bool", value)
        return int(value) if as_int else value

    return encode


def _json(reject_nul: bool, max_depth: int) -> Encode:
    def encode(value: Any) -> Any:
        # (Counting the levels the outbox's tagged JSON adds, so that the
        # entry carrying the value is stored whenever the row is.)
        text = json_text(value, max_depth, escapes=True)
        if reject_nul and "\\u0000" in text:
            raise ValidationError("PostgreSQL cannot store NUL (\\u0000) in JSON text")
        return text

    return encode


def _binary(value: Any) -> Any:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise _type_error("bytes", value)
    return bytes(value)


def _float(negative_zero: bool) -> Encode:
    def encode(value: Any) -> Any:
        if isinstance(value, float):
            number = float(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            number = _exact_double(value)
        else:
            hint = " (pass float(x), which rounds it)" if isinstance(value, Decimal) else ""
            raise ValidationError(
                f"expected a float value, got {type(value).__name__} {brief(value)}{hint}"
            )
        if not math.isfinite(number):
            raise ValidationError(
                f"{number!r} cannot be stored: float columns hold finite numbers on every "
                "backend (MySQL has no NaN or infinity, and JSON neither); store NULL instead"
            )
        if not negative_zero and number == 0.0 and math.copysign(1.0, number) < 0:
            raise ValidationError(
                "-0.0 cannot be stored exactly: this database keeps it as 0.0; pass 0.0 "
                "(x + 0.0 turns -0.0 into 0.0)"
            )
        return number

    return encode


def _exact_double(value: int) -> float:
    """``value`` as a float, if a double holds it exactly."""
    try:
        number = float(value)
        exact = int(number) == value
    except OverflowError:
        exact = False
    if not exact:
        raise ValidationError(
            f"{brief(value)} has no exact float (double) value; pass float(x) to round it"
        )
    return number


def _time(as_text: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, time):
            raise _type_error("time", value)
        if value.tzinfo is not None:
            raise ValidationError(
                f"{brief(value, 80)} has a time zone, which a time column does not keep: pass "
                "a naive time (value.replace(tzinfo=None)), or use a timestamp column"
            )
        # (Fixed-width text, so that text order is time order.)
        return value.isoformat(timespec="microseconds") if as_text else value

    return encode


def _time_of_day(value: timedelta) -> time:
    """A MySQL TIME (the driver's timedelta) as a time of day."""
    if not timedelta(0) <= value < timedelta(days=1):
        raise ValueError(f"the database holds {value} in a time column: not a time of day")
    minutes, seconds = divmod(value.seconds, 60)
    return time(minutes // 60, minutes % 60, seconds, value.microseconds)


def _uuid(as_bytes: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, UUID):
            hint = " (pass uuid.UUID(text))" if isinstance(value, str) else ""
            raise ValidationError(
                f"expected a uuid.UUID value, got {type(value).__name__} {brief(value)}{hint}"
            )
        return value.bytes if as_bytes else value

    return encode


def _plain_uuid(value: Any) -> UUID:
    """A driver's UUID (asyncpg's subclass) or 16 bytes as a uuid.UUID."""
    if isinstance(value, UUID):
        return value if type(value) is UUID else UUID(int=value.int)
    return UUID(bytes=bytes(value))


def _enum(declared: EnumType) -> Encode:
    members = {value: value for value in declared.values}

    def encode(value: Any) -> Any:
        if not isinstance(value, str):
            raise _type_error("str", value)
        member = members.get(value)
        if member is None:
            raise ValidationError(f"{brief(value)} is not one of {brief(declared.values, 200)}")
        return member  # (the declared str: a StrEnum member is stored as its value)

    return encode


def _array(element: Encode) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _type_error("list", value)
        items = []
        for index, item in enumerate(value):
            if item is None:
                raise ValidationError(
                    f"item {index} is None: arrays hold no NULLs (a nullable column can hold "
                    "NULL instead of an array)"
                )
            try:
                items.append(element(item))
            except ValidationError as exc:
                raise ValidationError(f"item {index}: {exc}") from None
        return items

    return encode


def _array_items(decode: Decode) -> Decode:
    return lambda value: [None if item is None else decode(item) for item in value]


def _refuse_infinity(value: date, low: date, high: date) -> None:
    if value in (low, high):
        raise ValidationError(
            f"{value.isoformat()} cannot be stored: the driver would write it as infinity"
        )


def _date(as_text: bool, infinity: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, date) or isinstance(value, datetime):
            raise _type_error("date", value)
        if infinity:
            _refuse_infinity(value, date.min, date.max)
        return value.isoformat() if as_text else value

    return encode


def _timestamp(storage: str, naive_as_utc: bool, infinity: bool) -> Encode:
    def encode(value: Any) -> Any:
        if not isinstance(value, datetime):
            raise _type_error("datetime", value)
        if value.tzinfo is not None:
            utc = utc_instant(value)
        elif naive_as_utc:
            utc = value.replace(tzinfo=UTC)
        else:
            raise ValidationError(
                f"naive datetime {value.isoformat()} is ambiguous: pass a timezone-aware "
                "datetime, or connect with naive_datetimes='utc'"
            )
        if storage == "native":
            if infinity:
                _refuse_infinity(utc.replace(tzinfo=None), datetime.min, datetime.max)
            return utc
        if storage == "utc-naive":
            return utc.replace(tzinfo=None)
        if storage == "iso-text":
            return utc.isoformat(timespec="microseconds")
        if utc.microsecond % 1000:
            raise ValidationError(
                f"{value.isoformat()} has sub-millisecond precision, which SQLite's epoch-ms "
                "timestamp storage would lose; round it, or connect with sqlite_timestamps='iso-text'"
            )
        return (utc - _EPOCH) // _MILLISECOND

    return encode


def utc_instant(value: datetime) -> datetime:
    """An aware datetime as the same instant in UTC. A ValidationError where
    there is none: a tzinfo whose ``utcoffset()`` gives None (Python calls
    such a datetime naive, and converting it would take it as local time) or
    no valid offset, or an instant outside datetime's range once in UTC
    (``datetime.max`` at UTC-1)."""
    try:
        offset = value.utcoffset()
    except (TypeError, ValueError) as exc:  # not a timedelta, or not within a day
        raise ValidationError(
            f"the tzinfo of {brief(value, 80)} gives no valid UTC offset: {exc}"
        ) from None
    if offset is None:
        raise ValidationError(
            f"{brief(value, 80)} is naive: its tzinfo's utcoffset() gives None, so which instant "
            "it names is unknown; pass a datetime with a fixed offset or a zoneinfo zone"
        )
    try:
        return (value - offset).replace(tzinfo=UTC)
    except OverflowError:
        raise ValidationError(
            f"{value.isoformat()} is outside the range of datetimes once in UTC (years 1..9999)"
        ) from None


def _decode_timestamp(storage: str) -> Decode | None:
    if storage == "epoch-ms":
        return lambda v: _EPOCH + v * _MILLISECOND
    if storage == "iso-text":
        return datetime.fromisoformat
    return None  # drivers return aware UTC datetimes


class ValueCodec:
    """Encoders and decoders for one dialect's :class:`StorageProfile`."""

    def __init__(self, storage: StorageProfile, *, naive_datetimes: str = "reject") -> None:
        self.storage = storage
        self._naive_as_utc = naive_datetimes == "utc"
        self._encoders: dict[tuple[str, TypeArg], Encode] = {}

    def encoder(self, kind: str, arg: TypeArg = None) -> Encode:
        """Check-and-convert for ``kind`` (``arg``: a varchar's limit, an
        enum's or array's declaration); built once per kind and argument (the
        outbox writer asks per unit)."""
        encode = self._encoders.get((kind, arg))
        if encode is None:
            encode = self._encoders[kind, arg] = self._build_encoder(kind, arg)
        return encode

    def _build_encoder(self, kind: str, arg: TypeArg) -> Encode:
        s = self.storage
        if kind in ("string", "text", "varchar"):
            limit = arg if kind == "varchar" else s.string_max_chars if kind == "string" else None
            assert limit is None or isinstance(limit, int)
            return _text(limit, s.text_rejects_nul)
        if kind in _INT_RANGES:
            return _integer(kind)
        if kind == "enum" and isinstance(arg, EnumType):
            return _enum(arg)
        if kind == "array" and isinstance(arg, ArrayType):
            if not s.arrays:
                raise ValidationError(
                    "array columns need a database with arrays (PostgreSQL); use a json "
                    "column on this one"
                )
            return _array(self.encoder(arg.element, arg.element_arg))
        factories: dict[str, Callable[[], Encode]] = {
            "decimal": lambda: _decimal(s.decimal == "text", s.decimal_digits),
            "bool": lambda: _bool(s.bool == "int"),
            "json": lambda: _json(s.text_rejects_nul, s.json_max_depth),
            "binary": lambda: _binary,
            "float": lambda: _float(s.float_negative_zero),
            "time": lambda: _time(s.time == "text"),
            "uuid": lambda: _uuid(s.uuid == "bytes"),
            "date": lambda: _date(s.date == "text", s.extreme_dates_are_infinity),
            "timestamp": lambda: _timestamp(
                s.timestamp, self._naive_as_utc, s.extreme_dates_are_infinity
            ),
        }
        if kind not in factories:
            raise ValidationError(f"unknown column type {kind!r} (or no argument for it)")
        return factories[kind]()

    def decoder(self, kind: str, arg: TypeArg = None) -> Decode | None:
        """Driver value -> Python for ``kind``; None when the driver's value is
        already right. An enum's value is returned as stored, declared or
        not (a value since dropped from the set stays readable)."""
        s = self.storage
        if kind == "float":
            return float  # (SQLite hands back an int written by hand as one)
        if kind == "time":
            return {"native": None, "timedelta": _time_of_day, "text": time.fromisoformat}[s.time]
        if kind == "uuid":
            return _plain_uuid
        if kind == "array" and isinstance(arg, ArrayType):
            element = self.decoder(arg.element, arg.element_arg)
            return None if element is None else _array_items(element)
        if kind == "decimal":
            return Decimal if s.decimal == "text" else None
        if kind == "bool":
            return bool
        if kind == "json":
            return json.loads
        if kind == "binary":
            return bytes
        if kind == "date":
            return date.fromisoformat if s.date == "text" else None
        if kind == "timestamp":
            return _decode_timestamp(s.timestamp)
        return None


def check_value(kind: str, value: Any, arg: TypeArg = None) -> None:
    """Raise ValidationError unless ``value`` suits ``kind`` on every dialect's
    common ground (used for schema defaults)."""
    ValueCodec(StorageProfile(), naive_datetimes="reject").encoder(kind, arg)(value)


def read_back(kind: str, arg: TypeArg, value: Any) -> Any:
    """``value``, accepted by the encoder of ``kind``, as a read gives it back
    (what an outbox entry's payload carries): an int given for a decimal as
    a Decimal, for a float as a float; a naive datetime accepted as UTC as
    an aware one; bytes-like values as bytes; a str subclass (a StrEnum
    member) as its str; an array given as a tuple as a list, its items alike."""
    if kind == "array" and isinstance(arg, ArrayType):
        return [read_back(arg.element, arg.element_arg, item) for item in value]
    convert = _READ_BACK.get(kind)
    return value if convert is None else convert(value)


# What a caller can still change after queueing a write: the values of
# json, array and binary columns.
MUTABLE = (dict, list, bytearray, memoryview)
# The kinds whose values can be MUTABLE.
MUTABLE_KINDS = frozenset({"json", "array", "binary"})


def as_queued(value: Any) -> Any:
    """``value`` as it is now: a copy of a dict, list or bytearray (bytes
    for the bytes-like), which the caller can change after queueing the
    write that stored it. The outbox entry, written at commit, must
    describe what the write stored, not what the value has become.

    Only the containers are copied: what they hold passed the codec, so it
    is a value that cannot change (a str, a number, a datetime, ...), and
    is shared as it is — ``copy.deepcopy`` would rebuild it, which fails for
    a valid value of a class it cannot remake (a datetime whose tzinfo's
    constructor takes arguments)."""
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {key: as_queued(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_queued(item) for item in value]
    if type(value) is tuple:  # (which may hold a list)
        return tuple(as_queued(item) for item in value)
    return value


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


_READ_BACK: dict[str, Callable[[Any], Any]] = {
    **dict.fromkeys(("string", "text", "varchar", "enum"), str.__str__),
    "decimal": lambda value: Decimal(value) if isinstance(value, int) else value,
    "float": float,
    "timestamp": _aware,
    "binary": bytes,
    "uuid": _plain_uuid,
}


def as_utc(value: Any) -> datetime:
    """A database's idea of "now" (aware datetime, naive UTC datetime or ISO
    text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise TypeError(f"expected a timestamp, got {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utc_now() -> datetime:
    """The current time for timestamps aiofragno writes itself, at millisecond
    precision (what every storage profile keeps exactly)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
