"""Server-side prepared statements on asyncmy: MySQL's binary protocol for
statements with parameters.

A statement with parameters is prepared once per connection (COM_STMT_PREPARE,
one round trip at its first run there) and then run by COM_STMT_EXECUTE with
its values sent as binary parameters: nothing of a value is ever SQL text, and
the driver neither escapes values nor parses result rows from text (a
one-row read costs about a fifth fewer client instructions than the text
protocol, ``python -m benchmarks.unit_instructions --backend mysql``).

Each value keeps the meaning its text literal has (see ``asyncmy._bind``,
which still writes the statements this protocol cannot take): text, bytes,
integers, booleans, NULL, floats and decimals go as their binary types, and
dates, times and intervals as the same text their literals hold. What the
literal writer refuses (a float or decimal that is not finite, a type it
does not know) is refused here with the same error; an integer beyond 64 bits,
which has no binary form, sends its statement as text.

A prepared statement keeps how it was parsed: under the sql_mode, character
set and default database of the moment it was prepared. A connection on
which a statement may have changed one of them (:data:`changes_parsing`)
sends everything as text until its reset.

A text the server will not prepare (several statements, a placeholder where
the grammar wants a literal, a command the protocol lacks) runs as text,
and on that connection from then on. COM_RESET_CONNECTION drops a
connection's prepared statements, so :meth:`Prepared.forget` must follow it.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Final

import asyncmy.errors
from asyncmy.connection import Connection as RawConnection
from asyncmy.converters import escape_date, escape_datetime, escape_time, escape_timedelta

from ..driver import TextMemo
from ..errors import ValidationError

# asyncmy's with Connection.prepare (0.2.18 has it); others run text only.
SUPPORTED: Final = hasattr(RawConnection, "prepare")
# Statements kept per connection (the server's max_prepared_stmt_count,
# 16,382 by default, is shared by every connection), and texts known to go
# as text.
MAX_STATEMENTS: Final = 256
MAX_TEXT_ONLY: Final = 1024
# The server's errors for a text the protocol cannot take as it is: a parse
# error (several statements; a placeholder where a literal must be), a
# command without prepared form, too many prepared statements on the server.
_TEXT_ONLY_ERRORS: Final = frozenset({1064, 1295, 1461})
_PLACEHOLDER: Final = re.compile(r"%[s%]")
# What changes how later statements are parsed: USE, a SET of the sql_mode
# or of a character set or collation (SET NAMES, SET CHARACTER SET, ...),
# or what may hide one (an executable comment, a second statement).
_PARSING: Final = re.compile(
    r"\A\s*(?:use\b|set\b.*?\b(?:sql_mode|names|char(?:acter|set)|collation))|/\*m?!|;\s*\S",
    re.DOTALL,
)
# Whether a statement (lower-cased or not) may change how later ones parse.
changes_parsing: Final = TextMemo(lambda sql: _PARSING.search(sql.lower()) is not None)
_INT64: Final = range(-(2**63), 2**64)


class Prepared:
    """One connection's prepared statements, by statement text (in the
    compiler's ``%s`` style), and the texts that go as text there.
    ``paused`` (set by the connection once a statement may have changed the
    session, cleared by :meth:`forget` at its reset): every statement goes
    as text meanwhile, parsed in the session as it is then."""

    __slots__ = ("_raw", "_text_only", "paused", "statements")

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.statements: dict[str, Any] = {}
        self._text_only: set[str] = set()
        self.paused = False

    async def prepare(self, sql: str, count: int) -> Any | None:
        """``sql`` prepared on the connection, or None where it must go as
        text. Only the server's refusal of the text is caught: a lost
        connection raises as the text protocol would."""
        if not SUPPORTED or sql in self._text_only:
            return None
        try:
            statement = await self._raw.prepare(_PLACEHOLDER.sub(_qmark, sql))
        except asyncmy.errors.MySQLError as exc:
            code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
            if not 1000 <= code < 2000 and code < 3000:  # (2xxx: the client's own)
                raise
            if code in _TEXT_ONLY_ERRORS:
                self._note_text_only(sql)
            # (Any other error, the text protocol reports as it always has.)
            return None
        if statement.parameter_count != count:  # a "?" of the text's own
            await statement.close()
            self._note_text_only(sql)
            return None
        statements = self.statements
        if len(statements) >= MAX_STATEMENTS:
            await statements.pop(next(iter(statements))).close()
        statements[sql] = statement
        return statement

    def forget(self) -> None:
        """After COM_RESET_CONNECTION: the server has dropped every statement,
        and the session is as it was after connect."""
        self.statements.clear()
        self.paused = False

    def _note_text_only(self, sql: str) -> None:
        if len(self._text_only) >= MAX_TEXT_ONLY:
            self._text_only.clear()
        self._text_only.add(sql)


def _qmark(match: re.Match[str]) -> str:
    return "?" if match[0] == "%s" else "%"


class GoesAsText(Exception):
    """A value without a binary form of its literal's meaning."""


