from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from notes import check, seed

import aiofragno as af


@pytest_asyncio.fixture
async def seeded(aiofragno_db: af.Database) -> AsyncIterator[tuple[str, ...]]:
    async for rows in seed(aiofragno_db):
        yield rows


@pytest.mark.asyncio
async def test_fresh(aiofragno_db: af.Database, dialect: str) -> None:
    await check(aiofragno_db, dialect)


@pytest.mark.asyncio
async def test_seeded(aiofragno_db: af.Database, dialect: str, seeded: tuple[str, ...]) -> None:
    await check(aiofragno_db, dialect, seeded)
