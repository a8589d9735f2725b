"""Database URLs and connection options.

``scheme[+backend]://user:password@host:port/database?option=value``. Schemes:
``postgresql`` (``postgres``), ``mysql`` (``mariadb``), ``sqlite``. For SQLite
the path follows the third slash: ``sqlite:///app.db`` is relative,
``sqlite:////var/db/app.db`` absolute, ``sqlite:///:memory:`` in memory.
A server's Unix socket takes the host's place, percent-encoded
(``postgresql://%2Fvar%2Frun%2Fpostgresql/db``: PostgreSQL's socket
directory, ``mysql://root@%2Frun%2Fmysqld%2Fmysqld.sock/db``: MySQL's socket
file), or is given as libpq's ``host=`` / PyMySQL's ``unix_socket=`` query
parameter. Other query parameters set the options of :class:`Options`;
keyword arguments to ``af.connect`` (typed by :class:`ConnectOptions`)
override them. docs/connecting.md has the whole story.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from ssl import SSLContext
from typing import Any, Literal, TypedDict, get_args
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

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
    # (Not in the repr: it may hold sslpassword.)
    query: dict[str, str] = field(default_factory=dict, repr=False)
    hosts: tuple[HostPort, ...] = ()
    """Every server of a URL that names several (libpq's
    ``host1:port1,host2:port2`` or ``host=h1,h2&port=p1,p2``; PostgreSQL
    and MySQL), in order, a port None for the default; empty for a URL of
    one server, whose host and port are ``host`` and ``port`` (the first of
    ``hosts`` otherwise)."""

    @property
    def is_memory(self) -> bool:
        return self.dialect == "sqlite" and self.database == ":memory:"

    @property
    def unix_socket(self) -> str | None:
        """The host when it is a path: PostgreSQL's socket directory, MySQL's
        socket file."""
        return self.host if self.host is not None and self.host.startswith("/") else None

    @property
    def servers(self) -> tuple[HostPort, ...]:
        """Every server the URL names, in order (one for a single host)."""
        return self.hosts or ((self.host or "localhost", self.port),)

    def describe(self) -> str:
        """The URL without its password, for messages."""
        if self.dialect == "sqlite":
            return f"sqlite:///{self.database}"
        user = f"{self.username}@" if self.username else ""
        hosts = ",".join(describe_host(host, port) for host, port in self.servers)
        return f"{self.dialect}://{user}{hosts}/{self.database}"


# A server's host name (or socket directory) and port (None: the default).
HostPort = tuple[str, int | None]


def describe_host(host: str, port: int | None) -> str:
    """``host:port`` as a URL writes it (a socket's path percent-encoded,
    an IPv6 address in brackets)."""
    shown = quote(host, safe="") if host.startswith("/") else f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port else shown


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
    return _SECRET_PARAMETERS.sub(r"\1***", f"{scheme}{sep}{shown}{fragment}")


# Query parameters whose values are secrets (an encrypted client key's password).
_SECRET_PARAMETERS = re.compile(r"([?&](?:sslpassword|ssl_key_password|password)=)[^&]*", re.I)


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
    hosts = _host_list(url, dialect, parts, query)
    if hosts:
        return _several(url, dialect, backend, parts, query, hosts)
    port = _port(parts)
    if port is not None and not 1 <= port <= 65535:
        raise ValidationError(
            f"bad port in database URL {redact_url(url)!r}: expected a number in 1..65535 "
            f"after the host; {_ENCODE_HINT}"
        )
    parsed = DatabaseURL(
        dialect,
        backend or None,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        host=_socket_parameter(dialect, query) or _host(parts),
        port=port,
        database=unquote(parts.path.lstrip("/")),
        query=query,
    )
    _refuse_nul(url, parsed.username, parsed.password, parsed.host, parsed.database, *query)
    return parsed


def _host_list(
    url: str, dialect: str, parts: SplitResult, query: dict[str, str]
) -> tuple[HostPort, ...]:
    """The servers of a URL that names several (libpq's syntax, for
    PostgreSQL and MySQL alike: a comma between ``host:port`` pairs, or
    ``host=`` and ``port=`` lists in the query, which override the URL's),
    taken out of ``query``; empty for a URL of one server."""
    hostport = parts.netloc.rpartition("@")[2]
    listed = "," in hostport or "," in query.get("host", "") or "," in query.get("port", "")
    if not listed:
        return ()
    pairs = [_host_port(url, text) for text in hostport.split(",")] if hostport else []
    names = query.pop("host", "")
    if names:
        pairs = [(unquote(name), None) for name in names.split(",")]
    ports = query.pop("port", "")
    if ports:
        numbers = [_port_number(url, text) for text in ports.split(",")]
        if len(numbers) not in (1, len(pairs) or 1):
            raise ValidationError(
                f"database URL {redact_url(url)!r} names {len(pairs)} hosts and "
                f"{len(numbers)} ports: give one port for all, or one per host"
            )
        pairs = pairs or [("localhost", None)] * len(numbers)
        pairs = [(host, numbers[min(i, len(numbers) - 1)]) for i, (host, _) in enumerate(pairs)]
    if any(not host for host, _ in pairs):
        raise ValidationError(f"database URL {redact_url(url)!r} has an empty host in its list")
    return tuple(pairs)


def _host_port(url: str, text: str) -> HostPort:
    """One ``host[:port]`` of a host list (``[v6]:port``, a percent-encoded
    socket directory)."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValidationError(
                f"bad host in database URL {redact_url(url)!r} (an IPv6 address goes in "
                "brackets: [::1]:5432)"
            )
        port = rest[1:]
    else:
        host, _, port = text.partition(":")
        host = unquote(host)
    return host, _port_number(url, port) if port else None


