"""Stopping a mutation phase at a stale operation on the server, so that its
writes, their checks and COMMIT need not wait for us in between.

Where the database aborts the phase itself — a failing expression in
PostgreSQL's one committing statement (``CommitPlanChoice.abort_sql``), a guard
statement after each checked operation in MySQL's one batch
(``CommitPlanChoice.stale_guard``) — the error's message carries :data:`STALE`
and the operation's index, which :func:`stale_index` reads back.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from ..driver import CompiledQuery, QueryResult, StaleGuard
from .ops import MutationOp

STALE = "aiofragno-stale-operation:"
_STALE_INDEX = re.compile(re.escape(STALE) + r"(\d+)")


def stale_index(message: str) -> int | None:
    """The index of the operation that aborted a phase, from the error's
    message; None if the error is another one."""
    found = _STALE_INDEX.search(message)
    return None if found is None else int(found.group(1))


def guarded(ops: Sequence[MutationOp], guard: StaleGuard) -> list[CompiledQuery]:
    """``ops``' statements, each one that must match a row followed by its
    guard: run as one batch, the batch ends at the first operation that
    matched no row."""
    queries: list[CompiledQuery] = []
    for index, op in enumerate(ops):
        queries.append(op.query)
        if op.must_match:
            queries.append(_guard(guard, op.is_read, index))
    return queries


def take_results(ops: Sequence[MutationOp], results: Sequence[QueryResult]) -> None:
    """Hand each operation that wants it its result, from the results of
    :func:`guarded`'s statements (a guard's come after its operation's)."""
    position = 0
    for op in ops:
        if op.wants_result:
            op.take(results[position])
        position += 2 if op.must_match else 1


@functools.lru_cache(maxsize=256)
def _guard(guard: StaleGuard, after_read: bool, index: int) -> CompiledQuery:
    template = guard.after_read if after_read else guard.after_write
    return CompiledQuery(template.format(message=f"'{STALE}{index}'"))
