"""A NATS JetStream sink for the outbox relay (``pip install 'aiofragno[nats]'``).

Each entry becomes one message on ``subject`` (a string, or a function of
the entry) in a stream that captures it, with the entry's versionstamp as
its ``Nats-Msg-Id``; the body is the entry as tagged JSON.

Guarantees (the stream must be written by this relay only):

* **a prefix, in order**: messages go out back to back on one connection,
  at most ``max_in_flight`` awaiting their acknowledgement, each carrying
  ``Nats-Expected-Last-Sequence`` — the stream sequence it must follow. The
  server stores a message only if the one before it was stored, so a batch
  cut short (a refusal, a lost connection, a cancellation, a crash) leaves a
  prefix of it in the stream, never a gap;
* **effectively once**: the relay resumes after the stream's newest message
  (its ``Nats-Msg-Id``), so nothing the stream holds is sent again; a message
  whose acknowledgement was lost and that is sent again anyway is dropped by
  the server as a duplicate (within the stream's duplicate window) or
  refused by the sequence check (after it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ValidationError
from ..consumer import MAX_SECONDS, _seconds
from ..entry import OutboxEntry
from ..versionstamp import check_versionstamp
from .sink import OutOfStep, RelayError, message_body, missing_extra

Subject = str | Callable[[OutboxEntry], str]

# JetStream's error code for a failed Nats-Expected-Last-Sequence check.
WRONG_LAST_SEQUENCE = 10071


class NatsSink:
    """Publishes outbox entries to a NATS JetStream stream.

    ``url``: the NATS server(s), e.g. ``nats://127.0.0.1:4222`` (a list or a
    comma-separated string for a cluster); ``subject``: the subject, or a
    function giving an entry's subject (then ``stream`` is required);
    ``stream``: the stream's name (default: the stream capturing
    ``subject``); ``max_in_flight``: messages awaiting acknowledgement at
    once (1..65536); ``ack_timeout``: seconds to wait for one;
    ``connect_options``: passed to ``nats.connect`` (credentials, TLS...)."""

    asyncio_only = True

    def __init__(
        self,
        url: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        subject: Subject,
        stream: str | None = None,
        max_in_flight: int = 256,
        ack_timeout: float = 10.0,
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        if not (isinstance(subject, str) and subject) and not callable(subject):
            raise ValidationError(f"subject must be a non-empty str or a function, got {subject!r}")
        if callable(subject) and stream is None:
            raise ValidationError("a subject function needs stream= (the stream to resume from)")
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or not 1 <= max_in_flight <= 65536
        ):
            raise ValidationError(
                f"max_in_flight must be an int in 1..65536, got {max_in_flight!r}"
            )
        self.servers = url.split(",") if isinstance(url, str) else list(url)
        self.subject = subject
        self.stream = stream
        self.max_in_flight = max_in_flight
        self.ack_timeout = _seconds("ack_timeout", ack_timeout, 0.001, MAX_SECONDS)
        self.connect_options = connect_options or {}
        self._nc: Any = None
        self._js: Any = None
        self._last_seq: int | None = None  # the stream's, as this sink last saw it
        self._acks: dict[str, _Ack] = {}
        self._inbox = ""
        self._tokens = itertools.count()

    async def last_published(self) -> str | None:
        """The ``Nats-Msg-Id`` of the stream's newest message (None if empty)."""
        js, stream = await self._stream()
        info = await js.stream_info(stream)
        self._last_seq = last = info.state.last_seq
        if not last:
            return None
        try:
            message = await js.get_msg(stream, last)
        except _nats().js.errors.NotFoundError:
            raise RelayError(
                f"the newest message of stream {stream!r} (sequence {last}) is gone (its "
                "limits removed it?), so where to resume is unknown: pass after= the "
                "versionstamp to resume after"
            ) from None
        stamp = (message.headers or {}).get("Nats-Msg-Id")
        try:
            return check_versionstamp(stamp, f"Nats-Msg-Id of message {last}")
        except ValidationError:
            raise RelayError(
                f"stream {stream!r} holds messages the relay did not write (sequence {last} "
                f"has Nats-Msg-Id {stamp!r}): give the relay a stream of its own"
            ) from None

    async def publish_batch(self, entries: Sequence[OutboxEntry]) -> None:
        """Publish ``entries`` in order (see the module docstring)."""
        if not entries:
            return
        js, stream = await self._stream()
        if self._last_seq is None:
            self._last_seq = (await js.stream_info(stream)).state.last_seq
        acks: list[_Ack] = []
        # Acknowledgements are awaited a quarter window at a time, so that
        # messages go out in bursts (one socket write each), not one by one.
        step, settled = max(1, self.max_in_flight // 4), 0
        try:
            for n, entry in enumerate(entries):
                if n - settled >= self.max_in_flight:
                    settled = await self._settle(acks, settled, settled + step)
                acks.append(await self._send(entry, stream, self._last_seq + n))
            await self._settle(acks, settled, len(acks))
        except BaseException:
            self._last_seq = None  # read it again: part of the batch may be stored
            raise
        finally:
            for ack in acks:
                self._acks.pop(ack.token, None)
        self._last_seq += len(entries)

    async def close(self) -> None:
        nc, self._nc, self._js, self._last_seq = self._nc, None, None, None
        self._acks.clear()
        if nc is not None:
            await nc.close()

    # Not nats-py's js.publish_async: up to 2.16 at least, a refused message
    # (e.g. a failed sequence check) raises inside its reply handler and
    # leaves the message's future pending for ever. So: plain publishes with
    # a reply subject of this sink's own, and the replies matched here.
    async def _send(self, entry: OutboxEntry, stream: str, after: int) -> _Ack:
        ack = _Ack(f"{self._inbox}.{next(self._tokens)}", entry.versionstamp)
        self._acks[ack.token] = ack
        subject = self.subject if isinstance(self.subject, str) else self.subject(entry)
        headers = {
            "Nats-Msg-Id": entry.versionstamp,
            "Nats-Expected-Stream": stream,
            "Nats-Expected-Last-Sequence": str(after),
        }
        await self._nc.publish(subject, message_body(entry), reply=ack.token, headers=headers)
        return ack

    async def _settle(self, acks: list[_Ack], start: int, end: int) -> int:
        """Wait for ``acks[start:end]`` in order; raise the first failure's
        error. Returns ``end``."""
        for ack in acks[start:end]:
            if not ack.done.done():
                try:
                    await asyncio.wait_for(ack.done, self.ack_timeout)
                except TimeoutError:
                    raise RelayError(
                        f"JetStream did not acknowledge {ack.versionstamp} within "
                        f"{self.ack_timeout}s"
                    ) from None
            if ack.error is not None:
                raise ack.error
        return end

    def _on_reply(self, message: Any) -> None:
        ack = self._acks.get(message.subject)
        if ack is None:
            return  # a late reply to a batch that was given up
        ack.error = _reply_error(message, ack.versionstamp)
        if not ack.done.done():
            ack.done.set_result(None)

    async def _stream(self) -> tuple[Any, str]:
        if self._nc is None:
            nats = _nats()
            nc = await nats.connect(servers=self.servers, **self.connect_options)
            self._inbox = nc.new_inbox()

            async def on_reply(message: Any) -> None:
                self._on_reply(message)

            await nc.subscribe(f"{self._inbox}.*", cb=on_reply)
            self._nc, self._js = nc, nc.jetstream()
        if self.stream is None:
            assert isinstance(self.subject, str)
            try:
                self.stream = await self._js.find_stream_name_by_subject(self.subject)
            except _nats().js.errors.NotFoundError:
                raise RelayError(
                    f"no JetStream stream captures subject {self.subject!r}: create one "
                    f"(e.g. `nats stream add NAME --subjects {self.subject!r}`)"
                ) from None
        return self._js, self.stream


class _Ack:
    """The acknowledgement of one message, once it arrives."""

    __slots__ = ("done", "error", "token", "versionstamp")

    def __init__(self, token: str, versionstamp: str) -> None:
        self.token = token
        self.versionstamp = versionstamp
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.error: Exception | None = None


def _reply_error(message: Any, versionstamp: str) -> Exception | None:
    """None if ``message`` acknowledges the entry as stored (or as a
    duplicate of a stored one), else the error to raise."""
    if message.data[:1] == b"{" and b'"error"' not in message.data:
        return None  # {"stream": ..., "seq": ...}: stored (or a duplicate)
    headers = message.headers or {}
    if headers.get("Status") == "503":
        return RelayError(
            f"no JetStream stream answered for {versionstamp} (no responders): "
            "is its subject captured by the stream?"
        )
    try:
        reply = json.loads(message.data)
    except ValueError:
        return RelayError(f"JetStream answered {message.data!r:.200} for {versionstamp}")
    error = reply.get("error")
    if error is None:
        return None
    if error.get("err_code") == WRONG_LAST_SEQUENCE:
        return OutOfStep(f"JetStream refused {versionstamp}: {error.get('description')}")
    return RelayError(f"JetStream refused {versionstamp}: {error.get('description', error)}")


def _nats() -> Any:
    try:
        import nats
        import nats.js.errors
    except ImportError as exc:
        raise missing_extra("nats-py", "nats", exc) from exc
    return nats
