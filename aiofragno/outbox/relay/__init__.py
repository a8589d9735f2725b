"""The outbox relay: outbox entries published to a message broker in
versionstamp order, with the broker as the durable cursor (see
:mod:`aiofragno.outbox.relay.run`). Sinks: :class:`NatsSink` (NATS
JetStream, extra ``nats``) and :class:`RedisSink` (Redis Streams, extra
``redis``); their client libraries are imported on first use."""

from .nats_sink import NatsSink
from .redis_sink import RedisSink
from .run import relay
from .sink import BrokerSink, OutOfStep, RelayError, SinkNotInstalled
from .urls import sink_for_url

__all__ = [
    "BrokerSink",
    "NatsSink",
    "OutOfStep",
    "RedisSink",
    "RelayError",
    "SinkNotInstalled",
    "relay",
    "sink_for_url",
]
