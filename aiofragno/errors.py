"""The exception hierarchy, and the table-driven mapping from driver errors to it.

Every exception aiofragno raises is an :class:`Error`. Errors that came from a
driver keep the driver's exception as ``__cause__``; database errors carry the
SQLSTATE (``sqlstate``) and the driver's own code (``code``) where known.

Each backend describes its driver's errors with an :class:`ErrorTable`; the core
translates with it in one place, so no backend re-implements the mapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .schema_diff import Difference


class Error(Exception):
    """Base class of every exception raised by aiofragno."""


class ValidationError(Error, ValueError):
    """Bad input caught before it reached the database (nothing was sent).

    Unknown tables or columns, values of the wrong type, unsafe identifiers,
    values a backend cannot store exactly.
    """


class SchemaError(Error):
    """A schema declaration is invalid."""


class MigrationError(Error):
    """A migration could not be applied; the database is left as it was where
    the database has transactional DDL. ``differences``: the differences from
    the declaration that made ``migrate()`` refuse, before it changed anything
    (:mod:`aiofragno.schema_diff`; empty for other causes)."""

    differences: tuple[Difference, ...] = ()


class ConcurrencyConflict(Error):
    """A unit of work kept conflicting with concurrent writers until its retry
    policy gave up. ``attempts`` is how many times it ran."""

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class AlreadyApplied(Error):
    """A unit of work with this ``idempotency_key`` has already committed (in
    an earlier ``execute_uow`` call), so this one wrote nothing: a key
    applies a unit at most once. Treat it as the earlier call's success;
    ``versionstamp`` is that call's outbox entry, where it wrote one."""

    def __init__(
        self, message: str, *, idempotency_key: str, versionstamp: str | None = None
    ) -> None:
        super().__init__(message)
        self.idempotency_key = idempotency_key
        self.versionstamp = versionstamp


class OutboxCursorPruned(Error):
    """An outbox read (``list``, ``tail``, a consumer) started from a cursor
    older than the outbox's prune horizon: entries after that cursor were
    deleted by ``db.outbox.prune()``, so reading on would silently skip
    them. ``cursor`` is the cursor given, ``horizon`` the versionstamp of
    the newest pruned entry (a cursor at or past it reads on). Rebuild what
    the reader derives from the outbox, or accept the loss and go on from
    ``horizon``; to keep this from happening, register the reader as a
    consumer (prune never passes a consumer's cursor) or widen the window
    that prune keeps."""

    def __init__(self, message: str, *, cursor: str, horizon: str) -> None:
        super().__init__(message)
        self.cursor = cursor
        self.horizon = horizon


class RowNotFound(Error):
    """A unit of work's update or delete named a row that does not exist (by
    an id the unit had not read), so the unit was rolled back: nothing was
    written, and no outbox entry announces a change that did not happen.
    Read the row in the retrieval phase to act only when it exists."""


class UnexpectedType(Error, TypeError):
    """A query's result was not of the type the caller asked for:
    ``fetch_value(query, int)`` got None (no row, or NULL) or a value of
    another type. What the query did stands (a statement that wrote has
    written)."""


class DatabaseClosed(Error):
    """The :class:`~aiofragno.Database` was closed; open a new one with
    ``af.connect``."""


class PoolTimeout(Error):
    """No connection became free within ``acquire_timeout``: raise ``pool_size``
    or shorten what holds connections (long transactions)."""


class TransactionClosed(Error):
    """A ``db.transaction()`` was used after it ended (committed or rolled
    back): nothing was sent."""


class WouldDeadlock(Error):
    """The call would wait for a lock that the calling task itself holds, so
    it was refused before writing anything (e.g. a unit of work's writes
    inside a ``db.transaction()`` on SQLite, whose one writer that
    transaction holds)."""


class ReadOnlyUnit(Error):
    """A unit of work run with ``reads="replica"`` queued a write (or a
    check): such a unit only reads, so it was refused before the write's
    SQL — nothing was written. Run the unit with ``reads="primary"`` (the
    default) to write."""


class WrongEventLoop(Error):
    """A :class:`~aiofragno.Database` whose connections belong to the asyncio
    loop that opened them (asyncpg's and asyncmy's) was used from another
    loop; nothing was sent. Open the Database in the loop that uses it."""


