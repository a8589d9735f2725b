"""TCP settings for a server connection, whichever driver made it."""

from __future__ import annotations

import asyncio
import socket

from ..url import Options

# Keepalive probes after keepalives_idle: one a second, five unanswered end it.
KEEPALIVE_INTERVAL = 1
KEEPALIVE_COUNT = 5


def tune_socket(transport: asyncio.BaseTransport | None, options: Options) -> None:
    """TCP keepalives and ``TCP_USER_TIMEOUT`` on a TCP connection (not a
    Unix socket), so that a host that vanished without a word (no RST) is
    noticed in seconds, not after the system's minutes of retransmissions."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    # (None: none at all, also where the driver turns them on by itself.)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, options.keepalives_idle is not None)
    if options.keepalives_idle is not None:
        for name, value in (
            ("TCP_KEEPIDLE", max(1, round(options.keepalives_idle))),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if options.tcp_user_timeout is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
        milliseconds = round(options.tcp_user_timeout * 1000)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)
