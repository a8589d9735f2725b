"""The operations of a unit of work and how each compiles to SQL.

Every operation compiles to parameters (its values checked and encoded) and
SQL text taken from the catalog's cache, keyed by the operation's shape
(table, columns, operators, directions, how references resolve); the text is
rendered only on a cache miss. A read finds its parameters by a walk of its
condition that skips the text; a write's parameters are its values in column
order, bound directly (:func:`_bind_values`), in the order its render would
bind them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import tagged_json
from ..driver import CompiledQuery, QueryResult
from ..errors import ValidationError
from ..schema import EXTERNAL_ID, INTERNAL_ID, VERSION, RowId, new_external_id
from .catalog import Catalog, TableInfo
from .context import Compiling, bind, row_id
from .expr import Expr, where_expr

_NOT_RETRIEVED = object()


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
    text = catalog.sql_cache.get(key)
    if text is None:
        built = Compiling(catalog, table, build_text=True)
        render(built)
        text = catalog.sql_cache[key] = built.sql()
    return text


def _bind_values(
    table: TableInfo, values: Mapping[str, Any], *, bind_nulls: bool
) -> tuple[list[Any], tuple[bool | None, ...]]:
    """The parameters of ``values`` in order, the way a render walk would bind
    them, without the walk: a None is a parameter of its own only with
    ``bind_nulls`` (else the text says NULL). Also, for each reference, what
    its text is: None for a NULL, else whether its row is looked up by
    external id (a subquery) rather than given by internal id — part of the
    key the text is cached by."""
    params: list[Any] = []
    references: list[bool | None] = []
    columns = table.columns
    for name, value in values.items():
        if value is None:
            if bind_nulls:
                params.append(None)
            if columns[name].target is not None:
                references.append(None)
            continue
        param = bind(table, name, value)
        if columns[name].target is not None:
            references.append(type(param) is str)
        params.append(param)
    return params, tuple(references)


class FindResult(list[dict[str, Any]]):
    """The rows of a ``find``; ``cursor`` continues after the last one (pass it
    as ``after=``), or is None when there are no more rows."""

    cursor: str | None = None


class RetrievalOp(ABC):
    """A queued read. ``result`` is available after ``await uow.retrieve()``."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self._result: Any = _NOT_RETRIEVED

    @property
    def result(self) -> Any:
        if self._result is _NOT_RETRIEVED:
            raise ValidationError(
                f"the result of this {type(self).__name__} on {self.table.name!r} is not there yet: "
                "await uow.retrieve() first"
            )
        return self._result

    @abstractmethod
    def compile(self, catalog: Catalog) -> CompiledQuery:
        """The read's SQL and parameters."""

    @abstractmethod
    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        """Take the read's rows (each a sequence of column values) as ``result``."""

    @abstractmethod
    def empty(self) -> None:
        """The result a dry run gives."""


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


def _order(table: TableInfo, order_by: Any) -> tuple[tuple[str, bool], ...]:
    """((column, descending), ...) from a name, a (name, direction) pair, or a list of those."""
    if order_by is None:
        return ()
    items = [order_by] if isinstance(order_by, str | tuple) else list(order_by)
    order: list[tuple[str, bool]] = []
    for item in items:
        name, direction = (item, "asc") if isinstance(item, str) else item
        if direction not in ("asc", "desc"):
            raise ValidationError(f"order direction must be 'asc' or 'desc', got {direction!r}")
        table.column(name)
        table.check_orderable(name)
        order.append((name, direction == "desc"))
    return tuple(order)


