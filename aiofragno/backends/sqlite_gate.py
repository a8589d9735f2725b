"""SQLite's write gate: one writing transaction at a time per Database, in
the order the writers came, and the writer thread that runs a unit's
transaction start to finish.

SQLite allows one writer per database file. Inside one process, writers
queue here instead of polling SQLite's busy handler, so none fails with
"database is locked". Two kinds of writer wait in the one queue:

- a *turn*: a connection that writes on its own thread over several calls
  (a ``db.transaction()``, a write outside a transaction, a writing stream),
  holding the gate from its first statement until it ends;
- a *job*: a whole transaction handed over at once — BEGIN, its statements
  and their checks, COMMIT (a unit of work's mutation phase) — which runs
  on the gate's own writer connection, on that connection's thread.

Jobs that follow one another run back to back on the writer's thread: the
gate passes from one to the next there, without a trip through the event
loop, and the writer's page cache stays warm (a connection's cache is
dropped whenever another connection has written). Where the backend has no
writer (aiosqlite, a ``:memory:`` database, whose other connections would
be other databases) every writer takes turns.

Waiting here counts against ``busy_timeout`` like waiting for another
process's lock does, so a writer gives up after about that long in all.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Literal, Protocol

from .. import runtime
from ..driver import QueryResult
from ..errors import LockTimeout
from ..slots import Alarm
from .sqlite_lock_sharing import LockSharing
from .thread_reply import Reply

# A job's transaction, run on the writer's connection in its thread: BEGIN,
# the statements, COMMIT (or stopped before it); their results.
Transaction = Callable[[sqlite3.Connection], list[QueryResult]]


class Writer(Protocol):
    """The gate's own connection, which runs jobs."""

    def post(self, run: Callable[[sqlite3.Connection], object]) -> None:
        """Call ``run(connection)`` on the connection's thread, after what
        was posted before; nobody waits for it (it must not raise)."""
        ...

    def interrupt(self) -> None:
        """Stop the statement running on the connection (thread-safe)."""
        ...

    async def close(self) -> None: ...


class CommitGuard:
    """Lets a cancelled caller interrupt a transaction's statements up to
    its COMMIT, and not once COMMIT has started: an interrupted COMMIT could
    leave the caller unsure whether it applied while the transaction is in
    fact gone. Once :meth:`finish`\\ ed it interrupts nothing (the thread
    may be running someone else's statements by then)."""

    def __init__(self, interrupt: Callable[[], None], *, started: bool = True) -> None:
        self._lock = threading.Lock()
        self._interrupt = interrupt
        self._state: Literal["ready", "running", "interrupted", "committing", "done"] = (
            "running" if started else "ready"
        )

    def interrupt(self) -> None:
        """From the caller's side: stop the transaction unless COMMIT has
        started (or it has ended)."""
        with self._lock:
            if self._state == "running":
                self._interrupt()
            if self._state in ("ready", "running"):
                self._state = "interrupted"

    def start(self) -> bool:
        """From the thread: the transaction starts; False if its caller has
        gone already (it must not run)."""
        with self._lock:
            if self._state == "interrupted":
                return False
            self._state = "running"
            return True

    def commit(self, raw: sqlite3.Connection) -> None:
        """From the thread: COMMIT, unless the caller has gone."""
        with self._lock:
            if self._state == "interrupted":
                # (sqlite3's interrupt is lost when no statement was running.)
                raise sqlite3.OperationalError("interrupted before COMMIT")
            self._state = "committing"
        raw.execute("COMMIT").close()

    def finish(self) -> None:
        """From the thread: the transaction is over."""
        with self._lock:
            self._state = "done"


class _Turn:
    """A connection waiting to write on its own thread."""

    __slots__ = ("deadline", "reply", "state")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.reply: Reply[None] = Reply()
        self.state: Literal["queued", "granted", "gone"] = "queued"


