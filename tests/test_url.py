"""Database URLs, connection options, and the errors ``af.connect`` gives for
bad ones (always :class:`af.ValidationError`, raised before anything is opened)."""

from __future__ import annotations

import importlib
import os
import socket
import ssl
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest

import aiofragno as af
from aiofragno.backends import BACKENDS
from aiofragno.engine import outbox_strategy
from aiofragno.libpq import from_environment, parse_options, server_settings
from aiofragno.resilience import is_retryable_loss
from aiofragno.url import ALIASES, SSL_MODES, DatabaseURL, Options, parse_url, redact_url

# --------------------------------------------------------------------------- parse_url: SQLite


@pytest.mark.parametrize(
    ("url", "database", "is_memory"),
    [
        ("sqlite:///app.db", "app.db", False),
        ("sqlite:///data/app.db", "data/app.db", False),
        ("sqlite:////var/db/app.db", "/var/db/app.db", False),
        ("sqlite:///:memory:", ":memory:", True),
        ("sqlite:///my%20app.db", "my app.db", False),
        ("sqlite:////tmp/caf%C3%A9.db", "/tmp/café.db", False),
    ],
)
def test_sqlite_paths(url: str, database: str, is_memory: bool) -> None:
    parsed = parse_url(url)
    assert parsed.dialect == "sqlite"
    assert parsed.backend is None
    assert parsed.database == database
    assert parsed.is_memory is is_memory
    assert parsed.host is None
    assert parsed.port is None
    assert parsed.username is None
    assert parsed.password is None


@pytest.mark.parametrize("backend", ["sqlite", "aiosqlite"])
def test_sqlite_backend_suffix(backend: str) -> None:
    parsed = parse_url(f"sqlite+{backend}:///app.db")
    assert (parsed.dialect, parsed.backend, parsed.database) == ("sqlite", backend, "app.db")


def test_sqlite_query_string_is_kept() -> None:
    parsed = parse_url("sqlite:///app.db?pool_size=3&busy_timeout=0.5")
    assert parsed.database == "app.db"
    assert parsed.query == {"pool_size": "3", "busy_timeout": "0.5"}


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://app.db",  # two slashes: "app.db" is a host
        "sqlite://localhost/app.db",
        "sqlite://:memory:",
        "sqlite://user@/app.db",
    ],
)
def test_sqlite_with_a_host_is_rejected(url: str) -> None:
    with pytest.raises(af.ValidationError) as info:
        parse_url(url)
    message = str(info.value)
    # The message shows the accepted forms.
    assert "sqlite:///" in message
    assert ":memory:" in message


def test_sqlite_describe_round_trips() -> None:
    for url in ("sqlite:///app.db", "sqlite:////var/db/app.db", "sqlite:///:memory:"):
        parsed = parse_url(url)
        assert parsed.describe() == url
        assert parse_url(parsed.describe()).database == parsed.database


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///?pool_size=1"])
def test_sqlite_without_a_path_is_refused(url: str) -> None:
    # It used to open a private in-memory database silently: a typo that
    # loses every write when the connection closes.
    with pytest.raises(af.ValidationError, match=r"sqlite:///:memory:"):
        parse_url(url)


# ------------------------------------------------------------------ parse_url: server dialects


@pytest.mark.parametrize(
    ("scheme", "dialect"),
    [
        ("postgresql", "postgresql"),
        ("postgres", "postgresql"),
        ("mysql", "mysql"),
        ("mariadb", "mysql"),
        ("PostgreSQL", "postgresql"),
        ("MARIADB", "mysql"),
    ],
)
def test_server_schemes(scheme: str, dialect: str) -> None:
    parsed = parse_url(f"{scheme}://alice:secret@db.example.com:6000/shop?pool_size=4")
    assert parsed == DatabaseURL(
        dialect,
        None,
        username="alice",
        password="secret",
        host="db.example.com",
        port=6000,
        database="shop",
        query={"pool_size": "4"},
    )


@pytest.mark.parametrize(
    ("url", "dialect", "backend"),
    [
        ("postgresql+asyncpg://h/db", "postgresql", "asyncpg"),
        ("postgres+asyncpg://h/db", "postgresql", "asyncpg"),
        ("mysql+asyncmy://h/db", "mysql", "asyncmy"),
        ("mariadb+asyncmy://h/db", "mysql", "asyncmy"),
        ("POSTGRESQL+ASYNCPG://h/db", "postgresql", "asyncpg"),
        # parse_url does not know backends; af.connect checks the name.
        ("postgresql+nosuch://h/db", "postgresql", "nosuch"),
    ],
)
def test_backend_suffix(url: str, dialect: str, backend: str) -> None:
    parsed = parse_url(url)
    assert (parsed.dialect, parsed.backend, parsed.host, parsed.database) == (
        dialect,
        backend,
        "h",
        "db",
    )


def test_percent_encoded_user_password_and_database() -> None:
    parsed = parse_url("postgresql://us%40er%3A1:p%40ss%3Aw%2Fo%23rd%25@host:5432/my%2Fdb%20x")
    assert parsed.username == "us@er:1"
    assert parsed.password == "p@ss:w/o#rd%"
    assert parsed.host == "host"
    assert parsed.port == 5432
    assert parsed.database == "my/db x"


def test_password_is_hidden() -> None:
    parsed = parse_url("postgresql://alice:hunter2@host/db")
    assert "hunter2" not in repr(parsed)
    assert "hunter2" not in parsed.describe()
    assert parsed.describe() == "postgresql://alice@host/db"


