"""TLS, for real: a private PostgreSQL and MariaDB with TLS
(tests/servers.py ``tls_server``; a certificate for "localhost" only, from
tests/certificates.py), and the shared servers, which have none.

Each check looks at the connection the server sees (pg_stat_ssl, MySQL's
``Ssl_cipher``), not at what aiofragno says it did. A TLS failure is an
``af.TLSError`` at once: not retried, not a ``DatabaseUnavailable``.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

import pytest

import aiofragno as af
from tests.certificates import CLIENT_USER, KEY_PASSWORD
from tests.conftest import Target
from tests.servers import TLSServer

pytestmark = pytest.mark.anyio

# What "at once" means: one connection attempt, not the 30 s reconnect_deadline.
FAST = 3.0


def server_url(server: TLSServer, host: str, *, user: str | None = None, **params: Any) -> str:
    scheme, _, rest = server.url.partition("://")
    default_user = rest.partition("@")[0]
    query = f"?{urlencode(params)}" if params else ""
    return f"{scheme}://{user or default_user}@{host}:{server.port}/test{query}"


def causes(error: BaseException) -> Iterator[BaseException]:
    cause = error.__cause__
    while cause is not None:
        yield cause
        cause = cause.__cause__


async def encrypted(db: af.Database) -> bool:
    """Whether the server sees this session's connection encrypted."""
    if db.name == "postgresql":
        sql = af.sql("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        return bool(await db.fetch_value(sql))
    row = await db.fetch_one(af.sql("SHOW SESSION STATUS LIKE 'Ssl_cipher'"))
    assert row is not None
    return bool(row["Value"])


async def connects(url: str, target: Target, **options: Any) -> bool:
    """Connect, and say whether the connection is encrypted."""
    async with af.connect(url, backend=target.backend, pool_size=1, **options) as db:
        return await encrypted(db)


async def refused(url: str, target: Target, **options: Any) -> af.TLSError:
    """The TLSError connecting raises, at once."""
    started = time.monotonic()
    with pytest.raises(af.TLSError) as info:
        await af.connect(url, backend=target.backend, pool_size=1, **options)
    assert time.monotonic() - started < FAST
    error = info.value
    assert not isinstance(error, af.DatabaseUnavailable | af.ConnectionLost)
    return error


async def test_verify_full_checks_the_host_name(tls_server: TLSServer, target: Target) -> None:
    ca = str(tls_server.certificates.ca)
    # libpq's names on PostgreSQL; PyMySQL's on MySQL, where a CA alone
    # means verify-full.
    verify = {"sslmode": "verify-full", "sslrootcert": ca}
    if target.dialect == "mysql":
        verify = {"ssl_ca": ca}
    assert await connects(server_url(tls_server, "localhost", **verify), target)

    error = await refused(server_url(tls_server, "127.0.0.1", **verify), target)
    message = str(error)
    assert f"127.0.0.1:{tls_server.port}" in message
    assert "verify-ca" in message  # what to do next
    assert any(isinstance(cause, ssl.SSLCertVerificationError) for cause in causes(error))


async def test_verify_ca_accepts_any_host_name(tls_server: TLSServer, target: Target) -> None:
    ca = str(tls_server.certificates.ca)
    assert await connects(
        server_url(tls_server, "127.0.0.1", sslmode="verify-ca", sslrootcert=ca), target
    )
    if target.dialect == "mysql":
        pymysql = {"ssl_ca": ca, "ssl_verify_identity": "false"}
        assert await connects(server_url(tls_server, "127.0.0.1", **pymysql), target)
        mysql = {"ssl_mode": "VERIFY_CA", "ssl_ca": ca}
        assert await connects(server_url(tls_server, "127.0.0.1", **mysql), target)


async def test_a_certificate_from_another_ca_is_refused(
    tls_server: TLSServer, target: Target
) -> None:
    other = str(tls_server.certificates.other_ca)
    # "require" with a root certificate verifies it, as libpq does.
    for mode in ("verify-ca", "require"):
        url = server_url(tls_server, "localhost", sslmode=mode, sslrootcert=other)
        error = await refused(url, target)
        assert "sslrootcert" in str(error)
        assert "sslmode=verify-ca" in str(error)


async def test_require_prefer_allow_and_disable(tls_server: TLSServer, target: Target) -> None:
    """require encrypts without checking the certificate (any host name);
    prefer encrypts where the server can; allow and disable do not (allow
    tries without TLS first, and this server takes that)."""
    host = "127.0.0.1"
    assert await connects(server_url(tls_server, host, sslmode="require"), target)
    assert await connects(server_url(tls_server, host, sslmode="prefer"), target)
    assert not await connects(server_url(tls_server, host, sslmode="disable"), target)
    if target.dialect == "postgresql":
        assert not await connects(server_url(tls_server, host, sslmode="allow"), target)
        # libpq's JDBC-compatible ssl=true; the default is prefer.
        assert await connects(server_url(tls_server, host, ssl="true"), target)
        assert await connects(server_url(tls_server, host), target)
    else:
        assert await connects(server_url(tls_server, host, ssl_mode="REQUIRED"), target)
        assert await connects(server_url(tls_server, host, ssl="true"), target)
        assert not await connects(server_url(tls_server, host), target)  # PyMySQL's default


async def test_a_server_without_tls(url: str, target: Target) -> None:
    """The shared server has no TLS: a required TLS fails at once, saying
    so; prefer falls back to a plain connection."""
    if target.dialect == "sqlite":
        pytest.skip("SQLite is embedded: no connection to encrypt")
    join = "&" if "?" in url else "?"
    if await connects(f"{url}{join}sslmode=prefer", target):
        pytest.skip("the shared server has TLS")
    for params in ("sslmode=require", "ssl=true", "sslmode=verify-full&sslrootcert=system"):
        error = await refused(f"{url}{join}{params}", target)
        assert "does not offer TLS" in str(error)
        assert "sslmode=prefer" in str(error)
    assert not await connects(url, target, ssl=False)


async def test_an_ssl_context(tls_server: TLSServer, target: Target) -> None:
    context = ssl.create_default_context(cafile=str(tls_server.certificates.ca))
    assert await connects(server_url(tls_server, "localhost"), target, ssl=context)
    error = await refused(server_url(tls_server, "127.0.0.1"), target, ssl=context)
    assert "the given ssl.SSLContext" in str(error)
    # A keyword wins over the URL, the context over the URL's sslmode.
    plain = server_url(tls_server, "127.0.0.1", sslmode="disable")
    assert await connects(plain, target, ssl=True)
    assert not await connects(server_url(tls_server, "127.0.0.1"), target, ssl=False)


async def test_client_certificates(tls_server: TLSServer, target: Target) -> None:
    """certuser must present a certificate (PostgreSQL: hostssl ... cert,
    MariaDB: REQUIRE X509); an encrypted key with its sslpassword."""
    files = tls_server.certificates
    verify = {"sslmode": "verify-full", "sslrootcert": str(files.ca)}
    url = server_url(tls_server, "localhost", user=CLIENT_USER, **verify)
    client = {"sslcert": str(files.client_cert), "sslkey": str(files.client_key)}
    async with af.connect(url, backend=target.backend, pool_size=1, **client) as db:
        assert await encrypted(db)
        who = "SELECT current_user" + ("()" if target.dialect == "mysql" else "")
        assert str(await db.fetch_value(af.sql(who))).partition("@")[0] == CLIENT_USER

    locked = {"ssl_cert": str(files.client_cert), "ssl_key": str(files.client_key_encrypted)}
    url_with_password = f"{url}&{urlencode({**locked, 'ssl_key_password': KEY_PASSWORD})}"
    assert await connects(url_with_password, target)

    with pytest.raises(af.ValidationError) as info:
        await af.connect(f"{url}&{urlencode(locked)}&sslpassword=wrong-{KEY_PASSWORD}")
    assert "sslpassword" in str(info.value)
    assert KEY_PASSWORD not in str(info.value)

    started = time.monotonic()
    with pytest.raises(af.DatabaseError) as refusal:  # the server refuses who has none
        await af.connect(url, backend=target.backend, pool_size=1)
    assert not isinstance(refusal.value, af.DatabaseUnavailable | af.ConnectionLost)
    assert time.monotonic() - started < FAST


async def test_no_tls_over_a_unix_socket(tls_server: TLSServer, target: Target) -> None:
    """As in libpq and the MySQL client, sslmode does not apply to a Unix socket."""
    socket = str(tls_server.directory if target.dialect == "postgresql" else tls_server.socket)
    url = server_url(tls_server, quote(socket, safe=""), sslmode="require")
    assert not await connects(url, target)


async def test_a_later_connection_fails_at_once_too(tls_server: TLSServer, target: Target) -> None:
    """The pool's next connection, not only af.connect's first: a TLS
    failure is not waited out like an unreachable server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    url = server_url(tls_server, "localhost")
    async with af.connect(url, backend=target.backend, pool_size=2, ssl=context) as db:
        assert db.options.reconnect_deadline == 30.0
        held = await db._engine.acquire()
        try:
            context.verify_mode = ssl.CERT_REQUIRED  # and no CA loaded: nothing verifies
            started = time.monotonic()
            with pytest.raises(af.TLSError, match=r"the given ssl\.SSLContext"):
                await db._engine.acquire()
            assert time.monotonic() - started < FAST
        finally:
            await db._engine.release(held)
