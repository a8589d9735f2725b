"""Read replicas: reads routed to PostgreSQL standbys or MySQL/MariaDB
replicas, reading your writes.

``af.connect(primary_url, replicas=[url, ...])`` gives the Database one
pool per replica (an :class:`~aiofragno.engine.Engine` of its own each,
beside the primary's). ``db.replica.fetch(...)`` (and ``fetch_one``,
``fetch_value``, ``execute`` of a read) runs a statement on a replica, and
``db.execute_uow(fn, reads="replica")`` a unit's reads. What is promised:

* **Read your writes, per task.** Every commit a task makes on the primary
  (a unit of work, a ``db.transaction()``, a statement that is not a
  SELECT, run or streamed, a migration) raises that task's *commit position*: how far the
  primary's log reaches, read after the commit (PostgreSQL: the WAL
  position; MySQL and MariaDB: the GTID state — the dialect's
  :class:`~aiofragno.driver.ReplicationSql`). It is a context variable, so
  it belongs to the asyncio or trio task (a task started later inherits
  it) and it only rises. A replica serves the task only once it has
  replayed that position, waited for up to ``replica_wait`` seconds (by
  the replica itself where it can wait for a position, else polled); else
  the read runs on the primary. A task that has not written waits for
  nothing.
* **Bounded staleness** with ``max_replica_lag``: a replica whose replay
  lags more (sampled at most every :data:`LAG_SAMPLE` seconds; MySQL and
  MariaDB tell it in whole seconds) is passed over.
* **Never inside a transaction**: inside ``db.transaction()``,
  ``db.replica.fetch`` is the transaction's own read, and a unit's reads go
  to the primary.
* **Replicas down**: a replica that fails is passed over for
  :data:`DOWN_FOR` seconds; with none left, reads run on the primary.
  ``db.stats`` counts ``replica_reads``, ``replica_waits`` and
  ``replica_fallbacks``.

Only reads go to a replica: a statement that is not a read (by its first
word) is refused before any SQL, and a unit run with ``reads="replica"``
that queues a write raises :class:`~aiofragno.errors.ReadOnlyUnit` before
the write's SQL. Without replicas ``db.replica`` reads on the primary, so
code written for replicas runs unchanged.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import runtime
from .driver import (
    CompiledQuery,
    QueryResult,
    ReplayPosition,
    ReplicationSql,
    Row,
    leading_keyword,
)
from .errors import (
    ConnectionLost,
    DatabaseUnavailable,
    Error,
    PoolTimeout,
    ReadOnlyUnit,
    SerializationFailure,
    ValidationError,
)
from .queries import Queries, Read
from .session import Session
from .sql import Fragment, sql
from .streaming import Rows, Stream
from .transaction import current_transaction, transaction_stack

if TYPE_CHECKING:
    from .engine import Engine
    from .uow.snapshot import Then

logger = logging.getLogger("aiofragno")
T = TypeVar("T")

# How long a replica that failed is passed over before it is tried again.
DOWN_FOR = 1.0
# How old a replica's lag sample may be when max_replica_lag is set.
LAG_SAMPLE = 0.25
# Polling a replica for a position: the first pause, doubling up to the last.
FIRST_POLL = 0.001
LAST_POLL = 0.01
DEFAULT_REPLICA_WAIT = 0.5
# The first words of statements db.replica runs (a read; one that is not
# could only fail on a replica, or write when it falls back to the primary).
READS = frozenset({"select", "with", "values", "table", "show"})
# A replica failing so: passed over, and the read goes elsewhere.
REPLICA_FAILURES = (ConnectionLost, DatabaseUnavailable, PoolTimeout)


class Replica:
    """One replica's pool, and what was last seen of it."""

    __slots__ = ("down_until", "engine", "lag", "replayed", "sampled_at")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # The furthest replay position seen (it only rises); None: not yet asked.
        self.replayed: ReplayPosition | None = None
        self.lag = 0.0
        self.sampled_at = -math.inf
        self.down_until = -math.inf


