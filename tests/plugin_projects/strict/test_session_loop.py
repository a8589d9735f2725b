import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from notes import check, same_loop, seed

import aiofragno as af

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOOPS: set[asyncio.AbstractEventLoop] = set()


@pytest_asyncio.fixture(loop_scope="session")
async def seeded(aiofragno_db: af.Database) -> AsyncIterator[tuple[str, ...]]:
    async for rows in seed(aiofragno_db):
        yield rows


async def test_fresh(aiofragno_db: af.Database, dialect: str) -> None:
    same_loop(LOOPS)
    await check(aiofragno_db, dialect)


async def test_seeded(aiofragno_db: af.Database, dialect: str, seeded: tuple[str, ...]) -> None:
    same_loop(LOOPS)
    await check(aiofragno_db, dialect, seeded)
