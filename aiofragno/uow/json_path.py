"""Conditions on a value inside a json column: ``af.c.meta["k"]["k2"] == "v"``,
``af.c.meta["tags"][0] == 3``.

The comparison is exact by JSON type and value, on every backend: the string
``"1"``, the number ``1`` and ``true`` are three different values. A path
that is not there (a missing key, an index past the end, a key asked of an
array) matches nothing. The path travels as a bound parameter (JSON path
text, ``$."k"."k2"[0]``), never as SQL text: a key may hold dots, quotes
(``'``) or spaces, but not ``"`` or ``\\``, which the databases' path
languages escape differently (or not at all: SQLite), nor control
characters.
"""

from __future__ import annotations

import functools
import string
from typing import Any

from ..brief import brief
from ..errors import ValidationError
from .compiling import Compiling
from .expr import Expr

_UNADDRESSABLE = frozenset('"\\') | frozenset(map(chr, range(32)))


class JsonPath:
    """A value inside json column ``column`` at ``path`` (keys and indexes):
    made by ``af.c.<column>[key]``; index it further, compare it with ``==``."""

    __slots__ = ("column", "path")

    def __init__(self, column: str, path: tuple[str | int, ...]) -> None:
        self.column, self.path = column, path

    def __getitem__(self, key: str | int) -> JsonPath:
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise ValidationError(
                f"{self.column}[...] takes a key (str) or an array index (int), got {brief(key)}"
            )
        if isinstance(key, int) and key < 0:
            raise ValidationError(f"{self.column}[{key}]: array indexes count from 0")
        if isinstance(key, str) and not _UNADDRESSABLE.isdisjoint(key):
            raise ValidationError(
                f"{self.column}[{key!r}]: a JSON key holding a double quote, a backslash or "
                "a control character cannot be addressed on every database"
            )
        if isinstance(key, str) and not _is_unicode(key):
            raise ValidationError(
                f"{self.column}[{key!r}]: a JSON key with a lone surrogate is not Unicode "
                "text, and no stored document has it"
            )
        return JsonPath(self.column, (*self.path, key))

    def __eq__(self, value: Any) -> Expr:  # type: ignore[override]
        if isinstance(value, float):
            raise ValidationError(
                f"{self._name()} == {value!r}: floats compare inexactly; compare ints, str or bool"
            )
        if value is None or not isinstance(value, str | int):
            raise ValidationError(
                f"{self._name()} == ...: compare with a str, int or bool, got {brief(value)}"
            )
        return _JsonEquals(self.column, self.path, value)

    def __ne__(self, value: Any) -> Expr:  # type: ignore[override]
        raise ValidationError(
            f"{self._name()} != ...: write ~({self._name()} == value), which also leaves out "
            "rows where the path is missing"
        )

    __hash__ = None  # type: ignore[assignment]
    # (Not iterable: with __getitem__, iter() would count up indexes forever.)
    __iter__ = None

    def _name(self) -> str:
        return self.column + "".join(f"[{key!r}]" for key in self.path)


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def path_text(path: tuple[str | int, ...]) -> str:
    """The JSON path text of ``path``: ``$."key"[0]`` (every key quoted)."""
    return "$" + "".join(f"[{key}]" if isinstance(key, int) else f'."{key}"' for key in path)


class _JsonEquals(Expr):
    __slots__ = ("column", "path", "value")

    def __init__(self, column: str, path: tuple[str | int, ...], value: Any) -> None:
        self.column, self.path, self.value = column, path, value

    def shape(self) -> Any:
        return ("json=", self.column)

    def render(self, ctx: Compiling) -> None:
        table = ctx.table
        info = table.column(self.column)
        if info.kind != "json":
            raise ValidationError(
                f"{table.name}.{self.column} is a {info.kind} column: [...] paths need a json column"
            )
        template = ctx.catalog.adapter.sql.json_path_equals
        if template is None:
            raise ValidationError("this database has no JSON path conditions")
        try:
            json = info.encode(self.value)  # (its JSON text, checked as a stored value is)
        except ValidationError as exc:
            raise ValidationError(f"{table.name}.{self.column}: {exc}") from None
        holes = {"column": info.qualified}
        values = {"path": path_text(self.path), "json": json}
        for literal, hole in _parsed(template):
            ctx.text(literal)
            if hole in holes:
                ctx.text(holes[hole])
            elif hole is not None:
                ctx.raw_value(values[hole])


@functools.cache
def _parsed(template: str) -> tuple[tuple[str, str | None], ...]:
    """A dialect's template as (text, hole) pairs, in order."""
    return tuple((text, hole) for text, hole, _, _ in string.Formatter().parse(template))
