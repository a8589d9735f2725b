"""Running units of work: the retry loop, the retrieval reads and the
mutation phase's transaction."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import runtime
from ..driver import CompiledQuery, IsolationLevel, QueryResult, StaleGuard
from ..errors import (
    CommitOutcomeUnknown,
    ConcurrencyConflict,
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    IntegrityError,
    ProgrammingError,
    RowNotFound,
    TransactionConflict,
    UniqueViolation,
    ValidationError,
    WouldDeadlock,
)
from ..outbox.versionstamp import MAX_INDEX
from ..outbox.writer import entry_values
from ..resilience import retry_read, shared_deadline
from ..schema import new_external_id
from ..session import Session, current_transaction
from .catalog import Catalog
from .combine import combinable, combine, combine_committing, groups, split
from .ops import Check, MutationOp
from .records import key_statement, key_taken, new_nonce, settle
from .retry import ExponentialBackoff, RetryPolicy
from .stale import guarded, stale_index
from .unit import UnitOfWork

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("aiofragno")
T = TypeVar("T")
Hook = Callable[[UnitOfWork], Any]
DEFAULT_RETRY = ExponentialBackoff()
# Isolation levels whose transactions read one snapshot throughout.
_SNAPSHOT_LEVELS = frozenset({"repeatable read", "serializable"})
# Idempotency keys are stored as varchar(255) (the outbox's uow_id).
MAX_KEY_LENGTH = 255


@dataclass(frozen=True, slots=True)
class UowHooks:
    """Instrumentation around the phases of each attempt (sync or async
    callables taking the UnitOfWork). A ``before_mutation`` or
    ``on_conflict`` hook that raises :class:`~aiofragno.ConcurrencyConflict`
    makes the attempt count as a conflict (and be retried); any other
    exception ends the unit, rolled back. ``after_mutation`` runs once the
    unit has committed: what it raises is logged (``aiofragno`` logger) and
    does not change the outcome — the unit stays committed and
    ``execute_uow`` returns its value."""

    before_mutation: Hook | None = None
    after_mutation: Hook | None = None
    on_conflict: Callable[[UnitOfWork, Exception], Any] | None = None


NO_HOOKS = UowHooks()


class _Conflict(Exception):
    """A checked operation matched no row."""


async def _call(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is not None:
        outcome = hook(*args)
        if inspect.isawaitable(outcome):
            await outcome


class HeldConnection:
    """The one connection an attempt uses for its reads and its mutation
    phase (one checkout per attempt, taken at the first use)."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.session: Session | None = None

    async def get(self) -> Session:
        if self.session is None:
            self.session = await self.db.checkout()
        return self.session

    async def release(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await self.db.checkin(session)

    async def read(self, queries: Sequence[CompiledQuery]) -> list[QueryResult]:
        """The reads, in order — all again on a fresh connection if this one is
        lost (reads have no effects)."""

        async def read_all() -> list[QueryResult]:
            session = await self.get()
            try:
                return await session.execute_batch(queries)
            except BaseException:
                await self.release()
                raise

        return await retry_read(self.db.options.reconnect_deadline, read_all)


def _check_not_waiting_for_itself(db: Engine) -> None:
    if db.adapter.one_writer and current_transaction(db) is not None:
        raise WouldDeadlock(
            f"this unit of work has writes, and a db.transaction() is open in this task: "
            f"on {db.name} that transaction holds the database's one writer until it ends, "
            "and the unit's mutation phase, which commits on a connection of its own, could "
            "only wait for it; nothing was written. Run the unit after the transaction, or "
            "make these writes part of the transaction with tx.execute()"
        )


async def run_mutations(
    db: Engine,
    held: HeldConnection,
    uow: UnitOfWork,
    catalog: Catalog,
    isolation: IsolationLevel | None,
    notify: Callable[[CompiledQuery], Any] | None,
    record_key: str | None,
    nonce: str,
) -> None:
    """The mutation phase: every write in one transaction, or none. Last in
    the same transaction, the unit's record (:mod:`.records`): with the
    outbox on, its outbox entry; else, given ``record_key``, that key."""
    ops = uow.mutations
    values = _entry_values(db, uow, catalog, nonce) if db.options.outbox else None
    if values is not None:
        entry = db.outbox_statements.queries(values)
    elif record_key is not None and _writes(ops):
        entry = [key_statement(db, record_key, nonce)]
    else:
        entry = []
    if notify is not None:
        for query in (*(op.query for op in ops), *entry):
            notify(query)
    session = await held.get()
    abort = None
    if values is not None and isolation is None:
        abort = _abort_sql(db, ops)
        if abort is not None and await _commit_alone(db, session, catalog, ops, values, abort, uow):
            return
    begin = functools.partial(_begin, db, session, isolation, values is not None)
    try:
        await begin()
        guard = db.adapter.stale_guard
        if db.adapter.checks_batches_in_process:
            written = await _write_and_commit(session, ops, entry)
        elif entry and guard is not None:
            written = await _write_guarded_and_commit(session, ops, entry, guard)
        else:
            # (After the one statement failed, only one statement per operation
            # tells which failed.)
            _check(ops, await _write(db, session, catalog, ops, begin, combined=abort is None))
            # The outbox entry reserves its version (locking the counter row
            # until COMMIT), so it goes out together with the COMMIT.
            written = await session.commit(entry)
    except BaseException:
        await _rollback(session)
        raise
    if values is not None:
        uow.versionstamp = db.outbox_statements.versionstamp(written)


async def _begin(
    db: Engine, session: Session, isolation: IsolationLevel | None, outbox: bool
) -> None:
    """Open the phase's transaction. With the outbox, at a snapshot isolation
    level, first wait for the outbox counter, before any statement takes
    the snapshot (:attr:`DialectAdapter.outbox_snapshot_lock_sql`): the
    reservation then reads the counter's newest version instead of failing
    on every outbox unit that committed meanwhile. Such units run one at a
    time with the other outbox writers for their whole phase."""
    await session.begin(isolation)
    lock = db.adapter.outbox_snapshot_lock_sql
    if outbox and lock is not None and isolation in _SNAPSHOT_LEVELS:
        await session.execute(CompiledQuery(lock))


def _writes(ops: Sequence[MutationOp]) -> bool:
    """Whether ``ops`` change anything (checks alone do not)."""
    return any(not isinstance(op, Check) for op in ops)


def _entry_values(
    db: Engine, uow: UnitOfWork, catalog: Catalog, nonce: str
) -> dict[str, Any] | None:
    """What the unit's outbox entry binds (:func:`entry_values`); None when
    the unit writes nothing (its checks alone make no entry)."""
    writes = [op for op in uow.mutations if not isinstance(op, Check)]
    if len(writes) > MAX_INDEX + 1:
        raise ValidationError(
            f"a unit of work can carry at most {MAX_INDEX + 1} outbox mutations, this one has "
            f"{len(writes)}; split it into several units"
        )
    if not writes:
        return None
    return entry_values(
        db.codec,
        uow_id=uow.uow_id,
        nonce=nonce,
        schema=catalog.layout.schema.name,
        namespace=catalog.layout.namespace,
        writes=writes,
    )


async def _write_and_commit(
    session: Session, ops: Sequence[MutationOp], entry: Sequence[CompiledQuery]
) -> list[QueryResult]:
    """The operations, then the outbox ``entry`` and COMMIT unless one
    conflicted: one call where the engine checks results in this process, so
    the transaction never waits on the event loop between its writes and its
    COMMIT. The entry's results."""
    count = len(ops)
    results = await session.commit(
        [*(op.query for op in ops), *entry],
        lambda index, result: index < count and ops[index].conflicted(result),
    )
    _check(ops, results[:count])
    return results[count:]


async def _write_guarded_and_commit(
    session: Session, ops: Sequence[MutationOp], entry: Sequence[CompiledQuery], guard: StaleGuard
) -> list[QueryResult]:
    """The operations, each checked one followed by its ``guard``, then the
    outbox ``entry`` and COMMIT, as one batch: one round trip where the
    driver sends a batch at once, and a stale operation stops the batch on
    the server before COMMIT. Only with the outbox on: a connection lost on
    the way makes the whole phase a lost COMMIT, which the entry resolves;
    without the outbox, a loss before COMMIT is worth keeping apart, since
    such a phase can simply run again. The entry's results."""
    queries = guarded(ops, guard)
    try:
        results = await session.commit([*queries, *entry])
    except DataError as exc:
        conflict = _stale_conflict(ops, exc)
        if conflict is None:
            raise
        raise conflict from exc
    return results[len(queries) :]


def _check(ops: Sequence[MutationOp], results: Sequence[QueryResult]) -> None:
    """Raise the conflict of the first operation that matched no row."""
    for op, result in zip(ops, results, strict=False):  # (a batch may stop early)
        if op.conflicted(result):
            raise _mismatch(op)


def _stale_conflict(ops: Sequence[MutationOp], exc: DataError) -> _Conflict | RowNotFound | None:
    """The conflict of the operation whose stale check the database aborted
    with ``exc`` (:mod:`.stale`), or None if ``exc`` is another error."""
    index = stale_index(str(exc))
    return None if index is None else _mismatch(ops[index])


def _mismatch(op: MutationOp) -> _Conflict | RowNotFound:
    """What an operation that matched no row makes of the phase: a conflict
    if the unit had seen the row, else :class:`RowNotFound`."""
    return _Conflict(op.stale()) if op.seen else RowNotFound(f"{op.stale()}; nothing was written")


def _abort_sql(db: Engine, ops: Sequence[MutationOp]) -> str | None:
    """:data:`DialectAdapter.abort_sql` where the phase and its outbox entry
    can be one statement committing on its own (:func:`_commit_alone`), else None."""
    adapter = db.adapter
    return adapter.abort_sql if adapter.supports_writable_cte and combinable(ops) else None


async def _commit_alone(
    db: Engine,
    session: Session,
    catalog: Catalog,
    ops: Sequence[MutationOp],
    values: dict[str, Any],
    abort: str,
    uow: UnitOfWork,
) -> bool:
    """The operations and the outbox entry as one statement outside any
    transaction — one round trip for the phase, its entry and COMMIT, and the
    outbox counter's row lock held only inside the server, not across our
    round trips. True once committed; False, with nothing applied, when it
    failed with an error that only a statement-by-statement run can pin to an
    operation. A lost connection is :class:`CommitOutcomeUnknown`, which the
    outbox entry resolves."""
    statements = db.outbox_statements
    query = combine_committing(catalog, ops, statements.with_parts(values), statements.stamp, abort)
    try:
        result = await session.execute_committing(query)
    except DataError as exc:
        conflict = _stale_conflict(ops, exc)
        if conflict is None:
            return False
        raise conflict from exc
    except (IntegrityError, ProgrammingError):
        return False
    uow.versionstamp = str(result.rows[0]["stamp"])
    return True


async def _write(
    db: Engine,
    session: Session,
    catalog: Catalog,
    ops: Sequence[MutationOp],
    begin: Callable[[], Awaitable[None]],
    *,
    combined: bool,
) -> list[QueryResult]:
    """Run the operations in the open transaction; their results, cut short
    at the first conflict (which rolls everything back afterwards). Where
    the database can combine them (and ``combined``), runs of independent
    operations go as one statement each (:func:`groups`); else one batch,
    one round trip where the driver can. ``begin`` opens the transaction
    again after a combined run failed."""
    if combined and db.adapter.supports_writable_cte:
        runs = groups(ops)
        if len(runs) < len(ops):
            try:
                return await _write_runs(session, catalog, runs)
            except (IntegrityError, DataError, ProgrammingError):
                # Which operation failed, and whether a stale one came before it
                # (then the unit conflicted), only a statement-by-statement run tells.
                await session.rollback()
                await begin()
    return await session.execute_batch(
        [op.query for op in ops], lambda index, result: ops[index].conflicted(result)
    )


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
        return  # nothing to undo, or checkin resets/discards the connection
    with runtime.shielded(runtime.CLEANUP_TIMEOUT):
        try:
            await session.rollback()
        except Exception:
            session.broken = True  # discarded at checkin; the server rolls back


def check_idempotency_key(key: object) -> str:
    """``key`` if it can name a unit of work: a str of 1 to 255 characters
    that every backend stores as given (no NUL, no lone surrogates)."""
    if not isinstance(key, str):
        raise ValidationError(f"idempotency_key must be a str, got {type(key).__name__}")
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise ValidationError(
            f"idempotency_key must have 1 to {MAX_KEY_LENGTH} characters, got {len(key)}"
        )
    if "\x00" in key:
        raise ValidationError("idempotency_key must not contain NUL (\\x00) characters")
    try:
        key.encode()
    except UnicodeEncodeError as exc:
        raise ValidationError(f"idempotency_key is not valid Unicode text: {exc}") from None
    return key


async def execute_uow(
    db: Engine,
    catalog: Catalog,
    fn: Callable[[UnitOfWork], Awaitable[T]],
    *,
    retry: RetryPolicy | None = None,
    idempotency_key: str | None = None,
    isolation: IsolationLevel | None = None,
    dry_run: bool = False,
    on_query: Callable[[CompiledQuery], Any] | None = None,
    hooks: UowHooks | None = None,
) -> T:
    policy = DEFAULT_RETRY if retry is None else retry
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    uow_id = new_external_id() if idempotency_key is None else idempotency_key
    # Names this call: its record tells it from an earlier call's with the same key.
    nonce = new_nonce()
    hooks = hooks or NO_HOOKS
    # A unit leaves a record to settle a lost COMMIT by: its outbox entry, or its key.
    settles = db.options.outbox or idempotency_key is not None
    # One reconnect budget for the whole unit, shared by every retry inside it.
    with shared_deadline(db.options.reconnect_deadline) as lost:
        attempt = 0
        while True:
            attempt += 1
            db.stats.attempts += 1
            held = HeldConnection(db)
            uow = UnitOfWork(held.read, catalog, uow_id, dry_run=dry_run, on_query=on_query)
            try:
                try:
                    value = await fn(uow)
                    if dry_run:
                        if on_query is not None:
                            for op in uow.mutations:
                                on_query(op.query)
                        return value
                    if not uow.mutations:
                        db.stats.units += 1
                        return value
                    _check_not_waiting_for_itself(db)
                    await _call(hooks.before_mutation, uow)
                    await run_mutations(
                        db, held, uow, catalog, isolation, on_query, idempotency_key, nonce
                    )
                finally:
                    # Released before any backoff sleep below.
                    await held.release()
            except (_Conflict, TransactionConflict, ConcurrencyConflict) as conflict:
                db.stats.conflicts += 1
                await _call(hooks.on_conflict, uow, conflict)
                delay = policy.delay(attempt)
                if delay is None:
                    raise ConcurrencyConflict(
                        f"unit of work {uow_id} still conflicted after {attempt} attempt(s): {conflict}",
                        attempts=attempt,
                    ) from conflict
                await runtime.sleep(delay)
                continue
            except CommitOutcomeUnknown as lost_commit:
                # Without writes the commit changed nothing; with a record (the
                # outbox entry, or the key's row) the look-up tells whether it
                # committed. Otherwise we cannot know, and re-running could
                # apply the writes twice.
                if _writes(uow.mutations):
                    if not settles:
                        raise
                    if not await settle(db, uow, nonce, lost_commit):
                        if not await lost.wait():
                            raise ConnectionLost(
                                f"{lost_commit}; unit of work {uow_id} did not commit (its "
                                "session has ended without it), and the database stayed "
                                "unreachable for the rest of reconnect_deadline"
                            ) from lost_commit
                        db.stats.lost_connection_retries += 1
                        continue
                db.stats.commits_resolved += 1
            except (ConnectionLost, DatabaseUnavailable):
                # Lost before COMMIT was sent: the server rolled the phase back.
                if not await lost.wait():
                    raise
                db.stats.lost_connection_retries += 1
                continue
            except UniqueViolation as violation:
                taken = None if idempotency_key is None else await key_taken(db, uow, nonce)
                if taken is not None:
                    raise taken from violation
                raise
            await _after_commit(hooks, uow)
            db.stats.units += 1
            return value


async def _after_commit(hooks: UowHooks, uow: UnitOfWork) -> None:
    """The ``after_mutation`` hook: the unit has committed, so what the hook
    raises must not make it look as if it had not."""
    try:
        await _call(hooks.after_mutation, uow)
    except Exception:
        logger.exception(
            "the after_mutation hook failed after unit of work %s committed; "
            "the unit stays committed",
            uow.uow_id,
        )
