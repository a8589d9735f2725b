"""PostgreSQL: capabilities, compiler settings, SQLSTATE meanings."""

from __future__ import annotations

from ..driver import DialectAdapter, IsolationLevel
from ..errors import (
    CheckViolation,
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    DeadlockDetected,
    Error,
    ForeignKeyViolation,
    IntegrityError,
    LockTimeout,
    NotNullViolation,
    ProgrammingError,
    QueryCanceled,
    SerializationFailure,
    TransactionConflict,
    UniqueViolation,
    ValidationError,
)
from ..sql import Json, SqlCompiler
from .common import isolation_sql, json_param

ADAPTER = DialectAdapter(
    supports_returning=True,
    supports_json=True,
    reports_affected_rows=True,
    supports_transactional_ddl=True,
    supports_skip_locked=True,
    supports_advisory_locks=True,
    outbox_version_strategy="insert-on-conflict-returning",
    default_naming="schema",
    max_identifier_length=63,
    now_sql="SELECT clock_timestamp()",
)


def _text(value: str) -> str:
    if "\x00" in value:
        raise ValidationError(
            "PostgreSQL cannot store NUL (\\x00) characters in text; "
            "strip them or store the value as binary (bytes)"
        )
    return value


def create_compiler() -> SqlCompiler:
    return SqlCompiler(
        placeholder="$n",
        quote='"',
        max_identifier_length=ADAPTER.max_identifier_length,
        encoders={str: _text, dict: json_param, Json: json_param},
        array_in=True,
    )


def begin_sql(isolation: IsolationLevel | None) -> str:
    return "BEGIN" if isolation is None else f"BEGIN ISOLATION LEVEL {isolation_sql(isolation)}"


# SQLSTATE -> error class; the driver's codes are SQLSTATEs.
CODES: dict[str, type[Error]] = {
    "23505": UniqueViolation,
    "23503": ForeignKeyViolation,
    "23502": NotNullViolation,
    "23514": CheckViolation,
    "40001": SerializationFailure,
    "40P01": DeadlockDetected,
    "55P03": LockTimeout,
    "57014": QueryCanceled,
    "57P01": ConnectionLost,  # admin shutdown / pg_terminate_backend
    "57P02": ConnectionLost,  # crash shutdown
    "57P03": DatabaseUnavailable,  # cannot connect now (starting up)
    "25006": ConnectionLost,  # read-only transaction: we were failed over to a replica
    "53300": DatabaseUnavailable,  # too many connections
}
PREFIXES: dict[str, type[Error]] = {
    "08": ConnectionLost,
    "22": DataError,
    "23": IntegrityError,
    "40": TransactionConflict,
    "42": ProgrammingError,
}
