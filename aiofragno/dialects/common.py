"""Pieces several dialects share."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..driver import ISOLATION_LEVELS, IsolationLevel
from ..errors import ValidationError
from ..sql import Json, json_text


def json_param(value: Any) -> str:
    """A dict or :class:`Json` value as JSON text (what every driver binds)."""
    return json_text(value.value if isinstance(value, Json) else value)


def utc_naive(value: datetime) -> datetime:
    """An aware datetime as naive UTC, for columns without a time zone; naive
    ones pass unchanged."""
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def isolation_sql(isolation: IsolationLevel) -> str:
    if isolation not in ISOLATION_LEVELS:
        raise ValidationError(f"unknown isolation level {isolation!r}")
    return isolation.upper()