def test_empty_password_and_user_without_password() -> None:
    assert parse_url("mysql://root:@h/db").password == ""
    no_password = parse_url("mysql://root@h/db")
    assert no_password.username == "root"
    assert no_password.password is None


def test_missing_parts() -> None:
    parsed = parse_url("postgresql://")
    assert (parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
        None,
        None,
        None,
        None,
        "",
    )
    parsed = parse_url("postgresql:///db")
    assert (parsed.host, parsed.port, parsed.database) == (None, None, "db")
    # Missing port: the driver's default applies.
    parsed = parse_url("mysql://h/db")
    assert (parsed.host, parsed.port) == ("h", None)
    assert parse_url("mysql://h:/db").port is None


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("postgresql://u:p@[::1]:5433/db", "::1", 5433),
        ("postgresql://u@[::1]/db", "::1", None),
        ("mysql://[2001:db8::7]:3307/db", "2001:db8::7", 3307),
    ],
)
def test_ipv6_host(url: str, host: str, port: int | None) -> None:
    parsed = parse_url(url)
    assert parsed.host == host
    assert parsed.port == port
    assert parsed.database == "db"


@pytest.mark.parametrize(
    "url",
    ["postgresql://u:p@[::1]:5433/db", "mysql://[2001:db8::7]/db"],
)
def test_ipv6_describe_keeps_brackets(url: str) -> None:
    # describe() goes into error messages: "::1:5433" would read as host "::1:5433"
    # (or host "::1", port 5433?) and does not parse back.
    parsed = parse_url(url)
    described = parse_url(parsed.describe())
    assert (described.host, described.port) == (parsed.host, parsed.port)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h:abc/db",
        "postgresql://h:-1/db",
        "postgresql://h:70000/db",
        "mysql://h:3306x/db",
        # Port 0 cannot be connected to; the backends would silently use the
        # default port instead (``url.port or 5432``).
        "postgresql://h:0/db",
    ],
)
def test_bad_port(url: str) -> None:
    with pytest.raises(af.ValidationError, match="port"):
        parse_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://[::1/db",  # unclosed IPv6 bracket
        "mysql://u@[not-an-ip]/db",
    ],
)
def test_malformed_netloc_is_a_validation_error(url: str) -> None:
    # urllib raises a bare ValueError for these: it must not escape as such.
    with pytest.raises(af.Error) as info:
        parse_url(url)
    assert isinstance(info.value, af.ValidationError)
    assert url in str(info.value) or "URL" in str(info.value)


@pytest.mark.parametrize(
    "scheme",
    ["oracle", "mssql", "http", "sqlite3", "pg", "mongodb+srv", ""],
)
def test_unknown_scheme(scheme: str) -> None:
    with pytest.raises(af.ValidationError) as info:
        parse_url(f"{scheme}://h/db")
    message = str(info.value)
    assert "scheme" in message
    for known in ("postgresql", "mysql", "sqlite"):
        assert known in message


@pytest.mark.parametrize(
    "url",
    [
        "",
        "app.db",
        "localhost:5432/db",
        "postgresql:/db",
        "sqlite:app.db",
        "sqlite:/app.db",
        "/var/db/app.db",
        "host=localhost dbname=test",  # libpq keyword form
        None,
        b"sqlite:///app.db",
        42,
        Path("app.db"),
    ],
)
def test_non_urls(url: Any) -> None:
    with pytest.raises(af.ValidationError) as info:
        parse_url(url)
    # The message shows what a URL looks like.
    assert "sqlite:///" in str(info.value)


def test_query_values_are_percent_decoded() -> None:
    parsed = parse_url("postgresql://h/db?command_timeout=1.5&pre_ping=true&x=a%20b")
    assert parsed.query == {"command_timeout": "1.5", "pre_ping": "true", "x": "a b"}


# ------------------------------------------------------------------------ Options.merged

DEFAULTS = Options()


def test_defaults_are_valid() -> None:
    assert DEFAULTS.merged({}, {}) == DEFAULTS


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"pool_size": "3"}, {"pool_size": 3}),
        ({"pool_size": " 7 "}, {"pool_size": 7}),
        ({"acquire_timeout": "2.5"}, {"acquire_timeout": 2.5}),
        ({"acquire_timeout": "2"}, {"acquire_timeout": 2.0}),
        ({"connect_timeout": "1e-1"}, {"connect_timeout": 0.1}),
        ({"busy_timeout": "0.25"}, {"busy_timeout": 0.25}),
        ({"command_timeout": "4"}, {"command_timeout": 4.0}),
        ({"command_timeout": "none"}, {"command_timeout": None}),
        ({"command_timeout": "NULL"}, {"command_timeout": None}),
        ({"command_timeout": ""}, {"command_timeout": None}),
        ({"max_lifetime": "None"}, {"max_lifetime": None}),
        ({"max_idle": ""}, {"max_idle": None}),
        ({"max_idle": "30"}, {"max_idle": 30.0}),
        ({"pre_ping": "true"}, {"pre_ping": True}),
        ({"pre_ping": "TRUE"}, {"pre_ping": True}),
        ({"pre_ping": "1"}, {"pre_ping": True}),
        ({"pre_ping": "yes"}, {"pre_ping": True}),
        ({"pre_ping": "on"}, {"pre_ping": True}),
        ({"pre_ping": "false"}, {"pre_ping": False}),
        ({"pre_ping": "0"}, {"pre_ping": False}),
        ({"pre_ping": "No"}, {"pre_ping": False}),
        ({"pre_ping": "off"}, {"pre_ping": False}),
        ({"outbox": "true"}, {"outbox": True}),
        ({"outbox": "off"}, {"outbox": False}),
        ({"outbox": "ticks"}, {"outbox": "ticks"}),
        ({"outbox": "counter"}, {"outbox": "counter"}),
    ],
)
def test_query_string_coercion(query: dict[str, str], expected: dict[str, Any]) -> None:
    options = DEFAULTS.merged(query, {})
    for name, value in expected.items():
        got = getattr(options, name)
        assert got == value
        assert type(got) is type(value)
    untouched = {f.name for f in fields(Options)} - set(expected)
    for name in untouched:
        assert getattr(options, name) == getattr(DEFAULTS, name)


