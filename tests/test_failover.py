"""Beyond one PostgreSQL server: a primary and its streaming standby of the
test's own (tests/pg_replication.py), named together in one URL.

* choosing the server: the primary whatever the order, a standby when asked
  for one, ``ReadOnlyDatabase`` at once for a single standby asked to write;
  a primary fenced read-only meanwhile is waited out, not failed on; idle
  connections to a host that lost one are replaced;
  ``Database.servers()`` and ``doctor`` tell each server's role, timeline
  and replay lag; the sockets get keepalives and ``TCP_USER_TIMEOUT``;
* synchronous replication with the standby gone: a COMMIT that outlives
  command_timeout is settled (committed, found by the look-up, which does
  not itself wait for the standby);
* failover under load with the outbox on — the primary crashed (async
  replication, asyncio) or silently black-holed by a proxy (sync
  replication, trio), the standby promoted: no unit fails, none is applied
  twice, the first success comes within 2 s of the promotion, an outbox
  consumer running meanwhile raises nothing and delivers after the
  promotion; then the old primary is back on its old timeline and fenced
  off.
"""

from __future__ import annotations

import io
import itertools
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.cli import doctor
from tests.conftest import Target
from tests.failover_units import add_key, keys, module_pairs, only_on
from tests.faults import tcp_proxy
from tests.pg_replication import PrimaryServer, ReplicationPair, SharedPairs

pytestmark = pytest.mark.anyio

EVENTS = af.Schema("failover", af.Table("events", af.Column("key", "string")))
WORKERS = 8
# The keys of the units under load (the pair's table has others' too).
LOAD = "load-"
# How long the primary stays gone before the standby is promoted: a crash
# is seen at once; a silent primary after command_timeout (no reply) and
# connect_timeout (a new connection gets none either), 1 s each here.
DOWN = 0.5
DOWN_SILENT = 2.0
# Units keep going this long after the promotion.
AFTER = 0.3


@pytest.fixture
def postgresql(target: Target) -> Target:
    return only_on(target, "postgresql", "streaming replication is PostgreSQL's")


shared_pairs = module_pairs(SharedPairs)


@pytest.fixture
def sync_pair(postgresql: Target, shared_pairs: SharedPairs) -> ReplicationPair:
    """One synchronous pair for the tests that leave it as they found it."""
    return shared_pairs.get(synchronous=True)


async def port_of(db: af.Database) -> int:
    return int(await db.fetch_value(af.sql("SELECT inet_server_port()")))


async def test_the_server_is_chosen_by_its_role(
    postgresql: Target, sync_pair: ReplicationPair
) -> None:
    pair, backend = sync_pair, postgresql.backend
    primary, standby = pair.primary.port, pair.standby.port
    # Standby first: read-write (the default with several hosts) passes it by.
    async with af.connect(pair.url(pair.standby, pair.primary), backend=backend) as db:
        assert await port_of(db) == primary
        assert await db.is_healthy(writable=True)
        await db.migrate(EVENTS)
        await add_key(db, EVENTS, "chosen")
        roles = await _servers_replayed(db, standby)
        assert (roles[primary].role, roles[standby].role) == ("primary", "standby")
        assert roles[primary].timeline == roles[standby].timeline == 1
        assert roles[standby].read_only and roles[standby].replay_lag is not None
        assert roles[standby].replay_lag >= 0 and not roles[primary].fenced
        report = io.StringIO()
        with redirect_stdout(report):
            await doctor(db)
        assert f"127.0.0.1:{standby}: standby, timeline 1, replay lag" in report.getvalue()
    for attrs in ("standby", "prefer-standby", "read-only"):
        url = pair.url(target_session_attrs=attrs)
        async with af.connect(url, backend=backend) as db:
            assert await port_of(db) == standby, attrs
            assert await db.is_healthy(), attrs
            assert not await db.is_healthy(writable=True), attrs
    # No standby in the list: prefer-standby takes what there is.
    url = pair.url(pair.primary, pair.primary, target_session_attrs="prefer-standby")
    async with af.connect(url, backend=backend) as db:
        assert await port_of(db) == primary
    # One standby, asked to write: at once, not after the reconnect deadline.
    started = time.monotonic()
    with pytest.raises(af.ReadOnlyDatabase, match="refuses writes"):
        url = pair.url(pair.standby, target_session_attrs="read-write")
        await af.connect(url, backend=backend, reconnect_deadline=30)
    async with af.connect(pair.url(pair.standby), backend=backend, reconnect_deadline=30) as db:
        with pytest.raises(af.ReadOnlyDatabase):
            await add_key(db, EVENTS, "refused")
        # It answers, but takes no writes.
        assert await db.is_healthy()
        assert not await db.is_healthy(writable=True)
        report = io.StringIO()
        with redirect_stdout(report):
            await doctor(db)
        assert "no server of the URL accepts writes" in report.getvalue()
    assert time.monotonic() - started < 5


