"""Aggregates in the unit of work: ``uow.aggregate(table, {"total":
af.fn.sum("balance"), "n": af.fn.count()}, where=..., group_by=[...])``.

Results are exact and the same on every backend: a count is an int; a sum
of integers an int (never a float or a Decimal, and never an overflow: on
SQLite, whose SUM fails past 64 bits, the reads then run again with the
sum as two 32-bit halves); a sum of decimals a Decimal;
min and max a value of the column's type, decoded as in a row; an average
a Decimal, computed from the exact sum and count. (Decimals stored as text,
on SQLite, are aggregated by functions the dialect provides:
:mod:`aiofragno.backends.sqlite_functions`.) Over no rows (or only
NULLs) every aggregate but count is None. Groups come back ordered by
their values as Python orders them (None last), not by a collation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Any, NamedTuple, cast

from ..brief import brief
from ..driver import CompiledQuery
from ..errors import ValidationError
from ..schema import EXTERNAL_ID, INTERNAL_ID, RowId
from .catalog import Catalog, ColumnInfo, TableInfo
from .compiling import Compiling
from .expr import Expr, where_expr
from .ops import ResultT, RetrievalOp, compile_cached

# An average: the sum over the count, to 28 significant digits (Python's
# default precision), whatever the caller's decimal context says.
AVG_CONTEXT = Context(prec=28, rounding=ROUND_HALF_EVEN)

_NUMBERS = frozenset({"smallint", "integer", "bigint", "decimal"})
# (Not float: SQLite keeps its exact bits as a blob, which orders as bytes.)
_ORDERED = _NUMBERS | {"string", "text", "varchar", "date", "time", "timestamp"}
_FUNCTIONS = frozenset({"count", "sum", "avg", "min", "max"})
_KINDS = {"sum": _NUMBERS, "avg": _NUMBERS, "min": _ORDERED, "max": _ORDERED}


class AggregateFn(NamedTuple):
    """One aggregate asked for: made by ``af.fn.count()``, ``af.fn.sum(column)``, ...
    (A tuple: it keys the caches of plans and SQL text, and a tuple hashes fast.)"""

    function: str  # count, sum, avg, min, max
    column: str | None  # None: count(*)


def _column_name(function: str, column: Any) -> str:
    if not isinstance(column, str):
        raise ValidationError(f"af.fn.{function}() takes a column name, got {brief(column)}")
    return column


class _Functions:
    """``af.fn``: the aggregates :meth:`UnitOfWork.aggregate` computes."""

    def count(self, column: str | None = None) -> AggregateFn:
        """The number of rows; with ``column``, of rows where it is not NULL."""
        return AggregateFn("count", None if column is None else _column_name("count", column))

    def sum(self, column: str) -> AggregateFn:
        """The exact sum (int for integer columns, Decimal for decimals); None over no rows."""
        return AggregateFn("sum", _column_name("sum", column))

    def avg(self, column: str) -> AggregateFn:
        """The mean as a Decimal (28 significant digits); None over no rows."""
        return AggregateFn("avg", _column_name("avg", column))

    def min(self, column: str) -> AggregateFn:
        """The least value, of the column's type; None over no rows."""
        return AggregateFn("min", _column_name("min", column))

    def max(self, column: str) -> AggregateFn:
        """The greatest value, of the column's type; None over no rows."""
        return AggregateFn("max", _column_name("max", column))


fn = _Functions()
"""``af.fn.sum("balance")`` and friends: the aggregates of ``uow.aggregate``."""

# An aggregate's SQL: its select expressions ({x}: the column), and what
# makes its result of the values they return.
_Finish = Callable[[Sequence[Any]], Any]


def _plan(
    table: TableInfo, catalog: Catalog, agg: AggregateFn, split: bool
) -> tuple[list[str], _Finish]:
    """The select expressions of ``agg`` on ``table`` and its finisher;
    a ValidationError for a column it cannot aggregate exactly. ``split``:
    an integer sum as its two halves (see _expressions)."""
    if agg.column is None:
        return ["COUNT(*)"], lambda v: int(v[0])
    info = table.column(agg.column)
    x = info.qualified
    if agg.function == "count":
        return [f"COUNT({x})"], lambda v: int(v[0])
    _check_kind(table, info, agg.function)
    function = "sum" if agg.function == "avg" else agg.function
    parts = _expressions(table, catalog, info, function, split)
    if agg.function in ("min", "max"):
        decode = catalog.codec.decoder(info.kind)
        if decode is None:
            return parts, lambda v: v[0]
        return parts, lambda v: None if v[0] is None else decode(v[0])
    total = _decimal_total if info.kind == "decimal" else _int_total
    if agg.function == "sum":
        return parts, total
    return [*parts, f"COUNT({x})"], lambda v: _avg(total(v[:-1]), v[-1])


