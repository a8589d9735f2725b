"""A mutation phase as one statement, where the database allows a
data-modifying WITH (PostgreSQL, whose driver sends one statement per round
trip): each operation becomes one part of the WITH, and the statement returns
the rows each one matched — one round trip for the phase's operations instead
of one per operation.

Every part of a WITH sees the snapshot the statement started with, and none
sees the others' changes. So only operations whose outcome cannot depend on
their order are combined: each on a different row, none referring to a row
that another creates, and no deletes (a cascade acts on rows of its own).
Other phases run statement by statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

from ..driver import CompiledQuery, QueryCompiler, QueryResult
from .catalog import Catalog
from .ops import Check, Create, Delete, MutationOp


def combinable(ops: Sequence[MutationOp]) -> bool:
    """Whether ``ops`` give the same result run as one statement."""
    if len(ops) < 2:
        return False
    touched: set[tuple[str, str]] = set()
    created: set[str] = set()
    for op in ops:
        if isinstance(op, Delete):
            return False
        row = (op.table.name, str(op.target))
        if row in touched:
            return False
        touched.add(row)
        if isinstance(op, Create):
            created.add(row[1])
    return not created or not any(_refers_to(op, created) for op in ops)


def _refers_to(op: MutationOp, rows: set[str]) -> bool:
    # A row created in this unit is found by its external id, which a part of
    # the same WITH cannot see yet.
    values = getattr(op, "values", None) or {}
    columns = op.table.columns
    return any(
        columns[name].target is not None and value is not None and str(value) in rows
        for name, value in values.items()
    )


def combine(catalog: Catalog, ops: Sequence[MutationOp]) -> CompiledQuery:
    """The one statement running ``ops`` (see :func:`combinable`); its text is
    cached by the operations' texts."""
    key = ("combined", *(op.query.sql for op in ops))
    text = catalog.sql_cache.get(key)
    if text is None:
        text = catalog.sql_cache[key] = _combined_sql(catalog.compiler, ops)
    return CompiledQuery(text, tuple(chain.from_iterable(op.query.parameters for op in ops)))


def _combined_sql(compiler: QueryCompiler, ops: Sequence[MutationOp]) -> str:
    parts: list[str] = []
    counts: list[str] = []
    offset = 0
    for index, op in enumerate(ops):
        statement = compiler.shift_placeholders(op.query.sql, offset)
        offset += len(op.query.parameters)
        # A check is a SELECT of the row already; a write returns one row per
        # row it changed.
        returning = "" if isinstance(op, Check) else " RETURNING 1"
        parts.append(f"q{index} AS ({statement}{returning})")
        counts.append(f"(SELECT count(*) FROM q{index}) AS n{index}")
    return f"WITH {', '.join(parts)} SELECT {', '.join(counts)}"


def split(ops: Sequence[MutationOp], result: QueryResult) -> list[QueryResult]:
    """Each operation's result (the rows it matched) from the combined
    statement's one row."""
    row = result.rows[0]
    return [QueryResult([], int(row[f"n{index}"])) for index in range(len(ops))]
