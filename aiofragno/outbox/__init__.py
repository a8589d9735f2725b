"""The transactional outbox: one entry per committed unit of work, written in
the unit's own transaction, read in commit order."""

from .consumer import Consumer, ConsumerHalted, DeadLetter
from .entry import OutboxEntry
from .reader import OutboxReader
from .versionstamp import versionstamp

__all__ = [
    "Consumer",
    "ConsumerHalted",
    "DeadLetter",
    "OutboxEntry",
    "OutboxReader",
    "versionstamp",
]
