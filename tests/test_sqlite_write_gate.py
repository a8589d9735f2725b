"""SQLite's write gate (aiofragno.backends.sqlite_gate), under asyncio and
trio, on a database file with the standard library's backend: units of
work's transactions run as jobs on the gate's writer, one after another on
its thread without waiting for the event loop; jobs and other writers
(``db.transaction()``) pass the gate in the order they came; a job that
gave up — cancelled in the queue, timed out, failed, or stopped by a
conflict — wrote nothing and left the writer ready for the next; closing
the Database ends the writer's thread."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.backends.sqlite import _Worker
from aiofragno.backends.sqlite_gate import CommitGuard, WriteGate, Writer
from aiofragno.driver import QueryResult

pytestmark = pytest.mark.anyio

SCHEMA = af.Schema(
    "gate",
    af.Table(
        "notes",
        af.Column("n", "bigint"),
        af.Column("tag", "string", nullable=True),
        af.Index("by_tag", ["tag"], unique=True),
    ),
)


@asynccontextmanager
async def database(tmp_path: Path, **options: Any) -> AsyncIterator[af.Database]:
    url = f"sqlite:///{tmp_path}/g.db"
    async with af.connect(url, backend="sqlite", pool_size=POOL, **options) as db:
        await db.migrate(SCHEMA)
        # A first unit opens the writer, and every connection of the pool is
        # opened: from now on the schema is known and a unit's way to the
        # gate is one step of its task (``wait_all_tasks_blocked`` means
        # "queued at the gate").
        await write(db, -1)
        await open_every_connection(db)
        yield db


POOL = 6


async def open_every_connection(db: af.Database) -> None:
    async def hold(opened: list[int], all_open: anyio.Event) -> None:
        async with db.stream(af.sql("SELECT 1")) as rows:
            async for _ in rows:
                opened.append(1)
                if len(opened) == POOL:
                    all_open.set()
                await all_open.wait()

    opened: list[int] = []
    all_open = anyio.Event()
    async with anyio.create_task_group() as tg:
        for _ in range(POOL):
            tg.start_soon(hold, opened, all_open)


def table_name(db: af.Database) -> str:
    return db.layout(SCHEMA).table("notes").identifier.parts[-1]


def rows_in_file(tmp_path: Path, table: str) -> list[int]:
    """The notes' numbers in the order they were written, read straight from
    the file (no event loop involved); not the first unit's."""
    raw = sqlite3.connect(f"{tmp_path}/g.db")
    try:
        return [n for (n,) in raw.execute(f'SELECT n FROM "{table}" WHERE n >= 0 ORDER BY _id')]
    finally:
        raw.close()


async def write(db: af.Database, n: int, tag: str | None = None, **options: Any) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("notes", {"n": n, "tag": tag})

    await db.execute_uow(unit, schema=SCHEMA, **options)


async def hold_gate(
    db: af.Database, holding: anyio.Event, let_go: anyio.Event, then: Callable[[], object]
) -> None:
    """A transaction of our own that writes (taking the gate) and keeps it
    until ``let_go``; ``then`` runs right after its COMMIT, in this task."""
    async with db.transaction() as tx:
        await tx.execute(
            af.sql("INSERT INTO {t} (id, n) VALUES ('held', 0)", t=af.Identifier(table_name(db)))
        )
        holding.set()
        await let_go.wait()
    then()


async def test_queued_units_commit_one_after_another_without_the_event_loop(
    tmp_path: Path,
) -> None:
    """Three units queue behind a transaction holding the gate. Right after
    that transaction commits, its task blocks the event loop: the three
    commit meanwhile, passed from one to the next on the writer's thread."""
    seen: list[list[int]] = []
    async with database(tmp_path) as db:
        table = table_name(db)

        def block_the_loop() -> None:
            deadline = time.monotonic() + 5
            while len(rows := rows_in_file(tmp_path, table)) < 4 and time.monotonic() < deadline:
                time.sleep(0.01)  # (synchronous: nothing else runs in this loop)
            seen.append(rows)

        holding, let_go = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_gate, db, holding, let_go, block_the_loop)
            await holding.wait()
            for n in (1, 2, 3):
                tg.start_soon(write, db, n)
                await anyio.wait_all_tasks_blocked()
            assert rows_in_file(tmp_path, table) == []  # (all waiting: nothing committed)
            let_go.set()
    assert seen == [[0, 1, 2, 3]]


