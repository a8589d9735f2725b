"""What an attempt's failure means for its unit of work: a conflict (run it
again), a connection lost before COMMIT (run it again once reconnected), a
lost COMMIT (ambiguous: settle it by the unit's record), a duplicate key
(maybe the unit's own idempotency key), or an error that ends the unit.

Kept apart from the retry loop (:func:`.executor.execute_uow`) that acts on
it and from the commit plans (:mod:`.plans`) that raise it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from ..driver import QueryResult
from ..errors import (
    CommitOutcomeUnknown,
    ConcurrencyConflict,
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    TransactionConflict,
    UniqueViolation,
)
from .ops import MutationOp
from .stale import stale_index


class PhaseConflict(Exception):
    """A checked operation matched no row."""


class Outcome(enum.Enum):
    CONFLICT = "conflict"
    LOST_BEFORE_COMMIT = "lost before commit"
    AMBIGUOUS = "commit outcome unknown"
    DUPLICATE_KEY = "duplicate key"
    ERROR = "error"


def classify(exc: Exception) -> Outcome:
    """What ``exc``, raised by an attempt, makes of it."""
    if isinstance(exc, (PhaseConflict, TransactionConflict, ConcurrencyConflict)):
        return Outcome.CONFLICT
    # (Before ConnectionLost, which it is a kind of.)
    if isinstance(exc, CommitOutcomeUnknown):
        return Outcome.AMBIGUOUS
    if isinstance(exc, (ConnectionLost, DatabaseUnavailable)):
        return Outcome.LOST_BEFORE_COMMIT
    if isinstance(exc, UniqueViolation):
        return Outcome.DUPLICATE_KEY
    return Outcome.ERROR


def mismatch(op: MutationOp) -> Exception:
    """What an operation that matched no row makes of the phase: a conflict
    if the unit had seen the row, else the operation's own error
    (:meth:`MutationOp.missing <.ops.MutationOp.missing>`:
    :class:`~aiofragno.RowNotFound`, or a unique violation for an upsert's
    read-back)."""
    return PhaseConflict(op.stale()) if op.seen else op.missing()


def check(ops: Sequence[MutationOp], results: Sequence[QueryResult]) -> None:
    """Raise the conflict of the first operation that matched no row; hand
    the others that want it their result."""
    for op, result in zip(ops, results, strict=False):  # (a batch may stop early)
        if op.conflicted(result):
            raise mismatch(op)
        if op.wants_result:
            op.take(result)


def stale_conflict(ops: Sequence[MutationOp], exc: DataError) -> Exception | None:
    """The conflict of the operation whose stale check the database aborted
    with ``exc`` (:mod:`.stale`), or None if ``exc`` is another error."""
    index = stale_index(str(exc))
    return None if index is None else mismatch(ops[index])
