"""Test targets: every backend under every runtime it supports.

Server-backed targets need a reachable server: by default they are skipped
with the reason when it is not; with ``AIOFRAGNO_REQUIRE_BACKENDS=postgresql,mysql``
(as CI sets it) a missing server or driver fails the run instead.
Select targets with ``--backend sqlite|postgresql|mysql`` (a dialect, all
its drivers) or a driver's name (``--backend aiosqlite``), and
``--runtime asyncio|trio`` (both repeatable).

Tests that restart, crash or stall a server use a private one
(``private_server``, from tests/servers.py), never the shared servers.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlsplit

import pytest

pytest_plugins = ["tests.servers"]

# Projects that tests/test_testing_runners.py copies and runs on their own.
collect_ignore = ["plugin_projects"]

POSTGRES_URL = os.environ.get(
    "AIOFRAGNO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("AIOFRAGNO_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


@dataclass(frozen=True)
class Target:
    runtime: str
    backend: str
    dialect: str
    module: str  # the driver package that must be importable

    def __str__(self) -> str:
        return f"{self.backend}-{self.runtime}"

    def url(self, tmp_path: object) -> str:
        if self.dialect == "postgresql":
            return POSTGRES_URL
        if self.dialect == "mysql":
            return MYSQL_URL
        return f"sqlite:///{tmp_path}/test.db"


TARGETS = [
    Target("asyncio", "sqlite", "sqlite", "sqlite3"),
    Target("trio", "sqlite", "sqlite", "sqlite3"),
    Target("asyncio", "aiosqlite", "sqlite", "aiosqlite"),
    Target("asyncio", "asyncpg", "postgresql", "asyncpg"),
    Target("trio", "asyncpg", "postgresql", "asyncpg"),
    Target("asyncio", "asyncmy", "mysql", "asyncmy"),
    Target("trio", "asyncmy", "mysql", "asyncmy"),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiofragno")
    group.addoption(
        "--backend",
        action="append",
        default=[],
        help="only these dialects (sqlite, postgresql, mysql) or drivers (aiosqlite, asyncpg, ...)",
    )
    group.addoption("--runtime", action="append", default=[], help="only these runtimes")


def selected_targets(config: pytest.Config) -> list[Target]:
    """The targets ``--backend`` (a dialect: all its drivers; or one driver,
    say ``aiosqlite``) and ``--runtime`` select."""
    backends = config.getoption("--backend")
    runtimes = config.getoption("--runtime")
    return [
        t
        for t in TARGETS
        if (not backends or t.dialect in backends or t.backend in backends)
        and (not runtimes or t.runtime in runtimes)
    ]


def selected_runtimes(config: pytest.Config) -> list[str]:
    return config.getoption("--runtime") or ["asyncio", "trio"]


def required_dialects() -> set[str]:
    value = os.environ.get("AIOFRAGNO_REQUIRE_BACKENDS", "")
    return {name.strip() for name in value.split(",") if name.strip()}


@cache
def _server_answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return True
    except OSError:
        return False


def unavailable_reason(target: Target) -> str | None:
    """Why ``target`` cannot run here, or None."""
    if importlib.util.find_spec(target.module) is None:
        return f"driver {target.module} is not installed (pip install 'aiofragno[all]')"
    if target.dialect == "sqlite":
        return None
    url = target.url(None)
    if not _server_answers(url):
        return f"no {target.dialect} server answers at {urlsplit(url).netloc} (see backends/)"
    return None


def require_target(target: Target) -> None:
    """Skip (or, when the dialect is required, fail) if ``target`` cannot run."""
    reason = unavailable_reason(target)
    if reason is None:
        return
    if target.dialect in required_dialects():
        pytest.fail(f"{reason}; AIOFRAGNO_REQUIRE_BACKENDS requires {target.dialect}")
    pytest.skip(reason)


@pytest.fixture
def anyio_backend() -> str:
    """Replaced by the parametrization below (every selected runtime); a plain
    fixture here so that it does not clash with anyio's own."""
    return "asyncio"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = selected_targets(metafunc.config)
        metafunc.parametrize("target", targets, ids=[str(t) for t in targets])
    elif "anyio_backend" in metafunc.fixturenames:
        runtimes = selected_runtimes(metafunc.config)
        metafunc.parametrize("anyio_backend", runtimes, ids=runtimes)
