"""The asyncio bridge: asyncio-only backends (asyncpg, asyncmy) under trio.

Tests taking ``bridged`` run once per bridged target (the trio targets of
asyncio-only backends in ``tests/conftest.py``) and need its server; the rest
exercise the bridge with plain asyncio coroutines and need no server.
Each test starts its own trio run, so the runtime is trio by construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

import aiofragno as af
from aiofragno.backends import BACKENDS, choose_backend, create_dialect
from aiofragno.backends.asyncio_bridge import AsyncioLoopThread, BridgedDialect, BridgedDriver
from aiofragno.pool import PooledDialect
from aiofragno.url import Options, parse_url
from tests.conftest import TARGETS, Target, require_target, selected_runtimes, selected_targets

BRIDGED = [t for t in TARGETS if t.runtime == "trio" and BACKENDS[t.backend].asyncio_only]

SLOW_QUERY = {"postgresql": "SELECT pg_sleep(10)", "mysql": "SELECT SLEEP(10)"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bridged" in metafunc.fixturenames:
        targets = [t for t in selected_targets(metafunc.config) if t in BRIDGED]
        metafunc.parametrize("bridged", targets, ids=[str(t) for t in targets])


@pytest.fixture(autouse=True)
def _only_when_trio_is_selected(request: pytest.FixtureRequest) -> None:
    if "trio" not in selected_runtimes(request.config):
        pytest.skip("the asyncio bridge serves trio; trio is not selected (--runtime)")


@pytest.fixture
def url(bridged: Target) -> str:
    require_target(bridged)
    return bridged.url(None)


def bridge_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("aiofragno-asyncio-")}


def run_checking_threads(main: Callable[[], Awaitable[Any]]) -> None:
    """``trio.run(main)``, then check that every thread it started has ended."""
    before = set(threading.enumerate())
    count = threading.active_count()
    trio.run(main)
    assert set(threading.enumerate()) - before == set()
    assert threading.active_count() <= count


def test_closing_databases_leaks_no_threads(bridged: Target, url: str) -> None:
    async def main() -> None:
        before = bridge_threads()
        dbs = [await af.connect(url, backend=bridged.backend, pool_size=4) for _ in range(3)]
        for db in dbs:
            assert isinstance(db._engine._driver, BridgedDriver)
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(db.fetch_value, af.sql("SELECT 1"))
            assert db._engine._driver.pool.stats.idle >= 2  # several connections to close
        assert len(bridge_threads() - before) == 3, "one loop thread per Database"
        for db in dbs:
            await db.close()
        assert bridge_threads() - before == set()

    run_checking_threads(main)


def test_a_failed_connect_leaks_no_thread(bridged: Target) -> None:
    pytest.importorskip(bridged.module)
    url = {
        "postgresql": "postgresql://postgres@127.0.0.1:1/test",
        "mysql": "mysql://root@127.0.0.1:1/test",
    }

    async def main() -> None:
        with pytest.raises(af.DatabaseUnavailable):
            await af.connect(url[bridged.dialect], backend=bridged.backend, connect_timeout=2)

    run_checking_threads(main)


def test_cancelling_a_slow_query_returns_quickly(bridged: Target, url: str) -> None:
    marker = uuid.uuid4().hex
    slow = f"{SLOW_QUERY[bridged.dialect]} /* {marker} */"

    async def main() -> None:
        async with af.connect(url, backend=bridged.backend, pool_size=3) as db:
            started = trio.current_time()
            with trio.move_on_after(0.3) as scope:
                await db.fetch(db._engine.raw(slow))
            assert scope.cancelled_caught
            assert trio.current_time() - started < 2
            assert db._engine._driver.pool.stats.in_use == 0  # type: ignore[attr-defined]
            results: list[int] = []

            async def one() -> None:
                results.append(await db.fetch_value(af.sql("SELECT 1")))

            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(one)
            assert results == [1] * 10
            assert await db.is_healthy()
            if db.name == "postgresql":
                await server_query_ends(db, marker)

    run_checking_threads(main)


async def server_query_ends(db: af.Database, marker: str) -> None:
    """The cancelled statement stops on the server too (asyncpg sends a cancel
    request from the loop)."""
    running = af.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE {m}",
        m=f"%pg_sleep(10) /* {marker}%",
    )
    for _ in range(60):
        if not await db.fetch_value(running):
            return
        await trio.sleep(0.05)
    pytest.fail("the cancelled query still runs on the server after 3 s")


def test_a_connection_in_use_outlives_close_then_the_thread_stops(
    bridged: Target, url: str
) -> None:
    """The pool's contract holds through the bridge: closing the Database does
    not break a query in flight; the thread ends once that connection is back."""
    # (The query outlasts the bound on close() by far: a loaded machine
    # slows close() down, never to the query's length.)
    pause = {"postgresql": "SELECT 7, pg_sleep(2)", "mysql": "SELECT 7, SLEEP(2)"}

    async def main() -> None:
        before = bridge_threads()
        db = await af.connect(url, backend=bridged.backend)
        results: list[int] = []

        async def query() -> None:
            results.append(await db.fetch_value(db._engine.raw(pause[db.name])))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(query)
            await trio.sleep(0.1)
            started = trio.current_time()
            await db.close()
            assert trio.current_time() - started < 1.0, "close() waited for the query"
            assert len(bridge_threads() - before) == 1
        assert results == [7]
        assert bridge_threads() - before == set()

    run_checking_threads(main)


def test_driver_errors_keep_their_type(bridged: Target, url: str) -> None:
    cause = {"asyncpg": "UniqueViolationError", "asyncmy": "IntegrityError"}[bridged.backend]

    async def main() -> None:
        async with af.connect(url, backend=bridged.backend) as db:
            table = af.Identifier(f"bridge_{uuid.uuid4().hex[:10]}")
            await db.execute(af.sql("CREATE TABLE {t} (i integer PRIMARY KEY)", t=table))
            try:
                await db.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
                with pytest.raises(af.UniqueViolation) as info:
                    await db.execute(af.sql("INSERT INTO {t} (i) VALUES (1)", t=table))
                assert type(info.value.__cause__).__name__ == cause
                assert type(info.value.__cause__).__module__.startswith(bridged.module)
                async with db.transaction() as tx:  # the connection is still fine
                    assert await tx.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table)) == 1
            finally:
                await db.execute(af.sql("DROP TABLE {t}", t=table))

    run_checking_threads(main)


def test_only_trio_gets_the_bridge() -> None:
    pytest.importorskip("asyncpg")
    url = parse_url("postgresql://postgres@127.0.0.1/test")
    backend = choose_backend(url, None, "trio")
    assert backend.name == "asyncpg"
    assert isinstance(create_dialect(backend, url, Options(), "trio"), BridgedDialect)
    native = create_dialect(backend, url, Options(), "asyncio")
    assert isinstance(native, PooledDialect) and not isinstance(native, BridgedDialect)


def test_exceptions_cross_as_the_same_object() -> None:
    boom = KeyError("raised on the loop")

    async def fail() -> None:
        assert threading.current_thread().name.startswith("aiofragno-asyncio-")
        raise boom

    async def main() -> None:
        bridge = AsyncioLoopThread()
        try:
            with pytest.raises(KeyError) as info:
                await bridge.run(fail)
            assert info.value is boom
        finally:
            await bridge.stop()
        assert bridge.thread is not None and not bridge.thread.is_alive()

    run_checking_threads(main)


def test_cancellation_waits_until_the_asyncio_task_has_finished() -> None:
    cleaned_up: list[bool] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.2)  # cleanup that takes a while
            cleaned_up.append(True)
            raise

    async def main() -> None:
        bridge = AsyncioLoopThread()
        try:
            started = trio.current_time()
            with trio.move_on_after(0.1) as scope:
                await bridge.run(slow)
            assert scope.cancelled_caught
            assert cleaned_up == [True], "cancellation propagated before the task finished"
            assert 0.25 < trio.current_time() - started < 2
        finally:
            await bridge.stop()

    run_checking_threads(main)


def test_a_call_in_an_already_cancelled_scope_returns_at_once() -> None:
    async def work() -> None:
        await asyncio.sleep(0)

    async def stall_the_loop_soon() -> None:
        # So that the call and its cancellation reach the loop together, and the
        # task is cancelled before its first step.
        asyncio.get_running_loop().call_soon(time.sleep, 0.2)

    async def main() -> None:
        bridge = AsyncioLoopThread()
        try:
            await bridge.run(stall_the_loop_soon)
            started = trio.current_time()
            with trio.CancelScope() as scope:
                scope.cancel()
                await bridge.run(work)
            assert scope.cancelled_caught
            assert trio.current_time() - started < 1
        finally:
            await bridge.stop()

    run_checking_threads(main)


class FakeConnection:
    is_closed = False
    is_stale = False

    async def close(self) -> None:
        self.is_closed = True


async def open_fake() -> FakeConnection:
    return FakeConnection()


def test_a_connection_opened_despite_cancellation_is_closed() -> None:
    fake = FakeConnection()

    async def stubborn_connect() -> FakeConnection:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)  # a driver finishing its handshake anyway
        return fake

    async def main() -> None:
        bridge = AsyncioLoopThread()
        try:
            with trio.move_on_after(0.1):
                await bridge.connect(stubborn_connect)  # type: ignore[arg-type]
            for _ in range(200):
                if fake.is_closed:
                    break
                await trio.sleep(0.01)
            assert fake.is_closed, "the orphaned connection was not closed"
        finally:
            await bridge.stop()

    run_checking_threads(main)


def test_the_loop_stops_when_the_last_connection_closes_after_stop() -> None:
    async def noop() -> None:
        pass

    async def main() -> None:
        bridge = AsyncioLoopThread()
        first = await bridge.connect(open_fake)  # type: ignore[arg-type]
        second = await bridge.connect(open_fake)  # type: ignore[arg-type]
        await bridge.stop()
        await bridge.stop()  # idempotent
        with pytest.raises(af.DatabaseClosed):
            await bridge.connect(open_fake)  # type: ignore[arg-type]
        await bridge.run(noop)  # still running for the connections in use
        await first.close()
        await first.close()  # idempotent
        assert first.is_closed and not second.is_closed
        assert bridge.thread is not None and bridge.thread.is_alive()
        await second.close()
        assert not bridge.thread.is_alive()
        with pytest.raises(af.DatabaseClosed):
            await bridge.run(noop)

    run_checking_threads(main)


def test_stopping_cleans_up_what_drivers_left_on_the_loop() -> None:
    """Background tasks are cancelled and the default executor's threads (used
    e.g. for getaddrinfo) are joined: nothing outlives the thread."""
    background: list[asyncio.Task[None]] = []

    async def leave_work_behind() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: None)
        background.append(loop.create_task(asyncio.sleep(10)))

    async def main() -> None:
        bridge = AsyncioLoopThread()
        await bridge.run(leave_work_behind)
        started = trio.current_time()
        await bridge.stop()
        assert trio.current_time() - started < 2
        assert background[0].cancelled()

    run_checking_threads(main)
