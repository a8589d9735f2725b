"""How a unit of work's mutation phase reaches COMMIT: one plan per way,
chosen once per engine from its dialect (:func:`choose`).

Every plan takes the phase (:class:`Phase`: the session, the operations,
the unit's record ``entry`` — its outbox entry or its idempotency key — and
the outbox entry's values) and commits it, all of it or nothing, or raises:
a stale operation as :class:`~.outcomes.PhaseConflict` (or
:class:`~aiofragno.RowNotFound`), anything else as the session raised it
(:mod:`.outcomes` tells what each means for the unit). They differ in how
the operations, their checks and COMMIT share round trips:

- :class:`StatementsThenCommit`: the operations (runs of them combined into
  one statement each where the database allows a writable WITH), checked
  here, then the entry with COMMIT.
- :class:`CheckedInProcess`: the operations, their checks, the entry and
  COMMIT in one call, where the engine runs in this process (SQLite).
- :class:`GuardedBatch`: each checked operation followed by a statement that
  stops the batch on the server if it matched no row, then the entry and
  COMMIT, all as one batch (MySQL).
- :class:`OneCommittingStatement`: with the outbox on, the operations and
  the entry as one statement committing on its own, which a stale operation
  aborts (PostgreSQL).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .. import runtime
from ..driver import CompiledQuery, DialectAdapter, IsolationLevel, QueryResult, StaleGuard
from ..errors import DataError, IntegrityError, ProgrammingError
from ..outbox.writer import EntryStatements
from ..session import Session
from ..url import OutboxStrategy
from .catalog import Catalog
from .combine import combinable, combine, combine_committing, groups, split
from .ops import MutationOp
from .outcomes import check, stale_conflict
from .stale import guarded, take_results

# Isolation levels whose transactions read one snapshot throughout.
_SNAPSHOT_LEVELS = frozenset({"repeatable read", "serializable"})


@dataclass(slots=True)
class Phase:
    """One mutation phase to commit. ``entry``: the unit's record, last in
    its transaction (empty if it leaves none); ``values`` and ``statements``:
    its outbox entry's values and statements, None without the outbox."""

    session: Session
    catalog: Catalog
    ops: Sequence[MutationOp]
    entry: Sequence[CompiledQuery]
    isolation: IsolationLevel | None
    values: dict[str, Any] | None
    statements: EntryStatements | None
    # The record bound once the operations ran (then by :func:`resolving`'s
    # plan only): an entry that describes upserts by their results.
    late_entry: Callable[[], Sequence[CompiledQuery]] | None = None


class CommitPlan(Protocol):
    async def commit(self, phase: Phase) -> str | None:
        """Commit ``phase``; its outbox entry's versionstamp (None without
        the outbox, or where the driver did not report it)."""
        ...


class _InTransaction(ABC):
    """A plan that runs the phase in an explicit transaction, rolled back
    if anything fails before COMMIT. ``snapshot_lock``: see :meth:`begin`."""

    __slots__ = ("snapshot_lock",)

    def __init__(self, snapshot_lock: str | None) -> None:
        self.snapshot_lock = snapshot_lock

    async def commit(self, phase: Phase) -> str | None:
        session = phase.session
        try:
            await self.begin(phase)
            written = await self.write_and_commit(phase)
        except BaseException:
            await _rollback(session)
            raise
        statements = phase.statements
        return None if statements is None else statements.versionstamp(written)

    @abstractmethod
    async def write_and_commit(self, phase: Phase) -> list[QueryResult]:
        """The operations, then the entry and COMMIT; the entry's results."""

    async def begin(self, phase: Phase) -> None:
        """Open the phase's transaction. With the counter's outbox (the
        plan's ``snapshot_lock``; none under ticks), at a snapshot
        isolation level, first wait for the outbox counter, before any
        statement takes the snapshot
        (:attr:`SqlSnippets.outbox_snapshot_lock
        <aiofragno.driver.SqlSnippets.outbox_snapshot_lock>`): the reservation
        then reads the counter's newest version instead of failing on every
        outbox unit that committed meanwhile. Such units run one at a time
        with the other outbox writers for their whole phase."""
        isolation = phase.isolation
        await phase.session.begin(isolation)
        lock = self.snapshot_lock
        if phase.values is not None and lock is not None and isolation in _SNAPSHOT_LEVELS:
            await phase.session.execute(CompiledQuery(lock))


