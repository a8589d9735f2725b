"""Fixtures for the conformance suite: each test runs once per target."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import new_namespace
from tests.conformance.private_databases import PrivateDatabases
from tests.conformance.uow_env import ITEMS, SHOP, Env, MakeEnv, drop_namespace
from tests.conftest import Target, require_target


@pytest.fixture
def anyio_backend(target: Target) -> str:
    return target.runtime


@pytest.fixture
def url(target: Target, tmp_path: Path) -> str:
    require_target(target)
    return target.url(tmp_path)


@pytest.fixture(scope="module")
def private_databases() -> Iterator[PrivateDatabases]:
    """Databases of the test module's own on the servers (see
    :mod:`tests.conformance.private_databases`), dropped after the module."""
    databases = PrivateDatabases()
    yield databases
    if databases.made:
        anyio.run(databases.drop_all, backend="asyncio")


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


# -- the unit-of-work modules' environments (test_uow_*.py, uow_env.py); modules
# with environments of their own (test_outbox.py, ...) override these ----------


@pytest.fixture
async def make_env(db: af.Database) -> AsyncIterator[MakeEnv]:
    async with _environments(db) as make:
        yield make


@pytest.fixture
async def make_outbox_env(url: str, target: Target) -> AsyncIterator[MakeEnv]:
    """As ``make_env``, on a Database whose units write outbox entries,
    each numbered at commit (``outbox="counter"``: ``uow.versionstamp`` is
    its entry's)."""
    async with (
        af.connect(url, backend=target.backend, outbox="counter") as odb,
        _environments(odb) as make,
    ):
        yield make


@contextlib.asynccontextmanager
async def _environments(db: af.Database) -> AsyncIterator[MakeEnv]:
    made: list[Env] = []

    async def make(schema: af.Schema) -> Env:
        env = Env(db, schema, new_namespace())
        made.append(env)
        await db.migrate(schema, namespace=env.namespace)
        return env

    yield make
    for env in reversed(made):
        await drop_namespace(db, env.schema, env.namespace)


@pytest.fixture
async def shop(make_env: MakeEnv) -> Env:
    return await make_env(SHOP)


@pytest.fixture
async def items(make_env: MakeEnv) -> Env:
    return await make_env(ITEMS)
