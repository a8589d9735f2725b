"""The operations of a unit of work and how each compiles to SQL.

Every operation compiles to parameters (its values checked and encoded) and
SQL text taken from the catalog's cache, keyed by the operation's shape
(table, columns, operators, directions, how references resolve); the text is
rendered only on a cache miss. A read finds its parameters by a walk of its
condition that skips the text; a write's parameters are its values in column
order, checked and bound directly (:func:`_bind_values`), in the order its
render would bind them.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Literal, NoReturn

from typing_extensions import TypeVar

from .. import tagged_json
from ..brief import brief
from ..codec import MUTABLE, as_queued
from ..driver import CompiledQuery, QueryResult
from ..errors import RowNotFound, SchemaError, ValidationError
from ..schema import EXTERNAL_ID, INTERNAL_ID, VERSION, RowId, new_external_id
from ..sqltext import SqlText
from .catalog import Catalog, ColumnInfo, Selection, TableInfo
from .compiling import Compiling, bind, row_id
from .expr import Expr, equalities, fixed_columns, where_expr


class _Missing(Enum):
    NOT_RETRIEVED = 0


ResultT = TypeVar("ResultT", covariant=True)
# A row as the type checker sees it: dict[str, Any], or a table's row type
# (see aiofragno.row_types). At run time, always a dict.
RowT = TypeVar("RowT", default=dict[str, Any])


def compile_cached(
    catalog: Catalog, table: TableInfo, shape: Any, render: Callable[[Compiling], None]
) -> CompiledQuery:
    """``render``'s statement: its parameters from a walk that skips the text,
    the text from the cache (rendered on a miss)."""
    ctx = Compiling(catalog, table, build_text=False)
    render(ctx)
    key = (table.name, shape, tuple(ctx.signature))
    return CompiledQuery(cached_text(catalog, table, key, render), tuple(ctx.params))


def cached_text(
    catalog: Catalog, table: TableInfo, key: Any, render: Callable[[Compiling], None]
) -> str:
    """``render``'s statement as the driver receives it, from the cache
    (rendered on a miss)."""
    text = catalog.sql_cache.get(key)
    if text is None:
        text = catalog.compiler.render(statement_text(catalog, table, render))
        catalog.sql_cache[key] = text
    return text


def statement_text(
    catalog: Catalog, table: TableInfo, render: Callable[[Compiling], None]
) -> SqlText:
    """``render``'s statement text, its placeholders not written yet: what
    statements combined into one are joined from."""
    built = Compiling(catalog, table, build_text=True)
    render(built)
    return built.sql_text()


def _bind_values(
    table: TableInfo, values: dict[str, Any], what: str, *, bind_nulls: bool
) -> tuple[list[Any], tuple[Any, ...], tuple[str, ...]]:
    """Check ``values`` — writable columns, each value of its column's type —
    and bind them: the parameters in order, the way a render walk would bind
    them, without the walk. ``values`` (the operation's own dict) keeps a
    copy of each value the caller could still change (:func:`as_queued`),
    so that its outbox entry describes what was bound. A None is a parameter of its own only with
    ``bind_nulls``; else the text says NULL, which a NOT NULL column refuses.
    Also what the text depends on besides the names, one entry per value
    (None for a NULL; for a reference, whether its row is looked up by
    external id in a subquery; else 0), and the external ids looked up."""
    params: list[Any] = []
    variant: list[Any] = []
    lookups: list[str] = []
    columns = table.columns
    for name, value in values.items():
        info = columns.get(name)
        if info is None or info.column is None:
            _refuse(table, name, what)
        if value is None:
            if bind_nulls:
                params.append(None)
            elif not info.column.nullable:
                raise ValidationError(f"{table.name}.{name} is NOT NULL: cannot set it to None")
            variant.append(None)
            continue
        param, looked_up = _bind_value(table, info, value)
        params.append(param)
        variant.append(looked_up)
        if looked_up:
            lookups.append(param)
        elif isinstance(value, MUTABLE):
            values[name] = as_queued(value)  # (a value changed, not a key added)
    return params, tuple(variant), tuple(lookups)


def _bind_value(table: TableInfo, info: ColumnInfo, value: Any) -> tuple[Any, Literal[0] | bool]:
    """``value``'s parameter in column ``info`` (see :func:`bind`), and what
    the statement's text depends on: 0 for a plain column; for a reference,
    whether its row is looked up by external id in a subquery."""
    param = bind(table, info, value)
    return param, 0 if info.target is None else type(param) is str


def _check_mapping(table: TableInfo, values: Any, what: str) -> None:
    if type(values) is not dict and not isinstance(values, Mapping):
        raise ValidationError(
            f"{what} on {table.name!r} takes a dict of column values, got {type(values).__name__}"
        )


def _refuse(table: TableInfo, name: Any, what: str) -> NoReturn:
    """Raise the error for a value given for ``name``, which is not a column
    that ``what`` can write."""
    if name == EXTERNAL_ID:
        raise ValidationError(f"{table.name}.id is generated by aiofragno and cannot be written")
    if not isinstance(name, str):
        raise ValidationError(f"{what} on {table.name!r}: column names are str, got {brief(name)}")
    table.column(name)  # raises, naming what is wrong
    raise AssertionError(name)


class FindResult(list[RowT]):
    """The rows of a ``find``; ``cursor`` continues after the last one (pass it
    as ``after=``), or is None when there are no more rows."""

    _cursor: str | None = None
    # The position after the page (its last row's order values and internal
    # id, taken when the page was read), encoded as a cursor when first
    # asked for: most pages read are never continued, and the encoding
    # costs more than decoding a row.
    _after: tuple[str, list[Any]] | None = None

    @property
    def cursor(self) -> str | None:
        after = self._after
        if after is not None:
            payload = tagged_json.dumps({"k": after[0], "v": after[1]})
            self._cursor = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
            self._after = None
        return self._cursor

    @cursor.setter
    def cursor(self, cursor: str | None) -> None:
        self._cursor, self._after = cursor, None


class RetrievalOp(ABC, Generic[ResultT]):
    """A queued read. ``result`` is available after ``await uow.retrieve()``."""

    # Its statements are made from its parent's rows, and run after them
    # (see staged_reads): what compile() gives is their template.
    runs_after_parent = False

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self._result: ResultT | _Missing = _Missing.NOT_RETRIEVED

    @property
    def result(self) -> ResultT:
        result = self._result
        if result is _Missing.NOT_RETRIEVED:
            raise ValidationError(
                f"the result of this {type(self).__name__} on {self.table.name!r} is not there yet: "
                "await uow.retrieve() first"
            )
        return result

    @abstractmethod
    def render(self, ctx: Compiling) -> None:
        """Write the read's statement (its text only where ``ctx`` builds it)."""

    @abstractmethod
    def compile(self, catalog: Catalog) -> CompiledQuery:
        """The read's SQL and parameters."""

    @abstractmethod
    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        """Take the read's rows (each a sequence of column values) as ``result``."""

    @abstractmethod
    def empty(self) -> None:
        """The result a dry run gives."""


def _set_columns(equal: dict[str, Any]) -> frozenset[str]:
    """The columns a dict ``where`` holds to one value (not those it asks
    to be NULL, which many rows may be)."""
    return frozenset(name for name, value in equal.items() if value is not None)


def _check_pageable(table: TableInfo, order: tuple[tuple[str, bool], ...]) -> None:
    """Keyset pages need a total order without NULLs."""
    for name, _ in order:
        column = table.columns[name].column
        if column is not None and column.nullable:
            raise ValidationError(
                f"{table.name}.{name} may be NULL, so find(limit=...) cannot page by it "
                "without losing rows; order by a NOT NULL column (or filter out NULLs "
                "and page without this column)"
            )


Order = tuple[tuple[str, bool], ...]


def with_tie(table: TableInfo, order: Order, fixed: frozenset[str] = frozenset()) -> Order:
    """``order`` and then its tie-break: the internal id (creation order), in
    the direction of the order's last column — newest first after a
    descending one. So an index on the order's columns, which holds the
    internal id after them (InnoDB, SQLite) or lets the database sort only
    within equal values (PostgreSQL), serves the whole order read forwards
    or backwards: an ascending tie after ``seq DESC`` made MariaDB and
    SQLite sort every matching row before a LIMIT.

    No tie-break where no two rows can tie: where the order's columns and
    ``fixed`` (those the condition holds to one value) include a unique key
    (:attr:`TableInfo.unique_keys`). A unique index holds no internal id
    after its columns on MariaDB, so an order by them and the id made it
    read and sort every matching row, ignoring the index."""
    names = fixed.union(name for name, _ in order)
    if order and any(key <= names for key in table.unique_keys):
        return order
    return (*order, (INTERNAL_ID, bool(order) and order[-1][1]))


def order_text(table: TableInfo, order: Order, fixed: frozenset[str] = frozenset()) -> str:
    """``ORDER BY``'s terms for ``order`` with its tie-break (:func:`with_tie`)."""
    return order_terms(table, with_tie(table, order, fixed))


def order_terms(table: TableInfo, order: Order) -> str:
    """``ORDER BY``'s terms for ``order`` as it is (its tie-break included)."""
    return ", ".join(
        f"{table.internal_id if name == INTERNAL_ID else table.column(name).qualified}"
        f"{' DESC' if desc else ''}"
        for name, desc in order
    )


def parse_order(table: TableInfo, order_by: Any) -> Order:
    """((column, descending), ...) from a name, a (name, direction) pair, or a list of those."""
    if order_by is None:
        return ()
    if isinstance(order_by, str | tuple):
        items: list[Any] = [order_by]
    elif isinstance(order_by, list):
        items = order_by
    else:
        raise ValidationError(f"{_ORDER_SHAPES}, got {type(order_by).__name__} {brief(order_by)}")
    order = tuple(_order_item(table, item) for item in items)
    if len({name for name, _ in order}) < len(order):
        raise ValidationError(f"order_by names a column more than once: {brief(order_by)}")
    return order


_ORDER_SHAPES = "order_by takes a column name, a (column, 'asc'|'desc') pair, or a list of those"


def _order_item(table: TableInfo, item: Any) -> tuple[str, bool]:
    if isinstance(item, str):
        name, direction = item, "asc"
    elif isinstance(item, tuple | list) and len(item) == 2:
        name, direction = item
    else:
        raise ValidationError(f"{_ORDER_SHAPES}; {brief(item)} is none of them")
    if not isinstance(name, str):
        raise ValidationError(f"order_by names columns by str, got {type(name).__name__}")
    if not isinstance(direction, str) or direction not in ("asc", "desc"):
        raise ValidationError(f"order direction must be 'asc' or 'desc', got {brief(direction)}")
    table.column(name)
    table.check_orderable(name)
    table.check_sortable(name)
    return name, direction == "desc"


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What a read of rows is, whatever values it binds: its order, and the
    order as the statement sorts (with its tie-break where rows may tie);
    the columns ``select`` asks for (None: all) and those of the order it
    leaves out (read for a page's cursor only); its select list, the table
    and joins it reads, and its rows' decoder."""

    order: Order
    full_order: Order
    select: tuple[str, ...] | None
    hidden: tuple[str, ...]
    select_list: tuple[str, ...]
    select_columns: str
    select_from: str
    decode: Callable[[Sequence[Any]], dict[str, Any]]


def read_plan(
    table: TableInfo, order_by: Any, paged: bool, select: Any, fixed: frozenset[str]
) -> ReadPlan:
    """The read ``order_by`` and ``select`` make on ``table`` (both checked;
    ``paged``: with a limit; ``fixed``: the columns its condition holds to
    one value). Built once per shape and kept in the table's plans, where
    the arguments are made of plain str, tuples and lists (see
    :func:`plan_key`); else built for this read alone."""
    fixed &= table.unique_columns  # (all that the tie-break depends on)
    shape = plan_key(order_by, select)
    if shape is None:
        return _read_plan(table, order_by, paged, select, fixed)
    key = ("read", shape, paged, fixed)
    plan: ReadPlan | None = table.plans.get(key)
    if plan is None:
        plan = table.plans[key] = _read_plan(table, order_by, paged, select, fixed)
    return plan


def _read_plan(
    table: TableInfo, order_by: Any, paged: bool, select: Any, fixed: frozenset[str]
) -> ReadPlan:
    order = () if order_by is None else parse_order(table, order_by)
    if paged:
        _check_pageable(table, order)
    # (Order columns left out of select are read only for a page's cursor.)
    names, hidden = _selected(table, select, order if paged else ())
    reads: Selection | TableInfo = table if names is None else table.selection((*names, *hidden))
    return ReadPlan(
        order,
        with_tie(table, order, fixed),
        names,
        hidden,
        reads.select_list,
        reads.select_columns,
        reads.select_from,
        reads.decode,
    )


def plan_key(order_by: Any, select: Any) -> tuple[Any, Any] | None:
    """``order_by`` and ``select`` as a key of a table's plans, or None if
    either holds anything but str, tuples and lists of them. Exact types:
    a subclass of str could compare equal to a name it does not spell."""
    order: Any
    if order_by is None:
        order = None
    elif type(order_by) is str or (type(order_by) is tuple and _pair(order_by)):
        order = ("one", order_by)
    elif type(order_by) is list and all(type(i) is str or _pair(i) for i in order_by):
        # (Tagged, as the above: a list of two names is no (name, direction) pair.)
        order = ("list", tuple(i if type(i) is str else tuple(i) for i in order_by))
    else:
        return None
    if select is None:
        return order, None
    if type(select) in (list, tuple) and all(type(name) is str for name in select):
        # (Without repeats, as _selected reads it: a key no longer than the
        # table's columns, whatever the caller repeats.)
        return order, tuple(dict.fromkeys(select))
    return None


def _pair(item: Any) -> bool:
    return type(item) in (tuple, list) and len(item) == 2 and all(type(i) is str for i in item)


class ReadRows(RetrievalOp[ResultT]):
    """A read of rows; :class:`Find` and :class:`FindFirst` say what its result is."""

    def __init__(
        self,
        table: TableInfo,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        limit: int | None,
        after: str | None,
        *,
        first: bool = False,
        select: Any = None,
    ) -> None:
        super().__init__(table)
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit < _BIGINT[1]
        ):
            # (limit + 1 is bound as a bigint: one more row tells of another page.)
            raise ValidationError(
                f"limit must be a positive int below 2**63 - 1, got {brief(limit)}"
            )
        if limit is not None:
            limit = int.__index__(limit)  # (an exact int: its digits go into the text)
        # A plain dict of equalities, the common case, stays a dict (a copy):
        # :meth:`compile` binds its values without building a condition.
        self.equal: dict[str, Any] | None = None
        self.where: Expr | None = None
        if type(where) is dict and after is None:
            self.equal = equalities(where)
        else:
            self.where = where_expr(where)
        self.limit = 1 if first else limit
        fixed = fixed_columns(self.where) if self.equal is None else _set_columns(self.equal)
        plan = read_plan(table, order_by, limit is not None, select, fixed)
        self.order, self.full_order = plan.order, plan.full_order
        self.select, self.hidden = plan.select, plan.hidden
        self.select_columns, self.select_from = plan.select_columns, plan.select_from
        self.select_list = plan.select_list
        self.decode = plan.decode
        self.after = (
            None
            if after is None
            else _decode_cursor(after, self._cursor_key(), len(self.order) + 1)
        )

    def _cursor_key(self) -> str:
        return _cursor_key(self.table.identity.physical, self.order)

    def shape(self) -> Any:
        return (
            "find",
            None if self.where is None else self.where.shape(),
            self.order,
            self.limit,  # (written into the text: see Compiling.limit)
            self.after is not None,
            self.select,
        )

    def render(self, ctx: Compiling) -> None:
        if ctx.build_text:  # (the walk for parameters alone skips building text)
            ctx.text(f"SELECT {self.select_columns} FROM ")
        self.render_from(ctx)

    def statement_order(self) -> Order:
        """The order its statement sorts its rows in (its tie-break included)."""
        return self.full_order

    def render_from(self, ctx: Compiling, *, keys_only: bool = False) -> None:
        """The read after ``SELECT <select_columns> FROM``: the table and its
        joins, the conditions, the order and the limit. ``keys_only``: as
        the rows a join's read embeds, which are the page itself, without
        the one more row that tells whether another page exists."""
        table = self.table
        ctx.text(self.select_from)
        where = self.where if self.equal is None else where_expr(self.equal)
        conditions = [c for c in (where, self.after) if c is not None]
        for i, condition in enumerate(conditions):
            ctx.text(" WHERE " if i == 0 else " AND ")
            if isinstance(condition, list):  # the keyset of ``after``
                self._render_keyset(ctx, self.full_order, condition)
            else:
                condition.render(ctx)
        if ctx.build_text:  # (the walk for parameters alone skips building text)
            ctx.text(f" ORDER BY {order_terms(table, self.full_order)}")
        if self.limit is not None:
            ctx.text(" LIMIT ")
            # One more tells whether another page exists.
            ctx.limit(self.limit if keys_only else self.limit + 1)

    def _render_keyset(self, ctx: Compiling, columns: Order, values: list[Any]) -> None:
        """Rows after ``values`` (the order's, then the internal id) in the
        order ``columns``: (a, b, _id) > (va, vb, vid), spelled out so that
        each column can have its own direction; without the id where
        ``columns`` has no tie-break (the order's values are unique)."""
        ctx.text("(")
        for i, (name, desc) in enumerate(columns):
            if i:
                ctx.text(" OR ")
            ctx.text("(")
            for j in range(i):
                self._keyset_term(ctx, columns[j][0], "=", values[j])
                ctx.text(" AND ")
            self._keyset_term(ctx, name, "<" if desc else ">", values[i])
            ctx.text(")")
        ctx.text(")")

    def _keyset_term(self, ctx: Compiling, name: str, op: str, value: Any) -> None:
        if name == INTERNAL_ID:
            ctx.text(f"{self.table.internal_id} {op} ")
            ctx.raw_value(value)
        else:
            ctx.text(f"{ctx.column(name)} {op} ")
            ctx.value(name, value)

    def compile(self, catalog: Catalog) -> CompiledQuery:
        if self.equal is None:
            return compile_cached(catalog, self.table, self.shape(), self.render)
        # The parameters straight from the dict, in the order in which the
        # condition it stands for (see where_expr) renders them.
        table = self.table
        columns = table.columns
        params: list[Any] = []
        variant: list[Any] = []  # per item: None for IS NULL, else as in _bind_values
        for name, value in self.equal.items():
            if value is None:
                variant.append(None)
                continue
            info = columns.get(name) or table.column(name)
            param, looked_up = _bind_value(table, info, value)
            params.append(param)
            variant.append(looked_up)
        key = (
            table.name,
            "find=",
            tuple(self.equal),
            tuple(variant),
            self.order,
            self.limit,
            self.select,
        )
        return CompiledQuery(cached_text(catalog, table, key, self.render), tuple(params))


@functools.lru_cache(maxsize=1024)
def _cursor_key(physical: tuple[str, ...], order: tuple[tuple[str, bool], ...]) -> str:
    """What a cursor names its table and order by. The physical table: a
    cursor from the same table in another namespace is no position in this
    one. An order ending descending names its tie-break too: its ties were
    in creation order before they followed the last column (see
    :func:`with_tie`), so a cursor made then is refused, not read in the
    other direction. (Cached: every page with a next one makes a cursor.)"""
    descending_tie = bool(order) and order[-1][1]
    text = json.dumps([physical, order, "tie desc"] if descending_tie else [physical, order])
    return hashlib.sha1(text.encode()).hexdigest()[:8]


class Find(ReadRows[FindResult[RowT]]):
    """``uow.find(...)``: ``result`` is the page of rows."""

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        page: FindResult[Any] = FindResult(map(self.decode, rows))
        if self.limit is not None and len(page) > self.limit:
            if self.full_order is self.order:
                self._check_untied(page[self.limit - 1], page[self.limit])
            del page[self.limit :]
            page._after = self._position_after(page[-1])
        for name in self.hidden:  # (read for the cursor only)
            for row in page:
                del row[name]
        self._result = page

    def empty(self) -> None:
        self._result = FindResult()

    def _check_untied(self, last: dict[str, Any], next_: dict[str, Any]) -> None:
        """Raise unless the page's last row and the one after it differ in
        the order's values. An order without a tie-break (the unique index
        its columns hold, see :func:`with_tie`) that ties anyway — the
        database lacks the index: a migration dropped it since this
        Database's confirmed it — would make the next page skip the tied
        rows; its cursor is never made."""
        names = [name for name, _ in self.order]
        if [last[name] for name in names] == [next_[name] for name in names]:
            raise SchemaError(
                f"rows of {self.table.name!r} share their values of {', '.join(names)}, which a "
                "unique index of the schema holds, so the database lacks that index (dropped "
                "since a migration confirmed it): no page can follow this one; run "
                "db.migrate(schema), which names the rows that share a key"
            )

    def _position_after(self, row: dict[str, Any]) -> tuple[str, list[Any]] | None:
        """What the cursor after ``row`` holds (see FindResult.cursor)."""
        values = [row[name] for name, _ in self.order]
        if None in values:
            return None  # NULLs have no place in a keyset; see find()
        values.append(row[EXTERNAL_ID].internal_id)
        return self._cursor_key(), values


class FindFirst(ReadRows[RowT | None]):
    """``uow.find_first(...)``: ``result`` is the first row, or None."""

    def __init__(
        self,
        table: TableInfo,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        select: Any = None,
    ) -> None:
        super().__init__(table, where, order_by, None, None, first=True, select=select)

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        row: Any = self.decode(rows[0]) if rows else None
        self._result = row

    def empty(self) -> None:
        self._result = None


def _selected(
    table: TableInfo, select: Any, order: tuple[tuple[str, bool], ...]
) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The columns ``select`` asks for (None: all), and the columns of
    ``order`` it leaves out, which are read for a page's cursor and then
    dropped. The id, with the row's version, is always read."""
    if select is None:
        return None, ()
    if isinstance(select, str) or not isinstance(select, list | tuple):
        raise ValidationError(
            f"select takes a list of column names, got {type(select).__name__} {brief(select)}"
        )
    names: list[str] = []
    for name in select:
        table.column(name)  # (raises for what is no column, naming the columns)
        if name != EXTERNAL_ID and name not in names:
            names.append(name)
    hidden = tuple(name for name, _ in order if name not in names)
    return tuple(names), hidden


def _decode_cursor(cursor: Any, key: str, width: int) -> list[Any]:
    malformed = ValidationError(
        f"malformed cursor {brief(cursor, 40)}: pass a find() result's .cursor"
    )
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = tagged_json.loads(base64.urlsafe_b64decode(padded.encode()))
    # (RecursionError: JSON nested deeper than the decoder recurses.)
    except (ValueError, TypeError, ArithmeticError, RecursionError) as exc:
        raise malformed from exc
    if not isinstance(data, dict) or not isinstance(data.get("v"), list):
        raise malformed
    if data.get("k") != key:
        raise ValidationError(
            "this cursor belongs to a find() on another table or with another order_by"
        )
    values: list[Any] = data["v"]
    last = values[-1] if values else None
    if len(values) != width or type(last) is not int or not _BIGINT[0] <= last <= _BIGINT[1]:
        raise malformed
    return values


_BIGINT = (-(2**63), 2**63 - 1)  # the range of an internal id


class Count(RetrievalOp[int]):
    """``uow.count(...)``: ``result`` is the number of matching rows."""

    def __init__(self, table: TableInfo, where: Expr | Mapping[str, Any] | None) -> None:
        super().__init__(table)
        self.where = where_expr(where)

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"SELECT COUNT(*) FROM {self.table.sql_name} t")
        if self.where is not None:
            ctx.text(" WHERE ")
            self.where.render(ctx)

    def compile(self, catalog: Catalog) -> CompiledQuery:
        return compile_cached(
            catalog,
            self.table,
            ("count", None if self.where is None else self.where.shape()),
            self.render,
        )

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        self._result = int(rows[0][0])

    def empty(self) -> None:
        self._result = 0