def test_connect_options_type_every_option() -> None:
    """af.connect's keyword arguments (ConnectOptions) are exactly the Options
    fields and their other spellings (ALIASES), each optional and of the
    field's type (a file option may be given as a path object): a new option
    goes in both."""
    from aiofragno.url import ALIASES, TLS_FILE_OPTIONS

    fields = get_type_hints(Options)
    keywords = get_type_hints(af.ConnectOptions)
    expected = {**fields, **{alias: fields[name] for alias, name in ALIASES.items()}}
    for name in keywords.keys() & expected.keys():
        if ALIASES.get(name, name) in TLS_FILE_OPTIONS and name not in (
            "sslpassword",
            "ssl_key_password",
        ):
            expected[name] = str | os.PathLike[str] | None
    assert keywords == expected, (
        "add every Options field (and alias) to ConnectOptions (aiofragno/url.py), with its type"
    )
    assert af.ConnectOptions.__required_keys__ == frozenset()


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [("sqlite_timestamps", "iso-text", "iso"), ("naive_datetimes", "utc", "UTC")],
)
def test_choice_options_take_their_literal_values(name: str, good: str, bad: str) -> None:
    """The Literal type of a choice option is what is checked at run time too,
    from the URL as from a keyword."""
    assert getattr(DEFAULTS.merged({name: good}, {}), name) == good
    assert getattr(DEFAULTS.merged({}, {name: good}), name) == good
    for query, overrides in (({name: bad}, {}), ({}, {name: bad})):
        with pytest.raises(af.ValidationError, match=f"{name} must be one of"):
            DEFAULTS.merged(query, overrides)


def test_merged_does_not_modify_the_original() -> None:
    base = Options()
    changed = base.merged({"pool_size": "2"}, {"max_idle": None})
    assert (changed.pool_size, changed.max_idle) == (2, None)
    assert (base.pool_size, base.max_idle) == (10, 600.0)


def test_keyword_overrides_win_over_the_query_string() -> None:
    options = DEFAULTS.merged(
        {"pool_size": "3", "acquire_timeout": "9", "pre_ping": "false", "max_idle": "5"},
        {"pool_size": 5, "pre_ping": True, "max_idle": None},
    )
    assert options.pool_size == 5
    assert options.pre_ping is True
    assert options.max_idle is None
    assert options.acquire_timeout == 9.0  # from the query, not overridden


def test_keyword_override_replaces_an_invalid_query_value_only_if_valid() -> None:
    # The query value is checked as text before overrides apply.
    with pytest.raises(af.ValidationError, match="pool_size"):
        DEFAULTS.merged({"pool_size": "lots"}, {"pool_size": 2})


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("pool_sise", "pool_size"),
        ("poolsize", "pool_size"),
        ("pool", "pool_size"),
        ("preping", "pre_ping"),
        ("max_idel", "max_idle"),
        ("max_life_time", "max_lifetime"),
        ("command_timout", "command_timeout"),
        ("aquire_timeout", "acquire_timeout"),
        ("busy_timout", "busy_timeout"),
    ],
)
@pytest.mark.parametrize("where", ["query", "keyword"])
def test_unknown_option_suggests(name: str, suggestion: str, where: str) -> None:
    query, overrides = ({name: "1"}, {}) if where == "query" else ({}, {name: 1})
    with pytest.raises(af.ValidationError) as info:
        DEFAULTS.merged(query, overrides)
    message = str(info.value)
    assert repr(name) in message
    assert f"did you mean {suggestion!r}" in message


