import asyncio

import pytest
from notes import check, same_loop

import aiofragno as af

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOOPS: set[asyncio.AbstractEventLoop] = set()


async def test_fresh(aiofragno_db: af.Database, dialect: str) -> None:
    same_loop(LOOPS)
    await check(aiofragno_db, dialect)
