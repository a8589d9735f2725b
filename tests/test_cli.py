"""The ``aiofragno`` console script, run as a user runs it, on every dialect."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from aiofragno.demo import SHOP
from tests.conftest import TARGETS, Target, require_target

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = shutil.which("aiofragno", path=str(Path(sys.executable).parent)) or "aiofragno"
DIALECTS = [
    t for t in TARGETS if t.runtime == "asyncio" and t.backend in ("sqlite", "asyncpg", "asyncmy")
]


def run(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if url is not None:
        env["AIOFRAGNO_URL"] = url
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


@pytest.fixture(params=DIALECTS, ids=str)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    target: Target = request.param
    require_target(target)
    return target.url(tmp_path)


def test_demo_with_url(url: str) -> None:
    result = run("demo", "--units", "40", "--url", url)
    assert result.returncode == 0, result.stderr
    assert ": True; transfer rows:" in result.stdout  # money conserved
    assert "versions contiguous: True" in result.stdout


def test_demo_runs_on_sqlite_by_default() -> None:
    result = run("demo", "--units", "60")
    assert result.returncode == 0, result.stderr
    assert "money conserved: 50000 == 50000: True" in result.stdout
    assert "versions contiguous: True" in result.stdout


def test_migrate_dry_run_then_migrate(url: str) -> None:
    dry = run(
        "migrate", "tests.clidata.schemas:ledger", "--dry-run", "--namespace", "clidry", url=url
    )
    assert dry.returncode == 0, dry.stderr
    assert "CREATE TABLE" in dry.stdout and "entries" in dry.stdout
    done = run("migrate", "tests.clidata.schemas:ledger", url=url)
    assert done.returncode == 0, done.stderr
    assert "schema version now at" in done.stderr
    again = run("migrate", "tests.clidata.schemas:ledger", url=url)
    assert again.returncode == 0 and again.stdout.strip() == "", again.stdout


def test_migrate_plan_then_apply(url: str, tmp_path: Path) -> None:
    """--plan prints the steps and writes the plan; --apply runs exactly it,
    and refuses it once the database has changed."""
    ns = ["--namespace", "cliplan"]
    anyio.run(_drop_namespace, url, "cliplan")  # (what an interrupted run left)
    try:
        _plan_then_apply(url, tmp_path, ns)
    finally:
        anyio.run(_drop_namespace, url, "cliplan")


async def _drop_namespace(url: str, namespace: str) -> None:
    from tests.clidata.schemas import ledger
    from tests.conformance.namespaces import Namespaces

    async with af.connect(url) as db:
        spaces = Namespaces(db)
        spaces.use(db, ledger, namespace)
        await spaces.drop()


def _plan_then_apply(url: str, tmp_path: Path, ns: list[str]) -> None:
    assert run("migrate", "tests.clidata.schemas:ledger", *ns, url=url).returncode == 0
    plan_file = tmp_path / "plan.json"
    planned = run(
        "migrate", "tests.clidata.schemas:ledger_v2", *ns, "--plan", "-o", str(plan_file), url=url
    )
    assert planned.returncode == 0, planned.stderr
    text = planned.stdout
    assert "-- step 1: rename column entries.amount -> total [locks table]" in text
    assert "RENAME COLUMN" in text and "create index entries.by_total" in text
    plan = json.loads(plan_file.read_text())
    applied = run(
        "migrate", "tests.clidata.schemas:ledger_v2", *ns, "--apply", str(plan_file), url=url
    )
    assert applied.returncode == 0, applied.stderr
    statements = [s for step in plan["steps"] for s in step["sql"] if not s.startswith("--")]
    assert applied.stdout.splitlines() == [s.rstrip() + ";" for s in statements]
    again = run(
        "migrate", "tests.clidata.schemas:ledger_v2", *ns, "--apply", str(plan_file), url=url
    )
    assert again.returncode != 0 and "the database changed since it was made" in again.stderr
    assert run("migrate", "tests.clidata.schemas:ledger_v2", *ns, "--plan", url=url).stdout == (
        f"-- migration plan {_empty_plan_id(again.stderr)} for namespace {ns[1]}: 0 steps, "
        "to schema version 2\n"
    )


def _empty_plan_id(message: str) -> str:
    return message.split("(a plan made now is ")[1].split(",")[0]


def test_inspect_prints_the_migrated_tables_as_json(url: str) -> None:
    assert run("migrate", "tests.clidata.schemas:ledger", url=url).returncode == 0
    result = run("inspect", url, "--namespace", "cliledger")
    assert result.returncode == 0, result.stderr
    live = json.loads(result.stdout)
    assert live["namespace"] == "cliledger"
    [entries] = live["tables"]
    assert entries["table"] == "entries"
    columns = {c["name"]: c for c in entries["columns"]}
    assert list(columns) == ["_id", "id", "_version", "amount"]
    assert "bigint" in columns["amount"]["types"] and not columns["amount"]["nullable"]
    assert any(i["columns"] == ["id"] and i["unique"] for i in entries["indexes"])
    # Without a namespace (the URL from --url): every table, aiofragno's too.
    every = json.loads(run("inspect", "--url", url).stdout)
    assert "fragno_db_settings" in {t["name"] for t in every["tables"]}


def test_outbox_commands(url: str) -> None:
    run("migrate", "tests.clidata.schemas:ledger", url=url)
    # (From the newest entries on: the shared test database's outbox holds
    # every test run's entries.)
    latest = json.loads(run("outbox", "consumers", "--url", url).stdout.splitlines()[0])["latest"]
    after = [] if latest is None else ["--after", f"{max(int(latest[:20], 16) - 50, 0):020x}0000"]
    tail = run("outbox", "tail", *after, url=url)
    assert tail.returncode == 0, tail.stderr
    for line in tail.stdout.splitlines():
        assert len(json.loads(line)["versionstamp"]) == 24
    consumers = run("outbox", "consumers", "--url", url)
    assert consumers.returncode == 0, consumers.stderr
    assert "latest" in json.loads(consumers.stdout.splitlines()[0])


def test_doctor(url: str) -> None:
    result = run("doctor", "--url", url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["healthy"] is True
    assert report["capabilities"]["outbox_version_strategy"].startswith("insert-on-")
    assert isinstance(report["capabilities"]["supports_writable_cte"], bool)
    if url.startswith("sqlite"):
        assert report["servers"] == []
    else:
        [server] = report["servers"]
        assert server.startswith(f"{url.split('@')[1].split('/')[0]}: primary, timeline ")
    assert "warnings" not in report


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["doctor", "--url", "nonsense"], "bad database URL"),
        (["doctor", "--url", "postgresql://postgres@127.0.0.1:1/x"], "cannot connect"),
        (["migrate", "--url", "sqlite:///:memory:", "no_such_module:x"], "cannot import module"),
        (
            ["migrate", "--url", "sqlite:///:memory:", "tests.clidata.schemas:nope"],
            "not an af.Schema",
        ),
        (
            ["migrate", "--url", "sqlite:///:memory:", "tests.clidata.schemas:not_a_schema"],
            "found int",
        ),
        (["outbox", "tail", "--url", "sqlite:///:memory:", "--after", "zz"], "malformed --after"),
        (["doctor"], "no database URL"),
    ],
)
def test_errors_are_one_line_and_exit_1(args: list[str], message: str) -> None:
    env_url = os.environ.pop("AIOFRAGNO_URL", None)
    try:
        result = run(*args)
    finally:
        if env_url is not None:
            os.environ["AIOFRAGNO_URL"] = env_url
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback() -> None:
    result = run("--debug", "doctor", "--url", "nonsense")
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_bench(url: str) -> None:
    result = run("bench", "--units", "40", "--concurrency", "4", "--url", url)
    assert result.returncode == 0, result.stderr
    report = dict(
        line.strip().split("  ", 1) for line in result.stdout.splitlines() if "  " in line.strip()
    )
    assert report["units"].strip() == "40"
    assert float(report["units/s"].replace(",", "")) > 0
    # It ran in a namespace of its own, which it dropped: nothing stays.
    namespace = report["namespace"].split()[0]
    assert namespace.startswith("bench")
    anyio.run(_assert_dropped, url, namespace)


async def _assert_dropped(url: str, namespace: str) -> None:
    async with af.connect(url) as db:
        layout = db.layout(SHOP, namespace)
        for table in ("accounts", "transfers"):
            with pytest.raises(af.ProgrammingError):
                await db.fetch_value(af.sql("SELECT 1 FROM {t}", t=layout.table(table).identifier))
        left = af.sql(
            "SELECT COUNT(*) FROM {t} WHERE {k} LIKE {p}",
            t=af.Identifier("fragno_db_settings"),
            k=af.Identifier("key"),
            p=f"{namespace}.%",
        )
        assert await db.fetch_value(left) == 0


def test_bench_compare_outside_a_checkout(tmp_path: Path) -> None:
    result = subprocess.run(
        [SCRIPT, "bench", "--compare", "raw"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 1 and "checkout" in result.stderr


def test_version_from_the_script_and_python_m() -> None:
    import aiofragno

    script = run("--version")
    module = subprocess.run(
        [sys.executable, "-m", "aiofragno", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    for result in (script, module):
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"aiofragno {aiofragno.__version__}"


def test_every_option_has_help_text() -> None:
    import argparse

    from aiofragno.cli import build_parser

    def options(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, str | None]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += options(sub, f"{path} {name}")
            elif action.option_strings:
                found.append((f"{path} {action.option_strings[-1]}", action.help))
        return found

    listed = options(build_parser(), "aiofragno")
    assert len(listed) > 15
    assert [name for name, help in listed if not help] == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://nobody:secret@127.0.0.1/test", "Access denied for user 'nobody'"),
        ("mysql://root@127.0.0.1/no_such_database", "Unknown database 'no_such_database'"),
        ("postgresql://nobody:secret@127.0.0.1/test", 'role "nobody" does not exist'),
        ("postgresql://postgres@127.0.0.1/no_such_database", "no_such_database"),
    ],
)
def test_connect_errors_read_alike_on_both_servers(url: str, message: str) -> None:
    # asyncmy's errors are (code, text) tuples: the user sees the text only.
    dialect = "mysql" if url.startswith("mysql") else "postgresql"
    require_target(next(t for t in DIALECTS if t.dialect == dialect))
    result = run("doctor", "--url", url)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert (
        "secret" not in result.stderr and '", "' not in result.stderr and "(1" not in result.stderr
    )
