"""``aiofragno.dialects`` holds what each SQL dialect *is* — capabilities,
compiler settings, error codes, SQL text — and no code that drives a
connection: that lives in ``aiofragno.backends``. Checked on the source, so a
driver import slipped into a dialect module fails here even where the driver
happens to be installed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aiofragno.dialects

DIALECTS = Path(aiofragno.dialects.__file__).parent
MODULES = sorted(DIALECTS.glob("*.py"))

# Engine code (pool, backends, the runtime port and its primitives), threads,
# event loops, and every driver a backend uses.
FORBIDDEN = (
    "aiofragno.pool",
    "aiofragno.backends",
    "aiofragno.runtime",
    "aiofragno.slots",
    "anyio",
    "asyncio",
    "trio",
    "sniffio",
    "threading",
    "sqlite3",
    "aiosqlite",
    "asyncpg",
    "asyncmy",
)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (functions and
    TYPE_CHECKING blocks too), relative imports resolved."""
    package = f"aiofragno.dialects.{path.stem}".split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            # "from .. import pool" imports the module aiofragno.pool.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


def test_the_dialect_modules_are_found() -> None:
    assert {path.stem for path in MODULES} >= {"common", "mysql", "postgresql", "sqlite"}


@pytest.mark.parametrize("path", MODULES, ids=[path.stem for path in MODULES])
def test_a_dialect_module_imports_no_engine_code(path: Path) -> None:
    imports = imported_modules(path)
    assert sorted(m for m in imports if forbidden(m)) == []


def test_the_check_sees_relative_and_driver_imports(tmp_path: Path) -> None:
    # The checker itself, on a module written like the old dialects/sqlite.py.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sqlite3\nfrom .. import runtime\nfrom ..pool import PooledDialect\n"
        "from .common import json_param\n"
        "def f():\n    import threading\n"
    )
    imports = imported_modules(bad)
    assert "aiofragno.dialects.common" in imports
    assert {m for m in imports if forbidden(m)} == {
        "sqlite3",
        "threading",
        "aiofragno.runtime",
        "aiofragno.pool",
        "aiofragno.pool.PooledDialect",
    }
