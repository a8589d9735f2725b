"""What the relay needs of a message broker: :class:`BrokerSink`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ...errors import Error
from ..entry import OutboxEntry


class RelayError(Error):
    """The broker refused or lost what the relay sent, or holds something the
    relay did not write. What it had stored stays; run the relay again once
    the cause is fixed: it resumes after the broker's last entry."""


class OutOfStep(RelayError):
    """The broker's newest message is not the one the sink expected (another
    writer got in between): the relay reads :meth:`BrokerSink.last_published`
    again and carries on from there."""


@runtime_checkable
class BrokerSink(Protocol):
    """A destination for outbox entries (one module per broker).

    The relay calls :meth:`last_published` first and after an
    :class:`OutOfStep`, then :meth:`publish_batch` with the entries that
    follow in versionstamp order, and :meth:`close` when it stops. A sink
    connects on first use, so it can be made outside any event loop.

    A sink must keep two promises, which together make the broker the
    relay's durable cursor:

    * ``publish_batch`` stores a *prefix* of ``entries`` whatever happens
      (an error, a cancellation, a crash): never an entry after one that was
      not stored;
    * ``last_published`` returns the versionstamp of the newest entry stored
      (None before the first), read from the broker.

    ``asyncio_only``: the sink's client runs on asyncio only; under trio the
    relay runs it on a private asyncio loop in a helper thread.
    """

    asyncio_only: bool

    async def last_published(self) -> str | None: ...

    async def publish_batch(self, entries: Sequence[OutboxEntry]) -> None: ...

    async def close(self) -> None: ...


def message_body(entry: OutboxEntry) -> bytes:
    """What a broker message carries: the entry as tagged JSON (see
    :meth:`OutboxEntry.to_json`)."""
    return entry.to_json().encode("utf-8")


class SinkNotInstalled(RelayError, ImportError):
    """The broker's client library is missing: install the extra it names."""


def missing_extra(package: str, extra: str, exc: ImportError) -> SinkNotInstalled:
    return SinkNotInstalled(
        f"the {extra} relay sink needs {package}, which is not installed ({exc.name}): "
        f"pip install 'aiofragno[{extra}]'"
    )