async def _servers_replayed(db: af.Database, standby: int) -> dict[int, af.HostStatus]:
    """``db.servers()`` by port, once the standby has replayed what it
    received (until then its lag is the age of a transaction it has not
    replayed yet: unknown, None, right after it started)."""
    with anyio.fail_after(5):
        while True:
            roles = {s.port: s for s in await db.servers()}
            if roles[standby].replay_lag is not None:
                return roles
            await anyio.sleep(0.02)


async def test_tcp_keepalive_and_user_timeout_are_set(
    postgresql: Target, sync_pair: ReplicationPair
) -> None:
    if postgresql.runtime != "asyncio":
        pytest.skip("reads the socket of asyncpg's connection in this loop")
    url = sync_pair.url(tcp_user_timeout="2.5", keepalives_idle="3")
    async with af.connect(url, backend=postgresql.backend) as db:
        session = await db._engine.acquire()
        try:
            raw: Any = session.connection._raw  # type: ignore[attr-defined]
            sock = raw._transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 2500
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 3
        finally:
            await db._engine.release(session)


async def _pids(db: af.Database, n: int) -> set[int]:
    """The server processes of ``n`` connections used at once."""
    pids: set[int] = set()
    together = anyio.Event()

    async def hold() -> None:
        async with db.transaction() as tx:
            pids.add(int(await tx.fetch_value(af.sql("SELECT pg_backend_pid()"))))
            if len(pids) == n:
                together.set()
            await together.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(hold)
    return pids


async def test_idle_connections_go_with_a_lost_one(
    postgresql: Target, sync_pair: ReplicationPair
) -> None:
    url = sync_pair.url(sync_pair.primary)
    async with af.connect(url, backend=postgresql.backend, pool_size=3) as db:
        before = await _pids(db, 3)
        async with af.connect(url, backend=postgresql.backend) as admin:
            await admin.execute(af.sql("SELECT pg_terminate_backend({p})", p=min(before)))
        await anyio.sleep(0.1)  # (the client reads the server's goodbye)
        # The two others were idle and fine, but on a host that just lost a
        # connection: replaced, not handed out.
        assert not (await _pids(db, 3)) & before


async def test_a_primary_turned_read_only_is_waited_out(
    postgresql: Target, sync_pair: ReplicationPair
) -> None:
    """A failover tool fences a primary with default_transaction_read_only
    and makes it writable again (or promotes another): units wait for a
    writable server within the deadline, they do not fail."""
    pair, primary = sync_pair, sync_pair.primary
    async with af.connect(pair.url(), backend=postgresql.backend, reconnect_deadline=10) as db:
        await db.migrate(EVENTS)
        await add_key(db, EVENTS, "warm")  # (an idle connection)
        key = f"fenced-{uuid.uuid4()}"

        async def unit() -> None:
            await add_key(db, EVENTS, key)

        await _reconfigure(primary, "SET default_transaction_read_only = on")
        try:
            # (pg_reload_conf() only signals: an idle connection takes the
            # setting when the signal reaches it, which may come after its
            # next command. Until then the unit could write and never wait.)
            with anyio.fail_after(5):
                read_only = af.sql("SHOW default_transaction_read_only")
                while True:
                    if await db.fetch_value(read_only) == "on":
                        break
                    await anyio.sleep(0.01)
            async with anyio.create_task_group() as tg:
                tg.start_soon(unit)
                # Until the unit has met the read-only primary and waits (a
                # fixed pause was too short on a loaded machine).
                with anyio.fail_after(8):
                    while True:
                        if db.stats.lost_connection_retries >= 1:
                            break
                        await anyio.sleep(0.02)
                await _reconfigure(primary, "RESET default_transaction_read_only")
        finally:
            await _reconfigure(primary, "RESET default_transaction_read_only")
        assert db.stats.lost_connection_retries >= 1
        assert (await keys(db, EVENTS)).count(key) == 1


async def _reconfigure(server: PrimaryServer, change: str) -> None:
    """``ALTER SYSTEM <change>`` on ``server``, in force for every session."""
    for statement in (f"ALTER SYSTEM {change}", "SELECT pg_reload_conf()"):
        await anyio.to_thread.run_sync(server.query_blocking, statement)