class Find(RetrievalOp):
    def __init__(
        self,
        table: TableInfo,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        limit: int | None,
        after: str | None,
        *,
        first: bool = False,
    ) -> None:
        super().__init__(table)
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValidationError(f"limit must be a positive int, got {limit!r}")
        self.where = where_expr(where)
        self.order = _order(table, order_by)
        if limit is not None:
            _check_pageable(table, self.order)
        self.limit = 1 if first else limit
        self.first = first
        self.after = (
            None
            if after is None
            else _decode_cursor(after, self._cursor_key(), len(self.order) + 1)
        )

    def _cursor_key(self) -> str:
        text = json.dumps([self.table.name, self.order])
        return hashlib.sha1(text.encode()).hexdigest()[:8]

    def shape(self) -> Any:
        return (
            "find",
            None if self.where is None else self.where.shape(),
            self.order,
            self.limit is not None,
            self.after is not None,
        )

    def render(self, ctx: Compiling) -> None:
        table = self.table
        ctx.text(table.select_sql)
        conditions = [c for c in (self.where, self.after) if c is not None]
        for i, condition in enumerate(conditions):
            ctx.text(" WHERE " if i == 0 else " AND ")
            if isinstance(condition, list):  # the keyset of ``after``
                self._render_keyset(ctx, condition)
            else:
                condition.render(ctx)
        if ctx.build_text:  # (the walk for parameters alone skips building text)
            keys = [
                f"{table.column(name).qualified}{' DESC' if desc else ''}"
                for name, desc in self.order
            ]
            ctx.text(f" ORDER BY {', '.join([*keys, table.internal_id])}")
        if self.limit is not None:
            ctx.text(" LIMIT ")
            ctx.raw_value(self.limit + 1)  # one more tells whether another page exists

    def _render_keyset(self, ctx: Compiling, values: list[Any]) -> None:
        """Rows after ``values`` in the order: (a, b, _id) > (va, vb, vid),
        spelled out so that each column can have its own direction."""
        columns = [*self.order, (INTERNAL_ID, False)]
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
        return compile_cached(catalog, self.table, self.shape(), self.render)

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        decode = self.table.decode
        decoded = [decode(values) for values in rows]
        if self.first:
            self._result = decoded[0] if decoded else None
            return
        page = FindResult(decoded)
        if self.limit is not None and len(decoded) > self.limit:
            del page[self.limit :]
            page.cursor = self._cursor_after(page[-1])
        self._result = page

    def empty(self) -> None:
        self._result = None if self.first else FindResult()

    def _cursor_after(self, row: dict[str, Any]) -> str | None:
        for name, _ in self.order:
            if row[name] is None:
                return None  # NULLs have no place in a keyset; see find()
        values = [row[name] for name, _ in self.order]
        values.append(row[EXTERNAL_ID].internal_id)
        payload = tagged_json.dumps({"k": self._cursor_key(), "v": values})
        return base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, key: str, width: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        data = tagged_json.loads(base64.urlsafe_b64decode(padded.encode()))
        if not isinstance(data, dict) or not isinstance(data.get("v"), list):
            raise ValueError("not a cursor")
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ValidationError(
            f"malformed cursor {cursor!r:.40}: pass a find() result's .cursor"
        ) from exc
    if data.get("k") != key:
        raise ValidationError(
            "this cursor belongs to a find() on another table or with another order_by"
        )
    values: list[Any] = data["v"]
    if len(values) != width or not isinstance(values[-1], int):
        raise ValidationError(f"malformed cursor {cursor!r:.40}: pass a find() result's .cursor")
    return values


class Count(RetrievalOp):
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
    ``checked`` ops make the mutation phase fail as a conflict when they match
    no row."""

    op: str
    checked: bool = False

    def __init__(self, table: TableInfo, target: RowId | str) -> None:
        self.table = table
        self.target = target
        self.query: CompiledQuery

    def conflicted(self, result: QueryResult) -> bool:
        # (For a check, a SELECT, rows_affected is the rows it returned.)
        return self.checked and result.rows_affected == 0


def _check_writable(table: TableInfo, values: Mapping[str, Any], what: str) -> None:
    if type(values) is not dict and not isinstance(values, Mapping):
        raise ValidationError(
            f"{what} on {table.name!r} takes a dict of column values, got {type(values).__name__}"
        )
    columns = table.columns
    for name in values:
        if name == EXTERNAL_ID:
            raise ValidationError(
                f"{table.name}.id is generated by aiofragno and cannot be written"
            )
        if name not in columns:
            table.column(name)  # raises, naming what is wrong


class Create(MutationOp):
    op = "create"

    def __init__(self, catalog: Catalog, table: TableInfo, values: Mapping[str, Any]) -> None:
        _check_writable(table, values, "create")
        complete: dict[str, Any] = {}
        for name, info in table.columns.items():
            column = info.column
            if column is None:
                continue
            value = values.get(name, column.default)
            if value is None and not column.nullable:
                raise ValidationError(f"{table.name}.{name} is required (NOT NULL, no default)")
            complete[name] = value
        super().__init__(table, RowId(new_external_id(), 0))
        self.values = complete
        params, references = _bind_values(table, complete, bind_nulls=True)
        key = (table.name, ("create", tuple(complete)), references)
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
        _check_writable(table, values, "update")
        super().__init__(table, row_id(target, table=table.name, need_version=check))
        self.checked = check
        self.values = dict(values)
        nulls = tuple([name for name, value in self.values.items() if value is None])
        for name in nulls:
            column = table.columns[name].column
            if column is not None and not column.nullable:
                raise ValidationError(f"{table.name}.{name} is NOT NULL: cannot set it to None")
        params, references = _bind_values(table, self.values, bind_nulls=False)
        key = (table.name, ("update", tuple(self.values), nulls, check), references)
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

    def __init__(self, catalog: Catalog, table: TableInfo, target: Any, check: bool) -> None:
        super().__init__(table, row_id(target, table=table.name, need_version=check))
        self.checked = check
        text = cached_text(catalog, table, (table.name, ("delete", check), ()), self.render)
        self.query = CompiledQuery(text, _target_params(self.target, check))

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"DELETE FROM {self.table.sql_name}")
        _render_target(ctx, self.target, self.checked)


class Check(MutationOp):
    op = "check"
    checked = True

    def __init__(self, catalog: Catalog, table: TableInfo, target: Any) -> None:
        super().__init__(table, row_id(target, table=table.name, need_version=True))
        text = cached_text(catalog, table, (table.name, ("check",), ()), self.render)
        self.query = CompiledQuery(text, _target_params(self.target, True))

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"SELECT 1 FROM {self.table.sql_name}")
        _render_target(ctx, self.target, True)
        # Hold a shared lock until commit, so the checked version cannot change
        # before the unit's writes commit.
        ctx.text(ctx.catalog.adapter.row_share_lock)