def _expressions(
    table: TableInfo, catalog: Catalog, info: ColumnInfo, function: str, split: bool
) -> list[str]:
    """The select expressions of ``function`` (sum, min or max) of a column:
    one, or an integer sum's two halves where SUM would fail past 64 bits
    (``split``: after it did, or always where the failure is not known)."""
    x = info.qualified
    sql = catalog.adapter.sql
    if info.kind == "decimal" and table.decimal_as_text:
        if sql.text_decimal_aggregate is None:
            raise ValidationError(
                f"{table.name}.{info.name}: decimals are stored as text on this database, "
                f"which cannot {function} them exactly; find() the rows and aggregate the "
                "Decimal values in Python"
            )
        return [sql.text_decimal_aggregate.format(function=function, x=x)]
    halves = sql.int_sum_halves
    integer_sum = function == "sum" and info.kind != "decimal"
    if integer_sum and halves is not None and (split or sql.int_sum_overflow is None):
        return [half.format(x=x) for half in halves]
    return [f"{function.upper()}({x})"]


def _check_kind(table: TableInfo, info: ColumnInfo, function: str) -> None:
    if info.kind not in _KINDS[function]:
        what = "numbers (integer, bigint, decimal)" if function in ("sum", "avg") else "values"
        raise ValidationError(
            f"{table.name}.{info.name} is a {info.kind} column: af.fn.{function}() takes a "
            f"column of ordered {what}, not {info.kind}"
        )


def _int_total(values: Sequence[Any]) -> int | None:
    """An integer sum from its one value, or its two halves (see _sum)."""
    if values[0] is None:
        return None
    if len(values) == 1:
        return int(values[0])
    high, low = values
    return int(high) * 2**32 + int(low)


def _decimal_total(values: Sequence[Any]) -> Decimal | None:
    return None if values[0] is None else Decimal(values[0])


def _avg(total: Any, count: Any) -> Decimal | None:
    if total is None or not count:
        return None
    return AVG_CONTEXT.divide(Decimal(total), Decimal(int(count)))


class _Plan:
    """What an aggregate's statement selects, from where, and how its rows
    become the result: built once per table and shape (names, aggregates,
    group_by), its columns checked then."""

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        names: tuple[str, ...],
        aggregates: tuple[AggregateFn, ...],
        group_by: tuple[str, ...],
        split: bool,
    ) -> None:
        quote = catalog.compiler.quote_identifier
        columns: list[str] = []
        joins: list[str] = []
        # Per group column: name, position, decoder, position of a reference's external id.
        self.groups: list[tuple[str, int, Callable[[Any], Any] | None, int | None, Any]] = []
        for name in group_by:
            info = table.columns[name]
            position, ref_position = len(columns), None
            columns.append(info.qualified)
            if info.target is not None:
                alias = f"r{len(joins) + 1}"
                joins.append(
                    f" LEFT JOIN {catalog.sql_name(info.target)} {alias} "
                    f"ON {alias}.{quote(INTERNAL_ID)} = {info.qualified}"
                )
                ref_position = len(columns)
                columns.append(f"{alias}.{quote(EXTERNAL_ID)}")
            decode = catalog.codec.decoder(info.kind)
            self.groups.append((name, position, decode, ref_position, info.target_identity))
        self.group_columns = ", ".join(columns)
        self.finishers: list[tuple[str, slice, _Finish]] = []
        for alias, agg in zip(names, aggregates, strict=True):
            parts, finish = _plan(table, catalog, agg, split)
            self.finishers.append((alias, slice(len(columns), len(columns) + len(parts)), finish))
            columns.extend(parts)
        self.select_columns = ", ".join(columns)
        self.select_from = f"{table.sql_name} t{''.join(joins)}"


