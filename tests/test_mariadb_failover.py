"""Beyond one MariaDB server: a primary and its replica of the test's own
(tests/mariadb_replication.py), named together in one URL.

* the pair itself: the replica applies the primary's writes (late by the
  link's delay when asked) and refuses the application's writes;
* choosing the server: the primary whatever the order, the replica when
  asked for one, ``ReadOnlyDatabase`` at once for a single replica asked
  to write; a silent host costs connect_timeout once, then the host that
  worked goes first; a primary set read-only meanwhile is waited out, not failed
  on; idle connections to a host that lost one are replaced;
  ``Database.servers()`` and ``doctor`` tell each server's role, writers
  and replica lag;
* failover under load with the outbox on — the primary crashed (SIGKILL),
  the replica promoted (STOP SLAVE; RESET SLAVE ALL; read_only=0): no unit
  fails, none is applied twice, the money they move is all there, the
  first success comes within 2 s of the promotion; then the old primary is
  back with its own writes only and fenced off.
"""

from __future__ import annotations

import io
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import redirect_stdout

import anyio
import pytest

import aiofragno as af
from aiofragno.cli import doctor
from tests.conftest import Target
from tests.failover_units import add_key, keys, module_pairs, only_on
from tests.faults import tcp_proxy
from tests.mariadb_replication import USER, MariaDBPair, SharedPairs

pytestmark = pytest.mark.anyio

WORKERS = 8
BALANCE = 1000
BANK = af.Schema(
    "failover",
    af.Table("events", af.Column("key", "string")),
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint"),
        af.Index("by_owner", ["owner"], unique=True),
    ),
)
# The keys of the units under load (the pair's table has others' too).
LOAD = "load-"
# How long the primary stays gone before the replica is promoted.
DOWN = 0.5
# Units keep going this long after the promotion.
AFTER = 0.3


@pytest.fixture
def mysql(target: Target) -> Target:
    return only_on(target, "mysql", "a MariaDB primary and replica")


shared_pairs = module_pairs(SharedPairs)


@pytest.fixture
def pair(mysql: Target, shared_pairs: SharedPairs) -> MariaDBPair:
    """The module's pair, for the tests that leave it as they found it."""
    return shared_pairs.get()


async def port_of(db: af.Database) -> int:
    return int(await db.fetch_value(af.sql("SELECT @@port")))


async def test_the_replica_follows_the_primary(mysql: Target, pair: MariaDBPair) -> None:
    key = f"followed-{uuid.uuid4()}"
    async with af.connect(pair.url(pair.primary), backend=mysql.backend) as db:
        await db.migrate(BANK)
        await add_key(db, BANK, key)
    await pair.caught_up()
    async with af.connect(pair.url(pair.replica), backend=mysql.backend) as replica:
        assert key in await keys(replica, BANK)
        assert await replica.fetch_value(af.sql("SELECT @@read_only")) == 1
    # The link's delay lags the replica by as much (once its I/O thread
    # connects through the delayed link: the pair may be new, its link
    # never delayed before).
    pair.link.delay(0.05)
    try:
        await pair.replica.reconnect()
        # (Timed from before the write: its event is on its way while the
        # primary's answer comes back.)
        started = time.monotonic()
        # (An insert: the pair is shared, and a CREATE TABLE IF NOT EXISTS
        # of a table there already may log nothing for the replica to wait for.)
        await pair.primary.query(
            "CREATE TABLE IF NOT EXISTS test.lagged (k int); INSERT INTO test.lagged VALUES (1)"
        )
        await pair.caught_up()
        assert time.monotonic() - started >= 0.04
    finally:
        pair.link.delay(0)