class StatementsThenCommit(_InTransaction):
    """The operations, checked here as their results come back, then the
    entry with COMMIT. ``combines``: runs of independent operations go as
    one statement each (:func:`.combine.groups`; the database allows a
    writable WITH), else all as one batch, one round trip where the driver
    can."""

    __slots__ = ("combines",)

    def __init__(self, snapshot_lock: str | None, *, combines: bool) -> None:
        super().__init__(snapshot_lock)
        self.combines = combines

    async def write_and_commit(self, phase: Phase) -> list[QueryResult]:
        check(phase.ops, await self._write(phase))
        entry = phase.entry if phase.late_entry is None else phase.late_entry()
        # The outbox entry reserves its version (locking the counter row
        # until COMMIT), so it goes out together with the COMMIT.
        return await phase.session.commit(entry)

    async def _write(self, phase: Phase) -> list[QueryResult]:
        """The operations' results, cut short at the first conflict (which
        rolls everything back afterwards)."""
        session, ops = phase.session, phase.ops
        if self.combines:
            runs = groups(ops)
            if len(runs) < len(ops):
                try:
                    return await _write_runs(session, phase.catalog, runs)
                except (IntegrityError, DataError, ProgrammingError):
                    # Which operation failed, and whether a stale one came before it
                    # (then the unit conflicted), only a statement-by-statement run tells.
                    await session.rollback()
                    await self.begin(phase)
        return await session.execute_batch(
            [op.query for op in ops], lambda index, result: ops[index].conflicted(result)
        )


class CheckedInProcess(_InTransaction):
    """The operations, then the entry and COMMIT unless one conflicted: one
    call where the engine checks results in this process, so the
    transaction never waits on the event loop between its writes and its
    COMMIT."""

    __slots__ = ()

    async def write_and_commit(self, phase: Phase) -> list[QueryResult]:
        ops = phase.ops
        count = len(ops)
        results = await phase.session.commit(
            [*(op.query for op in ops), *phase.entry],
            lambda index, result: index < count and ops[index].conflicted(result),
        )
        check(ops, results[:count])
        return results[count:]


class GuardedBatch(_InTransaction):
    """The operations, each checked one followed by its ``guard``, then the
    entry and COMMIT, as one batch: one round trip where the driver sends a
    batch at once, and a stale operation stops the batch on the server
    before COMMIT. Only for a phase with an entry: a connection lost on the
    way makes the whole phase a lost COMMIT, which the entry resolves;
    without one, a loss before COMMIT is worth keeping apart, since such a
    phase can simply run again (:class:`StatementsThenCommit` then)."""

    __slots__ = ("guard", "without_entry")

    def __init__(self, snapshot_lock: str | None, guard: StaleGuard) -> None:
        super().__init__(snapshot_lock)
        self.guard = guard
        self.without_entry = StatementsThenCommit(snapshot_lock, combines=False)

    async def commit(self, phase: Phase) -> str | None:
        if not phase.entry:
            return await self.without_entry.commit(phase)
        return await super().commit(phase)

    async def write_and_commit(self, phase: Phase) -> list[QueryResult]:
        ops = phase.ops
        queries = guarded(ops, self.guard)
        try:
            results = await phase.session.commit([*queries, *phase.entry])
        except DataError as exc:
            conflict = stale_conflict(ops, exc)
            if conflict is None:
                raise
            raise conflict from exc
        take_results(ops, results)
        return results[len(queries) :]