class Aggregate(RetrievalOp[ResultT]):
    """``uow.aggregate(...)``: ``result`` is a dict of the aggregates
    (``Aggregate[dict[str, Any]]``), or, with ``group_by``, a list of such
    dicts, one per group, each with its group's values
    (``Aggregate[list[dict[str, Any]]]``)."""

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        aggregates: Mapping[str, AggregateFn],
        where: Expr | Mapping[str, Any] | None,
        group_by: Any,
    ) -> None:
        super().__init__(table)
        self.group_by = _group_by(table, group_by)
        if not isinstance(aggregates, Mapping):
            raise ValidationError(
                "aggregate() takes a dict of name -> af.fn.<aggregate>(...), got "
                f"{type(aggregates).__name__}"
            )
        if not aggregates and not self.group_by:
            raise ValidationError("aggregate() needs at least one aggregate or a group_by")
        self.names = tuple(aggregates)
        self.aggregates = tuple(aggregates.values())
        self._check_names()
        self.where = where_expr(where)
        self.split = False
        self._use_plan(catalog)

    def _use_plan(self, catalog: Catalog) -> None:
        key = ("aggregate", self.names, self.aggregates, self.group_by, self.split)
        plan = self.table.plans.get(key)
        if plan is None:
            plan = self.table.plans[key] = _Plan(
                catalog, self.table, self.names, self.aggregates, self.group_by, self.split
            )
        self._plan = plan
        self.select_columns = plan.select_columns
        self.select_from = plan.select_from

    def split_sums(self, catalog: Catalog) -> bool:
        """Sum integers as their two halves from now on (SUM failed past 64
        bits); False if that changes nothing here."""
        if self.split:
            return False
        self.split = True
        before = self.select_columns
        self._use_plan(catalog)
        return self.select_columns != before

    def _check_names(self) -> None:
        for name, agg in zip(self.names, self.aggregates, strict=True):
            if not isinstance(name, str):
                raise ValidationError(f"aggregate names are str, got {brief(name)}")
            if not isinstance(agg, AggregateFn) or agg.function not in _FUNCTIONS:
                raise ValidationError(
                    f"aggregate {name!r} is {brief(agg)}: use af.fn.count(), af.fn.sum(column), "
                    "af.fn.avg(column), af.fn.min(column) or af.fn.max(column)"
                )
            if name in self.group_by:
                raise ValidationError(
                    f"aggregate {name!r} has the name of a group_by column; name it otherwise"
                )

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"SELECT {self.select_columns} FROM ")
        self.render_from(ctx)

    def render_from(self, ctx: Compiling) -> None:
        """The read after ``SELECT <select_columns> FROM``."""
        ctx.text(self.select_from)
        if self.where is not None:
            ctx.text(" WHERE ")
            self.where.render(ctx)
        if self._plan.group_columns:
            ctx.text(f" GROUP BY {self._plan.group_columns}")

    def compile(self, catalog: Catalog) -> CompiledQuery:
        shape = (
            "aggregate",
            None if self.where is None else self.where.shape(),
            self.aggregates,
            self.group_by,
            self.split,
        )
        return compile_cached(catalog, self.table, shape, self.render)

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        if not self.group_by:
            self._result = cast(ResultT, self._values(rows[0]))
            return
        groups = [{**self._group(row), **self._values(row)} for row in rows]
        # (Python's order of the decoded values, not the database's
        # collation: the same on every backend.)
        groups.sort(key=lambda g: [(g[n] is None, g[n]) for n in self.group_by])
        self._result = cast(ResultT, groups)

    def _group(self, row: Sequence[Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, position, decode, ref_position, target in self._plan.groups:
            value = row[position]
            if value is None:
                values[name] = None
            elif ref_position is not None:
                values[name] = RowId(row[ref_position], None, value, target)
            else:
                values[name] = value if decode is None else decode(value)
        return values

    def _values(self, row: Sequence[Any]) -> dict[str, Any]:
        return {alias: finish(row[where]) for alias, where, finish in self._plan.finishers}

    def empty(self) -> None:
        if self.group_by:
            self._result = cast(ResultT, [])
        else:
            self._result = cast(
                ResultT,
                {
                    name: 0 if agg.function == "count" else None
                    for name, agg in zip(self.names, self.aggregates, strict=True)
                },
            )


def _group_by(table: TableInfo, group_by: Any) -> tuple[str, ...]:
    """The group_by columns: a name or a list of names; never json or binary,
    which have no equality every backend agrees on."""
    if group_by is None:
        return ()
    names = [group_by] if isinstance(group_by, str) else group_by
    if not isinstance(names, list | tuple):
        raise ValidationError(
            f"group_by takes a column name or a list of them, got {type(group_by).__name__}"
        )
    for name in names:
        info = table.column(name)
        if info.kind in ("json", "binary"):
            raise ValidationError(
                f"{table.name}.{name} is a {info.kind} column, which cannot be grouped by"
            )
    if len(set(names)) != len(names):
        raise ValidationError(f"group_by names a column twice: {brief(names)}")
    return tuple(names)
