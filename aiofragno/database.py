"""The Database facade: ``af.connect(url)`` and what you do with the result."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, Unpack, overload

from . import libpq, runtime
from .backends import choose_backend, create_dialect
from .codec import as_utc
from .driver import (
    CompiledQuery,
    Dialect,
    DialectAdapter,
    IsolationLevel,
)
from .engine import Engine, check_isolation
from .errors import Error, ValidationError
from .hosts import HostStatus
from .introspection import LiveSchema, inspect_database
from .migrate import Ddl, MigrationResult, run_online
from .migrate import migrate as run_migration
from .migration_lock import DEFAULT_LOCK_TIMEOUT, check_lock_timeout, held_outside_transaction
from .migration_plan import MigrationPlan
from .naming import Layout, PhysicalNames, resolve_naming
from .outbox import OutboxReader
from .ownership import INTERNAL_TABLES
from .queries import Queries, Read
from .replicas import DEFAULT_REPLICA_WAIT, ReplicaReads, ReplicaSet
from .schema import Schema, Table, TableIdentity, _check_name
from .schema_changes import AllowDrop, check_allow_drop
from .server_sessions import end_server_session_reconnecting
from .sql import Fragment
from .streaming import DEFAULT_BATCH_SIZE, Stream, check_batch_size
from .transaction import TransactionContext
from .uow import execute_uow
from .uow.catalog import Catalog
from .uow.executor import Reads, UowHooks
from .uow.ops import FindResult
from .uow.retry import RetryPolicy
from .uow.unit import UnitOfWork, Where
from .url import ConnectOptions, DatabaseURL, Options, parse_url

T = TypeVar("T")
RowT = TypeVar("RowT")


class Database(Queries):
    """A pool of connections to one database, and the operations on it.

    Use it from any number of tasks at once. Outside a transaction every
    statement autocommits on whichever pooled connection is free; inside
    ``async with db.transaction()`` the same methods run in that transaction
    (also when called on ``db`` itself from the task that opened it).
    """

    def __init__(self, dialect: Dialect, url: DatabaseURL, options: Options, backend: str) -> None:
        # What the features run on (aiofragno.engine); this is the facade over it.
        self._engine = engine = Engine(dialect, url, options, backend)
        # The query methods run the engine's _run itself: no call of ours
        # per statement (the method below is what the class declares).
        self._run = engine._run  # type: ignore[method-assign]
        self.dialect = dialect
        self.url = url
        self.options = options
        self.backend = backend
        self.stats = engine.stats
        self.naming = resolve_naming(options.naming or engine.adapter.default_naming)
        if options.naming == "schema" and not engine.adapter.ddl.create_schema_sql:
            raise ValidationError(
                f"naming='schema' needs database schemas, which {dialect.name} does not have; use 'suffix'"
            )
        self._ddl = Ddl(engine.adapter.ddl, engine.compiler, engine.codec)
        self._layouts: dict[tuple[int, str], Layout] = {}
        self._physical_names = PhysicalNames(INTERNAL_TABLES)
        self._catalogs: dict[int, Catalog] = {}
        # Layouts (by id, with their namespace) that a migration of this
        # Database found or made as declared: their catalogs trust the
        # declared unique indexes, until a migration of the namespace.
        self._confirmed: dict[int, str] = {}
        self._table_identities: dict[tuple[str, ...], TableIdentity] = {}
        self.outbox = OutboxReader(engine)
        self._replicas: ReplicaSet | None = None
        self.replica: Queries = ReplicaReads(engine, None)
        """Reads on a read replica (see :mod:`aiofragno.replicas`); on the
        primary when the Database has none."""

    def _use_replicas(self, replicas: ReplicaSet) -> None:
        """Route ``db.replica`` and ``reads="replica"`` units to ``replicas``,
        and keep each task's commit position for reading its writes there."""
        self._replicas = replicas
        self.replica = ReplicaReads(self._engine, replicas)
        self._run = replicas.primary_run  # type: ignore[method-assign]
        self._stream = replicas.primary_stream  # type: ignore[method-assign]

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<aiofragno.Database {self._engine.describe()} {state}>"

    @property
    def name(self) -> str:
        """The dialect: "postgresql", "sqlite" or "mysql"."""
        return self.dialect.name

    @property
    def pool_size(self) -> int:
        """Most connections this Database opens at once."""
        return self._engine.pool_size

    @property
    def adapter(self) -> DialectAdapter:
        """Deprecated: the dialect's adapter is internal (``aiofragno doctor``
        prints its capability flags)."""
        warnings.warn(
            "Database.adapter is internal and will be removed; `aiofragno doctor` prints "
            "the capability flags, and db.dialect.create_adapter() makes an adapter",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._engine.adapter

    @property
    def closed(self) -> bool:
        return self._engine.closed

    def compile(self, query: Fragment) -> CompiledQuery:
        """``query`` (an ``af.sql`` fragment) as SQL text and parameters for
        this database, without running it."""
        return self._engine.compile(query)

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
            adapter = self._engine.adapter
            layout = Layout(schema, namespace, self.naming, adapter.max_identifier_length)
            if layout.db_schemas and not adapter.ddl.create_schema_sql:
                raise ValidationError(
                    f"the naming strategy puts tables in database schemas, which {self.name} "
                    "does not have; use naming='suffix'"
                )
            self._physical_names.claim(layout)
            self._layouts[key] = layout
        return layout

    def _catalog(self, schema: Schema, namespace: str | None = None) -> Catalog:
        """The compiled tables and SQL cache for ``schema`` under ``namespace``."""
        layout = self.layout(schema, namespace)
        catalog = self._catalogs.get(id(layout))
        if catalog is None:
            engine = self._engine
            catalog = self._catalogs[id(layout)] = Catalog(
                layout,
                engine.compiler,
                engine.codec,
                engine.adapter,
                self._table_identities,
                unique_indexes_confirmed=id(layout) in self._confirmed,
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
        outbox: bool | None = None,
        reads: Reads = "primary",
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
        attempt. ``outbox``: whether this unit writes an outbox entry
        (None: as ``af.connect(outbox=...)`` says; tables declared with
        ``outbox=False`` never go into one). ``reads="replica"``: ``fn``
        only reads, on a read replica that has this task's commits (else on
        the primary; see :mod:`aiofragno.replicas`), all on one server; a
        queued write raises :class:`~aiofragno.ReadOnlyUnit` before its SQL."""
        self._engine.check_open()
        check_isolation(isolation)
        return await execute_uow(
            self._engine,
            self._catalog(schema, namespace),
            fn,
            retry=retry,
            idempotency_key=idempotency_key,
            isolation=isolation,
            dry_run=dry_run,
            on_query=on_query,
            hooks=hooks,
            outbox=outbox,
            reads=reads,
            replicas=self._replicas,
        )

    @overload
    def stream_find(  # type: ignore[overload-overlap]
        self,
        table: Table[RowT],
        where: Where = None,
        order_by: Any = None,
        *,
        schema: Schema,
        namespace: str | None = None,
        page_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncIterator[RowT]: ...

    @overload
    def stream_find(
        self,
        table: str | Table[Any],
        where: Where = None,
        order_by: Any = None,
        *,
        schema: Schema,
        namespace: str | None = None,
        page_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncIterator[dict[str, Any]]: ...

    async def stream_find(
        self,
        table: str | Table[Any],
        where: Where = None,
        order_by: Any = None,
        *,
        schema: Schema,
        namespace: str | None = None,
        page_size: int = DEFAULT_BATCH_SIZE,
    ) -> AsyncIterator[Any]:
        """``async for row in db.stream_find("orders", where=..., order_by=...,
        schema=shop)``: every row ``uow.find`` would return (``table``: its
        name, or its ``af.Table``), decoded through the schema, read ``page_size`` at a time — each page a unit of work's
        read of its own (keyset-paged: ``find(limit=, after=)``), so no
        connection or transaction is held between pages, and leaving the loop
        at any point leaves nothing open. Pages are not one snapshot: a row
        written meanwhile is seen in the state its page reads. An order
        column that is NULL at a page's end cannot be continued from:
        :class:`ValidationError` (order by columns that are never NULL)."""
        check_batch_size(page_size, "page_size")
        after: str | None = None
        while True:
            page = await self.execute_uow(
                functools.partial(_find_page, table, where, order_by, page_size, after),
                schema=schema,
                namespace=namespace,
            )
            for row in page:
                yield row
            if page.cursor is None:
                if len(page) == page_size and _null_order_value(page[-1], order_by):
                    raise ValidationError(
                        f"stream_find on {getattr(table, 'name', table)!r} cannot go past a row whose order_by column is "
                        "NULL (a keyset has no place for NULL); order by columns that are "
                        "never NULL"
                    )
                return
            after = page.cursor

    async def migrate(
        self,
        schema: Schema,
        *,
        namespace: str | None = None,
        dry_run: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        adopt: bool = False,
        allow_drop: AllowDrop = False,
        plan: MigrationPlan | None = None,
    ) -> MigrationResult:
        """Create or extend ``schema``'s tables and make its declared changes
        (see :mod:`aiofragno.migrate` and :mod:`aiofragno.schema_changes`):
        the migration plans every step, then runs that plan
        (:attr:`MigrationResult.plan`). With ``dry_run`` nothing is changed
        and the result lists the statements a real run would execute now.
        ``plan`` (from :meth:`migration_plan`, or read back with
        :meth:`MigrationPlan.from_json`) runs only if the plan made now,
        under the migration lock, is that one: else :class:`MigrationError`
        and nothing changes. ``allow_drop=True`` (or ``{"table.column",
        ...}``) lets columns and indexes no longer declared be dropped, as
        ``af.Dropped`` does. Waits at most ``lock_timeout`` seconds for the
        migration lock (and, on PostgreSQL and MySQL, for each table lock
        its DDL needs), else raises :class:`MigrationError` — as it does,
        before changing anything, for every difference from the declaration
        it does not make. ``adopt=True`` takes over an existing table of the
        same name that is not aiofragno's, adding the columns of ours (see
        :mod:`aiofragno.ownership`)."""
        check_lock_timeout(lock_timeout)
        check_allow_drop(allow_drop)
        if plan is not None and not isinstance(plan, MigrationPlan):
            raise ValidationError(
                f"plan must be an af.MigrationPlan (db.migration_plan, MigrationPlan.from_json), "
                f"got {type(plan).__name__}"
            )
        layout = self.layout(schema, namespace)
        if not dry_run:
            # Whatever it changes, a migration of the namespace may drop a
            # unique index that another schema object of it declares.
            self._unconfirm(layout.namespace)
        engine = self._engine
        transactional = engine.adapter.capabilities.supports_transactional_ddl
        spec = self._ddl.spec
        session = await engine.acquire()
        try:
            if spec.migration_setup_sql:
                # (Reset on release should the teardown not run: cancelled.)
                session.dirty = True
            for statement in spec.migration_setup_sql:
                await session.execute(CompiledQuery(statement))
            try:
                async with held_outside_transaction(session, engine.compile, spec, lock_timeout):
                    if transactional:
                        await session.begin(None)
                    result = await run_migration(
                        session,
                        engine.compile,
                        layout,
                        self._ddl,
                        engine.codec,
                        lock_timeout=lock_timeout,
                        transactional=transactional,
                        execute=not dry_run,
                        adopt=adopt,
                        allow_drop=allow_drop,
                        expected=plan,
                    )
                    if transactional:
                        await session.commit()
                    if self._replicas is not None:
                        self._replicas.committing()  # (replicas get the new tables by replay)
                    if not dry_run and result.plan is not None:
                        await run_online(session, self._ddl, result.plan, lock_timeout)
            finally:
                if not session.broken:
                    for statement in spec.migration_teardown_sql:
                        await session.execute(CompiledQuery(statement))
            if dry_run and result.changed:
                # (Found to differ: a unique index may be missing.)
                self._unconfirm_layout(id(layout))
            elif id(layout) not in self._confirmed:
                # The database is as declared: later units' catalog trusts
                # its unique indexes (see uow.catalog._unique_keys).
                self._confirmed[id(layout)] = layout.namespace
                self._catalogs.pop(id(layout), None)
            return result
        finally:
            await engine.release(session)

    def _unconfirm(self, namespace: str) -> None:
        """Trust no declared unique index of ``namespace`` until a migration
        confirms it again: later units' catalogs keep the tie-break."""
        for key in [key for key, name in self._confirmed.items() if name == namespace]:
            self._unconfirm_layout(key)

    def _unconfirm_layout(self, key: int) -> None:
        if self._confirmed.pop(key, None) is not None:
            self._catalogs.pop(key, None)

    async def migration_plan(
        self,
        schema: Schema,
        *,
        namespace: str | None = None,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        adopt: bool = False,
        allow_drop: AllowDrop = False,
    ) -> MigrationPlan:
        """The plan ``migrate`` would run now (nothing is changed): each step
        with its SQL and whether it locks or rewrites a table or destroys
        data. ``migrate(schema, plan=...)`` runs exactly it, or refuses."""
        result = await self.migrate(
            schema,
            namespace=namespace,
            dry_run=True,
            lock_timeout=lock_timeout,
            adopt=adopt,
            allow_drop=allow_drop,
        )
        assert result.plan is not None
        return result.plan

    async def inspect(self, *, namespace: str | None = None) -> LiveSchema:
        """The tables the database has, read from its catalog (see
        :mod:`aiofragno.introspection`): those migrated for ``namespace``,
        keyed by their declared names, or (None) every table of the default
        schema."""
        engine = self._engine
        session = await engine.acquire()
        try:
            return await inspect_database(session, engine.compile, engine.adapter.ddl, namespace)
        finally:
            await engine.release(session)

    async def migration_sql(self, schema: Schema, *, namespace: str | None = None) -> list[str]:
        """The statements ``migrate`` would run now, without running them."""
        return (await self.migrate(schema, namespace=namespace, dry_run=True)).statements

    def transaction(self, isolation: IsolationLevel | None = None) -> TransactionContext:
        """``async with db.transaction() as tx:`` — commit on success, roll back
        on exception; nested use makes a savepoint. ``isolation`` is one of
        "read uncommitted", "read committed", "repeatable read", "serializable"
        (SQLite transactions are always serializable)."""
        return self._engine.transaction(isolation, watcher=self._replicas)

    async def now(self) -> datetime:
        """The database server's current time, timezone-aware in UTC."""
        engine = self._engine
        value = await self.fetch_value(engine.raw(engine.adapter.sql.now))
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
        await end_server_session_reconnecting(self._engine, server_session, give_up_after)

    async def is_healthy(self, *, writable: bool = False) -> bool:
        """True if a connection answers a round trip within ``connect_timeout``
        and, with ``writable=True``, the server takes writes (not a standby,
        not read-only by configuration): the check for the readiness of a
        service that writes. Never raises; :meth:`servers` says what each
        server is."""
        engine = self._engine
        if engine.closed:
            return False
        check = engine.adapter.sql.writable if writable else None
        with runtime.move_on_after(self.options.connect_timeout):
            try:
                session = await engine.acquire(wait=False)
                try:
                    if check is None:
                        await session.connection.ping()
                        return True
                    result = await session.connection.execute_query(CompiledQuery(check))
                    return bool(result.rows[0]["writable"])
                except Exception:
                    session.broken = True
                finally:
                    await engine.release(session)
            except Error:
                pass
        return False

    async def servers(self) -> list[HostStatus]:
        """Each server the URL names (one, or a primary and its standbys or
        replicas), asked afresh on a connection of its own: its role
        ("primary", "standby" on PostgreSQL, "replica" on MySQL/MariaDB),
        whether it refuses writes, its timeline (MySQL/MariaDB: the number
        of writers in its GTID history), a standby's replay lag or a
        replica's Seconds_Behind_Master in seconds, whether it is fenced off
        as a stale primary, or why it could not be asked
        (:class:`~aiofragno.HostStatus`; its ``describe()`` says it in a
        line). Each server is given ``connect_timeout``. Empty on SQLite."""
        return await self._engine.servers()

    async def close(self) -> None:
        """Close every connection. Idempotent; the Database is unusable after."""
        try:
            await self._engine.close()
        finally:
            if self._replicas is not None:
                await self._replicas.close()

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _run(self, query: Fragment, read: Read[T]) -> Coroutine[Any, Any, T]:
        # (Shadowed by the engine's own, bound in __init__.)
        return self._engine._run(query, read)

    def _stream(self, query: Fragment, batch_size: int) -> Stream:
        return self._engine._stream(query, batch_size)

    async def open(self) -> None:
        """Open the first connection, so a bad URL or a dead server fails now
        (and, with replicas, learn the primary's kind of replication)."""
        await self._engine.open()
        if self._replicas is not None:
            await self._replicas.open()


