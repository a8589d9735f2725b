"""The relay's sinks without a broker: arguments checked when given, the
extra to install named when a client library is missing, Redis stream IDs
that sort as versionstamps do, broker URLs to sinks."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

import aiofragno as af
from aiofragno.outbox.relay import SinkNotInstalled, sink_for_url
from aiofragno.outbox.relay.redis_sink import stream_id
from aiofragno.outbox.versionstamp import versionstamp


@pytest.mark.parametrize(
    ("make", "extra"),
    [
        (lambda: af.NatsSink(subject="s"), "nats"),
        (lambda: af.RedisSink(key="k"), "redis"),
    ],
)
def test_a_missing_client_names_the_extra(
    make: object, extra: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for module in ("nats", "nats.js.errors", "redis", "redis.asyncio"):
        monkeypatch.setitem(sys.modules, module, None)
    sink = make()  # type: ignore[operator]

    async def relay() -> None:
        async with af.connect(f"sqlite:///{tmp_path}/x.db", outbox=True) as db:
            await db.outbox.relay(sink, until_caught_up=True)

    with pytest.raises(SinkNotInstalled, match=rf"pip install 'aiofragno\[{extra}\]'"):
        anyio.run(relay)


def test_sink_arguments_are_checked_when_given() -> None:
    with pytest.raises(af.ValidationError, match="subject"):
        af.NatsSink(subject="")
    with pytest.raises(af.ValidationError, match="needs stream="):
        af.NatsSink(subject=lambda entry: "s")
    with pytest.raises(af.ValidationError, match="max_in_flight"):
        af.NatsSink(subject="s", max_in_flight=0)
    with pytest.raises(af.ValidationError, match="max_in_flight"):
        af.NatsSink(subject="s", max_in_flight=True)
    with pytest.raises(af.ValidationError, match="ack_timeout"):
        af.NatsSink(subject="s", ack_timeout=float("nan"))
    with pytest.raises(af.ValidationError, match="key"):
        af.RedisSink(key="")


def test_relay_arguments_are_checked_before_anything_runs(tmp_path: Path) -> None:
    async def relay(**options: object) -> None:
        async with af.connect(f"sqlite:///{tmp_path}/x.db", outbox=True) as db:
            await db.outbox.relay(af.RedisSink(key="never-used"), **options)  # type: ignore[arg-type]

    with pytest.raises(af.ValidationError, match="batch_size"):
        anyio.run(lambda: relay(batch_size=0))
    with pytest.raises(af.ValidationError, match="after"):
        anyio.run(lambda: relay(after="nope"))
    with pytest.raises(af.ValidationError, match="stop"):
        anyio.run(lambda: relay(stop=42))
    with pytest.raises(af.ValidationError, match="BrokerSink"):
        anyio.run(lambda: relay_to(tmp_path, object()))


async def relay_to(tmp_path: Path, sink: object) -> None:
    async with af.connect(f"sqlite:///{tmp_path}/x.db", outbox=True) as db:
        await db.outbox.relay(sink)  # type: ignore[arg-type]


def test_redis_stream_ids_sort_as_versionstamps_do() -> None:
    stamps = [versionstamp(v, i) for v in (1, 2, 255, 2**40, 2**64 - 1) for i in (0, 1, 65535)]
    ids = [tuple(map(int, stream_id(s).split("-"))) for s in stamps]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert stream_id(versionstamp(7, 3)) == "7-3"
    with pytest.raises(af.RelayError, match="does not fit"):
        stream_id(versionstamp(2**64))


def test_broker_urls_choose_the_sink() -> None:
    nats = sink_for_url("nats://127.0.0.1:4222", "orders", max_in_flight=8)
    assert isinstance(nats, af.NatsSink) and nats.subject == "orders" and nats.max_in_flight == 8
    redis = sink_for_url("redis://127.0.0.1:6379/0", "orders")
    assert isinstance(redis, af.RedisSink) and redis.key == "orders"
    with pytest.raises(af.ValidationError, match="no relay sink"):
        sink_for_url("kafka://h:9092", "orders")
