"""A MariaDB primary and its replica, of a test's own, for failover and
read-replica tests.

Both are :class:`~tests.servers.MariaDBServer` s (spare ports on
127.0.0.1, temporary directories, the watchdog's cleanup), each with its
binary log and GTIDs (so that the replica, once promoted, is a primary like
the first); the replica, ``read_only``, replicates with
``CHANGE MASTER TO ... MASTER_USE_GTID=slave_pos`` through a *link*: a
:func:`~tests.faults.tcp_proxy` that can delay the primary's log by tens of
milliseconds (``pair.link.delay(0.03)``), as a replica in another zone lags
(MariaDB's own ``MASTER_DELAY`` counts whole seconds: ``master_delay=``).
The link runs in a thread of its own (an anyio blocking portal), so that it
outlives each test's event loop: one pair can serve a whole module, under
both runtimes. Both servers start from a copy of one data directory made
with ``mariadb-install-db`` once per test session (with the user
:data:`USER`), which takes a fraction of initialising each.

The tests connect as :data:`USER`, not root: root has MariaDB's
``READ_ONLY ADMIN`` privilege, which writes through ``read_only``; an
application's user has not. ::

    pair = MariaDBPair.create_blocking()
    url = pair.url()                      # mysql://app@p1,p2/test
    pair.wait_caught_up()                 # the replica has applied all the primary logged
    await pair.primary.stop("crash")      # the primary dies (SIGKILL) ...
    await pair.replica.promote()          # ... and its replica takes over
    pair.close()

Fixtures: ``new_pair()`` / ``mariadb_pair(...)`` (a fixture body), and
:class:`SharedPairs` for a module's fixture. They skip (or fail under
AIOFRAGNO_REQUIRE_BACKENDS=mysql) where the server binaries are missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import anyio.to_thread
from anyio.from_thread import start_blocking_portal

from aiofragno.hosts import FENCE
from tests import servers
from tests.faults import Proxy, tcp_proxy
from tests.servers import (
    START_TIMEOUT,
    MariaDBServer,
    ServerFailed,
    copy_template,
    skip_unless_available,
)

# The application's user: no password, every privilege on ``test`` and
# replication monitoring (SHOW SLAVE STATUS), but not READ_ONLY ADMIN.
USER = "app"


class SmallServer(MariaDBServer):
    """A MariaDB server with small InnoDB files: less to copy for each server."""

    def _server_options(self) -> list[str]:
        return [
            *super()._server_options(),
            "--innodb-log-file-size=4M",
            "--innodb-data-file-path=ibdata1:4M:autoextend",
        ]


class ReplicatedServer(SmallServer):
    """A MariaDB server with its binary log and GTIDs (``server_id``: its
    own in the pair), its data a copy of the session's template."""

    kind = "mysql+replicated"

    def __init__(self, server_id: int) -> None:
        self.server_id = server_id
        super().__init__()

    def _initialise(self) -> None:
        copy_template(TemplateServer, self)

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            f"--server-id={self.server_id}",
            "--log-bin=binlog",
            "--log-slave-updates",  # (a promoted replica's log has all a new replica needs)
            "--binlog-format=ROW",
            "--slave-net-timeout=5",  # (notice a lost primary in seconds, not a minute)
        ]

    async def query(self, sql: str) -> str:
        return await anyio.to_thread.run_sync(self.query_blocking, sql)

    def gtid_binlog_pos(self) -> str:
        """The GTIDs of every transaction in this server's binary log."""
        return self.query_blocking("SELECT @@gtid_binlog_pos")


class ReplicaServer(ReplicatedServer):
    """A ``read_only`` replica of the server at ``source_port`` (the primary,
    or the link in front of it), replicating by GTID."""

    kind = "mysql+replica"

    def __init__(self, source_port: int, *, master_delay: int = 0) -> None:
        self.source_port = source_port
        self.master_delay = master_delay
        super().__init__(server_id=2)

    def _command(self) -> list[str]:
        return [*super()._command(), "--read-only=1"]

    def _after_first_start(self) -> None:
        self.query_blocking(
            f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.source_port}, "
            "MASTER_USER='root', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1, "
            f"MASTER_DELAY={self.master_delay}; START SLAVE"
        )

    def promote_blocking(self) -> float:
        """Make the replica the primary: replication stopped and forgotten,
        writes accepted. The seconds it took."""
        started = time.monotonic()
        self.query_blocking("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0")
        elapsed = time.monotonic() - started
        self.timings.append(("promote", elapsed))
        return elapsed

    async def promote(self) -> float:
        return await anyio.to_thread.run_sync(self.promote_blocking)

    def wait_connected_blocking(self, timeout: float = START_TIMEOUT) -> None:
        """Until this replica's I/O thread is connected to its primary (it
        retries every second): before, a replica with nothing to apply yet
        looks caught up, and its lag is unknown (NULL)."""
        deadline = time.monotonic() + timeout
        while True:
            running = self.query_blocking(
                "SELECT variable_value FROM information_schema.global_status "
                "WHERE variable_name = 'Slave_running'"
            )
            if running == "ON":
                return
            if time.monotonic() > deadline:
                status = self.query_blocking("SHOW SLAVE STATUS\\G")
                raise ServerFailed(f"{self!r} not connected after {timeout}s:\n{status}")
            time.sleep(0.05)

    async def reconnect(self) -> None:
        """Make the I/O thread connect to its primary again (through the
        link as it relays now: a delay set on it reaches new connections)."""

        def again() -> None:
            self.query_blocking("STOP SLAVE IO_THREAD; START SLAVE IO_THREAD")
            self.wait_connected_blocking()

        await anyio.to_thread.run_sync(again)

    def wait_for_blocking(self, gtids: str, timeout: float = START_TIMEOUT) -> None:
        """Until this replica has applied the transactions ``gtids``
        (``MASTER_GTID_WAIT``); ServerFailed after ``timeout`` seconds."""
        waited = self.query_blocking(f"SELECT MASTER_GTID_WAIT('{gtids}', {timeout})")
        if waited != "0":
            status = self.query_blocking("SHOW SLAVE STATUS\\G")
            raise ServerFailed(f"{self!r} has not applied {gtids} after {timeout}s:\n{status}")


