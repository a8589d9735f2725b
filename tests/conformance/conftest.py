"""Fixtures for the conformance suite: each test runs once per target."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import aiofragno as af
from tests.conftest import Target, require_target


@pytest.fixture
def anyio_backend(target: Target) -> str:
    return target.runtime


@pytest.fixture
def url(target: Target, tmp_path: Path) -> str:
    require_target(target)
    return target.url(tmp_path)


@pytest.fixture
async def db(url: str, target: Target) -> AsyncIterator[af.Database]:
    async with af.connect(url, backend=target.backend, pool_size=5) as database:
        yield database


class Tables:
    """Unique table names for one test, dropped afterwards."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def new(self, prefix: str = "t") -> af.Identifier:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return af.Identifier(name)


@pytest.fixture
async def tables(db: af.Database) -> AsyncIterator[Tables]:
    made = Tables()
    yield made
    if db.closed:
        return
    for name in reversed(made.names):
        await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=af.Identifier(name)))