async def _find_page(
    table: str | Table[Any],
    where: Where,
    order_by: Any,
    limit: int,
    after: str | None,
    uow: UnitOfWork,
) -> FindResult[Any]:
    rows = uow.find(table, where, order_by, limit, after)
    await uow.retrieve()
    return rows.result


def _null_order_value(row: dict[str, Any], order_by: Any) -> bool:
    """Whether ``row`` is NULL in one of ``order_by``'s columns."""
    items = order_by if isinstance(order_by, list) else [] if order_by is None else [order_by]
    names = [item[0] if isinstance(item, tuple) else item for item in items]
    return any(row.get(name) is None for name in names)


class Connect:
    """What ``af.connect`` returns: await it for a :class:`Database`, or use it
    as ``async with af.connect(url) as db`` to close the Database on exit."""

    def __init__(
        self,
        url: str,
        backend: str | None,
        options: ConnectOptions,
        replicas: ReplicaOptions | None = None,
    ) -> None:
        self._url = url
        self._backend = backend
        self._options = options
        self._replicas = replicas
        self._db: Database | None = None

    def _resolve(self, text: str) -> tuple[DatabaseURL, Options]:
        """The URL ``text`` and its options (libpq's environment, the URL's
        query, the keywords)."""
        url = parse_url(text)
        base = Options()
        if url.dialect == "postgresql":
            url, base = libpq.from_environment(url, os.environ)
        options = base.merged(url.query, self._options)
        options.check_dialect(url.dialect)
        return url, options

    async def _open(self) -> Database:
        url, options = self._resolve(self._url)
        backend = choose_backend(url, self._backend, runtime.current_runtime())
        db = Database(create_dialect(backend, url, options), url, options, backend.name)
        try:
            if self._replicas is not None:
                db._use_replicas(self._replica_set(db._engine, backend.name))
            await db.open()
        except BaseException:
            await db.close()
            raise
        return db

    def _replica_set(self, primary: Engine, backend: str) -> ReplicaSet:
        """A pool per replica URL, opened at first use (a replica down at
        connect time is passed over, not an error). A replica fails fast
        (no reconnect_deadline): the read goes elsewhere instead of waiting."""
        assert self._replicas is not None
        engines = []
        for text in self._replicas.urls:
            url, options = self._resolve(text)
            if url.dialect != primary.name:
                raise ValidationError(
                    f"replica {url.describe()} is {url.dialect}, the primary {primary.name}: "
                    "replicas are copies of the primary"
                )
            options = dataclasses.replace(options, reconnect_deadline=None)
            chosen = choose_backend(url, backend, runtime.current_runtime())
            engines.append(Engine(create_dialect(chosen, url, options), url, options, backend))
        return ReplicaSet(primary, engines, self._replicas.max_lag, self._replicas.wait)

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


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicaOptions:
    """What ``af.connect`` was told of read replicas (checked)."""

    urls: tuple[str, ...]
    max_lag: float | None
    wait: float


