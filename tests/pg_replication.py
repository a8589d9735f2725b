"""A PostgreSQL primary and its streaming-replication standby, of a test's
own, for failover and read-replica tests.

Both are :class:`~tests.servers.PostgresServer` s (spare ports on
127.0.0.1, temporary directories, the watchdog's cleanup): the primary with
WAL for a standby, the standby made from the same cluster (a
hot standby that streams from it). Both start from a copy of one cleanly
stopped cluster, made with ``initdb`` once per test session: what
``pg_basebackup -R`` would give, in a tenth of the time. With ``synchronous=True`` the primary
waits for the standby (``synchronous_standby_names``) at every COMMIT.

With ``latency`` the standby streams through a :func:`~tests.faults.tcp_proxy`
— the pair's *link* — that delays the log by that many seconds, as a
replica in another zone lags. The link runs in a thread of its own (an
anyio blocking portal), so that it outlives each test's event loop: one
pair serves a whole test module, under both runtimes (:func:`replica_pair`).

::

    pair = ReplicationPair.create_blocking(synchronous=False)
    url = pair.url()                      # postgresql://postgres@p1,p2/test
    await pair.primary.stop("crash")      # the primary dies ...
    await pair.standby.promote()          # ... and its standby takes over
    pair.close()

Skips (or fails under AIOFRAGNO_REQUIRE_BACKENDS=postgresql) where the
server binaries are missing: see :func:`new_pair`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anyio.to_thread
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from aiofragno.hosts import FENCE
from tests import servers
from tests.conftest import Target
from tests.faults import Proxy, tcp_proxy
from tests.servers import (
    POLL,
    START_TIMEOUT,
    PostgresServer,
    ServerFailed,
    ServerUnavailable,
    copy_template,
    skip_unless_available,
)

# The standby's name, as the primary's synchronous_standby_names knows it.
STANDBY_NAME = "standby1"


class PrimaryServer(PostgresServer):
    """A PostgreSQL server that feeds streaming replicas."""

    kind = "postgresql+primary"

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        super().__init__()

    def _initialise(self) -> None:
        copy_template(TemplateServer, self)

    def _after_first_start(self) -> None:
        """Nothing: the database ``test`` came with the template."""

    def _check_installed(self) -> None:
        super()._check_installed()
        for tool in ("pg_ctl",):
            if not (self.bin / tool).is_file():
                raise ServerUnavailable(
                    f"{tool} is not in {self.bin}; apt-get install postgresql (a full server)"
                )

    def _settings(self) -> dict[str, str]:
        return {
            **super()._settings(),
            "wal_level": "replica",
            "wal_keep_size": "64MB",
            "hot_standby": "on",
        }

    def _own(self, path: Path) -> None:
        """``path`` made the service user's (we may be root)."""
        if self._run_as is not None:
            user = pwd.getpwnam(self._run_as)
            os.chown(path, user.pw_uid, user.pw_gid)

    def query_blocking(self, sql: str) -> str:
        """``sql``'s result as psql prints it unaligned (``-At``)."""
        return self._capture(
            [
                str(self.bin / "psql"),
                *("-X", "-At", "-w", "-h", "127.0.0.1", "-p", str(self.port)),
                *("-U", "postgres", "-d", "test", "-c", sql),
            ],
            what=sql,
        )


