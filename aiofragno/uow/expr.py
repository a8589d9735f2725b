"""Where-expressions: ``af.c.owner == "alice"``, ``af.c.balance.in_([1, 2])``,
combined with ``&``, ``|`` and ``~``.

An expression compiles against one table: column names are checked, values
go through the column's encoder (so wrong types fail before any SQL runs), and
the SQL text depends only on the expression's *shape*, so it is cached.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..brief import brief
from ..errors import ValidationError
from .compiling import Compiling, bind

if TYPE_CHECKING:
    from .json_path import JsonPath


class Expr(ABC):
    """A condition. Combine with ``&`` (and), ``|`` (or), ``~`` (not)."""

    __slots__ = ()

    def __and__(self, other: Expr) -> Expr:
        return _Bool("AND", (self, _expr(other)))

    def __or__(self, other: Expr) -> Expr:
        return _Bool("OR", (self, _expr(other)))

    def __invert__(self) -> Expr:
        return _Not(self)

    def __bool__(self) -> bool:
        raise ValidationError("use & | ~ to combine conditions, not and/or/not")

    @abstractmethod
    def shape(self) -> Any:
        """What the SQL text depends on (operators, columns), without values."""

    @abstractmethod
    def render(self, ctx: Compiling) -> None:
        """Emit this condition's SQL text and parameters into ``ctx``."""


def _expr(value: Any) -> Expr:
    if not isinstance(value, Expr):
        raise ValidationError(f"expected a condition built from af.c, got {brief(value)}")
    return value