class MutationOp:
    """A queued write; compiled (and its values checked) when queued.

    ``must_match`` ops (updates, deletes, checks) stop the mutation phase
    when they match no row, so that it commits only when every operation
    did what it says (and the outbox entry describes what committed). That
    is a conflict — the unit runs again — when the unit had seen the row
    (``seen``: the target is a RowId with a version, from a read or a
    create) or checked its version; else the row was never there, which
    :class:`~aiofragno.errors.RowNotFound` reports. ``lookups``: the
    external ids of referenced rows that its statement looks up (in a
    subquery)."""

    op: str
    checked: bool = False
    must_match: bool = True
    lookups: tuple[str, ...] = ()
    # A read (a check): it changes nothing, and goes in no outbox entry.
    is_read: bool = False
    # Never part of a statement combining several operations (a delete; an
    # upsert, whose row no other operation's target names).
    runs_alone: bool = False
    # Takes its statement's result (:meth:`take`) once the phase ran it.
    wants_result: bool = False
    # The columns its statement returns for :meth:`take` (its RETURNING),
    # which a statement combining it with others returns too (0: none).
    returns: int = 0
    # Whether it has an entry of its own in the outbox payload, and
    # (describe) writes that entry itself (bulk writes, .bulk).
    in_outbox: bool = True
    describe: Callable[[dict[str, Any], int, dict[str, str]], None] | None = None
    # Writes the operation's statement (its text only where the Compiling
    # builds it). (Not an ABC's abstract method: isinstance() with an ABC
    # costs ~0.1 us more, several times per operation.)
    render: Callable[[Compiling], None]

    def __init__(self, table: TableInfo, target: RowId | str) -> None:
        self.table = table
        self.target = target
        self.query: CompiledQuery

    def conflicted(self, result: QueryResult) -> bool:
        """Whether the phase stops at this operation's ``result``."""
        # (For a check, a SELECT, rows_affected is the rows it returned.)
        return self.must_match and result.rows_affected == 0

    def take(self, result: QueryResult) -> None:
        """Keep what the statement returned (only where ``wants_result``)."""

    def missing(self) -> Exception:
        """The error when the operation matched no row, one the unit had not
        seen (else it is a conflict)."""
        return RowNotFound(f"{self.stale()}; nothing was written")

    @property
    def seen(self) -> bool:
        """Whether the unit knew the row: a conflict, not a missing row, if it is gone."""
        return self.checked or getattr(self.target, "version", None) is not None

    def stale(self) -> str:
        """What went wrong, when this operation matched no row."""
        if self.checked:
            why = "the row changed or is gone"
        elif self.seen:
            why = "the row is gone"
        else:
            why = "there is no such row"
        return f"{self.op} on {self.table.name} {str(self.target)!r}: {why}"