def _port_number(url: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValidationError(
            f"bad port in database URL {redact_url(url)!r}: expected a number in 1..65535 "
            f"after each host; {_ENCODE_HINT}"
        )
    return int(text)


def _several(
    url: str,
    dialect: str,
    backend: str,
    parts: SplitResult,
    query: dict[str, str],
    hosts: tuple[HostPort, ...],
) -> DatabaseURL:
    """A URL naming several servers (see :func:`_host_list`)."""
    userinfo, at, _ = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    parsed = DatabaseURL(
        dialect,
        backend or None,
        username=unquote(user) if at and user else None,
        password=unquote(password) if colon else None,
        host=hosts[0][0],
        port=hosts[0][1],
        database=unquote(parts.path.lstrip("/")),
        query=query,
        hosts=hosts if len(hosts) > 1 else (),
    )
    _refuse_nul(url, parsed.username, parsed.password, parsed.database, *query)
    _refuse_nul(url, *(host for host, _ in hosts))
    return parsed


def _refuse_nul(url: str, *texts: str | None) -> None:
    # A NUL ends a string in the servers' protocols (and in C): the server
    # would get another name than the one written, or refuse the packet.
    if any("\x00" in text for text in texts if text):
        raise ValidationError(
            f"database URL {redact_url(url)!r} holds a NUL character (%00): no server "
            "accepts one in a name, password or parameter"
        )


def _host(parts: SplitResult) -> str | None:
    """The host; percent-decoded, and its case kept, when it is written
    percent-encoded (a Unix socket's path: urllib's ``hostname`` would
    lowercase it and leave it encoded)."""
    hostport = parts.netloc.rpartition("@")[2]
    if "%" not in hostport or hostport.startswith("["):
        return parts.hostname
    return unquote(hostport.rpartition(":")[0] if ":" in hostport else hostport)


# The query parameter that names the host (libpq: a host name or the socket
# directory) or the socket (PyMySQL's unix_socket: the socket file).
_SOCKET_PARAMETERS = {"postgresql": "host", "mysql": "unix_socket"}


def _socket_parameter(dialect: str, query: dict[str, str]) -> str | None:
    """The host the query names (taken out of ``query``): it overrides the
    URL's host, as in libpq."""
    name = _SOCKET_PARAMETERS[dialect]
    value = query.pop(name, "")
    if dialect == "mysql" and value and not value.startswith("/"):
        raise ValidationError(
            f"unix_socket must be the absolute path of the server's socket file, got {value!r}"
        )
    return value or None


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
    _refuse_nul(url, database, *query)
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
OutboxStrategy = Literal["counter", "ticks"]
SessionAttrs = Literal["any", "read-write", "primary", "standby", "prefer-standby", "read-only"]
LoadBalance = Literal["disable", "random"]


@dataclass(frozen=True, slots=True)
class Options:
    """Connection options (all also accepted as URL query parameters, except
    an ``ssl`` SSLContext and ``server_settings``, which are keywords only).

    Times are in seconds. ``None`` disables a limit. On PostgreSQL, libpq's
    ``PG*`` environment variables set some of them (see docs/connecting.md):
    keyword over URL over environment over the default.
    """

    pool_size: int = 10
    """Most connections open at once (SQLite ``:memory:``: always 1)."""
    acquire_timeout: float = 30.0
    """How long to wait for a free connection before :class:`PoolTimeout`."""
    connect_timeout: float = 10.0
    """How long opening one connection may take (``PGCONNECT_TIMEOUT``)."""
    command_timeout: float | None = None
    """Per-statement limit (PostgreSQL, MySQL), None for none."""
    outbox: bool | OutboxStrategy = False
    """Write an outbox entry with every unit of work that changes data. True
    uses the dialect's default strategy; or name one (docs/outbox.md):
    "counter" (every dialect: the version is reserved from one counter row
    just before COMMIT, known at commit) or "ticks" (PostgreSQL: entries
    are versioned shortly after they commit, by whoever reads the outbox,
    so writers share no row and commits group)."""
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
    sslmode: str | None = None
    """PostgreSQL, MySQL: TLS, as libpq's sslmode: "disable", "allow" (not
    MySQL), "prefer", "require", "verify-ca" or "verify-full"; MySQL's
    spellings (``ssl_mode=REQUIRED``: DISABLED, PREFERRED, REQUIRED,
    VERIFY_CA, VERIFY_IDENTITY) mean the same. "require" with a root
    certificate (sslrootcert) is "verify-ca", as in libpq. None: PostgreSQL
    "prefer" (``PGSSLMODE``); MySQL no TLS unless ``ssl`` or an ``ssl_*``
    option asks for it (PyMySQL's rules)."""
    sslrootcert: str | None = None
    """The CA certificates (a PEM file) the server's certificate must chain
    to, or "system" for the system's trusted CAs (then sslmode defaults to
    "verify-full"). Also spelled ``ssl_ca``; ``PGSSLROOTCERT``; PostgreSQL
    default: ``~/.postgresql/root.crt`` if it exists."""
    sslcert: str | None = None
    """A client certificate to present (PEM file). Also spelled
    ``ssl_cert``; ``PGSSLCERT``; PostgreSQL default:
    ``~/.postgresql/postgresql.crt`` if it exists."""
    sslkey: str | None = None
    """The client certificate's private key (PEM file; None: in sslcert's
    file). Also spelled ``ssl_key``; ``PGSSLKEY``; PostgreSQL default:
    ``~/.postgresql/postgresql.key`` if it exists."""
    sslpassword: str | None = field(default=None, repr=False)
    """The password of an encrypted sslkey. Also spelled ``ssl_key_password``.
    Never shown in messages."""
    ssl_verify_cert: bool | None = None
    """PyMySQL's way to ask for "verify-ca" (true) or against it (false); by
    default true when sslrootcert (ssl_ca) is given."""
    ssl_verify_identity: bool | None = None
    """PyMySQL's way to ask for "verify-full" (true) or against it (false); by
    default true when the certificate is verified against a given ssl_ca."""
    ssl: bool | SSLContext | None = None
    """True: TLS required (libpq's ``ssl=true`` is sslmode "require"; on
    MySQL PyMySQL's ``ssl``, verified as ssl_ca and ssl_verify_* say).
    False: no TLS. An :class:`ssl.SSLContext` (keyword only): TLS required,
    with that context as given (its verify_mode and check_hostname decide
    what is checked)."""
    application_name: str = "aiofragno"
    """PostgreSQL: the session's application_name (pg_stat_activity;
    ``PGAPPNAME``). MySQL: the ``program_name`` connection attribute."""
    options: str | None = None
    """PostgreSQL: libpq's options string, settings for the session as
    ``-c name=value`` or ``--name=value`` (``PGOPTIONS``), e.g.
    ``-c statement_timeout=5s``."""
    server_settings: Mapping[str, str] | None = None
    """PostgreSQL (keyword only): settings for the session, as asyncpg's
    server_settings; they win over the same ones in ``options``."""
    target_session_attrs: SessionAttrs | None = None
    """Which server of the URL's hosts to use, as libpq: "read-write"
    (accepts writes), "primary" (not in recovery; MySQL: not replicating),
    "standby" (MySQL: a replica), "prefer-standby" (a standby if one
    answers, else any), "read-only" or "any". None: "read-write" when the
    URL names several hosts, else "any". docs/connecting.md, "Several hosts"."""
    load_balance_hosts: LoadBalance = "disable"
    """"random" tries the hosts in a random order (the last good one still
    first); "disable" in the URL's order."""
    tcp_user_timeout: float | None = 15.0
    """PostgreSQL and MySQL over TCP: how long sent data may stay unacknowledged
    before the connection counts as lost (Linux ``TCP_USER_TIMEOUT``; in
    seconds, not libpq's milliseconds). None: the system's (minutes)."""
    keepalives_idle: float | None = 5.0
    """PostgreSQL and MySQL over TCP: seconds of silence before TCP keepalive probes
    (then one a second, five unanswered ones end the connection), so an
    idle connection to a vanished host is noticed. None: no keepalives."""
    charset: str = "utf8mb4"
    """MySQL: the connection's character set. aiofragno writes text as
    utf8mb4 and runs ``SET NAMES utf8mb4``, so "utf8mb4" is the only one
    accepted (for URLs that spell it out)."""

    def merged(self, query: Mapping[str, str], overrides: Mapping[str, object]) -> Options:
        """These options updated from URL ``query`` strings, then ``overrides``.

        A source that says how TLS is used (sslmode, ssl, ssl_verify_*)
        replaces all that the sources under it said about that; an SSLContext
        also replaces their certificate files."""
        options = self
        for source in (
            {name: _parse_option(name, text) for name, text in query.items()},
            overrides,
        ):
            options = replace(options, **_values(source))
        options._validate()
        return options

    def check_dialect(self, dialect: str) -> None:
        """Refuse an option set for a dialect that has no use for it."""
        for name, dialects in _DIALECT_OPTIONS.items():
            if dialect not in dialects and getattr(self, name) != getattr(_DEFAULTS, name):
                raise ValidationError(
                    f"{name} is an option for {' and '.join(dialects)}, not {dialect}"
                )

    def _validate(self) -> None:
        if (
            not isinstance(self.pool_size, int)
            or isinstance(self.pool_size, bool)
            or self.pool_size < 1
        ):
            raise ValidationError(f"pool_size must be a positive int, got {self.pool_size!r}")
        for spec in fields(self):
            value = getattr(self, spec.name)
            _check_type(spec.name, str(spec.type), value)
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if not spec.type.startswith("float") or (value is None and spec.type.endswith("None")):
                continue
            if not (is_number and value > 0):
                raise ValidationError(f"{spec.name} must be a positive number, got {value!r}")
        _check_choice("sqlite_timestamps", self.sqlite_timestamps, get_args(SqliteTimestamps))
        _check_choice("naive_datetimes", self.naive_datetimes, get_args(NaiveDatetimes))
        if self.target_session_attrs is not None:
            _check_choice("target_session_attrs", self.target_session_attrs, get_args(SessionAttrs))
        _check_choice("load_balance_hosts", self.load_balance_hosts, get_args(LoadBalance))
        for name in ("tcp_user_timeout", "keepalives_idle"):
            seconds = getattr(self, name)
            if seconds is not None and seconds > 3600:
                raise ValidationError(
                    f"{name}={seconds!r} is more than an hour: aiofragno takes seconds "
                    "(libpq's tcp_user_timeout is in milliseconds: divide by 1000)"
                )
        if not isinstance(self.pre_ping, bool):
            raise ValidationError(f"pre_ping must be a bool, got {self.pre_ping!r}")
        if not isinstance(self.outbox, bool) and self.outbox not in get_args(OutboxStrategy):
            raise ValidationError(
                f"outbox must be a bool or one of {', '.join(get_args(OutboxStrategy))}; "
                f"got {self.outbox!r}"
            )
        if not isinstance(self.ssl, bool | SSLContext | None):
            raise ValidationError(
                f"ssl must be True, False or an ssl.SSLContext, got {type(self.ssl).__name__}"
            )
        if self.server_settings is not None and not (
            isinstance(self.server_settings, Mapping)
            and all(
                isinstance(k, str) and isinstance(v, str) and "\x00" not in k + v
                for k, v in self.server_settings.items()
            )
        ):
            raise ValidationError(
                "server_settings must map setting names to str values (without NUL), "
                f"got {self.server_settings!r}"
            )
        if self.charset.lower() != "utf8mb4":
            raise ValidationError(
                f"charset {self.charset!r} is not supported: aiofragno writes text as utf8mb4 "
                "and sets the connection to utf8mb4 (SET NAMES utf8mb4); leave charset out "
                "or write charset=utf8mb4"
            )


_DEFAULTS = Options()
_OPTION_TYPES = {spec.name: spec.type for spec in fields(Options)}

# Other spellings of options: MySQL's and PyMySQL's names for libpq's.
ALIASES = {
    "ssl_mode": "sslmode",
    "ssl_ca": "sslrootcert",
    "ssl_cert": "sslcert",
    "ssl_key": "sslkey",
    "ssl_key_password": "sslpassword",
}
TLS_MODE_OPTIONS = ("sslmode", "ssl", "ssl_verify_cert", "ssl_verify_identity")
TLS_FILE_OPTIONS = ("sslrootcert", "sslcert", "sslkey", "sslpassword")
_SERVERS = ("postgresql", "mysql")
# The dialects each connection option means something to (of those not
# older than this list: those apply wherever they are given).
_DIALECT_OPTIONS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys((*TLS_MODE_OPTIONS, *TLS_FILE_OPTIONS, "application_name"), _SERVERS),
    "options": ("postgresql",),
    "server_settings": ("postgresql",),
    **dict.fromkeys(("target_session_attrs", "load_balance_hosts"), _SERVERS),
    **dict.fromkeys(("tcp_user_timeout", "keepalives_idle"), _SERVERS),
    "charset": ("mysql",),
}

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_MYSQL_SSL_MODES = {
    "DISABLED": "disable",
    "PREFERRED": "prefer",
    "REQUIRED": "require",
    "VERIFY_CA": "verify-ca",
    "VERIFY_IDENTITY": "verify-full",
}


