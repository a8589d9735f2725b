"""Real network faults for tests: a TCP proxy between a client and a database
server that can cut, stall, refuse and selectively drop connections.

Written with anyio, so it runs under asyncio and trio alike. Every relayed
connection is served by tasks in the proxy's own task group; under trio the
proxy runs on the trio loop while asyncpg/asyncmy run on the asyncio bridge's
thread — that is fine, they only share TCP.

::

    async with tcp_proxy("127.0.0.1", 5432) as proxy:
        db = await af.connect(f"postgresql://postgres@127.0.0.1:{proxy.port}/test")
        proxy.cut_all()                       # close every relayed connection now
        proxy.stall(True)                     # hold every byte (a black hole)...
        proxy.stall(False)                    # ...and deliver it after all
        proxy.refuse(True)                    # new connections are refused (ECONNREFUSED)
        proxy.delay_close(1.0)                # pass the server's FIN on a second late
        proxy.drop_after(b"COMMIT", forward=True)   # lose the reply to the next COMMIT
        proxy.hold_after(b"COMMIT")           # the server reads the next COMMIT late...
        await proxy.release_held()            # ...now, after the client gave up on it
        proxy.delay(0.03)                     # every byte arrives 30 ms late (latency)

``drop_after(marker, forward)`` arms the proxy once: the next client->server
chunk that contains ``marker`` is forwarded to the server (``forward=True``;
the proxy then waits for the server's reply, swallows it, and closes the
connection: "lost during COMMIT", the server did commit) or not forwarded
(``forward=False``: "lost before the statement reached the server"), and the
connection is closed on both sides. ``await proxy.dropped.wait()`` waits until
that happened; ``proxy.drops`` counts how often.

``hold_after(marker)`` arms the proxy once as well: the next client->server
chunk containing ``marker`` is kept back and the client's side is closed at
once, while the server's side stays open and idle — the server has not read
the chunk yet. ``release_held()`` delivers it late, waits for the server's
answer (or its close) and closes the connection.

``delay(seconds)`` adds latency, not a bandwidth limit, to the connections
opened after it: each chunk, in either direction, is delivered ``seconds``
after the proxy received it, in order, however many follow it meanwhile (a
WAN link, or a replica streaming its primary's log from afar); what a side
sent before closing is delivered before the close. A later ``delay()``
changes the latency of those connections too (0: none). They are plain
relays otherwise: stall, drop_after and hold_after do not act on them.
"""

from __future__ import annotations

import math
import socket
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

import aiofragno as af

# How long a forwarded "drop" chunk waits for the server's reply before the
# connection is closed anyway.
REPLY_WAIT = 5.0
_CHUNK = 65536


@dataclass(eq=False)
class _Link:
    """One relayed connection: client <-> proxy <-> server."""

    client: anyio.abc.SocketStream
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    server: anyio.abc.SocketStream | None = None
    upstream_port: int | None = None
    # After a forwarded drop: the server's reply is swallowed, never relayed.
    swallow: bool = False
    reply: anyio.Event = field(default_factory=anyio.Event)
    reset: bool = False
    # A chunk kept back (hold_after): the server side outlives the link.
    held: bytes | None = None

    def cut(self, *, reset: bool = False) -> None:
        self.reset = self.reset or reset
        self.scope.cancel()