class _Job:
    """A transaction waiting to run on the writer."""

    __slots__ = ("deadline", "guard", "reply", "state", "transaction")

    def __init__(self, deadline: float, transaction: Transaction, guard: CommitGuard) -> None:
        self.deadline = deadline
        self.transaction = transaction
        self.guard = guard
        # None: the gate is the caller's, to run the transaction itself.
        self.reply: Reply[list[QueryResult] | None] = Reply()
        # "posted": to the writer, which holds the gate for it.
        self.state: Literal["queued", "granted", "posted", "gone"] = "queued"

    def run(self, raw: sqlite3.Connection) -> None:
        """On the writer's thread: the transaction, rolled back unless it
        committed; its results or error to the caller. Never raises."""
        ok, value = self._outcome(raw)
        self.guard.finish()
        try:
            if raw.in_transaction:  # stopped before COMMIT, or COMMIT failed
                raw.execute("ROLLBACK").close()
        except Exception as exc:  # (the next job tries again first)
            if ok:
                ok, value = False, exc
        self.reply.send(ok, value)

    def _outcome(self, raw: sqlite3.Connection) -> tuple[bool, object]:
        try:
            if raw.in_transaction:  # (a ROLLBACK before failed)
                raw.execute("ROLLBACK").close()
            if not self.guard.start():
                return False, sqlite3.OperationalError("interrupted before it started")
            return True, self.transaction(raw)
        except BaseException as exc:  # handed to the caller
            return False, exc

    def refuse(self, exc: BaseException) -> None:
        """The job will not run: ``exc`` for its caller."""
        self.reply.send(False, exc)