def test_unknown_option_without_a_close_match_lists_the_known_ones() -> None:
    with pytest.raises(af.ValidationError) as info:
        DEFAULTS.merged({"frobnicate": "yes"}, {})
    message = str(info.value)
    assert "'frobnicate'" in message
    for spec in fields(Options):
        assert spec.name in message


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ({"pool_size": "0"}, "pool_size"),
        ({"pool_size": "-2"}, "pool_size"),
        ({"pool_size": "2.5"}, "pool_size"),
        ({"pool_size": "ten"}, "pool_size"),
        ({"pool_size": ""}, "pool_size"),
        ({"pool_size": "none"}, "pool_size"),
        ({"acquire_timeout": "0"}, "acquire_timeout"),
        ({"acquire_timeout": "-1"}, "acquire_timeout"),
        ({"acquire_timeout": "soon"}, "acquire_timeout"),
        ({"acquire_timeout": "nan"}, "acquire_timeout"),
        ({"acquire_timeout": ""}, "acquire_timeout"),
        ({"acquire_timeout": "none"}, "acquire_timeout"),
        ({"connect_timeout": "0.0"}, "connect_timeout"),
        ({"busy_timeout": "-0.5"}, "busy_timeout"),
        ({"command_timeout": "0"}, "command_timeout"),
        ({"command_timeout": "-3"}, "command_timeout"),
        ({"max_lifetime": "0"}, "max_lifetime"),
        ({"max_idle": "-1"}, "max_idle"),
        ({"max_idle": "forever"}, "max_idle"),
        ({"pre_ping": "maybe"}, "pre_ping"),
        ({"pre_ping": ""}, "pre_ping"),
        ({"pre_ping": "2"}, "pre_ping"),
        ({"outbox": "tick"}, "outbox"),
        ({"outbox": "Ticks"}, "outbox"),
        ({"outbox": ""}, "outbox"),
    ],
)
def test_invalid_query_values(query: dict[str, str], name: str) -> None:
    with pytest.raises(af.ValidationError, match=name):
        DEFAULTS.merged(query, {})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pool_size", 0),
        ("pool_size", -1),
        ("pool_size", True),
        ("pool_size", False),
        ("pool_size", 2.0),
        ("pool_size", "5"),
        ("pool_size", None),
        ("acquire_timeout", 0),
        ("acquire_timeout", -0.1),
        ("acquire_timeout", True),
        ("acquire_timeout", "5"),
        ("acquire_timeout", float("nan")),
        ("connect_timeout", 0.0),
        ("connect_timeout", False),
        ("command_timeout", 0),
        ("command_timeout", True),
        ("command_timeout", "1"),
        ("max_lifetime", -5),
        ("max_lifetime", True),
        ("max_idle", 0),
        ("max_idle", [1]),
        ("busy_timeout", 0),
        ("busy_timeout", True),
        ("pre_ping", 1),
        ("pre_ping", "yes"),
        ("pre_ping", None),
        ("outbox", "sealer"),
        ("outbox", None),
        ("outbox", 1),
    ],
)
def test_invalid_keyword_values(name: str, value: Any) -> None:
    with pytest.raises(af.ValidationError, match=name):
        DEFAULTS.merged({}, {name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("pool_size", 1),
        ("pool_size", 500),
        ("acquire_timeout", 1),
        ("acquire_timeout", 0.001),
        ("command_timeout", None),
        ("command_timeout", 2),
        ("max_lifetime", None),
        ("max_idle", None),
        ("pre_ping", True),
        ("busy_timeout", 0.01),
    ],
)
def test_valid_keyword_values(name: str, value: Any) -> None:
    assert getattr(DEFAULTS.merged({}, {name: value}), name) == value


NUMBER_OPTIONS = [
    spec.name for spec in fields(Options) if spec.type in ("float", "float | None", "int")
]


@pytest.mark.parametrize("name", NUMBER_OPTIONS)
def test_none_is_accepted_the_same_way_from_url_and_keyword(name: str) -> None:
    """An option takes the same values whichever way it is given: the URL's
    ``name=none`` and the keyword ``name=None`` must both work or both fail."""

    def outcome(query: dict[str, str], overrides: dict[str, Any]) -> str:
        try:
            DEFAULTS.merged(query, overrides)
        except af.ValidationError:
            return "rejected"
        return "accepted"

    assert outcome({name: "none"}, {}) == outcome({}, {name: None})


# ----------------------------------------------------------------- af.connect validation


@pytest.fixture
def anyio_backend() -> str:
    """Replaced by the runtimes tests/conftest.py parametrizes; defined here so
    that anyio's own (parametrized) fixture does not clash with that."""
    return "asyncio"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/url.db"


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.anyio
@pytest.mark.parametrize(
    "url",
    ["", "app.db", "oracle://h/db", "sqlite://host/app.db", "postgresql://h:port/db"],
)
async def test_connect_bad_url(url: str) -> None:
    with pytest.raises(af.ValidationError):
        await af.connect(url)
    with pytest.raises(af.ValidationError):
        async with af.connect(url):
            pytest.fail("opened a Database for a bad URL")


@pytest.mark.anyio
async def test_connect_unknown_option_in_keyword(sqlite_url: str) -> None:
    with pytest.raises(af.ValidationError, match="did you mean 'pool_size'"):
        await af.connect(sqlite_url, pool_sise=2)  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_connect_unknown_option_in_url(sqlite_url: str) -> None:
    with pytest.raises(af.ValidationError, match="did you mean 'max_idle'"):
        await af.connect(sqlite_url + "?max_idel=3")


@pytest.mark.anyio
async def test_connect_invalid_option_value(sqlite_url: str) -> None:
    with pytest.raises(af.ValidationError, match="pool_size"):
        await af.connect(sqlite_url, pool_size=0)
    with pytest.raises(af.ValidationError, match="acquire_timeout"):
        await af.connect(sqlite_url + "?acquire_timeout=-1")