def replica_options(
    replicas: Sequence[str] | None,
    replica_url: str | None,
    max_replica_lag: float | None,
    replica_wait: float,
) -> ReplicaOptions | None:
    """``connect``'s replica keywords, checked; None without replicas."""
    if replicas is not None and replica_url is not None:
        raise ValidationError("pass replicas=[...] or replica_url=..., not both")
    urls = [replica_url] if replica_url is not None else replicas
    if isinstance(urls, str) or not isinstance(urls, Sequence | None):
        raise ValidationError(
            f"replicas must be a list of URLs, got {type(urls).__name__} (one replica: "
            "replicas=[url] or replica_url=url)"
        )
    if max_replica_lag is not None:
        _check_seconds("max_replica_lag", max_replica_lag)
    _check_seconds("replica_wait", replica_wait)
    if not urls:
        if max_replica_lag is not None:
            raise ValidationError("max_replica_lag needs replicas=[...]")
        return None
    for text in urls:
        if not isinstance(text, str):
            raise ValidationError(f"a replica URL must be a str, got {type(text).__name__}")
    return ReplicaOptions(tuple(urls), max_replica_lag, replica_wait)


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValidationError(f"{name} must be a number of seconds >= 0, got {value!r}")


def connect(
    url: str,
    *,
    backend: str | None = None,
    replicas: Sequence[str] | None = None,
    replica_url: str | None = None,
    max_replica_lag: float | None = None,
    replica_wait: float = DEFAULT_REPLICA_WAIT,
    **options: Unpack[ConnectOptions],
) -> Connect:
    """Open a :class:`Database` for ``url`` (see :mod:`aiofragno.url` for URL
    forms, and :class:`~aiofragno.url.Options` for what each option in
    :class:`~aiofragno.ConnectOptions` means). ``backend`` picks a driver ("asyncpg", "aiosqlite",
    "sqlite", "asyncmy"); by default the best one for the URL and the running
    event loop is used. The first connection is opened before this returns,
    so a wrong URL or a server that is down fails here
    (:class:`~aiofragno.errors.DatabaseUnavailable`; a TLS failure:
    :class:`~aiofragno.errors.TLSError`). On PostgreSQL, libpq's ``PG*``
    environment variables fill in what the URL and the keywords leave out
    (see :mod:`aiofragno.libpq`).

    ``replicas`` (or ``replica_url``, for one): PostgreSQL standbys, or
    MySQL/MariaDB GTID replicas, of ``url`` for ``db.replica`` and ``execute_uow(..., reads="replica")``,
    each a pool of its own with the same options, opened at first use.
    A replica read waits up to ``replica_wait`` seconds for the replica to
    replay the task's own commits, and passes over a replica whose replay
    lags more than ``max_replica_lag`` seconds; else it runs on the primary
    (see :mod:`aiofragno.replicas`)."""
    checked = replica_options(replicas, replica_url, max_replica_lag, replica_wait)
    return Connect(url, backend, options, checked)
