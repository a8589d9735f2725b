"""The connection pool with real connections: the thread-based SQLite backend on
a temporary file (under asyncio and trio), and PostgreSQL / MariaDB where a
server runs. Connection identity is observed through ``db._engine.acquire()``."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.backends import sqlite as sqlite_backend
from aiofragno.driver import Connection
from aiofragno.pool import Pool
from aiofragno.url import Options, parse_url
from tests.conftest import TARGETS, Target, require_target, selected_targets
from tests.faults import kill_mysql_connection, terminate_postgres_backend

pytestmark = pytest.mark.anyio

SELECT_1 = af.sql("SELECT 1")


@pytest.fixture
def anyio_backend() -> str:
    """Replaced by the runtimes tests/conftest.py parametrizes; defined here so
    that anyio's own (parametrized) fixture does not clash with that."""
    return "asyncio"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "pool.db"


def lite(path: Path, **options: Any) -> af.Connect:
    return af.connect(f"sqlite:///{path}", backend="sqlite", **options)


async def connection_of(db: af.Database) -> Connection:
    """The connection the pool hands out next (returned straight away)."""
    session = await db._engine.acquire()
    try:
        return session.connection
    finally:
        await db._engine.release(session)


def raw_is_closed(connection: Connection) -> bool:
    raw: sqlite3.Connection = connection._raw  # type: ignore[attr-defined]
    try:
        raw.total_changes  # noqa: B018  (raises once closed, without I/O)
    except sqlite3.ProgrammingError:
        return True
    return False


# -------------------------------------------------------- closed underneath / health


@pytest.mark.parametrize("pre_ping", [False, True], ids=["no-ping", "pre-ping"])
async def test_sqlite_connection_closed_underneath_is_replaced(path: Path, pre_ping: bool) -> None:
    """The raw sqlite3 connection of an idle pooled connection is closed behind
    the pool's back. The next caller must get a working connection, not
    "Cannot operate on a closed database"."""
    async with lite(path, pool_size=1, pre_ping=pre_ping) as db:
        first = await connection_of(db)
        first._raw.close()  # type: ignore[attr-defined]
        assert await db.fetch_value(SELECT_1) == 1
        second = await connection_of(db)
        assert second is not first
        assert await db.fetch_value(af.sql("SELECT 2")) == 2


async def test_sqlite_connection_closed_underneath_does_not_poison_the_pool(path: Path) -> None:
    """Even if one caller does see the error, the dead connection must not be
    put back: the following call works."""
    async with lite(path, pool_size=1) as db:
        first = await connection_of(db)
        first._raw.close()  # type: ignore[attr-defined]
        with contextlib.suppress(af.Error):
            await db.fetch_value(SELECT_1)
        assert await db.fetch_value(SELECT_1) == 1
        assert await connection_of(db) is not first


async def test_connection_closed_by_the_pool_is_replaced(path: Path) -> None:
    async with lite(path, pool_size=1) as db:
        first = await connection_of(db)
        await first.close()  # the Connection knows it is closed
        assert first.is_closed
        assert await db.fetch_value(SELECT_1) == 1
        assert await connection_of(db) is not first


async def test_healthy_connections_are_reused(path: Path) -> None:
    async with lite(path, pool_size=1, pre_ping=True) as db:
        first = await connection_of(db)
        for _ in range(5):
            assert await db.fetch_value(SELECT_1) == 1
        assert await connection_of(db) is first
        assert not raw_is_closed(first)


# ------------------------------------------------------------- lifetime and idle time


async def test_max_lifetime_replaces_old_connections(path: Path) -> None:
    async with lite(path, pool_size=1, max_lifetime=0.3, max_idle=None) as db:
        first = await connection_of(db)
        assert await connection_of(db) is first  # young: reused
        await anyio.sleep(0.4)
        second = await connection_of(db)
        assert second is not first
        assert first.is_closed
        assert raw_is_closed(first)  # closed, not just dropped
        assert await connection_of(db) is second


