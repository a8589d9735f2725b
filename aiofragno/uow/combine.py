"""A mutation phase as one statement, where the database allows a
data-modifying WITH (PostgreSQL, whose driver sends one statement per round
trip): each operation becomes one part of the WITH, and the statement returns
the rows each one matched — one round trip for the phase's operations instead
of one per operation.

Every part of a WITH sees the snapshot the statement started with, and none
sees the others' changes. So only operations whose outcome cannot depend on
their order are combined: each on a different row, none referring to a row
that another creates, and no deletes; upserts only with upserts by other
keys of the same unique index (:func:`~.upsert.gathers`), the statement then
returning each one's row. A phase is cut into such runs (:func:`groups`),
each one statement of bounded size, run in order.

With the outbox on, the statement can also carry the unit's outbox entry and
run outside any transaction, committing on its own (:func:`combine_committing`):
a stale checked operation then has to abort the statement itself, which
:data:`STALE` marks in the database's error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter
from typing import Any

from ..driver import CompiledQuery, QueryResult, Row, column_index
from ..sqltext import SqlText
from .catalog import Catalog
from .ops import Create, MutationOp, statement_text
from .stale import STALE
from .upsert import gathers

# (map() with it, and zip(), build a statement's key and parameters without
# a generator's frame: this runs for every unit of work.)
_QUERY = attrgetter("query")


# How big one statement may grow: PostgreSQL allows at most 1,664 columns in
# its select list (one count per operation, plus the versionstamp) and 32,767
# parameters per statement.
MAX_PARTS = 50
MAX_PARAMETERS = 30_000


def combinable(ops: Sequence[MutationOp]) -> bool:
    """Whether ``ops`` give the same result run as one statement (and fit in one)."""
    return len(groups(ops)) == 1 and not any(op.runs_alone for op in ops)


def groups(ops: Sequence[MutationOp]) -> list[Sequence[MutationOp]]:
    """``ops`` cut, in order, into runs that each give the same result run as
    one statement: a run ends before an operation on a row it already
    touches or that looks up a row it creates, and when it is full; a
    delete runs alone, an upsert alone or with upserts it
    :func:`~.upsert.gathers` with. Run one after the other, the runs give
    the same result as the operations one by one, in far fewer statements."""
    runs: list[Sequence[MutationOp]] = []
    run: list[MutationOp] = []
    touched: set[tuple[str, str]] = set()
    created: set[str] = set()
    parameters = 0
    for op in ops:
        row = (op.table.name, str(op.target))
        size = len(op.query.parameters)
        if run and (
            ((op.runs_alone or run[-1].runs_alone) and not gathers(run, op))
            or row in touched
            or any(ref in created for ref in op.lookups)
            or len(run) == MAX_PARTS
            or parameters + size > MAX_PARAMETERS
        ):
            runs.append(run)
            run, touched, created, parameters = [], set(), set(), 0
        run.append(op)
        touched.add(row)
        parameters += size
        if isinstance(op, Create) or op.returns:  # (an upsert may create its row)
            created.add(row[1])
    if run:
        runs.append(run)
    return runs


def combine(catalog: Catalog, ops: Sequence[MutationOp]) -> CompiledQuery:
    """The one statement running ``ops`` (see :func:`combinable`) inside the
    open transaction; its text is cached by the operations' texts."""
    texts, parameters = zip(*map(_QUERY, ops), strict=True)
    key = ("combined", *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        statement = "WITH " + SqlText.join(_parts(catalog, ops)) + " SELECT " + _results(ops)
        text = catalog.sql_cache[key] = catalog.compiler.render(statement)
    return CompiledQuery(text, tuple(chain.from_iterable(parameters)))


def _results(ops: Sequence[MutationOp]) -> str:
    """What the combined statement selects: the rows each operation matched
    (counts), or for operations that return their row (upserts, which
    always return one), those rows' columns side by side."""
    if ops[0].returns:
        parts = [f"q{index}" for index in range(len(ops))]
        return ", ".join(f"{part}.*" for part in parts) + " FROM " + ", ".join(parts)
    return ", ".join(f"(SELECT count(*) FROM q{index}) AS n{index}" for index in range(len(ops)))


def combine_committing(
    catalog: Catalog,
    ops: Sequence[MutationOp],
    entry: tuple[SqlText, tuple[Any, ...]],
    stamp: SqlText,
    abort: str,
) -> CompiledQuery:
    """The one statement running ``ops`` and writing the outbox ``entry``
    (parts of a WITH, and their parameters; ``stamp`` selects the entry's
    versionstamp from them), to be run outside a transaction. A checked
    operation that matches no row aborts it through ``abort`` (``{message}``:
    an SQL text expression, which will name
    :data:`~aiofragno.uow.stale.STALE` and the operation's index). So does
    any other operation that must match a row (an update or delete) and
    matches none."""
    texts, parameters = zip(*map(_QUERY, ops), strict=True)
    entry_text, entry_parameters = entry
    key = ("committing", *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        parts = SqlText.join([*_parts(catalog, ops), entry_text])
        counts = SqlText.join([*(_guarded_count(op, i, abort) for i, op in enumerate(ops)), stamp])
        statement = "WITH " + parts + " SELECT " + counts + " AS stamp"
        text = catalog.sql_cache[key] = catalog.compiler.render(statement)
    bound = (*chain.from_iterable(parameters), *entry_parameters)
    return CompiledQuery(text, bound)


def _guarded_count(op: MutationOp, index: int, abort: str) -> SqlText | str:
    count = f"(SELECT count(*) FROM q{index}) AS n{index}"
    if not op.must_match:
        return count
    # The message has the count in it, so it is not a constant that the
    # planner would evaluate (and fail on) whatever the count turns out to be.
    failed = SqlText.fill(abort, message=f"'{STALE}{index}:' || count(*)")
    return (
        "(SELECT CASE count(*) WHEN 0 THEN "
        + failed
        + f" ELSE count(*) END FROM q{index}) AS n{index}"
    )


def _parts(catalog: Catalog, ops: Sequence[MutationOp]) -> list[SqlText]:
    """The WITH parts q0, q1, ... running ``ops``, their slots in the order
    of the operations' parameters (texts rendered again for them, on a
    cache miss only)."""
    parts: list[SqlText] = []
    for index, op in enumerate(ops):
        statement = statement_text(catalog, op.table, op.render)
        # A check is a SELECT of the row already, an upsert returns its row;
        # another write returns one row per row it changed.
        returning = "" if op.is_read or op.returns else " RETURNING 1"
        parts.append(f"q{index} AS (" + statement + f"{returning})")
    return parts


def split(ops: Sequence[MutationOp], result: QueryResult) -> list[QueryResult]:
    """Each operation's result from the combined statement's one row, whose
    columns are the counts of the rows each matched, in operation order
    (or, see :func:`_results`, each one's returned row)."""
    row = result.rows[0]
    width = ops[0].returns
    if not width:
        return [QueryResult([], int(count)) for count in row.values()]
    values = tuple(row.raw)
    index = column_index(tuple(row)[:width])  # (the names repeat from part to part)
    return [
        QueryResult([Row(index, values[start : start + width])], 1)
        for start in range(0, len(values), width)
    ]
