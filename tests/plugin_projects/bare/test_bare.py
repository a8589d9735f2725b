"""Run with neither pytest-asyncio nor anyio's plugin."""

import pytest

import aiofragno as af


def test_plain_test_is_unaffected(aiofragno_url: str, aiofragno_schema: af.Schema | None) -> None:
    assert aiofragno_url.startswith("sqlite:///")
    assert aiofragno_schema is None


async def test_async_without_a_plugin(aiofragno_db: af.Database) -> None:
    pass


def test_sync(aiofragno_db: af.Database) -> None:
    pass


@pytest.mark.asyncio
async def test_marked_for_pytest_asyncio(aiofragno_db: af.Database) -> None:
    pass
