"""Pieces several dialects share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..codec import fit_decimal, utc_instant
from ..driver import ISOLATION_LEVELS, IsolationLevel
from ..errors import ValidationError
from ..sql import Json, json_text


def json_param(value: Any) -> str:
    """A dict or :class:`Json` value as JSON text (what every driver binds)."""
    return json_text(value.value if isinstance(value, Json) else value)


def utc_naive(value: datetime) -> datetime:
    """An aware datetime as naive UTC, for columns without a time zone; naive
    ones pass unchanged. (What has no UTC instant: see :func:`utc_instant`.)"""
    if value.tzinfo is None:
        return value
    return utc_instant(value).replace(tzinfo=None)


def decimal_param(before: int, after: int, *, special: bool) -> Callable[[Decimal], Decimal]:
    """How a raw ``Decimal`` parameter is checked where the database's numeric
    type holds at most ``before`` digits before the point and ``after`` after
    it (see :func:`fit_decimal`: nothing is written out first, so a short
    value with a huge exponent cannot grow into megabytes of text). NaN and
    infinities pass only where the type holds them (``special``); a
    signalling NaN nowhere (it would be stored as a quiet one)."""

    def encode(value: Decimal) -> Decimal:
        if value.is_finite():
            return fit_decimal(value, before, after)
        if special and not value.is_snan():
            return value
        raise ValidationError(f"Decimal('{value}') cannot be stored exactly by this database")

    return encode


def isolation_sql(isolation: IsolationLevel) -> str:
    if isolation not in ISOLATION_LEVELS:
        raise ValidationError(f"unknown isolation level {isolation!r}")
    return isolation.upper()
