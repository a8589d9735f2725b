"""Outbox versionstamps keep rising across a promotion (PostgreSQL, async
replication), with readers whose cursor lives outside the database.

A primary and its standby (tests/pg_replication.py) whose log goes through
a link the test holds back: what the primary commits meanwhile never
reaches the standby. Writers run units all along; a ``tail()`` reader (its
cursor in memory) and a relay to Redis (the broker is its cursor) read
them from the primary — past all the standby has. The primary crashes, the
standby is promoted, and the units go on there. Then, for each outbox
strategy (counter, ticks) and runtime:

* the units the standby never got are lost, entries and all (the test
  makes sure there are some: it is what used to renumber);
* every entry the new primary numbers is above both outside cursors: the
  tail reader and the relay, restarted after the broker's newest entry
  (which the new primary does not hold), read every entry the new primary
  holds — nothing skipped;
* no versionstamp was given to two different entries, and none was read
  twice;
* on each timeline the versions are consecutive, the new one's from
  ``2**48 + 1`` (:attr:`SqlSnippets.outbox_version_floor
  <aiofragno.driver.SqlSnippets.outbox_version_floor>`).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox.queries import passed_by_promotion
from aiofragno.outbox.versionstamp import version_of, versionstamp
from tests.conftest import Target
from tests.pg_replication import ReplicationPair, new_pair
from tests.relay_brokers import Message, Redis, require_broker

pytestmark = pytest.mark.anyio

EVENTS = af.Schema("failover", af.Table("events", af.Column("key", "string")))
WRITERS = 4
FLOOR = 1 << 48  # the first version of timeline 2 is FLOOR + 1
# Seconds: units before the link is held back, then only on the primary.
BEFORE, HELD = 0.3, 0.4
# The primary stays dead this long before the promotion; units go on after.
DOWN, AFTER = 0.5, 0.5


@pytest.fixture
def held_pair(target: Target) -> Iterator[ReplicationPair]:
    """An asynchronous pair of the test's own (it promotes the standby),
    the standby streaming through a link the test can hold back."""
    if target.dialect != "postgresql":
        pytest.skip("streaming replication is PostgreSQL's")
    require_broker("redis")
    pair = new_pair(synchronous=False, latency=0.0)
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def broker() -> Iterator[Redis]:
    redis = Redis()
    try:
        yield redis
    finally:
        redis.delete()


async def create(uow: af.UnitOfWork, key: str) -> None:
    uow.create("events", {"key": key})


async def entries_on(db: af.Database) -> list[af.OutboxEntry]:
    found: list[af.OutboxEntry] = []
    while page := await db.outbox.list(found[-1].versionstamp if found else None, limit=1000):
        found += page
    return found


@pytest.mark.parametrize("strategy", ["counter", "ticks"])
async def test_versionstamps_rise_across_a_promotion_that_lost_units(
    held_pair: ReplicationPair, broker: Redis, target: Target, strategy: str
) -> None:
    pair = held_pair
    async with af.connect(
        pair.url(),
        backend=target.backend,
        outbox=strategy,
        connect_timeout=1,
        command_timeout=1,
        reconnect_deadline=30,
        pool_size=WRITERS + 4,
    ) as db:
        await db.migrate(EVENTS)
        tailed, relayed_before = await _failover(db, pair, broker)
        # The relay again, on the new primary: after the broker's newest
        # entry, which it no longer holds (lost with the primary).
        resumed = await db.outbox.relay(broker.sink(), until_caught_up=True)

    async with af.connect(pair.url(pair.standby), backend=target.backend) as new:
        kept = await entries_on(new)
        # The relay's check: after an entry the promotion lost, yes; after
        # one missing below entries of the old timeline, or above the
        # floor, no.
        engine = new._engine
        assert await passed_by_promotion(engine, relayed_before)
        assert not await passed_by_promotion(engine, versionstamp(1, 1))
        assert not await passed_by_promotion(engine, versionstamp(FLOOR + 10**9))
    messages = await anyio.to_thread.run_sync(broker.read)
    kept_stamps = {e.versionstamp for e in kept}
    tail_stamps = [stamp for stamp, _ in tailed]
    # Each timeline's versions are consecutive; the new one's start at the floor.
    versions = [version_of(e.versionstamp) for e in kept]
    old = [v for v in versions if v < FLOOR]
    new_versions = [v for v in versions if v >= FLOOR]
    assert old == list(range(1, len(old) + 1))
    assert new_versions == list(range(FLOOR + 1, FLOOR + 1 + len(new_versions)))
    assert new_versions, "no entry was numbered on the new timeline"
    assert all(e.versionstamp.endswith("0000") for e in kept)
    # One entry per unit on the new primary.
    assert len({e.uow_id for e in kept}) == len(kept)

    # The primary had units the standby never got: lost, read all the same.
    lost = [stamp for stamp in tail_stamps if stamp not in kept_stamps]
    assert lost, "the failover lost nothing: the link did not hold the log back"
    assert all(version_of(stamp) < FLOOR for stamp in lost)
    assert min(lost) > max(s for s in kept_stamps if version_of(s) < FLOOR)

    # Above both outside cursors: every entry numbered on the new timeline.
    assert relayed_before not in kept_stamps
    first_new = min(s for s in kept_stamps if version_of(s) >= FLOOR)
    assert first_new > max(stamp for stamp in tail_stamps if version_of(stamp) < FLOOR)
    assert first_new > relayed_before
    # Nothing skipped: both readers got every entry the new primary holds,
    # as it holds it (the same unit under the same versionstamp); no
    # versionstamp twice, none for two units.
    assert tail_stamps == sorted(set(tail_stamps)), "the tail read out of order or twice"
    assert {(e.versionstamp, e.uow_id) for e in kept} <= set(tailed)
    bodies = {e.versionstamp: e.to_json() for e in kept}
    _check_broker(messages, bodies)
    assert resumed == sum(1 for s in kept_stamps if s > relayed_before)


async def _failover(
    db: af.Database, pair: ReplicationPair, broker: Redis
) -> tuple[list[tuple[str, str]], str]:
    """Writers and a tail reader all along, a relay until the primary dies;
    the log held back from the standby, the primary crashed, the standby
    promoted. What the tail reader read (versionstamp, uow_id), and the
    broker's newest entry before the promotion."""
    tailed: list[tuple[str, str]] = []
    caught_up = anyio.Event()
    target: list[str] = []  # the newest entry, once the writers stopped
    counter = itertools.count()
    promoted_at = float("inf")
    stop, relay_stop = anyio.Event(), anyio.Event()
    after_promotion = anyio.Event()  # a unit returned after it
    held_read = anyio.Event()  # the tail read an entry the standby never got
    some_read = anyio.Event()  # the tail read a few entries

    async def writer() -> None:
        while not stop.is_set():
            key = f"{uuid.uuid4().hex[:8]}-{next(counter)}"
            await db.execute_uow(lambda uow, key=key: create(uow, key), schema=EVENTS)
            if anyio.current_time() > promoted_at:
                after_promotion.set()

    async def tail(held_at: list[float]) -> None:
        async for entry in db.outbox.tail(poll_interval=0.02):
            tailed.append((entry.versionstamp, entry.uow_id))
            if len(tailed) >= 3:
                some_read.set()
            if held_at and anyio.current_time() > held_at[0] + 0.1 and not held_read.is_set():
                held_stamp.append(entry.versionstamp)
                held_read.set()
            if target and entry.versionstamp >= target[0]:
                caught_up.set()

    async def relay() -> None:
        await db.outbox.relay(broker.sink(), stop=relay_stop, poll_interval=0.02)

    held_at: list[float] = []
    held_stamp: list[str] = []  # the first entry the tail read well after the hold
    async with anyio.create_task_group() as readers:
        readers.start_soon(tail, held_at)
        async with anyio.create_task_group() as tg:
            for _ in range(WRITERS):
                tg.start_soon(writer)
            async with anyio.create_task_group() as relaying:
                relaying.start_soon(relay)
                await anyio.sleep(BEFORE)
                # The standby has entries of the old timeline, versioned
                # (under ticks, a tick it has not received versions its
                # entries again on the new timeline), however slow the machine.
                with anyio.fail_after(10):
                    await some_read.wait()
                await anyio.to_thread.run_sync(pair.wait_replayed)
                await anyio.to_thread.run_sync(pair.stall_link, True)
                held_at.append(anyio.current_time())
                await anyio.sleep(HELD)
                with anyio.fail_after(10):
                    await held_read.wait()
                # (The relay too is past what the standby has.)
                for _ in range(200):
                    published = await anyio.to_thread.run_sync(broker.read)
                    if published and published[-1].id >= held_stamp[0]:
                        break
                    await anyio.sleep(0.05)
                relay_stop.set()
            await pair.primary.stop("crash")
            await anyio.sleep(DOWN)
            await pair.standby.promote()
            promoted_at = anyio.current_time()
            await anyio.sleep(AFTER)
            with anyio.fail_after(30):
                await after_promotion.wait()
            stop.set()
        # The tail reader catches up with the new primary, then stops.
        latest = await db.outbox.latest()
        assert latest is not None
        target.append(latest)
        with anyio.fail_after(30):
            if not (tailed and tailed[-1][0] >= latest):
                await caught_up.wait()
        readers.cancel_scope.cancel()
    relayed = await anyio.to_thread.run_sync(broker.read)
    return tailed, relayed[-1].id


def _check_broker(messages: list[Message], bodies: dict[str, str]) -> None:
    """The broker holds every entry of ``bodies`` (versionstamp: JSON) as
    it is, in versionstamp order, none twice."""
    ids = [m.id for m in messages]
    assert ids == sorted(set(ids)), "out of order or published twice"
    held = {m.id: m.body.decode() for m in messages}
    assert set(bodies) <= set(held), "the broker skipped entries the new primary holds"
    assert all(held[stamp] == body for stamp, body in bodies.items())
