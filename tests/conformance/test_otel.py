"""aiofragno.otel on every backend and runtime: one span per unit of work,
read back through the OpenTelemetry SDK's in-memory exporter — attributes,
statement events, outcomes (committed, read only, dry run, conflict, error,
a lost COMMIT), and no parameter value unless asked for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import aiofragno as af
from aiofragno.otel import UowTracer
from tests.conformance.namespaces import Namespaces
from tests.conftest import Target
from tests.faults import tcp_proxy

pytestmark = pytest.mark.anyio

SHOP = af.Schema(
    "shop",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Index("by_owner", ["owner"], unique=True),
    ),
)
SECRET = "s3cret-owner-value"


class Spans:
    """A tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def tracer(self, **options: Any) -> UowTracer:
        return UowTracer(self.provider, **options)

    def take(self) -> list[ReadableSpan]:
        """The spans finished since the last call."""
        spans = list(self.exporter.get_finished_spans())
        self.exporter.clear()
        return spans


@pytest.fixture
def spans() -> Iterator[Spans]:
    made = Spans()
    yield made
    made.provider.shutdown()


@pytest.fixture
async def outbox_db(url: str, target: Target) -> AsyncIterator[af.Database]:
    async with af.connect(url, backend=target.backend, pool_size=2, outbox=True) as database:
        yield database


@pytest.fixture
async def namespace(db: af.Database) -> AsyncIterator[str]:
    namespaces = Namespaces(db)
    name = namespaces.use(db, SHOP).namespace
    try:
        await db.migrate(SHOP, namespace=name)

        async def seed(uow: af.UnitOfWork) -> None:
            uow.create("accounts", {"owner": "alice", "balance": 100})

        await db.execute_uow(seed, schema=SHOP, namespace=name)
        yield name
    finally:
        await namespaces.drop()


def debit(amount: int, *, before_write: Any = None) -> Any:
    """A unit reading alice, debiting her (checked) and opening an account
    for SECRET; ``before_write(attempt)`` runs between its read and its writes."""
    attempts = 0

    async def unit(uow: af.UnitOfWork) -> str:
        nonlocal attempts
        attempts += 1
        alice = uow.find_first("accounts", where={"owner": "alice"})
        await uow.retrieve()
        if before_write is not None:
            await before_write(attempts)
        row = alice.result
        uow.update("accounts", row["id"], {"balance": row["balance"] - amount}, check=True)
        uow.create("accounts", {"owner": f"{SECRET}-{attempts}-{amount}", "balance": amount})
        return uow.uow_id

    return unit


def texts(values: Any) -> str:
    return repr(sorted(map(repr, values)))


def everything(span: ReadableSpan) -> str:
    """Every attribute value of ``span`` and of its events, as one text."""
    parts = [texts((span.attributes or {}).values())]
    parts += [texts((event.attributes or {}).values()) for event in span.events]
    return "\n".join(parts)


async def test_a_unit_is_one_span_with_its_statements(
    outbox_db: af.Database, namespace: str, spans: Spans, target: Target
) -> None:
    db = outbox_db
    seen: list[af.CompiledQuery] = []
    stamps: list[str | None] = []
    hooks = af.UowHooks(after_mutation=lambda uow: stamps.append(uow.versionstamp))
    tracer = spans.tracer()
    uow_id = await tracer.execute_uow(
        db, debit(5), schema=SHOP, namespace=namespace, on_query=seen.append, hooks=hooks
    )
    [span] = spans.take()
    assert span.name == "uow unit"
    assert span.kind is SpanKind.INTERNAL
    assert span.status.status_code is StatusCode.UNSET
    attributes = dict(span.attributes or {})
    if db._engine.outbox_strategy == "counter":
        assert attributes.pop("aiofragno.uow.versionstamp") == stamps[0] is not None
    else:  # ticks: the versionstamp is not known at commit (docs/outbox.md)
        assert "aiofragno.uow.versionstamp" not in attributes and stamps == [None]
    assert attributes.pop("aiofragno.uow.id") == uow_id
    expected: dict[str, Any] = {
        "db.system.name": db.name,
        "db.namespace": db.url.database,
        "aiofragno.uow.schema": "shop",
        "aiofragno.uow.namespace": namespace,
        "aiofragno.uow.outcome": "committed",
        "aiofragno.uow.attempts": 1,
        "aiofragno.uow.conflicts": 0,
        "aiofragno.uow.statements": len(seen),
    }
    if target.dialect != "sqlite":
        parts = urlsplit(db.url.describe())
        expected |= {"server.address": parts.hostname, "server.port": parts.port}
    assert attributes == expected
    # Each statement the unit sent (the read, the writes, the outbox entry),
    # as compiled; the user's own on_query saw the same.
    assert seen
    assert [e.name for e in span.events] == ["aiofragno.statement"] * len(seen)
    assert [dict(e.attributes or {}) for e in span.events] == [
        {"db.query.text": q.sql} for q in seen
    ]
    assert SECRET in texts(p for q in seen for p in q.parameters)
    assert SECRET not in everything(span)

    # Parameter values only when asked for.
    seen.clear()
    await spans.tracer(capture_parameters=True).execute_uow(
        db, debit(6), schema=SHOP, namespace=namespace, on_query=seen.append
    )
    [span] = spans.take()
    assert [dict(e.attributes or {}) for e in span.events] == [
        {
            "db.query.text": q.sql,
            **{f"db.query.parameter.{i}": str(p) for i, p in enumerate(q.parameters)},
        }
        for q in seen
    ]
    assert SECRET in everything(span)

    # A unit turned out of the outbox, through the tracer as through the Database.
    seen.clear()
    await spans.tracer().execute_uow(
        db, debit(7), schema=SHOP, namespace=namespace, on_query=seen.append, outbox=False
    )
    spans.take()
    assert seen and not any("fragno_db_outbox" in q.sql for q in seen)