class WriteGate:
    """Admits one writing transaction at a time, first come first served:
    turns (:meth:`acquire`, :meth:`release`) and jobs (:meth:`run_alone`)
    alike. Thread-safe: the writer's thread passes the gate on as a job
    ends. Without a writer (:meth:`use_writer`) every writer takes turns."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._held = False
        self._queue: deque[_Turn | _Job] = deque()
        self._alarm = Alarm(self._expire)
        self._open_writer: Callable[[], Awaitable[Writer]] | None = None
        self._writer: Writer | None = None
        self._closed = False
        # Turns granted (this Database's connections' own writes), and as
        # many as the writer had seen at its last run (its thread's alone).
        self._turns = 0
        self._turns_seen = 0
        self._sharing = LockSharing()  # (the writer's thread's alone)

    def use_writer(self, open_writer: Callable[[], Awaitable[Writer]]) -> None:
        """Run jobs on a writer that ``open_writer`` opens, on the first job."""
        self._open_writer = open_writer

    async def acquire(self) -> None:
        """Wait for the gate, for a connection's own writes: raises
        :class:`~aiofragno.LockTimeout` after ``timeout`` seconds."""
        with self._lock:
            if not self._held:
                self._held = True
                self._turns += 1
                return
            turn = _Turn(self._deadline())
            self._queue.append(turn)
        self._alarm.set(self._timeout)
        try:
            await turn.reply.wait()
        except BaseException:
            with self._lock:
                granted = turn.state == "granted"
                self._leave(turn)
            if granted:  # handed the gate as it was cancelled: pass it on
                self.release()
            raise

    def release(self) -> None:
        """Give the gate back (after :meth:`acquire`, or a :meth:`run_alone`
        that returned None): to the next in line."""
        job = self._pass_on()
        if job is None:
            return
        writer = self._writer
        if writer is not None:
            writer.post(partial(self._run_jobs, job))
            return
        # (No writer: closed, or it failed to open.) The job's caller runs
        # its transaction itself, holding the gate.
        with self._lock:
            job.state = "granted"
        job.reply.send(True, None)

    async def run_alone(
        self, transaction: Transaction, guard: CommitGuard
    ) -> list[QueryResult] | None:
        """``transaction`` on the writer, in its turn: its results, or the
        exception it raised. None where there is no writer: the caller has
        the gate then (as after :meth:`acquire`), to run the transaction on
        its own connection and :meth:`release` it. ``guard`` was made
        ``started=False`` with :meth:`interrupt_writer`. A cancelled caller
        leaves the queue, or interrupts the transaction up to its COMMIT;
        one that waited ``timeout`` seconds in the queue gets
        :class:`~aiofragno.LockTimeout`."""
        if self._open_writer is None:
            await self.acquire()
            return None
        job = _Job(self._deadline(), transaction, guard)
        with self._lock:
            first = not self._held
            if first:
                self._held = True
                job.state = "granted"
            else:
                self._queue.append(job)
        if not first:
            self._alarm.set(self._timeout)
        elif not await self._post(job):
            return None
        try:
            return await job.reply.wait()
        except runtime.get_cancelled_exc_class():
            with self._lock:
                state = job.state
                self._leave(job)
            if state == "posted":
                guard.interrupt()
            elif state == "granted":  # handed the gate as it was cancelled
                self.release()
            raise

    async def _post(self, job: _Job) -> bool:
        """``job``, holding the gate, to the writer (opened first if need
        be); False, the gate still held, if there is none."""
        writer = self._writer
        if writer is None:
            try:
                writer = await self._open()
            except BaseException:
                self.release()
                raise
            if writer is None:
                return False
        job.state = "posted"
        writer.post(partial(self._run_jobs, job))
        return True

    def interrupt_writer(self) -> None:
        """Stop the writer's running statement (a :class:`CommitGuard`'s)."""
        if self._writer is not None:
            self._writer.interrupt()

    async def close(self) -> None:
        """Close the writer, once the jobs posted to it have run; jobs that
        still wait run on their callers' connections."""
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()

    async def _open(self) -> Writer | None:
        """The writer, opened by the job holding the gate; None if closed,
        or if opening failed (tried again by a later job)."""
        if self._open_writer is None or self._closed:
            return None
        try:
            writer = await self._open_writer()
        except Exception:
            return None  # (the connections' own errors show on their own)
        if self._closed:  # (while it opened)
            with runtime.shielded(runtime.CLEANUP_TIMEOUT):
                await writer.close()
            return None
        self._writer = writer
        return writer

    def _run_jobs(self, job: _Job, raw: sqlite3.Connection) -> None:
        """On the writer's thread: ``job``, then each job the gate passes on
        to, until it goes to a turn or nobody waits; letting SQLite's lock
        go now and then for other processes (:mod:`.sqlite_lock_sharing`)."""
        turns = self._turns
        self._sharing.run_starts(raw, others_wrote=turns != self._turns_seen)
        self._turns_seen = turns
        while True:
            job.run(raw)
            next_job = self._pass_on()
            if next_job is None:
                self._sharing.run_ends()
                return
            self._sharing.between_jobs(raw)  # (the gate held: for other processes)
            job = next_job

    def _pass_on(self) -> _Job | None:
        """The gate to the next in line (from any thread): a turn is woken,
        a job returned (marked posted) to be run; free if nobody waits."""
        with self._lock:
            if not self._queue:
                self._held = False
                return None
            entry = self._queue.popleft()
            if isinstance(entry, _Job):
                entry.state = "posted"
                return entry
            entry.state = "granted"
            self._turns += 1
        entry.reply.send(True, None)
        return None

    def _leave(self, entry: _Turn | _Job) -> None:
        """(Under the lock.) ``entry`` gives up: out of the queue if still
        in it."""
        if entry.state == "queued":
            self._queue.remove(entry)
        entry.state = "gone"

    def _deadline(self) -> float:
        return runtime.loop_time() + self._timeout

    def _expire(self) -> float | None:
        """The alarm: whoever waited ``timeout`` in the queue gives up
        (:class:`~aiofragno.LockTimeout`); the delay to the next deadline."""
        now = runtime.loop_time()
        expired: list[_Turn | _Job] = []
        with self._lock:
            queue = self._queue
            while queue and queue[0].deadline <= now:
                entry = queue.popleft()
                entry.state = "gone"
                expired.append(entry)
            delay = queue[0].deadline - now if queue else None
        for entry in expired:
            entry.reply.send(False, self._timed_out())
        return delay

    def _timed_out(self) -> LockTimeout:
        return LockTimeout(
            f"waited busy_timeout={self._timeout}s for this process's other writers; "
            "shorten write transactions or raise busy_timeout",
            sqlstate="55P03",
        )
