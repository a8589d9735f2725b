"""Consumer arguments are checked when they are given, before any SQL: a
lease, interval or delay must be a finite number of seconds in range, counts
and flags of their type. And the retry backoff is capped."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox import OutboxEntry

pytestmark = pytest.mark.anyio

BAD_SECONDS = [0, -1, 0.0, -0.5, math.nan, math.inf, -math.inf, True, "1", None, 10**400, 1e300]


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[af.Database]:
    async with af.connect(f"sqlite:///{tmp_path}/c.db", outbox=True) as database:
        yield database


@pytest.fixture
async def closed(tmp_path: Path) -> af.Database:
    """A closed Database: any SQL would raise DatabaseClosed, so a
    ValidationError from it shows the check came first."""
    database = await af.connect(f"sqlite:///{tmp_path}/closed.db")
    await database.close()
    return database


@pytest.mark.parametrize("lease", [*BAD_SECONDS, 0.001, 86_401])
async def test_bad_lease(closed: af.Database, lease: Any) -> None:
    with pytest.raises(af.ValidationError, match="lease"):
        closed.outbox.consumer("c", lease=lease)


@pytest.mark.parametrize("lease", [0.01, 1, 30.0, 86_400])
async def test_good_lease(closed: af.Database, lease: Any) -> None:
    assert closed.outbox.consumer("c", lease=lease).lease == lease


@pytest.mark.parametrize("name", ["", "x" * 256, None, 3, "a\x00b", "lone \ud800"])
async def test_bad_name(closed: af.Database, name: Any) -> None:
    with pytest.raises(af.ValidationError, match="consumer names"):
        closed.outbox.consumer(name)


async def _handle(entry: OutboxEntry) -> None:
    pass


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        *(("poll_interval", v) for v in BAD_SECONDS),
        *(("retry_delay", v) for v in [-1, math.nan, math.inf, True, "0.1", None, 10**400]),
        *(("max_retry_delay", v) for v in BAD_SECONDS),
        *(("max_attempts", v) for v in [0, -1, 1.5, True, "3", None]),
        *(("batch_size", v) for v in [0, 10_001, True, 2.0]),
        ("on_failure", "ignore"),
        ("transactional", "yes"),
        ("transactional", 1),
        ("until_caught_up", None),
        ("stop", 42),
        ("handler", None),
    ],
)
async def test_bad_run_argument(closed: af.Database, argument: str, value: Any) -> None:
    consumer = closed.outbox.consumer("c")
    handler = value if argument == "handler" else _handle
    arguments = {} if argument == "handler" else {argument: value}
    with pytest.raises(af.ValidationError, match=argument):
        await consumer.run(handler, **arguments)


async def test_backoff_is_capped(db: af.Database) -> None:
    """With ``max_attempts=12`` and a doubling delay from 10 ms the last
    waits would add up to 20 s; capped at 20 ms they take a quarter second."""
    schema = af.Schema("s", af.Table("t", af.Column("n", "bigint")))
    await db.migrate(schema)

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("t", {"n": 1})

    await db.execute_uow(unit, schema=schema)
    calls = 0

    async def fail(entry: OutboxEntry) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("always")

    began = anyio.current_time()
    with anyio.fail_after(10):
        await db.outbox.consumer("capped").run(
            fail, until_caught_up=True, max_attempts=12, retry_delay=0.01, max_retry_delay=0.02
        )
    assert calls == 12
    assert anyio.current_time() - began < 3
    assert len(await db.outbox.consumer("capped").dead_letters()) == 1
