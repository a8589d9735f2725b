"""Run with these modules made unimportable: the plugin still loads, and
aiofragno_db works on the standard library's sqlite3 under anyio."""

import importlib

import pytest


@pytest.mark.parametrize("module", ["asyncpg", "asyncmy", "aiosqlite", "trio", "pytest_asyncio"])
def test_not_installed(module: str) -> None:
    with pytest.raises(ImportError):
        importlib.import_module(module)
