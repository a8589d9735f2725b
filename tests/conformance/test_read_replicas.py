"""Read replicas (aiofragno.replicas) on a real primary and replica whose
log arrives 30 ms late — a PostgreSQL hot standby (tests/pg_replication.py),
a MariaDB GTID replica (tests/mariadb_replication.py): a task reads its
own writes on the replica, while a task that has not written sees the
replica's lag; a unit run with reads="replica" refuses writes before their
SQL; reads fall back to the primary when the replica cannot serve them
(too far behind within replica_wait, lagging past max_replica_lag, down),
counted in db.stats."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial

import anyio
import pytest

import aiofragno as af
from tests.conftest import Target
from tests.faults import tcp_proxy
from tests.mariadb_replication import MariaDBPair, SharedPairs
from tests.pg_replication import LATENCY, ReplicationPair, replica_pair, replica_pairs

__all__ = ["replica_pair", "replica_pairs"]  # (fixtures)

pytestmark = pytest.mark.anyio

NOTES = af.Schema("replica_notes", af.Table("notes", af.Column("text", "string")))
ROUNDS = 8


async def write(text: str, uow: af.UnitOfWork) -> None:
    uow.create("notes", {"text": text})


async def count(text: str, uow: af.UnitOfWork) -> int:
    found = uow.count("notes", {"text": text})
    await uow.retrieve()
    return found.result


async def read_then_write(uow: af.UnitOfWork) -> None:
    found = uow.count("notes")
    await uow.retrieve()
    uow.create("notes", {"text": "refused"})
    assert found.result == 0


async def write_then_read(uow: af.UnitOfWork) -> None:
    uow.create("notes", {"text": "refused"})
    uow.count("notes")
    await uow.retrieve()


class Notes:
    """The notes table of a namespace of the test's own, migrated."""

    def __init__(self, db: af.Database, namespace: str | None = None) -> None:
        self.db = db
        self.namespace = namespace or f"r{uuid.uuid4().hex[:10]}"
        self.table = db.layout(NOTES, self.namespace).table("notes").identifier

    def on(self, db: af.Database) -> Notes:
        """The same notes, through ``db``."""
        return Notes(db, self.namespace)

    def counting(self, text: str) -> af.Fragment:
        return af.sql("SELECT count(*) AS n FROM {t} WHERE text = {v}", t=self.table, v=text)

    def inserting(self, text: str) -> af.Fragment:
        return af.sql(
            "INSERT INTO {t} (id, text) VALUES ({id}, {v})",
            t=self.table,
            id=uuid.uuid4().hex,
            v=text,
        )

    async def on_replica(self, text: str) -> int:
        return await self.db.replica.fetch_value(self.counting(text), int)

    async def unit(self, fn: object, **options: object) -> object:
        return await self.db.execute_uow(
            fn,  # type: ignore[arg-type]
            schema=NOTES,
            namespace=self.namespace,
            **options,  # type: ignore[arg-type]
        )


async def read_after(written: anyio.Event, notes: Notes, text: str, seen: list[int]) -> None:
    await written.wait()
    seen.append(await notes.on_replica(text))


@dataclass
class Replicated:
    """A primary and its replica, whatever the dialect."""

    primary_url: str
    replica_url: str
    replica_port: int
    # The replica's URL through a proxy listening on the given port.
    url_at: Callable[[int], str]
    # While held, the replica stops applying writes to the given table (and
    # after them), its lag growing.
    holding_replay: Callable[[str], AbstractAsyncContextManager[None]]
    # The lag's resolution (seconds): MySQL and MariaDB tell whole seconds.
    lag_resolution: float


def postgresql_pair(pair: ReplicationPair, backend: str) -> Replicated:
    @asynccontextmanager
    async def holding_replay(table: str) -> AsyncIterator[None]:
        async with af.connect(pair.standby.url, backend=backend) as on_standby:
            await on_standby.execute(af.sql("SELECT pg_wal_replay_pause()"))
            try:
                yield
            finally:
                await on_standby.execute(af.sql("SELECT pg_wal_replay_resume()"))

    return Replicated(
        pair.primary.url,
        pair.standby.url,
        pair.standby.port,
        lambda port: f"postgresql://postgres@127.0.0.1:{port}/test",
        holding_replay,
        0.0,
    )


