"""The TLS a connection gets from its options (aiofragno.tls.configure):
libpq's rules on PostgreSQL, PyMySQL's where MySQL has its own; the context
it builds from real certificate files (tests/certificates.py). No server:
test_tls.py connects."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest

import aiofragno as af
from aiofragno import tls
from aiofragno.url import Options, parse_url
from tests.certificates import KEY_PASSWORD, Certificates, make_certificates

PG = "postgresql://postgres@db.example.com/test"
MY = "mysql://root@db.example.com/test"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed (apt-get install openssl)")
    return make_certificates(Path(openssl), tmp_path_factory.mktemp("tls") / "certificates")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home directory without ~/.postgresql (unless a test makes one)."""
    return tmp_path


def configure(
    url: str, home: Path, query: dict[str, str] | None = None, **keywords: Any
) -> tls.TLS:
    options = Options().merged(query or {}, keywords)
    return tls.configure(parse_url(url), options, home)


def checks(setup: tls.TLS) -> tuple[str, bool, bool]:
    """The mode, and whether the certificate and the host name are checked."""
    context = setup.context
    assert context is not None
    return setup.mode, context.verify_mode == ssl.CERT_REQUIRED, context.check_hostname


def test_postgresql_default_is_prefer(home: Path) -> None:
    assert checks(configure(PG, home)) == ("prefer", False, False)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"sslmode": "require"}, ("require", False, False)),
        ({"ssl": "true"}, ("require", False, False)),  # libpq's ssl=true
        ({"sslmode": "allow"}, ("allow", False, False)),
        ({"sslmode": "require", "sslrootcert": "CA"}, ("verify-ca", True, False)),  # libpq
        ({"sslmode": "verify-ca", "sslrootcert": "CA"}, ("verify-ca", True, False)),
        ({"sslmode": "verify-full", "sslrootcert": "CA"}, ("verify-full", True, True)),
        ({"sslmode": "prefer", "sslrootcert": "CA"}, ("prefer", False, False)),  # not checked
        ({"sslrootcert": "system"}, ("verify-full", True, True)),  # libpq 16
        ({"ssl_verify_cert": "true", "sslrootcert": "CA"}, ("verify-full", True, True)),
    ],
)
def test_postgresql_modes(
    home: Path, certificates: Certificates, query: dict[str, str], expected: tuple[str, bool, bool]
) -> None:
    query = {k: str(certificates.ca) if v == "CA" else v for k, v in query.items()}
    assert checks(configure(PG, home, query)) == expected


def test_disable_and_unix_sockets_have_no_tls(home: Path) -> None:
    assert configure(PG, home, {"sslmode": "disable"}) == tls.NONE
    assert configure(PG, home, {"ssl": "false"}) == tls.NONE
    assert configure("postgresql://%2Ftmp/test", home, {"sslmode": "verify-full"}) == tls.NONE
    assert configure("mysql://root@localhost/t?unix_socket=/tmp/m.sock", home, ssl=True) == tls.NONE


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, None),  # PyMySQL: no TLS unless asked
        ({"ssl": "true"}, ("require", False, False)),
        ({"ssl_ca": "CA"}, ("verify-full", True, True)),  # PyMySQL: a CA checks all
        ({"ssl_ca": "CA", "ssl_verify_identity": "false"}, ("verify-ca", True, False)),
        ({"ssl_ca": "CA", "ssl_verify_cert": "false"}, ("require", False, False)),
        ({"ssl_verify_cert": "true", "ssl_ca": "system"}, ("verify-full", True, True)),
        ({"ssl_mode": "REQUIRED"}, ("require", False, False)),
        ({"ssl_mode": "PREFERRED"}, ("prefer", False, False)),
        ({"ssl_mode": "REQUIRED", "ssl_ca": "CA"}, ("verify-ca", True, False)),
        ({"ssl_mode": "VERIFY_IDENTITY", "ssl_ca": "CA"}, ("verify-full", True, True)),
    ],
)
def test_mysql_modes(
    home: Path,
    certificates: Certificates,
    query: dict[str, str],
    expected: tuple[str, bool, bool] | None,
) -> None:
    query = {k: str(certificates.ca) if v == "CA" else v for k, v in query.items()}
    setup = configure(MY, home, query)
    assert (setup == tls.NONE) if expected is None else checks(setup) == expected


@pytest.mark.parametrize(
    ("url", "query", "says"),
    [
        (PG, {"sslmode": "verify-ca"}, "sslrootcert=system"),
        (PG, {"sslmode": "verify-full"}, "~/.postgresql/root.crt"),
        (MY, {"ssl_verify_cert": "true"}, "ssl_ca"),
        (MY, {"ssl_mode": "VERIFY_IDENTITY"}, "ssl_ca"),
        (PG, {"sslmode": "require", "sslrootcert": "system"}, "needs sslmode=verify-full"),
        (MY, {"sslmode": "allow"}, "use prefer or disable"),
        (PG, {"sslmode": "require", "ssl_verify_cert": "true"}, "give one"),
        (PG, {"sslmode": "prefer", "ssl": "true"}, "disagree"),
        (MY, {"ssl_mode": "REQUIRED", "ssl": "false"}, "disagree"),
        (MY, {"ssl": "false", "ssl_verify_cert": "true"}, "turns TLS off"),
        (MY, {"ssl_verify_identity": "true", "ssl_verify_cert": "false"}, "cannot be false"),
        (PG, {"sslmode": "require", "sslkey": "/k.pem"}, "without sslcert"),
    ],
)
def test_contradictions_are_refused(home: Path, url: str, query: dict[str, str], says: str) -> None:
    with pytest.raises(af.ValidationError, match=says):
        configure(url, home, query)


