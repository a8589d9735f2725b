"""Database URLs, connection options, and the errors ``af.connect`` gives for
bad ones (always :class:`af.ValidationError`, raised before anything is opened)."""

from __future__ import annotations

import socket
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest

import aiofragno as af
from aiofragno.backends import BACKENDS
from aiofragno.url import DatabaseURL, Options, parse_url

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
    fields, each optional and of the field's type: a new option goes in both."""
    assert get_type_hints(af.ConnectOptions) == get_type_hints(Options), (
        "add every Options field to ConnectOptions (aiofragno/url.py), with the same type"
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
        DEFAULTS.merged({"sslmode": "require"}, {})
    message = str(info.value)
    assert "'sslmode'" in message
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