async def test_units_and_transactions_pass_the_gate_in_the_order_they_came(
    tmp_path: Path,
) -> None:
    async def transaction(db: af.Database, n: int) -> None:
        async with db.transaction() as tx:
            await tx.execute(
                af.sql(
                    "INSERT INTO {t} (id, n) VALUES ({i}, {n})",
                    t=af.Identifier(table_name(db)),
                    i=f"tx{n}",
                    n=n,
                )
            )

    async with database(tmp_path) as db:
        holding, let_go = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_gate, db, holding, let_go, lambda: None)
            await holding.wait()
            for n, writer in enumerate([write, transaction, write, write, transaction], 1):
                tg.start_soon(writer, db, n)
                await anyio.wait_all_tasks_blocked()
            let_go.set()
        assert rows_in_file(tmp_path, table_name(db)) == [0, 1, 2, 3, 4, 5]


async def test_a_unit_cancelled_in_the_queue_writes_nothing_and_holds_nobody_up(
    tmp_path: Path,
) -> None:
    async with database(tmp_path) as db:
        holding, let_go = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_gate, db, holding, let_go, lambda: None)
            await holding.wait()
            tg.start_soon(write, db, 1)
            await anyio.wait_all_tasks_blocked()
            doomed = anyio.CancelScope()
            tg.start_soon(_cancelled_write, db, doomed)
            await anyio.wait_all_tasks_blocked()
            doomed.cancel()
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(write, db, 3)
            await anyio.wait_all_tasks_blocked()
            let_go.set()
        with anyio.fail_after(10):
            await write(db, 4)
        assert rows_in_file(tmp_path, table_name(db)) == [0, 1, 3, 4]


async def _cancelled_write(db: af.Database, scope: anyio.CancelScope) -> None:
    with scope:
        await write(db, 2)


async def test_a_unit_that_waited_busy_timeout_gives_up_having_written_nothing(
    tmp_path: Path,
) -> None:
    async with database(tmp_path, busy_timeout=0.3) as db:
        holding, let_go = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold_gate, db, holding, let_go, lambda: None)
            await holding.wait()
            started = anyio.current_time()
            with pytest.raises(af.ConcurrencyConflict) as raised:
                await write(db, 1, retry=af.NoRetry())
            assert isinstance(raised.value.__cause__, af.LockTimeout)
            assert 0.25 < anyio.current_time() - started < 3
            let_go.set()
        await write(db, 2)
        assert rows_in_file(tmp_path, table_name(db)) == [0, 2]


async def test_failed_and_conflicted_units_leave_the_writer_ready(tmp_path: Path) -> None:
    """A unique violation fails its unit's COMMIT job, a stale version stops
    another before COMMIT: the writer rolls each back at once, and the
    units queued behind them commit."""
    async with database(tmp_path) as db:
        await write(db, 1, tag="only")

        async def make(uow: af.UnitOfWork) -> af.RowId:
            return uow.create("notes", {"n": 2})

        row = await db.execute_uow(make, schema=SCHEMA)

        async def stale(uow: af.UnitOfWork) -> None:
            uow.update("notes", af.RowId(str(row), 7), {"n": 20}, check=True)

        outcomes: list[str] = []

        async def expect(error: type[Exception], run: Awaitable[None]) -> None:
            with pytest.raises(error):
                await run
            outcomes.append(error.__name__)

        async with anyio.create_task_group() as tg:
            tg.start_soon(expect, af.UniqueViolation, write(db, 3, tag="only"))
            tg.start_soon(
                expect,
                af.ConcurrencyConflict,
                db.execute_uow(stale, schema=SCHEMA, retry=af.NoRetry()),
            )
            for n in (4, 5):
                tg.start_soon(write, db, n)
        assert sorted(outcomes) == ["ConcurrencyConflict", "UniqueViolation"]
        assert sorted(rows_in_file(tmp_path, table_name(db))) == [1, 2, 4, 5]


async def test_closing_the_database_ends_the_writers_thread(tmp_path: Path) -> None:
    before = sqlite_threads()
    async with database(tmp_path) as db:
        await write(db, 1)
        ours = sqlite_threads() - before
        assert len(ours) == POOL + 1  # (the pool's connections and the writer)
    for thread in ours:
        await anyio.to_thread.run_sync(thread.join, 5)
        assert not thread.is_alive()


# The gate itself, with a writer of its own: a job cancelled while its
# statements run is interrupted before COMMIT, and the next job runs.


class _ThreadWriter:
    def __init__(self, path: str) -> None:
        self.worker = _Worker()
        self.raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def post(self, run: Callable[[sqlite3.Connection], object]) -> None:
        self.worker.post(partial(run, self.raw))

    def interrupt(self) -> None:
        self.raw.interrupt()

    async def close(self) -> None:
        await self.worker.run(self.raw.close)
        self.worker.stop()


