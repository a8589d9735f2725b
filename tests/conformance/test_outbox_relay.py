"""The outbox relay on every backend and runtime, to the real NATS JetStream
and Redis servers: every entry delivered once, in versionstamp order, the
broker's messages exactly the outbox's entries (read back as a JetStream
pull consumer and with XRANGE); a relay cancelled in the middle of
publishing, twice, and restarted: nothing lost, nothing repeated; two relays
racing on one stream. What a sink does whatever the database — refusing a
stream it did not write or one ahead of the outbox, refusing repeats after
JetStream's duplicate window, a subject per entry — runs on the sqlite
backend under both runtimes.

The outbox is shared by a whole database, so on PostgreSQL and MariaDB the
module works in a database of its own (dropped at the end); SQLite gets a
file per test. Each test relays from the outbox's newest entry before it
wrote (``after=``), to a stream (or key) of its own, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox import OutboxEntry
from aiofragno.outbox.relay import OutOfStep
from aiofragno.outbox.relay.bridge import BridgedSink
from aiofragno.outbox.relay.run import relay as relay_to
from aiofragno.runtime import current_runtime
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target
from tests.relay_brokers import BROKERS, Broker, Nats, check_delivered, require_broker

pytestmark = pytest.mark.anyio

SCHEMA = af.Schema("relay", af.Table("events", af.Column("n", "bigint")))
LIMIT = 60  # seconds: a hang fails the test instead of blocking the suite


@pytest.fixture(params=sorted(BROKERS))
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    require_broker(request.param)
    made: Broker = BROKERS[request.param]()
    await anyio.to_thread.run_sync(made.create)
    yield made
    await anyio.to_thread.run_sync(made.delete)


class Source:
    """An outbox-enabled database, the namespace a test writes in, and the
    newest entry before it wrote."""

    def __init__(self, db: af.Database, namespace: str, start: str | None) -> None:
        self.db = db
        self.namespace = namespace
        self.start = start

    async def write(self, units: int) -> None:
        """``units`` units (8 at a time), each one outbox entry."""

        async def unit(uow: af.UnitOfWork) -> None:
            uow.create("events", {"n": 1})

        async def writer(count: int) -> None:
            for _ in range(count):
                await self.db.execute_uow(unit, schema=SCHEMA, namespace=self.namespace)

        async with anyio.create_task_group() as tg:
            for w in range(8):
                tg.start_soon(writer, units // 8 + (w < units % 8))

    async def entries(self) -> list[af.OutboxEntry]:
        found: list[af.OutboxEntry] = []
        while page := await self.db.outbox.list(
            after=found[-1].versionstamp if found else self.start, limit=1000
        ):
            found += page
        return found


@pytest.fixture
async def source(
    target: Target, tmp_path: Path, private_databases: PrivateDatabases
) -> AsyncIterator[Source]:
    require_target(target)
    url = target.url(tmp_path)
    if target.dialect != "sqlite":
        url = await private_databases.url_for(target, url)
    async with af.connect(url, backend=target.backend, outbox=True, pool_size=8) as db:
        namespace = f"ns{uuid.uuid4().hex[:8]}"
        await db.migrate(SCHEMA, namespace=namespace)
        yield Source(db, namespace, await db.outbox.latest())


@pytest.fixture
def sink_property(target: Target) -> None:
    """For a test of what a sink does whatever the database: only on the
    stdlib SQLite backend (under both runtimes). First in a test's
    arguments, so that the skip comes before the other fixtures' work."""
    if target.backend != "sqlite":
        pytest.skip("a property of the sink: checked on the sqlite backend")


async def check(broker: Broker, source: Source) -> list[af.OutboxEntry]:
    """The broker holds exactly the entries written since ``source.start``,
    whose versions are contiguous (the outbox is gap-free)."""
    entries = await source.entries()
    versions = [int(e.versionstamp[:20], 16) for e in entries]
    assert versions == list(range(versions[0], versions[0] + len(versions)))
    check_delivered(await anyio.to_thread.run_sync(broker.read), entries)
    return entries