async def test_max_lifetime_counts_from_creation_not_release(path: Path) -> None:
    async with lite(path, pool_size=1, max_lifetime=0.3, max_idle=None) as db:
        first = await connection_of(db)
        session = await db._engine.acquire()
        assert session.connection is first
        await anyio.sleep(0.4)  # in use past its lifetime: not taken away meanwhile
        assert (await session.execute(db.compile(SELECT_1))).rows[0]["1"] == 1
        await db._engine.release(session)
        # Just released, but too old: replaced.
        assert await connection_of(db) is not first


async def test_max_idle_counts_from_release(path: Path) -> None:
    async with lite(path, pool_size=1, max_idle=0.3, max_lifetime=None) as db:
        session = await db._engine.acquire()
        first = session.connection
        await anyio.sleep(0.4)  # busy, not idle
        await db._engine.release(session)
        assert await connection_of(db) is first  # idle only briefly
        await anyio.sleep(0.4)
        second = await connection_of(db)
        assert second is not first
        assert raw_is_closed(first)


async def test_memory_database_survives_idle_and_lifetime_limits() -> None:
    """``sqlite:///:memory:`` is one connection holding the whole database:
    replacing it (idle too long, too old) silently throws the data away. With
    the default max_idle (600 s) an app idle for ten minutes loses its tables."""
    async with af.connect(
        "sqlite:///:memory:", backend="sqlite", max_idle=0.1, max_lifetime=0.2
    ) as db:
        await db.execute(af.sql("CREATE TABLE kept (x INTEGER)"))
        await db.execute(af.sql("INSERT INTO kept VALUES (1)"))
        await anyio.sleep(0.3)
        assert await db.fetch_value(af.sql("SELECT count(*) FROM kept")) == 1


# ------------------------------------------------------------------------ PoolTimeout


async def test_pool_timeout(path: Path) -> None:
    async with lite(path, pool_size=1, acquire_timeout=0.2) as db:
        held = await db._engine.acquire()
        try:
            started = anyio.current_time()
            with pytest.raises(af.PoolTimeout) as info:
                await db.fetch_value(SELECT_1)
            waited = anyio.current_time() - started
            assert 0.15 <= waited < 2
            assert "pool_size" in str(info.value)
            with pytest.raises(af.PoolTimeout):
                async with db.transaction():
                    pytest.fail("got a transaction without a connection")
        finally:
            await db._engine.release(held)
        # A timed-out wait took nothing: the slot is free again.
        assert await db.fetch_value(SELECT_1) == 1
        session_a = await db._engine.acquire()
        await db._engine.release(session_a)


async def test_waiters_are_served_when_a_connection_comes_back(path: Path) -> None:
    async with lite(path, pool_size=1, acquire_timeout=5) as db:
        held = await db._engine.acquire()
        results: list[int] = []

        async def wait_for_one(i: int) -> None:
            results.append(await db.fetch_value(af.sql("SELECT {i}", i=i)))

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(wait_for_one, i)
            await anyio.wait_all_tasks_blocked()
            assert results == []
            await db._engine.release(held)
        assert sorted(results) == [0, 1, 2]


# ------------------------------------------------------------------------- pool size


async def test_pool_never_exceeds_pool_size(path: Path) -> None:
    size = 4
    async with lite(path, pool_size=size, acquire_timeout=10) as db:
        await db.execute(af.sql("CREATE TABLE hits (task INTEGER)"))
        active = 0
        peak = 0
        seen: list[Connection] = []

        async def task(i: int) -> None:
            nonlocal active, peak
            session = await db._engine.acquire()
            try:
                active += 1
                peak = max(peak, active)
                if all(c is not session.connection for c in seen):
                    seen.append(session.connection)
                await session.execute(db.compile(af.sql("INSERT INTO hits VALUES ({i})", i=i)))
                await anyio.sleep(0.001)
            finally:
                active -= 1
                await db._engine.release(session)
            # And the plain path, also concurrently.
            assert await db.fetch_value(af.sql("SELECT {i}", i=i)) == i

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(task, i)
        assert peak == size  # the pool was really saturated ...
        assert len(seen) <= size  # ... and never opened more than pool_size
        assert await db.fetch_value(af.sql("SELECT count(*) FROM hits")) == 100
        # Everything came back.
        sessions = [await db._engine.acquire() for _ in range(size)]
        for session in sessions:
            await db._engine.release(session)