async def test_a_job_cancelled_while_it_runs_stops_before_commit(tmp_path: Path) -> None:
    path = str(tmp_path / "jobs.db")
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE t (i integer)")
    setup.close()
    writer = _ThreadWriter(path)
    gate = WriteGate(timeout=5)

    async def open_writer() -> Writer:
        return writer

    gate.use_writer(open_writer)
    inside, go_on = threading.Event(), threading.Event()

    def transaction(i: int, guard: CommitGuard, raw: sqlite3.Connection) -> list[QueryResult]:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO t VALUES (?)", (i,))
        if i == 1:
            inside.set()
            go_on.wait(5)
        guard.commit(raw)
        return []

    async def job(i: int) -> list[QueryResult] | None:
        guard = CommitGuard(gate.interrupt_writer, started=False)
        return await gate.run_alone(partial(transaction, i, guard), guard)

    async with anyio.create_task_group() as tg:
        tg.cancel_scope.deadline = anyio.current_time() + 10
        first = anyio.CancelScope()
        tg.start_soon(_in_scope, first, job(1))
        await anyio.to_thread.run_sync(inside.wait, 5)
        first.cancel()
        await anyio.wait_all_tasks_blocked()
        go_on.set()
        assert await job(2) == []
    await gate.close()
    check = sqlite3.connect(path)
    assert check.execute("SELECT i FROM t").fetchall() == [(2,)]
    check.close()


async def _in_scope(scope: anyio.CancelScope, run: Awaitable[object]) -> None:
    with scope:
        await run


OTHER_PROCESS = r"""
import sqlite3, sys, time
raw = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10.0)
raw.execute("CREATE TABLE IF NOT EXISTS other (x integer)")
ok = locked = 0
first = worst = 0.0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    started = time.monotonic()
    try:
        raw.execute("BEGIN IMMEDIATE")
        raw.execute("INSERT INTO other VALUES (1)")
        raw.execute("COMMIT")
        ok += 1
    except sqlite3.OperationalError:
        locked += 1
    if ok + locked == 1:
        first = time.monotonic() - started
    else:
        worst = max(worst, time.monotonic() - started)
    time.sleep(0.02)
print(ok, locked, first, worst)
"""


async def test_another_process_writes_while_units_run_back_to_back(tmp_path: Path) -> None:
    """Units queue without pause on the writer while another process writes
    every 20 ms. Its first write waits for one of the writer's short pauses
    (a millisecond every 10 to 30 ms); once it has committed in one, the
    writer lets SQLite's lock go often enough for each of its later writes
    to get in well within its busy timeout (see
    aiofragno.backends.sqlite_lock_sharing)."""
    async with database(tmp_path) as db:
        stop = anyio.Event()

        async def writer() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                await write(db, 100 + n)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(writer)
            other = [sys.executable, "-c", OTHER_PROCESS, f"{tmp_path}/g.db", "3"]
            ok, locked, first, worst = (await anyio.run_process(other)).stdout.split()
            stop.set()
        assert int(locked) == 0 and int(ok) > 30, (ok, locked, first, worst)
        assert float(worst) < 1.0, (ok, locked, first, worst)


async def test_a_writer_opened_as_the_database_closes_is_closed_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first unit opens the writer; the Database is closed while that
    connection is being set up. The writer must not outlive the close."""
    opening, go_on = anyio.Event(), anyio.Event()
    use_writer = WriteGate.use_writer

    def slow_writer(gate: WriteGate, open_writer: Callable[[], Awaitable[Writer]]) -> None:
        async def opened_slowly() -> Writer:
            writer = await open_writer()
            opening.set()
            await go_on.wait()
            return writer

        use_writer(gate, opened_slowly)

    monkeypatch.setattr(WriteGate, "use_writer", slow_writer)
    before = sqlite_threads()
    db = await af.connect(f"sqlite:///{tmp_path}/g.db", backend="sqlite", pool_size=1)
    await db.migrate(SCHEMA)  # (transactions: the writer is not opened yet)

    async def unit_as_it_closes() -> None:
        with contextlib.suppress(af.Error):
            await write(db, 1)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(unit_as_it_closes)
            await opening.wait()
            await db.close()
            go_on.set()
    for thread in sqlite_threads() - before:
        await anyio.to_thread.run_sync(thread.join, 5)
        assert not thread.is_alive()


def sqlite_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "aiofragno-sqlite"}
