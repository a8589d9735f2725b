"""Multi-host PostgreSQL and MySQL URLs (libpq's syntax) and the choice
among their servers (aiofragno.hosts; MySQL's roles: aiofragno.dialects.mysql):
no server needed. The servers themselves are tests/test_failover.py's and
tests/test_mariadb_failover.py's."""

from __future__ import annotations

import pytest

import aiofragno as af
from aiofragno.dialects.mysql import replica_lag, role_sql, server_role
from aiofragno.host_choice import hosts_of
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
        ("mysql://u@h1:3307,h2:3308/app", (("h1", 3307), ("h2", 3308))),
        ("mariadb://h1,h2/app", (("h1", None), ("h2", None))),
        ("mysql://[::1]:3307,h2/app", (("::1", 3307), ("h2", None))),
        ("mysql:///app?host=a,b&port=3307", (("a", 3307), ("b", 3307))),
        ("mysql://x/app?host=a,b&port=1,2", (("a", 1), ("b", 2))),
        (
            "mysql://u@%2Frun%2Fmysqld%2Fmysqld.sock,b:3307/app",
            (("/run/mysqld/mysqld.sock", None), ("b", 3307)),
        ),
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
        ("mysql://a:3306,b:x/db", "bad port"),
        ("mysql://a,,b/db", "empty host"),
        ("mysql://a,b/x?port=1,2,3", "2 hosts and 3 ports"),
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


def test_host_choice_and_socket_options_are_for_servers() -> None:
    options = Options().merged({"target_session_attrs": "read-write"}, {})
    options.check_dialect("postgresql")
    options.check_dialect("mysql")
    with pytest.raises(af.ValidationError, match="for postgresql and mysql, not sqlite"):
        options.check_dialect("sqlite")
    balanced = Options().merged({"load_balance_hosts": "random"}, {})
    balanced.check_dialect("mysql")
    timeout = Options().merged({"tcp_user_timeout": "10"}, {})
    timeout.check_dialect("mysql")
    with pytest.raises(af.ValidationError, match="for postgresql and mysql, not sqlite"):
        timeout.check_dialect("sqlite")
    assert Options().merged({"tcp_user_timeout": "none"}, {}).tcp_user_timeout is None


def test_a_mysql_url_of_several_hosts_reads_write_by_default() -> None:
    url = parse_url("mysql://app@h1:3307,h2:3308/test")
    hosts = hosts_of(url, Options())
    assert hosts.attrs == "read-write" and hosts.several
    assert url.describe() == "mysql://app@h1:3307,h2:3308/test"
    assert hosts_of(parse_url("mysql://app@h1/test"), Options()).attrs == "any"


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


# The role query's row: read_only, innodb_read_only, server id (MySQL: uuid),
# GTID history, running replication threads.
MARIADB_PRIMARY = (0, 0, 1, "0-1-100", "0")
MARIADB_REPLICA = (1, 0, 2, "0-1-100", "1")
MARIADB_PROMOTED = (0, 0, 2, "0-1-100,0-2-140", "0")
MARIADB_PROMOTED_UNWRITTEN = (0, 0, 2, "0-1-100", "0")


def test_mariadb_roles() -> None:
    primary = server_role(MARIADB_PRIMARY, "set")
    assert (primary.standby, primary.read_only, primary.timeline) == (False, False, 1)
    replica = server_role(MARIADB_REPLICA, "set")
    assert (replica.standby, replica.read_only, replica.timeline) == (True, True, 1)
    # A promoted replica: its primary's writes and its own, two writers.
    assert server_role(MARIADB_PROMOTED, "set").timeline == 2
    assert server_role(MARIADB_PROMOTED_UNWRITTEN, "set").timeline == 2  # (it takes writes)
    # read_only or innodb_read_only, not replicating: a primary that refuses writes.
    configured = server_role((0, 1, 1, "", "0"), "set")
    assert (configured.standby, configured.read_only) == (False, True)
    # A replica set read_only=0 by mistake is still not written to.
    assert server_role((0, 0, 2, "0-1-5", "1"), "set").read_only
    assert role_sql("5.5.5-10.11.19-MariaDB-0+deb12u1").count("gtid_binlog_state") == 1
    assert "gtid_executed" in role_sql("8.0.36")


def test_mysql_roles_count_the_uuids_of_the_gtid_history() -> None:
    history = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-77,\n4f22ab58-81db-22f2-8f44-d91bb0530673:1-5"
    assert (
        server_role((0, 0, "4f22ab58-81db-22f2-8f44-d91bb0530673", history, 0), "s").timeline == 2
    )
    assert server_role((1, 0, "x", history, 1), "s").timeline == 2


def test_the_fence_refuses_an_old_mariadb_primary_after_a_promotion() -> None:
    fence = Fence()
    assert fence.admits(server_role(MARIADB_PRIMARY, "set"))
    assert fence.admits(server_role(MARIADB_PROMOTED_UNWRITTEN, "set"))
    # The old primary is back, its own writes only (even some the new one never got).
    assert not fence.admits(server_role((0, 0, 1, "0-1-104", "0"), "set"))
    # As a replica of the new primary it is harmless, and once it has followed it
    # (its history names both writers) it may be promoted again.
    assert fence.admits(server_role((1, 0, 1, "0-1-104", "1"), "set"))
    assert fence.admits(server_role((0, 0, 1, "0-1-100,0-2-150", "0"), "set"))
    assert fence.admits(server_role((0, 0, 1, "0-1-104", "0"), "another set"))


def test_replica_lag_from_show_slave_status() -> None:
    columns = ["Slave_IO_State", "Seconds_Behind_Master"]
    assert replica_lag(columns, [("Waiting", 3)]) == 3.0
    assert replica_lag(columns, [("Connecting", None)]) is None
    assert replica_lag(columns, []) is None
    assert replica_lag(["Seconds_Behind_Source"], [(0,)]) == 0.0
