from collections.abc import AsyncIterator

import pytest
import sniffio
from notes import check, seed

import aiofragno as af

pytestmark = pytest.mark.anyio


@pytest.fixture
async def seeded(aiofragno_db: af.Database) -> AsyncIterator[tuple[str, ...]]:
    async for rows in seed(aiofragno_db):
        yield rows


async def test_fresh(aiofragno_db: af.Database, dialect: str, anyio_backend: str) -> None:
    assert sniffio.current_async_library() == anyio_backend
    await check(aiofragno_db, dialect)


async def test_seeded(aiofragno_db: af.Database, dialect: str, seeded: tuple[str, ...]) -> None:
    await check(aiofragno_db, dialect, seeded)