_MISSING = object()


class Create(MutationOp):
    op = "create"
    must_match = False

    def __init__(self, catalog: Catalog, table: TableInfo, values: Mapping[str, Any]) -> None:
        _check_mapping(table, values, "create")
        complete: dict[str, Any] = {}
        given = 0
        missing = None  # a required column without a value
        for name, info in table.columns.items():
            column = info.column
            if column is None:
                continue
            value = values.get(name, _MISSING)
            if value is _MISSING:
                value = column.default
            else:
                given += 1
            if value is None and not column.nullable and missing is None:
                missing = name
            complete[name] = value
        if given != len(values):  # a name that is no column of the table (a typo, say)
            for name in values:
                if name not in complete:
                    _refuse(table, name, "create")
        if missing is not None:
            raise ValidationError(f"{table.name}.{missing} is required (NOT NULL, no default)")
        super().__init__(table, RowId(new_external_id(), 0, None, table.identity))
        self.values = complete
        params, variant, self.lookups = _bind_values(table, complete, "create", bind_nulls=True)
        key = (table.name, "create", tuple(complete), variant)
        text = cached_text(catalog, table, key, self.render)
        self.query = CompiledQuery(text, (str(self.target), *params))

    def render(self, ctx: Compiling) -> None:
        table = self.table
        columns = [
            table.columns[EXTERNAL_ID].quoted,
            *(table.columns[n].quoted for n in self.values),
        ]
        ctx.text(f"INSERT INTO {table.sql_name} ({', '.join(columns)}) VALUES (")
        ctx.raw_value(str(self.target))
        for name, value in self.values.items():
            ctx.text(", ")
            if value is None:
                ctx.raw_value(None)
            else:
                ctx.value(name, value)
        ctx.text(")")


