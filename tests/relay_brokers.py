"""The message brokers the relay tests publish to: the shared NATS JetStream
(127.0.0.1:4222) and Redis (127.0.0.1:6379) servers, each test on a stream
or key of its own, deleted afterwards.

What a test reads back, it reads as a broker's own consumer would — a
JetStream pull consumer, Redis ``XRANGE`` — on a fresh connection in a
thread with an asyncio loop of its own, so the tests run under trio too.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest

import aiofragno as af

NATS_URL = os.environ.get("AIOFRAGNO_TEST_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("AIOFRAGNO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass(frozen=True)
class Message:
    """One message as a broker consumer sees it."""

    id: str  # Nats-Msg-Id, or the versionstamp of the Redis stream ID
    body: bytes
    subject: str  # NATS: the message's subject; Redis: the key


class Broker(Protocol):
    name: str
    url: str
    subject: str  # the NATS subject or the Redis key

    def sink(self, **options: Any) -> af.BrokerSink: ...
    def create(self) -> None: ...
    def delete(self) -> None: ...
    def read(self) -> list[Message]: ...
    def add_foreign(self) -> None: ...


class Nats:
    name = "nats"
    url = NATS_URL

    def __init__(self) -> None:
        self.stream = f"relay_{uuid.uuid4().hex[:12]}"
        self.subject = f"{self.stream}.entries"

    def sink(self, **options: Any) -> af.NatsSink:
        return af.NatsSink(self.url, subject=self.subject, **options)

    def create(self, duplicate_window: float = 120.0) -> None:
        asyncio.run(
            self._on_js(
                lambda js: js.add_stream(
                    name=self.stream,
                    subjects=[f"{self.stream}.>"],
                    duplicate_window=duplicate_window,
                )
            )
        )

    def delete(self) -> None:
        asyncio.run(self._on_js(lambda js: js.delete_stream(self.stream)))

    def add_foreign(self) -> None:
        """A message of someone else's (no versionstamp for its id)."""
        asyncio.run(self._on_js(lambda js: js.publish(self.subject, b"{}")))

    def read(self) -> list[Message]:
        """Every message of the stream, through an ephemeral pull consumer."""
        return asyncio.run(self._on_js(self._read))

    async def _read(self, js: Any) -> list[Message]:
        expected = (await js.stream_info(self.stream)).state.messages
        subscription = await js.pull_subscribe(f"{self.stream}.>", stream=self.stream)
        found: list[Message] = []
        try:
            while len(found) < expected:
                batch = await subscription.fetch(min(500, expected - len(found)), timeout=5)
                found += [Message(m.headers["Nats-Msg-Id"], m.data, m.subject) for m in batch]
            return found
        finally:
            await subscription.unsubscribe()

    async def _on_js(self, use: Any) -> Any:
        import nats

        nc = await nats.connect(self.url)
        try:
            return await use(nc.jetstream())
        finally:
            await nc.close()


class Redis:
    name = "redis"
    url = REDIS_URL

    def __init__(self) -> None:
        self.subject = f"relay_{uuid.uuid4().hex[:12]}"

    def sink(self, **options: Any) -> af.RedisSink:
        options.pop("max_in_flight", None)  # a Redis batch is one script call
        return af.RedisSink(self.url, key=self.subject, **options)

    def create(self) -> None:
        pass  # XADD creates the key

    def delete(self) -> None:
        asyncio.run(self._on_client(lambda client: client.delete(self.subject)))

    def add_foreign(self) -> None:
        """An entry of someone else's (an ID of Redis's choosing)."""
        asyncio.run(self._on_client(lambda client: client.xadd(self.subject, {"x": "1"})))

    def read(self) -> list[Message]:
        return asyncio.run(self._on_client(self._read))

    async def _read(self, client: Any) -> list[Message]:
        from aiofragno.outbox.versionstamp import versionstamp

        found = []
        for stream_id, fields in await client.xrange(self.subject, "-", "+"):
            version, index = stream_id.decode().split("-")
            stamp = versionstamp(int(version), int(index))
            found.append(Message(stamp, fields[b"entry"], self.subject))
        return found

    async def _on_client(self, use: Any) -> Any:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(self.url)
        try:
            return await use(client)
        finally:
            await client.aclose()


BROKERS = {"nats": Nats, "redis": Redis}


def unavailable_reason(name: str) -> str | None:
    module = {"nats": "nats", "redis": "redis"}[name]
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install 'aiofragno[{name}]')"
    parts = urlsplit(BROKERS[name].url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return None
    except OSError:
        return f"no {name} server answers at {parts.netloc} (.ci/run starts one)"


def require_broker(name: str) -> None:
    """Skip when ``name``'s server or client is missing; fail instead when
    ``AIOFRAGNO_REQUIRE_BACKENDS`` names it (as CI does)."""
    reason = unavailable_reason(name)
    if reason is None:
        return
    required = {n.strip() for n in os.environ.get("AIOFRAGNO_REQUIRE_BACKENDS", "").split(",")}
    if name in required:
        pytest.fail(f"{reason}; AIOFRAGNO_REQUIRE_BACKENDS requires {name}")
    pytest.skip(reason)


def check_delivered(messages: Sequence[Message], entries: Sequence[af.OutboxEntry]) -> None:
    """The broker holds exactly ``entries``: each once, in versionstamp
    order, each body the entry's JSON."""
    ids = [m.id for m in messages]
    assert len(ids) == len(set(ids)), "a message was published twice"
    assert all(a < b for a, b in itertools.pairwise(ids)), "out of order"
    assert ids == [e.versionstamp for e in entries]
    assert [m.body for m in messages] == [e.to_json().encode() for e in entries]
