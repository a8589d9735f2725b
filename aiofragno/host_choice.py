"""Choosing the server to connect to among a URL's hosts, for every backend
that talks to a server: try the hosts in :meth:`Hosts.order
<aiofragno.hosts.Hosts.order>`, ask each server what it is, keep the first
that suits ``target_session_attrs`` and the fence, and say why none did.

A backend gives a :class:`Probe` — how to open a raw connection to one host,
ask it its role (the dialect's SQL), and drop it — and gets back the raw
connection with the backend's own answer (the asyncpg backend reads the
session's name from the same row). Nothing here knows a driver.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import ConnectionLost, DatabaseUnavailable, Error, ReadOnlyDatabase, TLSError
from .hosts import Hosts, HostState, HostStatus, Role, ServerRole, accepts
from .url import DatabaseURL, HostPort, Options, SessionAttrs, describe_host

Raw = TypeVar("Raw")
Answer = TypeVar("Answer")

# Session attributes under which a read-only server is of no use.
WRITABLE: tuple[SessionAttrs, ...] = ("read-write", "primary")
FENCED = (
    "a read-write server older than one this process has seen for the same replication "
    "set (a stale primary: a standby or replica was promoted since), fenced off"
)


def hosts_of(url: DatabaseURL, options: Options) -> Hosts:
    """The URL's hosts, with target_session_attrs' default: "read-write"
    when it names several, else "any"."""
    attrs = options.target_session_attrs or ("read-write" if url.hosts else "any")
    return Hosts(url.servers, attrs, load_balance=options.load_balance_hosts == "random")


class Origin:
    """The server a connection was opened to: the host's state among the
    URL's (:class:`~aiofragno.hosts.Hosts`), and whether it still answers
    a new connection (``answers``, bounded by connect_timeout). A
    connection notes here that it was lost (:meth:`lost`), and is stale
    once another connection to the same host was (:attr:`outdated`): the
    pool replaces it rather than hand it out."""

    __slots__ = ("answers", "generation", "hosts", "server", "state")

    def __init__(
        self, hosts: Hosts, server: HostPort, answers: Callable[[], Awaitable[bool]]
    ) -> None:
        self.hosts = hosts
        self.server = server
        self.state: HostState = hosts.states[server]
        self.generation = self.state.generation
        self.answers = answers

    def describe(self) -> str:
        return describe_host(*self.server)

    def lost(self) -> None:
        """This connection broke without being closed by us."""
        self.hosts.lost(self.server)

    @property
    def outdated(self) -> bool:
        """Another connection to this host was lost since this one opened."""
        return self.generation != self.state.generation


@dataclass(frozen=True, slots=True)
class Probe(Generic[Raw, Answer]):
    """A backend's means to look at one server."""

    open: Callable[[HostPort], Awaitable[Raw]]
    """A raw connection to the server (bounded by connect_timeout)."""
    ask: Callable[[Raw], Awaitable[Answer]]
    """The server's answer to the dialect's role query (bounded as well)."""
    role: Callable[[Answer], ServerRole]
    """What the answer says the server is."""
    drop: Callable[[Raw], None]
    """Drop the raw connection at once (no goodbye that could wait)."""
    lag: Callable[[Raw], Awaitable[float | None]] | None = None
    """A replica's lag in seconds, when the role query cannot tell it
    (asked for :meth:`HostChoice.status` only); None: ``role().replay_lag``."""