def test_libpq_default_files(home: Path, certificates: Certificates) -> None:
    """~/.postgresql/root.crt makes require verify-ca (and is what verify-*
    use); postgresql.crt and .key are the client certificate."""
    directory = home / ".postgresql"
    directory.mkdir()
    shutil.copy(certificates.ca, directory / "root.crt")
    assert checks(configure(PG, home, {"sslmode": "require"})) == ("verify-ca", True, False)
    assert checks(configure(PG, home, {"sslmode": "verify-full"})) == ("verify-full", True, True)
    assert configure(PG, home, {"sslmode": "require"}).cert is None
    shutil.copy(certificates.client_cert, directory / "postgresql.crt")
    shutil.copy(certificates.client_key, directory / "postgresql.key")
    setup = configure(PG, home)
    assert (setup.cert, setup.key) == (
        str(directory / "postgresql.crt"),
        str(directory / "postgresql.key"),
    )
    # Not MySQL's: PyMySQL has no default files.
    assert configure(MY, home) == tls.NONE


def test_client_certificates(home: Path, certificates: Certificates) -> None:
    files = {"sslcert": str(certificates.client_cert), "sslkey": str(certificates.client_key)}
    setup = configure(PG, home, {"sslmode": "require", **files})
    assert (setup.cert, setup.key, setup.password) == (files["sslcert"], files["sslkey"], None)
    locked = {**files, "sslkey": str(certificates.client_key_encrypted)}
    setup = configure(PG, home, {"sslmode": "require", **locked}, sslpassword=KEY_PASSWORD)
    assert setup.password == KEY_PASSWORD
    assert KEY_PASSWORD not in repr(setup)
    for password in (None, f"not-{KEY_PASSWORD}"):
        with pytest.raises(af.ValidationError) as info:
            configure(PG, home, {"sslmode": "require", **locked}, sslpassword=password)
        assert "sslpassword" in str(info.value)
        assert KEY_PASSWORD not in str(info.value)


@pytest.mark.parametrize("which", ["sslrootcert", "sslcert"])
@pytest.mark.parametrize("problem", ["missing", "not PEM", "a directory"])
def test_unusable_files_are_named(
    home: Path, certificates: Certificates, tmp_path: Path, which: str, problem: str
) -> None:
    path = tmp_path / "file.pem"
    if problem == "not PEM":
        path.write_text("not a certificate\n")
    elif problem == "a directory":
        path.mkdir()
    query = {"sslmode": "verify-full", "sslrootcert": str(certificates.ca), which: str(path)}
    with pytest.raises(af.ValidationError) as info:
        configure(PG, home, query)
    assert str(path) in str(info.value)
    assert which in str(info.value)


def test_an_ssl_context_is_used_as_given(home: Path, certificates: Certificates) -> None:
    context = ssl.create_default_context(cafile=str(certificates.ca))
    setup = configure(PG, home, ssl=context)
    assert (setup.mode, setup.context, setup.given_context) == ("require", context, True)
    assert configure(MY, home, {"ssl_mode": "VERIFY_IDENTITY"}, ssl=context).context is context
    unchecked = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    unchecked.check_hostname = False
    for keywords, says in [
        ({"ssl": context, "sslmode": "prefer"}, "TLS is required"),
        ({"ssl": unchecked, "sslmode": "verify-full"}, "check_hostname"),
    ]:
        with pytest.raises(af.ValidationError, match=says):
            configure(PG, home, **keywords)
    with pytest.raises(af.ValidationError, match="load the certificates into the context"):
        configure(PG, home, ssl=context, sslrootcert=str(certificates.ca))


def test_failures_are_classified(home: Path) -> None:
    required = configure(PG, home, {"sslmode": "require"})
    refusal = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] alert")
    wrapped = ConnectionError("cannot connect")
    wrapped.__cause__ = refusal
    error = tls.failure(wrapped, address="db:5432", tls=required)
    assert isinstance(error, af.TLSError)
    assert "db:5432" in str(error)
    assert "sslmode=require" in str(error)
    # A connection lost mid-handshake, or any failure when TLS was optional, is none.
    assert tls.failure(ssl.SSLEOFError(), address="db:5432", tls=required) is None
    assert tls.failure(wrapped, address="db:5432", tls=configure(PG, home)) is None
    assert tls.failure(OSError("refused"), address="db:5432", tls=required) is None
    no_tls = tls.failure(OSError("x"), address="db:5432", tls=required, offers_tls=False)
    assert no_tls is not None
    assert "does not offer TLS" in str(no_tls)