class ReplicaSet:
    """The replicas of one primary, and each task's commit position on it.

    ``max_lag``: seconds of replay lag past which a replica is passed over
    (None: any); ``wait``: how long a read waits for a replica to replay
    the task's commits before it runs on the primary."""

    def __init__(
        self, primary: Engine, engines: Sequence[Engine], max_lag: float | None, wait: float
    ) -> None:
        kinds = primary.adapter.sql.replication
        if not kinds:
            raise ValidationError(
                "read replicas need PostgreSQL streaming replication or MySQL/MariaDB GTID "
                f"replication; {primary.name} has neither: connect without replicas="
            )
        self.primary = primary
        self.replicas = [Replica(engine) for engine in engines]
        self.max_lag = max_lag
        self.wait = wait
        self.stats = primary.stats
        self._kinds = kinds
        self._replication: ReplicationSql | None = None
        if len(kinds) == 1:
            self._use(kinds[0])
        self._next = 0
        # (position, unknown): the task's commit position (None: no commit
        # yet), and whether a commit since may have gone past it (then the
        # primary is asked).
        self._position: ContextVar[tuple[ReplayPosition | None, bool]] = ContextVar(
            "aiofragno_commit_position", default=(None, False)
        )

    async def open(self) -> None:
        """Once the primary is open: where the dialect covers several kinds
        of server (MySQL, MariaDB), which one it is — one round trip, once."""
        if self._replication is not None:
            return
        primary = self.primary
        version = await primary.fetch_value(primary.raw(primary.adapter.sql.version), str)
        for kind in self._kinds:
            if re.search(kind.server, version):
                self._use(kind)
                return
        raise ValidationError(
            f"read replicas: aiofragno knows no replication for server {version!r}; "
            "connect without replicas="
        )

    def _use(self, replication: ReplicationSql) -> None:
        primary = self.primary
        self._replication = replication
        self._position_query = primary.raw(replication.position)
        self._commit_position = primary.compile(self._position_query)
        self._replica_state = primary.raw(replication.state)

    @property
    def replication(self) -> ReplicationSql:
        """The primary's kind of replication (known once :meth:`open`)."""
        if self._replication is None:
            raise RuntimeError("ReplicaSet.open() was not awaited")
        return self._replication

    async def close(self) -> None:
        for replica in self.replicas:
            await replica.engine.close()

    # -- the task's commit position -------------------------------------------

    def committing(self) -> None:
        """Before a commit on the primary (or a statement that may commit):
        the task's position is unknown until :meth:`committed` reads it, so
        a commit whose outcome is never learnt still counts."""
        position, unknown = self._position.get()
        if not unknown:
            self._position.set((position, True))

    async def committed(self, session: Session) -> None:
        """After a commit on ``session``: the task's position raised to the
        primary's WAL position now, at or past the commit's (one round trip
        on the connection still held). Never raises an :class:`Exception`:
        the commit stands, and a failure leaves the position unknown, for
        the next replica read to ask the primary."""
        try:
            result = await session.execute(self._commit_position)
            position = self.replication.parse(result.rows[0]["position"])
        except Exception as exc:
            logger.debug("reading the log position after a commit failed: %s", exc)
            return
        self._raise_to(position)

    def _raise_to(self, position: ReplayPosition) -> None:
        known, _ = self._position.get()
        self._position.set((merged(known, position), False))

    async def _target(self) -> ReplayPosition | None:
        """The position a replica must have replayed to serve this task
        (None: any will do)."""
        position, unknown = self._position.get()
        if unknown:
            primary = self.primary
            value = await primary.fetch_value(self._position_query)
            position = self.replication.parse(value)
            self._raise_to(position)
        return position

    def primary_run(self, query: Fragment, read: Read[T]) -> Coroutine[Any, Any, T]:
        """``db``'s own statements, when it has replicas: one that is not a
        SELECT may commit a write, which the task's position must cover."""
        self._may_commit(query)
        return self.primary._run(query, read)

    def primary_stream(self, query: Fragment, batch_size: int) -> Stream:
        """``db.stream``, when it has replicas: a stream of a statement that
        is not a SELECT (``INSERT .. RETURNING``) commits a write when its
        block ends, which the task's position must cover."""
        stream = self.primary._stream(query, batch_size)
        if not self._may_commit(query):
            return stream
        return CommittingStream(self, stream)

    def _may_commit(self, query: Fragment) -> bool:
        if leading_keyword(self.primary.compile(query).sql) == "select":
            return False
        self.committing()
        return True

    # -- choosing a replica ---------------------------------------------------

    async def choose(self) -> Replica | None:
        """A replica that has replayed this task's commits (waiting up to
        ``wait`` seconds for one) and lags at most ``max_lag``; None when
        there is none, and the read belongs on the primary."""
        target = await self._target()
        candidates = []
        for replica in self._in_turn():
            # (Never asked, or back from failing: is it a replica at all?)
            unchecked = replica.sampled_at == -math.inf
            stale = self.max_lag is not None and time.monotonic() - replica.sampled_at > LAG_SAMPLE
            if (unchecked or stale) and not await self._sample(replica):
                continue
            if self.max_lag is not None and replica.lag > self.max_lag:
                continue
            if covers(replica.replayed, target):
                return replica
            candidates.append(replica)
        if candidates and await self._wait_for(candidates[0], target):
            self.stats.replica_waits += 1
            return candidates[0]
        return None

    def _in_turn(self) -> list[Replica]:
        """The replicas that are up, starting with the next one in turn."""
        replicas = self.replicas
        start = self._next % len(replicas)
        self._next = start + 1
        now = time.monotonic()
        ordered = replicas[start:] + replicas[:start]
        return [replica for replica in ordered if replica.down_until <= now]

    async def _wait_for(self, replica: Replica, target: ReplayPosition | None) -> bool:
        """Whether ``replica`` replays ``target`` within ``wait`` seconds:
        waited for by the replica itself where the dialect can, else polled."""
        wait = self.replication.wait
        if wait is not None and target is not None and self.wait > 0:
            return await self._wait_on(replica, wait, target)
        deadline = time.monotonic() + self.wait
        pause = FIRST_POLL
        while await self._sample(replica):
            if covers(replica.replayed, target):
                return True
            if time.monotonic() + pause > deadline:
                return False
            await runtime.sleep(pause)
            pause = min(2 * pause, LAST_POLL)
        return False

    async def _wait_on(self, replica: Replica, wait: str, target: ReplayPosition) -> bool:
        """The replica's own wait for ``target``, bounded by ``wait`` seconds."""
        query = sql(wait, position=str(target), seconds=self.wait)
        try:
            reached = await replica.engine.fetch_value(query)
        except Error as exc:
            self.failed(replica, exc)
            return False
        if reached:
            replica.replayed = merged(replica.replayed, target)
        return bool(reached)

    async def _sample(self, replica: Replica) -> bool:
        """Read how far ``replica`` has replayed and how far it lags; False
        (and the replica passed over for a while) if it cannot say."""
        try:
            rows = await replica.engine.fetch(self._replica_state)
            state = replica_state(self.replication, rows)
        except Error as exc:
            self.failed(replica, exc)
            return False
        if state is None:
            self.failed(replica, Error("it is not a replica (not replaying a primary's log)"))
            return False
        replica.replayed = merged(replica.replayed, state[0])
        replica.lag = state[1]
        replica.sampled_at = time.monotonic()
        return True

    def failed(self, replica: Replica, exc: Exception) -> None:
        """``replica`` failed with ``exc``: pass it over for ``DOWN_FOR`` seconds."""
        now = time.monotonic()
        if replica.down_until <= now:
            logger.warning(
                "read replica %s is passed over for %ss: %s",
                replica.engine.url.describe(),
                DOWN_FOR,
                exc,
            )
        replica.down_until = now + DOWN_FOR
        replica.sampled_at = -math.inf

    # -- db.replica -------------------------------------------------------------

    async def run(self, query: Fragment, read: Read[T]) -> T:
        """``query`` on a replica chosen by :meth:`choose`, else on the
        primary; inside a transaction of the primary, in that transaction."""
        primary = self.primary
        primary.check_open()
        check_read(primary.compile(query))
        if transaction_stack.get() is not None and current_transaction(primary) is not None:
            return await primary._run(query, read)
        replica = await self.choose()
        if replica is not None:
            try:
                value = await replica.engine._run(query, read)
            except REPLICA_FAILURES as exc:
                self.failed(replica, exc)
            except SerializationFailure:
                # (A standby cancels a read that holds up its replay: "conflict
                # with recovery". The primary has no such conflict.)
                pass
            else:
                self.stats.replica_reads += 1
                return value
        self.stats.replica_fallbacks += 1
        return await primary._run(query, read)


