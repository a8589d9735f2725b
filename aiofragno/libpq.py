"""libpq's conventions for PostgreSQL connections: the ``PG*`` environment
variables, and the ``options`` string of settings for the session.

Each value is taken, as in libpq, from the first of: a keyword argument to
``af.connect``, the URL, the environment, aiofragno's default. An empty
variable counts as unset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from urllib.parse import urlencode

from .errors import ValidationError
from .url import DatabaseURL, Options, parse_url

# Environment variables that set options (PGPASSFILE, read when no password
# is known, and the other variables asyncpg reads are asyncpg's business).
OPTION_VARIABLES = {
    "PGSSLMODE": "sslmode",
    "PGSSLROOTCERT": "sslrootcert",
    "PGSSLCERT": "sslcert",
    "PGSSLKEY": "sslkey",
    "PGAPPNAME": "application_name",
    "PGOPTIONS": "options",
    "PGCONNECT_TIMEOUT": "connect_timeout",
}

# Settings aiofragno owns, which ``options`` and ``server_settings`` may not set.
_OWN_SETTINGS = {
    "timezone": "aiofragno runs every session in UTC, and reads and writes timestamps so",
    "client_encoding": "asyncpg speaks UTF8 only",
    "application_name": "set it with the application_name option",
}


def from_environment(url: DatabaseURL, environ: Mapping[str, str]) -> tuple[DatabaseURL, Options]:
    """``url`` with what it leaves out taken from ``PGHOST``, ``PGPORT``,
    ``PGUSER``, ``PGPASSWORD`` and ``PGDATABASE``; and the options that
    :data:`OPTION_VARIABLES` set (for the URL and keywords to override)."""
    env = {name: value for name, value in environ.items() if name.startswith("PG") and value}
    if url.host is None and "," in env.get("PGHOST", "") + env.get("PGPORT", ""):
        url = _listed_hosts(url, env)
    url = replace(
        url,
        host=url.host or _host(env),
        port=url.port or _port(env),
        username=url.username or env.get("PGUSER"),
        password=url.password if url.password is not None else env.get("PGPASSWORD"),
        database=url.database or env.get("PGDATABASE", ""),
    )
    options = Options()
    for variable, name in OPTION_VARIABLES.items():
        if variable in env:
            try:
                options = options.merged({name: env[variable]}, {})
            except ValidationError as exc:
                raise ValidationError(f"environment variable {variable}: {exc}") from None
    return url, options


def _listed_hosts(url: DatabaseURL, env: dict[str, str]) -> DatabaseURL:
    """``url`` with the servers that ``PGHOST`` and ``PGPORT`` list (libpq's
    comma-separated lists)."""
    given = {"host": env.get("PGHOST", "localhost"), "port": env.get("PGPORT", "")}
    try:
        listed = parse_url(f"postgresql:///?{urlencode(given)}")
    except ValidationError as exc:
        shown = ", ".join(f"PG{name.upper()}={value!r}" for name, value in given.items())
        raise ValidationError(f"environment variables {shown}: {exc}") from None
    return replace(url, host=listed.host, port=listed.port, hosts=listed.hosts)


def _host(env: dict[str, str]) -> str | None:
    return env.get("PGHOST")


def _port(env: dict[str, str]) -> int | None:
    text = env.get("PGPORT")
    if text is None:
        return None
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise ValidationError(
            f"environment variable PGPORT={text!r} is not a port number (1..65535)"
        )
    return int(text)


def server_settings(options: Options) -> dict[str, str]:
    """The settings a new session starts with: application_name, those of
    ``options.options`` and then of ``options.server_settings`` (a name in
    both: the latter's value), and aiofragno's own (TimeZone UTC, and the
    search_path option). :class:`ValidationError` for a setting aiofragno
    owns, or search_path given both ways."""
    settings = {"application_name": options.application_name}
    given = {**parse_options(options.options or ""), **(options.server_settings or {})}
    for name, value in given.items():
        reason = _OWN_SETTINGS.get(name.lower())
        if reason is None and name.lower() == "search_path" and options.search_path is not None:
            reason = "the search_path option sets it already"
        if reason is not None:
            raise ValidationError(f"the session setting {name} cannot be set: {reason}")
        settings[name] = value
    settings["TimeZone"] = "UTC"
    if options.search_path:
        settings["search_path"] = options.search_path
    return settings


# A word of an options string: backslash escapes the next character (a space, say).
_WORD = re.compile(r"(?:\\.|[^\s\\])+")


def parse_options(text: str) -> dict[str, str]:
    """The settings in libpq's ``options`` string: words separated by
    whitespace (``\\`` escapes the next character), each setting written
    ``-c name=value``, ``-cname=value`` or ``--name=value`` (a ``-`` in the
    name is read as ``_``, as the server does)."""
    words = [re.sub(r"\\(.)", r"\1", word) for word in _WORD.findall(text)]
    settings: dict[str, str] = {}
    position = 0
    while position < len(words):
        word = words[position]
        if word == "-c" and position + 1 < len(words):
            assignment, position = words[position + 1], position + 2
        elif word.startswith(("-c", "--")) and len(word) > 2:
            assignment, position = word[2:], position + 1
        else:
            assignment = ""
        name, equals, value = assignment.partition("=")
        if not (name and equals):
            raise ValidationError(
                f"options {text!r}: expected settings as '-c name=value' or '--name=value', "
                f"got {word!r}"
            )
        settings[name.replace("-", "_")] = value
    return settings
