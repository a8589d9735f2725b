"""The command line against hostile input: malformed schema targets, a
current directory full of modules named like the ones aiofragno imports, and
outbox entries full of terminal control characters."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from tests.conftest import TARGETS, Target, require_target

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = shutil.which("aiofragno", path=str(Path(sys.executable).parent)) or "aiofragno"
DIALECTS = [
    t for t in TARGETS if t.runtime == "asyncio" and t.backend in ("sqlite", "asyncpg", "asyncmy")
]
# What a terminal acts on or reorders by (see aiofragno.cli.escape_controls).
UNSAFE = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
HOSTILE = "a\x1b[31mred\x07\x85next\u202eevil\u2066iso\u2069\u200f\u061c\u2028sep\x7fdel é ✓"


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AIOFRAGNO_URL", None)
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("aiofragno: error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not UNSAFE.search(result.stderr), result.stderr


@pytest.fixture(params=DIALECTS, ids=str)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    target: Target = request.param
    require_target(target)
    return target.url(tmp_path)


@pytest.mark.parametrize(
    "spec", ["..x:y", ".x:y", "x:", ":y", "a.b", "a..b:c", "x:y.z", "1x:y", "x:y:z", "x y:z"]
)
def test_migrate_with_a_malformed_target(spec: str, tmp_path: Path) -> None:
    result = run("migrate", "--url", f"sqlite:///{tmp_path}/t.db", spec)
    assert_one_line_error(result, "expected module:attr")


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("raise TypeError('no')", "TypeError: no"),
        ("def broken(:\n", "SyntaxError"),
        (f"raise RuntimeError({HOSTILE!r})", "RuntimeError: a"),
        ("import no_such_module_here", "ModuleNotFoundError"),
    ],
)
def test_migrate_a_module_that_fails_to_import(code: str, message: str, tmp_path: Path) -> None:
    """Whatever the schema's module raises while imported is one line on
    stderr (control characters escaped), exit 1."""
    (tmp_path / "broken_schema.py").write_text(code)
    result = run("migrate", "--url", f"sqlite:///{tmp_path}/t.db", "broken_schema:s", cwd=tmp_path)
    assert_one_line_error(result, f"cannot import module 'broken_schema': {message}")


# Named like what the command imports: drivers, runtimes, the standard library.
SHADOWS = ["asyncpg", "asyncmy", "aiosqlite", "sqlite3", "trio", "anyio", "sniffio", "ssl"]
SCHEMA_MODULE = """
import aiofragno as af

schema = af.Schema("hostile", af.Table("notes", af.Column("body", "string")))
"""


@pytest.mark.parametrize("runtime", ["asyncio", "trio"])
def test_migrate_imports_drivers_not_the_current_directory(
    url: str, runtime: str, tmp_path: Path
) -> None:
    """The schema's module is found in the current directory; the driver,
    the runtime and the standard library are not, even when files there
    are named like them."""
    work = tmp_path / "work"
    work.mkdir()
    for name in SHADOWS:
        (work / f"{name}.py").write_text(
            f"import sys\nsys.stderr.write('SHADOWED {name}\\n')\nraise ImportError('shadowed')\n"
        )
    (work / "app_schema.py").write_text(SCHEMA_MODULE)
    namespace = f"h{uuid.uuid4().hex[:8]}"
    result = run(
        "--runtime",
        runtime,
        "migrate",
        "--url",
        url,
        "app_schema:schema",
        "--namespace",
        namespace,
        "--dry-run",
        cwd=work,
    )
    assert "SHADOWED" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE" in result.stdout


def test_outbox_tail_escapes_control_characters(url: str, tmp_path: Path) -> None:
    """Entries carrying C0/C1 controls and bidi overrides print as valid
    JSON with those characters as \\uXXXX escapes — the same value, nothing
    a terminal would act on — in the default and the ``--json`` output."""
    schema = af.Schema("hostile", af.Table("notes", af.Column("body", "string")))
    namespace = f"h{uuid.uuid4().hex[:8]}"

    async def write() -> str | None:
        async with af.connect(url, outbox=True) as db:
            await db.migrate(schema, namespace=namespace)
            before = await db.outbox.latest()

            async def unit(uow: af.UnitOfWork) -> None:
                uow.create("notes", {"body": HOSTILE})

            await db.execute_uow(unit, schema=schema, namespace=namespace)
            return before

    async def drop() -> None:
        async with af.connect(url) as db:
            layout = db.layout(schema, namespace)
            # (PostgreSQL: the namespace's own schema, which would stay behind.)
            for name in layout.db_schemas:
                await db.execute(af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name)))
            if not layout.db_schemas:
                table = layout.table("notes").identifier
                await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=table))

    after = anyio.run(write)
    try:
        for flags in ([], ["--json"]):
            since = [] if after is None else ["--after", after]
            result = run("outbox", "tail", "--url", url, *since, *flags)
            assert result.returncode == 0, result.stderr
            assert not UNSAFE.search(result.stdout), result.stdout
            lines = result.stdout.splitlines()
            bodies = [
                m["values"]["body"]
                for line in lines
                for m in json.loads(line)["payload"]["mutations"]
                if m["namespace"] == namespace
            ]
            assert bodies == [HOSTILE]
    finally:
        anyio.run(drop)


def test_outbox_tail_into_a_reader_that_goes_away_is_quiet(tmp_path: Path) -> None:
    """``aiofragno outbox tail | head -1``: the reader closes the pipe after
    one line; the command ends without an error line and with status 0."""
    url = f"sqlite:///{tmp_path}/pipe.db"
    schema = af.Schema("piped", af.Table("notes", af.Column("body", "string")))

    async def write() -> None:
        async with af.connect(url, outbox=True) as db:
            await db.migrate(schema)

            async def unit(uow: af.UnitOfWork) -> None:
                for i in range(2000):
                    uow.create("notes", {"body": f"note {i}"})

            for _ in range(5):
                await db.execute_uow(unit, schema=schema)

    anyio.run(write)
    tail = subprocess.Popen(
        [SCRIPT, "outbox", "tail", "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tail.stdout is not None and tail.stderr is not None
    assert json.loads(tail.stdout.readline())["versionstamp"]
    tail.stdout.close()  # the reader goes away
    assert tail.wait(timeout=60) == 0
    assert tail.stderr.read() == b""