def _values(source: Mapping[str, object]) -> dict[str, Any]:
    """``source``'s options by their field names, with the TLS options it
    replaces (see :meth:`Options.merged`) reset to their defaults."""
    values: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, value in source.items():
        canonical = _option_name(name)
        if canonical in spelled:
            raise ValidationError(
                f"{spelled[canonical]} and {name} are the same option; give one of them"
            )
        spelled[canonical] = name
        values[canonical] = _coerce(canonical, value)
    replaced = [*TLS_MODE_OPTIONS] if values.keys() & set(TLS_MODE_OPTIONS) else []
    if isinstance(values.get("ssl"), SSLContext):
        replaced += TLS_FILE_OPTIONS
    for name in replaced:
        values.setdefault(name, getattr(_DEFAULTS, name))
    return values


def _coerce(name: str, value: Any) -> Any:
    """``value`` in the form the option keeps: libpq's spelling of an sslmode,
    a file's path as a str."""
    if name == "sslmode" and isinstance(value, str):
        mode = _MYSQL_SSL_MODES.get(value.upper(), value)
        if mode not in SSL_MODES:
            raise ValidationError(
                f"sslmode must be one of {', '.join(SSL_MODES)} (or MySQL's "
                f"{', '.join(_MYSQL_SSL_MODES)}); got {value!r}"
            )
        return mode
    if name in TLS_FILE_OPTIONS and name != "sslpassword" and isinstance(value, os.PathLike):
        return os.fspath(value)
    if name == "server_settings" and isinstance(value, Mapping):
        return dict(value)
    return value


