"""Choosing one server among the several a URL names (a primary and its
standbys), as libpq's ``target_session_attrs`` does — with what libpq's
in-order loop lacks for failover:

* the host that last gave a suitable connection is tried first (after a
  failover, new connections go straight to the new primary instead of
  waiting ``connect_timeout`` on the dead one each time);
* each host has its own ``connect_timeout``;
* **fencing**: a server that accepts writes is refused when its timeline is
  older than one this process has already seen for the same cluster (same
  system identifier) — an old primary that came back after its standby was
  promoted would otherwise take writes that the new primary never sees
  (MariaDB and MySQL have no timeline: their dialect counts the writers of
  a server's GTID history instead, see :mod:`aiofragno.dialects.mysql`);
* a host whose connection was lost unexpectedly has a new *generation*:
  the idle connections opened to it before are dropped at checkout, not
  handed out one by one to fail.

The server is asked what it is (:class:`ServerRole`) by the backend,
through :mod:`aiofragno.host_choice`; nothing here talks to a server.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from .url import HostPort, SessionAttrs, describe_host

# What a server is: a primary, or one that replays a primary's log — a
# PostgreSQL standby, a MySQL/MariaDB replica.
Role = Literal["primary", "standby", "replica"]


@dataclass(frozen=True, slots=True)
class ServerRole:
    """What a server says of itself once connected."""

    standby: bool
    """In recovery: a standby replaying WAL."""
    read_only: bool
    """Refuses writes (a standby, or ``default_transaction_read_only``)."""
    system: str | None
    """The cluster's system identifier: a primary and its standbys share it."""
    timeline: int | None
    """PostgreSQL: the WAL timeline; each promotion starts a new, higher
    one. MariaDB/MySQL: how many servers have written the GTID history
    this server holds (each promotion adds one; see
    :mod:`aiofragno.dialects.mysql`)."""
    replay_lag: float | None = None
    """A standby's or replica's lag in seconds, when the role query tells it."""


@dataclass(frozen=True, slots=True)
class HostStatus:
    """One server of the URL as :meth:`Database.servers
    <aiofragno.Database.servers>` reports it: its role, timeline (MariaDB,
    MySQL: the number of writers in its GTID history) and (for a standby or
    replica) replay lag in seconds, or why it could not be asked."""

    host: str
    port: int | None
    role: Role | None
    read_only: bool | None = None
    timeline: int | None = None
    replay_lag: float | None = None
    fenced: bool = False
    """A read-write server on a timeline older than one already seen: not used."""
    error: str | None = None

    def describe(self) -> str:
        where = describe_host(self.host, self.port)
        if self.error is not None:
            return f"{where}: unreachable ({self.error})"
        parts: list[str] = [self.role or "unknown role"]
        if self.read_only and self.role == "primary":
            parts.append("read-only")
        if self.timeline is not None:
            parts.append(f"timeline {self.timeline}")
        if self.replay_lag is not None:
            parts.append(f"replay lag {self.replay_lag:.3f}s")
        if self.fenced:
            parts.append(
                "FENCED: an older timeline or GTID history than one already seen (a stale primary)"
            )
        return f"{where}: {', '.join(parts)}"


def accepts(attrs: SessionAttrs, role: ServerRole) -> bool:
    """Whether a server of ``role`` suits ``attrs`` (prefer-standby: in its
    first round, which looks for a standby)."""
    if attrs == "read-write":
        return not role.read_only
    if attrs == "read-only":
        return role.read_only
    if attrs == "primary":
        return not role.standby
    if attrs in ("standby", "prefer-standby"):
        return role.standby
    return True


class Fence:
    """The newest timeline seen per cluster in this process."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def admits(self, role: ServerRole) -> bool:
        """Whether ``role``'s server may be used, noting its timeline: a
        writable server on a timeline older than one seen is a stale primary."""
        if role.system is None or role.timeline is None:
            return True
        newest = self._seen.get(role.system, role.timeline)
        if role.timeline < newest and not role.read_only:
            return False
        self._seen[role.system] = max(newest, role.timeline)
        return True

    def forget(self) -> None:
        """Forget every timeline seen: for a process that goes on with new
        clusters cloned from one data directory (test suites do; real
        clusters have identifiers of their own)."""
        self._seen.clear()


# Per process, as the guarantee is: a Database opened later (or another
# Database on the same cluster) does not forget what an earlier one saw.
FENCE = Fence()


class HostState:
    """A host's generation: raised when one of its connections is lost
    unexpectedly, which makes the connections opened before stale."""

    __slots__ = ("generation",)

    def __init__(self) -> None:
        self.generation = 0


class Hosts:
    """The URL's servers, in the order to try them, and what is known of each."""

    def __init__(
        self, servers: Sequence[HostPort], attrs: SessionAttrs, *, load_balance: bool
    ) -> None:
        self.servers = tuple(servers)
        self.attrs = attrs
        self.load_balance = load_balance
        self.fence = FENCE
        self.states = {server: HostState() for server in self.servers}
        self._last_good: HostPort | None = None
        # Hosts whose connection was lost, until one to them succeeds again:
        # tried last, so that reconnecting does not wait out connect_timeout
        # on a host gone silent before trying the others.
        self._lost: set[HostPort] = set()

    @property
    def several(self) -> bool:
        return len(self.servers) > 1

    def order(self) -> list[HostPort]:
        """The hosts to try: the last good one first, the others in the
        URL's order (``load_balance``: shuffled), those lost last."""
        rest = [server for server in self.servers if server != self._last_good]
        if self.load_balance:
            random.shuffle(rest)
        rest.sort(key=lambda server: server in self._lost)  # (stable)
        return rest if self._last_good is None else [self._last_good, *rest]

    def good(self, server: HostPort) -> None:
        self._last_good = server
        self._lost.discard(server)

    def lost(self, server: HostPort) -> None:
        """A connection to ``server`` broke without being closed by us."""
        self.states[server].generation += 1
        if self.several:
            self._lost.add(server)
        if self._last_good == server:
            self._last_good = None
