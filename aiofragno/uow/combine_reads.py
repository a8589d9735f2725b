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
from .catalog import Catalog
from .ops import Count, RetrievalOp


def combine_reads(
    catalog: Catalog, ops: Sequence[RetrievalOp[object]], queries: Sequence[CompiledQuery]
) -> CompiledQuery | None:
    """The one statement running the reads ``ops`` (compiled as ``queries``),
    or None where they go as a batch (a single read, or a dialect without
    arrays of rows). Its text is cached by the reads' texts."""
    template = catalog.adapter.rows_array_sql
    if template is None or len(ops) < 2:
        return None
    texts, parameters = zip(*queries, strict=True)  # (each a (sql, parameters) tuple)
    key = ("reads", *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        text = catalog.sql_cache[key] = _combined_sql(catalog, template, ops, queries)
    return CompiledQuery(text, tuple(chain.from_iterable(parameters)))


def _combined_sql(
    catalog: Catalog,
    template: str,
    ops: Sequence[RetrievalOp[object]],
    queries: Sequence[CompiledQuery],
) -> str:
    parts: list[str] = []
    offset = 0
    for index, (op, query) in enumerate(zip(ops, queries, strict=True)):
        text = catalog.compiler.shift_placeholders(query.sql, offset)
        offset += len(query.parameters)
        if isinstance(op, Count):
            part = f"({text})"
        else:  # a find: the table's SELECT of whole rows, then its conditions
            columns = op.table.select_columns
            head = f"SELECT {columns} FROM "
            assert text.startswith(head), text
            part = template.format(columns=columns, rest=text[len(head) :])
        parts.append(f"{part} AS r{index}")
    return f"SELECT {', '.join(parts)}"


def split_reads(
    ops: Sequence[RetrievalOp[object]], result: QueryResult
) -> list[list[Sequence[Any]]]:
    """Each read's rows (value sequences) from the combined statement's one row."""
    values = result.rows[0]._values
    return [
        [(values[index],)] if isinstance(op, Count) else list(values[index])
        for index, op in enumerate(ops)
    ]
