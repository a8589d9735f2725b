"""Beyond one MariaDB server: a primary and its replica of the test's own
(tests/mariadb_replication.py).

* the pair itself: the replica applies the primary's writes (late by the
  link's delay when asked), refuses the application's writes, and takes
  them once promoted;
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import anyio
import pytest

import aiofragno as af
from tests.conftest import Target
from tests.mariadb_replication import MariaDBPair, SharedPairs

pytestmark = pytest.mark.anyio

EVENTS = af.Schema("failover", af.Table("events", af.Column("key", "string")))


@pytest.fixture
def mysql(target: Target) -> Target:
    if target.dialect != "mysql":
        pytest.skip("a MariaDB primary and replica")
    return target


@pytest.fixture(scope="module")
def shared_pairs() -> Iterator[SharedPairs]:
    pairs = SharedPairs()
    yield pairs
    pairs.close()


@pytest.fixture
def pair(mysql: Target, shared_pairs: SharedPairs) -> MariaDBPair:
    """The module's pair, for the tests that leave it as they found it."""
    return shared_pairs.get()


async def create(uow: af.UnitOfWork, key: str) -> None:
    uow.create("events", {"key": key})


async def keys(db: af.Database) -> list[str]:
    async def fn(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("events")
        await uow.retrieve()
        return [row["key"] for row in op.result]

    return await db.execute_uow(fn, schema=EVENTS)


async def test_the_replica_follows_the_primary(mysql: Target, pair: MariaDBPair) -> None:
    key = f"followed-{uuid.uuid4()}"
    async with af.connect(pair.url(pair.primary), backend=mysql.backend) as db:
        await db.migrate(EVENTS)
        await db.execute_uow(lambda uow: create(uow, key), schema=EVENTS)
    await pair.caught_up()
    async with af.connect(pair.url(pair.replica), backend=mysql.backend) as replica:
        assert key in await keys(replica)
        assert await replica.fetch_value(af.sql("SELECT @@read_only")) == 1
    # The link's delay lags the replica by as much.
    pair.link.delay(0.05)
    try:
        await pair.primary.query("CREATE TABLE IF NOT EXISTS test.lagged (k int)")
        started = time.monotonic()
        await pair.caught_up()
        assert time.monotonic() - started >= 0.04
    finally:
        pair.link.delay(0)


async def test_a_promoted_replica_takes_writes(mysql: Target, shared_pairs: SharedPairs) -> None:
    pair = shared_pairs.take()  # (promoted: no other test can use it after)
    try:
        async with af.connect(pair.url(pair.primary), backend=mysql.backend) as db:
            await db.migrate(EVENTS)
        await pair.caught_up()
        await pair.primary.stop("crash")
        await pair.replica.promote()
        key = f"promoted-{uuid.uuid4()}"
        async with af.connect(pair.url(pair.replica), backend=mysql.backend) as db:
            await db.execute_uow(lambda uow: create(uow, key), schema=EVENTS)
            assert key in await keys(db)
            with anyio.fail_after(5):
                assert await db.fetch_value(af.sql("SELECT @@read_only")) == 0
    finally:
        pair.close()
