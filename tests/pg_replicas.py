"""A PostgreSQL primary and its hot standby, for the read-replica tests.

The primary is a :class:`~tests.servers.PostgresServer` — in the tests,
the session's private one (``private_servers``), so that the pair costs
only its standby when other tests have started that server; the standby is
made from it with ``pg_basebackup -R`` (the base backup, and a
``primary_conninfo`` that streams the primary's log) and runs as a hot
standby. It streams through a :func:`~tests.faults.tcp_proxy` — the
*link* — that can delay the log by tens of milliseconds, as a replica in
another zone lags. The link runs in a thread of its own (an anyio blocking
portal), so that it outlives each test's event loop: one pair serves a
whole test module, under both runtimes.

Skips with the reason where the server binaries (``initdb``, ``postgres``,
``pg_basebackup``) are missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from anyio.from_thread import start_blocking_portal

from tests.conftest import Target, required_dialects
from tests.faults import Proxy, tcp_proxy
from tests.servers import PostgresServer, PrivateServers, ServerUnavailable


class StandbyServer(PostgresServer):
    """A hot standby, its data a base backup taken from the server at
    ``source_port`` (the primary, or a proxy in front of it), from which it
    then streams the log."""

    kind = "postgresql+standby"

    def __init__(self, source_port: int) -> None:
        self.source_port = source_port
        super().__init__()

    def _check_installed(self) -> None:
        super()._check_installed()
        if not (self.bin / "pg_basebackup").is_file():
            raise ServerUnavailable(
                f"no pg_basebackup in {self.bin}; apt-get install postgresql (it ships with "
                "the server)"
            )

    def _initialise(self) -> None:
        # -R: standby.signal and primary_conninfo (to source_port); -X stream:
        # the log written meanwhile comes along; checkpoint fast: no waiting
        # for the primary's next one.
        self._run(
            [
                str(self.bin / "pg_basebackup"),
                *("-h", "127.0.0.1", "-p", str(self.source_port), "-U", "postgres"),
                f"--pgdata={self.data}",
                *("-R", "-X", "stream", "--checkpoint=fast", "--no-sync"),
            ],
            what="pg_basebackup",
        )

    def _after_first_start(self) -> None:
        pass  # (the test database came with the base backup)


@dataclass
class ReplicaPair:
    primary: PostgresServer
    standby: StandbyServer
    link: Proxy  # between the standby and the primary: delay() lags the standby

    def pids(self) -> dict[str, int]:
        """Each server's main process (for metering its processes' CPU)."""
        servers = {"primary": self.primary, "standby": self.standby}
        return {
            name: server._process.pid
            for name, server in servers.items()
            if server._process is not None
        }


class ReplicaPairs:
    """The module's pair, made at first use (a module whose tests all skip
    makes none) and closed with the module (the primary too, unless it is
    the session's private server, taken from ``servers``)."""

    def __init__(self, latency: float, servers: PrivateServers | None = None) -> None:
        self.latency = latency
        self._servers = servers
        self._stack = ExitStack()
        self._pair: ReplicaPair | None = None
        self._unavailable: str | None = None

    def get(self) -> ReplicaPair:
        if self._unavailable is not None:
            raise ServerUnavailable(self._unavailable)
        if self._pair is None:
            try:
                self._pair = self._start()
            except ServerUnavailable as exc:
                self._unavailable = str(exc)
                raise
        return self._pair

    def _start(self) -> ReplicaPair:
        stack = self._stack
        primary = self._primary()
        portal = stack.enter_context(start_blocking_portal())
        link = stack.enter_context(
            portal.wrap_async_context_manager(tcp_proxy("127.0.0.1", primary.port))
        )
        link.delay(self.latency)  # (before the standby's connections open)
        standby = StandbyServer(link.port)
        stack.callback(standby.close)
        standby.create_blocking()
        return ReplicaPair(primary, standby, link)

    def _primary(self) -> PostgresServer:
        if self._servers is not None:
            primary = self._servers.get(PostgresServer.kind)
            assert isinstance(primary, PostgresServer)
            return primary
        primary = PostgresServer()
        self._stack.callback(primary.close)
        primary.create_blocking()
        return primary

    def close(self) -> None:
        self._stack.close()


# The standby's log arrives this late (seconds; a replica in another zone).
LATENCY = 0.03


@pytest.fixture(scope="module")
def replica_pairs(private_servers: PrivateServers) -> Iterator[ReplicaPairs]:
    pairs = ReplicaPairs(LATENCY, private_servers)
    try:
        yield pairs
    finally:
        pairs.close()


@pytest.fixture
def replica_pair(target: Target, replica_pairs: ReplicaPairs) -> ReplicaPair:
    """The module's primary and standby, for a PostgreSQL target (others
    skip); skips — or fails, where AIOFRAGNO_REQUIRE_BACKENDS names
    postgresql — when the server binaries are missing."""
    if target.dialect != "postgresql":
        pytest.skip("read replicas are PostgreSQL streaming replication")
    try:
        return replica_pairs.get()
    except ServerUnavailable as exc:
        if "postgresql" in required_dialects():
            pytest.fail(f"{exc}; AIOFRAGNO_REQUIRE_BACKENDS requires postgresql")
        pytest.skip(str(exc))