async def test_the_server_is_chosen_by_its_role(mysql: Target, pair: MariaDBPair) -> None:
    backend = mysql.backend
    primary, replica = pair.primary.port, pair.replica.port
    # Either order: read-write (the default with several hosts) takes the primary.
    for order in ((pair.replica, pair.primary), (pair.primary, pair.replica)):
        async with af.connect(pair.url(*order), backend=backend) as db:
            assert await port_of(db) == primary
            await db.migrate(BANK)
            await add_key(db, BANK, "chosen")
    await pair.caught_up()
    async with af.connect(pair.url(pair.replica, pair.primary), backend=backend) as db:
        roles = {s.port: s for s in await db.servers()}
        assert (roles[primary].role, roles[replica].role) == ("primary", "replica")
        assert not roles[primary].read_only and roles[replica].read_only
        assert roles[primary].timeline == roles[replica].timeline == 1
        assert roles[replica].replay_lag == 0 and roles[primary].replay_lag is None
        assert not roles[primary].fenced and not roles[replica].fenced
        report = io.StringIO()
        with redirect_stdout(report):
            await doctor(db)
        assert f"127.0.0.1:{replica}: replica, timeline 1, replay lag 0.000s" in report.getvalue()
        assert f"127.0.0.1:{primary}: primary, timeline 1" in report.getvalue()
    for attrs in ("standby", "prefer-standby", "read-only"):
        async with af.connect(pair.url(target_session_attrs=attrs), backend=backend) as db:
            assert await port_of(db) == replica, attrs
            assert "chosen" in await keys(db, BANK)
    url = pair.url(pair.primary, target_session_attrs="prefer-standby")
    async with af.connect(url, backend=backend) as db:
        assert await port_of(db) == primary
    # One replica, asked to write: at once, not after the reconnect deadline.
    started = time.monotonic()
    with pytest.raises(af.ReadOnlyDatabase, match="refuses writes"):
        url = pair.url(pair.replica, target_session_attrs="read-write")
        await af.connect(url, backend=backend, reconnect_deadline=30)
    async with af.connect(pair.url(pair.replica), backend=backend, reconnect_deadline=30) as db:
        with pytest.raises(af.ReadOnlyDatabase):
            await add_key(db, BANK, "refused")
        report = io.StringIO()
        with redirect_stdout(report):
            await doctor(db)
        assert "no server of the URL accepts writes" in report.getvalue()
    assert time.monotonic() - started < 5


async def test_a_silent_host_costs_connect_timeout_once(mysql: Target, pair: MariaDBPair) -> None:
    """A host that accepts the TCP connection and says nothing (a black
    hole) holds a new connection for connect_timeout — its own, then the
    next host is tried — and, the next host having worked, is tried after
    it from then on."""
    async with tcp_proxy("127.0.0.1", pair.replica.port) as silent:
        silent.stall(True)
        url = f"mysql://{USER}@127.0.0.1:{silent.port},127.0.0.1:{pair.primary.port}/test"
        started = time.monotonic()
        async with af.connect(url, backend=mysql.backend, connect_timeout=1.0) as db:
            assert await port_of(db) == pair.primary.port
            assert 1.0 <= time.monotonic() - started < 4
            started = time.monotonic()
            assert len(await _connection_ids(db, 3)) == 3  # (two connections more)
            assert time.monotonic() - started < 1.0  # (the silent host would cost 1.0 s)


async def _connection_ids(db: af.Database, n: int) -> set[int]:
    """The server's ids of ``n`` connections used at once."""
    ids: set[int] = set()
    together = anyio.Event()

    async def hold() -> None:
        async with db.transaction() as tx:
            ids.add(int(await tx.fetch_value(af.sql("SELECT CONNECTION_ID()"))))
            if len(ids) == n:
                together.set()
            await together.wait()

    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(hold)
    return ids


async def test_idle_connections_go_with_a_lost_one(mysql: Target, pair: MariaDBPair) -> None:
    async with af.connect(pair.url(), backend=mysql.backend, pool_size=3) as db:
        before = await _connection_ids(db, 3)
        await pair.primary.query(f"KILL {min(before)}")
        await anyio.sleep(0.1)  # (the client reads the server's close)
        # The two others were idle and fine, but on a host that just lost a
        # connection: replaced, not handed out.
        assert not (await _connection_ids(db, 3)) & before


async def test_a_primary_turned_read_only_is_waited_out(mysql: Target, pair: MariaDBPair) -> None:
    """A failover tool fences a primary with read_only=1 and makes it
    writable again (or promotes another): units wait for a writable server
    within the deadline, they do not fail."""
    primary = pair.primary
    async with af.connect(pair.url(), backend=mysql.backend, reconnect_deadline=10) as db:
        await db.migrate(BANK)
        await add_key(db, BANK, "warm")  # (an idle connection)
        key = f"fenced-{uuid.uuid4()}"

        async def unit() -> None:
            await add_key(db, BANK, key)

        await primary.query("SET GLOBAL read_only = 1")
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(unit)
                await anyio.sleep(0.5)  # (the unit meets the read-only primary and waits)
                await primary.query("SET GLOBAL read_only = 0")
        finally:
            await primary.query("SET GLOBAL read_only = 0")
        assert db.stats.lost_connection_retries >= 1
        assert (await keys(db, BANK)).count(key) == 1


@pytest.fixture
def failover_pair(mysql: Target, shared_pairs: SharedPairs) -> Iterator[MariaDBPair]:
    """A pair of the test's own (it promotes the replica): the module's,
    taken over (this test runs after the others), or a new one."""
    pair = shared_pairs.take()
    try:
        yield pair
    finally:
        pair.close()


