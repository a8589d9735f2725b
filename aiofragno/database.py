"""The Database facade: ``af.connect(url)`` and what you do with the result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, Unpack

from . import runtime
from .backends import choose_backend, create_dialect
from .codec import ValueCodec, as_utc
from .driver import (
    ISOLATION_LEVELS,
    CompiledQuery,
    Dialect,
    DialectAdapter,
    IsolationLevel,
    QueryResult,
    leading_keyword,
)
from .errors import (
    ConnectionLost,
    DatabaseClosed,
    DatabaseUnavailable,
    Error,
    ProgrammingError,
    QueryCanceled,
    ValidationError,
)
from .lost_session import end_session
from .migrate import Ddl, MigrationResult
from .migrate import migrate as run_migration
from .migration_lock import DEFAULT_LOCK_TIMEOUT, check_lock_timeout
from .naming import Layout, PhysicalNames, resolve_naming
from .outbox import OutboxReader
from .outbox.writer import OutboxStatements
from .ownership import INTERNAL_TABLES
from .resilience import Deadline, retry_read, shared_deadline
from .schema import Schema, TableIdentity, _check_name
from .session import Queries, Session, TransactionContext, current_transaction
from .sql import Fragment
from .stats import Stats
from .uow import execute_uow as run_uow
from .uow.catalog import Catalog
from .uow.executor import UowHooks
from .uow.retry import RetryPolicy
from .uow.unit import UnitOfWork
from .url import ConnectOptions, DatabaseURL, Options, parse_url

T = TypeVar("T")


class Database(Queries):
    """A pool of connections to one database, and the operations on it.

    Use it from any number of tasks at once. Outside a transaction every
    statement autocommits on whichever pooled connection is free; inside
    ``async with db.transaction()`` the same methods run in that transaction
    (also when called on ``db`` itself from the task that opened it).
    """

    def __init__(self, dialect: Dialect, url: DatabaseURL, options: Options, backend: str) -> None:
        self.dialect = dialect
        self.url = url
        self.options = options
        self.backend = backend
        self.adapter: DialectAdapter = dialect.create_adapter()
        self.compiler = dialect.create_query_compiler()
        self._driver = dialect.create_driver()
        self._closed = False
        self.codec = ValueCodec(self.adapter.storage, naive_datetimes=options.naive_datetimes)
        self.naming = resolve_naming(options.naming or self.adapter.default_naming)
        if options.naming == "schema" and not self.adapter.ddl.create_schema_sql:
            raise ValidationError(
                f"naming='schema' needs database schemas, which {dialect.name} does not have; use 'suffix'"
            )
        self._ddl = Ddl(self.adapter.ddl, self.compiler, self.codec)
        self._layouts: dict[tuple[int, str], Layout] = {}
        self._physical_names = PhysicalNames(INTERNAL_TABLES)
        self._catalogs: dict[int, Catalog] = {}
        self._table_identities: dict[tuple[str, ...], TableIdentity] = {}
        self.outbox = OutboxReader(self)
        self.stats = Stats()
        self._outbox_statements: OutboxStatements | None = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<aiofragno.Database {self.url.describe()} backend={self.backend} {state}>"

    @property
    def name(self) -> str:
        """The dialect: "postgresql", "sqlite" or "mysql"."""
        return self.dialect.name

    @property
    def pool_size(self) -> int:
        """Most connections this Database opens at once."""
        return self._driver.pool_size

    @property
    def outbox_statements(self) -> OutboxStatements:
        """The outbox writer's SQL for this database, compiled once."""
        if self._outbox_statements is None:
            self._outbox_statements = OutboxStatements(self.compiler, self.adapter)
        return self._outbox_statements

    @property
    def closed(self) -> bool:
        return self._closed

    def compile(self, query: Fragment) -> CompiledQuery:
        """``query`` (an ``af.sql`` fragment) as SQL text and parameters for
        this database, without running it."""
        return self.compiler.compile(query)

    def raw(self, text: str) -> Fragment:
        """A fragment of trusted SQL text without parameters (internal use:
        never build ``text`` from user input)."""
        return Fragment((text,))

    def layout(self, schema: Schema, namespace: str | None = None) -> Layout:
        """Where ``schema``'s tables live in this database under ``namespace``
        (default: the schema's name). :class:`SchemaError` if a table would
        be one that another namespace's table (of any layout of this
        Database) or aiofragno itself uses; :class:`ValidationError` for a
        system schema (``information_schema``, ``pg_*``, ``mysql``,
        ``performance_schema``, ``sys``) as namespace."""
        namespace = schema.name if namespace is None else namespace
        key = (id(schema), namespace)
        layout = self._layouts.get(key)
        if layout is None or layout.schema is not schema:
            if not isinstance(schema, Schema):
                raise ValidationError(f"expected an af.Schema, got {type(schema).__name__}")
            _check_name("namespace", namespace)
            layout = Layout(schema, namespace, self.naming, self.adapter.max_identifier_length)
            if layout.db_schemas and not self.adapter.ddl.create_schema_sql:
                raise ValidationError(
                    f"the naming strategy puts tables in database schemas, which {self.name} "
                    "does not have; use naming='suffix'"
                )
            self._physical_names.claim(layout)
            self._layouts[key] = layout
        return layout

    def catalog(self, schema: Schema, namespace: str | None = None) -> Catalog:
        """The compiled tables and SQL cache for ``schema`` under ``namespace``."""
        layout = self.layout(schema, namespace)
        catalog = self._catalogs.get(id(layout))
        if catalog is None:
            catalog = self._catalogs[id(layout)] = Catalog(
                layout, self.compiler, self.codec, self.adapter, self._table_identities
            )
        return catalog

    async def execute_uow(
        self,
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
    ) -> T:
        """Run ``fn`` as a unit of work on ``schema``'s tables and return what it
        returns. ``fn`` queues reads, awaits ``uow.retrieve()``, and queues
        writes; after it returns, the writes run in one transaction (at
        ``isolation``, if given). When a checked write finds its row changed, or
        the server reports a serialization failure or deadlock, the whole of
        ``fn`` runs again under ``retry`` (default: ``ExponentialBackoff()``);
        when retries run out, :class:`ConcurrencyConflict` is raised. So ``fn``
        must not have side effects outside the unit. ``dry_run`` compiles
        without touching the database (reads give empty results);
        ``on_query`` sees every compiled statement; ``hooks`` instrument each
        attempt."""
        self._check_open()
        _check_isolation(isolation)
        return await run_uow(
            self,
            self.catalog(schema, namespace),
            fn,
            retry=retry,
            idempotency_key=idempotency_key,
            isolation=isolation,
            dry_run=dry_run,
            on_query=on_query,
            hooks=hooks,
        )

    async def migrate(
        self,
        schema: Schema,
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> MigrationResult:
        """Create or extend ``schema``'s tables (see :mod:`aiofragno.migrate`).
        With ``dry_run`` nothing is changed and the result lists the
        statements a real run would execute now. Waits at most
        ``lock_timeout`` seconds for the migration lock (and, on PostgreSQL
        and MySQL, for each table lock its DDL needs), else raises
        :class:`MigrationError`."""
        check_lock_timeout(lock_timeout)
        layout = self.layout(schema, namespace)
        transactional = self.adapter.supports_transactional_ddl
        session = await self.checkout()
        try:
            if transactional:
                await session.begin(None)
            result = await run_migration(
                session,
                self.compile,
                layout,
                self._ddl,
                self.codec,
                dry_run=dry_run,
                lock_timeout=lock_timeout,
            )
            if transactional:
                await session.commit()
            return result
        finally:
            await self.checkin(session)

    async def migration_sql(self, schema: Schema, *, namespace: str | None = None) -> list[str]:
        """The statements ``migrate`` would run now, without running them."""
        return (await self.migrate(schema, namespace=namespace, dry_run=True)).statements

    def transaction(self, isolation: IsolationLevel | None = None) -> TransactionContext:
        """``async with db.transaction() as tx:`` — commit on success, roll back
        on exception; nested use makes a savepoint. ``isolation`` is one of
        "read uncommitted", "read committed", "repeatable read", "serializable"
        (SQLite transactions are always serializable)."""
        self._check_open()
        _check_isolation(isolation)
        return TransactionContext(self, isolation)

    async def now(self) -> datetime:
        """The database server's current time, timezone-aware in UTC."""
        value = await self.fetch_value(self.raw(self.adapter.now_sql))
        return as_utc(value)

    async def end_session(self, server_session: str | None, *, give_up_after: float = 30.0) -> None:
        """End the server session behind a broken connection and return once it
        has gone — after a :class:`~aiofragno.CommitOutcomeUnknown`, pass its
        ``server_session``. Until then the server may still commit what was in
        flight; after, what the database holds is final, so check it then.
        Raises :class:`~aiofragno.SessionStillRunning` when the session still
        runs ``give_up_after`` seconds after it was asked to end (e.g. it belongs to a role this one may
        not end). Ending a session is allowed to its own role (PostgreSQL
        ``pg_terminate_backend``, MySQL ``KILL``); on SQLite this returns at once."""
        await retry_read(
            self.options.reconnect_deadline,
            lambda: end_session(self, server_session, give_up_after),
        )

    async def is_healthy(self) -> bool:
        """True if a connection answers a round trip within ``connect_timeout``.
        Never raises."""
        if self._closed:
            return False
        with runtime.move_on_after(self.options.connect_timeout):
            try:
                session = await self.checkout(wait=False)
                try:
                    await session.connection.ping()
                    return True
                except Exception:
                    session.broken = True
                finally:
                    await self.checkin(session)
            except Error:
                pass
        return False

    async def close(self) -> None:
        """Close every connection. Idempotent; the Database is unusable after."""
        if self._closed:
            return
        self._closed = True
        await self._driver.destroy()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _run(self, query: Fragment) -> QueryResult:
        tx = current_transaction(self)
        if tx is not None:
            return await tx.execute(query)
        compiled = self.compiler.compile(query)
        # Only plain SELECTs are retried after a lost connection: anything else
        # (INSERT ... RETURNING through fetch, say) might have taken effect.
        if leading_keyword(compiled.sql) == "select":
            return await retry_read(
                self.options.reconnect_deadline, lambda: self._execute(compiled)
            )
        return await self._execute(compiled)

    async def _execute(self, compiled: CompiledQuery) -> QueryResult:
        """``compiled`` on a connection of its own, outside any transaction.
        A statement that may change the session (see
        :attr:`DialectAdapter.session_changes`) gets its connection reset
        before reuse; one that leaves a transaction open is refused."""
        session = await self.checkout()
        try:
            session.dirty = self.adapter.session_changes(compiled.sql)
            result = await session.execute(compiled)
            if session.connection.in_transaction:
                session.dirty = True
                raise ProgrammingError(
                    f"{compiled.sql[:60]!r} left its connection in a transaction, which would "
                    "have outlived the statement (BEGIN, START TRANSACTION or autocommit off "
                    "outside db.transaction()); it has been rolled back. Run statements "
                    "that belong together in `async with db.transaction() as tx:`"
                )
            return result
        finally:
            await self.checkin(session)

    async def checkout(self, *, wait: bool = True) -> Session:
        """A connection from the pool, wrapped in a :class:`Session`. While the
        server is unreachable, retries until ``reconnect_deadline`` (``wait``)."""
        with shared_deadline(self.options.reconnect_deadline if wait else None) as deadline:
            if not wait:
                deadline = Deadline(None)
            while True:
                self._check_open()
                try:
                    connection = await self._driver.acquire_connection()
                except Error:
                    raise
                except Exception as exc:
                    error = self._unavailable(exc)
                    if not isinstance(error, DatabaseUnavailable) or not await deadline.wait():
                        raise error from exc
                    self.stats.reconnect_waits += 1
                    continue
                return Session(connection, self.dialect.translate_error)

    async def checkin(self, session: Session) -> None:
        """Return ``session``'s connection: reset it if an operation was
        interrupted, restore its session if that may have changed or the
        server still has a transaction open on it, discard it if it broke
        (or a reset failed). So the next caller gets the session as it was
        after connect."""
        connection = session.connection
        if not (
            session.broken
            or session.interrupted
            or session.in_transaction
            or session.dirty
            or connection.in_transaction
        ):
            # Clean: going back to the idle list awaits nothing that could be
            # cancelled, so no shielded scope is needed.
            await self._driver.release_connection(connection)
            return
        with runtime.shielded(runtime.CLEANUP_TIMEOUT):
            discard = session.broken
            try:
                if not discard and (session.interrupted or session.in_transaction):
                    discard = not await connection.reset()
                if not discard and (session.dirty or connection.in_transaction):
                    self.stats.session_resets += 1
                    discard = not await connection.reset_session()
            except Exception:
                discard = True
            await self._driver.release_connection(connection, discard=discard)

    async def open(self) -> None:
        """Open the first connection, so a bad URL or a dead server fails now."""
        try:
            await self._driver.init()
        except Error:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> Error:
        error = self.dialect.translate_error(exc)
        # Failing to connect in time is the server being unavailable, whatever
        # the driver calls it.
        if isinstance(error, ConnectionLost | DatabaseUnavailable | QueryCanceled):
            return DatabaseUnavailable(
                f"cannot connect to {self.url.describe()}: {error}; "
                "check that the server is running and the URL is right",
                sqlstate=error.sqlstate,
                code=error.code,
            )
        return error if isinstance(error, Error) else Error(str(error))

    def _check_open(self) -> None:
        if self._closed:
            raise DatabaseClosed(f"{self!r} is closed; open a new one with af.connect()")


def _check_isolation(isolation: object) -> None:
    """Refuse an unknown isolation level where the user's value enters (it
    goes into SQL text later: ``BEGIN ISOLATION LEVEL ...``)."""
    if isolation is not None and isolation not in ISOLATION_LEVELS:
        raise ValidationError(
            f"unknown isolation level {isolation!r}; use one of {sorted(ISOLATION_LEVELS)}"
        )


class Connect:
    """What ``af.connect`` returns: await it for a :class:`Database`, or use it
    as ``async with af.connect(url) as db`` to close the Database on exit."""

    def __init__(self, url: str, backend: str | None, options: ConnectOptions) -> None:
        self._url = url
        self._backend = backend
        self._options = options
        self._db: Database | None = None

    async def _open(self) -> Database:
        url = parse_url(self._url)
        options = Options().merged(url.query, self._options)
        backend = choose_backend(url, self._backend, runtime.current_runtime())
        db = Database(create_dialect(backend, url, options), url, options, backend.name)
        try:
            await db.open()
        except BaseException:
            await db.close()
            raise
        return db

    def __await__(self) -> Generator[Any, None, Database]:
        return self._open().__await__()

    async def __aenter__(self) -> Database:
        self._db = await self._open()
        return self._db

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._db is not None:
            await self._db.close()


def connect(url: str, *, backend: str | None = None, **options: Unpack[ConnectOptions]) -> Connect:
    """Open a :class:`Database` for ``url`` (see :mod:`aiofragno.url` for URL
    forms, and :class:`~aiofragno.url.Options` for what each option in
    :class:`~aiofragno.ConnectOptions` means). ``backend`` picks a driver ("asyncpg", "aiosqlite",
    "sqlite", "asyncmy"); by default the best one for the URL and the running
    event loop is used. The first connection is opened before this returns,
    so a wrong URL or a server that is down fails here
    (:class:`~aiofragno.errors.DatabaseUnavailable`)."""
    return Connect(url, backend, options)
