"""aiofragno: an async-first database layer for asyncio and trio.

The public API, re-exported; see docs/ for guides with examples.
"""

from .backends import BackendNotInstalled
from .database import Connect, Database, connect
from .driver import CompiledQuery, QueryResult, Row
from .errors import (
    AlreadyApplied,
    CheckViolation,
    CommitOutcomeUnknown,
    ConcurrencyConflict,
    ConnectionLost,
    DatabaseClosed,
    DatabaseError,
    DatabaseUnavailable,
    DataError,
    DeadlockDetected,
    Error,
    ForeignKeyViolation,
    IntegrityError,
    LockTimeout,
    MigrationError,
    NotNullViolation,
    PoolTimeout,
    ProgrammingError,
    QueryCanceled,
    RowNotFound,
    SchemaError,
    SerializationFailure,
    SessionStillRunning,
    TLSError,
    TransactionClosed,
    TransactionConflict,
    UnexpectedType,
    UniqueViolation,
    ValidationError,
    WouldDeadlock,
    WrongEventLoop,
)
from .migrate import MigrationResult
from .outbox import Consumer, ConsumerHalted, DeadLetter, OutboxEntry
from .schema import Column, Index, Reference, RowId, Schema, Table, varchar
from .sql import Fragment, Identifier, Json, sql
from .stats import Stats
from .transaction import Transaction
from .uow import ExponentialBackoff, FindResult, NoRetry, RetryPolicy, UnitOfWork, UowHooks, c
from .url import ConnectOptions

__version__ = "0.1.0"

__all__ = [
    "AlreadyApplied",
    "BackendNotInstalled",
    "CheckViolation",
    "Column",
    "CommitOutcomeUnknown",
    "CompiledQuery",
    "ConcurrencyConflict",
    "Connect",
    "ConnectOptions",
    "ConnectionLost",
    "Consumer",
    "ConsumerHalted",
    "DataError",
    "Database",
    "DatabaseClosed",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadLetter",
    "DeadlockDetected",
    "Error",
    "ExponentialBackoff",
    "FindResult",
    "ForeignKeyViolation",
    "Fragment",
    "Identifier",
    "Index",
    "IntegrityError",
    "Json",
    "LockTimeout",
    "MigrationError",
    "MigrationResult",
    "NoRetry",
    "NotNullViolation",
    "OutboxEntry",
    "PoolTimeout",
    "ProgrammingError",
    "QueryCanceled",
    "QueryResult",
    "Reference",
    "RetryPolicy",
    "Row",
    "RowId",
    "RowNotFound",
    "Schema",
    "SchemaError",
    "SerializationFailure",
    "SessionStillRunning",
    "Stats",
    "TLSError",
    "Table",
    "Transaction",
    "TransactionClosed",
    "TransactionConflict",
    "UnexpectedType",
    "UniqueViolation",
    "UnitOfWork",
    "UowHooks",
    "ValidationError",
    "WouldDeadlock",
    "WrongEventLoop",
    "c",
    "connect",
    "sql",
    "varchar",
]