async def test_conflicts_and_retries_are_counted(
    db: af.Database, namespace: str, spans: Spans
) -> None:
    layout = db.layout(SHOP, namespace)

    async def concurrent_writer(attempt: int) -> None:
        if attempt == 1:  # bumps alice's version between the unit's read and write
            await db.execute(
                af.sql(
                    "UPDATE {t} SET {v} = {v} + 1 WHERE owner = 'alice'",
                    t=layout.table("accounts").identifier,
                    v=af.Identifier("_version"),
                )
            )

    conflicts: list[Exception] = []

    async def on_conflict(uow: af.UnitOfWork, exc: Exception) -> None:
        conflicts.append(exc)

    tracer = spans.tracer(max_statement_events=2)
    await tracer.execute_uow(
        db,
        debit(5, before_write=concurrent_writer),
        schema=SHOP,
        namespace=namespace,
        retry=af.ExponentialBackoff(initial=0.001),
        hooks=af.UowHooks(on_conflict=on_conflict),
        span_name="debit",
    )
    [span] = spans.take()
    assert len(conflicts) == 1  # the user's hook still ran
    attributes = span.attributes or {}
    assert span.name == "debit"
    assert attributes["aiofragno.uow.outcome"] == "committed"
    assert (attributes["aiofragno.uow.attempts"], attributes["aiofragno.uow.conflicts"]) == (2, 1)
    events = [e for e in span.events if e.name != "aiofragno.statement"]
    assert [(e.name, dict(e.attributes or {})) for e in events] == [
        (
            "aiofragno.uow.conflict",
            {"aiofragno.uow.attempt": 1, "error.type": _qualified(conflicts[0])},
        ),
        ("aiofragno.uow.attempt", {"aiofragno.uow.attempt": 2}),
    ]
    # Statements over both attempts, events for the first two only.
    assert attributes["aiofragno.uow.statements"] > 2
    assert len(span.events) - len(events) == 2

    # Retries that run out.
    with pytest.raises(af.ConcurrencyConflict):
        await tracer.execute_uow(
            db,
            debit(5, before_write=concurrent_writer),
            schema=SHOP,
            namespace=namespace,
            retry=af.NoRetry(),
        )
    [span] = spans.take()
    attributes = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert attributes["aiofragno.uow.outcome"] == "conflict"
    assert attributes["error.type"] == "aiofragno.errors.ConcurrencyConflict"
    assert (attributes["aiofragno.uow.attempts"], attributes["aiofragno.uow.conflicts"]) == (1, 1)


async def test_reads_dry_runs_and_errors(db: af.Database, namespace: str, spans: Spans) -> None:
    async def read(uow: af.UnitOfWork) -> None:
        uow.find("accounts")
        await uow.retrieve()

    async def duplicate(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "alice", "balance": 1})

    tracer = spans.tracer()
    await tracer.execute_uow(db, read, schema=SHOP, namespace=namespace)
    await tracer.execute_uow(db, duplicate, schema=SHOP, namespace=namespace, dry_run=True)
    with pytest.raises(af.UniqueViolation):
        await tracer.execute_uow(db, duplicate, schema=SHOP, namespace=namespace)
    read_span, dry_span, failed = spans.take()
    assert read_span.attributes is not None and dry_span.attributes is not None
    assert read_span.attributes["aiofragno.uow.outcome"] == "read_only"
    assert dry_span.attributes["aiofragno.uow.outcome"] == "dry_run"
    assert read_span.attributes["aiofragno.uow.statements"] == 1
    assert failed.attributes is not None
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["aiofragno.uow.outcome"] == "error"
    assert failed.attributes["error.type"] == "aiofragno.errors.UniqueViolation"
    assert not [
        e for e in failed.events if e.name == "exception"
    ]  # (its message may quote a value)

    with pytest.raises(af.UniqueViolation):
        await spans.tracer(record_exceptions=True).execute_uow(
            db, duplicate, schema=SHOP, namespace=namespace
        )
    [failed] = spans.take()
    [event] = [e for e in failed.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"].endswith("UniqueViolation")


async def test_a_lost_commit_is_an_unknown_outcome(
    url: str, target: Target, namespace: str, spans: Spans
) -> None:
    if target.dialect == "sqlite":
        pytest.skip("SQLite runs in this process: no network to lose a COMMIT in")
    parts = urlsplit(url)
    async with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
        userinfo = parts.netloc.rpartition("@")[0]
        proxied = urlunsplit(parts._replace(netloc=f"{userinfo}@127.0.0.1:{proxy.port}"))
        async with af.connect(proxied, backend=target.backend, pool_size=1) as db:

            def lose_the_commit_reply(uow: af.UnitOfWork) -> None:
                proxy.drop_after(b"COMMIT", forward=True)

            with anyio.fail_after(30), pytest.raises(af.CommitOutcomeUnknown):
                await spans.tracer().execute_uow(
                    db,
                    debit(5),
                    schema=SHOP,
                    namespace=namespace,
                    hooks=af.UowHooks(before_mutation=lose_the_commit_reply),
                )
        assert proxy.drops == 1, "the fault was not injected"
    [span] = spans.take()
    attributes = span.attributes or {}
    assert span.status.status_code is StatusCode.ERROR
    assert attributes["aiofragno.uow.outcome"] == "unknown"
    assert attributes["error.type"] == "aiofragno.errors.CommitOutcomeUnknown"
    assert attributes["server.port"] == proxy.port


def _qualified(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"