@pytest.mark.anyio
async def test_connect_validates_options_before_connecting() -> None:
    # Nothing listens on this port: a ValidationError (not DatabaseUnavailable)
    # shows the options were checked first.
    url = f"postgresql://postgres@127.0.0.1:{_refused_port()}/test"
    with pytest.raises(af.ValidationError, match="pool_size"):
        await af.connect(url, pool_sise=3)  # type: ignore[call-arg]
    with pytest.raises(af.ValidationError, match="backend"):
        await af.connect(url, backend="nosuch")


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["keyword", "url"])
async def test_connect_unknown_backend(tmp_path: Path, where: str) -> None:
    if where == "keyword":
        opening = af.connect(f"sqlite:///{tmp_path}/x.db", backend="sqlite4")
    else:
        opening = af.connect(f"sqlite+sqlite4:///{tmp_path}/x.db")
    with pytest.raises(af.ValidationError) as info:
        await opening
    message = str(info.value)
    assert "'sqlite4'" in message
    for known in ("asyncpg", "aiosqlite", "sqlite", "asyncmy"):
        assert known in message  # lists the known backends


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("url", "backend", "speaks"),
    [
        ("sqlite:///{tmp}/x.db", "asyncpg", "postgresql"),
        ("sqlite:///{tmp}/x.db", "asyncmy", "mysql"),
        ("postgresql://127.0.0.1:{port}/db", "sqlite", "sqlite"),
        ("postgresql://127.0.0.1:{port}/db", "asyncmy", "mysql"),
        ("mysql://127.0.0.1:{port}/db", "asyncpg", "postgresql"),
        ("mysql://127.0.0.1:{port}/db", "aiosqlite", "sqlite"),
    ],
)
async def test_connect_backend_for_the_wrong_dialect(
    tmp_path: Path, url: str, backend: str, speaks: str
) -> None:
    url = url.format(tmp=tmp_path, port=_refused_port())
    dialect = parse_url(url).dialect
    with pytest.raises(af.ValidationError) as info:
        await af.connect(url, backend=backend)
    message = str(info.value)
    assert repr(backend) in message
    assert speaks in message
    assert dialect in message
    # Also when the backend is named in the URL.
    scheme, rest = url.split("://", 1)
    with pytest.raises(af.ValidationError, match=speaks):
        await af.connect(f"{scheme}+{backend}://{rest}")


@pytest.mark.anyio
async def test_connect_backend_for_the_wrong_runtime(tmp_path: Path, anyio_backend: str) -> None:
    url = f"sqlite:///{tmp_path}/x.db"
    for backend in BACKENDS.values():
        if backend.dialect != "sqlite":
            continue
        if anyio_backend in backend.runtimes:
            async with af.connect(url, backend=backend.name) as db:
                assert db.backend == backend.name
                assert await db.fetch_value(af.sql("SELECT 1")) == 1
        else:
            with pytest.raises(af.ValidationError, match=f"not {anyio_backend}") as info:
                await af.connect(url, backend=backend.name)
            assert repr(backend.name) in str(info.value)
    # Without a backend named, one that runs here is chosen.
    async with af.connect(url) as db:
        assert anyio_backend in BACKENDS[db.backend].runtimes


@pytest.mark.anyio
async def test_connect_url_options_reach_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/x.db?pool_size=3&pre_ping=yes&max_idle=none"
    async with af.connect(url, acquire_timeout=7) as db:
        assert db.options.pool_size == 3
        assert db.options.pre_ping is True
        assert db.options.max_idle is None
        assert db.options.acquire_timeout == 7.0
        assert db.url.database == f"{tmp_path}/x.db"


@pytest.mark.anyio
async def test_connect_busy_timeout_none(tmp_path: Path) -> None:
    """busy_timeout has no "off" value (the URL form ``busy_timeout=none`` is
    refused); ``busy_timeout=None`` must be refused up front too, not crash when
    the first connection opens (sqlite3.connect: "must be real number, not
    NoneType", reported as a DatabaseError)."""
    with pytest.raises(af.ValidationError, match="busy_timeout"):
        await af.connect(f"sqlite:///{tmp_path}/x.db", busy_timeout=None)  # type: ignore[arg-type]


# ------------------------------------------------------------------ Unix sockets


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("postgresql://%2Fvar%2Frun%2Fpostgresql/test", "/var/run/postgresql", None),
        ("postgresql://u@%2Ftmp%2FMixed%20Case:5433/test", "/tmp/Mixed Case", 5433),
        ("postgresql://u@%2ftmp/test", "/tmp", None),
        ("postgresql:///test?host=/var/run/postgresql", "/var/run/postgresql", None),
        ("postgresql://u@/test?host=%2Ftmp", "/tmp", None),
        ("postgresql://db.example.com/test?host=/tmp", "/tmp", None),  # as libpq: host= wins
        ("postgresql:///test?host=other.example.com", "other.example.com", None),
        ("mysql://root@%2Frun%2Fmysqld%2Fmysqld.sock/test", "/run/mysqld/mysqld.sock", None),
        (
            "mysql://root@localhost/test?unix_socket=/run/mysqld/mysqld.sock",
            "/run/mysqld/mysqld.sock",
            None,
        ),
        ("mariadb://root@/test?unix_socket=%2Ftmp%2Fm.sock", "/tmp/m.sock", None),
    ],
)
def test_unix_socket_hosts(url: str, host: str, port: int | None) -> None:
    parsed = parse_url(url)
    assert (parsed.host, parsed.port) == (host, port)
    assert parsed.unix_socket == (host if host.startswith("/") else None)
    assert "host" not in parsed.query
    assert "unix_socket" not in parsed.query
    again = parse_url(parsed.describe())  # (shown percent-encoded)
    assert (again.host, again.port, again.database) == (host, port, "test")


def test_tcp_hosts_are_no_sockets() -> None:
    for url in ("postgresql://db.example.com/x", "mysql://127.0.0.1/x", "postgresql://[::1]/x"):
        assert parse_url(url).unix_socket is None