def mariadb_pair(pair: MariaDBPair, backend: str) -> Replicated:
    @asynccontextmanager
    async def holding_replay(table: str) -> AsyncIterator[None]:
        # (A shared lock on the whole table, gaps included: the replica's
        # applier waits to insert — the lock wait, not a stopped replication,
        # whose lag is unknown rather than growing. The table must have
        # reached the replica first.)
        await pair.caught_up()
        async with (
            af.connect(pair.url(pair.replica), backend=backend) as on_replica,
            on_replica.transaction() as tx,
        ):
            await tx.execute(af.sql("SELECT count(*) FROM {t} LOCK IN SHARE MODE", t=table))
            yield

    return Replicated(
        pair.url(pair.primary),
        pair.url(pair.replica),
        pair.replica.port,
        lambda port: f"mysql://app@127.0.0.1:{port}/test",
        holding_replay,
        1.0,
    )


@pytest.fixture(scope="module")
def mariadb_pairs() -> Iterator[SharedPairs]:
    pairs = SharedPairs()
    yield pairs
    pairs.close()


@pytest.fixture
def replicated(target: Target, request: pytest.FixtureRequest) -> Replicated:
    """The module's primary and replica for the target's dialect (SQLite
    skips); made at first use."""
    if target.dialect == "postgresql":
        return postgresql_pair(request.getfixturevalue("replica_pair"), target.backend)
    if target.dialect == "mysql":
        pairs: SharedPairs = request.getfixturevalue("mariadb_pairs")
        return mariadb_pair(pairs.get(latency=LATENCY), target.backend)
    pytest.skip("read replicas need a replicating server (PostgreSQL, MariaDB)")


@pytest.fixture
async def notes(replicated: Replicated, target: Target) -> AsyncIterator[Notes]:
    async with af.connect(
        replicated.primary_url, backend=target.backend, replicas=[replicated.replica_url]
    ) as db:
        notes = Notes(db)
        await db.migrate(NOTES, namespace=notes.namespace)
        yield notes


async def test_a_task_reads_its_writes_on_a_lagging_replica(notes: Notes) -> None:
    db = notes.db
    stale = 0
    for round in range(ROUNDS):
        text = f"unit {round}"
        seen_by_other: list[int] = []
        written = anyio.Event()
        async with anyio.create_task_group() as tg:
            # Started before the write: its commit position is older.
            tg.start_soon(read_after, written, notes, text, seen_by_other)
            await notes.unit(partial(write, text))
            written.set()
            assert await notes.on_replica(text) == 1
            assert await notes.unit(partial(count, text), reads="replica") == 1
        stale += seen_by_other == [0]
    # Without its commit position the other task read the replica at once,
    # before the log got there: the lag is real, and waiting is what hid it.
    assert stale >= ROUNDS // 4, f"only {stale} of {ROUNDS} reads elsewhere were stale"

    async with db.transaction() as tx:
        await tx.execute(notes.inserting("tx"))
        # Inside a transaction db.replica is the transaction's own read, and
        # a unit's reads go to the primary (on a connection of their own, as
        # any unit's: they do not see the transaction's row).
        served = db.stats.replica_reads
        assert await notes.on_replica("tx") == 1
        assert await notes.unit(partial(count, "tx"), reads="replica") == 0
        assert db.stats.replica_reads == served
    assert await notes.on_replica("tx") == 1
    await db.execute(notes.inserting("plain"))
    assert await notes.on_replica("plain") == 1
    await db.execute(notes.inserting("streamed"))
    async with db.replica.stream(notes.counting("streamed")) as rows:
        assert [row["n"] async for row in rows] == [1]

    stats = db.stats
    assert stats.replica_reads >= 2 * ROUNDS + 4
    assert stats.replica_waits >= ROUNDS
    assert stats.replica_fallbacks == 0


WAL_PAGE = 8192
# Where the insert position stands once the record before it ended a page:
# past the next page's (short) header.
PAST_PAGE_HEADER = 24


