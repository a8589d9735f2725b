"""What a user does first with an installed aiofragno, run by .ci/run in
each fresh venv the *wheel* is installed into (never in the checkout: the
venv's site-packages must be what is imported).

    python smoke.py CHECK [CHECK ...]

Checks: ``sqlite`` (stdlib backend), ``aiosqlite``, ``trio`` (SQLite under
trio), ``postgresql``, ``mysql`` (the shared CI servers), ``cli`` (the demo,
which draws with rich), ``otel`` (a unit of work in aiofragno.otel's span), ``missing:DIALECT`` (connecting says which extra to
install), ``relay:BROKER`` (an entry relayed to the shared ``nats`` or
``redis`` server), ``relay-missing:BROKER`` (relaying says which extra to
install). Every run also checks the import, ``aiofragno --version`` and that
pytest starts with the plugin loaded, when pytest is installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio

import aiofragno as af
from aiofragno.demo import drop_namespace

URLS = {
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}
LEDGER = af.Schema("smoke", af.Table("notes", af.Column("text", "string")))


def check_installed() -> None:
    here = Path(af.__file__).resolve()
    assert "site-packages" in here.parts, f"aiofragno imported from {here}, not the venv"
    version = importlib.metadata.version("aiofragno")
    assert af.__version__ == version, (af.__version__, version)
    script = shutil.which("aiofragno", path=str(Path(sys.executable).parent))
    assert script, "no aiofragno script in the venv"
    for command in ([script, "--version"], [sys.executable, "-m", "aiofragno", "--version"]):
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"aiofragno {version}", out


async def round_trip(url: str, backend: str | None = None) -> None:
    async with af.connect(url, backend=backend, outbox=True) as db:
        assert await db.fetch_value(af.sql("SELECT 1")) == 1
        namespace = f"smoke{os.getpid()}"
        try:
            await db.migrate(LEDGER, namespace=namespace)

            async def write(uow: af.UnitOfWork) -> None:
                uow.create("notes", {"text": "hello"})

            await db.execute_uow(write, schema=LEDGER, namespace=namespace)

            async def read(uow: af.UnitOfWork) -> None:
                found = uow.find("notes")
                await uow.retrieve()
                assert [row["text"] for row in found.result] == ["hello"], found.result

            await db.execute_uow(read, schema=LEDGER, namespace=namespace)
        finally:
            await drop_namespace(db, namespace, LEDGER)



async def traced(url: str) -> None:
    from aiofragno.otel import UowTracer

    async with af.connect(url) as db:
        await db.migrate(LEDGER)

        async def write(uow: af.UnitOfWork) -> str:
            uow.create("notes", {"text": "traced"})
            return "done"

        assert await UowTracer().execute_uow(db, write, schema=LEDGER) == "done"


async def refused(dialect: str) -> None:
    try:
        async with af.connect(URLS[dialect]):
            pass
    except af.BackendNotInstalled as exc:
        assert "pip install 'aiofragno[" in str(exc), exc
    else:
        raise AssertionError(f"{dialect} connected without its driver installed")


def check_pytest_starts() -> None:
    if importlib.util.find_spec("pytest") is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_plain.py").write_text("def test_nothing():\n    assert True\n")
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"],
            capture_output=True, text=True, cwd=tmp,
        )  # fmt: skip
        assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout + result.stderr


async def relayed(broker: str, url: str) -> None:
    """One unit's entry relayed to a stream (key) of its own, then removed."""
    name = f"smoke_{os.getpid()}"
    async with af.connect(url, outbox=True) as db:
        await db.migrate(LEDGER)
        await db.execute_uow(_note, schema=LEDGER)
        if broker == "nats":
            import nats

            nc = await nats.connect("nats://127.0.0.1:4222")
            js = nc.jetstream()
            await js.add_stream(name=name, subjects=[name])
            try:
                sink: af.BrokerSink = af.NatsSink(subject=name)
                assert await db.outbox.relay(sink, until_caught_up=True) == 1
                assert (await js.stream_info(name)).state.messages == 1
            finally:
                await js.delete_stream(name)
                await nc.close()
        else:
            sink = af.RedisSink(key=name)
            try:
                assert await db.outbox.relay(sink, until_caught_up=True) == 1
            finally:
                import redis.asyncio

                client = redis.asyncio.Redis()
                assert await client.delete(name) == 1
                await client.aclose()


async def _note(uow: af.UnitOfWork) -> None:
    uow.create("notes", {"text": "relayed"})


async def relay_refused(broker: str, url: str) -> None:
    sink = af.NatsSink(subject="x") if broker == "nats" else af.RedisSink(key="x")
    async with af.connect(url, outbox=True) as db:
        try:
            await db.outbox.relay(sink, until_caught_up=True)
        except af.RelayError as exc:
            assert f"pip install 'aiofragno[{broker}]'" in str(exc), exc
        else:
            raise AssertionError(f"relayed to {broker} without its client installed")


def run(check: str, tmp: str) -> None:
    sqlite_url = f"sqlite:///{tmp}/{check.replace(':', '_')}.db"
    if check == "sqlite":
        anyio.run(round_trip, sqlite_url, "sqlite")
    elif check == "aiosqlite":
        anyio.run(round_trip, sqlite_url, "aiosqlite")
    elif check == "trio":
        anyio.run(round_trip, sqlite_url, None, backend="trio")
    elif check in URLS:
        anyio.run(round_trip, URLS[check])
    elif check == "cli":
        demo = subprocess.run(
            [sys.executable, "-m", "aiofragno", "demo", "--units", "20", "--url", sqlite_url],
            capture_output=True, text=True,
        )  # fmt: skip
        assert demo.returncode == 0 and "versions contiguous: True" in demo.stdout, demo
    elif check == "otel":
        anyio.run(traced, sqlite_url)
    elif check.startswith("missing:"):
        anyio.run(refused, check.partition(":")[2])
    elif check.startswith("relay:"):
        anyio.run(relayed, check.partition(":")[2], sqlite_url)
    elif check.startswith("relay-missing:"):
        anyio.run(relay_refused, check.partition(":")[2], sqlite_url)
    else:
        raise SystemExit(f"unknown check {check!r}")


def main() -> None:
    check_installed()
    check_pytest_starts()
    with tempfile.TemporaryDirectory() as tmp:
        for check in sys.argv[1:]:
            run(check, tmp)
            print(f"  ok: {check}")


if __name__ == "__main__":
    main()