def test_a_relative_unix_socket_is_refused() -> None:
    with pytest.raises(af.ValidationError, match="absolute path"):
        parse_url("mysql://root@localhost/test?unix_socket=mysqld.sock")


@pytest.mark.parametrize(
    "url", ["mysql://root@localhost/test?host=/tmp", "postgresql:///test?unix_socket=/tmp/s"]
)
def test_the_other_dialects_socket_parameter_is_unknown(url: str) -> None:
    parsed = parse_url(url)
    with pytest.raises(af.ValidationError, match="unknown connection option"):
        DEFAULTS.merged(parsed.query, {})


# ------------------------------------------------------------------ TLS and session options


@pytest.mark.parametrize("mode", SSL_MODES)
def test_libpq_ssl_modes(mode: str) -> None:
    assert DEFAULTS.merged({"sslmode": mode}, {}).sslmode == mode
    assert DEFAULTS.merged({}, {"sslmode": mode}).sslmode == mode


@pytest.mark.parametrize(
    ("spelling", "mode"),
    [
        ("DISABLED", "disable"),
        ("PREFERRED", "prefer"),
        ("REQUIRED", "require"),
        ("VERIFY_CA", "verify-ca"),
        ("VERIFY_IDENTITY", "verify-full"),
        ("verify_identity", "verify-full"),
    ],
)
def test_mysql_ssl_modes(spelling: str, mode: str) -> None:
    assert DEFAULTS.merged({"ssl_mode": spelling}, {}).sslmode == mode
    assert DEFAULTS.merged({"sslmode": spelling}, {}).sslmode == mode


@pytest.mark.parametrize("value", ["on", "Require", "verify_full", "strict", "none-of-these"])
def test_unknown_ssl_modes_name_the_choices(value: str) -> None:
    with pytest.raises(af.ValidationError) as info:
        DEFAULTS.merged({"sslmode": value}, {})
    message = str(info.value)
    assert repr(value) in message
    for choice in (*SSL_MODES, "VERIFY_IDENTITY"):
        assert choice in message


def test_pymysql_names_are_other_spellings() -> None:
    query = {
        "ssl_ca": "/ca.pem",
        "ssl_cert": "/c.pem",
        "ssl_key": "/k.pem",
        "ssl_key_password": "pw",
    }
    options = DEFAULTS.merged(query, {})
    assert (options.sslrootcert, options.sslcert, options.sslkey, options.sslpassword) == (
        "/ca.pem",
        "/c.pem",
        "/k.pem",
        "pw",
    )
    assert DEFAULTS.merged({}, {"ssl_ca": Path("/ca.pem")}).sslrootcert == "/ca.pem"
    for alias, name in ALIASES.items():
        with pytest.raises(af.ValidationError, match=f"{name} and {alias} are the same option"):
            DEFAULTS.merged({name: "require", alias: "disable"}, {})


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"ssl": "true"}, True),
        ({"ssl": "false"}, False),
        ({"ssl": "none"}, None),
        ({"ssl_verify_cert": "yes"}, None),
    ],
)
def test_ssl_from_the_url(query: dict[str, str], expected: bool | None) -> None:
    assert DEFAULTS.merged(query, {}).ssl is expected


def test_ssl_keyword_takes_an_ssl_context() -> None:
    context = ssl.create_default_context()
    assert DEFAULTS.merged({}, {"ssl": context}).ssl is context
    for wrong in ("yes", 1, {"ca": "x"}):
        with pytest.raises(af.ValidationError, match="ssl must be"):
            DEFAULTS.merged({}, {"ssl": wrong})


def test_a_source_saying_how_tls_is_used_replaces_what_lower_ones_said() -> None:
    """Like every option, the keyword wins; here its one subject is how TLS
    is used, however the URL spelled that (or the environment, under it)."""
    options = DEFAULTS.merged({"sslmode": "verify-full", "sslrootcert": "/ca.pem"}, {"ssl": True})
    assert (options.sslmode, options.ssl, options.sslrootcert) == (None, True, "/ca.pem")
    options = DEFAULTS.merged({"ssl": "true", "ssl_verify_cert": "1"}, {"sslmode": "disable"})
    assert (options.sslmode, options.ssl, options.ssl_verify_cert) == ("disable", None, None)
    context = ssl.create_default_context()
    options = DEFAULTS.merged({"sslrootcert": "/ca.pem", "sslcert": "/c.pem"}, {"ssl": context})
    assert (options.ssl, options.sslrootcert, options.sslcert) == (context, None, None)


def test_server_settings_are_a_keyword_only() -> None:
    assert DEFAULTS.merged({}, {"server_settings": {"work_mem": "8MB"}}).server_settings == {
        "work_mem": "8MB"
    }
    with pytest.raises(af.ValidationError, match="options=-c name=value"):
        DEFAULTS.merged({"server_settings": "work_mem=8MB"}, {})
    with pytest.raises(af.ValidationError, match="server_settings"):
        DEFAULTS.merged({}, {"server_settings": {"work_mem": 8}})


@pytest.mark.parametrize("charset", ["utf8mb4", "UTF8MB4"])
def test_charset_utf8mb4(charset: str) -> None:
    assert DEFAULTS.merged({"charset": charset}, {}).charset == charset