class Col:
    """A column in a condition: made by ``af.c.<name>`` or ``af.c["name"]``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise ValidationError(f"af.c[...] takes a column name (str), got {brief(name)}")
        self.name = name

    def _compare(self, op: str, value: Any) -> Expr:
        if value is None:
            raise ValidationError(f"compare {self.name} with None using .is_null(), not {op}")
        return _Compare(self.name, op, value)

    def __eq__(self, value: Any) -> Expr:  # type: ignore[override]
        return self._compare("=", value)

    def __ne__(self, value: Any) -> Expr:  # type: ignore[override]
        return self._compare("<>", value)

    def __lt__(self, value: Any) -> Expr:
        return self._compare("<", value)

    def __le__(self, value: Any) -> Expr:
        return self._compare("<=", value)

    def __gt__(self, value: Any) -> Expr:
        return self._compare(">", value)

    def __ge__(self, value: Any) -> Expr:
        return self._compare(">=", value)

    __hash__ = None  # type: ignore[assignment]
    # (Not iterable: with __getitem__, iter() would count up indexes forever.)
    __iter__ = None

    def in_(self, values: Iterable[Any]) -> Expr:
        """The column is one of ``values`` (none: no row matches)."""
        if isinstance(values, str | bytes):
            raise ValidationError(f"{self.name}.in_() takes a collection of values, not a string")
        return _In(self.name, tuple(values))

    def not_in_(self, values: Iterable[Any]) -> Expr:
        """``~column.in_(values)``: the column is none of ``values``. A NULL
        column matches neither (SQL's NOT IN), except with no values, where
        every row matches."""
        return ~self.in_(values)

    def __getitem__(self, key: str | int) -> JsonPath:
        """The value at ``key`` (or array index) inside this json column."""
        from .json_path import JsonPath  # (json_path builds on this module)

        return JsonPath(self.name, ())[key]

    def is_null(self) -> Expr:
        return _IsNull(self.name)

    def starts_with(self, prefix: str) -> Expr:
        if not isinstance(prefix, str):
            raise ValidationError(
                f"{self.name}.starts_with() takes a str, got {type(prefix).__name__}"
            )
        return _StartsWith(self.name, prefix, False)

    def istarts_with(self, prefix: str) -> Expr:
        """Begins with ``prefix``, ignoring case: both lowered (Unicode case
        mapping: the database's LOWER(), on PostgreSQL under its LC_CTYPE;
        Python's str.lower on SQLite, whose own folds ASCII only)."""
        if not isinstance(prefix, str):
            raise ValidationError(
                f"{self.name}.istarts_with() takes a str, got {type(prefix).__name__}"
            )
        return _StartsWith(self.name, prefix, True)


class _Columns:
    def __getattr__(self, name: str) -> Col:
        if name.startswith("__"):
            raise AttributeError(name)
        return Col(name)

    def __getitem__(self, name: str) -> Col:
        return Col(name)


c = _Columns()
"""``af.c.<column>`` starts a condition on a column."""


class _Compare(Expr):
    __slots__ = ("column", "op", "value")

    def __init__(self, column: str, op: str, value: Any) -> None:
        self.column, self.op, self.value = column, op, value

    def shape(self) -> Any:
        return ("cmp", self.column, self.op)

    def render(self, ctx: Compiling) -> None:
        if self.op not in ("=", "<>"):
            ctx.table.check_orderable(self.column)
        if ctx.build_text:
            ctx.text(f"{ctx.column(self.column)} {self.op} ")
        ctx.value(self.column, self.value)


class _In(Expr):
    __slots__ = ("column", "values")

    def __init__(self, column: str, values: tuple[Any, ...]) -> None:
        self.column, self.values = column, values

    def shape(self) -> Any:
        return ("in", self.column, len(self.values))

    def render(self, ctx: Compiling) -> None:
        if not self.values:
            ctx.text("1 = 0")
            return
        ctx.text(f"{ctx.column(self.column)} IN (")
        for i, value in enumerate(self.values):
            if i:
                ctx.text(", ")
            ctx.value(self.column, value)
        ctx.text(")")


class _IsNull(Expr):
    __slots__ = ("column",)

    def __init__(self, column: str) -> None:
        self.column = column

    def shape(self) -> Any:
        return ("null", self.column)

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"{ctx.column(self.column)} IS NULL")


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return escaped + "%"


class _StartsWith(Expr):
    __slots__ = ("column", "fold", "prefix")

    def __init__(self, column: str, prefix: str, fold: bool) -> None:
        self.column, self.prefix, self.fold = column, prefix, fold

    def shape(self) -> Any:
        return ("prefix", self.column, self.fold)

    def render(self, ctx: Compiling) -> None:
        # The prefix is checked as a value of the column is (lone surrogates,
        # NUL where the database cannot store it, a varchar's length): what
        # no stored value can start with is refused, as == refuses it.
        ctx.check_text_column(self.column, "istarts_with" if self.fold else "starts_with")
        bind(ctx.table, ctx.table.column(self.column), self.prefix)
        if not self.fold:
            ctx.text(f"{ctx.column(self.column)} LIKE ")
            ctx.raw_value(_like_prefix(self.prefix))
        else:  # (both sides lowered by the same function; ! % _ have no case)
            lower = ctx.catalog.adapter.sql.lower
            before, after = lower.split("{x}")
            ctx.text(f"{lower.format(x=ctx.column(self.column))} LIKE {before}")
            ctx.raw_value(_like_prefix(self.prefix))
            ctx.text(after)
        ctx.text(" ESCAPE '!'")


class _Bool(Expr):
    __slots__ = ("op", "parts")

    def __init__(self, op: str, parts: tuple[Expr, ...]) -> None:
        self.op, self.parts = op, parts

    def shape(self) -> Any:
        return (self.op, tuple(p.shape() for p in self.parts))

    def render(self, ctx: Compiling) -> None:
        ctx.text("(")
        for i, part in enumerate(self.parts):
            if i:
                ctx.text(f" {self.op} ")
            part.render(ctx)
        ctx.text(")")


class _Not(Expr):
    __slots__ = ("part",)

    def __init__(self, part: Expr) -> None:
        self.part = part

    def shape(self) -> Any:
        return ("not", self.part.shape())

    def render(self, ctx: Compiling) -> None:
        ctx.text("NOT ")
        self.part.render(ctx)


def where_expr(where: Expr | Mapping[str, Any] | None) -> Expr | None:
    """Normalize ``where``: a dict means column == value for each item, AND-ed
    (a None value means IS NULL)."""
    if where is None:
        return None
    if type(where) is not dict:  # (a plain dict, the common case, skips two ABC checks)
        if isinstance(where, Expr):
            return where
        if not isinstance(where, Mapping):
            raise ValidationError(
                f"where must be a dict or an af.c condition, got {type(where).__name__}"
            )
    parts: list[Expr] = [
        _IsNull(name) if value is None else _Compare(name, "=", value)
        for name, value in equalities(where).items()
    ]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else _Bool("AND", tuple(parts))


def fixed_columns(where: Expr | None) -> frozenset[str]:
    """The columns ``where`` holds equal to one value in every row it
    matches: those compared with ``=`` in it, or in a part of its top-level
    AND."""
    if isinstance(where, _Compare):
        return frozenset((where.column,)) if where.op == "=" else frozenset()
    if isinstance(where, _Bool) and where.op == "AND":
        return frozenset().union(*map(fixed_columns, where.parts))
    return frozenset()


def equalities(where: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a dict ``where`` (column -> value), its keys checked."""
    for name in where:
        if not isinstance(name, str):
            raise ValidationError(f"where keys must be column names, got {brief(name)}")
    return dict(where)