async def test_memory_database_has_one_connection() -> None:
    async with af.connect("sqlite:///:memory:", backend="sqlite", pool_size=8) as db:
        await db.execute(af.sql("CREATE TABLE t (x INTEGER)"))

        async def insert(i: int) -> None:
            await db.execute(af.sql("INSERT INTO t VALUES ({i})", i=i))

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(insert, i)
        assert await db.fetch_value(af.sql("SELECT count(*) FROM t")) == 20


# ------------------------------------------------------------------------------ close


async def test_close(path: Path) -> None:
    db = await lite(path, pool_size=2)
    in_use = await db._engine.acquire()
    idle_session = await db._engine.acquire()
    idle = idle_session.connection
    await db._engine.release(idle_session)

    await db.close()
    assert db.closed
    assert idle.is_closed and raw_is_closed(idle)  # idle: closed at once
    assert not in_use.connection.is_closed  # in use: still usable ...
    result = await in_use.execute(db.compile(af.sql("SELECT 5")))
    assert result.rows[0]["5"] == 5

    with pytest.raises(af.DatabaseClosed):
        await db.fetch_value(SELECT_1)
    with pytest.raises(af.DatabaseClosed):
        await db._engine.acquire()
    with pytest.raises(af.DatabaseClosed):
        async with db.transaction():
            pytest.fail("transaction on a closed Database")

    await db._engine.release(in_use)  # ... and closed when it comes back
    assert in_use.connection.is_closed and raw_is_closed(in_use.connection)
    await db.close()  # idempotent


async def test_transaction_open_at_close_finishes(path: Path) -> None:
    db = await lite(path, pool_size=2)
    await db.execute(af.sql("CREATE TABLE t (x INTEGER)"))
    async with db.transaction() as tx:
        connection = tx.session.connection
        await db.close()
        await tx.execute(af.sql("INSERT INTO t VALUES (1)"))
    assert connection.is_closed
    async with lite(path) as again:
        assert await again.fetch_value(af.sql("SELECT count(*) FROM t")) == 1


async def test_close_wakes_tasks_waiting_for_a_connection(path: Path) -> None:
    db = await lite(path, pool_size=1, acquire_timeout=5)
    held = await db._engine.acquire()
    outcomes: list[BaseException | int] = []

    async def waiter() -> None:
        try:
            outcomes.append(await db.fetch_value(SELECT_1))
        except af.Error as exc:
            outcomes.append(exc)

    with anyio.fail_after(3):  # a waiter must not sit out its acquire_timeout
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            await db.close()
            await db._engine.release(held)
    assert len(outcomes) == 3
    assert all(isinstance(o, af.DatabaseClosed) for o in outcomes), outcomes
    assert held.connection.is_closed


def _real_pool(path: Path, **kwargs: Any) -> Pool:
    dialect = sqlite_backend.create_dialect(parse_url(f"sqlite:///{path}"), Options())
    return Pool(dialect.connect, **kwargs)


async def test_pool_acquire_after_close(path: Path) -> None:
    pool = _real_pool(path, size=2, acquire_timeout=1)
    a = await pool.acquire()
    b = await pool.acquire()
    await pool.release(b)
    assert pool.stats.idle == 1 and pool.stats.in_use == 1
    await pool.close()
    assert b.is_closed
    assert pool.stats.idle == 0
    with pytest.raises(af.DatabaseClosed):
        await pool.acquire()
    assert not a.is_closed
    await pool.release(a)
    assert a.is_closed
    assert pool.stats.in_use == 0
    await pool.close()