def covers(replayed: ReplayPosition | None, target: ReplayPosition | None) -> bool:
    """Whether a replica that has replayed ``replayed`` (None: unknown)
    serves a task at ``target`` (None: no commit to wait for)."""
    return target is None or (replayed is not None and replayed.covers(target))


def merged(known: ReplayPosition | None, position: ReplayPosition) -> ReplayPosition:
    return position if known is None else known.merged(position)


def replica_state(
    replication: ReplicationSql, rows: Sequence[Row]
) -> tuple[ReplayPosition, float] | None:
    """What a replica's ``state`` rows say: how far it has replayed and its
    lag (seconds; unknown: infinite, as a replica whose replication has
    stopped); None when the server is not a replica."""
    positions = [row[replication.state_position] for row in rows]
    if not positions or positions[0] is None:
        return None
    lags = [row[replication.state_lag] for row in rows]
    lag = math.inf if None in lags else max(float(lag) for lag in lags)
    return replication.parse(positions[0]), lag


def check_read(compiled: CompiledQuery) -> None:
    """Refuse a statement that is not a read, before any SQL is sent."""
    keyword = leading_keyword(compiled.sql)
    if keyword not in READS:
        raise ValidationError(
            f"db.replica runs reads only (SELECT, WITH, VALUES, TABLE, SHOW), not "
            f"{keyword.upper() or compiled.sql[:40]!r}; run it on db itself"
        )