class Proxy:
    """A running proxy; see the module docstring. Only its own task group
    touches sockets, so the methods here are synchronous and safe to call from
    the test's task."""

    def __init__(self, host: str, port: int, target_host: str, target_port: int) -> None:
        self.host = host
        self.port = port
        self.target_host = target_host
        self.target_port = target_port
        self.accepted = 0  # connections accepted since the start
        self.drops = 0  # drop_after triggers so far
        self.dropped = anyio.Event()  # set by the first drop_after trigger
        self._links: set[_Link] = set()
        self._tg: anyio.abc.TaskGroup | None = None
        self._stalled = False
        self._flowing = anyio.Event()
        self._flowing.set()
        self._refusing = False
        self._accepting = anyio.Event()
        self._accepting.set()
        self._listening = anyio.Event()
        self._accept_scope: anyio.CancelScope | None = None
        # (markers still to drop at, first the next one; forward; wait_reply)
        self._drop: tuple[tuple[bytes, ...], bool, bool] | None = None
        self._hold: bytes | None = None
        self._held: list[tuple[anyio.abc.SocketStream, bytes]] = []
        self._link_closed = anyio.Event()  # set (and replaced) whenever a link ends
        self._close_delay = 0.0
        self._latency = 0.0
        self._delayed = False  # whether new connections relay through the delay

    def __repr__(self) -> str:
        return (
            f"<Proxy 127.0.0.1:{self.port} -> {self.target_host}:{self.target_port} "
            f"links={len(self._links)} stalled={self._stalled} refusing={self._refusing}>"
        )

    # -- controls ---------------------------------------------------------

    @property
    def connections(self) -> int:
        """Relayed connections open now."""
        return len(self._links)

    def upstream_ports(self) -> set[int]:
        """The local ports of the proxy's connections to the server: what the
        server sees as its clients' ports (PostgreSQL ``client_port``, MariaDB
        ``processlist.HOST``)."""
        return {link.upstream_port for link in self._links if link.upstream_port is not None}

    def cut_all(self, *, reset: bool = False) -> int:
        """Close every relayed connection now, on both sides (``reset``: with
        a TCP RST instead of a FIN). Returns how many were cut."""
        links = list(self._links)
        for link in links:
            link.cut(reset=reset)
        return len(links)

    def stall(self, stalled: bool) -> None:
        """Stop (True) or resume (False) relaying bytes in both directions.
        Connections stay open; bytes received meanwhile are delivered on resume."""
        if stalled and not self._stalled:
            self._flowing = anyio.Event()
        elif not stalled and self._stalled:
            self._flowing.set()
        self._stalled = stalled

    def delay_close(self, seconds: float) -> None:
        """When the server closes a connection, pass the close on to the client
        only ``seconds`` later (what the server sent before closing is relayed
        at once): the client learns late that its connection is gone."""
        self._close_delay = seconds

    def delay(self, seconds: float) -> None:
        """Deliver every chunk ``seconds`` late (see the module docstring)."""
        self._latency = seconds
        self._delayed = self._delayed or seconds > 0

    def refuse(self, refusing: bool) -> None:
        """Refuse new connections (the listening socket is closed, so clients
        get ECONNREFUSED) or accept them again. Open connections are not
        touched: combine with :meth:`cut_all` for "the server went away"."""
        if refusing and not self._refusing:
            self._accepting = anyio.Event()
            self._listening = anyio.Event()
            if self._accept_scope is not None:
                self._accept_scope.cancel()
        elif not refusing and self._refusing:
            self._accepting.set()
        self._refusing = refusing

    async def wait_closed(self) -> None:
        """Wait until no relayed connection is open (e.g. after :meth:`cut_all`)."""
        while self._links:
            await self._link_closed.wait()

    async def wait_listening(self) -> None:
        """Wait until the proxy accepts connections (after ``refuse(False)``)."""
        await self._listening.wait()

    def drop_after(
        self, marker: bytes, forward: bool, *, wait_reply: bool = True, then: Sequence[bytes] = ()
    ) -> None:
        """Arm a one-shot drop of the next client->server chunk containing
        ``marker`` (see the module docstring); with ``then``, after it, of the
        next chunk containing each of those in turn (each on whichever
        connection carries it). With ``forward`` and ``wait_reply=False`` the
        connection is closed right after the chunk is sent on, without waiting
        for the server to answer (the statement may still be running on the
        server when the client sees the loss)."""
        self._drop = ((marker, *then), forward, wait_reply)
        if self.dropped.is_set():
            self.dropped = anyio.Event()

    def hold_after(self, marker: bytes) -> None:
        """Keep back the next client->server chunk containing ``marker`` and
        close the client's side (see the module docstring)."""
        self._hold = marker

    @property
    def held(self) -> int:
        """Chunks kept back by :meth:`hold_after`, not yet released."""
        return len(self._held)

    async def release_held(self) -> list[bytes]:
        """Deliver every kept-back chunk to the server, wait (up to
        ``REPLY_WAIT``) for its answer or its close, and close those
        connections. Returns what the server answered to each ("" where it
        had already closed the connection)."""
        held, self._held = self._held, []
        answers = []
        for server, chunk in held:
            answer = b""
            with suppress(
                anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError
            ):
                await server.send(chunk)
                with anyio.move_on_after(REPLY_WAIT):
                    answer = await server.receive(_CHUNK)
            await anyio.aclose_forcefully(server)
            answers.append(answer)
        return answers

    def disarm(self) -> None:
        self._drop = None
        self._hold = None

    @property
    def armed(self) -> bool:
        return self._drop is not None

    # -- the relay --------------------------------------------------------

    async def _listen(self, listener: anyio.abc.SocketListener | None) -> None:
        assert self._tg is not None
        while True:
            while self._refusing:
                await self._accepting.wait()
            if listener is None:
                listener = await self._bind()
            async with listener:
                with anyio.CancelScope() as scope:
                    self._accept_scope = scope
                    if self._refusing:
                        scope.cancel()
                    self._listening.set()
                    while True:
                        client = await listener.accept()
                        self.accepted += 1
                        self._tg.start_soon(self._relay, client)
                self._accept_scope = None
            listener = None

    async def _bind(self) -> anyio.abc.SocketListener:
        # The same port again (SO_REUSEADDR is set by anyio); retry briefly in
        # case the old socket is still being torn down.
        for attempt in range(50):
            try:
                multi = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
            except OSError:
                if attempt == 49:
                    raise
                await anyio.sleep(0.02)
                continue
            return multi.listeners[0]  # type: ignore[return-value]
        raise AssertionError("unreachable")

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        link = _Link(client)
        self._links.add(link)
        try:
            with link.scope:
                try:
                    link.server = await anyio.connect_tcp(self.target_host, self.target_port)
                except OSError:
                    return  # server down: the client sees its connection closed
                link.upstream_port = link.server.extra(SocketAttribute.local_port)
                async with anyio.create_task_group() as tg:
                    if self._delayed:
                        for source, sink in ((client, link.server), (link.server, client)):
                            late, due = anyio.create_memory_object_stream[tuple[float, bytes]](
                                math.inf
                            )
                            tg.start_soon(self._pump_late, source, late)
                            tg.start_soon(self._deliver, link, due, sink)
                    else:
                        tg.start_soon(self._pump, link, client, link.server, True)
                        tg.start_soon(self._pump, link, link.server, client, False)
        finally:
            if link.reset:
                _linger_zero(client)
            await anyio.aclose_forcefully(client)
            if link.server is not None and link.held is not None:
                self._held.append((link.server, link.held))
            elif link.server is not None:
                await anyio.aclose_forcefully(link.server)
            self._links.discard(link)
            self._link_closed.set()
            self._link_closed = anyio.Event()

    async def _pump(
        self,
        link: _Link,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        upstream: bool,
    ) -> None:
        tail = b""  # the end of the previous chunk, for markers split across chunks
        try:
            while True:
                try:
                    chunk = await source.receive(_CHUNK)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    if not upstream and self._close_delay:
                        await anyio.sleep(self._close_delay)
                    return
                while self._stalled:
                    await self._flowing.wait()
                if not upstream and link.swallow:
                    link.reply.set()  # the server answered: drop the answer
                    continue
                if upstream and self._hold is not None and self._hold in chunk:
                    self._hold = None
                    link.held = chunk
                    return
                if upstream and self._drop is not None:
                    (marker, *rest), forward, wait_reply = self._drop
                    seen = tail + chunk
                    tail = seen[-(len(marker) - 1) :] if len(marker) > 1 else b""
                    if marker in seen:
                        self._drop = (tuple(rest), forward, wait_reply) if rest else None
                        await self._drop_link(link, sink, chunk, forward, wait_reply)
                        return
                try:
                    await sink.send(chunk)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return
        finally:
            # Either side closing (or failing) ends the whole connection.
            link.scope.cancel()

    async def _pump_late(
        self,
        source: anyio.abc.SocketStream,
        late: anyio.abc.ObjectSendStream[tuple[float, bytes]],
    ) -> None:
        """Queue each chunk from ``source`` with the time it is due; at the
        source's end, close the queue (its deliverer ends the connection
        once the queue is empty)."""
        async with late:
            while True:
                try:
                    chunk = await source.receive(_CHUNK)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return
                try:
                    late.send_nowait((anyio.current_time() + self._latency, chunk))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return

    async def _deliver(
        self,
        link: _Link,
        due: anyio.abc.ObjectReceiveStream[tuple[float, bytes]],
        sink: anyio.abc.SocketStream,
    ) -> None:
        """Send on what :meth:`_pump_late` queued, each chunk at its time."""
        try:
            async with due:
                async for at, chunk in due:
                    if at > anyio.current_time():
                        await anyio.sleep_until(at)
                    try:
                        await sink.send(chunk)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        return
        finally:
            link.scope.cancel()

    async def _drop_link(
        self,
        link: _Link,
        server: anyio.abc.SocketStream,
        chunk: bytes,
        forward: bool,
        wait_reply: bool,
    ) -> None:
        if forward:
            link.swallow = True
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await server.send(chunk)
                if wait_reply:
                    with anyio.move_on_after(REPLY_WAIT):
                        await link.reply.wait()
        self.drops += 1
        self.dropped.set()


