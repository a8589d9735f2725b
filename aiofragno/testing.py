"""pytest fixtures for your own test suite: an isolated, migrated Database per test.

Loaded automatically when aiofragno is installed (a ``pytest11`` entry point).
Point it at a server with ``AIOFRAGNO_TEST_URL`` (default: a SQLite file in
the test's temporary directory), tell it your schema, and ask for
``aiofragno_db`` from a test that pytest-asyncio or anyio runs::

    import pytest, aiofragno as af
    from myapp.db import shop

    @pytest.fixture
    def aiofragno_schema():
        return shop

    @pytest.mark.asyncio              # or @pytest.mark.anyio
    async def test_transfer(aiofragno_db: af.Database):
        await aiofragno_db.execute_uow(my_unit, schema=shop)

The Database is opened in the event loop the test runs in (its connections
belong to that loop): under pytest-asyncio the loop of the test's
``loop_scope``, under anyio the test's backend (asyncio or trio). It is
closed, and its data dropped, when the test ends.

Isolation per test: SQLite gets a fresh file; PostgreSQL a private schema
(the session's search_path, where aiofragno's own tables go) plus one schema per
namespace prefixed with the same token, so your code's namespaces stay as they
are; MySQL/MariaDB a private database. All are dropped afterwards.
:func:`isolated_database` gives the same for fixtures of your own making.
"""

from __future__ import annotations

import inspect
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Unpack, cast

import pytest

from .database import Database, connect
from .naming import SchemaNaming
from .schema import Schema
from .sql import Identifier, sql
from .url import ConnectOptions, parse_url

try:
    import pytest_asyncio
except ImportError:  # an optional runner: anyio's plugin may be the one in use
    pytest_asyncio = None  # type: ignore[assignment]

# Fixture loop scopes came with pytest-asyncio 0.24; older ones cannot run a
# fixture in a module's or session's loop, so they are left alone.
_PYTEST_ASYNCIO = (
    pytest_asyncio is not None
    and "loop_scope" in inspect.signature(pytest_asyncio.fixture).parameters
)

LoopScope = Literal["session", "package", "module", "class", "function"]


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
def aiofragno_db(request: pytest.FixtureRequest) -> Database:
    """A Database of its own for this test, migrated to ``aiofragno_schema``,
    opened in the event loop the test runs in."""
    # A synchronous fixture that picks an async one run by the test's own
    # plugin: an async fixture of ours would be set up by whichever plugin
    # claims it, in a loop that need not be the test's.
    return cast(Database, request.getfixturevalue(_database_fixture_for(request)))


def _database_fixture_for(request: pytest.FixtureRequest) -> str:
    """The name of the fixture that opens the Database in ``request``'s test loop."""
    item = request.node
    if _PYTEST_ASYNCIO and pytest_asyncio.is_async_test(item):
        return f"_aiofragno_db_asyncio_{_asyncio_loop_scope(item)}"
    if "anyio_backend" in request.fixturenames:
        return "_aiofragno_db_anyio"
    if item.get_closest_marker("asyncio") is not None:
        pytest.fail(
            f"aiofragno_db: {item.name} is marked asyncio, but no pytest-asyncio 0.24 or "
            "later runs it: pip install -U 'pytest-asyncio>=0.24' (and do not disable it "
            "with -p no:asyncio)",
            pytrace=False,
        )
    pytest.fail(
        f"aiofragno_db: {item.name} is not run by an async test plugin, so there is no "
        "event loop to open the Database in. Make it an async test and mark it "
        "@pytest.mark.asyncio (pytest-asyncio; or set asyncio_mode = auto) or "
        "@pytest.mark.anyio (anyio's plugin).",
        pytrace=False,
    )


def _asyncio_loop_scope(item: pytest.Item) -> str:
    """The scope of the loop pytest-asyncio runs ``item`` in: the ``loop_scope``
    of its closest asyncio mark, else ``asyncio_default_test_loop_scope``."""
    mark = item.get_closest_marker("asyncio")
    scope = mark and (mark.kwargs.get("loop_scope") or mark.kwargs.get("scope"))
    return str(scope or item.config.getini("asyncio_default_test_loop_scope") or "function")


@asynccontextmanager
async def isolated_database(
    url: str, schema: Schema | None = None, **options: Unpack[ConnectOptions]
) -> AsyncIterator[Database]:
    """``async with`` a Database of its own on the server of ``url`` (see the
    module's notes on isolation), migrated to ``schema``; its data is dropped
    on exit. ``options`` go to ``af.connect``. Open and use it in one event
    loop: under pytest-asyncio, give your fixture the tests' ``loop_scope``."""
    token = f"t{uuid.uuid4().hex[:12]}"
    dialect = parse_url(url).dialect
    if dialect == "mysql":
        async with private_mysql_database(url, token) as private, connect(private, **options) as db:
            yield await _migrated(db, schema)
        return
    if dialect == "sqlite":
        async with connect(url, **options) as db:
            yield await _migrated(db, schema)
        return
    options = {"naming": PrefixedSchemaNaming(token), "search_path": token, **options}
    async with connect(url) as admin:
        await admin.execute(sql("CREATE SCHEMA {s}", s=Identifier(token)))
        try:
            async with connect(url, **options) as db:
                yield await _migrated(db, schema)
        finally:
            await _drop_prefixed_schemas(admin, token)


def _database_fixture() -> Callable[..., AsyncIterator[Database]]:
    # A function object per fixture: pytest-asyncio marks the function itself.
    async def database(
        aiofragno_url: str, aiofragno_schema: Schema | None, aiofragno_options: ConnectOptions
    ) -> AsyncIterator[Database]:
        async with isolated_database(aiofragno_url, aiofragno_schema, **aiofragno_options) as db:
            yield db

    return database


# anyio's plugin runs an async fixture in the test's runner when the test
# uses ``anyio_backend``; pytest-asyncio runs one in the loop of the
# ``loop_scope`` it was declared with, so there is one per scope. Strict mode
# leaves the anyio one alone (it is not marked), and anyio the others (no
# pytest-asyncio test uses ``anyio_backend``).
_aiofragno_db_anyio = pytest.fixture(name="_aiofragno_db_anyio")(_database_fixture())


def _asyncio_fixture(loop_scope: LoopScope) -> Any:
    assert pytest_asyncio is not None
    name = f"_aiofragno_db_asyncio_{loop_scope}"
    return pytest_asyncio.fixture(loop_scope=loop_scope, name=name)(_database_fixture())


if _PYTEST_ASYNCIO:
    _aiofragno_db_asyncio_function = _asyncio_fixture("function")
    _aiofragno_db_asyncio_class = _asyncio_fixture("class")
    _aiofragno_db_asyncio_module = _asyncio_fixture("module")
    _aiofragno_db_asyncio_package = _asyncio_fixture("package")
    _aiofragno_db_asyncio_session = _asyncio_fixture("session")


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