@pytest.mark.parametrize("charset", ["utf8", "latin1", "utf8mb3", ""])
def test_other_charsets_are_refused(charset: str) -> None:
    with pytest.raises(af.ValidationError) as info:
        DEFAULTS.merged({"charset": charset}, {})
    assert "utf8mb4" in str(info.value)
    assert repr(charset) in str(info.value)


@pytest.mark.parametrize(
    ("dialect", "name", "value"),
    [
        ("sqlite", "sslmode", "require"),
        ("sqlite", "sslrootcert", "/ca.pem"),
        ("sqlite", "ssl", True),
        ("sqlite", "application_name", "x"),
        ("mysql", "options", "-c work_mem=8MB"),
        ("mysql", "server_settings", {"work_mem": "8MB"}),
        ("postgresql", "charset", "UTF8MB4"),
        ("sqlite", "charset", "UTF8MB4"),
    ],
)
def test_options_for_another_dialect_are_refused(dialect: str, name: str, value: Any) -> None:
    options = DEFAULTS.merged({}, {name: value})
    with pytest.raises(af.ValidationError, match=f"{name} is an option for .*not {dialect}"):
        options.check_dialect(dialect)


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_defaults_suit_every_dialect(dialect: str) -> None:
    DEFAULTS.check_dialect(dialect)


SECRET = "Zt8-secret-key-password"


def test_sslpassword_is_never_shown() -> None:
    options = DEFAULTS.merged({"sslpassword": SECRET}, {})
    assert SECRET not in repr(options)
    url = f"postgresql://u:pw@h:x/db?sslmode=require&sslpassword={SECRET}&ssl_key_password={SECRET}"
    assert SECRET not in redact_url(url)
    assert "sslmode=require" in redact_url(url)
    with pytest.raises(af.ValidationError) as info:
        parse_url(url)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(parse_url(f"postgresql://h/db?sslpassword={SECRET}"))
    with pytest.raises(af.ValidationError) as info:
        DEFAULTS.merged({}, {"sslpassword": SECRET.encode()})
    assert SECRET not in str(info.value)
    assert "bytes" in str(info.value)


# ------------------------------------------------------------------ libpq: options string


@pytest.mark.parametrize(
    ("text", "settings"),
    [
        ("", {}),
        ("-c statement_timeout=5s", {"statement_timeout": "5s"}),
        ("-cwork_mem=8MB  --lock-timeout=2s", {"work_mem": "8MB", "lock_timeout": "2s"}),
        ("-c search_path=a,\\ b", {"search_path": "a, b"}),
        ("-c x.y=1 -c x.y=2", {"x.y": "2"}),
        ("-c geqo=", {"geqo": ""}),
    ],
)
def test_libpq_options_string(text: str, settings: dict[str, str]) -> None:
    assert parse_options(text) == settings


@pytest.mark.parametrize("text", ["-c", "statement_timeout=5s", "-c foo", "--=1", "-B 100", "-d 5"])
def test_bad_libpq_options_strings(text: str) -> None:
    with pytest.raises(af.ValidationError, match="-c name=value"):
        parse_options(text)


def test_session_settings() -> None:
    options = DEFAULTS.merged(
        {"options": "-c statement_timeout=5s -c lock_timeout=1s", "application_name": "app"},
        {"server_settings": {"lock_timeout": "2s"}, "search_path": "tenant"},
    )
    assert server_settings(options) == {
        "application_name": "app",
        "statement_timeout": "5s",
        "lock_timeout": "2s",
        "TimeZone": "UTC",
        "search_path": "tenant",
    }
    assert server_settings(DEFAULTS) == {"application_name": "aiofragno", "TimeZone": "UTC"}


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"options": "-c TimeZone=Europe/Paris"}, "UTC"),
        ({"server_settings": {"timezone": "UTC"}}, "UTC"),
        ({"options": "-c application_name=x"}, "application_name option"),
        ({"options": "-c client_encoding=LATIN1"}, "UTF8"),
        ({"options": "-c search_path=a", "search_path": "b"}, "search_path option"),
    ],
)
def test_settings_aiofragno_owns_are_refused(given: dict[str, Any], why: str) -> None:
    with pytest.raises(af.ValidationError, match=why):
        server_settings(DEFAULTS.merged({}, given))


# ------------------------------------------------------------------ libpq: environment


def test_environment_fills_what_the_url_leaves_out() -> None:
    environ = {
        "PGHOST": "/var/run/postgresql",
        "PGPORT": "5433",
        "PGUSER": "alice",
        "PGPASSWORD": SECRET,
        "PGDATABASE": "shop",
        "PGSSLMODE": "verify-full",
        "PGSSLROOTCERT": "/ca.pem",
        "PGSSLCERT": "/c.pem",
        "PGSSLKEY": "/k.pem",
        "PGAPPNAME": "billing",
        "PGOPTIONS": "-c work_mem=8MB",
        "PGCONNECT_TIMEOUT": "4",
        "HOME": "/nowhere",
    }
    url, options = from_environment(parse_url("postgresql://"), environ)
    assert (url.host, url.port, url.username, url.password, url.database) == (
        "/var/run/postgresql",
        5433,
        "alice",
        SECRET,
        "shop",
    )
    assert (options.sslmode, options.sslrootcert, options.sslcert, options.sslkey) == (
        "verify-full",
        "/ca.pem",
        "/c.pem",
        "/k.pem",
    )
    assert (options.application_name, options.options, options.connect_timeout) == (
        "billing",
        "-c work_mem=8MB",
        4.0,
    )
    # The URL wins, part by part (an empty password is a password)...
    url, _ = from_environment(parse_url("postgresql://bob:@db.example.com/crm"), environ)
    assert (url.host, url.port, url.username, url.password, url.database) == (
        "db.example.com",
        5433,
        "bob",
        "",
        "crm",
    )
    # ... and its options over the environment's, keywords over both.
    merged = options.merged({"ssl": "true", "application_name": "url"}, {"application_name": "kw"})
    assert (merged.sslmode, merged.ssl, merged.application_name) == (None, True, "kw")


