"""A retrieval phase as one statement, where the database allows, instead of
a batch: one statement reads one snapshot by itself, so it needs no
snapshot transaction around it, and costs one round trip.

* Arrays of rows (PostgreSQL, whose driver sends one statement per round
  trip): the statement has one column per read — its rows as an array of
  row values, or its count.
* A UNION ALL (MySQL, MariaDB, whose driver sends a batch in one round
  trip, but a batch of several reads needs a snapshot transaction, three
  statements more): one part per read, each in columns of its own (NULL in
  the others' columns, so that no column mixes two reads' types), after the
  read's number. The parts keep their own ORDER BY and LIMIT, which choose
  their rows; what orders the result is the statement's own ORDER BY: the
  read's number, then each read's order on its own columns (the others'
  are NULL in its rows). Every part has every read's columns, the result
  goes through a temporary table, and its sort key holds every read's
  order: so only a few reads of a few rows and columns unite (the limits
  below); more go as the batch, whose cost grows with them only linearly.

Reads have no effects and all see the statement's one snapshot, so any reads
combine (a union: reads of rows and counts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, NamedTuple

from ..driver import CompiledQuery, QueryResult
from ..schema import INTERNAL_ID
from ..sqltext import SqlText
from .aggregates import Aggregate
from .catalog import Catalog
from .joins import JoinRead
from .ops import Count, ReadRows, RetrievalOp, statement_text

Rows = list[list[Sequence[Any]]]  # each read's rows, as value sequences

# What a UNION ALL of reads may hold at most: reads, columns in all, order
# columns in all (each up to 1,020 sort bytes in a key), and rows.
MAX_UNITED_READS = 6
MAX_UNITED_COLUMNS = 64
MAX_UNITED_ORDER = 8
MAX_UNITED_ROWS = 500


class Combined(NamedTuple):
    """The one statement of a phase's reads, and what splits its result
    into each read's rows."""

    query: CompiledQuery
    split: Callable[[QueryResult], Rows]


