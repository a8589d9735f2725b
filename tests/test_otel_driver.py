"""OpenTelemetry outside aiofragno.otel: the driver's instrumentation, and a
core that never imports opentelemetry.

OpenTelemetry's asyncpg instrumentation sees every statement of a unit of
work — the reads and the writes, not only BEGIN and COMMIT — under asyncio
and under trio (where asyncpg runs on the asyncio bridge's thread), and its
spans nest under aiofragno.otel's unit span. It patches asyncpg's classes
for the whole process: the test instruments and uninstruments around itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import aiofragno as af
from aiofragno.otel import UowTracer
from tests.conformance.namespaces import Namespaces
from tests.conftest import require_target, selected_targets

pytestmark = pytest.mark.anyio

SHOP = af.Schema(
    "shop",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
    ),
    af.Table("transfers", af.Reference("src", "accounts"), af.Column("amount", "bigint")),
)


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = AsyncPGInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


@pytest.fixture
async def shop(
    anyio_backend: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[af.Database, str]]:
    """A Database on PostgreSQL through asyncpg, and a namespace of SHOP in it."""
    selected = [
        t
        for t in selected_targets(request.config)
        if t.backend == "asyncpg" and t.runtime == anyio_backend
    ]
    if not selected:
        pytest.skip("PostgreSQL is not selected (--backend)")
    [target] = selected
    require_target(target)
    async with af.connect(target.url(None), backend="asyncpg", pool_size=2) as db:
        namespaces = Namespaces(db)
        namespace = namespaces.use(db, SHOP).namespace
        try:
            await db.migrate(SHOP, namespace=namespace)
            yield db, namespace
        finally:
            await namespaces.drop()


async def transfer(uow: af.UnitOfWork) -> None:
    """Opens two accounts on the first call; moves money between them after."""
    accounts = uow.find("accounts", order_by="owner")
    await uow.retrieve()
    if not accounts.result:
        uow.create("accounts", {"owner": "alice", "balance": 100})
        uow.create("accounts", {"owner": "bob", "balance": 0})
        return
    alice, bob = accounts.result
    uow.update("accounts", alice["id"], {"balance": alice["balance"] - 10}, check=True)
    uow.update("accounts", bob["id"], {"balance": bob["balance"] + 10}, check=True)
    uow.create("transfers", {"src": alice["id"], "amount": 10})


def renumbered(text: str, offset: int) -> str:
    """``text``'s ``$n`` placeholders as they read in a statement combined
    after ``offset`` parameters (these texts quote no ``$``)."""
    return re.sub(r"\$(\d+)", lambda m: f"${int(m[1]) + offset}", text)


def statement(span: ReadableSpan) -> str:
    attributes = span.attributes or {}
    return str(attributes.get("db.query.text", attributes.get("db.statement", "")))


async def test_the_instrumentation_records_the_units_statements(
    shop: tuple[af.Database, str], exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    db, namespace = shop
    provider, spans = exporter
    seen: list[af.CompiledQuery] = []
    # The first two units run statements new to the Database (prepared, to
    # learn their kind), the third statements it knows (fetch / execute).
    for _ in range(3):
        seen.clear()
        spans.clear()
        await db.execute_uow(transfer, schema=SHOP, namespace=namespace, on_query=seen.append)
        recorded = [statement(span) for span in spans.get_finished_spans()]
        # The unit's read, then its writes as one statement (PostgreSQL
        # combines them, each with its placeholders renumbered) between
        # BEGIN and COMMIT.
        read, *writes = seen
        assert len(recorded) == 4, recorded
        assert recorded[0] == read.sql
        assert (recorded[1], recorded[3]) == ("BEGIN", "COMMIT")
        offset = 0
        for write in writes:
            assert renumbered(write.sql, offset) in recorded[2], recorded
            offset += len(write.parameters)

    # Under aiofragno.otel's unit span, the driver's spans are its children.
    spans.clear()
    await UowTracer(provider).execute_uow(db, transfer, schema=SHOP, namespace=namespace)
    finished = list(spans.get_finished_spans())
    [unit] = [span for span in finished if span.name == "uow transfer"]
    driver = [span for span in finished if span is not unit]
    assert [statement(span).split()[0] for span in driver] == ["SELECT", "BEGIN", "WITH", "COMMIT"]
    assert unit.context is not None
    assert all(
        span.parent is not None and span.parent.span_id == unit.context.span_id for span in driver
    )


def test_the_core_never_imports_opentelemetry() -> None:
    """aiofragno.otel is the only module that imports it (the otel extra is
    optional): importing aiofragno and every backend leaves it out."""
    code = (
        "import importlib, importlib.util, sys, aiofragno, aiofragno.cli, aiofragno.testing\n"
        "for name in ('asyncpg', 'asyncmy', 'aiosqlite', 'sqlite3', 'trio'):\n"
        "    if importlib.util.find_spec(name):  # (the installed drivers' backends)\n"
        "        importlib.import_module('aiofragno.backends.' + {\n"
        "            'sqlite3': 'sqlite', 'trio': 'asyncio_bridge'}.get(name, name))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