def test_empty_variables_count_as_unset() -> None:
    url, options = from_environment(parse_url("postgresql://"), {"PGHOST": "", "PGSSLMODE": ""})
    assert url.host is None
    assert options == DEFAULTS


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("PGSSLMODE", "sometimes", "verify-full"),
        ("PGPORT", "54x", "port"),
        ("PGPORT", "70000", "port"),
        ("PGHOST", "db1,,db2", "empty host"),
        ("PGCONNECT_TIMEOUT", "0", "positive"),
        ("PGOPTIONS", "-B 10", "-c name=value"),
    ],
)
def test_bad_environment_variables_are_named(variable: str, value: str, says: str) -> None:
    with pytest.raises(af.ValidationError) as info:
        _, options = from_environment(parse_url("postgresql://"), {variable: value})
        server_settings(options)
    assert says in str(info.value)
    if variable != "PGOPTIONS":  # (checked when the settings are built)
        assert variable in str(info.value)


def test_tls_errors_are_not_retried() -> None:
    error = af.TLSError("the certificate failed verification")
    assert isinstance(error, af.DatabaseError)
    assert not isinstance(error, af.DatabaseUnavailable | af.ConnectionLost)
    assert not is_retryable_loss(error)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("scheme", "query", "says"),
    [
        ("postgresql", "sslmode=sometimes", "sslmode"),
        (
            "postgresql",
            "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "/nonexistent/ca.pem",
        ),
        ("postgresql", "sslmode=verify-ca", "sslrootcert"),
        ("postgresql", "options=-B%2010", "-c name=value"),
        ("postgresql", "charset=latin1", "utf8mb4"),
        ("mysql", "charset=latin1", "utf8mb4"),
        ("mysql", "ssl_mode=REQUIRED&ssl=false", "disagree"),
        ("mysql", "sslmode=allow", "MySQL has no sslmode 'allow'"),
        ("mysql", "ssl_verify_identity=true&ssl_verify_cert=false", "ssl_verify_cert"),
    ],
)
async def test_connect_checks_tls_and_session_options_before_connecting(
    scheme: str, query: str, says: str
) -> None:
    url = f"{scheme}://root@127.0.0.1:{_refused_port()}/test?{query}"
    with pytest.raises(af.ValidationError) as info:
        await af.connect(url)
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("postgresql://u%00x:pw@127.0.0.1/db", {}),
        ("postgresql://u:p%00w@127.0.0.1/db", {}),
        ("postgresql://u@127.0.0.1/d%00b", {}),
        ("mysql://root@%2Frun%2Fmy%00sql.sock/test", {}),
        ("postgresql://u@127.0.0.1/db?application_name=a%00b", {}),
        ("postgresql://u@127.0.0.1/db?options=-c%20search_path%3Da%00", {}),
        ("mysql://root@127.0.0.1/test", {"application_name": "a\x00b"}),
        ("postgresql://u@127.0.0.1/db", {"server_settings": {"search_path": "a\x00"}}),
        ("postgresql://u@127.0.0.1/db", {"sslpassword": "se\x00cret"}),
        ("sqlite:///x%00.db", {}),
    ],
)
def test_a_nul_character_is_refused_before_connecting(url: str, options: dict[str, Any]) -> None:
    """A NUL ends a string in the servers' protocols: the server would see
    another name than the one written, or refuse the startup packet with an
    error that reads like an outage. Refused up front, nothing shown."""
    with pytest.raises(af.ValidationError, match="NUL") as caught:
        parsed = parse_url(url)
        Options().merged(parsed.query, options)
    assert "se\x00cret" not in str(caught.value) and "p%00w" not in str(caught.value)


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_outbox_ticks_are_refused_where_the_dialect_has_none(dialect: str) -> None:
    """outbox="ticks" is PostgreSQL's; elsewhere a ValidationError (raised by
    af.connect before it connects), naming what to use instead."""
    module = importlib.import_module(f"aiofragno.dialects.{dialect}")
    adapter = getattr(module, "ADAPTER", None) or module._BASE
    with pytest.raises(af.ValidationError, match='outbox="ticks" needs PostgreSQL'):
        outbox_strategy("ticks", adapter, dialect)
    assert outbox_strategy(True, adapter, dialect) == "counter"
    assert outbox_strategy("counter", adapter, dialect) == "counter"
    assert outbox_strategy(False, adapter, dialect) is None


def test_outbox_true_is_ticks_on_postgresql() -> None:
    from aiofragno.dialects.postgresql import ADAPTER

    assert outbox_strategy(True, ADAPTER, "postgresql") == "ticks"
    assert outbox_strategy("counter", ADAPTER, "postgresql") == "counter"


@pytest.mark.anyio
async def test_connect_refuses_outbox_ticks_on_sqlite() -> None:
    with pytest.raises(af.ValidationError, match='outbox="ticks" needs PostgreSQL'):
        await af.connect("sqlite:///:memory:", outbox="ticks")
