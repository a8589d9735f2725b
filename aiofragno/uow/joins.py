"""Joins in the retrieval phase: ``find(..., join={...})`` follows references
both ways and returns nested rows (plain dicts: no identity map, no lazy
loading; each occurrence of a joined row is a dict of its own).

``af.one("src")`` follows a reference column of the row to the row it names
(many-to-one): that row as a dict, or None where the reference is NULL. (A
reference always finds its row: the find and its joins read one snapshot,
see :mod:`.snapshot`; were one missing, the attempt would be a conflict,
never a None.) ``af.many("transfers", by="src")`` follows a
reference backwards (one-to-many): the rows of ``transfers`` whose ``src``
is the row, a list in the join's ``order_by`` (ties: creation order), at
most ``limit`` per row. Joins nest (``join=`` on a join), :data:`MAX_DEPTH`
levels deep at most.

How a tree runs: every join is one more read, queued before the find, that
selects its table's rows whose key is among the keys of its parent's rows —
the parent's read itself, embedded as a derived table, so that it needs
nothing from the parent's results and travels with it: one statement on
PostgreSQL, MySQL and MariaDB (see combine_reads), one batch (one round
trip) elsewhere (but for a join read by key, below).
Joined rows come back as rows of their own table through its decoder, so
every value is as exact as in a plain find, and each ``id`` is a RowId
with version and table, usable in ``update(..., check=True)``. A
per-parent ``limit`` is a LIMIT per parent: in a LATERAL subquery
(PostgreSQL) or a correlated ``IN (... LIMIT)`` (SQLite). Where the
database has neither (MariaDB, MySQL), a join under a find's page of one
row (``find_first``, ``limit=1``) takes that row's key from the find's read
embedded as a scalar subquery, in a read of its own; a join without joins
of its own on the rows of a find whose page is at most
:data:`BY_KEY_PARENTS` rows is
read by key once that page is in: one ``WHERE <by> = <parent> ORDER BY ...
LIMIT n`` per parent, which an index on the reference and order columns
reads no further than ``n`` rows, in a second batch of the retrieve's
snapshot (one round trip more, see :mod:`.staged_reads`); anywhere else,
each parent's rows are numbered with ``ROW_NUMBER()``, which reads and
sorts all of them.

A ``where`` on a ``one`` join filters by the joined row's columns: it keeps
only the rows whose referenced row matches (an inner join), as part of
the parent's own condition (``src IN (SELECT _id FROM accounts WHERE
...)``), so the parent's ``limit`` and cursor count matching rows only. A
``where`` on a ``many`` join filters that join's rows only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, get_args, get_origin

from ..brief import brief
from ..driver import CompiledQuery
from ..errors import ConcurrencyConflict, SchemaError, ValidationError
from ..row_types import JoinCheck, check_row_type, members
from ..schema import Table, table_name
from .catalog import ALIAS, Catalog, TableInfo
from .compiling import Compiling
from .expr import Expr, fixed_columns, where_expr
from .ops import (
    Find,
    FindFirst,
    Order,
    ReadRows,
    RetrievalOp,
    cached_text,
    order_text,
    parse_order,
    plan_key,
    with_tie,
)

MAX_DEPTH = 4
"""How deeply joins may nest (each level one more read, embedding its parents)."""

BY_KEY_PARENTS = 100
"""The largest page of a find whose per-parent limited joins are read by key
where the database cannot limit per parent in one statement (one statement
per parent: more than these would cost more than numbering their rows)."""

_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")


class One:
    """A many-to-one join (see :func:`one`)."""

    __slots__ = ("column", "join", "where")

    def __init__(self, column: str, where: Expr | Mapping[str, Any] | None, join: Any) -> None:
        self.column, self.where, self.join = column, where, join


class Many:
    """A one-to-many join (see :func:`many`)."""

    __slots__ = ("by", "join", "limit", "order_by", "table", "where")

    def __init__(
        self,
        table: str | Table[Any],
        by: str,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        limit: int | None,
        join: Any,
    ) -> None:
        self.table, self.by, self.where = table, by, where
        self.order_by, self.limit, self.join = order_by, limit, join


Join = One | Many
Joins = Mapping[str, Join]


def one(
    column: str,
    *,
    where: Expr | Mapping[str, Any] | None = None,
    join: Joins | None = None,
) -> One:
    """Join the row that reference ``column`` names: a dict, or None. With
    ``where`` (on the joined row's columns), only rows whose referenced row
    matches are found."""
    return One(column, where, join)


def many(
    table: str | Table[Any],
    *,
    by: str,
    where: Expr | Mapping[str, Any] | None = None,
    order_by: Any = None,
    limit: int | None = None,
    join: Joins | None = None,
) -> Many:
    """Join the rows of ``table`` whose reference column ``by`` names the row:
    a list in ``order_by`` order (ties: creation order), at most ``limit``
    of them per row, only those matching ``where``."""
    return Many(table, by, where, order_by, limit, join)


class _Matches(Expr):
    """Reference ``column`` names a row of ``target`` matching ``condition``."""

    __slots__ = ("column", "condition", "target")

    def __init__(self, column: str, target: TableInfo, condition: Expr) -> None:
        self.column, self.target, self.condition = column, target, condition

    def shape(self) -> Any:
        return ("matches", self.column, self.target.name, self.condition.shape())

    def render(self, ctx: Compiling) -> None:
        target = self.target
        ctx.text(
            f"{ctx.column(self.column)} IN (SELECT {target.internal_id} "
            f"FROM {target.sql_name} {ALIAS} WHERE "
        )
        _render_on(ctx, target, self.condition.render)
        ctx.text(")")


def _render_on(ctx: Compiling, table: TableInfo, render: Callable[[Compiling], None]) -> None:
    """``render(ctx)`` with ``table``'s columns in scope (an inner SELECT's)."""
    outer = ctx.table
    ctx.table = table
    try:
        render(ctx)
    finally:
        ctx.table = outer


def _both(a: Expr | None, b: Expr | None) -> Expr | None:
    return b if a is None else a if b is None else a & b


class _Node:
    """One join, checked against the schema: ``table`` is the joined table;
    ``link`` the reference column (the parent's for a ``one``, the joined
    table's for a ``many``); ``where`` its rows' condition (a ``many``'s)."""

    def __init__(self, key: str, spec: Join, table: TableInfo, link: str) -> None:
        self.key, self.spec, self.table, self.link = key, spec, table, link
        self.children: list[_Node] = []
        self.where: Expr | None = None
        self.order: tuple[tuple[str, bool], ...] = ()  # a many's order_by
        self.per_parent: int | None = None  # a many's limit


def _resolve(
    catalog: Catalog, parent: TableInfo, joins: Any, depth: int
) -> tuple[list[_Node], Expr | None]:
    """The checked joins on rows of ``parent``, and the condition their
    ``where``s (on ``one`` joins) add to the parent's."""
    if not isinstance(joins, Mapping):
        raise ValidationError(
            f"join= takes a dict of name -> af.one(...) or af.many(...), got {brief(joins)}"
        )
    if depth > MAX_DEPTH:
        raise ValidationError(f"joins nest at most {MAX_DEPTH} levels deep")
    nodes: list[_Node] = []
    condition: Expr | None = None
    for key, spec in joins.items():
        _check_key(parent, key)
        if isinstance(spec, One):
            node = _one(catalog, parent, key, spec)
        elif isinstance(spec, Many):
            node = _many(catalog, parent, key, spec)
        else:
            raise ValidationError(
                f"join {key!r} must be af.one(...) or af.many(...), got {brief(spec)}"
            )
        own = where_expr(spec.where)
        if spec.join is not None:
            node.children, inner = _resolve(catalog, node.table, spec.join, depth + 1)
            own = _both(own, inner)
        if isinstance(spec, Many):
            node.where = own
        elif own is not None:
            condition = _both(condition, _Matches(node.link, node.table, own))
        nodes.append(node)
    return nodes, condition


def _check_key(parent: TableInfo, key: Any) -> None:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValidationError(
            f"join names are a letter, then letters, digits or _ (at most 63), got {brief(key)}"
        )
    if key in parent.columns:
        raise ValidationError(
            f"join {key!r} has the name of a column of {parent.name!r}; name it otherwise"
        )


def _one(catalog: Catalog, parent: TableInfo, key: str, spec: One) -> _Node:
    info = parent.column(spec.column)
    if info.target is None:
        refs = [c.name for c in parent.columns.values() if c.target is not None]
        raise ValidationError(
            f"join {key!r}: {parent.name}.{info.name} is no reference, so af.one() cannot "
            f"follow it (references of {parent.name!r}: {', '.join(refs) or 'none'})"
        )
    return _Node(key, spec, catalog.table(info.target), info.name)


def _many(catalog: Catalog, parent: TableInfo, key: str, spec: Many) -> _Node:
    table = catalog.table(spec.table)
    if not isinstance(spec.by, str):
        raise ValidationError(f"join {key!r}: by= names a reference column, got {brief(spec.by)}")
    info = table.column(spec.by)
    if info.target != parent.name:
        refs = [c.name for c in table.columns.values() if c.target == parent.name]
        raise ValidationError(
            f"join {key!r}: {table.name}.{info.name} is no reference to {parent.name!r} "
            f"(those of {table.name!r}: {', '.join(refs) or 'none'})"
        )
    limit = spec.limit
    if limit is not None and (
        not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit < 2**63
    ):
        raise ValidationError(f"join {key!r}: limit must be a positive int, got {brief(limit)}")
    node = _Node(key, spec, table, info.name)
    node.order = parse_order(table, spec.order_by)
    # (An exact int: its digits go into the text, see Compiling.limit.)
    node.per_parent = None if limit is None else int.__index__(limit)
    return node


class _CompiledWhenQueued:
    """A read compiled (every value and column checked) when queued, so that
    a bad join or value fails at the call; retrieve() takes that query."""

    query: CompiledQuery

    def compile(self, catalog: Catalog) -> CompiledQuery:
        return self.query


class JoinRead(_CompiledWhenQueued, ReadRows[list[dict[str, Any]]]):
    """The read of one join: its table's rows whose key is among those of
    ``parent``'s rows (``parent`` embedded as a derived table).

    Compiled without a walk of its parent: its parameters are the parent's
    (the embedded read binds what the parent's own statement binds, in the
    same order) and then those of its own ``where``; its text, cached, is
    keyed by the parent's text — which says all the embedded read's text
    depends on — and what this read adds to it (see :meth:`_compile`)."""

    def __init__(
        self, catalog: Catalog, node: _Node, parent: JoinRead | JoinedFind | JoinedFindFirst
    ) -> None:
        # (Not ReadRows.__init__: _resolve checked the order, and a join's
        # read has no limit, cursor or select of its own.)
        RetrievalOp.__init__(self, node.table)
        table = node.table
        self.equal, self.where, self.order = None, node.where, node.order
        self.limit = self.after = self.select = None
        self.hidden = ()
        self.select_columns, self.select_from = table.select_columns, table.select_from
        self.select_list = table.select_list
        self.decode = table.decode
        self.key = node.key
        self.parent = parent
        self.many = isinstance(node.spec, Many)
        self.link = node.link
        self.per_parent = node.per_parent
        # Where no statement can limit rows per parent (MariaDB), the
        # first rows of the one parent of a page of one row, read by that
        # parent's key taken from its read in the same statement.
        self.of_one_parent = self._no_limit_per_parent(catalog, parent) and parent.limit == 1
        self.runs_after_parent = self._by_key(catalog, node, parent)
        self.query = self._compile(catalog, parent.query)
        self.joins = [JoinRead(catalog, child, self) for child in node.children]
        self._found: dict[str, Any] = {}

    def _no_limit_per_parent(
        self, catalog: Catalog, parent: JoinRead | JoinedFind | JoinedFindFirst
    ) -> bool:
        """Whether this is a ``many`` with a limit, on a database that can
        limit rows per parent in no statement, under a find's page."""
        capabilities = catalog.adapter.capabilities
        return (
            self.per_parent is not None
            and not (capabilities.supports_lateral or capabilities.supports_limit_in_subquery)
            and not isinstance(parent, JoinRead)
            and parent.limit is not None
        )

    def _by_key(
        self, catalog: Catalog, node: _Node, parent: JoinRead | JoinedFind | JoinedFindFirst
    ) -> bool:
        """Whether this read runs by key after its parent's page (see the
        module's doc). Not with joins of its own: each of those embeds this
        read's rows as one statement, which by key they are not."""
        return (
            self._no_limit_per_parent(catalog, parent)
            and not self.of_one_parent
            and not node.children
            and parent.limit is not None
            and parent.limit <= BY_KEY_PARENTS
        )

    def by_keys(self, parent_rows: Sequence[Sequence[Any]]) -> list[CompiledQuery]:
        """The statements reading this join (:attr:`runs_after_parent`) for
        its parent's page ``parent_rows`` (row values, the internal id first):
        one per parent, in the page's order."""
        assert isinstance(self.parent, ReadRows) and self.parent.limit is not None
        sql, (_, *params) = self.query  # (its first parameter: a parent's key)
        keys = dict.fromkeys(row[0] for row in parent_rows[: self.parent.limit])
        return [CompiledQuery(sql, (key, *params)) for key in keys]

    def _compile(self, catalog: Catalog, parent: CompiledQuery) -> CompiledQuery:
        table = self.table
        where = self.where
        params: tuple[Any, ...] = ()
        signature: tuple[bool, ...] = ()
        shape = None
        if where is not None:  # (its values checked and bound here, as in any read)
            ctx = Compiling(catalog, table, build_text=False)
            where.render(ctx)
            params, signature, shape = tuple(ctx.params), tuple(ctx.signature), where.shape()
        if self.runs_after_parent:  # (a parent's key first, 0 until by_keys)
            by_key = (
                table.name,
                "by key",
                self.link,
                self.order,
                self.per_parent,
                shape,
                signature,
            )
            return CompiledQuery(
                cached_text(catalog, table, by_key, self._render_by_key), (0, *params)
            )
        key = (
            table.name,
            "join",
            parent.sql,
            self.many,
            self.link,
            self.order,
            self.per_parent,  # (written into the text: see Compiling.limit)
            shape,
            signature,
        )
        return CompiledQuery(
            cached_text(catalog, table, key, self.render), parent.parameters + params
        )

    def reads(self) -> list[JoinRead]:
        """This read and those of the joins below it."""
        return [self, *(read for join in self.joins for read in join.reads())]

    def statement_order(self) -> Order:
        # (A one's rows are found by key: they come in no order.)
        return with_tie(self.table, self.order, self._fixed()) if self.many else ()

    def render_from(self, ctx: Compiling, *, keys_only: bool = False) -> None:
        # (No limit of its own: as the parent of a join, the same rows.)
        table = self.table
        order = order_text(table, self.order, self._fixed())
        limit = self.per_parent
        if limit is None:
            ctx.text(f"{table.select_from} WHERE ")
            self._render_matching(ctx)
        elif self.of_one_parent:
            ctx.text(f"{table.select_from} WHERE ")
            self._render_of_one_parent(ctx, order, limit)
            return
        elif ctx.catalog.adapter.capabilities.supports_lateral:
            ctx.text(f"{table.select_from} WHERE ")
            self._render_lateral(ctx, order, limit)
        elif ctx.catalog.adapter.capabilities.supports_limit_in_subquery:
            self._render_correlated(ctx, order, limit)
        else:
            self._render_numbered(ctx, order, limit)
        if self.many:
            ctx.text(f" ORDER BY {order}")

    def _render_matching(self, ctx: Compiling) -> None:
        """The rows whose key is among the parent's rows' keys, and ``where``."""
        parent = self.parent.table
        if self.many:
            mine, theirs = self.table.column(self.link).qualified, parent.internal_id
        else:
            mine, theirs = self.table.internal_id, parent.column(self.link).qualified
        ctx.text(f"{mine} IN (SELECT p.k FROM ")
        self._render_parent_keys(ctx, theirs)
        ctx.text(")")
        self._render_where(ctx)

    def _render_parent_keys(self, ctx: Compiling, key: str) -> None:
        """The parent's read as derived table ``p``, its one column ``k`` (``key``)."""
        ctx.text(f"(SELECT {key} AS k FROM ")
        _render_on(ctx, self.parent.table, partial(self.parent.render_from, keys_only=True))
        ctx.text(") p")

    def _fixed(self) -> frozenset[str]:
        """The columns equal among one parent's rows of a ``many``: its
        reference, and those its ``where`` holds to one value (see
        :func:`.ops.with_tie`: each parent's rows are ordered on their own)."""
        return fixed_columns(self.where) | {self.link}

    def _render_where(self, ctx: Compiling) -> None:
        if self.where is not None:
            ctx.text(" AND ")
            self.where.render(ctx)

    def _render_by_key(self, ctx: Compiling) -> None:
        """A many's first rows for one parent, whose key binds first."""
        table = self.table
        assert self.per_parent is not None
        ctx.text(
            f"SELECT {table.select_columns} FROM {table.select_from} "
            f"WHERE {table.column(self.link).qualified} = "
        )
        ctx.raw_value(0)
        self._render_where(ctx)
        ctx.text(f" ORDER BY {order_text(table, self.order, self._fixed())} LIMIT ")
        ctx.limit(self.per_parent)

    def _render_of_one_parent(self, ctx: Compiling, order: str, limit: int) -> None:
        """A many's first ``limit`` rows of the one row of its parent's page:
        its key from the parent's read, a scalar subquery (NULL, so no row,
        where the page is empty); an index on the reference and order
        columns reads no further than ``limit`` rows."""
        ctx.text(f"{self.table.column(self.link).qualified} = (SELECT p.k FROM ")
        self._render_parent_keys(ctx, self.parent.table.internal_id)
        ctx.text(")")
        self._render_where(ctx)
        ctx.text(f" ORDER BY {order} LIMIT ")
        ctx.limit(limit)

    def _render_numbered(self, ctx: Compiling, order: str, limit: int) -> None:
        """A many's first ``limit`` rows per parent: the ids of all
        matching rows, numbered per parent in order (ROW_NUMBER()), joined
        back to the table up to that number. The numbered ids come first in
        the FROM, so that the planner starts from them: MariaDB, given
        ``_id IN (<numbered ids>)`` instead, scans the whole table."""
        table = self.table
        joins = table.select_from.removeprefix(f"{table.sql_name} {ALIAS}")
        ctx.text(
            f"(SELECT {table.internal_id} AS k, ROW_NUMBER() OVER (PARTITION BY "
            f"{table.column(self.link).qualified} ORDER BY {order}) AS n "
            f"FROM {table.sql_name} {ALIAS} WHERE "
        )
        self._render_matching(ctx)
        ctx.text(
            f") w JOIN {table.sql_name} {ALIAS} ON {table.internal_id} = w.k{joins} WHERE w.n <= "
        )
        ctx.limit(limit)

    def _render_correlated(self, ctx: Compiling, order: str, limit: int) -> None:
        """A many's first ``limit`` rows per parent: each parent's key
        joined to its own rows, those in a correlated ``IN (... LIMIT)``."""
        table = self.table
        joins = table.select_from.removeprefix(f"{table.sql_name} {ALIAS}")
        self._render_parent_keys(ctx, self.parent.table.internal_id)
        ctx.text(
            f" JOIN {table.sql_name} {ALIAS} ON {table.internal_id} IN (SELECT "
            f"{table.internal_id} FROM {table.sql_name} {ALIAS} "
            f"WHERE {table.column(self.link).qualified} = p.k"
        )
        self._render_where(ctx)
        ctx.text(f" ORDER BY {order} LIMIT ")
        ctx.limit(limit)
        ctx.text(f"){joins}")

    def _render_lateral(self, ctx: Compiling, order: str, limit: int) -> None:
        """A many's first ``limit`` rows per parent: for each parent, a
        LIMIT over its own rows (which an index on the reference and order
        columns reads no further than that)."""
        table = self.table
        ctx.text(f"{table.internal_id} IN (SELECT w.k FROM ")
        self._render_parent_keys(ctx, self.parent.table.internal_id)
        ctx.text(
            f" CROSS JOIN LATERAL (SELECT {table.internal_id} AS k FROM {table.sql_name} {ALIAS} "
            f"WHERE {table.column(self.link).qualified} = p.k"
        )
        self._render_where(ctx)
        ctx.text(f" ORDER BY {order} LIMIT ")
        ctx.limit(limit)
        ctx.text(") w)")

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        # Keyed by external id (a RowId hashes as its text), never reused,
        # unlike an internal id (SQLite reuses a deleted row's).
        decoded = list(map(self.table.decode, rows))
        found: dict[str, Any] = {}
        if self.many:
            for row in decoded:  # (in order: each parent's list keeps it)
                found.setdefault(row[self.link], []).append(row)
        else:
            found = {row["id"]: row for row in decoded}
        self._found = found
        self._result = decoded

    def empty(self) -> None:
        self._found = {}
        self._result = []

    def attach(self, parents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Set this join on each of ``parents``: fresh dicts (one per
        occurrence: a row that two parents share is taken by the first and
        copied for the others), which it returns for the joins below it."""
        found = self._found
        taken: set[str] = set()
        attached: list[dict[str, Any]] = []
        for parent in parents:
            if self.many:
                key = parent["id"]
                rows = found.get(key)
                if rows is None:
                    rows = []
                elif key in taken:
                    rows = [dict(row) for row in rows]
                else:
                    taken.add(key)
                parent[self.key] = rows
                attached += rows
            else:
                ref = parent[self.link]
                row = None if ref is None else found.get(ref)
                if row is None:
                    if ref is not None:
                        raise self._moved(ref)
                elif ref in taken:
                    row = dict(row)
                else:
                    taken.add(ref)
                parent[self.key] = row
                if row is not None:
                    attached.append(row)
        return attached

    def _moved(self, ref: Any) -> ConcurrencyConflict:
        """A reference whose row this join's read did not find: the foreign
        key kept the row there while the parent's read saw the reference,
        so the two reads saw different moments — which one snapshot per
        retrieve (:mod:`.snapshot`) rules out. Kept as the last guard: a
        conflict, and the unit runs again; never a None where the row type
        says there is a row."""
        return ConcurrencyConflict(
            f"join {self.key!r}: the {self.table.name} row {str(ref)!r} that a row read by "
            "this find references was gone (or no longer matched) when the join read its "
            "table: a concurrent write came between the two reads"
        )


def _attach(rows: list[dict[str, Any]], joins: list[JoinRead]) -> None:
    for join in joins:
        _attach(join.attach(rows), join.joins)


def _tree_where(
    catalog: Catalog, table: TableInfo, where: Expr | Mapping[str, Any] | None, join: Any
) -> tuple[Expr | None, list[_Node]]:
    nodes, condition = _resolved(catalog, table, join)
    return _both(where_expr(where), condition), nodes


def _resolved(catalog: Catalog, parent: TableInfo, joins: Any) -> tuple[list[_Node], Expr | None]:
    """:func:`_resolve`'s joins on rows of ``parent``, from the parent's
    plans where the tree has a key (:func:`_tree_key`: no ``where`` in it,
    whose values each call binds anew): its nodes hold nothing else that
    varies, and the reads made of them do not change them."""
    shape = _tree_key(joins, 1)
    if shape is None:
        return _resolve(catalog, parent, joins, 1)
    key = ("joins", shape)
    nodes: list[_Node] | None = parent.plans.get(key)
    if nodes is None:
        nodes, condition = _resolve(catalog, parent, joins, 1)
        assert condition is None  # (only a one's where adds one)
        parent.plans[key] = nodes
    return nodes, None


def _tree_key(joins: Any, depth: int) -> tuple[Any, ...] | None:
    """A join tree as a key of its parent's plans: what each join says, or
    None where a join has a ``where``, or anything but plain str and ints
    (exact types, see :func:`.ops.plan_key`), or the tree nests too deep
    (:func:`_resolve` then says what is wrong)."""
    if type(joins) is not dict or depth > MAX_DEPTH:
        return None
    parts: list[tuple[Any, ...]] = []
    for key, spec in joins.items():
        kind = type(spec)
        if type(key) is not str or kind not in (One, Many) or spec.where is not None:
            return None
        below = () if spec.join is None else _tree_key(spec.join, depth + 1)
        if below is None:
            return None
        if kind is One:
            if type(spec.column) is not str:
                return None
            parts.append((key, spec.column, below))
            continue
        order = plan_key(spec.order_by, None)
        limit = spec.limit
        if type(spec.table) is not str or type(spec.by) is not str or order is None:
            return None
        if limit is not None and type(limit) is not int:
            return None
        parts.append((key, spec.table, spec.by, order, limit, below))
    return tuple(parts)


class JoinedFind(_CompiledWhenQueued, Find[Any]):
    """``uow.find(..., join=...)``: a find whose rows carry their joins."""

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        limit: int | None,
        after: str | None,
        join: Joins,
    ) -> None:
        condition, nodes = _tree_where(catalog, table, where, join)
        super().__init__(table, condition, order_by, limit, after)
        self.query = Find.compile(self, catalog)
        self.joins = [JoinRead(catalog, node, self) for node in nodes]

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        super().accept(rows)
        _attach(self.result, self.joins)


class JoinedFindFirst(_CompiledWhenQueued, FindFirst[Any]):
    """``uow.find_first(..., join=...)``: the first row with its joins."""

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        where: Expr | Mapping[str, Any] | None,
        order_by: Any,
        join: Joins,
    ) -> None:
        condition, nodes = _tree_where(catalog, table, where, join)
        super().__init__(table, condition, order_by)
        self.query = FindFirst.compile(self, catalog)
        self.joins = [JoinRead(catalog, node, self) for node in nodes]

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        super().accept(rows)
        row = self.result
        _attach([] if row is None else [row], self.joins)


def check_tree_row(catalog: Catalog, table: TableInfo, joins: Joins, row: type[Any] | None) -> None:
    """Raise :class:`SchemaError` unless ``row`` (if given) is the TypedDict
    of ``table``'s rows with ``joins`` (already resolved): each ``one`` join
    a row type of its table (``| None`` where the reference is nullable and
    the join has no ``where``: the row may be missing), each ``many`` join
    a ``list`` of one. Checked once per catalog, row type and tree shape."""
    if row is None:
        return
    key = (row, table.name, _tree_shape(joins))
    if key not in catalog.checked_row_types:
        _check_row(catalog, table, joins, row)
        catalog.checked_row_types.add(key)


def _tree_shape(joins: Joins) -> Any:
    return tuple(
        (name, "one", spec.column, spec.where is None, _tree_shape(spec.join or {}))
        if isinstance(spec, One)
        else (name, "many", table_name(spec.table), spec.by, _tree_shape(spec.join or {}))
        for name, spec in joins.items()
    )


def _check_row(
    catalog: Catalog, table: TableInfo, joins: Joins, row: Any, within: str = ""
) -> None:
    checks = {name: _join_check(catalog, table, spec) for name, spec in joins.items()}
    check_row_type(row, table.table, checks, within)


def _join_check(catalog: Catalog, parent: TableInfo, spec: Join) -> JoinCheck:
    nested = spec.join or {}

    def check_many(where: str, hint: Any) -> None:
        assert isinstance(spec, Many)
        target = catalog.table(spec.table)
        if get_origin(hint) is not list:
            raise SchemaError(f"{where} is a list of {target.name!r} rows: list[<its row type>]")
        _check_row(catalog, target, nested, get_args(hint)[0], f"{where}: ")

    def check_one(where: str, hint: Any) -> None:
        assert isinstance(spec, One)
        reference = parent.columns[spec.column]
        assert reference.target is not None and reference.column is not None
        hints = members(hint)
        rows = [member for member in hints if member is not type(None)]
        may_be_none = reference.column.nullable and spec.where is None
        if len(rows) != 1 or (may_be_none and len(hints) == 1):
            shape = "<its row type> | None" if may_be_none else "<its row type> (| None)"
            raise SchemaError(f"{where} is a row of {reference.target!r}: {shape}")
        _check_row(catalog, catalog.table(reference.target), nested, rows[0], f"{where}: ")

    return check_many if isinstance(spec, Many) else check_one


def join_reads(op: JoinedFind | JoinedFindFirst) -> list[JoinRead]:
    """The reads a find with joins queues before itself (its rows' accept
    puts their results together)."""
    return [read for join in op.joins for read in join.reads()]
