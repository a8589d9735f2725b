"""aiofragno.testing under each test runner users have, in throw-away projects.

Each test copies projects from tests/plugin_projects/ to a temporary
directory and runs pytest there in a subprocess (the plugin is loaded from
the entry point, as in a user's venv), then asserts on what that run
reported. The projects' tests run once per dialect (SQLite, and the
PostgreSQL and MariaDB servers where they answer) and record where their
data lived, so we can check that it was dropped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from tests.conftest import TARGETS, required_dialects, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
PROJECTS = Path(__file__).parent / "plugin_projects"
CACHES = shutil.ignore_patterns("__pycache__")


@dataclass
class Run:
    outcome: dict[str, int]
    output: str
    places: Counter[tuple[str, str]]  # (dialect, schema or database) -> tests that used it


@pytest.fixture(scope="module")
def dialect_urls() -> dict[str, str | None]:
    """SQLite (the default: no URL) and each server that answers; a server
    that AIOFRAGNO_REQUIRE_BACKENDS requires fails the test instead."""
    urls: dict[str, str | None] = {"sqlite": None}
    for target in TARGETS:
        if target.dialect == "sqlite" or target.dialect in urls:
            continue
        reason = unavailable_reason(target)
        if reason is None:
            urls[target.dialect] = target.url(None)
        elif target.dialect in required_dialects():
            pytest.fail(f"{reason}; AIOFRAGNO_REQUIRE_BACKENDS requires {target.dialect}")
    return urls


def run_project(
    tmp_path: Path,
    sources: list[str],
    urls: dict[str, str | None],
    *,
    args: tuple[str, ...] = (),
    without: tuple[str, ...] = (),
) -> Run:
    """Copy ``sources`` (directories or files under tests/plugin_projects) to a
    project and run pytest in it with the venv's python."""
    project = tmp_path / "project"
    project.mkdir()
    for source in sources:
        path = PROJECTS / source
        if path.is_dir():
            shutil.copytree(path, project, dirs_exist_ok=True, ignore=CACHES)
        else:
            shutil.copy(path, project)
    if not (project / "pytest.ini").exists():
        (project / "pytest.ini").write_text("[pytest]\n")
    record = tmp_path / "places.jsonl"
    record.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AIOFRAGNO_"))}
    env |= {"PYTHONPATH": str(ROOT), "AF_DIALECT_URLS": json.dumps(urls), "AF_RECORD": str(record)}
    # -rN: no short summary, whose lines repeat messages up to the terminal's
    # width, so counts of a message would depend on COLUMNS.
    command = [sys.executable, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider", *args]
    if without:
        # No site-packages but a copy (of links) without those distributions.
        command[1:1] = ["-S"]
        env["PYTHONPATH"] += os.pathsep + str(site_packages_without(without, tmp_path / "site"))
    done = subprocess.run(
        [*command, "--basetemp", str(tmp_path / "base")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    output = done.stdout + done.stderr
    places = Counter(tuple(json.loads(line)) for line in record.read_text().splitlines())
    return Run(outcome(output), output, places)


def site_packages_without(distributions: tuple[str, ...], site: Path) -> Path:
    """``site``: links to what the venv's site-packages holds, but for the
    packages and metadata (so the entry points) of ``distributions``."""
    site.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.partition("-")[0].lower() not in distributions:
            (site / entry.name).symlink_to(entry)
    return site


def outcome(output: str) -> dict[str, int]:
    """The counts of pytest's summary line: ``{"passed": 3, "errors": 1}``."""
    last = output.strip().splitlines()[-1]
    counts = re.findall(r"(\d+) (passed|failed|skipped|errors?|warnings?|xfailed|xpassed)", last)
    plural = {"error": "errors", "warning": "warnings"}
    return {plural.get(word, word): int(n) for n, word in counts}


def expect(run: Run, urls: dict[str, str | None], per_dialect: int) -> None:
    """``per_dialect`` tests passed on each dialect and nothing else happened;
    on a server, each test had a schema or database of its own."""
    assert run.outcome == {"passed": per_dialect * len(urls)}, run.output
    for dialect in urls.keys() - {"sqlite"}:
        assert sum(d == dialect for d, _ in run.places) == per_dialect, run.places
    assert all(count == 1 for count in run.places.values()), run.places
    anyio.run(assert_dropped, urls, run.places)


async def assert_dropped(urls: dict[str, str | None], places: Counter[tuple[str, str]]) -> None:
    for dialect, url in urls.items():
        if url is None:
            continue
        async with af.connect(url) as db:
            for place in (p for d, p in places if d == dialect):
                found = await db.fetch_value(
                    af.sql(
                        "SELECT count(*) FROM information_schema.schemata "
                        "WHERE schema_name = {p} OR schema_name LIKE {prefix}",
                        p=place,
                        prefix=f"{place}\\_%",
                    )
                )
                assert found == 0, f"{dialect} {place} was left behind"


def test_pytest_asyncio_strict_mode(tmp_path: Path, dialect_urls: dict[str, str | None]) -> None:
    # pytest-asyncio's default mode, each loop scope, a fixture of the user's
    # on top of aiofragno_db, and anyio tests (asyncio, trio) in the same run.
    run = run_project(tmp_path, ["common", "strict", "anyio/test_anyio.py"], dialect_urls)
    expect(run, dialect_urls, per_dialect=10)


def test_pytest_asyncio_auto_mode(tmp_path: Path, dialect_urls: dict[str, str | None]) -> None:
    # Unmarked tests in the default loop scope of pytest.ini (module), and
    # marked ones in function and session loops.
    run = run_project(tmp_path, ["common", "auto"], dialect_urls)
    expect(run, dialect_urls, per_dialect=5)


def test_anyio_without_pytest_asyncio_or_drivers(tmp_path: Path) -> None:
    # The plugin is loaded into every pytest run of the venv: with only
    # anyio (and no trio, no drivers) it still serves SQLite.
    urls: dict[str, str | None] = {"sqlite": None}
    absent = ("pytest_asyncio", "trio", "asyncpg", "asyncmy", "aiosqlite")
    run = run_project(tmp_path, ["common", "minimal", "anyio/test_anyio.py"], urls, without=absent)
    expect(run, urls, per_dialect=2 + len(absent))


def test_neither_plugin(tmp_path: Path) -> None:
    # Plain tests are unaffected; aiofragno_db says what is missing.
    # (anyio is a dependency of aiofragno: its plugin can only be disabled.)
    run = run_project(tmp_path, ["bare"], {}, args=("-p", "no:anyio"), without=("pytest_asyncio",))
    assert run.outcome == {"passed": 1, "errors": 3}, run.output
    assert run.output.count("is not run by an async test plugin, so there is no") == 2
    assert run.output.count("is marked asyncio, but no pytest-asyncio 0.24 or later runs") == 1
