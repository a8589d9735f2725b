"""SQLite: capabilities, compiler settings, the meaning of its error codes,
and the settings each connection starts with. The connection code both
SQLite backends share lives in :mod:`aiofragno.backends.sqlite_connection`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, time
from decimal import Decimal
from uuid import UUID

from ..brief import brief
from ..codec import utc_instant
from ..driver import (
    Capabilities,
    CatalogSql,
    CommitPlanChoice,
    DdlSpec,
    DialectAdapter,
    SqlSnippets,
    StorageProfile,
)
from ..errors import (
    CheckViolation,
    DatabaseUnavailable,
    DataError,
    Error,
    ForeignKeyViolation,
    IntegrityError,
    LockTimeout,
    NotNullViolation,
    ProgrammingError,
    QueryCanceled,
    SerializationFailure,
    UniqueViolation,
    ValidationError,
)
from ..sql import Json, SqlCompiler, unicode_text
from ..url import DatabaseURL, Options
from .common import SessionChanges, json_param, uuid_bytes

# The SQLite library version from which RETURNING is understood.
RETURNING_SINCE = (3, 35, 0)

# Begins a transaction of reads only (see SqlSnippets.read_snapshot): it
# takes no write lock, so it runs beside the writer, outside the write gate.
READ_SNAPSHOT = "BEGIN DEFERRED"

# The catalog, through the pragma functions (a database has no schemas:
# {schema} is not used). An INTEGER PRIMARY KEY is the rowid: never NULL.
CATALOG = CatalogSql(
    tables="SELECT name FROM sqlite_master WHERE type = 'table' "
    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
    columns="SELECT name, type AS sql_type, "
    "NOT (\"notnull\" OR (pk > 0 AND lower(type) = 'integer')) AS is_nullable, "
    "dflt_value AS default_value FROM pragma_table_info({table}) ORDER BY cid",
    indexes="SELECT il.name AS name, il.\"unique\" AS is_unique, il.origin = 'pk' AS is_primary, "
    "ii.name AS column_name FROM pragma_index_list({table}) AS il, "
    "pragma_index_info(il.name) AS ii ORDER BY il.name, ii.seqno",
    # (on_update, on_delete and maybe_deferrable: what a rebuild restates;
    # the catalog does not say whether a key is DEFERRABLE, the table's text may.)
    references='SELECT NULL AS name, fk.seq + 1 AS position, fk."from" AS column_name, NULL AS to_schema, '
    'fk."table" AS to_table, fk."to" AS to_column, fk.on_update, fk.on_delete, '
    "instr(upper((SELECT sql FROM sqlite_master WHERE type = 'table' AND name = {table})), "
    "'DEFERRABLE') > 0 AS maybe_deferrable "
    "FROM pragma_foreign_key_list({table}) AS fk ORDER BY fk.id, fk.seq",
    type_spellings=((r"\s+", " "),),
)

_BASE = DialectAdapter(
    capabilities=Capabilities(
        supports_returning=True,  # (see adapter)
        supports_transactional_ddl=True,
        supports_skip_locked=False,
        supports_writable_cte=False,
        one_writer=True,
        reuses_row_ids=True,
        # (SQLITE_MAX_VARIABLE_NUMBER since 3.32.)
        max_parameters=32766,
        supports_limit_in_subquery=True,
    ),
    outbox_version_strategy="insert-on-conflict-returning",
    default_naming="suffix",
    # SQLite has no limit; keep names portable to PostgreSQL's.
    max_identifier_length=63,
    sql=SqlSnippets(
        now="SELECT strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')",
        version="SELECT sqlite_version()",
        row_share_lock="",
        version_hex="printf('%020x', CAST({value} AS INTEGER))",
        json_from_text="{x}",
        # (No rows_array: the driver sends a batch in one round trip.)
        # (A deferred transaction takes no lock until its first read, which
        # starts its read transaction: in WAL mode the snapshot it reads
        # until COMMIT.)
        read_snapshot=(READ_SNAPSHOT,),
        # "UNIQUE constraint failed: table.a, table.b": columns, not the index.
        unique_violation=r"UNIQUE constraint failed: (?P<columns>[^\[]+?)(?: \[|$)",
        # (SUM of integers fails with "integer overflow" past 64 bits: then
        # the halves; ">>" shifts arithmetically, so they add up for
        # negative values.)
        int_sum_halves=("SUM({x} >> 32)", "SUM({x} & 4294967295)"),
        int_sum_overflow="integer overflow",
        # (These two registered on each connection: aiofragno.backends.sqlite_functions.)
        text_decimal_aggregate="aiofragno_decimal_{function}({x})",
        # (SQLite's LOWER folds ASCII only; this is Python's str.lower.)
        lower="aiofragno_lower({x})",
        # (-> gives the JSON text at the path: true, 1 and "1" all differ.)
        json_path_equals="{column} -> {path} = {json}",
    ),
    commit=CommitPlanChoice("checked-in-process"),
    storage=StorageProfile(
        decimal="text",
        bool="int",
        date="text",
        timestamp="epoch-ms",
        uuid="bytes",
        time="text",
        arrays=False,
    ),
    # PRAGMA is plain only for the pragmas that read (a setting's pragma
    # with an argument sets it); ATTACH and BEGIN are not plain.
    session_changes=SessionChanges(
        r"replace|reindex|vacuum|pragma\s+(?:\w+\.)?(?:table_x?info|table_list|index_x?info"
        r"|index_list|foreign_key_list|foreign_key_check|integrity_check|quick_check"
        r"|database_list|collation_list|function_list|module_list|pragma_list"
        r"|compile_options|data_version|page_count|freelist_count)"
    ),
    ddl=DdlSpec(
        types={
            "string": "text",
            "text": "text",
            "varchar": "varchar({n})",
            "smallint": "integer",
            "integer": "integer",
            "bigint": "integer",
            # Blob affinity (the name's BLOB wins over its FLOA): a double is
            # kept as it is bound. Under REAL affinity SQLite stores a float
            # with no fraction as an integer, and -0.0 comes back as 0.0.
            "float": "float_blob",
            # Text keeps every digit: SQLite has no exact decimal type.
            "decimal": "text",
            "bool": "integer",
            "json": "text",
            "json_document": "text",
            "binary": "blob",
            "date": "text",
            "timestamp": "integer",
            # "HH:MM:SS.ffffff": fixed width, so text order is time order.
            "time": "text",
            # 16 bytes: a third of the text, and it sorts as PostgreSQL's uuid.
            "uuid": "blob",
            "enum": "text",
            "external_id": "text",
            "reference": "integer",
            "versionstamp": "text",
            "version": "integer",
        },
        # An alias of the rowid: a 64-bit key without extra storage.
        primary_key="INTEGER PRIMARY KEY",
        table_options="",
        columns_sql="SELECT name FROM pragma_table_info({table})",
        indexes_sql="SELECT name FROM pragma_index_list({table})",
        add_column_references=True,
        catalog=CATALOG,
        add_primary_key=False,
        # Columns are changed by rebuilding the table (no alter_column_sql),
        # as SQLite documents it: foreign keys off meanwhile, checked after.
        migration_setup_sql=("PRAGMA foreign_keys = OFF",),
        migration_teardown_sql=("PRAGMA foreign_keys = ON",),
        foreign_key_check_sql="PRAGMA foreign_key_check",
    ),
)


def adapter(options: Options, library_version: tuple[int, ...]) -> DialectAdapter:
    """The adapter for one Database on SQLite ``library_version`` (the linked
    library's, e.g. ``sqlite3.sqlite_version_info``): the timestamp storage
    profile is an option (``sqlite_timestamps``: "epoch-ms", the default, or
    "iso-text")."""
    base = _BASE
    if library_version < RETURNING_SINCE:
        base = replace(base, capabilities=replace(base.capabilities, supports_returning=False))
    if options.sqlite_timestamps == "epoch-ms":
        return base
    storage = replace(base.storage, timestamp="iso-text")
    ddl = replace(base.ddl, types={**base.ddl.types, "timestamp": "text"})
    return replace(base, storage=storage, ddl=ddl)


def _datetime(value: datetime) -> str:
    # ISO-8601 text; aware values in UTC so text order is time order.
    if value.tzinfo is not None:
        value = utc_instant(value)
    return value.isoformat()


def _integer(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise ValidationError(
            f"{brief(value)} is outside SQLite's 64-bit integers; bind a Decimal or text"
        )
    return value


def _real(value: float) -> float:
    if value != value:
        raise ValidationError("NaN cannot be stored: SQLite would store NULL instead")
    return value


def _time(value: time) -> str:
    try:  # (an aware time's text calls its tzinfo's utcoffset())
        return value.isoformat(timespec="microseconds")
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"the tzinfo of {brief(value, 80)} gives no valid UTC offset: {exc}"
        ) from None


def create_compiler() -> SqlCompiler:
    return SqlCompiler(
        placeholder="?",
        quote='"',
        max_identifier_length=_BASE.max_identifier_length,
        encoders={
            str: unicode_text,
            int: _integer,
            float: _real,
            # sqlite3 has no exact decimal type: text keeps every digit.
            Decimal: str,
            datetime: _datetime,
            date: date.isoformat,
            # (As a time column stores them, so that a raw comparison matches.)
            time: _time,
            UUID: uuid_bytes,
            dict: json_param,
            Json: json_param,
        },
        empty_set="SELECT NULL WHERE 0",
        # What sqlite3 binds, and what the encoders above turn into that.
        scalars=(
            *(type(None), bool, int, float, str, bytes, bytearray, memoryview),
            *(Decimal, datetime, date, time, UUID, dict, Json),
        ),
    )


# SQLite extended result codes -> error class, and the nearest SQLSTATE.
_CODES: dict[str, tuple[type[Error], str | None]] = {
    "2067": (UniqueViolation, "23505"),  # SQLITE_CONSTRAINT_UNIQUE
    "1555": (UniqueViolation, "23505"),  # SQLITE_CONSTRAINT_PRIMARYKEY
    "787": (ForeignKeyViolation, "23503"),  # SQLITE_CONSTRAINT_FOREIGNKEY
    "1299": (NotNullViolation, "23502"),  # SQLITE_CONSTRAINT_NOTNULL
    "275": (CheckViolation, "23514"),  # SQLITE_CONSTRAINT_CHECK
    "19": (IntegrityError, "23000"),  # SQLITE_CONSTRAINT
    "5": (LockTimeout, "55P03"),  # SQLITE_BUSY: another process kept the lock
    "6": (LockTimeout, "55P03"),  # SQLITE_LOCKED
    "517": (SerializationFailure, "40001"),  # SQLITE_BUSY_SNAPSHOT
    "1": (ProgrammingError, "42000"),  # SQLITE_ERROR: syntax, no such table/column
    "9": (QueryCanceled, "57014"),  # SQLITE_INTERRUPT
    "18": (DataError, "22001"),  # SQLITE_TOOBIG
    "20": (DataError, "22000"),  # SQLITE_MISMATCH
    "14": (DatabaseUnavailable, None),  # SQLITE_CANTOPEN
}

CODES: dict[str, type[Error]] = {code: cls for code, (cls, _) in _CODES.items()}
SQLSTATES: dict[str, str] = {code: state for code, (_, state) in _CODES.items() if state}


def pragmas(url: DatabaseURL, options: Options) -> list[str]:
    """The settings each connection to ``url`` starts with."""
    statements = [
        f"PRAGMA busy_timeout = {int(options.busy_timeout * 1000)}",
        "PRAGMA foreign_keys = ON",
        # LIKE (starts_with) is case-sensitive on the other databases too.
        "PRAGMA case_sensitive_like = ON",
    ]
    if not url.is_memory:
        statements.append("PRAGMA journal_mode = WAL")
    return statements
