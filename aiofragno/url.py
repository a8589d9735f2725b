"""Database URLs and connection options.

``scheme[+backend]://user:password@host:port/database?option=value``. Schemes:
``postgresql`` (``postgres``), ``mysql`` (``mariadb``), ``sqlite``. For SQLite
the path follows the third slash: ``sqlite:///app.db`` is relative,
``sqlite:////var/db/app.db`` absolute, ``sqlite:///:memory:`` in memory.
Query parameters set the options of :class:`Options`; keyword arguments to
``af.connect`` (typed by :class:`ConnectOptions`) override them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypedDict, get_args
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from .errors import ValidationError
from .naming import NamingStrategy

_SCHEMES = {
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
    "sqlite": "sqlite",
}


@dataclass(frozen=True, slots=True)
class DatabaseURL:
    """A parsed URL. ``dialect`` is "postgresql", "mysql" or "sqlite";
    ``backend`` the driver named after ``+`` in the scheme, if any."""

    dialect: str
    backend: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    database: str = ""
    query: dict[str, str] = field(default_factory=dict)

    @property
    def is_memory(self) -> bool:
        return self.dialect == "sqlite" and self.database == ":memory:"

    def describe(self) -> str:
        """The URL without its password, for messages."""
        if self.dialect == "sqlite":
            return f"sqlite:///{self.database}"
        user = f"{self.username}@" if self.username else ""
        port = f":{self.port}" if self.port else ""
        host = self.host or "localhost"
        if ":" in host:
            host = f"[{host}]"  # IPv6
        return f"{self.dialect}://{user}{host}{port}/{self.database}"


_EXAMPLES = "e.g. 'sqlite:///app.db', 'postgresql://user@host/db' or 'mysql://user:pw@host/db'"
_ENCODE_HINT = (
    "percent-encode ':', '/', '?', '#', '@' and '%' in a user name or password, "
    "e.g. with urllib.parse.quote(password, safe='')"
)


def parse_url(url: str) -> DatabaseURL:
    """``url`` parsed, or :class:`ValidationError`. No message this raises
    contains the URL's password, in any form: a malformed URL is shown with
    its userinfo redacted (see :func:`redact_url`), and urllib's own
    complaints, which quote the text they choke on, are replaced, not chained."""
    if not isinstance(url, str) or "://" not in url:
        what = "a str without '://'" if isinstance(url, str) else type(url).__name__
        raise ValidationError(f"bad database URL ({what}): expected {_EXAMPLES}")
    try:
        return _parse(url)
    except ValidationError:
        raise
    except ValueError:  # urllib's: a bad IPv6 host, an NFKC-unsafe netloc
        pass
    # Raised here, outside the except block, so that urllib's exception (whose
    # text may hold the password) is not even kept as __context__.
    raise ValidationError(
        f"bad host in database URL {redact_url(url)!r} (an IPv6 address goes in brackets: "
        f"postgresql://user@[::1]:5432/db); {_ENCODE_HINT}"
    )


def redact_url(url: str) -> str:
    """``url`` as error messages may show it: everything between the first
    ``:`` of the userinfo and the *last* ``@`` becomes ``***`` (so an
    unencoded ``/``, ``?``, ``#`` or ``@`` in a password cannot move part of
    it out of the redaction); without any ``@``, a non-numeric "port" is
    hidden as well (``user:password`` with the host forgotten), and so is a
    ``#fragment``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    rest, hash_, _ = rest.partition("#")
    fragment = "#***" if hash_ else ""
    userinfo, at, hostpart = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        shown = f"{user}:***@{hostpart}" if colon else f"{userinfo}@{hostpart}"
    else:
        end = next((i for i, ch in enumerate(rest) if ch in "/?"), len(rest))
        host, colon, port = rest[:end].rpartition(":")
        shown = rest if not colon or port.isdigit() or "]" in port else f"{host}:***"
    return f"{scheme}{sep}{shown}{fragment}"


def _parse(url: str) -> DatabaseURL:
    parts = urlsplit(url)
    scheme, _, backend = parts.scheme.partition("+")
    dialect = _SCHEMES.get(scheme.lower())
    if dialect is None:
        raise ValidationError(
            f"unknown database URL scheme {scheme!r}; use one of: postgresql, mysql, sqlite"
        )
    if "#" in url or "@" in parts.path + parts.query:
        raise ValidationError(
            f"bad database URL {redact_url(url)!r}: a '#', or an '@' after the host, is "
            f"not part of a database URL; {_ENCODE_HINT}"
        )
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if dialect == "sqlite":
        return _sqlite(url, parts, backend, query)
    port = _port(parts)
    if port is not None and not 1 <= port <= 65535:
        raise ValidationError(
            f"bad port in database URL {redact_url(url)!r}: expected a number in 1..65535 "
            f"after the host; {_ENCODE_HINT}"
        )
    return DatabaseURL(
        dialect,
        backend or None,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        host=parts.hostname,
        port=port,
        database=unquote(parts.path.lstrip("/")),
        query=query,
    )


def _port(parts: SplitResult) -> int | None:
    """The port, or -1 when it is not a valid number (urllib's ValueError
    quotes the text, which may be part of a password)."""
    try:
        return parts.port
    except ValueError:
        return -1


