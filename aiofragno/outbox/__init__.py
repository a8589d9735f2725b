"""The transactional outbox: one entry per committed unit of work, written in
the unit's own transaction, read in commit order."""

from .consumer import Consumer, ConsumerHalted, DeadLetter
from .entry import OutboxEntry
from .reader import OutboxReader
from .relay import BrokerSink, NatsSink, RedisSink, RelayError
from .versionstamp import versionstamp

__all__ = [
    "BrokerSink",
    "Consumer",
    "ConsumerHalted",
    "DeadLetter",
    "NatsSink",
    "OutboxEntry",
    "OutboxReader",
    "RedisSink",
    "RelayError",
    "versionstamp",
]
