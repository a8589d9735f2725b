"""OpenTelemetry spans for units of work: ``pip install 'aiofragno[otel]'``.

:class:`UowTracer` runs ``db.execute_uow`` inside one span per call, built
from the unit-of-work hooks (``on_query``, ``on_conflict``) and from wrapping
the unit's function, so it sees every attempt. The span is current while the
unit runs, so the spans of an instrumented driver (OpenTelemetry's asyncpg
instrumentation, say) nest under it, under asyncio and trio alike.

Attributes follow OpenTelemetry's database semantic conventions where they
apply (``db.system.name``, ``db.namespace``, ``server.address``,
``server.port``, ``error.type``, ``db.query.text``); the rest are
``aiofragno.uow.*``. Statement parameter values and exception messages (a
database error may quote a value) stay out of spans unless you opt in.

Only this module imports ``opentelemetry``; the rest of aiofragno never
imports this module.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, Literal, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from . import __version__
from .database import Database
from .driver import CompiledQuery, IsolationLevel
from .errors import CommitOutcomeUnknown, ConcurrencyConflict
from .schema import Schema
from .uow.executor import Reads, UowHooks
from .uow.retry import RetryPolicy
from .uow.unit import UnitOfWork

T = TypeVar("T")

Outcome = Literal["committed", "read_only", "dry_run", "conflict", "unknown", "error", "cancelled"]

# server.port where the URL names none: the driver's default.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


class UowTracer:
    """Runs units of work in OpenTelemetry spans.

    One INTERNAL span per :meth:`execute_uow` call, named ``uow <function
    name>`` (or ``span_name``), with:

    * ``db.system.name`` (``postgresql``, ``mysql`` — MariaDB too, aiofragno
      does not tell them apart — or ``sqlite``), ``db.namespace`` (the
      database, or the SQLite file), ``server.address`` and ``server.port``;
      ``aiofragno.uow.schema`` and ``aiofragno.uow.namespace``;
    * at the end: ``aiofragno.uow.outcome`` (``committed``; ``read_only``
      when the unit wrote nothing; ``dry_run``; ``conflict`` when retries ran
      out; ``unknown`` for :class:`~aiofragno.CommitOutcomeUnknown`, the
      COMMIT may or may not have been applied; ``error``; ``cancelled``),
      ``aiofragno.uow.attempts`` (runs of the function: retries after
      conflicts and after lost connections included),
      ``aiofragno.uow.conflicts``, ``aiofragno.uow.statements`` (statements
      compiled, over all attempts), ``aiofragno.uow.id`` and, with the
      outbox, ``aiofragno.uow.versionstamp``;
    * on failure, status ERROR and ``error.type`` (the exception's qualified
      class name);
    * events: ``aiofragno.uow.attempt`` at each retry, ``aiofragno.uow.conflict``
      at each conflict (with ``error.type``), and ``aiofragno.statement`` as
      each statement is about to be sent (``db.query.text``; the first
      ``max_statement_events`` of the call). Events have no duration: the
      hooks tell when a statement is sent, not when it finished. For timed
      spans per statement, instrument the driver (see docs/observability.md).

    ``capture_parameters`` adds each statement's parameter values to its
    event (``db.query.parameter.<index>``, as text); ``record_exceptions``
    records the exception (message and traceback) as an event. Both are off
    by default: values may be secrets or personal data.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        capture_parameters: bool = False,
        record_exceptions: bool = False,
        max_statement_events: int = 64,
    ) -> None:
        self._tracer = trace.get_tracer("aiofragno", __version__, tracer_provider)
        self.capture_parameters = capture_parameters
        self.record_exceptions = record_exceptions
        self.max_statement_events = max_statement_events

    async def execute_uow(
        self,
        db: Database,
        fn: Callable[[UnitOfWork], Awaitable[T]],
        *,
        schema: Schema,
        namespace: str | None = None,
        retry: RetryPolicy | None = None,
        idempotency_key: str | None = None,
        isolation: IsolationLevel | None = None,
        dry_run: bool = False,
        on_query: Callable[[CompiledQuery], Any] | None = None,
        hooks: UowHooks | None = None,
        outbox: bool | None = None,
        reads: Reads = "primary",
        span_name: str | None = None,
    ) -> T:
        """``db.execute_uow(fn, ...)`` (same arguments, same result and
        exceptions) in a span; your ``on_query`` and ``hooks`` still run."""
        name = span_name or f"uow {getattr(fn, '__name__', type(fn).__name__)}"
        attributes = _database_attributes(db)
        attributes["aiofragno.uow.schema"] = schema.name
        attributes["aiofragno.uow.namespace"] = schema.name if namespace is None else namespace
        if reads != "primary":
            attributes["aiofragno.uow.reads"] = reads
        # (Failures are recorded by _TracedUnit.failed: a message may quote a value.)
        with self._tracer.start_as_current_span(
            name,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            traced = _TracedUnit(self, span, fn, on_query, hooks)
            try:
                value = await db.execute_uow(
                    traced.run,
                    schema=schema,
                    namespace=namespace,
                    retry=retry,
                    idempotency_key=idempotency_key,
                    isolation=isolation,
                    dry_run=dry_run,
                    on_query=traced.statement,
                    hooks=traced.hooks,
                    outbox=outbox,
                    reads=reads,
                )
            except BaseException as exc:
                traced.failed(exc)
                raise
            traced.finish("dry_run" if dry_run else traced.written())
            return value


class _TracedUnit(Generic[T]):
    """What one traced ``execute_uow`` call has seen so far."""

    def __init__(
        self,
        tracer: UowTracer,
        span: Span,
        fn: Callable[[UnitOfWork], Awaitable[T]],
        on_query: Callable[[CompiledQuery], Any] | None,
        hooks: UowHooks | None,
    ) -> None:
        self._tracer = tracer
        self._span = span
        self._fn = fn
        self._on_query = on_query
        self._user_hooks = hooks or UowHooks()
        self.hooks = UowHooks(
            before_mutation=self._user_hooks.before_mutation,
            after_mutation=self._user_hooks.after_mutation,
            on_conflict=self._conflict,
        )
        self._attempts = 0
        self._conflicts = 0
        self._statements = 0
        self._uow: UnitOfWork | None = None

    async def run(self, uow: UnitOfWork) -> T:
        self._attempts += 1
        self._uow = uow
        if self._attempts > 1:
            self._span.add_event("aiofragno.uow.attempt", {"aiofragno.uow.attempt": self._attempts})
        return await self._fn(uow)

    def statement(self, query: CompiledQuery) -> Any:
        self._statements += 1
        if self._statements <= self._tracer.max_statement_events:
            attributes: dict[str, str] = {"db.query.text": query.sql}
            if self._tracer.capture_parameters:
                for index, value in enumerate(query.parameters):
                    attributes[f"db.query.parameter.{index}"] = str(value)
            self._span.add_event("aiofragno.statement", attributes)
        return None if self._on_query is None else self._on_query(query)

    def _conflict(self, uow: UnitOfWork, exc: Exception) -> Any:
        self._conflicts += 1
        self._span.add_event(
            "aiofragno.uow.conflict",
            {"aiofragno.uow.attempt": self._attempts, "error.type": _qualified_name(exc)},
        )
        user = self._user_hooks.on_conflict
        return None if user is None else user(uow, exc)  # (awaited by the executor)

    def written(self) -> Outcome:
        uow = self._uow
        return "committed" if uow is not None and uow.mutations else "read_only"

    def failed(self, exc: BaseException) -> None:
        if not isinstance(exc, Exception):  # cancelled (or interrupted)
            self.finish("cancelled")
            return
        span = self._span
        span.set_status(Status(StatusCode.ERROR))
        span.set_attribute("error.type", _qualified_name(exc))
        if self._tracer.record_exceptions:
            span.record_exception(exc)
        if isinstance(exc, ConcurrencyConflict):
            self.finish("conflict")
        elif isinstance(exc, CommitOutcomeUnknown):
            self.finish("unknown")
        else:
            self.finish("error")

    def finish(self, outcome: Outcome) -> None:
        span = self._span
        span.set_attribute("aiofragno.uow.outcome", outcome)
        span.set_attribute("aiofragno.uow.attempts", self._attempts)
        span.set_attribute("aiofragno.uow.conflicts", self._conflicts)
        span.set_attribute("aiofragno.uow.statements", self._statements)
        uow = self._uow
        if uow is not None:
            span.set_attribute("aiofragno.uow.id", uow.uow_id)
            if uow.versionstamp is not None:
                span.set_attribute("aiofragno.uow.versionstamp", uow.versionstamp)


def _database_attributes(db: Database) -> dict[str, Any]:
    """The semantic conventions' attributes naming ``db``'s database."""
    url = db.url
    attributes: dict[str, Any] = {"db.system.name": db.name}
    if url.database:
        attributes["db.namespace"] = url.database
    if db.name in _DEFAULT_PORTS:
        attributes["server.address"] = url.host or "localhost"
        attributes["server.port"] = url.port or _DEFAULT_PORTS[db.name]
    return attributes


def _qualified_name(exc: BaseException) -> str:
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"