async def test_every_entry_once_in_order_and_resumed_from_the_broker(
    broker: Broker, source: Source
) -> None:
    """30 entries relayed in batches of 7; then 5 more by a new relay, which
    starts after the broker's newest message (not ``after=``, which only
    counts while the broker holds nothing)."""
    await source.write(30)
    with anyio.fail_after(LIMIT):
        sink = broker.sink(max_in_flight=3)
        count = await source.db.outbox.relay(
            sink, after=source.start, batch_size=7, until_caught_up=True
        )
    assert count == 30
    entries = await check(broker, source)
    body = json.loads((await anyio.to_thread.run_sync(broker.read))[0].body)
    assert body["uow_id"] == entries[0].uow_id
    assert body["payload"]["mutations"][0]["values"] == {"n": 1}

    await source.write(5)
    with anyio.fail_after(LIMIT):
        count = await source.db.outbox.relay(broker.sink(), after=None, until_caught_up=True)
    assert count == 5
    assert len(await check(broker, source)) == 35


async def test_cancelled_while_publishing_then_restarted(broker: Broker, source: Source) -> None:
    """A relay cancelled while a batch is on its way — twice, at different
    points — and run again: every entry is in the broker exactly once, in
    order. The sink stores part of a batch and then stalls, so the relay is
    always caught mid-batch, however fast the machine."""
    total = 150
    await source.write(total)
    for stored_at_least in (15, 60):
        seen = await cancel_when_stored(broker, source, stored_at_least)
        assert seen == stored_at_least, "the relay did not stop where its batch was cut"
    with anyio.fail_after(LIMIT):
        count = await source.db.outbox.relay(
            broker.sink(), after=source.start, until_caught_up=True
        )
    assert count == total - seen
    assert len(await check(broker, source)) == total


class Stalling:
    """A sink that stores the first ``store`` entries it is given (part of a
    batch, by the real sink), then stalls with the rest of that batch on its
    way until it is cancelled. Its own code runs on asyncio (the relay runs
    an asyncio-only sink on a loop of its own under trio)."""

    asyncio_only = True

    def __init__(self, inner: af.BrokerSink, store: int) -> None:
        self.inner = inner
        self.left = store

    async def last_published(self) -> str | None:
        return await self.inner.last_published()

    async def publish_batch(self, entries: Sequence[OutboxEntry]) -> None:
        if len(entries) >= self.left:
            await self.inner.publish_batch(entries[: self.left])
            self.left = 0
            await asyncio.sleep(LIMIT * 10)  # cancelled here
        await self.inner.publish_batch(entries)
        self.left -= len(entries)

    async def close(self) -> None:
        await self.inner.close()


async def cancel_when_stored(broker: Broker, source: Source, at_least: int) -> int:
    """Run a relay, cancel it once the broker holds ``at_least`` entries (the
    sink stalls there, in the middle of a batch of 10), and return how many
    the broker holds."""
    stamps = [e.versionstamp for e in await source.entries()]
    watcher: af.BrokerSink = broker.sink()
    if current_runtime() != "asyncio":
        watcher = BridgedSink(watcher)

    async def stored() -> int:
        last = await watcher.last_published()
        return 0 if last is None else stamps.index(last) + 1

    try:
        before = await stored()
        # (Batches of 10 from ``before``: the cut falls inside one.)
        assert (at_least - before) % 10 not in (0, 1)
        sink = Stalling(broker.sink(max_in_flight=1), at_least - before)
        with anyio.fail_after(LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: relay_to(source.db._engine, sink, after=source.start, batch_size=10)
                )
                while await stored() < at_least:
                    pass  # (each look is a round trip to the broker)
                tg.cancel_scope.cancel()
        return await stored()
    finally:
        await watcher.close()


async def test_a_stream_written_by_someone_else_is_refused(
    sink_property: None, broker: Broker, source: Source
) -> None:
    """The broker is the relay's cursor, so a stream whose newest message the
    relay did not write is an error that says so, not a guess."""
    await anyio.to_thread.run_sync(broker.add_foreign)
    await source.write(1)
    with pytest.raises(af.RelayError, match="did not write"):
        await source.db.outbox.relay(broker.sink(), until_caught_up=True)


