"""No message built from a database URL shows its password: not for a URL so
malformed that urllib itself chokes on it (whose own messages quote the
text), not in the exception chain, not in ``repr(db)``, not on the command
line's stderr."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import aiofragno as af
from aiofragno.url import parse_url, redact_url
from tests.conftest import POSTGRES_URL, TARGETS, require_target

# Every piece between the characters a URL parser splits at is distinctive,
# so that finding any piece of it anywhere is finding (part of) the password.
PASSWORDS = [
    "Qx7v/Wk9z",  # an unencoded '/': ends the netloc early
    "Qx7v#Wk9z",  # '#': starts a fragment
    "Qx7v?Wk9z",  # '?': starts the query
    "Qx7v@Wk9z",  # '@': the last one ends the userinfo
    "Qx7v:Wk9z",  # ':' inside the password
    "Qx7v%zzWk9z",  # a '%' that is no escape
    "Qx7vöWk9zé",  # non-ASCII
    "Qx7v\uff03Wk9z",  # fullwidth '#': urllib refuses it under NFKC, quoting the netloc
    "Qx7v[Wk9z]",  # brackets: urllib takes them for an IPv6 host
]
SHAPES = [
    "postgresql://alice:{pw}@db.example.com/shop",
    "postgresql://alice:{pw}@db.example.com:bad/shop",  # bad port
    "postgresql://alice:{pw}@db.example.com:99999/shop",  # port out of range
    "mysql://alice:{pw}@[::1/shop",  # unclosed IPv6 bracket
    "mysql://alice:{pw}@[not-an-ip]/shop",  # not an IPv6 address
    "mysql://alice:{pw}@[::1]:x/shop",
    "postgresql://alice:{pw}@db.example.com/shop#frag",
    "postgresql://alice:{pw}@/shop?pool_size=lots",
    "sqlite://alice:{pw}@/app.db",
    "alice:{pw}@db.example.com/shop",  # no scheme
]


def pieces(password: str) -> set[str]:
    """What must not appear: the password, its encoded forms, and each of its
    parts between URL delimiters (a parser may split it anywhere there)."""
    parts = {p for p in re.split("[/#?@:%\\[\\]\uff03]", password) if len(p) >= 3}
    return {password, quote(password, safe=""), quote(password), *parts}


def messages(exc: BaseException) -> Iterator[str]:
    """The text of ``exc`` and of every exception chained to it."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield str(current)
        yield repr(current)
        yield from (str(arg) for arg in current.args)
        todo += [current.__cause__, current.__context__]


def assert_hidden(password: str, texts: Iterator[str] | list[str]) -> None:
    for text in texts:
        for piece in pieces(password):
            assert piece not in text, f"{piece!r} (from password {password!r}) in {text!r}"


def hostile_urls() -> list[tuple[str, str]]:
    urls = [(shape.format(pw=pw), pw) for shape in SHAPES for pw in PASSWORDS]
    # Percent-encoded properly, the password must not show decoded either.
    urls += [(SHAPES[1].format(pw=quote(pw, safe="")), pw) for pw in PASSWORDS]
    return urls


@pytest.mark.parametrize(("url", "password"), hostile_urls())
def test_no_parse_error_shows_the_password(url: str, password: str) -> None:
    try:
        parsed = parse_url(url)
    except af.ValidationError as exc:
        assert_hidden(password, messages(exc))
        return
    # Parsed: then the password went where passwords go, and nothing shows it.
    assert parsed.password == password or parsed.password == quote(password, safe="")
    assert_hidden(password, [repr(parsed), parsed.describe(), str(parsed.query)])


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:Qx7v/Wk9z@h/db",  # would connect to host "alice", port "Qx7v"...
        "postgresql://alice:4711/Wk9z@h/db",  # ...or, digits first, succeed: database "Wk9z@h/db"
        "postgresql://alice:4711#Wk9z@h/db",  # a fragment would swallow the rest
        "postgresql://alice:4711?Wk9z@h/db",  # the query likewise
        "postgresql://h/db#",
    ],
)
def test_unencoded_delimiters_in_the_userinfo_are_refused(url: str) -> None:
    """A URL that parses to something else than was meant is refused, not
    connected to: host "alice" on port 4711 with database "Wk9z@h/db" would
    put the password in every later message that shows the URL."""
    with pytest.raises(af.ValidationError, match="percent-encode"):
        parse_url(url)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://alice:Qx7v@h:5432/db", "postgresql://alice:***@h:5432/db"),
        ("postgresql://alice:Qx7v/Wk9z@h/db", "postgresql://alice:***@h/db"),
        ("postgresql://alice:Qx@v:Wk@h/db", "postgresql://alice:***@h/db"),
        ("postgresql://alice@h/db", "postgresql://alice@h/db"),
        ("postgresql://alice:Qx7v/db", "postgresql://alice:***"),  # the host forgotten
        ("postgresql://h:5432/db?x=1", "postgresql://h:5432/db?x=1"),
        ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db"),
        ("postgresql://h/db#Qx7v", "postgresql://h/db#***"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_database_unavailable_hides_the_password() -> None:
    """A server that is not there: the message names the URL (without its
    password), and nothing in the chain shows it."""
    password = "Qx7v:Wk9z"
    url = f"postgresql://alice:{quote(password, safe='')}@127.0.0.1:1/db"
    with pytest.raises(af.DatabaseUnavailable) as info:
        await af.connect(url, reconnect_deadline=None, connect_timeout=2)
    assert "postgresql://alice@127.0.0.1:1/db" in str(info.value)
    assert_hidden(password, messages(info.value))


@pytest.mark.anyio
async def test_repr_of_an_open_database_hides_the_password() -> None:
    target = next(t for t in TARGETS if t.backend == "asyncpg" and t.runtime == "asyncio")
    require_target(target)
    password = "Qx7v#Wk9z"
    # The test server trusts local connections: the password is sent, not needed.
    url = POSTGRES_URL.replace("postgres@", f"postgres:{quote(password, safe='')}@", 1)
    assert url != POSTGRES_URL, "the test server URL has no 'postgres@' user"
    async with af.connect(url) as db:
        assert_hidden(password, [repr(db), str(db.url), db.url.describe()])
    assert_hidden(password, [repr(db)])


SCRIPT = shutil.which("aiofragno", path=str(Path(sys.executable).parent)) or "aiofragno"
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("postgresql://alice:Qx7v/Wk9z@db.example.com:bad/shop", "Qx7v/Wk9z"),
        ("mysql://alice:Qx7v#Wk9z@[::1/shop", "Qx7v#Wk9z"),
        ("postgresql://alice:Qx7v@Wk9z@[zz]/shop", "Qx7v@Wk9z"),
        ("postgresql://alice:Qx7v\uff03Wk9z@h/shop", "Qx7v\uff03Wk9z"),
        ("postgresql://alice:Qx7v/db", "Qx7v"),
    ],
)
@pytest.mark.parametrize("how", ["--url", "AIOFRAGNO_URL"])
def test_cli_stderr_hides_the_password(url: str, password: str, how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [SCRIPT, "doctor"]
    if how == "--url":
        args += ["--url", url]
    else:
        env["AIOFRAGNO_URL"] = url
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 1
    assert result.stderr.startswith("aiofragno: error: "), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr  # one line, no traceback
    assert_hidden(password, [result.stdout, result.stderr])