class ReplicaReads(Queries):
    """``db.replica``: the query methods and ``stream``, reading on a
    replica (see the module docstring); without replicas, on the primary."""

    def __init__(self, primary: Engine, replicas: ReplicaSet | None) -> None:
        self._primary = primary
        self._replicas = replicas

    def _run(self, query: Fragment, read: Read[T]) -> Coroutine[Any, Any, T]:
        if self._replicas is None:
            check_read(self._primary.compile(query))
            return self._primary._run(query, read)
        return self._replicas.run(query, read)

    def _stream(self, query: Fragment, batch_size: int) -> Stream:
        compiled = self._primary.compile(query)
        check_read(compiled)
        if self._replicas is None:
            return self._primary._stream(query, batch_size)
        return ReplicaStream(self._replicas, query, compiled, batch_size)


class ReplicaStream(Stream):
    """``db.replica.stream(query)``: the rows streamed from a replica chosen
    as for ``fetch`` (else from the primary; in a transaction of the
    primary, in that transaction). A replica that fails before the first
    batch is handed out is passed over, and the stream opens on the
    primary; one that fails later fails the stream, as on the primary."""

    def __init__(
        self, replicas: ReplicaSet, query: Fragment, compiled: CompiledQuery, batch_size: int
    ) -> None:
        super().__init__(compiled, batch_size)
        self._replicas = replicas
        self._fragment = query
        self._inner: Stream | None = None

    async def __aenter__(self) -> Rows:
        replicas, primary = self._replicas, self._replicas.primary
        primary.check_open()
        if current_transaction(primary) is None:
            replica = await replicas.choose()
            if replica is not None:
                self._inner = replica.engine._stream(self._fragment, self._batch_size)
                try:
                    rows = await self._inner.__aenter__()
                except REPLICA_FAILURES as exc:
                    replicas.failed(replica, exc)
                else:
                    replicas.stats.replica_reads += 1
                    return rows
            replicas.stats.replica_fallbacks += 1
        self._inner = primary._stream(self._fragment, self._batch_size)
        return await self._inner.__aenter__()

    async def _end(self, exc: BaseException | None) -> None:
        inner, self._inner = self._inner, None
        if inner is not None:
            await inner._end(exc)