async def test_pool_release_twice_is_refused_and_does_not_free_a_slot(path: Path) -> None:
    pool = _real_pool(path, size=1, acquire_timeout=0.2)
    connection = await pool.acquire()
    await pool.release(connection)
    with pytest.raises(RuntimeError):
        await pool.release(connection)
    again = await pool.acquire()
    with pytest.raises(af.PoolTimeout):  # still only one slot
        await pool.acquire()
    await pool.release(again)
    await pool.close()


async def test_pool_release_with_discard(path: Path) -> None:
    pool = _real_pool(path, size=1, acquire_timeout=1)
    first = await pool.acquire()
    await pool.release(first, discard=True)
    assert first.is_closed and raw_is_closed(first)
    second = await pool.acquire()
    assert second is not first
    await pool.release(second)
    await pool.close()


# ----------------------------------------------------------------------- cancellation


async def _all_slots_usable(db: af.Database, size: int) -> None:
    with anyio.fail_after(3):
        sessions = [await db._engine.acquire() for _ in range(size)]
        for session in sessions:
            assert (await session.execute(db.compile(SELECT_1))).rows[0]["1"] == 1
        for session in sessions:
            await db._engine.release(session)


async def test_cancelled_waiter_does_not_leak_a_slot(path: Path) -> None:
    size = 2
    async with lite(path, pool_size=size, acquire_timeout=0.5) as db:
        held = [await db._engine.acquire() for _ in range(size)]
        with anyio.move_on_after(0.1) as scope:
            async with anyio.create_task_group() as tg:
                for _ in range(10):
                    tg.start_soon(db.fetch_value, SELECT_1)
        assert scope.cancelled_caught
        for session in held:
            await db._engine.release(session)
        await _all_slots_usable(db, size)


async def test_waiter_cancelled_as_a_slot_is_handed_to_it(path: Path) -> None:
    size = 2
    async with lite(path, pool_size=size, acquire_timeout=0.5) as db:
        held = [await db._engine.acquire() for _ in range(size)]
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                tg.start_soon(db.fetch_value, SELECT_1)
            await anyio.wait_all_tasks_blocked()
            # Hand both slots to waiters, then cancel every waiter before any
            # of them has run.
            for session in held:
                await db._engine.release(session)
            tg.cancel_scope.cancel()
        await _all_slots_usable(db, size)


async def test_cancelled_while_opening_a_connection(path: Path) -> None:
    size = 2
    async with lite(path, pool_size=size, acquire_timeout=0.5, max_idle=None) as db:
        # Empty the pool so the next acquires must open new connections.
        sessions = [await db._engine.acquire() for _ in range(size)]
        for session in sessions:
            session.broken = True  # discarded on release
            await db._engine.release(session)
        for delay in (0, 0.0005, 0.001, 0.002, 0.005):
            with anyio.move_on_after(delay):
                async with anyio.create_task_group() as tg:
                    for _ in range(4):
                        tg.start_soon(db.fetch_value, SELECT_1)
        await _all_slots_usable(db, size)


async def test_cancelled_inside_a_transaction_returns_the_connection(path: Path) -> None:
    async with lite(path, pool_size=1, acquire_timeout=0.5) as db:
        await db.execute(af.sql("CREATE TABLE t (x INTEGER)"))
        with anyio.move_on_after(0.05):
            async with db.transaction() as tx:
                await tx.execute(af.sql("INSERT INTO t VALUES (1)"))
                await anyio.sleep(5)
        # Rolled back, and the single slot is free.
        assert await db.fetch_value(af.sql("SELECT count(*) FROM t")) == 0
        async with db.transaction() as tx:
            await tx.execute(af.sql("INSERT INTO t VALUES (2)"))
        assert await db.fetch_value(af.sql("SELECT count(*) FROM t")) == 1


# ---------------------------------------------------------- live servers (pre_ping etc.)


