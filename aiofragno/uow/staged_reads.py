"""A retrieve's reads in two steps, where some need the rows of others.

A join's first rows per parent (``af.many(..., limit=n)``), on a database
that can limit rows per parent in no single statement (MariaDB, MySQL: no
LATERAL, no LIMIT in ``IN (...)``), is read by key under a find with a small
page (see :mod:`.joins`): one statement per parent, made once the page's
rows are in. The other reads go first; those run in a second batch of the
same snapshot (:mod:`.snapshot`), and each read's rows come back in the
order the reads were queued, as from one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..driver import CompiledQuery, QueryResult
from .joins import JoinRead
from .ops import RetrievalOp


class StagedReads:
    """``reads`` (compiled as ``queries``; some run after their parent)
    split into :attr:`first`, the statements of the first batch, and
    :meth:`then`, which makes the second from the first's results."""

    def __init__(
        self,
        reads: Sequence[RetrievalOp[object]],
        queries: Sequence[CompiledQuery],
        on_query: Callable[[CompiledQuery], Any] | None,
    ) -> None:
        self._reads = reads
        self._later = [op for op in reads if isinstance(op, JoinRead) and op.runs_after_parent]
        self._first_ops = [op for op in reads if not op.runs_after_parent]
        self.first = [
            query for op, query in zip(reads, queries, strict=True) if not op.runs_after_parent
        ]
        # (Told once, as the first batch's statements are: not again when
        # the reads run again on a new connection.)
        self._on_query = on_query
        self._counts: list[int] = []  # per later read, its statements in the second batch

    def then(self, results: list[QueryResult]) -> list[CompiledQuery]:
        rows = {id(op): result.rows for op, result in zip(self._first_ops, results, strict=True)}
        queries: list[CompiledQuery] = []
        self._counts = []  # (anew each time: a read run again on a new connection)
        for op in self._later:
            keyed = op.by_keys([row.raw for row in rows[id(op.parent)]])
            self._counts.append(len(keyed))
            queries += keyed
        if self._on_query is not None:
            tell, self._on_query = self._on_query, None
            for query in queries:
                tell(query)
        return queries

    def rows(self, results: Sequence[QueryResult]) -> list[list[Sequence[Any]]]:
        """Each read's row values, in the order of ``reads``, from the
        results of both batches."""
        first = iter(results[: len(self.first)])
        second = iter(results[len(self.first) :])
        later = {
            id(op): [row.raw for _ in range(count) for row in next(second).rows]
            for op, count in zip(self._later, self._counts, strict=True)
        }
        return [
            later[id(op)] if op.runs_after_parent else [row.raw for row in next(first).rows]
            for op in self._reads
        ]
