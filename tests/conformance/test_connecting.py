"""Connecting as libpq and PyMySQL users do: Unix sockets, application_name,
session settings (libpq's ``options``, ``server_settings``), and libpq's
``PG*`` environment variables. TLS: test_tls.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest

import aiofragno as af
from aiofragno.url import parse_url
from tests.conftest import Target
from tests.servers import TLSPostgresServer, TLSServer

pytestmark = pytest.mark.anyio

APPLICATION_NAME = af.sql(
    "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)


@pytest.fixture
def server(url: str, target: Target) -> str:
    """The shared server's URL (server targets only)."""
    if target.dialect == "sqlite":
        pytest.skip("SQLite is embedded: no server to connect to")
    return url


def only(target: Target, dialect: str) -> None:
    if target.dialect != dialect:
        pytest.skip(f"a {dialect} feature")


async def socket_of(url: str, target: Target) -> str:
    """The server's Unix socket (PostgreSQL: its directory, MySQL: the
    file); skips when it is not on this machine."""
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        if target.dialect == "postgresql":
            setting = await db.fetch_value(af.sql("SHOW unix_socket_directories"))
            path = str(setting).split(",")[0].strip()
        else:
            path = str(await db.fetch_value(af.sql("SELECT @@socket")))
    if not await anyio.Path(path).exists():
        pytest.skip(f"the server's socket {path} is not on this machine")
    return path


async def test_unix_socket(server: str, target: Target) -> None:
    """A percent-encoded path in the host's place, or libpq's host= /
    PyMySQL's unix_socket= parameter."""
    socket = await socket_of(server, target)
    parsed = parse_url(server)
    userinfo = quote(parsed.username or "", safe="")
    if parsed.password:
        userinfo += ":" + quote(parsed.password, safe="")
    scheme = "postgresql" if target.dialect == "postgresql" else "mysql"
    parameter = "host" if target.dialect == "postgresql" else "unix_socket"
    encoded = f"{scheme}://{userinfo}@{quote(socket, safe='')}/{parsed.database}"
    urls = [encoded, f"{scheme}://{userinfo}@localhost/{parsed.database}?{parameter}={socket}"]
    if target.dialect == "mysql":
        urls.append(f"{urls[1]}&charset=utf8mb4")
    for url in urls:
        async with af.connect(url, backend=target.backend, pool_size=1) as db:
            assert db.url.host == socket
            if target.dialect == "postgresql":
                # No server address: the session came over a Unix socket.
                assert await db.fetch_value(af.sql("SELECT inet_server_addr()")) is None
            else:
                sql = af.sql(
                    "SELECT host FROM information_schema.processlist WHERE id = CONNECTION_ID()"
                )
                assert await db.fetch_value(sql) == "localhost"  # (TCP: address:port)
            assert quote(socket, safe="") in repr(db)


@pytest.mark.parametrize(
    ("query", "keepalive_idle", "user_timeout"),
    [
        ("", 5, 15_000),
        ("keepalives_idle=3&tcp_user_timeout=2.5", 3, 2_500),
        ("keepalives_idle=none&tcp_user_timeout=none", None, 0),
    ],
    ids=["defaults", "set", "none"],
)
async def test_tcp_keepalives_and_user_timeout(
    server: str, target: Target, query: str, keepalive_idle: int | None, user_timeout: int
) -> None:
    """Every TCP connection, MySQL's too, notices a host that vanished
    without a word: keepalive probes after ``keepalives_idle`` of silence
    (none at all with ``none``, though the driver would turn them on), and
    ``TCP_USER_TIMEOUT`` for data sent and never acknowledged."""
    url = f"{server}{'&' if '?' in server else '?'}{query}" if query else server
    async with af.connect(url, backend=target.backend) as db:
        session = await db._engine.acquire()
        try:
            connection: Any = session.connection
            connection = getattr(connection, "raw", connection)  # (trio: bridged)
            sock = connection._raw._transport.get_extra_info("socket")
            assert sock.family in (socket.AF_INET, socket.AF_INET6)
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == user_timeout
            keepalive = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            assert keepalive == (keepalive_idle is not None)
            if keepalive_idle is not None:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == keepalive_idle
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 5
        finally:
            await db._engine.release(session)


