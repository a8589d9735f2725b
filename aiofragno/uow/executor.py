"""Running units of work: the retry loop, the retrieval reads and the
mutation phase's transaction."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from .. import runtime
from ..driver import CompiledQuery, IsolationLevel, QueryResult
from ..errors import (
    CommitOutcomeUnknown,
    ConcurrencyConflict,
    ConnectionLost,
    DatabaseUnavailable,
    ValidationError,
    WouldDeadlock,
)
from ..outbox.versionstamp import MAX_INDEX
from ..outbox.writer import entry_values
from ..replicas import ReplicaSet, UnitReads
from ..resilience import Deadline, is_retryable_loss, retry_read_after, shared_deadline
from ..schema import new_external_id
from ..session import Session
from ..transaction import current_transaction
from .catalog import Catalog
from .ops import MutationOp
from .outcomes import Outcome, classify
from .plans import Phase, resolving
from .records import key_statement, key_taken, new_nonce, settle
from .retry import ExponentialBackoff, RetryPolicy
from .snapshot import Then, read_in_snapshot
from .unit import UnitOfWork

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("aiofragno")
T = TypeVar("T")
# Where a unit's reads run (aiofragno.replicas): "replica" units only read.
Reads = Literal["primary", "replica"]
Hook = Callable[[UnitOfWork], Any]
DEFAULT_RETRY = ExponentialBackoff()
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


async def _call(hook: Callable[..., Any] | None, *args: Any) -> None:
    if hook is not None:
        outcome = hook(*args)
        if inspect.isawaitable(outcome):
            await outcome


class HeldConnection:
    """The one connection an attempt uses for its reads and its mutation
    phase (one checkout per attempt, taken at the first use). Without
    ``retries`` (a read replica's, which the caller passes over when it
    fails), neither a checkout nor the reads wait out the unit's reconnect
    deadline."""

    def __init__(self, db: Engine, retries: bool = True) -> None:
        self.db = db
        self.retries = retries
        self.session: Session | None = None

    async def get(self) -> Session:
        if self.session is None:
            self.session = await self.db.acquire(wait=self.retries)
        return self.session

    async def release(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await self.db.release(session)

    async def read(
        self, queries: Sequence[CompiledQuery], then: Then | None = None
    ) -> list[QueryResult]:
        """The reads, in order, and those ``then`` makes of their results,
        all from one snapshot (:mod:`.snapshot`) — all again on a fresh
        connection if this one is lost (reads have no effects)."""
        try:
            return await self._read_all(queries, then)
        except (ConnectionLost, DatabaseUnavailable) as exc:
            if not (self.retries and is_retryable_loss(exc)):
                raise
            return await retry_read_after(
                exc, self.db.options.reconnect_deadline, partial(self._read_all, queries, then)
            )

    async def _read_all(
        self, queries: Sequence[CompiledQuery], then: Then | None
    ) -> list[QueryResult]:
        session = await self.get()
        try:
            return await read_in_snapshot(session, self.db.adapter.sql.read_snapshot, queries, then)
        except BaseException:
            await self.release()
            raise


def _check_not_waiting_for_itself(db: Engine) -> None:
    if db.adapter.capabilities.one_writer and current_transaction(db) is not None:
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
    outbox: bool,
) -> None:
    """The mutation phase: every write in one transaction, or none, committed
    by the engine's plan (:mod:`.plans`). Last in the same transaction, the
    unit's records (:mod:`.records`): given ``record_key``, that key's row
    (wherever the unit writes); with the ``outbox`` on and writes to tables
    in it, its outbox entry."""
    ops = uow.mutations
    values = _entry_values(db, uow, catalog, nonce) if outbox else None
    statements = None
    if values is not None:
        statements = db.outbox_statements if record_key is None else db.keyed_outbox_statements
        entry = statements.queries(values)
    elif record_key is not None and _writes(ops):
        entry = [key_statement(db, record_key, nonce)]
    else:
        entry = []
    if notify is not None:
        for query in (*(op.query for op in ops), *entry):
            notify(query)
    session = await held.get()
    phase = Phase(session, catalog, ops, entry, isolation, values, statements)
    plan = db.commit_plan
    if values is not None and values["payload_sql"] is not None and _writes_after_upsert(ops):
        # The entry's SQL would look each upsert's row up by key at the end,
        # after later writes may have deleted it or moved the key: bound once
        # the operations ran, it describes each upsert by its own result.
        late = statements
        assert late is not None
        phase.late_entry = lambda: late.queries(_entry_values(db, uow, catalog, nonce) or {})
        plan = resolving(db.adapter, db.outbox_strategy)
    stamp = await plan.commit(phase)
    if values is not None:
        uow.versionstamp = stamp
        if stamp is None:
            # Versioned by a tick (outbox.ticks), which this engine's next
            # read then waits for, so that it reads its own units.
            db.outbox_ticks.commit_seen()


def _writes(ops: Sequence[MutationOp]) -> bool:
    """Whether ``ops`` change anything (checks alone do not)."""
    return any(not op.is_read for op in ops)


def _writes_after_upsert(ops: Sequence[MutationOp]) -> bool:
    """Whether a write follows an unchecked upsert in ``ops``."""
    upserted = False
    for op in ops:
        if upserted and not op.is_read and op.in_outbox:
            return True
        upserted = upserted or op.op == "upsert"
    return False


def _outbox_writes(ops: Sequence[MutationOp]) -> list[MutationOp]:
    """The writes of ``ops`` that go into an outbox entry: not checks, and
    not to tables declared with ``outbox=False``."""
    return [op for op in ops if not op.is_read and op.in_outbox and op.table.table.outbox]


def _entry_values(
    db: Engine, uow: UnitOfWork, catalog: Catalog, nonce: str
) -> dict[str, Any] | None:
    """What the unit's outbox entry binds (:func:`entry_values`); None when
    the unit writes nothing the outbox takes (its checks, and its writes to
    tables out of the outbox, alone make no entry)."""
    writes = _outbox_writes(uow.mutations)
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
    outbox: bool | None = None,
    reads: Reads = "primary",
    replicas: ReplicaSet | None = None,
) -> T:
    policy = DEFAULT_RETRY if retry is None else retry
    if reads not in ("primary", "replica"):
        raise ValidationError(f'reads must be "primary" or "replica", got {reads!r}')
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    if outbox is None:
        outbox = db.outbox_strategy is not None
    elif not isinstance(outbox, bool):
        raise ValidationError(f"outbox must be a bool or None, got {outbox!r}")
    uow_id = new_external_id() if idempotency_key is None else idempotency_key
    # Names this call: its record tells it from an earlier call's with the same key.
    nonce = new_nonce()
    hooks = hooks or NO_HOOKS
    # One reconnect budget for the whole unit, shared by every retry inside it.
    with shared_deadline(db.options.reconnect_deadline) as lost:
        lost.max_delay = min(lost.max_delay, db.reconnect_max_delay)
        attempt = 0
        while True:
            attempt += 1
            db.stats.attempts += 1
            held = HeldConnection(db)
            # (A unit of reads only reads through its UnitReads: it never
            # gets as far as the mutation phase, which uses held.)
            reader = None if reads == "primary" else UnitReads(db, replicas, HeldConnection)
            read = held.read if reader is None else reader.read
            uow = UnitOfWork(read, catalog, uow_id, dry_run=dry_run, on_query=on_query)
            if reader is not None:
                reader.unit = uow
            try:
                try:
                    value = await fn(uow)
                    if reader is not None:
                        reader.refuse_writes()
                    await uow.settle_bulk()
                    if dry_run or not uow.mutations:
                        _without_writes(db, uow, dry_run, on_query)
                        return value
                    _check_not_waiting_for_itself(db)
                    await _call(hooks.before_mutation, uow)
                    if replicas is not None:
                        replicas.committing()  # (read-your-writes: aiofragno.replicas)
                    await run_mutations(
                        db, held, uow, catalog, isolation, on_query, idempotency_key, nonce, outbox
                    )
                    if replicas is not None:
                        await replicas.committed(await held.get())
                finally:
                    # Released before any backoff sleep below.
                    await held.release()
                    if reader is not None:
                        await reader.release()
            except Exception as exc:
                outcome = classify(exc)
                if outcome is Outcome.DUPLICATE_KEY and uow.unique_conflicts.match(exc):
                    outcome = Outcome.CONFLICT
                if outcome is Outcome.CONFLICT:
                    await _back_off(db, policy, hooks, uow, exc, attempt)
                    continue
                if outcome is Outcome.AMBIGUOUS:
                    # A unit leaves a record to settle a lost COMMIT by: its
                    # outbox entry, or its key.
                    settles = idempotency_key is not None or (
                        outbox and bool(_outbox_writes(uow.mutations))
                    )
                    lost_commit = cast(CommitOutcomeUnknown, exc)
                    keyed = idempotency_key is not None
                    if not await _settled(db, uow, nonce, lost_commit, settles, keyed, lost):
                        continue
                elif outcome is Outcome.LOST_BEFORE_COMMIT:
                    # The server rolled the phase back.
                    if not await lost.wait():
                        raise
                    db.stats.lost_connection_retries += 1
                    continue
                elif outcome is Outcome.DUPLICATE_KEY and idempotency_key is not None:
                    await _check_key_taken(db, uow, nonce, exc)
                    raise
                else:
                    raise
            uow.committed()
            await _after_commit(hooks, uow)
            db.stats.units += 1
            return value


def _without_writes(
    db: Engine, uow: UnitOfWork, dry_run: bool, on_query: Callable[[CompiledQuery], Any] | None
) -> None:
    """A unit that ends without a mutation phase: a dry run (its writes go
    to ``on_query`` only) or one that wrote nothing (it counts as done)."""
    if dry_run:
        if on_query is not None:
            for op in uow.mutations:
                on_query(op.query)
    else:
        db.stats.units += 1


async def _check_key_taken(db: Engine, uow: UnitOfWork, nonce: str, violation: Exception) -> None:
    """After a duplicate key in a unit with an idempotency key: raise
    :class:`~aiofragno.AlreadyApplied` if another call's record holds the
    key; else return, and the violation is the answer."""
    taken = await key_taken(db, uow, nonce)
    if taken is not None:
        raise taken from violation


async def _back_off(
    db: Engine,
    policy: RetryPolicy,
    hooks: UowHooks,
    uow: UnitOfWork,
    conflict: Exception,
    attempt: int,
) -> None:
    """After a conflict: wait before the next attempt, or raise
    :class:`ConcurrencyConflict` if ``policy`` gives up."""
    db.stats.conflicts += 1
    await _call(hooks.on_conflict, uow, conflict)
    delay = policy.delay(attempt)
    if delay is None:
        raise ConcurrencyConflict(
            f"unit of work {uow.uow_id} still conflicted after {attempt} attempt(s): {conflict}",
            attempts=attempt,
        ) from conflict
    await runtime.sleep(delay)


async def _settled(
    db: Engine,
    uow: UnitOfWork,
    nonce: str,
    lost_commit: CommitOutcomeUnknown,
    settles: bool,
    keyed: bool,
    lost: Deadline,
) -> bool:
    """After a lost COMMIT: True if the unit committed, False if it did not
    and may run again (the database is back). Without writes the commit
    changed nothing; with a record (the outbox entry, or the key's row)
    the look-up tells whether it committed. Otherwise we cannot know, and
    re-running could apply the writes twice: ``lost_commit`` is raised."""
    if _writes(uow.mutations):
        if not settles:
            raise lost_commit
        if not await settle(db, uow, nonce, lost_commit, keyed):
            if not await lost.wait():
                raise ConnectionLost(
                    f"{lost_commit}; unit of work {uow.uow_id} did not commit (its "
                    "session has ended without it), and the database stayed "
                    "unreachable for the rest of reconnect_deadline"
                ) from lost_commit
            db.stats.lost_connection_retries += 1
            return False
    db.stats.commits_resolved += 1
    return True


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
