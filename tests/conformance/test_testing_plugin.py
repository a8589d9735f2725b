"""aiofragno.testing, used as users would: their schema, an isolated Database
per test, on every backend and runtime."""

from __future__ import annotations

import pytest

import aiofragno as af
from tests.conftest import Target

pytestmark = pytest.mark.anyio

NOTES = af.Schema("notes", af.Table("note", af.Column("text", "string")))


@pytest.fixture
def aiofragno_url(url: str) -> str:  # the conformance target's server
    return url


@pytest.fixture
def aiofragno_schema() -> af.Schema:
    return NOTES


@pytest.fixture
def aiofragno_options() -> dict[str, object]:
    return {"outbox": True}


async def add(db: af.Database, text: str) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("note", {"text": text})

    await db.execute_uow(unit, schema=NOTES)


async def texts(db: af.Database) -> list[str]:
    async def unit(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("note")
        await uow.retrieve()
        return [row["text"] for row in op.result]

    return await db.execute_uow(unit, schema=NOTES)


@pytest.mark.parametrize("run", [1, 2])
async def test_each_test_starts_empty(aiofragno_db: af.Database, run: int) -> None:
    # Run twice on the same server: the second run must not see the first's row
    # nor its outbox entry.
    assert await texts(aiofragno_db) == []
    assert await aiofragno_db.outbox.list() == []
    await add(aiofragno_db, f"run {run}")
    assert await texts(aiofragno_db) == [f"run {run}"]
    assert len(await aiofragno_db.outbox.list()) == 1


async def test_isolated_database_is_dropped_afterwards(target: Target, url: str) -> None:
    if target.dialect == "sqlite":
        pytest.skip("SQLite gets a file in the test's temporary directory")
    async with af.connect(url) as admin:
        if target.dialect == "postgresql":
            query = "SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE 't%\\_notes'"
        else:
            query = "SELECT count(*) FROM information_schema.schemata WHERE schema_name REGEXP '^t[0-9a-f]{12}$'"
        assert await admin.fetch_value(admin._engine.raw(query)) == 0