class CommittingStream(Stream):
    """A stream on the primary of a statement that may write: the task's
    commit position is unknown from its start until a read asks the
    primary after the block has ended — a replica read inside the block
    would otherwise settle the position before the stream's commit."""

    def __init__(self, replicas: ReplicaSet, inner: Stream) -> None:
        super().__init__(inner._query, inner._batch_size)
        self._replicas = replicas
        self._inner = inner

    async def __aenter__(self) -> Rows:
        self._replicas.committing()
        return await self._inner.__aenter__()

    async def _end(self, exc: BaseException | None) -> None:
        try:
            await self._inner._end(exc)
        finally:
            self._replicas.committing()


class HeldReads(Protocol):
    """The reads of one unit attempt on one engine (the executor's
    ``HeldConnection``: one connection, held until released; made with
    ``retries=False`` for a replica, which is passed over when it fails
    rather than waited for)."""

    async def read(
        self, queries: Sequence[CompiledQuery], then: Then | None = None
    ) -> list[QueryResult]: ...

    async def release(self) -> None: ...


class Queues(Protocol):
    """A unit of work, as far as its reads care: what it has queued to write."""

    @property
    def mutations(self) -> Sequence[object]: ...


class UnitReads:
    """The reads of one attempt of a unit run with ``reads="replica"``: all
    on one server, chosen at the first read — a replica that has this
    task's commits, else the primary (always inside a
    ``db.transaction()``). As on the primary, each ``retrieve()`` reads
    one snapshot (:mod:`aiofragno.uow.snapshot`); and as the server stays the same, a later
    ``retrieve()`` never sees an older state than an earlier one. A replica
    lost after the first read fails the attempt, which runs again (the
    executor's "lost before commit"). Once the unit (:attr:`unit`) has
    queued a write, a read, and the unit's end (:meth:`refuse_writes`),
    raise :class:`ReadOnlyUnit` before more SQL."""

    def __init__(
        self,
        primary: Engine,
        replicas: ReplicaSet | None,
        hold: Callable[[Engine, bool], HeldReads],
    ) -> None:
        self._primary = primary
        self._replicas = replicas
        self._hold = hold
        self.unit: Queues | None = None
        self._held: HeldReads | None = None
        self._replica: Replica | None = None

    def refuse_writes(self) -> None:
        if self.unit is not None and self.unit.mutations:
            raise ReadOnlyUnit(
                'this unit of work was run with reads="replica", which only reads, and it '
                "queued a write or a check; nothing was written. Run it with "
                'reads="primary" (the default) to write'
            )

    async def read(
        self, queries: Sequence[CompiledQuery], then: Then | None = None
    ) -> list[QueryResult]:
        self.refuse_writes()
        held = self._held
        if held is None:
            return await self._first_read(queries, then)
        try:
            return await held.read(queries, then)
        except REPLICA_FAILURES as exc:
            if self._replica is not None and self._replicas is not None:
                self._replicas.failed(self._replica, exc)
            raise

    async def _first_read(
        self, queries: Sequence[CompiledQuery], then: Then | None
    ) -> list[QueryResult]:
        replicas = self._replicas
        if replicas is not None and current_transaction(self._primary) is None:
            replica = await replicas.choose()
            if replica is not None:
                self._held, self._replica = self._hold(replica.engine, False), replica
                try:
                    results = await self._held.read(queries, then)
                except REPLICA_FAILURES as exc:
                    replicas.failed(replica, exc)
                    await self.release()
                else:
                    replicas.stats.replica_reads += 1
                    return results
            replicas.stats.replica_fallbacks += 1
        self._held = self._hold(self._primary, True)
        return await self._held.read(queries, then)

    async def release(self) -> None:
        held, self._held, self._replica = self._held, None, None
        if held is not None:
            await held.release()
