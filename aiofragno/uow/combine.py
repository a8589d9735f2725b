"""A mutation phase as one statement, where the database allows a
data-modifying WITH (PostgreSQL, whose driver sends one statement per round
trip): each operation becomes one part of the WITH, and the statement returns
the rows each one matched — one round trip for the phase's operations instead
of one per operation.

Every part of a WITH sees the snapshot the statement started with, and none
sees the others' changes. So only operations whose outcome cannot depend on
their order are combined: each on a different row, none referring to a row
that another creates, and no deletes. A phase is cut into such runs
(:func:`groups`), each one statement of bounded size, run in order.

With the outbox on, the statement can also carry the unit's outbox entry and
run outside any transaction, committing on its own (:func:`combine_committing`):
a stale checked operation then has to abort the statement itself, which
:data:`STALE` marks in the database's error message.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

from ..driver import CompiledQuery, QueryCompiler, QueryResult
from .catalog import Catalog
from .ops import Check, Create, Delete, MutationOp
from .stale import STALE

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
    return len(groups(ops)) == 1 and not any(isinstance(op, Delete) for op in ops)


def groups(ops: Sequence[MutationOp]) -> list[Sequence[MutationOp]]:
    """``ops`` cut, in order, into runs that each give the same result run as
    one statement: a run ends before an operation on a row it already
    touches or that looks up a row it creates, and when it is full; a
    delete runs alone. Run one after the other, the runs give the same
    result as the operations one by one, in far fewer statements."""
    runs: list[Sequence[MutationOp]] = []
    run: list[MutationOp] = []
    touched: set[tuple[str, str]] = set()
    created: set[str] = set()
    parameters = 0
    for op in ops:
        row = (op.table.name, str(op.target))
        size = len(op.query.parameters)
        if run and (
            isinstance(op, Delete)
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
        if isinstance(op, Create):
            created.add(row[1])
        elif isinstance(op, Delete):
            runs.append(run)
            run, touched, created, parameters = [], set(), set(), 0
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
        parts, _ = _parts(catalog.compiler, ops)
        counts = (f"(SELECT count(*) FROM q{index}) AS n{index}" for index in range(len(ops)))
        text = catalog.sql_cache[key] = f"WITH {', '.join(parts)} SELECT {', '.join(counts)}"
    return CompiledQuery(text, tuple(chain.from_iterable(parameters)))


def combine_committing(
    catalog: Catalog, ops: Sequence[MutationOp], entry: CompiledQuery, stamp: str, abort: str
) -> CompiledQuery:
    """The one statement running ``ops`` and writing the outbox ``entry``
    (parts of a WITH; ``stamp`` selects the entry's versionstamp from them),
    to be run outside a transaction. A checked operation that matches no row
    aborts it through ``abort`` (``{message}``: an SQL text expression, which
    will name :data:`~aiofragno.uow.stale.STALE` and the operation's index).
    So does any other operation that must match a row (an update or delete)
    and matches none."""
    texts, parameters = zip(*map(_QUERY, ops), strict=True)
    key = ("committing", *texts)
    text = catalog.sql_cache.get(key)
    if text is None:
        compiler = catalog.compiler
        parts, offset = _parts(compiler, ops)
        parts.append(compiler.shift_placeholders(entry.sql, offset))
        counts = [_guarded_count(op, index, abort) for index, op in enumerate(ops)]
        text = f"WITH {', '.join(parts)} SELECT {', '.join(counts)}, {stamp} AS stamp"
        catalog.sql_cache[key] = text
    bound = (*chain.from_iterable(parameters), *entry.parameters)
    return CompiledQuery(text, bound)


def _guarded_count(op: MutationOp, index: int, abort: str) -> str:
    count = f"(SELECT count(*) FROM q{index}) AS n{index}"
    if not op.must_match:
        return count
    # The message has the count in it, so it is not a constant that the
    # planner would evaluate (and fail on) whatever the count turns out to be.
    message = f"'{STALE}{index}:' || count(*)"
    failed = abort.format(message=message)
    return (
        f"(SELECT CASE count(*) WHEN 0 THEN {failed} ELSE count(*) END FROM q{index}) AS n{index}"
    )


def _parts(compiler: QueryCompiler, ops: Sequence[MutationOp]) -> tuple[list[str], int]:
    """The WITH parts q0, q1, ... running ``ops``, and how many parameters
    they take."""
    parts: list[str] = []
    offset = 0
    for index, op in enumerate(ops):
        statement = compiler.shift_placeholders(op.query.sql, offset)
        offset += len(op.query.parameters)
        # A check is a SELECT of the row already; a write returns one row per
        # row it changed.
        returning = "" if isinstance(op, Check) else " RETURNING 1"
        parts.append(f"q{index} AS ({statement}{returning})")
    return parts, offset


def split(ops: Sequence[MutationOp], result: QueryResult) -> list[QueryResult]:
    """Each operation's result (the rows it matched) from the combined
    statement's one row, whose columns are the counts in operation order."""
    return [QueryResult([], int(count)) for count in result.rows[0].values()]
