"""PostgreSQL: capabilities, compiler settings, SQLSTATE meanings."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from ..codec import utc_instant
from ..driver import (
    Capabilities,
    CatalogSql,
    CommitPlanChoice,
    DdlSpec,
    DialectAdapter,
    IsolationLevel,
    OutboxTicksSql,
    ReplicationSql,
    SqlSnippets,
    StorageProfile,
)
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
    ReadOnlyDatabase,
    SerializationFailure,
    TransactionConflict,
    UniqueViolation,
    ValidationError,
)
from ..json_check import MAX_DEPTH
from ..sql import Json, SqlCompiler, unicode_text
from .common import SessionChanges, decimal_param, isolation_sql, json_param

# A server session: its backend's process id and start time (a process id
# alone is reused once the process has exited). The start time as epoch
# seconds, so that no session's TimeZone or DateStyle changes its text.
SESSION = "CAST(pid AS text) || '@' || CAST(EXTRACT(EPOCH FROM backend_start) AS text)"
SESSION_SQL = f"SELECT {SESSION} FROM pg_stat_activity WHERE pid = pg_backend_pid()"

# The insert position. When the last record ended exactly at a page's end,
# that position is past the next page's header (24 bytes; 40 at a segment's
# start), which a standby reaches only with the next record — on an idle
# primary, never: so it is taken back to the page boundary (no record ends
# inside a header).
WAL_POSITION_SQL = (
    "SELECT p - CASE WHEN p % pg_size_bytes(current_setting('wal_segment_size')) = 40 THEN 40 "
    "WHEN p % current_setting('wal_block_size')::bigint = 24 THEN 24 ELSE 0 END AS position "
    "FROM (SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint AS p) AS insert"
)
# The timeline the server writes its WAL on now: a promoted standby's new
# one as soon as it accepts writes (pg_control_checkpoint's lags until the
# next checkpoint). On a primary only (an error during recovery).
TIMELINE_SQL = (
    "CAST(CAST('x' || substr(pg_walfile_name(pg_current_wal_insert_lsn()), 1, 8) AS bit(32)) "
    "AS int)"
)
# Outbox versions numbered on timeline T are above (T - 1) << 48: the first
# on a new timeline is above all an older one could give (2**48 each), and a
# server never promoted (timeline 1) numbers as if there were no floor.
VERSION_FLOOR_BITS = 48
OUTBOX_VERSION_FLOOR = f"((CAST({TIMELINE_SQL} AS bigint) - 1) << {VERSION_FLOOR_BITS})"

# What a server is (aiofragno.hosts.ServerRole), with the session's name, in
# one round trip at connect. The timeline: a primary's from the WAL file it
# writes (pg_control_checkpoint's lags a promotion until the next
# checkpoint), a standby's from its last restart point. The replay lag: 0
# while a standby has replayed all it received (pg_last_xact_replay_timestamp
# alone grows while the primary is idle), else the age of the last
# transaction replayed.
ROLE_SQL = (
    f"SELECT ({SESSION_SQL}) AS session, pg_is_in_recovery() AS standby, "
    "current_setting('transaction_read_only') = 'on' AS read_only, "
    "(SELECT CAST(system_identifier AS text) FROM pg_control_system()) AS system, "
    "CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint()) "
    "ELSE CAST(CAST('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) AS bit(32)) "
    "AS int) END AS timeline, "
    "CASE WHEN NOT pg_is_in_recovery() THEN NULL "
    "WHEN pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() THEN 0 "
    "ELSE EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()) END "
    "AS replay_lag"
)

# The outbox's "ticks" strategy (aiofragno.outbox.ticks), after PgQ's ticks:
# each tick records the snapshot it read in; the entries committed since the
# previous tick's snapshot are those of transactions at or past its xmax or
# in progress then (its xip list), read through the index on "xid" (the
# statement sees committed rows only, as of the snapshot it records). Each
# of the two is its own index scan, found apart from the numbering: the
# range's upper bound, which no visible row reaches anyway, makes the
# planner take it as narrow, as in PgQ's batch queries; ordered by id
# together, a plan scanned the whole table in id order. They
# take the counter's next versions, in entry id order (the counter row is
# created if missing, as the counter's writers do). No tick is recorded
# when nothing committed: the next one then compares with the last recorded.
_TICKS_TABLE = '"fragno_db_outbox_ticks"'
_VERSIONS_TABLE = '"fragno_db_outbox_versions"'
_TICK_LOCK = "hashtext('aiofragno.outbox.tick')"
OUTBOX_TICK = f"""WITH prev AS (
  SELECT "snapshot" AS s FROM {_TICKS_TABLE} ORDER BY "id" DESC LIMIT 1
), fresh AS MATERIALIZED (
  SELECT o."id" FROM "fragno_db_outbox" o
  WHERE o."xid" >= (SELECT pg_snapshot_xmax(s) FROM prev)
    AND o."xid" < pg_snapshot_xmax(pg_current_snapshot())
  UNION ALL
  SELECT o."id" FROM "fragno_db_outbox" o
  WHERE o."xid" = ANY (ARRAY(SELECT pg_snapshot_xip(s) FROM prev))
), batch AS (
  SELECT "id", row_number() OVER (ORDER BY "id") AS n FROM fresh
), counted AS (
  SELECT count(*) AS total FROM batch
), reserved AS (
  INSERT INTO "fragno_db_settings" ("key", "value")
  SELECT {{key}}, CAST({OUTBOX_VERSION_FLOOR} + total AS text) FROM counted WHERE total > 0
  ON CONFLICT ("key") DO UPDATE SET "value" = CAST(GREATEST(
    CAST("fragno_db_settings"."value" AS bigint) + (SELECT total FROM counted),
    CAST(EXCLUDED."value" AS bigint)) AS text)
  RETURNING CAST("value" AS bigint) AS last
), versioned AS (
  INSERT INTO {_VERSIONS_TABLE} ("versionstamp", "entry_id")
  SELECT lpad(to_hex(r.last - c.total + b.n), 20, '0') || '0000', b."id"
  FROM batch b, reserved r, counted c
), ticked AS (
  INSERT INTO {_TICKS_TABLE} ("snapshot", "last_version")
  SELECT pg_current_snapshot(), last FROM reserved
)
SELECT total AS versioned FROM counted"""
OUTBOX_TICKS_DDL = (
    'ALTER TABLE "fragno_db_outbox" ADD COLUMN IF NOT EXISTS "xid" xid8',
    # (Entries wait for their version under ticks; the counter's still
    # carry theirs from the start.)
    'ALTER TABLE "fragno_db_outbox" ALTER COLUMN "versionstamp" DROP NOT NULL',
    # (Partial: the counter's entries, without an xid, cost it nothing.)
    'CREATE INDEX IF NOT EXISTS "fragno_db_outbox_xid" ON "fragno_db_outbox" ("xid") '
    'WHERE "xid" IS NOT NULL',
    f'CREATE TABLE IF NOT EXISTS {_TICKS_TABLE} ("id" bigint GENERATED BY DEFAULT AS IDENTITY '
    'PRIMARY KEY, "snapshot" pg_snapshot NOT NULL, "last_version" bigint, '
    '"created_at" timestamptz NOT NULL DEFAULT clock_timestamp())',
    f'CREATE TABLE IF NOT EXISTS {_VERSIONS_TABLE} ("versionstamp" varchar(24) COLLATE "C" '
    'PRIMARY KEY, "entry_id" bigint NOT NULL UNIQUE)',
    # The first tick: no entry has an xid before the column exists.
    f'INSERT INTO {_TICKS_TABLE} ("snapshot") SELECT pg_current_snapshot() '
    f"WHERE NOT EXISTS (SELECT 1 FROM {_TICKS_TABLE})",
)

# The catalog, through pg_catalog (information_schema hides what the role
# does not own, and spells types without their modifiers).
CATALOG = CatalogSql(
    tables="SELECT t.relname AS name FROM pg_class t JOIN pg_namespace n "
    "ON n.oid = t.relnamespace WHERE n.nspname = COALESCE({schema}, current_schema()) "
    "AND t.relkind IN ('r', 'p') ORDER BY t.relname",
    columns="SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS sql_type, "
    "NOT a.attnotnull AS is_nullable, pg_get_expr(d.adbin, d.adrelid) AS default_value "
    "FROM pg_attribute a JOIN pg_class t ON t.oid = a.attrelid "
    "JOIN pg_namespace n ON n.oid = t.relnamespace "
    "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    "WHERE n.nspname = COALESCE({schema}, current_schema()) AND t.relname = {table} "
    "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    indexes="SELECT i.relname AS name, x.indisunique AS is_unique, x.indisprimary AS is_primary, "
    "a.attname AS column_name FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
    "JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
    "CROSS JOIN LATERAL unnest(CAST(x.indkey AS int2[])) WITH ORDINALITY AS k(attnum, position) "
    "LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum "
    # (An invalid index, left by an interrupted CREATE INDEX CONCURRENTLY, is
    # no index: a migration drops it and builds it again.)
    "WHERE n.nspname = COALESCE({schema}, current_schema()) AND t.relname = {table} "
    "AND x.indisvalid ORDER BY i.relname, k.position",
    references="SELECT c.conname AS name, k.position, a.attname AS column_name, rn.nspname AS to_schema, "
    "r.relname AS to_table, ra.attname AS to_column FROM pg_constraint c "
    "JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
    "JOIN pg_class r ON r.oid = c.confrelid JOIN pg_namespace rn ON rn.oid = r.relnamespace "
    "CROSS JOIN LATERAL unnest(c.conkey, c.confkey) WITH ORDINALITY AS k(col, ref, position) "
    "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.col "
    "JOIN pg_attribute ra ON ra.attrelid = c.confrelid AND ra.attnum = k.ref "
    "WHERE c.contype = 'f' AND n.nspname = COALESCE({schema}, current_schema()) "
    "AND t.relname = {table} ORDER BY c.conname, k.position",
    # format_type's spelling; the short names are what DdlSpec.types writes.
    type_spellings=(
        (r' collate "[^"]*"', ""),
        (r"^varchar(?=$|\(|\[)", "character varying"),
        (r"^char(?=$|\(|\[)", "character"),
        (r"^decimal(?=$|\(|\[)", "numeric"),
        (r"^timestamptz(?=$|\[)", "timestamp with time zone"),
        (r"^timestamp(?=$|\[)", "timestamp without time zone"),
        (r"^timetz(?=$|\[)", "time with time zone"),
        (r"^time(?=$|\[)", "time without time zone"),
        (r"^int8(?=$|\[)", "bigint"),
        (r"^int4?(?=$|\[)", "integer"),
        (r"^int2(?=$|\[)", "smallint"),
        (r"^float8(?=$|\[)", "double precision"),
        (r"^float4(?=$|\[)", "real"),
        (r"^bool(?=$|\[)", "boolean"),
    ),
    default_casts=r"(?:::[a-z_ ]+(?:\([0-9, ]*\))?(?:\[\])?)+$",
)


class WalPosition(int):
    """A WAL position, in bytes from 0/0 (a replica has replayed every
    commit before it once its replay position is at least as far)."""

    __slots__ = ()

    def covers(self, other: WalPosition) -> bool:
        return self >= other

    def merged(self, other: WalPosition) -> WalPosition:
        return self if self >= other else other


REPLICATION = ReplicationSql(
    # (The insert position, not the flush position: read right after a
    # commit it is at or past the commit's record even with
    # synchronous_commit off; see WAL_POSITION_SQL.)
    position=WAL_POSITION_SQL,
    # (Caught up with all it received: no lag. Else the age of the last
    # transaction it replayed, which overstates the lag after the primary
    # was idle; a sample, not a promise. Not in recovery: a NULL position.)
    state="SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint AS position, "
    "CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
    "ELSE COALESCE(EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0) "
    "END::float8 AS lag",
    parse=WalPosition,
)


ADAPTER = DialectAdapter(
    capabilities=Capabilities(
        supports_returning=True,
        supports_transactional_ddl=True,
        supports_skip_locked=True,
        supports_writable_cte=True,
        # (The wire protocol counts a statement's parameters in 16 bits.)
        max_parameters=32767,
        streams_in_transaction=True,
        supports_lateral=True,
    ),
    outbox_version_strategy="insert-on-conflict-returning",
    default_naming="schema",
    max_identifier_length=63,
    sql=SqlSnippets(
        now="SELECT clock_timestamp()",
        version="SELECT version()",
        row_share_lock=" FOR SHARE",
        version_hex="lpad(to_hex(CAST({value} AS BIGINT)), 20, '0')",
        json_from_text="CAST({x} AS json)",
        # (An array constructor keeps its subquery's ORDER BY order.)
        rows_array="ARRAY(SELECT ROW({columns}) FROM {rest})",
        # (Only where the reads are too many to combine into one statement.
        # Repeatable read takes its snapshot at the first statement and
        # keeps it; a standby allows it, unlike serializable.)
        read_snapshot=("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",),
        # (strict: a key on an array is no match, not each element's key;
        # silent: a missing key is NULL, not an error. jsonb compares by
        # type and value.)
        json_path_equals="jsonb_path_query_first({column}, CAST('strict ' || {path} AS "
        "jsonpath), '{{}}', TRUE) = CAST({json} AS jsonb)",
        session_process=f"SELECT pid AS process FROM pg_stat_activity WHERE {SESSION} = {{session}}",
        end_process="SELECT pg_terminate_backend({process})",
        local_commit="SET LOCAL synchronous_commit = local",
        # (On in recovery and with default_transaction_read_only: outside a
        # transaction, the session's default.)
        writable="SELECT current_setting('transaction_read_only') = 'off' AS writable",
        replication=(REPLICATION,),
        # (The settings table holds the counter row; this mode lets readers and
        # row-share lockers through, and waits for — then holds off — writers.)
        outbox_snapshot_lock='LOCK TABLE "fragno_db_settings" IN SHARE ROW EXCLUSIVE MODE',
        # (Delivered at COMMIT, once per transaction however often sent.)
        outbox_wake="pg_notify('fragno_db_outbox', '')",
        outbox_channel="fragno_db_outbox",
        outbox_ticks=OutboxTicksSql(
            entry_xid="pg_current_xact_id()",
            try_lock=f"SELECT pg_try_advisory_xact_lock({_TICK_LOCK}) AS taken",
            lock=f"SELECT TRUE AS taken FROM pg_advisory_xact_lock({_TICK_LOCK})",
            tick=OUTBOX_TICK,
        ),
        outbox_version_floor=OUTBOX_VERSION_FLOOR,
    ),
    commit=CommitPlanChoice(
        "one-committing-statement",
        # (The text is not an integer, and the error quotes it.)
        abort_sql="CAST({message} AS integer)",
    ),
    storage=StorageProfile(text_rejects_nul=True, extreme_dates_are_infinity=True),
    session_changes=SessionChanges(
        # (SET LOCAL, SET TRANSACTION and SET CONSTRAINTS end with the transaction.)
        "table|merge|show|comment|vacuum|refresh|reindex|cluster|notify|fetch|move"
        r"|set\s+(?:local|transaction|constraints)",
        # Session settings and advisory locks (not the _xact_ ones, which end
        # with the transaction), the temporary schema, SELECT INTO a temporary
        # table, a dblink connection, the random seed.
        ("set_config", "advisory_lock", "pg_temp", r"into\s+temp", "dblink_connect", "setseed"),
    ),
    ddl=DdlSpec(
        types={
            "string": "text",
            "text": "text",
            "varchar": "varchar({n})",
            "smallint": "smallint",
            "integer": "integer",
            "bigint": "bigint",
            "float": "double precision",
            "decimal": "numeric",
            "bool": "boolean",
            "json": "jsonb",
            # Kept as written: jsonb would be parsed into binary on every
            # write and printed back to text on every read.
            "json_document": "json",
            "binary": "bytea",
            "date": "date",
            "timestamp": "timestamptz",
            "time": "time",
            "uuid": "uuid",
            # (Checked against the declared set by the codec: a CHECK would
            # need altering whenever the set grows.)
            "enum": "text",
            "array": "{element}[]",
            "external_id": "varchar(64)",
            "reference": "bigint",
            "versionstamp": 'varchar(24) COLLATE "C"',
            "version": "integer",
        },
        primary_key="bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        table_options="",
        columns_sql="SELECT column_name AS name FROM information_schema.columns "
        "WHERE table_schema = COALESCE({schema}, current_schema()) AND table_name = {table}",
        indexes_sql="SELECT indexname AS name FROM pg_indexes "
        "WHERE schemaname = COALESCE({schema}, current_schema()) AND tablename = {table}",
        create_schema_sql="CREATE SCHEMA IF NOT EXISTS {schema}",
        # (lock_timeout bounds the wait, and the DDL's table locks after it.)
        migration_lock_sql="SELECT TRUE AS taken FROM pg_advisory_xact_lock(hashtext({key}))",
        lock_timeout_sql="SELECT set_config('lock_timeout', CAST(CAST({milliseconds} AS integer) "
        "AS text), TRUE)",
        current_schema_sql="SELECT current_schema() AS name",
        # (DROP COLUMN would take the key with it; said, so that the plan shows it.)
        drop_foreign_key_sql="DROP CONSTRAINT {name}",
        outbox_ticks_sql=OUTBOX_TICKS_DDL,
        catalog=CATALOG,
        alter_column_sql={
            "type": "ALTER TABLE {table} ALTER COLUMN {column} TYPE {type}",
            "null": "ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL",
            "not_null": "ALTER TABLE {table} ALTER COLUMN {column} SET NOT NULL",
            "set_default": "ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT {default}",
            "drop_default": "ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT",
        },
        # (varchar(n) to varchar(m > n) or text keeps the rows as they are.)
        rewriting_changes=frozenset({"widen_integer"}),
        rename_index_sql="ALTER INDEX {index} RENAME TO {new}",
        online_index_sql="CREATE {unique}INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} "
        "({columns})",
        online_outside_transaction=True,
        online_lock_sql=(
            "SELECT set_config('lock_timeout', CAST(CAST({milliseconds} AS integer) AS text), "
            "FALSE)",
            "SELECT pg_try_advisory_lock(hashtext({key})) AS taken",
        ),
        online_unlock_sql=(
            "SELECT pg_advisory_unlock(hashtext({key}))",
            "RESET lock_timeout",
        ),
        invalid_index_sql="SELECT 1 AS invalid FROM pg_index x JOIN pg_class i "
        "ON i.oid = x.indexrelid JOIN pg_namespace n ON n.oid = i.relnamespace "
        "WHERE n.nspname = COALESCE({schema}, current_schema()) AND i.relname = {index} "
        "AND NOT x.indisvalid",
        drop_index_online_sql="DROP INDEX CONCURRENTLY IF EXISTS {index}",
    ),
)


def _text(value: str) -> str:
    unicode_text(value)
    if "\x00" in value:
        raise ValidationError(
            "PostgreSQL cannot store NUL (\\x00) characters in text; "
            "strip them or store the value as binary (bytes)"
        )
    return value


def _timestamp(value: datetime) -> datetime:
    """A raw datetime: aware ones as UTC (refusing those without an instant),
    never the first or last one, which the driver would send as infinity."""
    utc = value if value.tzinfo is None else utc_instant(value)
    if utc.replace(tzinfo=None) in (datetime.min, datetime.max):
        raise ValidationError(f"{value!r} cannot be stored: the driver would write it as infinity")
    return utc


def _date(value: date) -> date:
    if value in (date.min, date.max):
        raise ValidationError(f"{value!r} cannot be stored: the driver would write it as infinity")
    return value


def _items(value: list[Any] | tuple[Any, ...], depth: int = 1) -> list[Any] | tuple[Any, ...]:
    """A list or tuple parameter (an array, or a row) with its items encoded
    like parameters of their own: no value skips its checks inside one.
    Nested at most MAX_DEPTH levels (an array has at most 6 dimensions)."""
    if depth > MAX_DEPTH:
        raise ValidationError(f"a list or tuple parameter nested more than {MAX_DEPTH} levels")
    encoded = [
        _items(item, depth + 1) if type(item) in (list, tuple) else _encode(item) for item in value
    ]
    return encoded if isinstance(value, list) else tuple(encoded)


def _encode(value: Any) -> Any:
    encoder = ENCODERS.get(type(value))
    return value if encoder is None else encoder(value)


ENCODERS: dict[type, Callable[[Any], Any]] = {
    str: _text,
    dict: json_param,
    Json: json_param,
    # numeric: 131072 digits before the point, 16383 after; beyond them the
    # driver sends 0.
    Decimal: decimal_param(131072, 16383, special=True),
    datetime: _timestamp,
    date: _date,
    list: _items,
    tuple: _items,
}


def create_compiler() -> SqlCompiler:
    return SqlCompiler(
        placeholder="$n",
        quote='"',
        max_identifier_length=ADAPTER.max_identifier_length,
        encoders=ENCODERS,
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
    "25006": ReadOnlyDatabase,  # a write in a read-only transaction: a standby, or configured so
    "53300": DatabaseUnavailable,  # too many connections
}
PREFIXES: dict[str, type[Error]] = {
    "08": ConnectionLost,
    "22": DataError,
    "23": IntegrityError,
    "40": TransactionConflict,
    "42": ProgrammingError,
}