def combine_reads(
    catalog: Catalog, ops: Sequence[RetrievalOp[object]], queries: Sequence[CompiledQuery]
) -> Combined | None:
    """The one statement running the reads ``ops`` (compiled as ``queries``),
    or None where they go as a batch (a single read; reads too many or of a
    kind the database cannot combine). Its text is cached by the reads' texts."""
    if len(ops) < 2:
        return None
    texts, parameters = zip(*queries, strict=True)  # (each a (sql, parameters) tuple)
    if sum(map(len, parameters)) > catalog.adapter.capabilities.max_parameters:
        return None  # (too many for one statement: each read goes on its own)
    template = catalog.adapter.sql.rows_array
    if template is not None:
        render: Callable[[], SqlText] = lambda: _arrays(catalog, template, ops)  # noqa: E731
        split = _arrays_split
    elif catalog.adapter.capabilities.unites_reads and _unite(ops):
        render, split = (lambda: _union(catalog, ops)), _union_split
    else:
        return None
    key = ("reads", template is not None, *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        text = catalog.sql_cache[key] = catalog.compiler.render(render())
    return Combined(
        CompiledQuery(text, tuple(chain.from_iterable(parameters))),
        lambda result: split(ops, result),
    )


def _arrays(catalog: Catalog, template: str, ops: Sequence[RetrievalOp[object]]) -> SqlText:
    """The statement with one column per read, joined from the reads' texts
    (rendered again for it, on this cache miss only)."""
    columns: list[SqlText] = []
    for index, op in enumerate(ops):
        if isinstance(op, ReadRows | Aggregate):  # its rows as one value
            rest = statement_text(catalog, op.table, op.render_from)
            read = SqlText.fill(template, columns=op.select_columns, rest=rest)
        else:  # a count
            read = "(" + statement_text(catalog, op.table, op.render) + ")"
        columns.append(read + f" AS r{index}")
    return "SELECT " + SqlText.join(columns)


def _arrays_split(ops: Sequence[RetrievalOp[object]], result: QueryResult) -> Rows:
    """Each read's rows from the combined statement's one row."""
    values = result.rows[0].raw
    return [
        [(values[index],)] if isinstance(op, Count) else list(values[index])
        for index, op in enumerate(ops)
    ]


def _unite(ops: Sequence[RetrievalOp[object]]) -> bool:
    """Whether ``ops`` go as a union: counts and reads of rows (not made
    from their parent's rows, selecting what they are ordered by), within
    the limits of a union's size."""
    if len(ops) > MAX_UNITED_READS:
        return False
    columns = order = rows = 0
    for op in ops:
        if isinstance(op, Count):
            columns, rows = columns + 1, rows + 1
            continue
        if not isinstance(op, ReadRows) or op.runs_after_parent:
            return False
        positions, bound = _order_positions(op), _row_bound(op)
        if positions is None or bound is None:
            return False
        columns, order, rows = columns + len(op.select_list), order + len(positions), rows + bound
    return columns <= MAX_UNITED_COLUMNS and order <= MAX_UNITED_ORDER and rows <= MAX_UNITED_ROWS


def _row_bound(op: RetrievalOp[object]) -> int | None:
    """The most rows ``op`` reads (None: no bound): a page's limit and the
    one more row that tells of another page; a join's, per parent row."""
    if isinstance(op, JoinRead):
        parent = _row_bound(op.parent)
        if parent is None or not op.many:
            return parent
        return None if op.per_parent is None else parent * op.per_parent
    if isinstance(op, ReadRows):
        return None if op.limit is None else op.limit + 1
    return 1


def _order_positions(op: ReadRows[Any]) -> list[tuple[int, bool]] | None:
    """Where in its select list each column of ``op``'s order is, and its
    direction; None if one is not there (an order by a column a ``select``
    leaves out, on a read without a limit)."""
    table, columns = op.table, op.select_list
    positions = []
    for name, desc in op.statement_order():
        expression = table.internal_id if name == INTERNAL_ID else table.column(name).qualified
        if expression not in columns:
            return None
        positions.append((columns.index(expression), desc))
    return positions


def _width(op: RetrievalOp[object]) -> int:
    return len(op.select_list) if isinstance(op, ReadRows) else 1


def _union(catalog: Catalog, ops: Sequence[RetrievalOp[object]]) -> SqlText:
    """``(SELECT 0 AS q, <read 0's columns>, NULL, .. FROM ..) UNION ALL
    (SELECT 1, NULL, .., <read 1's columns> ..) .. ORDER BY q, <each read's
    order on its columns>``, the columns named c0, c1, .. in the first part."""
    widths = [_width(op) for op in ops]
    total = sum(widths)
    parts: list[SqlText] = []
    order = ["q"]
    start = 0
    for number, (op, width) in enumerate(zip(ops, widths, strict=True)):
        columns: list[SqlText | str] = ["NULL"] * start
        columns += [*_columns(op, catalog), *["NULL"] * (total - start - width)]
        if number == 0:  # (the union's columns take the first part's names)
            columns = [column + f" AS c{i}" for i, column in enumerate(columns)]
        select = f"SELECT {number}{' AS q' if number == 0 else ''}, " + SqlText.join(columns)
        if isinstance(op, ReadRows):
            rest = statement_text(catalog, op.table, op.render_from)
            parts.append("(" + select + " FROM " + rest + ")")
            order += _order_terms(op, start)
        else:
            parts.append(select)
        start += width
    return SqlText.join(parts, " UNION ALL ") + f" ORDER BY {', '.join(order)}"


def _columns(op: RetrievalOp[object], catalog: Catalog) -> list[SqlText | str]:
    """What ``op``'s part selects in its own columns."""
    if isinstance(op, ReadRows):
        return list(op.select_list)
    return ["(" + statement_text(catalog, op.table, op.render) + ")"]


def _order_terms(op: ReadRows[Any], start: int) -> list[str]:
    """``op``'s order (as its statement sorts) on its columns, which start
    at column ``c<start>``."""
    positions = _order_positions(op)
    assert positions is not None  # (else it is no part of a union: _unite)
    return [f"c{start + i}{' DESC' if desc else ''}" for i, desc in positions]


def _union_split(ops: Sequence[RetrievalOp[object]], result: QueryResult) -> Rows:
    """Each read's rows from the union's rows: those with its number, its
    columns."""
    rows: Rows = [[] for _ in ops]
    bounds = []
    start = 1  # (after the read's number)
    for op in ops:
        width = _width(op)
        bounds.append((start, start + width))
        start += width
    for row in result.rows:
        values = row.raw
        number = values[0]
        begin, end = bounds[number]
        rows[number].append(values[begin:end])
    return rows
