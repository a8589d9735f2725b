"""A server that only reads (a standby, or read-only by configuration):
writes fail at once with ReadOnlyDatabase — nothing written, no retries
until the reconnect deadline — and reads go on.

PostgreSQL: a session with ``default_transaction_read_only`` (what a
database configured read-only gives every session). MariaDB: a private
server with ``read_only`` on, used by a user without the privilege to
write through it (a replica's application user)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

import aiofragno as af
from tests.conftest import Target
from tests.servers import PrivateServer

pytestmark = pytest.mark.anyio

NOTES = af.Schema("notes", af.Table("notes", af.Column("text", "string")))
# Far longer than the test may take: a write must not wait for it.
DEADLINE = 30.0


async def write(uow: af.UnitOfWork) -> None:
    uow.create("notes", {"text": "refused"})


async def count(uow: af.UnitOfWork) -> int:
    notes = uow.count("notes")
    await uow.retrieve()
    return notes.result


@pytest.fixture
async def read_only_url(
    private_server: PrivateServer, target: Target
) -> AsyncIterator[tuple[str, dict[str, object]]]:
    """A URL and connect options whose sessions cannot write, on a private
    server where NOTES is migrated."""
    async with af.connect(private_server.url, backend=target.backend) as admin:
        await admin.migrate(NOTES)
        if target.dialect == "postgresql":
            options = {"server_settings": {"default_transaction_read_only": "on"}}
            yield private_server.url, options
            return
        user = f"reader_{uuid.uuid4().hex[:8]}"
        for statement in (
            f"CREATE USER '{user}'@'%'",
            f"GRANT ALL ON test.* TO '{user}'@'%'",
            "SET GLOBAL read_only = 1",
        ):
            await admin.execute(admin._engine.raw(statement))
        try:
            yield private_server.url.replace("root@", f"{user}@"), {}
        finally:
            await admin.execute(admin._engine.raw("SET GLOBAL read_only = 0"))
            await admin.execute(admin._engine.raw(f"DROP USER '{user}'@'%'"))


async def test_writes_fail_at_once_reads_go_on(
    read_only_url: tuple[str, dict[str, object]], target: Target
) -> None:
    url, options = read_only_url
    async with af.connect(
        url, backend=target.backend, reconnect_deadline=DEADLINE, outbox=True, **options
    ) as db:
        started = time.monotonic()
        with pytest.raises(af.ReadOnlyDatabase):
            await db.execute_uow(write, schema=NOTES, idempotency_key=f"k-{uuid.uuid4()}")
        with pytest.raises(af.ReadOnlyDatabase):
            notes = db.layout(NOTES).table("notes").identifier
            await db.execute(af.sql("DELETE FROM {t}", t=notes))
        assert time.monotonic() - started < DEADLINE / 3, "a write waited as if to reconnect"
        assert db.stats.lost_connection_retries == 0
        assert await db.execute_uow(count, schema=NOTES) == 0
        # It answers (reads go on), and says it takes no writes.
        assert await db.is_healthy()
        assert not await db.is_healthy(writable=True)