class Update(MutationOp):
    op = "update"

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        target: Any,
        values: Mapping[str, Any],
        check: bool,
    ) -> None:
        _check_mapping(table, values, "update")
        super().__init__(table, row_id(target, table=table, need_version=check))
        self.checked = check
        self.values = dict(values)
        params, variant, self.lookups = _bind_values(table, self.values, "update", bind_nulls=False)
        key = (table.name, "update", tuple(self.values), variant, check)
        text = cached_text(catalog, table, key, self.render)
        self.query = CompiledQuery(text, (*params, *_target_params(self.target, check)))

    def render(self, ctx: Compiling) -> None:
        table = self.table
        ctx.text(f"UPDATE {table.sql_name} SET ")
        for name, value in self.values.items():
            ctx.text(f"{table.columns[name].quoted} = ")
            if value is None:
                ctx.text("NULL")
            else:
                ctx.value(name, value)
            ctx.text(", ")
        version = ctx.catalog.compiler.quote_identifier(VERSION)
        ctx.text(f"{version} = {version} + 1")
        _render_target(ctx, self.target, self.checked)


def _target_params(target: RowId | str, checked: bool) -> tuple[Any, ...]:
    """The parameters :func:`_render_target` binds."""
    return (str(target), getattr(target, "version", None)) if checked else (str(target),)