class StandbyServer(PrimaryServer):
    """A hot standby of ``primary``, streaming from it (through the port
    ``source_port``, a proxy in front of it, if given).
    Its own settings are a primary's, so that once promoted it serves
    standbys of its own (the synchronous standby name: only if it had one)."""

    kind = "postgresql+standby"

    def __init__(self, primary: PrimaryServer, source_port: int | None = None) -> None:
        self.primary = primary
        self.source_port = source_port or primary.port
        super().__init__(synchronous=False)

    def _initialise(self) -> None:
        # A copy of a cleanly stopped cluster is a base backup as good as
        # pg_basebackup's (the primary starts from the same copy), and a
        # fraction of its time.
        copy_template(TemplateServer, self)
        (self.data / "standby.signal").touch()
        conninfo = (
            f"host=127.0.0.1 port={self.source_port} user=postgres application_name={STANDBY_NAME}"
        )
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\n")
        self._own(self.data / "standby.signal")

    def _ready(self, pid: int) -> bool:
        # A hot standby's postmaster.pid says "standby" once it accepts
        # read-only connections; a promoted one "ready".
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0] == str(pid) and lines[7].strip() in ("ready", "standby")

    def promote_blocking(self) -> float:
        """Promote the standby (``pg_ctl promote``) and return the seconds
        until it accepted writes."""
        started = time.monotonic()
        self._run(
            [str(self.bin / "pg_ctl"), "promote", "-D", str(self.data), "-w", "-t", "60"],
            what="pg_ctl promote",
        )
        elapsed = time.monotonic() - started
        self.timings.append(("promote", elapsed))
        return elapsed

    async def promote(self) -> float:
        return await anyio.to_thread.run_sync(self.promote_blocking)


class TemplateServer(PostgresServer):
    """The cluster the pairs' servers are copied from (see
    :func:`~tests.servers.copy_template`): initdb'd, with the database ``test``."""

    kind = "postgresql+template"
    # 1 MB WAL segments, not 16: less to copy for each server.
    initdb_options = ("--wal-segsize=1",)

    def _settings(self) -> dict[str, str]:
        return {**super()._settings(), "wal_level": "replica"}


