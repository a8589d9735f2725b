"""Pieces several dialects share."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from ..codec import fit_decimal, utc_instant
from ..driver import IsolationLevel, TextMemo
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


def uuid_bytes(value: UUID) -> bytes:
    """A raw ``uuid.UUID`` parameter as the 16 bytes a uuid column holds where
    the database has no uuid type."""
    return value.bytes


def isolation_sql(isolation: IsolationLevel) -> str:
    # (A known level: Database checks the user's value where it enters.)
    return isolation.upper()


# Statements that only read, write or change the schema, by their first word
# (``rollback to`` a savepoint ends nothing but the savepoint).
PLAIN_STATEMENTS = (
    "select|insert|update|delete|with|values|explain|create|drop|alter|truncate"
    "|grant|revoke|analyze|savepoint|release|rollback\\s+to"
)
# CREATE / DROP of a temporary object: "temp" starting a word before any "("
# (so also a table named "tempdata": a needless reset, never a missed one).
TEMPORARY_OBJECTS = r"\A\s*(?:create|drop)\b[^(;]*?\btemp"


class SessionChanges(TextMemo[bool]):
    """:attr:`DialectAdapter.session_changes
    <aiofragno.driver.DialectAdapter.session_changes>` for one dialect: called
    with a statement's text, True when its first word is not one of
    :data:`PLAIN_STATEMENTS` or ``plain`` (alternations of lower-case
    keywords; a leading comment counts as another word), or when it
    contains one of ``markers`` (lower-case patterns of functions and
    clauses that change the session from inside a plain statement) or
    creates or drops a temporary object.

    A dictionary look-up for a short text seen before (raw statements
    repeat), a couple of microseconds for a new one: the text is lowered
    once, and each marker is a pattern of its own starting with literal
    text, which the regex engine finds with a fast scan (one alternation of
    them all takes ten times as long)."""

    def __init__(self, plain: str, markers: tuple[str, ...] = ()) -> None:
        super().__init__(self._classify)
        self._plain = re.compile(rf"\s*(?:{PLAIN_STATEMENTS}|{plain})\b")
        self._markers = tuple(re.compile(m) for m in (TEMPORARY_OBJECTS, *markers))

    # ``session_changes(sql)`` is the memo's look-up itself: it runs for
    # every statement, and this way costs no Python call.
    __call__ = TextMemo.__getitem__

    def _classify(self, sql: str) -> bool:
        text = sql.lower()
        if self._plain.match(text) is None:
            return True
        return any(marker.search(text) is not None for marker in self._markers)