class HostChoice(Generic[Raw, Answer]):
    """The host-choice loop and the servers' status for one URL.

    ``follower`` is what the dialect calls a server that replays another's
    log: "standby" (PostgreSQL) or "replica" (MySQL, MariaDB)."""

    def __init__(
        self, url: DatabaseURL, hosts: Hosts, probe: Probe[Raw, Answer], follower: Role
    ) -> None:
        self.url = url
        self.hosts = hosts
        self.probe = probe
        self.follower = follower

    @property
    def attrs(self) -> SessionAttrs:
        return self.hosts.attrs

    @property
    def needed(self) -> bool:
        """Whether there is a choice to make at connect: not for one server
        of any role (nothing to ask it)."""
        return self.hosts.several or self.attrs != "any"

    def origin(self, server: HostPort) -> Origin:
        """The :class:`Origin` of a connection opened to ``server``."""
        return Origin(self.hosts, server, lambda: self.answers(server))

    async def answers(self, server: HostPort) -> bool:
        """Whether ``server`` accepts a new connection (within connect_timeout)."""
        try:
            raw = await self.probe.open(server)
        except Exception:
            return False
        self.probe.drop(raw)
        return True

    async def choose(self) -> tuple[Raw, HostPort, Answer]:
        """A raw connection to the first host, in :meth:`Hosts.order
        <aiofragno.hosts.Hosts.order>`, whose server suits
        target_session_attrs and is not fenced (prefer-standby: the first
        that answered, when no follower did). Raises :class:`ReadOnlyDatabase`
        for a URL of one server that answered but refuses writes wanted of
        it (waiting would not change it), else :class:`DatabaseUnavailable`
        listing each host's reason (retried until reconnect_deadline: a
        follower may be promoted meanwhile); a TLS failure at once."""
        probe, hosts = self.probe, self.hosts
        refusals: list[str] = []
        fallback: tuple[Raw, HostPort, Answer] | None = None
        try:
            for server in hosts.order():
                asked = await self._ask(server, refusals)
                if asked is None:
                    continue
                raw, answer = asked
                why = self._unsuitable(probe.role(answer))
                if why is None:
                    hosts.good(server)
                    return raw, server, answer
                if self.attrs == "prefer-standby" and fallback is None and why != FENCED:
                    fallback = (raw, server, answer)
                else:
                    probe.drop(raw)
                refusals.append(f"{describe_host(*server)}: {why}")
            if fallback is not None:
                chosen, fallback = fallback, None
                hosts.good(chosen[1])
                return chosen
        finally:
            if fallback is not None:
                probe.drop(fallback[0])
        raise self._no_server(refusals)

    async def _ask(self, server: HostPort, refusals: list[str]) -> tuple[Raw, Answer] | None:
        """A raw connection to ``server`` and its answer, or None with the
        reason noted in ``refusals``."""
        probe = self.probe
        try:
            raw = await probe.open(server)
        except TLSError:
            raise
        except Exception as exc:
            refusals.append(f"{describe_host(*server)}: {type(exc).__name__}: {exc}")
            return None
        try:
            return raw, await probe.ask(raw)
        except BaseException as exc:
            probe.drop(raw)
            if not isinstance(exc, Exception):
                raise
            refusals.append(f"{describe_host(*server)}: {type(exc).__name__}: {exc}")
            return None

    def _unsuitable(self, role: ServerRole) -> str | None:
        """Why a server of ``role`` is not used, or None when it is."""
        if not self.hosts.fence.admits(role):
            return FENCED
        if accepts(self.attrs, role):
            return None
        kind = f"a {self.follower}" if role.standby else "read-only" if role.read_only else None
        return f"{kind or 'a primary'}, not what target_session_attrs={self.attrs} asks for"

    def _no_server(self, refusals: list[str]) -> Error:
        listed = "; ".join(refusals)
        if not self.url.hosts and self.attrs in WRITABLE and "not what" in listed:
            return ReadOnlyDatabase(
                f"{self.url.describe()} refuses writes ({listed}); point the URL at the "
                f"primary, or list the primary and its {self.follower}s "
                "(host1:port1,host2:port2) to follow failovers"
            )
        return DatabaseUnavailable(
            f"no server of {self.url.describe()} is usable with "
            f"target_session_attrs={self.attrs}: {listed}"
        )

    async def servers(self) -> list[HostStatus]:
        """Each server asked afresh (a connection of its own, dropped after)."""
        return [await self.status(server) for server in self.hosts.servers]

    async def status(self, server: HostPort) -> HostStatus:
        probe = self.probe
        try:
            raw = await probe.open(server)
            try:
                role = probe.role(await probe.ask(raw))
                lag = role.replay_lag if probe.lag is None else await probe.lag(raw)
            finally:
                probe.drop(raw)
        except Exception as exc:
            return HostStatus(*server, role=None, error=f"{type(exc).__name__}: {exc}")
        return HostStatus(
            *server,
            role=self.follower if role.standby else "primary",
            read_only=role.read_only,
            timeline=role.timeline,
            replay_lag=lag,
            fenced=not self.hosts.fence.admits(role),
        )

    def read_only_elsewhere(self, error: Exception) -> Exception:
        """``error`` as the statement's caller should see it: a read-only
        refusal on a URL of several hosts, wanting writes, becomes
        :class:`ConnectionLost` — a primary made read-only since we connected
        (fenced by a failover tool, or demoted): nothing was written, another
        host may take the work, so the connection goes and a new one is
        chosen, within reconnect_deadline."""
        if isinstance(error, ReadOnlyDatabase) and self.hosts.several and self.attrs in WRITABLE:
            return ConnectionLost(
                f"{error}; the server turned read-only since this connection was opened: "
                "choosing another of the URL's hosts",
                sqlstate=error.sqlstate,
            )
        return error