def _server_target(request: pytest.FixtureRequest, backend: str, runtime: str) -> Target:
    target = next((t for t in TARGETS if t.backend == backend and t.runtime == runtime), None)
    if target is None:
        pytest.skip(f"{backend} does not run under {runtime}")
    if target not in selected_targets(request.config):
        pytest.skip(f"{target} not selected (--backend / --runtime)")
    require_target(target)
    return target


@pytest.fixture
async def pg(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[str]:
    yield _server_target(request, "asyncpg", anyio_backend).url(None)


@pytest.fixture
async def my(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[str]:
    yield _server_target(request, "asyncmy", anyio_backend).url(None)


async def test_postgresql_idle_connection_terminated_is_replaced_with_pre_ping(pg: str) -> None:
    async with af.connect(pg, pool_size=1, pre_ping=True) as db:
        pid = await db.fetch_value(af.sql("SELECT pg_backend_pid()"))
        await terminate_postgres_backend(pg, pid)
        with anyio.fail_after(10):
            new_pid = await db.fetch_value(af.sql("SELECT pg_backend_pid()"))
        assert new_pid != pid
        async with db.transaction() as tx:
            assert await tx.fetch_value(af.sql("SELECT pg_backend_pid()")) == new_pid


async def test_postgresql_idle_connection_terminated_is_noticed_without_ping(pg: str) -> None:
    """asyncpg sees the server close the socket: ``is_closed`` turns true, so
    the pool replaces the connection even without pre_ping."""
    async with af.connect(pg, pool_size=1) as db:
        pid = await db.fetch_value(af.sql("SELECT pg_backend_pid()"))
        await terminate_postgres_backend(pg, pid)
        await anyio.sleep(0.2)  # let the driver read the EOF
        with anyio.fail_after(10):
            assert await db.fetch_value(af.sql("SELECT pg_backend_pid()")) != pid


async def test_mysql_idle_connection_killed_is_replaced_with_pre_ping(my: str) -> None:
    async with af.connect(my, pool_size=1, pre_ping=True) as db:
        cid = await db.fetch_value(af.sql("SELECT CONNECTION_ID()"))
        await kill_mysql_connection(my, cid)
        with anyio.fail_after(10):
            new_cid = await db.fetch_value(af.sql("SELECT CONNECTION_ID()"))
        assert new_cid != cid


async def test_postgresql_pool_never_exceeds_pool_size(pg: str) -> None:
    size = 3
    async with af.connect(pg, pool_size=size, acquire_timeout=10) as db:

        async def task() -> int:
            return int(await db.fetch_value(af.sql("SELECT pg_backend_pid() FROM pg_sleep(0.005)")))

        pids: list[int] = []

        async def run() -> None:
            pids.append(await task())

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for _ in range(100):
                    tg.start_soon(run)
        assert len(pids) == 100
        assert len(set(pids)) == size  # every slot used, never more connections
        # The server agrees: this Database's connections are exactly those.
        async with af.connect(pg, pool_size=1) as admin:
            alive = await admin.fetch(
                af.sql("SELECT pid FROM pg_stat_activity WHERE pid IN {p}", p=sorted(set(pids)))
            )
        assert len(alive) == size


async def test_postgresql_pool_timeout_and_close(pg: str) -> None:
    """The Pool's guarantee on a live server: a connection in use when the
    Database is closed keeps working until it is released, then is closed."""
    db = await af.connect(pg, pool_size=1, acquire_timeout=0.2)
    held = await db._engine.acquire()
    try:
        with pytest.raises(af.PoolTimeout):
            await db.fetch_value(SELECT_1)
        await db.close()
        with pytest.raises(af.DatabaseClosed):
            await db.fetch_value(SELECT_1)
        assert not held.connection.is_closed
        result = await held.execute(db.compile(af.sql("SELECT 5 AS five")))
        assert result.rows[0]["five"] == 5
    finally:
        await db._engine.release(held)
    assert held.connection.is_closed
