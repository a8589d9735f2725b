"""``aiofragno outbox relay``, run as a user runs it, killed with SIGKILL in
the middle of a batch and run again: the broker (NATS JetStream, Redis
Streams) ends up holding every outbox entry exactly once, in order."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiofragno as af
from tests.relay_brokers import BROKERS, Broker, check_delivered, require_broker
from tests.test_cli import ROOT, SCRIPT, run

SCHEMA = af.Schema("clirelay", af.Table("events", af.Column("n", "bigint")))
TOTAL = 300


@pytest.fixture(params=sorted(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    require_broker(request.param)
    made: Broker = BROKERS[request.param]()
    made.create()
    yield made
    made.delete()


async def write_entries(url: str) -> list[af.OutboxEntry]:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("events", {"n": 1})

    async with af.connect(url, outbox=True) as db:
        await db.migrate(SCHEMA)
        for _ in range(TOTAL):
            await db.execute_uow(unit, schema=SCHEMA)
        return await db.outbox.list(limit=TOTAL)


async def kill_when_stored(args: list[str], broker: Broker, entries: list[af.OutboxEntry]) -> int:
    """Start the relay command, SIGKILL it once the broker holds a tenth of
    the entries; how many it holds then."""
    stamps = [e.versionstamp for e in entries]
    watcher = broker.sink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        SCRIPT, *args, cwd=ROOT, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(60):
            while (last := await watcher.last_published()) is None or stamps.index(
                last
            ) < TOTAL // 10:
                assert process.returncode is None, await process.stderr.read()  # type: ignore[union-attr]
                await asyncio.sleep(0.001)
        process.send_signal(signal.SIGKILL)
        await process.wait()
        last = await watcher.last_published()
        assert last is not None
        return stamps.index(last) + 1
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await watcher.close()


def test_relay_killed_mid_batch_then_run_again(broker: Broker, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/relay.db"
    entries = asyncio.run(write_entries(url))
    args = ["outbox", "relay", "--url", url, "--to", broker.url, "--subject", broker.subject]
    # One message in flight (NATS), batches of 7 (Redis: one script each):
    # slow enough to be killed half-way.
    slow = ["--max-in-flight", "1", "--batch-size", "150"] if broker.name == "nats" else []
    stored = asyncio.run(
        kill_when_stored([*args, *(slow or ["--batch-size", "7"])], broker, entries)
    )
    assert TOTAL // 10 <= stored < TOTAL, "the relay was not killed half-way"

    done = run(*args, "--until-caught-up")
    assert done.returncode == 0, done.stderr
    # (What the killed process had already written to its socket may be
    # stored after ``stored`` was read; the second run starts after it.)
    assert 0 < json.loads(done.stdout)["published"] <= TOTAL - stored
    check_delivered(broker.read(), entries)


def test_relay_refuses_an_unknown_broker_url(tmp_path: Path) -> None:
    result = run(
        "outbox",
        "relay",
        "--url",
        f"sqlite:///{tmp_path}/x.db",
        "--to",
        "kafka://h:9092",
        "--subject",
        "s",
    )
    assert result.returncode == 1
    assert "no relay sink for 'kafka://h:9092'" in result.stderr