def binary_values(parameters: Sequence[Any]) -> Sequence[Any]:
    """``parameters`` as binary parameters that mean what their literals
    mean; :class:`GoesAsText` for one that has no such form (an integer
    beyond 64 bits), :class:`ValidationError` for one the literal writer
    refuses."""
    values = parameters
    for i, value in enumerate(parameters):
        kind = type(value)
        # (The usual types in a line, without a call.)
        if kind is str or kind is NoneType or kind is bool or kind is bytes:
            continue
        if kind is int:
            if value in _INT64:
                continue
            raise GoesAsText
        if kind is float and value - value == 0.0:  # (finite)
            continue
        if values is parameters:
            values = list(parameters)
        values[i] = _binary_value(value)  # type: ignore[index]
    return values


NoneType = type(None)


def _finite_float(value: float) -> float:
    if not math.isfinite(value):
        raise ValidationError(f"MySQL has no {value!r}; store a finite number or NULL")
    return float(value)


def _finite_decimal(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise ValidationError(f"MySQL has no Decimal {value}; store a finite number or NULL")
    return value


def _integer(value: int) -> int:
    value = int.__int__(value)
    if value not in _INT64:
        raise GoesAsText
    return value


def _unquoted(escape: Callable[[Any], str]) -> Callable[[Any], str]:
    # (The literal's text without its quotes: the same characters.)
    return lambda value: escape(value)[1:-1]


# For each type the literal writer knows, subclasses included (the base's
# value, whatever the subclass overrides; datetime before date).
_BASES: Final[tuple[tuple[type, Callable[[Any], Any]], ...]] = (
    (str, str.__str__),
    (int, _integer),
    (float, _finite_float),
    (Decimal, _finite_decimal),
    (bytes, bytes),
    (bytearray, bytes),
    (memoryview, bytes),
    (datetime, _unquoted(escape_datetime)),
    (date, _unquoted(escape_date)),
    (time, _unquoted(escape_time)),
    (timedelta, _unquoted(escape_timedelta)),
)


def _binary_value(value: Any) -> Any:
    for base, convert in _BASES:
        if isinstance(value, base):
            return convert(value)
    raise ValidationError(
        f"cannot bind a {type(value).__name__} value on MySQL; convert it "
        "(for example str(value)) before passing it"
    )


_FLOAT32: Final = struct.Struct("f")


def float32(value: float) -> float:
    """A FLOAT column's value, sent by the binary protocol as the stored
    single-precision number (0.1 comes as 0.10000000149011612): the shortest
    decimal that is that same number, the value the row was written with."""
    stored = _FLOAT32.pack(value)
    for digits in range(6, 10):
        shortest = float(format(value, f".{digits}g"))
        if _FLOAT32.pack(shortest) == stored:
            return shortest
    return value