async def test_a_commit_waiting_for_a_lost_sync_standby_is_settled(
    postgresql: Target, sync_pair: ReplicationPair
) -> None:
    pair = sync_pair
    async with af.connect(
        pair.url(pair.primary),
        backend=postgresql.backend,
        outbox="counter",  # (its look-up takes a row lock: a transaction id to commit)
        command_timeout=0.5,
        reconnect_deadline=10,
    ) as db:
        await db.migrate(EVENTS)
        await add_key(db, EVENTS, "before")
        await pair.standby.stop("crash")
        key = f"waited-{uuid.uuid4()}"
        try:
            started = time.monotonic()
            # COMMIT waits for the standby; after command_timeout it is
            # ambiguous, and the look-up finds the unit committed (locally).
            await add_key(db, EVENTS, key)
            assert time.monotonic() - started < 8
            assert db.stats.commits_resolved == 1
            assert (await keys(db, EVENTS)).count(key) == 1
        finally:
            await pair.standby.start()
            await anyio.to_thread.run_sync(pair.wait_streaming)


@pytest.fixture
def failover_pair(postgresql: Target, shared_pairs: SharedPairs) -> Iterator[ReplicationPair]:
    """A pair of the test's own (it promotes the standby): asynchronous
    under asyncio, synchronous under trio (the module's, taken over: this
    test runs after the others)."""
    synchronous = postgresql.runtime == "trio"
    pair = shared_pairs.take(synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.close()


async def test_failover_under_load(failover_pair: ReplicationPair, postgresql: Target) -> None:
    pair, backend = failover_pair, postgresql.backend
    silent = pair.primary.synchronous  # (the trio run: the primary vanishes without a word)
    async with tcp_proxy("127.0.0.1", pair.primary.port) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port},127.0.0.1:{pair.standby.port}/test"
        async with af.connect(
            url,
            backend=backend,
            outbox=True,
            connect_timeout=1,
            command_timeout=1,
            reconnect_deadline=30,
            pool_size=WORKERS,
        ) as db:
            await db.migrate(EVENTS)
            done, promoted = await _load(db, pair, proxy, silent)
            # (Units did meet the loss, and rode it out.)
            stats = db.stats
            assert stats.lost_connection_retries + stats.commits_resolved > 0
        # Every unit that returned is there once; none is there twice.
        async with af.connect(pair.url(pair.standby), backend=backend) as new:
            stored = [key for key in await keys(new, EVENTS) if key.startswith(LOAD)]
        assert len(stored) == len(set(stored)), "a unit was applied twice"
        after = [t - promoted for t in done.values() if t > promoted]
        assert after and min(after) < 2.0, f"first success {min(after, default=None)}s after"
        missing = set(done) - set(stored)
        if pair.primary.synchronous:
            assert not missing
        # (Asynchronous replication may lose what the crashed primary had
        # not yet sent: at most the units in flight at the crash.)
        assert len(missing) <= WORKERS
        # The old primary comes back on its old timeline: fenced off, even
        # listed first to a new Database.
        if silent:
            proxy.stall(False)
        else:
            await pair.primary.start()
        async with af.connect(url, backend=backend, connect_timeout=1) as db:
            assert await port_of(db) == pair.standby.port
            fenced = [s for s in await db.servers() if s.fenced]
            assert [s.port for s in fenced] == [proxy.port]
            assert fenced[0].role == "primary" and fenced[0].timeline == 1


async def _load(
    db: af.Database, pair: ReplicationPair, proxy: Any, silent: bool
) -> tuple[dict[str, float], float]:
    """WORKERS tasks running units while the primary is lost and the standby
    promoted; every unit must return. The time each unit's key returned,
    and when the promotion ended."""
    done: dict[str, float] = {}
    counter = itertools.count()
    promoted = float("inf")
    stop = anyio.Event()
    succeeded_after = anyio.Event()
    consumed_after = anyio.Event()  # (the consumer delivered after the promotion)

    async def worker() -> None:
        while not stop.is_set():
            key = f"{LOAD}{next(counter)}"
            await add_key(db, EVENTS, key)
            done[key] = time.monotonic()
            if done[key] > promoted:
                succeeded_after.set()

    async def consume(entry: af.OutboxEntry) -> None:
        if time.monotonic() > promoted:
            consumed_after.set()

    async def consumer() -> None:
        # (Rides out the failover too: what it raised would end the test.)
        await db.outbox.consumer("failover").run(consume, stop=stop.is_set, poll_interval=0.05)

    async with anyio.create_task_group() as tg:
        for _ in range(WORKERS):
            tg.start_soon(worker)
        tg.start_soon(consumer)
        await anyio.sleep(0.3)
        if silent:
            proxy.stall(True)
        else:
            await pair.primary.stop("crash")
        await anyio.sleep(DOWN_SILENT if silent else DOWN)
        await pair.standby.promote()
        promoted = time.monotonic()
        await anyio.sleep(AFTER)
        with anyio.fail_after(30):
            await succeeded_after.wait()
            await consumed_after.wait()
        stop.set()
    return done, promoted