def _check_type(name: str, kind: str, value: object) -> None:
    """Options typed plain str / bool hold one (or None where allowed); no
    text holds a NUL (see :func:`_refuse_nul`)."""
    if isinstance(value, str) and "\x00" in value:
        raise ValidationError(f"{name} holds a NUL character, which no server accepts")
    if value is None and kind.endswith("| None"):
        return
    expected = {"str": str, "str | None": str, "bool | None": bool}.get(kind)
    if expected is not None and not isinstance(value, expected):
        shown = type(value).__name__ if name == "sslpassword" else repr(value)
        raise ValidationError(f"{name} must be a {expected.__name__}, got {shown}")


class ConnectOptions(TypedDict, total=False):
    """The keyword arguments of ``af.connect``: every field of :class:`Options`,
    each optional and of the field's type (see there for what each means),
    and the other spellings in :data:`ALIASES`, so that a type checker
    catches a misspelt option or a value of the wrong type."""

    pool_size: int
    acquire_timeout: float
    connect_timeout: float
    command_timeout: float | None
    outbox: bool | OutboxStrategy
    reconnect_deadline: float | None
    pre_ping: bool
    max_lifetime: float | None
    max_idle: float | None
    busy_timeout: float
    sqlite_timestamps: SqliteTimestamps
    naming: NamingName | NamingStrategy | None
    search_path: str | None
    naive_datetimes: NaiveDatetimes
    sslmode: str | None
    sslrootcert: str | os.PathLike[str] | None
    sslcert: str | os.PathLike[str] | None
    sslkey: str | os.PathLike[str] | None
    sslpassword: str | None
    ssl_verify_cert: bool | None
    ssl_verify_identity: bool | None
    ssl: bool | SSLContext | None
    application_name: str
    options: str | None
    server_settings: Mapping[str, str] | None
    target_session_attrs: SessionAttrs | None
    load_balance_hosts: LoadBalance
    tcp_user_timeout: float | None
    keepalives_idle: float | None
    charset: str
    # ALIASES: MySQL's and PyMySQL's spellings.
    ssl_mode: str | None
    ssl_ca: str | os.PathLike[str] | None
    ssl_cert: str | os.PathLike[str] | None
    ssl_key: str | os.PathLike[str] | None
    ssl_key_password: str | None


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValidationError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _option_name(name: str) -> str:
    if name in _OPTION_TYPES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    known = [*_OPTION_TYPES, *ALIASES]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(known)}"
    raise ValidationError(f"unknown connection option {name!r}{hint}")


def _parse_option(name: str, text: str) -> Any:
    kind = _OPTION_TYPES[_option_name(name)]
    if kind.startswith("Mapping"):
        raise ValidationError(
            f"{name} cannot be given in a URL: pass it to af.connect as a keyword "
            "(settings go in a URL as options=-c name=value)"
        )
    if kind.endswith("| None") and text.lower() in ("none", "null", ""):
        return None
    try:
        if kind == "bool | OutboxStrategy" and text in get_args(OutboxStrategy):
            return text
        if kind.startswith("bool"):
            if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes", "on")
        if kind == "int":
            return int(text)
        if kind.startswith("float"):
            return float(text)
        return text  # a str, or one of a Literal's strings (checked by _validate)
    except ValueError:
        shown = "***" if _option_name(name) == "sslpassword" else repr(text)
        raise ValidationError(f"connection option {name}={shown} is not a valid {kind}") from None
