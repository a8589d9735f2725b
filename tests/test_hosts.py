"""Multi-host PostgreSQL URLs (libpq's syntax) and the choice among their
servers (aiofragno.hosts): no server needed. The servers themselves are
tests/test_failover.py's."""

from __future__ import annotations

import pytest

import aiofragno as af
from aiofragno.hosts import Fence, Hosts, ServerRole, accepts
from aiofragno.libpq import from_environment
from aiofragno.url import Options, parse_url


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        ("postgresql://u@h1:5434,h2:5435/app", (("h1", 5434), ("h2", 5435))),
        ("postgresql://h1,h2/app", (("h1", None), ("h2", None))),
        ("postgresql://[::1]:5433,h2/app", (("::1", 5433), ("h2", None))),
        ("postgresql:///app?host=a,b&port=6000", (("a", 6000), ("b", 6000))),
        ("postgresql:///app?host=a,b&port=1,2", (("a", 1), ("b", 2))),
        ("postgresql://x/app?host=%2Ftmp%2Fpg,b", (("/tmp/pg", None), ("b", None))),
    ],
)
def test_host_lists_are_parsed_as_libpq_does(url: str, hosts: tuple[object, ...]) -> None:
    parsed = parse_url(url)
    assert parsed.hosts == hosts
    assert (parsed.host, parsed.port) == hosts[0]
    assert parsed.servers == hosts
    assert parsed.database == "app"


def test_one_host_keeps_its_form() -> None:
    parsed = parse_url("postgresql://u:p@h:5433/app")
    assert parsed.hosts == () and parsed.servers == (("h", 5433),)


def test_a_host_list_keeps_user_password_and_options() -> None:
    parsed = parse_url(
        "postgresql://u%40x:p%2Cw@h1:5434,h2/app?target_session_attrs=primary&sslmode=disable"
    )
    assert (parsed.username, parsed.password) == ("u@x", "p,w")
    assert parsed.query == {"target_session_attrs": "primary", "sslmode": "disable"}
    assert parsed.describe() == "postgresql://u@x@h1:5434,h2/app"
    assert "p,w" not in repr(parsed)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://h1:x,h2/app", "bad port"),
        ("postgresql://h1:70000,h2/app", "bad port"),
        ("postgresql://h1,,h2/app", "empty host"),
        ("postgresql://a,b/x?port=1,2,3", "2 hosts and 3 ports"),
        ("postgresql://[::1,h2/app", "bad host"),
        ("mysql://a,b/db", "only PostgreSQL"),
    ],
)
def test_bad_host_lists_are_refused(url: str, says: str) -> None:
    with pytest.raises(af.ValidationError, match=says):
        parse_url(url)


def test_pghost_and_pgport_lists() -> None:
    url, _ = from_environment(parse_url("postgresql:///app"), {"PGHOST": "a,b", "PGPORT": "1,2"})
    assert url.hosts == (("a", 1), ("b", 2))
    # The URL's host wins over the environment's list.
    url, _ = from_environment(parse_url("postgresql://c/app"), {"PGHOST": "a,b"})
    assert (url.host, url.hosts) == ("c", ())


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"target_session_attrs": "writable"}, "target_session_attrs must be one of"),
        ({"load_balance_hosts": "yes"}, "load_balance_hosts must be one of"),
        ({"tcp_user_timeout": "10000"}, "milliseconds"),
        ({"keepalives_idle": "0"}, "positive"),
    ],
)
def test_bad_failover_options_are_refused(options: dict[str, str], says: str) -> None:
    with pytest.raises(af.ValidationError, match=says):
        Options().merged(options, {})


def test_failover_options_are_postgresqls() -> None:
    options = Options().merged({"target_session_attrs": "read-write"}, {})
    options.check_dialect("postgresql")
    with pytest.raises(af.ValidationError, match="for postgresql, not mysql"):
        options.check_dialect("mysql")
    assert Options().merged({"tcp_user_timeout": "none"}, {}).tcp_user_timeout is None


PRIMARY = ServerRole(standby=False, read_only=False, system="s", timeline=2)
STANDBY = ServerRole(standby=True, read_only=True, system="s", timeline=2)
CONFIGURED_READ_ONLY = ServerRole(standby=False, read_only=True, system="s", timeline=2)


@pytest.mark.parametrize(
    ("attrs", "accepted"),
    [
        ("any", {PRIMARY, STANDBY, CONFIGURED_READ_ONLY}),
        ("read-write", {PRIMARY}),
        ("primary", {PRIMARY, CONFIGURED_READ_ONLY}),
        ("standby", {STANDBY}),
        ("prefer-standby", {STANDBY}),  # (its first round; any server after)
        ("read-only", {STANDBY, CONFIGURED_READ_ONLY}),
    ],
)
def test_session_attrs(attrs: str, accepted: set[ServerRole]) -> None:
    roles = {PRIMARY, STANDBY, CONFIGURED_READ_ONLY}
    assert {role for role in roles if accepts(attrs, role)} == accepted  # type: ignore[arg-type]


def test_the_fence_refuses_a_writable_server_on_an_older_timeline() -> None:
    fence = Fence()
    assert fence.admits(ServerRole(False, False, "s", 1))
    assert fence.admits(ServerRole(True, True, "s", 2))  # a promoted standby's timeline...
    assert not fence.admits(ServerRole(False, False, "s", 1))  # ...fences the old primary
    assert fence.admits(ServerRole(True, True, "s", 1))  # (read-only: harmless)
    assert fence.admits(ServerRole(False, False, "other cluster", 1))
    assert fence.admits(ServerRole(False, False, "s", 3))
    assert not fence.admits(ServerRole(False, False, "s", 2))
    assert fence.admits(ServerRole(False, False, None, None))  # (cannot tell: not fenced)


def test_hosts_order_last_good_first_lost_last() -> None:
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    hosts = Hosts([a, b, c], "read-write", load_balance=False)
    assert hosts.order() == [a, b, c]
    hosts.good(c)
    assert hosts.order() == [c, a, b]
    generation = hosts.states[c].generation
    hosts.lost(c)
    assert hosts.states[c].generation == generation + 1
    hosts.lost(a)
    assert hosts.order() == [b, a, c]
    hosts.good(a)
    assert hosts.order() == [a, b, c]
    shuffled = Hosts([a, b, c], "any", load_balance=True)
    shuffled.good(b)
    assert {tuple(shuffled.order()) for _ in range(50)} <= {(b, a, c), (b, c, a)}
