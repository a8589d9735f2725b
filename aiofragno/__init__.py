"""aiofragno: an async-first database layer for asyncio and trio.

The public API, re-exported; see the README for examples.
"""

from .backends import BackendNotInstalled
from .database import Connect, Database, connect
from .driver import CompiledQuery, QueryResult, Row
from .errors import (
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
    SchemaError,
    SerializationFailure,
    TransactionConflict,
    UniqueViolation,
    ValidationError,
)
from .session import Transaction
from .sql import Fragment, Identifier, Json, sql

__version__ = "0.1.0"

__all__ = [
    "BackendNotInstalled",
    "CheckViolation",
    "CommitOutcomeUnknown",
    "CompiledQuery",
    "ConcurrencyConflict",
    "Connect",
    "ConnectionLost",
    "DataError",
    "Database",
    "DatabaseClosed",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadlockDetected",
    "Error",
    "ForeignKeyViolation",
    "Fragment",
    "Identifier",
    "IntegrityError",
    "Json",
    "LockTimeout",
    "MigrationError",
    "NotNullViolation",
    "PoolTimeout",
    "ProgrammingError",
    "QueryCanceled",
    "QueryResult",
    "Row",
    "SchemaError",
    "SerializationFailure",
    "Transaction",
    "TransactionConflict",
    "UniqueViolation",
    "ValidationError",
    "connect",
    "sql",
]
