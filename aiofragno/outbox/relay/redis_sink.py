"""A Redis Streams sink for the outbox relay (``pip install 'aiofragno[redis]'``).

Each entry becomes one stream entry of ``key`` whose ID is the entry's
versionstamp as ``<version>-<index>`` (its 10-byte commit version and its
2-byte index, in decimal), with one field, ``entry``: the entry as tagged
JSON. Redis orders stream IDs, so ID order is commit order.

Guarantees (the key must be written by this relay only):

* **a prefix, in order**: a batch is added by one Lua script, which Redis
  runs atomically and which stops at the first entry Redis refuses, so a
  batch cut short leaves a prefix of it, never a gap;
* **exactly once**: Redis refuses an ID not above the stream's
  ``last-generated-id``; the script skips such an entry as already there.
  The relay resumes after ``last-generated-id`` (which trimming the stream
  does not lower), so nothing is added twice, however late a retry comes;
  an entry whose ID is refused so is skipped only if the stream holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ValidationError
from ..entry import OutboxEntry
from ..versionstamp import MAX_INDEX, versionstamp
from .sink import RelayError, message_body, missing_extra

# Adds ARGV's (id, body) pairs to KEYS[1] in order. An ID Redis refuses as
# not above the stream's last one is skipped if the stream holds it (added
# before, by a relay that raced this one); any other refusal stops the
# script there. Returns how many it added.
ADD_BATCH = """
local added = 0
for i = 1, #ARGV, 2 do
  local reply = redis.pcall('XADD', KEYS[1], ARGV[i], 'entry', ARGV[i + 1])
  if type(reply) == 'table' and reply.err then
    if not (string.find(reply.err, 'equal or smaller', 1, true)
            and #redis.call('XRANGE', KEYS[1], ARGV[i], ARGV[i]) == 1) then
      return redis.error_reply(reply.err .. ' (at ID ' .. ARGV[i] .. ')')
    end
  else
    added = added + 1
  end
end
return added
"""
MAX_VERSION = 2**64 - 1  # a stream ID's first half


class RedisSink:
    """Adds outbox entries to the Redis stream ``key``.

    ``url``: e.g. ``redis://127.0.0.1:6379/0`` (``rediss://`` for TLS);
    ``client_options``: passed to ``redis.asyncio.Redis.from_url``."""

    asyncio_only = True

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key: str,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValidationError(f"key must be a non-empty str, got {key!r}")
        self.url = url
        self.key = key
        self.client_options = client_options or {}
        self._client: Any = None
        self._script: Any = None

    async def last_published(self) -> str | None:
        """The versionstamp of the stream's ``last-generated-id`` (None if
        the key does not exist yet), after checking that the newest entry
        the stream still holds is one the relay wrote."""
        client = self._connect()
        redis = _redis()
        try:
            info = await client.xinfo_stream(self.key)
        except redis.ResponseError as exc:
            if "no such key" in str(exc):
                return None
            raise RelayError(f"cannot read Redis stream {self.key!r}: {exc}") from exc
        last = _text(info["last-generated-id"])
        newest = info.get("last-entry")
        if newest and not {b"entry", "entry"} & set(newest[1]):
            raise self._foreign(_text(newest[0]))
        return None if last == "0-0" else self._stamp(last)

    async def publish_batch(self, entries: Sequence[OutboxEntry]) -> None:
        if not entries:
            return
        self._connect()
        args: list[str | bytes] = []
        for entry in entries:
            args += [stream_id(entry.versionstamp), message_body(entry)]
        try:
            await self._script(keys=[self.key], args=args)
        except _redis().ResponseError as exc:
            raise RelayError(f"Redis refused an entry of the batch: {exc}") from exc

    async def close(self) -> None:
        client, self._client, self._script = self._client, None, None
        if client is not None:
            await client.aclose()

    def _connect(self) -> Any:
        if self._client is None:
            self._client = _redis().asyncio.Redis.from_url(self.url, **self.client_options)
            self._script = self._client.register_script(ADD_BATCH)
        return self._client

    def _stamp(self, stream_id: str) -> str:
        version, _, index = stream_id.partition("-")
        if not (version.isdigit() and index.isdigit() and int(index) <= MAX_INDEX):
            raise self._foreign(stream_id)
        return versionstamp(int(version), int(index))

    def _foreign(self, stream_id: str) -> RelayError:
        return RelayError(
            f"Redis stream {self.key!r} holds entries the relay did not write (at "
            f"{stream_id}): give the relay a key of its own"
        )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def stream_id(stamp: str) -> str:
    """The Redis stream ID of a versionstamp: ``<version>-<index>``."""
    version, index = int(stamp[:20], 16), int(stamp[20:], 16)
    if version > MAX_VERSION:
        raise RelayError(f"versionstamp {stamp} does not fit a Redis stream ID")
    return f"{version}-{index}"


def _redis() -> Any:
    try:
        import redis
        import redis.asyncio
    except ImportError as exc:
        raise missing_extra("redis", "redis", exc) from exc
    return redis