class OneCommittingStatement:
    """With the outbox on, at the server's default isolation, and operations
    that can be one statement (:func:`.combine.combinable`): they and the
    outbox entry as one statement outside any transaction — one round trip
    for the phase, its entry and COMMIT, and the outbox counter's row lock
    held only inside the server, not across our round trips. A stale
    operation aborts the statement with ``abort`` (an expression failing
    with its ``{message}``: :attr:`CommitPlanChoice.abort_sql
    <aiofragno.driver.CommitPlanChoice.abort_sql>`). A lost
    connection is :class:`~aiofragno.CommitOutcomeUnknown`, which the
    outbox entry resolves.

    Other phases, and one that failed with an error that only a
    statement-by-statement run can pin to an operation (nothing was
    applied), go as :class:`StatementsThenCommit` (the latter without
    combining)."""

    __slots__ = ("abort", "one_by_one", "otherwise")

    def __init__(self, snapshot_lock: str | None, abort: str) -> None:
        self.abort = abort
        self.otherwise = StatementsThenCommit(snapshot_lock, combines=True)
        self.one_by_one = StatementsThenCommit(snapshot_lock, combines=False)

    async def commit(self, phase: Phase) -> str | None:
        values, statements = phase.values, phase.statements
        if values is None or statements is None or phase.isolation is not None:
            return await self.otherwise.commit(phase)
        if not combinable(phase.ops):
            return await self.otherwise.commit(phase)
        ops = phase.ops
        query = combine_committing(
            phase.catalog, ops, statements.with_parts(values), statements.stamp, self.abort
        )
        try:
            result = await phase.session.execute_committing(query)
        except DataError as exc:
            conflict = stale_conflict(ops, exc)
            if conflict is None:
                return await self.one_by_one.commit(phase)
            raise conflict from exc
        except (IntegrityError, ProgrammingError):
            return await self.one_by_one.commit(phase)
        stamp = result.rows[0]["stamp"]
        return None if stamp is None else str(stamp)


def choose(adapter: DialectAdapter, outbox: OutboxStrategy | None = "counter") -> CommitPlan:
    """The plan the dialect names (:class:`~aiofragno.driver.CommitPlanChoice`),
    for the engine's ``outbox`` strategy: only the counter's writers share a
    row, which units at a snapshot isolation level wait for first."""
    choice = adapter.commit
    lock = adapter.sql.outbox_snapshot_lock if outbox == "counter" else None
    if choice.plan == "one-committing-statement":
        if choice.abort_sql is None or not adapter.capabilities.supports_writable_cte:
            raise ValueError("one-committing-statement needs abort_sql and a writable WITH")
        return OneCommittingStatement(lock, choice.abort_sql)
    if choice.plan == "checked-in-process":
        return CheckedInProcess(lock)
    if choice.plan == "guarded-batch":
        if choice.stale_guard is None:
            raise ValueError("guarded-batch needs a stale_guard")
        return GuardedBatch(lock, choice.stale_guard)
    return StatementsThenCommit(lock, combines=adapter.capabilities.supports_writable_cte)


def resolving(adapter: DialectAdapter, outbox: OutboxStrategy | None) -> CommitPlan:
    """The plan for a phase whose record is bound once the operations ran
    (:attr:`Phase.late_entry`): the operations, their results read here,
    then the entry with COMMIT — one round trip more than a batch."""
    lock = adapter.sql.outbox_snapshot_lock if outbox == "counter" else None
    return StatementsThenCommit(lock, combines=adapter.capabilities.supports_writable_cte)


async def _write_runs(
    session: Session, catalog: Catalog, runs: Sequence[Sequence[MutationOp]]
) -> list[QueryResult]:
    """Each run as one statement, in order, up to the first that conflicted."""
    results: list[QueryResult] = []
    for run in runs:
        if len(run) == 1:
            done = await session.execute_batch([run[0].query])
        else:
            done = split(run, (await session.execute_batch([combine(catalog, run)]))[0])
        results += done
        if any(op.conflicted(result) for op, result in zip(run, done, strict=True)):
            break
    return results


async def _rollback(session: Session) -> None:
    if not session.in_transaction or session.broken or session.interrupted:
        return  # nothing to undo, or release resets/discards the connection
    with runtime.shielded(runtime.CLEANUP_TIMEOUT):
        try:
            await session.rollback()
        except Exception:
            session.broken = True  # discarded at release; the server rolls back
