"""A sink from a broker URL (what ``aiofragno outbox relay --to`` takes)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ...errors import ValidationError
from .nats_sink import NatsSink
from .redis_sink import RedisSink
from .sink import BrokerSink

NATS_SCHEMES = {"nats", "tls", "ws", "wss"}
REDIS_SCHEMES = {"redis", "rediss", "unix"}


def sink_for_url(url: str, subject: str, **options: Any) -> BrokerSink:
    """:class:`NatsSink` for ``nats://``, ``tls://``, ``ws(s)://`` URLs
    (``subject``: the subject; ``options``: ``stream``, ``max_in_flight``,
    ``ack_timeout``...), :class:`RedisSink` for ``redis://``, ``rediss://``,
    ``unix://`` ones (``subject``: the stream's key)."""
    scheme = urlsplit(url).scheme
    if scheme in NATS_SCHEMES:
        return NatsSink(url, subject=subject, **options)
    if scheme in REDIS_SCHEMES:
        return RedisSink(url, key=subject, **options)
    known = ", ".join(f"{s}://" for s in sorted(NATS_SCHEMES | REDIS_SCHEMES))
    raise ValidationError(f"no relay sink for {url!r}: expected one of {known}")
