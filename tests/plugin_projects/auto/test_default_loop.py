"""No marks: auto mode runs these in the default loop (module, from pytest.ini)."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from notes import check, same_loop, seed

import aiofragno as af

LOOPS: set[asyncio.AbstractEventLoop] = set()


@pytest.fixture
async def seeded(aiofragno_db: af.Database) -> AsyncIterator[tuple[str, ...]]:
    async for rows in seed(aiofragno_db):
        yield rows


async def test_fresh(aiofragno_db: af.Database, dialect: str) -> None:
    same_loop(LOOPS)
    await check(aiofragno_db, dialect)


async def test_seeded(aiofragno_db: af.Database, dialect: str, seeded: tuple[str, ...]) -> None:
    same_loop(LOOPS)
    await check(aiofragno_db, dialect, seeded)
