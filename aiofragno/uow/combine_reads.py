"""A retrieval phase as one statement, where the dialect can return a read's
rows as one value (PostgreSQL, whose driver sends one statement per round
trip): the statement has one column per read — its rows as an array of row
values, or its count — so the phase costs one round trip instead of one per
read.

Reads have no effects and all see the statement's one snapshot, so any reads
combine; each keeps its own ORDER BY and LIMIT inside its array.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from ..driver import CompiledQuery, QueryResult
from ..sqltext import SqlText
from .aggregates import Aggregate
from .catalog import Catalog
from .ops import Count, ReadRows, RetrievalOp, statement_text


def combine_reads(
    catalog: Catalog, ops: Sequence[RetrievalOp[object]], queries: Sequence[CompiledQuery]
) -> CompiledQuery | None:
    """The one statement running the reads ``ops`` (compiled as ``queries``),
    or None where they go as a batch (a single read, or a dialect without
    arrays of rows). Its text is cached by the reads' texts."""
    template = catalog.adapter.sql.rows_array
    if template is None or len(ops) < 2:
        return None
    texts, parameters = zip(*queries, strict=True)  # (each a (sql, parameters) tuple)
    if sum(map(len, parameters)) > catalog.adapter.capabilities.max_parameters:
        return None  # (too many for one statement: each read goes on its own)
    key = ("reads", *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        text = catalog.compiler.render(_combined(catalog, template, ops))
        catalog.sql_cache[key] = text
    return CompiledQuery(text, tuple(chain.from_iterable(parameters)))


def _combined(catalog: Catalog, template: str, ops: Sequence[RetrievalOp[object]]) -> SqlText:
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


def split_reads(
    ops: Sequence[RetrievalOp[object]], result: QueryResult
) -> list[list[Sequence[Any]]]:
    """Each read's rows (value sequences) from the combined statement's one row."""
    values = result.rows[0].raw
    return [
        [(values[index],)] if isinstance(op, Count) else list(values[index])
        for index, op in enumerate(ops)
    ]