class TemplateServer(SmallServer):
    """The data directory the pairs' servers are copied from (see
    :func:`~tests.servers.copy_template`): ``mariadb-install-db``'s, with
    the database ``test`` and the user :data:`USER`."""

    kind = "mysql+template"

    def _after_first_start(self) -> None:
        self.query_blocking(
            f"CREATE USER {USER}@'%'; GRANT ALL ON test.* TO {USER}@'%'; "
            f"GRANT SLAVE MONITOR ON *.* TO {USER}@'%'"
        )


class MariaDBPair:
    """A primary and its replica, both running, the replica replicating
    through ``link`` (a proxy: ``link.delay(seconds)`` lags it)."""

    def __init__(
        self, primary: ReplicatedServer, replica: ReplicaServer, link: Proxy, stack: ExitStack
    ) -> None:
        self.primary = primary
        self.replica = replica
        self.link = link
        self._stack = stack

    @classmethod
    def create_blocking(cls, *, latency: float = 0.0, master_delay: int = 0) -> MariaDBPair:
        """A new pair; the replica's log arrives ``latency`` seconds late
        (the link's delay) and is applied ``master_delay`` seconds late."""
        with ExitStack() as stack:
            primary = ReplicatedServer(server_id=1)
            stack.callback(primary.close)
            portal = stack.enter_context(start_blocking_portal())
            link = stack.enter_context(
                portal.wrap_async_context_manager(tcp_proxy("127.0.0.1", primary.port))
            )
            link.delay(latency)
            replica = ReplicaServer(link.port, master_delay=master_delay)
            stack.callback(replica.close)
            # Both at once (the replica retries its primary every second).
            with ThreadPoolExecutor(2) as starting:
                for started in [starting.submit(s.create_blocking) for s in (primary, replica)]:
                    started.result()
            pair = cls(primary, replica, link, stack.pop_all())
        try:
            pair.replica.wait_connected_blocking()
            pair.wait_caught_up()
        except BaseException:
            pair.close()
            raise
        return pair

    def url(self, *servers: ReplicatedServer, **query: str) -> str:
        """A URL naming ``servers`` (default: primary, then replica) in order."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers or (self.primary, self.replica))
        params = "&".join(f"{name}={value}" for name, value in query.items())
        return f"mysql://{USER}@{hosts}/test" + (f"?{params}" if params else "")

    def wait_caught_up(self, timeout: float = START_TIMEOUT) -> None:
        """Until the replica has applied everything the primary has logged."""
        self.replica.wait_for_blocking(self.primary.gtid_binlog_pos(), timeout)

    async def caught_up(self) -> None:
        """:meth:`wait_caught_up`, in a worker thread."""
        await anyio.to_thread.run_sync(self.wait_caught_up)

    def close(self) -> None:
        """Stop both servers, remove their directories, close the link."""
        self._stack.close()


def new_pair(*, latency: float = 0.0, master_delay: int = 0) -> MariaDBPair:
    """A new pair (close it after); skips the test where MariaDB's server
    binaries are missing (fails under AIOFRAGNO_REQUIRE_BACKENDS=mysql)."""
    # Every pair is a copy of one template: what an earlier test's pair left
    # in the process's fence must not fence this pair's primary off.
    FENCE.forget()
    with skip_unless_available("mysql"):
        return MariaDBPair.create_blocking(latency=latency, master_delay=master_delay)


def mariadb_pair(*, latency: float = 0.0, master_delay: int = 0) -> Iterator[MariaDBPair]:
    """A fixture body: :func:`new_pair`, closed after the test."""
    pair = new_pair(latency=latency, master_delay=master_delay)
    try:
        yield pair
    finally:
        pair.close()


class SharedPairs(servers.SharedPairs[MariaDBPair]):
    """Pairs made on first use and kept, by their options (``latency``,
    ``master_delay``; see :class:`tests.servers.SharedPairs`)."""

    def __init__(self) -> None:
        super().__init__(new_pair, FENCE.forget)
