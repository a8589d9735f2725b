"""pytest fixtures for your own test suite: an isolated, migrated Database per test.

Loaded automatically when aiofragno is installed (a ``pytest11`` entry point).
Point it at a server with ``AIOFRAGNO_TEST_URL`` (default: a SQLite file in
the test's temporary directory), tell it your schema, and ask for
``aiofragno_db``::

    import pytest, aiofragno as af
    from myapp.db import shop

    @pytest.fixture
    def aiofragno_schema():
        return shop

    @pytest.mark.anyio
    async def test_transfer(aiofragno_db: af.Database):
        await aiofragno_db.execute_uow(my_unit, schema=shop)

Isolation per test: SQLite gets a fresh file; PostgreSQL a private schema
(the session's search_path, where aiofragno's own tables go) plus one schema per
namespace prefixed with the same token, so your code's namespaces stay as they
are; MySQL/MariaDB a private database. All are dropped afterwards. Works under
asyncio and trio (anyio's pytest plugin).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .database import Database, connect
from .naming import SchemaNaming
from .schema import Schema
from .sql import Identifier, sql
from .url import ConnectOptions, parse_url


@dataclass(frozen=True, slots=True)
class PrefixedSchemaNaming:
    """One PostgreSQL schema per namespace, named ``<prefix>_<namespace>``."""

    prefix: str

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return f"{self.prefix}_{namespace}", table

    def index(self, namespace: str, table: str, index: str) -> str:
        return SchemaNaming().index(namespace, table, index)

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return SchemaNaming().foreign_key(namespace, table, column)


@pytest.fixture
def aiofragno_url(tmp_path: Path) -> str:
    """The server to test against: ``$AIOFRAGNO_TEST_URL`` or a SQLite file."""
    return os.environ.get("AIOFRAGNO_TEST_URL") or f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def aiofragno_schema() -> Schema | None:
    """Override to return the Schema to migrate before each test."""
    return None


@pytest.fixture
def aiofragno_options() -> ConnectOptions:
    """Override to pass options to ``af.connect`` (e.g. ``{"outbox": True}``)."""
    return {}


@pytest.fixture
async def aiofragno_db(
    aiofragno_url: str, aiofragno_schema: Schema | None, aiofragno_options: ConnectOptions
) -> AsyncIterator[Database]:
    """A Database of its own for this test, migrated to ``aiofragno_schema``."""
    token = f"t{uuid.uuid4().hex[:12]}"
    dialect = parse_url(aiofragno_url).dialect
    if dialect == "mysql":
        database = private_mysql_database(aiofragno_url, token)
        async with database as url, connect(url, **aiofragno_options) as db:
            yield await _migrated(db, aiofragno_schema)
        return
    if dialect == "sqlite":
        async with connect(aiofragno_url, **aiofragno_options) as db:
            yield await _migrated(db, aiofragno_schema)
        return
    options: ConnectOptions = {
        "naming": PrefixedSchemaNaming(token),
        "search_path": token,
        **aiofragno_options,
    }
    async with connect(aiofragno_url) as admin:
        await admin.execute(sql("CREATE SCHEMA {s}", s=Identifier(token)))
        try:
            async with connect(aiofragno_url, **options) as db:
                yield await _migrated(db, aiofragno_schema)
        finally:
            await _drop_prefixed_schemas(admin, token)


async def _migrated(db: Database, schema: Schema | None) -> Database:
    if schema is not None:
        await db.migrate(schema)
    return db


async def _drop_prefixed_schemas(db: Database, token: str) -> None:
    rows = await db.fetch(
        sql(
            "SELECT schema_name AS s FROM information_schema.schemata "
            "WHERE schema_name = {t} OR schema_name LIKE {p}",
            t=token,
            p=f"{token}\\_%",
        )
    )
    for row in rows:
        await db.execute(sql("DROP SCHEMA {s} CASCADE", s=Identifier(row["s"])))


class private_mysql_database:
    """``async with`` a fresh database on the server of ``url``; yields its URL."""

    def __init__(self, url: str, name: str) -> None:
        self._url = url
        self._name = name

    async def __aenter__(self) -> str:
        async with connect(self._url) as admin:
            await admin.execute(sql("CREATE DATABASE {d}", d=Identifier(self._name)))
        base, _, query = self._url.partition("?")
        root = base.rsplit("/", 1)[0]
        return f"{root}/{self._name}" + (f"?{query}" if query else "")

    async def __aexit__(self, *exc: object) -> None:
        async with connect(self._url) as admin:
            await admin.execute(sql("DROP DATABASE IF EXISTS {d}", d=Identifier(self._name)))