def _sqlite(url: str, parts: SplitResult, backend: str, query: dict[str, str]) -> DatabaseURL:
    forms = "sqlite:///relative/path.db, sqlite:////absolute/path.db or sqlite:///:memory:"
    if parts.netloc:
        raise ValidationError(f"bad SQLite URL {redact_url(url)!r}: write {forms}")
    database = unquote(parts.path[1:])
    if not database:
        # An empty path would open a private in-memory database, which
        # vanishes with its connection: say so explicitly if that is meant.
        raise ValidationError(
            f"SQLite URL {url!r} names no database file: write {forms} "
            "(an in-memory database must be asked for as sqlite:///:memory:)"
        )
    return DatabaseURL("sqlite", backend or None, database=database, query=query)


NamingName = Literal["suffix", "schema"]
SqliteTimestamps = Literal["epoch-ms", "iso-text"]
NaiveDatetimes = Literal["reject", "utc"]


@dataclass(frozen=True, slots=True)
class Options:
    """Connection options (all also accepted as URL query parameters).

    Times are in seconds. ``None`` disables a limit.
    """

    pool_size: int = 10
    """Most connections open at once (SQLite ``:memory:``: always 1)."""
    acquire_timeout: float = 30.0
    """How long to wait for a free connection before :class:`PoolTimeout`."""
    connect_timeout: float = 10.0
    """How long opening one connection may take."""
    command_timeout: float | None = None
    """Per-statement limit (PostgreSQL, MySQL), None for none."""
    outbox: bool = False
    """Write an outbox entry with every unit of work that changes data."""
    reconnect_deadline: float | None = 30.0
    """While the server cannot be reached, how long new work waits (retrying
    with backoff) before :class:`DatabaseUnavailable`; None: do not wait."""
    pre_ping: bool = False
    """Check an idle connection with a round trip before handing it out."""
    max_lifetime: float | None = 3600.0
    """Replace connections older than this."""
    max_idle: float | None = 600.0
    """Replace connections idle longer than this."""
    busy_timeout: float = 5.0
    """SQLite: how long to wait for another process's write lock."""
    sqlite_timestamps: SqliteTimestamps = "epoch-ms"
    """SQLite storage of timestamp columns: "epoch-ms" (integer milliseconds;
    sub-millisecond values are refused) or "iso-text" (microseconds kept)."""
    naming: NamingName | NamingStrategy | None = None
    """Where schemas' tables live: "suffix", "schema", your own
    :class:`~aiofragno.naming.NamingStrategy`, or None for the dialect's default."""
    search_path: str | None = None
    """PostgreSQL: the session's search_path (where unqualified tables,
    aiofragno's own included, are created and found)."""
    naive_datetimes: NaiveDatetimes = "reject"
    """Timestamps without a time zone: "reject" (ValidationError) or "utc"
    (taken as UTC)."""

    def merged(self, query: Mapping[str, str], overrides: Mapping[str, object]) -> Options:
        """These options updated from URL ``query`` strings, then ``overrides``."""
        values: dict[str, Any] = {}
        for name, text in query.items():
            values[_option_name(name)] = _parse_option(name, text)
        for name, value in overrides.items():
            values[_option_name(name)] = value
        options = replace(self, **values)
        options._validate()
        return options

    def _validate(self) -> None:
        if (
            not isinstance(self.pool_size, int)
            or isinstance(self.pool_size, bool)
            or self.pool_size < 1
        ):
            raise ValidationError(f"pool_size must be a positive int, got {self.pool_size!r}")
        for spec in fields(self):
            value = getattr(self, spec.name)
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if not spec.type.startswith("float") or (value is None and spec.type.endswith("None")):
                continue
            if not (is_number and value > 0):
                raise ValidationError(f"{spec.name} must be a positive number, got {value!r}")
        _check_choice("sqlite_timestamps", self.sqlite_timestamps, get_args(SqliteTimestamps))
        _check_choice("naive_datetimes", self.naive_datetimes, get_args(NaiveDatetimes))
        for flag in ("pre_ping", "outbox"):
            if not isinstance(getattr(self, flag), bool):
                raise ValidationError(f"{flag} must be a bool, got {getattr(self, flag)!r}")


class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of ``af.connect``: every field of :class:`Options`,
    each optional and of the field's type (see there for what each means), so
    that a type checker catches a misspelt option or a value of the wrong type."""

    pool_size: int
    acquire_timeout: float
    connect_timeout: float
    command_timeout: float | None
    outbox: bool
    reconnect_deadline: float | None
    pre_ping: bool
    max_lifetime: float | None
    max_idle: float | None
    busy_timeout: float
    sqlite_timestamps: SqliteTimestamps
    naming: NamingName | NamingStrategy | None
    search_path: str | None
    naive_datetimes: NaiveDatetimes


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValidationError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


_OPTION_TYPES = {spec.name: spec.type for spec in fields(Options)}


def _option_name(name: str) -> str:
    if name in _OPTION_TYPES:
        return name
    close = difflib.get_close_matches(name, _OPTION_TYPES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(_OPTION_TYPES)}"
    raise ValidationError(f"unknown connection option {name!r}{hint}")


def _parse_option(name: str, text: str) -> Any:
    kind = _OPTION_TYPES[_option_name(name)]
    if kind.endswith("| None") and text.lower() in ("none", "null", ""):
        return None
    try:
        if kind == "bool":
            if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        if kind == "int":
            return int(text)
        if kind.startswith("float"):
            return float(text)
        return text  # a str, or one of a Literal's strings (checked by _validate)
    except ValueError:
        raise ValidationError(f"connection option {name}={text!r} is not a valid {kind}") from None