async def test_two_relays_at_once_publish_each_entry_once(broker: Broker, source: Source) -> None:
    """Two relays on one stream (which the docs advise against) race for
    every batch; the one that loses reads the broker again and carries on,
    so the broker still holds each entry once, in order."""
    await source.write(120)
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(
                    lambda: source.db.outbox.relay(
                        broker.sink(max_in_flight=4),
                        after=source.start,
                        batch_size=10,
                        until_caught_up=True,
                    )
                )
    assert len(await check(broker, source)) == 120


async def test_nats_refuses_a_repeat_after_the_duplicate_window(
    sink_property: None, source: Source
) -> None:
    """A sink whose view of the stream is stale (here: read before another
    relay published) sends entries the stream already holds, after the
    duplicate window has passed: the sequence check refuses them
    (``OutOfStep``, on which the relay reads the stream again), so the
    stream still holds each entry once."""
    require_broker("nats")
    broker = Nats()
    await anyio.to_thread.run_sync(lambda: broker.create(duplicate_window=0.1))
    try:
        await source.write(6)
        entries = await source.entries()
        stale = broker.sink()
        if current_runtime() != "asyncio":
            stale = BridgedSink(stale)
        try:
            assert await stale.last_published() is None
            with anyio.fail_after(LIMIT):
                await source.db.outbox.relay(
                    broker.sink(), after=source.start, until_caught_up=True
                )
            await anyio.sleep(0.3)  # past the duplicate window
            with pytest.raises(OutOfStep, match="wrong last sequence"):
                await stale.publish_batch(entries[:3])
        finally:
            await stale.close()
        check_delivered(await anyio.to_thread.run_sync(broker.read), entries)
    finally:
        await anyio.to_thread.run_sync(broker.delete)


async def test_a_stream_ahead_of_the_outbox_is_refused(
    sink_property: None, broker: Broker, source: Source, tmp_path: Path
) -> None:
    """A stream whose newest entry this outbox does not hold (another
    database's stream, or a database restored from an older backup) is an
    error: resuming after it would skip the entries that reuse its versions."""
    await source.write(3)
    await source.db.outbox.relay(broker.sink(), after=source.start, until_caught_up=True)
    async with af.connect(f"sqlite:///{tmp_path}/other.db", outbox=True) as other:
        await other.migrate(SCHEMA)
        with pytest.raises(af.RelayError, match="is not in this database's outbox"):
            await other.outbox.relay(broker.sink(), until_caught_up=True)


async def test_nats_subject_per_entry_keeps_each_subjects_order(
    sink_property: None, source: Source
) -> None:
    """``subject`` as a function of the entry (here: odd and even commit
    versions on two subjects of one stream): each subject gets its entries in
    versionstamp order, the stream as a whole the outbox's order, and a new
    relay resumes after the stream's newest message, whichever subject."""
    require_broker("nats")
    broker = Nats()
    await anyio.to_thread.run_sync(broker.create)

    def subject(entry: af.OutboxEntry) -> str:
        return f"{broker.stream}.v{int(entry.versionstamp[:20], 16) % 2}"

    try:
        await source.write(10)
        counts = []
        for _ in range(2):  # the second run resumes: nothing new to send
            sink = af.NatsSink(broker.url, subject=subject, stream=broker.stream)
            with anyio.fail_after(LIMIT):
                counts.append(
                    await source.db.outbox.relay(sink, after=source.start, until_caught_up=True)
                )
        assert counts == [10, 0]
        entries = await source.entries()
        messages = await anyio.to_thread.run_sync(broker.read)
        check_delivered(messages, entries)
        assert {m.subject for m in messages} == {f"{broker.stream}.v0", f"{broker.stream}.v1"}
        assert [m.subject for m in messages] == [subject(e) for e in entries]
    finally:
        await anyio.to_thread.run_sync(broker.delete)