class DatabaseError(Error):
    """An error reported by the database or its driver.

    ``sqlstate`` is the SQLSTATE where one applies (MySQL and SQLite codes are
    mapped to the nearest standard SQLSTATE), ``code`` the driver's own code
    (PostgreSQL SQLSTATE, MySQL error number, SQLite extended result code).
    """

    def __init__(
        self, message: str, *, sqlstate: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.code = code


class IntegrityError(DatabaseError):
    """A constraint was violated; the statement changed nothing."""


class UniqueViolation(IntegrityError):
    """A unique constraint or primary key was violated."""


class ForeignKeyViolation(IntegrityError):
    """A foreign key points to a missing row, or a referenced row is still in use."""


class NotNullViolation(IntegrityError):
    """NULL was written to a NOT NULL column."""


class CheckViolation(IntegrityError):
    """A CHECK constraint failed."""


class TransactionConflict(DatabaseError):
    """The transaction lost against a concurrent one and was rolled back by the
    server. Re-running the whole transaction is the remedy (``execute_uow`` does
    that for you)."""


class SerializationFailure(TransactionConflict):
    """SQLSTATE 40001: the server could not serialize this transaction."""


class DeadlockDetected(TransactionConflict):
    """SQLSTATE 40P01 / MySQL 1213: the server broke a deadlock by aborting us."""


class LockTimeout(TransactionConflict):
    """A lock was not granted in time (MySQL 1205, PostgreSQL 55P03, SQLite
    ``database is locked`` after ``busy_timeout``)."""


class ProgrammingError(DatabaseError):
    """The SQL is wrong: syntax error, unknown table or column, wrong arity."""


class DataError(DatabaseError):
    """The database rejected a value: out of range, too long, invalid text."""


class QueryCanceled(DatabaseError):
    """The statement was cancelled by the server (statement timeout, admin)."""


class ConnectionLost(DatabaseError):
    """The connection broke while in use. What was in flight is lost; anything
    not yet committed was rolled back by the server."""


class CommitOutcomeUnknown(ConnectionLost):
    """The connection broke while COMMIT was in flight: the transaction may or
    may not have been applied. aiofragno never re-applies it silently; check the
    data (or enable the outbox, which lets ``execute_uow`` resolve this).

    The server may not even have read the COMMIT yet, so look only after the
    lost session has ended: ``server_session`` names it (see
    :attr:`aiofragno.driver.Connection.server_session`), and
    ``await db.end_session(exc.server_session)`` ends it and waits until it is
    gone."""

    def __init__(
        self,
        message: str,
        *,
        sqlstate: str | None = None,
        code: str | None = None,
        server_session: str | None = None,
    ) -> None:
        super().__init__(message, sqlstate=sqlstate, code=code)
        self.server_session = server_session


class SessionStillRunning(DatabaseError):
    """A server session that was asked to end still runs (see
    ``Database.end_session``): what its transaction does is not final yet."""


class DatabaseUnavailable(DatabaseError):
    """The server could not be reached (refused, unreachable, not accepting
    connections) within the deadline. Check that it is running and that the URL
    is right."""


class ReadOnlyDatabase(DatabaseError):
    """The server refused a write because it only reads: a standby (replica),
    or a database made read-only by configuration (PostgreSQL's
    ``default_transaction_read_only``, MySQL's ``read_only`` or a ``READ
    ONLY`` transaction). Nothing was written, and aiofragno does not retry:
    waiting would not make this server writable. Point the URL at the
    primary (or promote this server), then run the work again."""


class TLSError(DatabaseError):
    """A TLS connection could not be set up as the options ask: the server's
    certificate failed verification (a CA not trusted, a host name the
    certificate does not name), the server offers no TLS while ``sslmode``
    requires it, or the handshake failed (a client certificate refused, say).

    Not a :class:`DatabaseUnavailable`: nothing transient, so aiofragno never
    retries it. The message says what to change: the certificates, the host
    name connected to, or ``sslmode``."""


class ErrorTable:
    """What one backend's driver errors mean.

    A driver exception is classified by, in order: its exact code (SQLSTATE,
    MySQL error number or SQLite extended result code, as a string); the first
    two characters of that code when it is a SQLSTATE class (``"08"``); its
    exception type; otherwise it is a plain :class:`DatabaseError`.
    """

    def __init__(
        self,
        *,
        codes: Mapping[str, type[Error]],
        prefixes: Mapping[str, type[Error]] | None = None,
        types: Iterable[tuple[type[BaseException], type[Error]]] = (),
        sqlstates: Mapping[str, str] | None = None,
    ) -> None:
        """``sqlstates`` maps driver codes to SQLSTATEs; omit it when the
        driver's codes are SQLSTATEs."""
        self.codes = dict(codes)
        self.prefixes = dict(prefixes or {})
        self.types = tuple(types)
        # None: the driver's codes are SQLSTATEs already (PostgreSQL).
        self.sqlstates = None if sqlstates is None else dict(sqlstates)

    def classify(self, exc: BaseException, code: str | None) -> type[Error]:
        """The aiofragno class for ``exc`` carrying driver code ``code``."""
        if code is not None:
            cls = self.codes.get(code) or self.prefixes.get(code[:2])
            if cls is not None:
                return cls
        for exc_type, cls in self.types:
            if isinstance(exc, exc_type):
                return cls
        return DatabaseError

    def translate(
        self, exc: BaseException, code: str | None = None, message: str | None = None
    ) -> Error:
        """Build the aiofragno error for ``exc``; raise it ``from exc``.
        ``message`` replaces ``str(exc)`` where the driver's own is not
        written for people (a tuple's repr, say)."""
        cls = self.classify(exc, code)
        sqlstate = code if code is None or self.sqlstates is None else self.sqlstates.get(code)
        message = message or str(exc) or type(exc).__name__
        if issubclass(cls, DatabaseError):
            if code is not None:
                message = f"{message} [code {code}]"
            return cls(message, sqlstate=sqlstate, code=code)
        return cls(message)