class ReplicationPair:
    """A primary and its standby, both running, the standby streaming (through
    ``link`` if the pair was made with a latency: ``link.delay()`` lags it)."""

    def __init__(
        self,
        primary: PrimaryServer,
        standby: StandbyServer,
        link: tuple[Proxy, BlockingPortal] | None = None,
        stack: ExitStack | None = None,
    ) -> None:
        self.primary = primary
        self.standby = standby
        self.link: Proxy | None = link[0] if link else None
        self._portal: BlockingPortal | None = link[1] if link else None
        self._stack = stack or ExitStack()

    @classmethod
    def create_blocking(cls, *, synchronous: bool, latency: float | None = None) -> ReplicationPair:
        """A new pair; with ``latency`` (seconds), the standby's log comes
        through a link that delays it that long."""
        stack = ExitStack()
        try:
            primary = PrimaryServer(synchronous=synchronous)
            stack.callback(primary.close)
            primary.create_blocking()
            link = None if latency is None else _link(stack, primary, latency)
            standby = StandbyServer(primary, link[0].port if link else None)
            stack.callback(standby.close)
            standby.create_blocking()
            pair = cls(primary, standby, link, stack)
            pair.wait_streaming("async")
            if synchronous:
                # (Only now: until the standby streams, every COMMIT — CREATE
                # DATABASE's too — would wait for it.)
                primary.query_blocking(
                    f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"
                )
                primary.query_blocking("SELECT pg_reload_conf()")
                pair.wait_streaming()
        except BaseException:
            stack.close()
            raise
        return pair

    def stall_link(self, stalled: bool) -> None:
        """Hold back (True) or pass on again (False) the log on its way to
        the standby, whatever the primary commits meanwhile (a pair made
        with a latency)."""
        link, portal = self.link, self._portal
        assert link is not None and portal is not None, "no link: make the pair with a latency"
        portal.call(link.stall, stalled)  # (in the link's own thread)

    def pids(self) -> dict[str, int]:
        """Each server's main process (for metering its processes' CPU)."""
        servers = {"primary": self.primary, "standby": self.standby}
        return {
            name: server._process.pid
            for name, server in servers.items()
            if server._process is not None
        }

    def url(self, *servers: PostgresServer, **query: str) -> str:
        """A URL naming ``servers`` (default: primary, then standby) in order."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers or (self.primary, self.standby))
        params = "&".join(f"{name}={value}" for name, value in query.items())
        return f"postgresql://postgres@{hosts}/test" + (f"?{params}" if params else "")

    def wait_streaming(self, wanted: str | None = None) -> None:
        """Until the primary sees the standby streaming, as its synchronous
        standby if the pair is synchronous (``wanted``: "sync" or "async")."""
        wanted = wanted or ("sync" if self.primary.synchronous else "async")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            state = self.primary.query_blocking(
                f"SELECT state || '/' || sync_state FROM pg_stat_replication "
                f"WHERE application_name = '{STANDBY_NAME}'"
            )
            if state == f"streaming/{wanted}":
                return
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"the standby is not streaming ({state!r}) after {START_TIMEOUT}s"
                )
            time.sleep(POLL)

    def wait_replayed(self) -> None:
        """Until the standby has replayed all the primary has written so far."""
        written = self.primary.query_blocking("SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + START_TIMEOUT
        check = f"SELECT pg_last_wal_replay_lsn() >= '{written}'::pg_lsn"
        while self.standby.query_blocking(check) != "t":
            if time.monotonic() > deadline:
                raise ServerFailed(f"the standby has not replayed {written} in {START_TIMEOUT}s")
            time.sleep(POLL)

    def close(self) -> None:
        """The standby, the link, then the primary."""
        with contextlib.suppress(Exception):
            self._stack.close()


def _link(stack: ExitStack, primary: PrimaryServer, latency: float) -> tuple[Proxy, BlockingPortal]:
    """A proxy to ``primary`` in a thread of its own (closed with ``stack``),
    delaying what passes through it by ``latency`` seconds."""
    portal = stack.enter_context(start_blocking_portal())
    link = stack.enter_context(
        portal.wrap_async_context_manager(tcp_proxy("127.0.0.1", primary.port))
    )
    link.delay(latency)  # (before the standby's connections open)
    return link, portal


def new_pair(*, synchronous: bool, latency: float | None = None) -> ReplicationPair:
    """A new pair (close it after); skips the test where PostgreSQL's server
    binaries are missing (fails under AIOFRAGNO_REQUIRE_BACKENDS=postgresql)."""
    # Every pair is a copy of one template cluster, so all share its system
    # identifier: the timelines an earlier test's promotion left in the
    # process's fence would fence this pair's primary off.
    FENCE.forget()
    with skip_unless_available("postgresql"):
        return ReplicationPair.create_blocking(synchronous=synchronous, latency=latency)


def replication_pair(*, synchronous: bool) -> Iterator[ReplicationPair]:
    """A fixture body: :func:`new_pair`, closed after the test."""
    pair = new_pair(synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.close()


class SharedPairs(servers.SharedPairs[ReplicationPair]):
    """Pairs made on first use and kept, by ``synchronous`` (see
    :class:`tests.servers.SharedPairs`); with ``latency``, each streams
    through a link (see :func:`new_pair`). The fence forgets what tests of
    other pairs saw (see :func:`new_pair`) at each hand-out."""

    def __init__(self, latency: float | None = None) -> None:
        super().__init__(functools.partial(new_pair, latency=latency), FENCE.forget)


# The read-replica tests' standby gets its log this late (seconds; a replica
# in another zone).
LATENCY = 0.03


@pytest.fixture(scope="module")
def replica_pairs() -> Iterator[SharedPairs]:
    pairs = SharedPairs(LATENCY)
    try:
        yield pairs
    finally:
        pairs.close()


@pytest.fixture
def replica_pair(target: Target, replica_pairs: SharedPairs) -> ReplicationPair:
    """The module's asynchronous pair whose standby lags by :data:`LATENCY`,
    for a PostgreSQL target (others skip); skips — or fails, where
    AIOFRAGNO_REQUIRE_BACKENDS names postgresql — when the server binaries
    are missing."""
    if target.dialect != "postgresql":
        pytest.skip("read replicas are PostgreSQL streaming replication")
    return replica_pairs.get(synchronous=False)