async def test_failover_under_load(failover_pair: MariaDBPair, mysql: Target) -> None:
    pair, backend = failover_pair, mysql.backend
    url = pair.url()
    async with af.connect(
        url,
        backend=backend,
        outbox=True,
        connect_timeout=1,
        command_timeout=1,
        reconnect_deadline=30,
        pool_size=WORKERS,
    ) as db:
        await db.migrate(BANK)
        await _open_accounts(db)
        await pair.caught_up()
        done, promoted = await _load(db, pair)
        stats = db.stats  # (units did meet the loss, and rode it out)
        assert stats.lost_connection_retries + stats.commits_resolved > 0
    async with af.connect(pair.url(pair.replica), backend=backend) as new:
        stored = [key for key in await keys(new, BANK) if key.startswith(LOAD)]
        balances = await _balances(new)
    assert len(stored) == len(set(stored)), "a unit was applied twice"
    after = [t - promoted for t in done.values() if t > promoted]
    assert after and min(after) < 2.0, f"first success {min(after, default=None)}s after"
    # (Asynchronous replication may lose what the crashed primary had not
    # yet sent: at most the units in flight at the crash.)
    assert len(set(done) - set(stored)) <= WORKERS
    # Each unit moved 1 from its worker's first account to its second, with
    # its event: the money is all there, moved once per stored event.
    assert sum(balances.values()) == 2 * WORKERS * BALANCE
    for worker in range(WORKERS):
        moved = sum(1 for key in stored if key.startswith(f"{LOAD}{worker}-"))
        assert balances[f"a{worker}"] == BALANCE - moved
        assert balances[f"b{worker}"] == BALANCE + moved
    # The old primary comes back with its own writes only: fenced off, even
    # listed first to a new Database.
    await pair.primary.start()
    async with af.connect(url, backend=backend, connect_timeout=1) as db:
        assert await port_of(db) == pair.replica.port
        await add_key(db, BANK, "after")
        fenced = [s for s in await db.servers() if s.fenced]
        assert [s.port for s in fenced] == [pair.primary.port]
        assert fenced[0].role == "primary" and fenced[0].timeline == 1
    async with af.connect(pair.url(pair.primary), backend=backend) as old:
        assert "after" not in await keys(old, BANK)


async def _open_accounts(db: af.Database) -> None:
    async def open_accounts(uow: af.UnitOfWork) -> None:
        for worker in range(WORKERS):
            for side in "ab":
                uow.create("accounts", {"owner": f"{side}{worker}", "balance": BALANCE})

    await db.execute_uow(open_accounts, schema=BANK)


async def _balances(db: af.Database) -> dict[str, int]:
    async def fn(uow: af.UnitOfWork) -> dict[str, int]:
        op = uow.find("accounts")
        await uow.retrieve()
        return {row["owner"]: row["balance"] for row in op.result}

    return await db.execute_uow(fn, schema=BANK)


def transfer(worker: int, key: str) -> Callable[[af.UnitOfWork], Awaitable[None]]:
    """A unit moving 1 from account a<worker> to b<worker>, checked, with its event."""

    async def unit(uow: af.UnitOfWork) -> None:
        source = uow.find_first("accounts", where={"owner": f"a{worker}"})
        target = uow.find_first("accounts", where={"owner": f"b{worker}"})
        await uow.retrieve()
        src, dst = source.result, target.result
        uow.update("accounts", src["id"], {"balance": src["balance"] - 1}, check=True)
        uow.update("accounts", dst["id"], {"balance": dst["balance"] + 1}, check=True)
        uow.create("events", {"key": key})

    return unit


async def _load(db: af.Database, pair: MariaDBPair) -> tuple[dict[str, float], float]:
    """WORKERS tasks running units while the primary is crashed and the
    replica promoted; every unit must return. The time each unit's key
    returned, and when the promotion ended."""
    done: dict[str, float] = {}
    promoted = float("inf")
    stop = anyio.Event()
    succeeded_after = anyio.Event()

    async def worker(n: int) -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            key = f"{LOAD}{n}-{i}"
            await db.execute_uow(transfer(n, key), schema=BANK)
            done[key] = time.monotonic()
            if done[key] > promoted:
                succeeded_after.set()

    async with anyio.create_task_group() as tg:
        for n in range(WORKERS):
            tg.start_soon(worker, n)
        await anyio.sleep(0.3)
        await pair.primary.stop("crash")
        await anyio.sleep(DOWN)
        await pair.replica.promote()
        promoted = time.monotonic()
        await anyio.sleep(AFTER)
        with anyio.fail_after(30):
            await succeeded_after.wait()
        stop.set()
    return done, promoted