def _render_target(ctx: Compiling, target: RowId | str, checked: bool) -> None:
    quote = ctx.catalog.compiler.quote_identifier
    ctx.text(f" WHERE {quote(EXTERNAL_ID)} = ")
    ctx.raw_value(str(target))
    if checked:
        ctx.text(f" AND {quote(VERSION)} = ")
        ctx.raw_value(getattr(target, "version", None))


class Delete(MutationOp):
    op = "delete"
    runs_alone = True

    def __init__(self, catalog: Catalog, table: TableInfo, target: Any, check: bool) -> None:
        super().__init__(table, row_id(target, table=table, need_version=check))
        self.checked = check
        text = cached_text(catalog, table, (table.name, ("delete", check), ()), self.render)
        self.query = CompiledQuery(text, _target_params(self.target, check))

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"DELETE FROM {self.table.sql_name}")
        _render_target(ctx, self.target, self.checked)


class Check(MutationOp):
    op = "check"
    checked = True
    is_read = True

    def __init__(self, catalog: Catalog, table: TableInfo, target: Any) -> None:
        super().__init__(table, row_id(target, table=table, need_version=True))
        text = cached_text(catalog, table, (table.name, ("check",), ()), self.render)
        self.query = CompiledQuery(text, _target_params(self.target, True))

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"SELECT 1 FROM {self.table.sql_name}")
        _render_target(ctx, self.target, True)
        # Hold a shared lock until commit, so the checked version cannot change
        # before the unit's writes commit.
        ctx.text(ctx.catalog.adapter.sql.row_share_lock)