async def test_a_commit_that_ends_a_wal_page_is_read_on_the_replica(
    notes: Notes, target: Target
) -> None:
    """The commit position after a commit whose log ended exactly at a WAL
    page's end: a replica reaches it (it is not the insert position, past
    the next page's header, which an idle standby never replays)."""
    if target.dialect != "postgresql":
        pytest.skip("WAL pages are PostgreSQL's")
    db = notes.db
    position = af.sql("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")

    async def emit(size: int) -> int:
        """A log record of its own (no transaction id, so no commit record
        follows it) carrying ``size`` bytes, committed through ``db``; the
        insert position after it."""
        async with db.transaction() as tx:
            await tx.execute(
                af.sql("SELECT pg_logical_emit_message(false, 'af', repeat('x', {n}))", n=size)
            )
        return int(await db.fetch_value(position))

    start = int(await db.fetch_value(position))
    calibration = 400
    overhead = await emit(calibration) - start - calibration  # (the record's, aligned)
    for _ in range(10):
        at = int(await db.fetch_value(position))
        room = WAL_PAGE - at % WAL_PAGE
        if room < calibration + overhead:
            await emit(calibration)  # (into the next page first)
            continue
        served = db.stats.replica_reads
        if await emit(room - overhead) % WAL_PAGE == PAST_PAGE_HEADER:
            break
    else:
        pytest.fail("no record ended a WAL page (other writes on the primary?)")
    # (Without the correction: replica_wait waited out, then the primary.)
    assert await db.replica.fetch_value(af.sql("SELECT 1")) == 1
    assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (served + 1, 0)


async def test_a_replica_unit_refuses_writes_before_their_sql(notes: Notes) -> None:
    with pytest.raises(af.ReadOnlyUnit):
        await notes.unit(read_then_write, reads="replica")
    with pytest.raises(af.ReadOnlyUnit):
        await notes.unit(write_then_read, reads="replica")
    # The first unit's read ran; the second unit's, after its write, went
    # nowhere (the unit's server is chosen at its first read).
    stats = notes.db.stats
    assert (stats.replica_reads, stats.replica_fallbacks) == (1, 0)
    with pytest.raises(af.ValidationError, match="reads only"):
        await notes.db.replica.execute(af.sql("DELETE FROM {t}", t=notes.table))
    with pytest.raises(af.ValidationError, match="reads must be"):
        await notes.unit(partial(count, "x"), reads="secondary")
    assert await notes.db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=notes.table)) == 0
    assert stats.units == 0


async def test_reads_fall_back_to_the_primary(
    replicated: Replicated, target: Target, notes: Notes
) -> None:
    primary, replica = replicated.primary_url, replicated.replica_url
    # Waiting for nothing: right after a write the replica has not replayed it.
    async with af.connect(
        primary, backend=target.backend, replicas=[replica], replica_wait=0
    ) as db:
        # (A first read opens the replica's pool: later reads take no time
        # to connect, which the log's 30 ms could hide in.)
        assert await db.replica.fetch_value(af.sql("SELECT 1")) == 1
        await notes.on(db).unit(partial(write, "impatient"))
        assert await notes.on(db).on_replica("impatient") == 1
        assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (1, 1)

    # A replica whose replay is held up lags more and more.
    async with replicated.holding_replay(notes.table):
        await notes.unit(partial(write, "paused"))
        await lagging(replicated, target, 0.3)
        async with af.connect(
            primary, backend=target.backend, replicas=[replica], max_replica_lag=0.1
        ) as db:
            assert await notes.on(db).on_replica("paused") == 1
            assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (0, 1)

    # A replica that goes away: passed over, its reads on the primary.
    async with (
        tcp_proxy("127.0.0.1", replicated.replica_port) as proxy,
        af.connect(primary, backend=target.backend, replicas=[replicated.url_at(proxy.port)]) as db,
    ):
        through = notes.on(db)
        assert await through.on_replica("never") == 0
        assert db.stats.replica_reads == 1
        proxy.refuse(True)
        proxy.cut_all()
        # The unit's first read finds the pooled connection gone: on the
        # primary at once (not after the unit's reconnect deadline).
        with anyio.fail_after(5):
            assert await through.unit(partial(count, "paused"), reads="replica") == 1
        # Then the replica is passed over without being tried.
        assert await through.on_replica("paused") == 1
        assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (1, 2)
        assert proxy.accepted == 1