def _linger_zero(stream: anyio.abc.SocketStream) -> None:
    with suppress(OSError):
        raw = stream.extra(SocketAttribute.raw_socket)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[Proxy]:
    """A proxy listening on 127.0.0.1:<free port> (``proxy.port``) that relays
    to ``target_host:target_port`` until the block exits."""
    multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    listener: anyio.abc.SocketListener = multi.listeners[0]  # type: ignore[assignment]
    port = listener.extra(SocketAttribute.local_port)
    proxy = Proxy("127.0.0.1", port, target_host, target_port)
    try:
        async with anyio.create_task_group() as tg:
            proxy._tg = tg
            tg.start_soon(proxy._listen, listener)
            try:
                yield proxy
            finally:
                tg.cancel_scope.cancel()
    finally:
        # (Outside the task group, whose cancellation would swallow the
        # exception on its way out.)
        for server, _ in proxy._held:
            await anyio.aclose_forcefully(server)


async def terminate_postgres_backend(url: str, pid: int) -> None:
    """``pg_terminate_backend(pid)`` from a connection of its own; waits (up to
    5 s) until the backend has exited."""
    async with af.connect(url, pool_size=1) as admin:
        done = await admin.fetch_value(af.sql("SELECT pg_terminate_backend({p}, 5000)", p=pid))
        assert done is True, f"backend {pid} did not exit"


async def kill_mysql_connection(url: str, connection_id: int) -> None:
    """MariaDB/MySQL ``KILL`` from a connection of its own; waits until the
    killed thread is gone (it exits asynchronously)."""
    async with af.connect(url, pool_size=1) as admin:
        await admin.execute(af.sql(f"KILL {int(connection_id)}"))
        gone = af.sql(
            "SELECT count(*) = 0 FROM information_schema.processlist WHERE id = {i}",
            i=connection_id,
        )
        for _ in range(500):
            if await admin.fetch_value(gone):
                return
            await anyio.sleep(0.01)
        raise AssertionError(f"connection {connection_id} still alive after KILL")
