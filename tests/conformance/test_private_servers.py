"""The private servers of tests/servers.py do what the crash and restart
tests rely on, per target: stalled by ``pause()`` (connections open, nothing
answered) until ``resume()``; gone after ``stop("crash")``; back, with the
data committed before the crash, after ``start()``."""

from __future__ import annotations

import pytest

import aiofragno as af
from tests.conftest import Target
from tests.servers import PrivateServer

pytestmark = pytest.mark.anyio


async def test_pause_crash_and_start(private_server: PrivateServer, target: Target) -> None:
    table = af.Identifier("private_server_check")
    async with af.connect(
        private_server.url, backend=target.backend, pool_size=1, connect_timeout=1.0
    ) as db:
        await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=table))
        await db.execute(af.sql("CREATE TABLE {t} (n integer)", t=table))
        await db.execute(af.sql("INSERT INTO {t} (n) VALUES ({n})", t=table, n=7))

        private_server.pause()
        try:
            assert not await db.is_healthy()
        finally:
            private_server.resume()
        assert await db.is_healthy()

        await private_server.stop("crash")
        assert not private_server.running
        assert not await db.is_healthy()
        await private_server.start()
        assert private_server.running
        assert await db.fetch_value(af.sql("SELECT n FROM {t}", t=table)) == 7
        await db.execute(af.sql("DROP TABLE {t}", t=table))