async def lagging(replicated: Replicated, target: Target, seconds: float) -> None:
    """Until the held replica lags ``seconds`` at least, as it reports it:
    MariaDB's whole seconds, from when its applier holds the write (a
    fixed pause was too short once in CI, the replica reporting no lag)."""
    if target.dialect != "mysql":
        await anyio.sleep(seconds + replicated.lag_resolution)
        return
    async with af.connect(replicated.replica_url, backend=target.backend) as replica:
        with anyio.fail_after(10):
            while True:
                (status,) = await replica.fetch(af.sql("SHOW SLAVE STATUS"))
                if (status["Seconds_Behind_Master"] or 0) >= max(1.0, seconds):
                    return
                await anyio.sleep(0.1)


async def test_cancelled_anywhere_a_task_still_reads_its_writes(
    replicated: Replicated, target: Target, notes: Notes
) -> None:
    """A write or a replica read cancelled at any point (the commit, the
    position's read after it, the wait for the replica): no connection is
    left checked out (one per pool, so a leak would stall the next use),
    and the task's next replica read shows at least what the primary
    showed it — a commit whose position was never read still counts."""
    async with af.connect(
        replicated.primary_url,
        backend=target.backend,
        replicas=[replicated.replica_url],
        pool_size=1,
        acquire_timeout=5,
    ) as db:
        through = notes.on(db)
        counting = through.counting("cancelled")
        for delay in (0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032):
            with anyio.move_on_after(delay):
                await through.unit(partial(write, "cancelled"))
            with anyio.move_on_after(delay):
                await db.replica.fetch_value(counting, int)
            on_primary = await db.fetch_value(counting, int)
            assert await db.replica.fetch_value(counting, int) >= on_primary


async def test_a_replica_whose_replication_stopped_is_passed_over(
    replicated: Replicated, target: Target, notes: Notes, request: pytest.FixtureRequest
) -> None:
    """MariaDB tells a replica whose applier has stopped: its lag is
    unknown (NULL), which no max_replica_lag admits; and its position stays
    where it stopped, so a task that wrote waits replica_wait — the
    replica's own MASTER_GTID_WAIT — then reads on the primary."""
    if target.dialect != "mysql":
        pytest.skip("a PostgreSQL standby cut off from its primary looks caught up")
    pairs: SharedPairs = request.getfixturevalue("mariadb_pairs")
    pair = pairs.get(latency=LATENCY)
    await pair.caught_up()  # (the notes table on the replica too)
    replica = pair.replica
    await replica.query("STOP SLAVE SQL_THREAD")
    try:
        async with af.connect(
            replicated.primary_url,
            backend=target.backend,
            replicas=[replicated.replica_url],
            max_replica_lag=60,
        ) as db:
            assert await notes.on(db).on_replica("stopped") == 0
            assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (0, 1)
        async with af.connect(
            replicated.primary_url,
            backend=target.backend,
            replicas=[replicated.replica_url],
            replica_wait=0.2,
        ) as db:
            through = notes.on(db)
            assert await through.on_replica("stopped") == 0  # (nothing written: served)
            await through.unit(partial(write, "stopped"))
            started = anyio.current_time()
            assert await through.on_replica("stopped") == 1
            assert anyio.current_time() - started >= 0.2
            assert (db.stats.replica_reads, db.stats.replica_fallbacks) == (1, 1)
    finally:
        await replica.query("START SLAVE SQL_THREAD")


async def test_a_write_streamed_on_the_primary_is_read_on_the_replica(
    notes: Notes, target: Target
) -> None:
    """``db.stream`` of a statement that writes (``INSERT .. RETURNING``):
    the task's next replica read waits for its commit as for any other of
    its writes — at the block's end on PostgreSQL, whose stream runs in a
    transaction; at once on MariaDB, whose stream runs in autocommit (so a
    replica read inside the block already reads it)."""
    db = notes.db
    inside = 0 if target.dialect == "postgresql" else 1
    for round in range(ROUNDS):
        text = f"streamed {round}"
        inserting = notes.inserting(text)
        returning = af.sql("{i} RETURNING text", i=inserting)
        async with db.stream(returning) as rows:
            assert [row["text"] async for row in rows] == [text]
            # (A replica read inside the block.)
            assert await notes.on_replica(text) == inside
        assert await notes.on_replica(text) == 1
