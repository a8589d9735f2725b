"""MySQL and MariaDB: capabilities, compiler settings, error numbers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from ..brief import brief
from ..driver import (
    Capabilities,
    CatalogSql,
    CommitPlanChoice,
    DdlSpec,
    DialectAdapter,
    IsolationLevel,
    ReplicationSql,
    SqlSnippets,
    StaleGuard,
    StorageProfile,
    UpsertSql,
)
from ..errors import (
    CheckViolation,
    ConnectionLost,
    DatabaseUnavailable,
    DataError,
    DeadlockDetected,
    Error,
    ForeignKeyViolation,
    LockTimeout,
    NotNullViolation,
    ProgrammingError,
    QueryCanceled,
    ReadOnlyDatabase,
    SerializationFailure,
    UniqueViolation,
    ValidationError,
)
from ..hosts import ServerRole
from ..sql import Json, SqlCompiler, unicode_text
from .common import (
    SessionChanges,
    decimal_param,
    isolation_sql,
    json_param,
    utc_naive,
    uuid_bytes,
)
from .gtid import DomainPosition, GtidSet

# What a server is (aiofragno.hosts.ServerRole), asked at connect when the
# URL names several servers or target_session_attrs asks for a kind: whether
# it refuses writes (read_only — root's READ_ONLY ADMIN / SUPER writes
# through it, an application's user does not — or InnoDB read-only), its
# server id and GTID history, whether it replicates (MariaDB: its running
# replica SQL threads; MySQL 8: its running applier channels). Each
# variable read is in memory; the status table is the server's counters.
MARIADB_ROLE_SQL = (
    "SELECT @@read_only, @@innodb_read_only, @@server_id, @@gtid_binlog_state, "
    "(SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS "
    "WHERE VARIABLE_NAME = 'SLAVES_RUNNING')"
)
MYSQL_ROLE_SQL = (
    "SELECT @@read_only OR @@super_read_only, @@innodb_read_only, @@server_uuid, "
    "@@gtid_executed, (SELECT COUNT(*) FROM performance_schema.replication_applier_status "
    "WHERE SERVICE_STATE = 'ON')"
)
# A replica's lag: Seconds_Behind_Master (MariaDB; MySQL 8's
# Seconds_Behind_Source), NULL while it is not connected to its primary. Needs
# MariaDB's SLAVE MONITOR or MySQL's REPLICATION CLIENT privilege.
REPLICA_STATUS_SQL = "SHOW SLAVE STATUS"
_LAG_COLUMNS = ("Seconds_Behind_Master", "Seconds_Behind_Source")


def role_sql(server_version: str) -> str:
    """The role query for the server whose handshake said ``server_version``."""
    return MARIADB_ROLE_SQL if "MariaDB" in server_version else MYSQL_ROLE_SQL


def server_role(row: Sequence[Any], replication_set: str) -> ServerRole:
    """The role query's ``row`` as a :class:`~aiofragno.hosts.ServerRole`.

    MariaDB and MySQL have no timeline, the fence's measure of promotions:
    its stand-in here is the number of servers that have written the GTID
    history a server holds (MariaDB's ``gtid_binlog_state`` keeps the last
    GTID of each server id; MySQL's ``gtid_executed`` names each server's
    uuid), counting the server itself when it takes writes. A promoted
    replica has its old primary's writes and its own: one writer more than
    the old primary, which, coming back, holds its own writes only — and is
    fenced off. The limit: a server promoted a second time (after it
    followed the new primary, whose writes it then holds) adds no writer,
    so only the first promotion among the same servers is fenced for. The
    fence keeps what it saw per ``replication_set`` (the URL's hosts): the
    servers carry no identity of their set, as PostgreSQL's system
    identifier is."""
    read_only, innodb_read_only, server_id, history, replicating = row
    writers = _writers(str(history or ""))
    replica = int(replicating or 0) > 0
    refuses = bool(int(read_only)) or bool(int(innodb_read_only))
    if not (refuses or replica):
        writers.add(str(server_id))
    return ServerRole(
        standby=replica,
        read_only=refuses or replica,
        system=replication_set,
        timeline=len(writers),
    )


def _writers(history: str) -> set[str]:
    """The servers that wrote a GTID history: the server ids of MariaDB's
    ``domain-server-sequence`` entries, the uuids of MySQL's ``uuid:ranges``."""
    entries = [entry.strip() for entry in history.split(",") if entry.strip()]
    return {entry.partition(":")[0] if ":" in entry else entry.split("-")[1] for entry in entries}


def replica_lag(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> float | None:
    """A replica's lag in seconds from :data:`REPLICA_STATUS_SQL`'s result:
    None when it is no replica or not connected to its primary."""
    if not rows:
        return None
    status = dict(zip(columns, rows[0], strict=False))
    lag = next((status[name] for name in _LAG_COLUMNS if name in status), None)
    return None if lag is None else float(lag)


SESSION_LOCK_SQL = "SELECT GET_LOCK(%s, 0)"
# The id of the connection holding a session lock; NULL once that one is gone.
SESSION_HOLDER_SQL = "SELECT IS_USED_LOCK(%s)"

# A stale-operation guard (StaleGuard): a statement that fails, quoting its
# message, only when the statement before it matched no row. Neither MySQL nor
# MariaDB can raise an error of one's own outside a stored program, so this
# sets the session's time zone to what it is, or to the message, which is no
# time zone: error 1298, "Unknown or incorrect time zone: '<message>'".
# ({count}: the rows the statement before matched. ROW_COUNT() counts matched
# rows, not changed ones, under the FOUND_ROWS client flag; FOUND_ROWS() is
# the rows the last SELECT returned.) The test is "fewer than one", not "0":
# once the client has gone, the server goes on running the batch, and there
# ROW_COUNT() after an UPDATE that matched nothing is -1.
_GUARD = "SET SESSION time_zone = IF({count} < 1, {{message}}, @@SESSION.time_zone)"

# The catalog, through information_schema (aliases in lower case: MySQL
# names its columns in upper case).
_WHERE = "table_schema = COALESCE({schema}, DATABASE()) AND table_name = {table}"
CATALOG = CatalogSql(
    tables="SELECT table_name AS name FROM information_schema.tables "
    "WHERE table_schema = COALESCE({schema}, DATABASE()) AND table_type = 'BASE TABLE' "
    "ORDER BY table_name",
    columns="SELECT column_name AS name, column_type AS sql_type, "
    "is_nullable = 'YES' AS is_nullable, column_default AS default_value "
    f"FROM information_schema.columns WHERE {_WHERE} ORDER BY ordinal_position",
    indexes="SELECT index_name AS name, non_unique = 0 AS is_unique, "
    "index_name = 'PRIMARY' AS is_primary, column_name AS column_name "
    f"FROM information_schema.statistics WHERE {_WHERE} ORDER BY index_name, seq_in_index",
    references="SELECT constraint_name AS name, ordinal_position AS position, "
    "column_name AS column_name, "
    "referenced_table_schema AS to_schema, referenced_table_name AS to_table, "
    "referenced_column_name AS to_column FROM information_schema.key_column_usage "
    f"WHERE {_WHERE} AND referenced_table_name IS NOT NULL "
    "ORDER BY constraint_name, ordinal_position",
    type_spellings=(
        # Display widths (older servers: bigint(20)) mean nothing but for
        # tinyint(1), which is how a boolean is reported.
        (r"^(tinyint|smallint|mediumint|int|bigint)\((?!1\))\d+\)", r"\1"),
        (r"^(smallint|mediumint|int|bigint)\(1\)", r"\1"),
        (r"^integer\b", "int"),
        (r"^bool(ean)?$", "tinyint(1)"),
        # MariaDB's json is longtext with a check that it holds JSON.
        (r"^json$", "longtext"),
    ),
    null_default="NULL",
)

# Read replicas (aiofragno.replicas) through GTIDs. The position after a
# commit is the server's whole executed GTID state (read on the connection
# that committed, so it includes the commit); a replica waits for it on
# its own (MASTER_GTID_WAIT / WAIT_FOR_EXECUTED_GTID_SET) instead of being
# polled. The lag is the replica's Seconds_Behind_Master, in whole seconds:
# 0 is "less than one", NULL (replication stopped, or not connected) unknown.
MARIADB_REPLICATION = ReplicationSql(
    position="SELECT @@GLOBAL.gtid_binlog_pos AS position",
    # (One row per source; none on a server that is not a replica. ALL:
    # the only form that shows Gtid_Slave_Pos.)
    state="SHOW ALL SLAVES STATUS",
    state_position="Gtid_Slave_Pos",
    state_lag="Seconds_Behind_Master",
    parse=DomainPosition.parse,
    wait="SELECT MASTER_GTID_WAIT({position}, {seconds}) = 0 AS reached",
    server="MariaDB",
)
MYSQL_REPLICATION = ReplicationSql(
    position="SELECT @@GLOBAL.gtid_executed AS position",
    # (MySQL 8.0.22+; Executed_Gtid_Set is the replica's @@gtid_executed.)
    state="SHOW REPLICA STATUS",
    state_position="Executed_Gtid_Set",
    state_lag="Seconds_Behind_Source",
    parse=GtidSet.parse,
    wait="SELECT WAIT_FOR_EXECUTED_GTID_SET({position}, {seconds}) = 0 AS reached",
)

ADAPTER = DialectAdapter(
    capabilities=Capabilities(
        supports_returning=False,
        supports_transactional_ddl=False,
        supports_skip_locked=True,
        supports_writable_cte=False,
        # (A prepared statement's limit; the driver binds client-side, but a
        # list that works here should work on the server's own protocol.)
        max_parameters=65535,
        sort_prefix_bytes=1024,
        unites_reads=True,
    ),
    outbox_version_strategy="insert-on-duplicate-last-insert-id",
    default_naming="suffix",
    max_identifier_length=64,
    sql=SqlSnippets(
        now="SELECT UTC_TIMESTAMP(6)",
        version="SELECT version()",
        row_share_lock=" LOCK IN SHARE MODE",
        version_hex="LPAD(LOWER(HEX(CAST({value} AS UNSIGNED))), 20, '0')",
        json_from_text="{x}",
        # (No rows_array: the driver sends a batch in one round trip.)
        # (A consistent snapshot needs repeatable read, which the server's
        # default may not be; the snapshot is taken at START TRANSACTION,
        # and every consistent read of the transaction uses it.)
        read_snapshot=(
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
            "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        ),
        # (MariaDB's JSON is text and JSON_EXTRACT gives the value's text
        # from the document, which aiofragno wrote compact: compared as
        # bytes, true, 1 and "1" all differ, and so do "a" and "A".)
        json_path_equals="CAST(JSON_EXTRACT({column}, {path}) AS BINARY) = CAST({json} AS BINARY)",
        # A session is named by a user-level lock it takes at connect
        # (SESSION_LOCK_SQL) and holds until it ends: connection ids are reused
        # after a server restart.
        session_process="SELECT process FROM (SELECT IS_USED_LOCK({session}) AS process) AS s "
        "WHERE process IS NOT NULL",
        end_process="KILL CONNECTION {process}",
        # (A replica is read_only by convention; innodb_read_only is a
        # read-only server. Accounts with SUPER / READ ONLY ADMIN may still
        # write to a read_only server: it is not writable for aiofragno.)
        writable="SELECT NOT (@@global.read_only OR @@innodb_read_only) AS writable",
        replication=(MARIADB_REPLICATION, MYSQL_REPLICATION),
        outbox_read_horizon="SELECT {v} FROM {t} WHERE {k} = {key} LOCK IN SHARE MODE",
        # ON DUPLICATE KEY UPDATE fires on the first unique key the row
        # collides on, not only the one named: each assignment applies only
        # to a row holding the proposed key (then 2 affected rows: the
        # version always changes); otherwise the key's row is updated next.
        upsert=UpsertSql(
            into="INSERT INTO {table}",
            clause=" ON DUPLICATE KEY UPDATE {assignments}",
            assign="{column} = IF({matches}, VALUES({column}), {column})",
            bump="{column} = IF({matches}, {column} + 1, {column})",
            matches="{column} <=> VALUES({column})",
            unchanged="ROW_COUNT() <> 2",
        ),
        # "Duplicate entry 'x' for key 'name'" (MySQL 8: 'table.name').
        unique_violation=r"for key '(?:[^']*\.)?(?P<index>[^'.]+)'",
    ),
    commit=CommitPlanChoice(
        "guarded-batch",
        stale_guard=StaleGuard(
            after_write=_GUARD.format(count="ROW_COUNT()"),
            after_read=_GUARD.format(count="FOUND_ROWS()"),
        ),
    ),
    storage=StorageProfile(
        timestamp="utc-naive",
        string_max_chars=255,
        decimal_digits=(35, 30),
        # MariaDB refuses JSON nested 32 levels deep (a CHECK on json_valid),
        # and a value sits 4 levels down in an outbox entry's payload and 5
        # in its dead letter.
        json_max_depth=26,
        # A DOUBLE keeps only 0.0 for -0.0.
        float_negative_zero=False,
        uuid="bytes",
        time="timedelta",
        arrays=False,
    ),
    session_changes=SessionChanges(
        "replace|table|show|describe|desc|rename|optimize|check|checksum|kill",
        # User-level locks, user variables (:= and SELECT INTO @), executable
        # comments, and a second statement in the same text.
        ("get_lock", ":=", r"into\s+@", r"/\*m?!", r";\s*\S"),
    ),
    ddl=DdlSpec(
        types={
            # varchar(255) so that string columns can be indexed (3 per key).
            "string": "varchar(255)",
            "text": "longtext",
            "varchar": "varchar({n})",
            "smallint": "smallint",
            "integer": "int",
            "bigint": "bigint",
            "float": "double",
            "decimal": "decimal(65,30)",
            "bool": "boolean",
            "json": "json",
            "json_document": "json",
            "binary": "longblob",
            "date": "date",
            "timestamp": "datetime(6)",
            "time": "time(6)",
            # 16 bytes: a third of char(36), and it sorts as PostgreSQL's uuid.
            "uuid": "binary(16)",
            "enum": "varchar(255)",
            "external_id": "varchar(64)",
            "reference": "bigint",
            "versionstamp": "char(24)",
            "version": "int",
        },
        primary_key="bigint NOT NULL AUTO_INCREMENT PRIMARY KEY",
        # Binary and NO PAD: 'a' and 'a ' are different strings, as elsewhere.
        # (MariaDB's name; on Oracle MySQL 8 the equivalent is utf8mb4_0900_bin.)
        table_options=" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_nopad_bin",
        columns_sql="SELECT column_name AS name FROM information_schema.columns "
        "WHERE table_schema = COALESCE({schema}, DATABASE()) AND table_name = {table}",
        indexes_sql="SELECT DISTINCT index_name AS name FROM information_schema.statistics "
        "WHERE table_schema = COALESCE({schema}, DATABASE()) AND table_name = {table}",
        backslash_escapes=True,
        migration_lock_sql="SELECT GET_LOCK({key}, {seconds}) AS taken",
        # (DEFAULT: the global value, which every new connection starts with.)
        lock_timeout_sql="SET SESSION lock_wait_timeout = {whole_seconds}",
        lock_timeout_reset_sql="SET SESSION lock_wait_timeout = DEFAULT",
        migration_unlock_sql="SELECT RELEASE_LOCK({key})",
        drop_index_sql="DROP INDEX {index} ON {table}",
        drop_index_clause="DROP INDEX {index}",
        foreign_keys_need_an_index=True,
        drop_foreign_key_sql="DROP FOREIGN KEY {name}",
        catalog=CATALOG,
        alter_column_sql={
            "type": "ALTER TABLE {table} MODIFY COLUMN {definition}",
            "null": "ALTER TABLE {table} MODIFY COLUMN {definition}",
            "not_null": "ALTER TABLE {table} MODIFY COLUMN {definition}",
            "set_default": "ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT {default}",
            "drop_default": "ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT",
        },
        # (MODIFY COLUMN may copy the table; said so rather than guessed.)
        rewriting_changes=frozenset({"widen_integer", "widen_text", "null", "not_null"}),
        rename_index_sql="ALTER TABLE {table} RENAME INDEX {index} TO {new}",
        online_index_sql="CREATE {unique}INDEX {index} ON {table} ({columns}) "
        "ALGORITHM=INPLACE LOCK=NONE",
    ),
)

# Every session runs in UTC and in strict mode: out-of-range or oversize values
# are errors, never silently truncated. utf8mb4 with the server's default
# collation for it, which is also what a _utf8mb4 literal gets (the backend
# writes text holding a backslash as one). A connection whose session may have
# changed runs this again after its reset (Connection.reset_session).
SESSION_SQL = (
    "SET NAMES utf8mb4, autocommit = 1, time_zone = '+00:00', sql_mode = 'STRICT_ALL_TABLES,"
    "NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'"
)


def _naive_time(value: time) -> time:
    # TIME keeps no zone, and the driver writes an aware time's clock
    # reading without its offset: refused, as a time column refuses it.
    if value.tzinfo is not None:
        raise ValidationError(
            f"{brief(value, 80)} has a time zone, which MySQL's TIME does not keep: pass a naive "
            "time (value.replace(tzinfo=None)), or a datetime"
        )
    return value


def create_compiler() -> SqlCompiler:
    return SqlCompiler(
        placeholder="%s",
        quote="`",
        max_identifier_length=ADAPTER.max_identifier_length,
        encoders={
            str: unicode_text,
            # DATETIME has no zone: store UTC (the session time zone).
            datetime: utc_naive,
            dict: json_param,
            Json: json_param,
            # The driver writes a Decimal out positionally: bound it first.
            # (DECIMAL holds at most 65 digits, 30 of them after the point.)
            Decimal: decimal_param(65, 30, special=False),
            # (As a uuid column stores them, so that a raw comparison matches.)
            UUID: uuid_bytes,
            time: _naive_time,
        },
        empty_set="SELECT NULL FROM DUAL WHERE 1=0",
        # What the backend writes as a literal itself (see asyncmy._literal).
        scalars=(
            *(type(None), bool, int, float, Decimal, str, bytes, bytearray, memoryview),
            *(datetime, date, time, timedelta, UUID, dict, Json),
        ),
    )


def isolation_statement(isolation: IsolationLevel) -> str:
    return f"SET TRANSACTION ISOLATION LEVEL {isolation_sql(isolation)}"


# MySQL error number -> (error class, SQLSTATE).
_CODES: dict[str, tuple[type[Error], str]] = {
    "1062": (UniqueViolation, "23000"),
    "1586": (UniqueViolation, "23000"),
    "1451": (ForeignKeyViolation, "23000"),
    "1452": (ForeignKeyViolation, "23000"),
    "1216": (ForeignKeyViolation, "23000"),
    "1217": (ForeignKeyViolation, "23000"),
    "1048": (NotNullViolation, "23000"),
    "1364": (NotNullViolation, "HY000"),  # no default for a NOT NULL column
    "3819": (CheckViolation, "HY000"),  # MySQL CHECK
    "4025": (CheckViolation, "23000"),  # MariaDB CHECK
    "1213": (DeadlockDetected, "40001"),
    "1020": (SerializationFailure, "40001"),  # MariaDB 11.6+: record changed since last read
    "1205": (LockTimeout, "HY000"),
    "1064": (ProgrammingError, "42000"),
    "1146": (ProgrammingError, "42S02"),
    "1054": (ProgrammingError, "42S22"),
    "1406": (DataError, "22001"),
    "1153": (DataError, "HY000"),  # a statement longer than max_allowed_packet
    "1264": (DataError, "22003"),
    "1366": (DataError, "HY000"),
    "1292": (DataError, "22007"),
    "1298": (DataError, "HY000"),  # unknown time zone (also: a stale guard, above)
    "3024": (QueryCanceled, "HY000"),  # MySQL max_execution_time
    "1969": (QueryCanceled, "70100"),  # MariaDB max_statement_time
    "1317": (QueryCanceled, "70100"),  # query interrupted
    "2006": (ConnectionLost, "08S01"),  # server has gone away
    "2013": (ConnectionLost, "08S01"),  # lost connection during query
    "2055": (ConnectionLost, "08S01"),  # lost connection (system error)
    "1927": (ConnectionLost, "08S01"),  # connection was killed
    "1053": (ConnectionLost, "08S01"),  # server shutdown in progress
    "2003": (DatabaseUnavailable, "08001"),  # can't connect
    "1040": (DatabaseUnavailable, "08004"),  # too many connections
    # A write refused by a server that only reads: --read-only (a replica;
    # 1290 is also other options' refusal, which no statement of ours meets),
    # a READ ONLY transaction, InnoDB read-only mode.
    "1290": (ReadOnlyDatabase, "HY000"),
    "1792": (ReadOnlyDatabase, "25006"),
    "1836": (ReadOnlyDatabase, "HY000"),
}
CODES: dict[str, type[Error]] = {code: cls for code, (cls, _) in _CODES.items()}
SQLSTATES: dict[str, str] = {code: state for code, (_, state) in _CODES.items()}