async def test_application_name(server: str, target: Target) -> None:
    only(target, "postgresql")
    async with af.connect(server, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(APPLICATION_NAME) == "aiofragno"
    url = f"{server}?application_name=billing"
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(APPLICATION_NAME) == "billing"
    async with af.connect(url, backend=target.backend, application_name="worker") as db:
        assert await db.fetch_value(APPLICATION_NAME) == "worker"


async def test_application_name_on_mysql(tls_server: TLSServer, target: Target) -> None:
    """MySQL's equivalent: the program_name connection attribute (the
    private server runs performance_schema, which shows it)."""
    only(target, "mysql")
    sql = af.sql(
        "SELECT ATTR_VALUE FROM performance_schema.session_connect_attrs "
        "WHERE PROCESSLIST_ID = CONNECTION_ID() AND ATTR_NAME = 'program_name'"
    )
    async with af.connect(tls_server.url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(sql) == "aiofragno"
    url = f"{tls_server.url}?application_name=billing"
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(sql) == "billing"


async def test_session_settings(server: str, target: Target) -> None:
    """libpq's options (-c name=value) and server_settings (which win)
    start every session, also one whose settings were reset after a SET;
    aiofragno's UTC stays."""
    only(target, "postgresql")
    url = f"{server}?options={quote('-c statement_timeout=5s --lock-timeout=2s')}"
    settings = {"work_mem": "8MB", "lock_timeout": "3s"}
    async with af.connect(url, backend=target.backend, pool_size=1, server_settings=settings) as db:
        for name, value in [
            ("statement_timeout", "5s"),
            ("lock_timeout", "3s"),
            ("work_mem", "8MB"),
            ("TimeZone", "UTC"),
        ]:
            assert await db.fetch_value(af.sql(f"SHOW {name}")) == value
        await db.execute(af.sql("SET statement_timeout = '1s'"))  # the session is reset after
        assert await db.fetch_value(af.sql("SHOW statement_timeout")) == "5s"


async def test_libpq_environment(
    server: str, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PGHOST, PGPORT, PGUSER, PGDATABASE, PGAPPNAME, PGOPTIONS,
    PGCONNECT_TIMEOUT fill in what the URL leaves out; the URL wins over
    them, keywords over the URL."""
    only(target, "postgresql")
    parsed = parse_url(server)
    environment = {
        "PGHOST": parsed.host or "localhost",
        "PGPORT": str(parsed.port or 5432),
        "PGUSER": parsed.username or "postgres",
        "PGDATABASE": parsed.database,
        "PGAPPNAME": "from-env",
        "PGOPTIONS": "-c statement_timeout=7s",
        "PGCONNECT_TIMEOUT": "4",
    }
    if parsed.password:
        monkeypatch.setenv("PGPASSWORD", parsed.password)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    async with af.connect("postgresql://", backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(APPLICATION_NAME) == "from-env"
        assert await db.fetch_value(af.sql("SHOW statement_timeout")) == "7s"
        assert db.options.connect_timeout == 4.0
        assert db.url.host == environment["PGHOST"]
    url = "postgresql:///?application_name=from-url"
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(APPLICATION_NAME) == "from-url"
    async with af.connect(url, backend=target.backend, application_name="from-keyword") as db:
        assert await db.fetch_value(APPLICATION_NAME) == "from-keyword"

    monkeypatch.setenv("PGSSLMODE", "sometimes")
    with pytest.raises(af.ValidationError, match=r"PGSSLMODE.*verify-full"):
        await af.connect("postgresql://", backend=target.backend)


async def test_password_from_the_environment(
    tls_server: TLSServer, target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """PGPASSWORD, else the password file (PGPASSFILE, read by asyncpg)."""
    only(target, "postgresql")
    assert isinstance(tls_server, TLSPostgresServer)
    url = f"postgresql://pwuser@127.0.0.1:{tls_server.port}/test"
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "none"))
    with pytest.raises(af.DatabaseError):
        await af.connect(url, backend=target.backend)

    monkeypatch.setenv("PGPASSWORD", tls_server.PASSWORD)
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(af.sql("SELECT current_user")) == "pwuser"
    monkeypatch.delenv("PGPASSWORD")

    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{tls_server.port}:test:pwuser:{tls_server.PASSWORD}\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    async with af.connect(url, backend=target.backend, pool_size=1) as db:
        assert await db.fetch_value(af.sql("SELECT current_user")) == "pwuser"
