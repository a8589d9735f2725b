"""The seam every backend implements: Dialect, Driver, Connection, QueryCompiler,
DialectAdapter — and the values that cross it (CompiledQuery, QueryResult, Row).

The shape follows Kysely: a *dialect* bundles a driver (connections, which
run their own transactions), a query compiler (SQL text and placeholders) and an adapter
(capability flags the core consults instead of asking "which database is
this?"). This module imports nothing else of aiofragno's (but, for type
checking, :class:`~aiofragno.sqltext.SqlText`, which imports nothing).
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NamedTuple,
    Protocol,
    Self,
    TypeVar,
    runtime_checkable,
)

from .column_types import ArrayType, TypeArg
from .errors import SchemaError

if TYPE_CHECKING:
    from .hosts import HostStatus

if TYPE_CHECKING:
    from .sqltext import SqlText

IsolationLevel = Literal["read uncommitted", "read committed", "repeatable read", "serializable"]
ISOLATION_LEVELS: frozenset[str] = frozenset(IsolationLevel.__args__)  # type: ignore[attr-defined]


class CompiledQuery(NamedTuple):
    """SQL text in the dialect's placeholder style plus its bound parameters.

    Parameters are never part of ``sql``; the driver sends them separately (or,
    for drivers without server-side binding, escapes them itself). Only the
    placeholders the compiler wrote are placeholders: all other text went
    through :meth:`QueryCompiler.escape_text` (on MySQL every literal ``%`` is
    doubled, with or without parameters).
    """

    sql: str
    parameters: tuple[Any, ...] = ()


V = TypeVar("V")


class TextMemo(dict[str, V]):
    """``compute(text)`` remembered per statement text: statements repeat,
    and ``memo[text]`` for a text seen before is one dictionary look-up.
    Bounded: texts over ``max_length`` characters are computed every time,
    and the memo starts afresh once it holds ``max_size`` texts. (Each
    dictionary operation is atomic, so threads may share one.)"""

    def __init__(
        self, compute: Callable[[str], V], max_size: int = 4096, max_length: int = 2000
    ) -> None:
        super().__init__()
        self._compute = compute
        self._max_size = max_size
        self._max_length = max_length

    def __missing__(self, text: str) -> V:
        value = self._compute(text)
        if len(text) <= self._max_length:
            if len(self) >= self._max_size:
                self.clear()
            self[text] = value
        return value


_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")


def _first_word(sql: str) -> str:
    match = _FIRST_WORD.match(sql)
    return match[1].lower() if match else ""


_KEYWORDS = TextMemo(_first_word)


def leading_keyword(sql: str) -> str:
    """The first word of statement ``sql``, lower-cased: what kind of
    statement it is ("select", "insert", ...). "" when it starts with
    something else, a comment for one (callers then assume the worst)."""
    return _KEYWORDS[sql]


class Row(Mapping[str, Any]):
    """One result row: a read-only mapping from column name to value.

    Rows of one result share their name-to-position index, so a row costs one
    small object over the driver's own value sequence. Iteration yields column
    names, like a dict; ``row.values()`` yields values in column order, and
    ``row.raw`` is the driver's sequence itself (read it, never change it).
    """

    __slots__ = ("_index", "raw")

    def __init__(self, index: Mapping[str, int], values: Sequence[Any]) -> None:
        self._index = index
        self.raw = values

    def __getitem__(self, key: str) -> Any:
        return self.raw[self._index[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"Row({dict(self)!r})"


@functools.lru_cache(maxsize=1024)
def column_index(names: tuple[str, ...]) -> Mapping[str, int]:
    """The shared name-to-position index for rows with columns ``names``
    (cached: a result's rows, and every result of the same columns, share one;
    nobody may change it).

    With duplicate names the first occurrence wins; alias columns (``AS``) to
    reach the others.
    """
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        index.setdefault(name, position)
    return index


@dataclass(slots=True)
class QueryResult:
    """What one statement returned.

    ``rows_affected`` counts rows *matched* by UPDATE/DELETE on every backend
    (MySQL is connected with the FOUND_ROWS flag), or rows returned by a query.
    ``insert_id`` is the auto-generated key of the last inserted row where the
    driver reports it (SQLite, MySQL), else None.
    """

    rows: list[Row]
    rows_affected: int
    insert_id: int | None = None


@dataclass(frozen=True, slots=True)
class StorageProfile:
    """How logical column types are stored where the database has no exact
    native type. The value codec reads these; values stay exact either way."""

    text_rejects_nul: bool = False
    # Characters a "string" column holds (MySQL: varchar(255), so it can be indexed).
    string_max_chars: int | None = None
    # (digits before, digits after the point) a decimal column holds; checked
    # on the digits and exponent before anything is formatted or bound. The
    # default is PostgreSQL numeric's range, which also bounds the text that
    # SQLite stores.
    decimal_digits: tuple[int, int] = (131072, 16383)
    # Levels of arrays and objects a json column value may nest (see
    # json_check.check_json; the default is its MAX_DEPTH).
    json_max_depth: int = 64
    # The driver turns date/datetime min and max into +-infinity (asyncpg).
    extreme_dates_are_infinity: bool = False
    # A float column keeps -0.0 (MySQL and MariaDB store 0.0 for it).
    float_negative_zero: bool = True
    # uuid: the database's own type, or 16 bytes (big-endian, RFC 9562's order).
    uuid: Literal["native", "bytes"] = "native"
    # time: the driver's time, a MySQL TIME (the driver's timedelta), or ISO text.
    time: Literal["native", "timedelta", "text"] = "native"
    # Array columns (PostgreSQL's).
    arrays: bool = True
    decimal: Literal["native", "text"] = "native"
    bool: Literal["native", "int"] = "native"
    date: Literal["native", "text"] = "native"
    timestamp: Literal["native", "utc-naive", "epoch-ms", "iso-text"] = "native"


@dataclass(frozen=True, slots=True)
class CatalogSql:
    """How one dialect reads its catalog (:mod:`aiofragno.introspection`).

    The templates are ``af.sql`` templates taking ``{schema}`` (None: the
    current one) and, but for ``tables``, ``{table}``. ``tables`` returns
    ``name``; ``columns`` one row per column in table order: ``name``,
    ``sql_type`` (as the catalog spells it), ``is_nullable``,
    ``default_value`` (the default's SQL text, or NULL); ``indexes`` one row
    per indexed column: ``name``, ``is_unique``, ``is_primary``,
    ``column_name`` (NULL for an expression), ordered by index and position;
    ``references`` one row per column of each foreign key: ``name`` (NULL
    where the catalog keeps none), ``position`` (from 1 in each key),
    ``column_name``, ``to_schema``, ``to_table``, ``to_column``, ordered by
    key and position.

    ``type_spellings`` are (regex, replacement) pairs applied in order to a
    lower-cased type, from the catalog or from :attr:`DdlSpec.types`, so that
    both end in one spelling (PostgreSQL ``character varying(20)`` and
    ``varchar(20)``). ``default_casts`` matches what the catalog appends to a
    default (PostgreSQL's ``::text``); ``null_default`` is how it reports a
    default of NULL, where it writes one (MariaDB: ``NULL``)."""

    tables: str
    columns: str
    indexes: str
    references: str
    type_spellings: tuple[tuple[str, str], ...] = ()
    default_casts: str | None = None
    null_default: str | None = None


@dataclass(frozen=True, slots=True)
class DdlSpec:
    """What migrations need to know to write DDL for one dialect.

    ``types`` maps logical column types to SQL types (``varchar`` contains
    ``{n}``, ``array`` ``{element}``; a type missing is one the database
    lacks, see :meth:`type_sql`), plus ``json_document``: JSON that is only stored and handed back
    whole (the outbox's), in the type that does the least work for that. The ``*_sql`` templates are ``af.sql`` templates: ``columns_sql``
    and ``indexes_sql`` take ``{schema}`` (None: the current one) and
    ``{table}`` and return rows with a ``name`` column; the lock templates take
    ``{key}``, and ``migration_lock_sql`` also ``{seconds}``, the longest it may
    wait: it returns one row whose ``taken`` column is true (1) once the lock
    is held, false (0) or NULL when it was not free in time, or fails with
    :class:`~aiofragno.errors.LockTimeout`.
    """

    types: Mapping[str, str]
    primary_key: str
    table_options: str
    columns_sql: str
    indexes_sql: str
    # String literals treat backslash as an escape (MySQL): double it.
    backslash_escapes: bool = False
    create_schema_sql: str | None = None
    migration_lock_sql: str | None = None
    migration_unlock_sql: str | None = None
    # Bounds each lock wait of the migration's statements ({milliseconds} or
    # {whole_seconds}); run before the migration lock is taken, and undone
    # after it by ``lock_timeout_reset_sql`` (None: it ends with the
    # migration's transaction).
    lock_timeout_sql: str | None = None
    lock_timeout_reset_sql: str | None = None
    # The schema unqualified names resolve to (a row, column ``name``). None:
    # tables have no schema of their own (SQLite, MySQL: the database).
    current_schema_sql: str | None = None
    # ALTER TABLE .. ADD COLUMN can add a foreign key in the same clause.
    add_column_references: bool = True
    # Drops index {index} of table {table} (both quoted).
    drop_index_sql: str = "DROP INDEX {index}"
    # Drops index {index}: a clause of ALTER TABLE, where the database has
    # one. Used where an index is dropped with the foreign key it may serve
    # (see foreign_keys_need_an_index), in one statement: both go or neither.
    drop_index_clause: str | None = None
    # The database refuses to drop the last index a foreign key can use
    # (MySQL, MariaDB: error 1553, which left a migration half done): such a
    # key first gets an index of its own, named as the key, as the database
    # names the one it makes with the key (and drops once another serves).
    foreign_keys_need_an_index: bool = False
    # Drops foreign key {name}: a clause of ALTER TABLE, made in the
    # statement that drops the key's column, so that both go or neither
    # (MySQL ``DROP FOREIGN KEY``, PostgreSQL ``DROP CONSTRAINT``). None: the
    # database cannot drop a key in place (SQLite keeps them in the table's
    # definition, and refuses to drop a column one uses): the table is
    # rebuilt without the keys of the columns to drop before they are.
    drop_foreign_key_sql: str | None = None
    # What the outbox's "ticks" strategy adds (:mod:`aiofragno.outbox.ticks`):
    # the entries' transaction id column and its index, the tables of ticks
    # and of the versions they gave, and the first tick. Each statement is
    # idempotent; run by every migration until the id column exists. Empty:
    # the dialect has only the counter.
    outbox_ticks_sql: tuple[str, ...] = ()
    # How the live tables are read back (introspection, drift).
    catalog: CatalogSql | None = None
    # ALTER TABLE .. ADD COLUMN can add a primary key (false: SQLite, where
    # a table without one is rebuilt to get it).
    add_primary_key: bool = True
    # Declared changes of existing columns (:mod:`aiofragno.schema_changes`):
    # a template per change ("type", "null", "not_null", "set_default",
    # "drop_default") taking {table}, {column}, {type}, {definition} (the
    # whole declared column) and {default}. A change with no template is
    # made by rebuilding the table (SQLite).
    alter_column_sql: Mapping[str, str] = field(default_factory=dict)
    # The changes (those keys; "widen_integer", "widen_text" for types;
    # "drop_column") that copy every row of the table.
    rewriting_changes: frozenset[str] = frozenset()
    # Renames index {index} (qualified) of {table} to {new}; None: dropped
    # and created again.
    rename_index_sql: str | None = None
    # Builds a new index on an existing table while writes go on ({unique},
    # {index}, {table}, {columns}); None: a plain CREATE INDEX, which locks.
    online_index_sql: str | None = None
    # The online build cannot run in a transaction (PostgreSQL): it runs after
    # the migration's commit, under the session lock below.
    online_outside_transaction: bool = False
    # (Each a statement taking {key} and {milliseconds}, the longest wait;
    # the last tries the lock, returning a row whose ``taken`` is true once
    # held, and is tried again until then.)
    online_lock_sql: tuple[str, ...] = ()
    online_unlock_sql: tuple[str, ...] = ()
    # Rows when index {index} of {schema} exists and is invalid (a build that
    # was interrupted), and how such an index is dropped online.
    invalid_index_sql: str | None = None
    drop_index_online_sql: str | None = None
    # Run on the migration's connection before its transaction and after it
    # (SQLite: foreign keys are not enforced while tables are rebuilt), and
    # the query listing rows that reference missing ones (checked after a
    # rebuild).
    migration_setup_sql: tuple[str, ...] = ()
    migration_teardown_sql: tuple[str, ...] = ()
    foreign_key_check_sql: str | None = None

    def type_sql(self, kind: str, arg: TypeArg = None) -> str:
        """The SQL type of a column of logical type ``kind`` (``arg``: its
        argument, see :mod:`aiofragno.column_types`); a SchemaError for one
        this database has no type for (arrays outside PostgreSQL)."""
        template = self.types.get(kind)
        if template is None:
            raise SchemaError(
                f"this database has no {kind} columns (arrays: PostgreSQL only; use a json "
                "column elsewhere)"
            )
        if isinstance(arg, ArrayType):
            template = template.replace("{element}", self.type_sql(arg.element, arg.element_arg))
        return template.replace("{n}", str(arg)) if isinstance(arg, int) else template


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a database can do that changes how the core works with it."""

    # INSERT/UPDATE/DELETE .. RETURNING (SQLite from 3.35).
    supports_returning: bool
    # Schema changes are transactional: a migration is all or nothing.
    supports_transactional_ddl: bool
    # SELECT .. FOR UPDATE SKIP LOCKED (the outbox consumer's claims).
    supports_skip_locked: bool
    # A data-modifying statement may sit in a WITH clause: a unit's
    # independent writes, and the outbox reservation with its entry, each go
    # as one statement.
    supports_writable_cte: bool
    # The database has one writer at a time, and a transaction holds it from
    # BEGIN to its end: a unit of work's writes cannot run while the same
    # task has a transaction open, which would wait for itself.
    one_writer: bool = False
    # A deleted row's internal id may go to a row created later (SQLite's
    # rowid without AUTOINCREMENT): an internal id read before cannot name the
    # same row for sure, so references are looked up by external id.
    reuses_row_ids: bool = False
    # The most parameters one statement may bind.
    max_parameters: int = 32766
    # A streamed result (:meth:`Connection.stream`) is read only inside a
    # transaction (PostgreSQL: a portal ends with its transaction), so a
    # stream outside the caller's transaction opens one of its own.
    streams_in_transaction: bool = False
    # How a join's per-parent limit can read each parent's first rows only
    # (see uow/joins.py), instead of numbering all of them with ROW_NUMBER():
    # a subquery in FROM may refer to the FROM items before it (LATERAL), or
    # a correlated subquery in IN (...) may have ORDER BY .. LIMIT.
    supports_lateral: bool = False
    supports_limit_in_subquery: bool = False
    # ORDER BY compares only this many first bytes of a text or binary value
    # (MariaDB, MySQL: max_sort_length, 1,024 by default), where a comparison
    # takes the whole value: an order by a column whose values may be longer
    # is refused (see uow/catalog.py, TableInfo.check_sortable). None: whole.
    sort_prefix_bytes: int | None = None
    # A retrieval phase's reads go as one UNION ALL statement (see
    # uow/combine_reads.py) instead of a batch, which, for several reads,
    # needs a snapshot transaction (three statements more: MySQL, MariaDB).
    unites_reads: bool = False


class ReplayPosition(Protocol):
    """How far a server's log reaches (a primary's after a commit, or what
    a replica has replayed): a WAL position, a set of GTIDs. ``str()`` is
    the server's own spelling of it, as its wait statement takes it."""

    def covers(self, other: Self) -> bool:
        """Whether a replica that has replayed this has replayed ``other``."""
        ...

    def merged(self, other: Self) -> Self:
        """What covers both this and ``other`` (and nothing more)."""
        ...


@dataclass(frozen=True, slots=True)
class ReplicationSql:
    """How one kind of server says how far its log reaches, for read
    replicas (:mod:`aiofragno.replicas`).

    ``position``: one statement the primary answers, in the column
    ``position``, with how far its log reaches now — run right after a
    commit on the connection that committed, it covers that commit.
    ``state``: one statement a replica answers with how far it has
    replayed (column ``state_position``) and its replay lag in seconds
    (column ``state_lag``; NULL: unknown, as good as infinite); no row, or
    a NULL position, when the server is not a replica (several rows — one
    per source — are one position and the largest lag). ``parse`` makes a
    position of either column's value. ``wait``: a statement a replica
    runs until it has replayed ``{position}`` or ``{seconds}`` have passed,
    answering in the column ``reached`` whether it has; None: the replica
    is polled with ``state``. ``server``: a pattern searched for in the
    primary's version string (empty: any)."""

    position: str
    state: str
    parse: Callable[[Any], ReplayPosition]
    state_position: str = "position"
    state_lag: str = "lag"
    wait: str | None = None
    server: str = ""


@dataclass(frozen=True, slots=True)
class SqlSnippets:
    """Statements and expressions the core needs in each dialect's words."""

    # One statement returning the database's current time (UTC).
    now: str
    # One statement returning the server's version string.
    version: str
    # Appended to a SELECT to hold a shared row lock until commit ("" if the
    # database serializes writers anyway).
    row_share_lock: str
    # The outbox version as 20 lowercase hex digits, from the counter's text
    # value ({value}: an SQL expression).
    version_hex: str
    # Text turned into a json_document column's value ({x}: an SQL expression).
    json_from_text: str
    # One read's rows as one value, an array of row values, so that a unit's
    # reads travel as one statement ({columns}: the read's select list;
    # {rest}: the read after "SELECT <columns> FROM "). None: reads go as a
    # batch.
    rows_array: str | None = None
    # Statements beginning a read-only transaction whose reads all see one
    # snapshot, taken no later than its first read: a unit's reads that go
    # as several statements run in one, ended by ROLLBACK
    # (aiofragno.uow.snapshot). Empty:
    # every batch of reads is one statement here.
    read_snapshot: tuple[str, ...] = ()
    # The exact sum of an integer column ({x}) as two SQL sums, of its high
    # and of its low 32 bits (the total is high * 2**32 + low), where SUM
    # would fail past 64 bits (SQLite). None: SUM({x}) is exact (a numeric).
    int_sum_halves: tuple[str, str] | None = None
    # What SUM of integers fails with past 64 bits where it fails instead of
    # giving a numeric (SQLite: "integer overflow"). Set: an integer sum is
    # one SUM({x}), and after that error the reads run again with
    # int_sum_halves (a sum this large is rare; two sums cost every read).
    # None: int_sum_halves always, where set.
    int_sum_overflow: str | None = None
    # An exact aggregate of a decimal column stored as text
    # (StorageProfile.decimal "text"; {function}: sum, min or max; {x}: the
    # column), giving the value as text. None: such decimals are not
    # aggregated.
    text_decimal_aggregate: str | None = None
    # A condition: the JSON value at path {path} (a bound JSON path text,
    # '$."key"[0]') of json column {column} is the JSON value {json} (bound
    # compact JSON text of a str, int or bool): equal by type and value.
    # None: no JSON path conditions.
    json_path_equals: str | None = None
    # Text {x} in lower case, for every cased letter of Unicode.
    lower: str = "LOWER({x})"
    # Ending a server session whose connection broke (see
    # :attr:`Connection.server_session`). ``session_process`` takes
    # ``{session}`` and returns one row, column ``process``, while that
    # session still runs on the server (no row once it has ended);
    # ``end_process`` asks the server to end process ``{process}``.
    # None: a broken connection leaves nothing running (an embedded database).
    session_process: str | None = None
    end_process: str | None = None
    # Run first in the transaction that looks up whether a lost COMMIT took
    # effect: its own COMMIT (it takes a row lock) must not wait for a
    # synchronous standby, which may be what has just gone. None: commits
    # wait for nothing outside the server.
    local_commit: str | None = None
    # Read replicas (aiofragno.replicas): how the primary and its replicas
    # say how far their log reaches, one :class:`ReplicationSql` per kind
    # of server the dialect covers (the first whose ``server`` matches the
    # primary's version). Empty: no replicas on this dialect.
    replication: tuple[ReplicationSql, ...] = ()
    # One row, column ``writable``: true while the server takes writes (not
    # a standby, not read-only by configuration). None: it always does.
    writable: str | None = None
    # Run first in a mutation phase at "repeatable read" or "serializable"
    # with the counter's outbox on (not under ticks): it waits for the
    # outbox counter's writers before the transaction takes its snapshot.
    # Without it, reserving a version fails as a serialization conflict
    # whenever another outbox unit committed after the snapshot was taken
    # (PostgreSQL's first-updater-wins rule; LOCK TABLE takes no snapshot).
    # None: no such rule.
    outbox_snapshot_lock: str | None = None
    # Where a read view can miss a transaction that committed before one it
    # sees (InnoDB: a view copies the list of running transactions while
    # they leave it, and the outbox counter's lock passes on as soon as its
    # holder has left): one statement returning the counter's committed
    # value ({t}, {k}, {v}: the settings table and its key and value
    # columns; {key}: the counter's key) under a shared lock, which waits
    # for the writer holding the counter. Run outside a transaction, so
    # that the lock ends with the statement; a read after it, bounded by
    # that version, misses none up to it. None: a view includes every
    # transaction that committed before the newest one it sees.
    outbox_read_horizon: str | None = None
    # An expression that wakes the outbox's waiting readers, evaluated once
    # in each transaction that writes an entry (it must take effect only if
    # that transaction commits), and the channel they listen on (see
    # :class:`Listens`). None: readers poll.
    outbox_wake: str | None = None
    outbox_channel: str | None = None
    # The outbox's "ticks" strategy (:mod:`aiofragno.outbox.ticks`); None:
    # the dialect has only the counter.
    outbox_ticks: OutboxTicksSql | None = None
    # Where a standby can be promoted to primary: an SQL expression (a
    # bigint) every outbox version the server numbers now must be above.
    # It rises with each promotion past any version the old primary could
    # have numbered, so that versions keep rising across a failover that
    # lost some (asynchronous replication); 0 on a server never promoted.
    # None: versions only continue from the counter.
    outbox_version_floor: str | None = None
    # The upsert's words (``uow.upsert``), see :class:`UpsertSql`.
    upsert: UpsertSql = field(default_factory=lambda: UpsertSql())
    # Finds the unique index a UniqueViolation's message names: a pattern with
    # a group ``index`` (the index's name) or ``columns`` (its columns, each
    # as ``table.column``, comma-separated), for ``uow.conflict_on_unique``.
    unique_violation: str = r'unique constraint "(?P<index>[^"]+)"'


@dataclass(frozen=True, slots=True)
class UpsertSql:
    """An insert that updates the row holding its unique key instead
    (``uow.upsert``). ``into`` starts it (``{table}``; the existing row is
    aliased ``t`` where it says so), ``clause`` follows its VALUES
    (``{keys}``: the key's columns; ``{assignments}``): ``assign`` for each
    column set, ``bump`` for the version (``{column}``: a quoted name;
    ``{matches}``: the ``matches`` term of each key column, AND-ed — the
    existing row holds the proposed key). ``unchanged``: where the clause
    fires on the first unique key the row collides on, not only the one
    named, a condition true right after the statement unless its update
    branch changed a row — then the row holding the named key, if another
    key fired, is updated by a statement of its own, and, if no row holds
    it, the row is inserted without the clause, which fails naming the
    index it collides on (as the named-key clause does); None: the clause
    fires on the named key alone."""

    into: str = "INSERT INTO {table} AS t"
    clause: str = " ON CONFLICT ({keys}) DO UPDATE SET {assignments}"
    assign: str = "{column} = excluded.{column}"
    bump: str = "{column} = t.{column} + 1"
    matches: str = ""
    unchanged: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxTicksSql:
    """The SQL of the outbox's "ticks" strategy (:mod:`aiofragno.outbox.ticks`).

    ``entry_xid``: an expression naming the writing transaction, stored
    with each entry. ``try_lock`` and ``lock``: take the ticker's lock
    until the transaction ends, returning one row whose ``taken`` column
    is true once it is held (``try_lock``: false at once if another
    holds it). ``tick``: in the transaction holding that lock, versions
    every entry committed since the last tick (a ``{key}``: the version
    counter's settings key), returning one row whose ``versioned`` column
    counts them."""

    entry_xid: str
    try_lock: str
    lock: str
    tick: str


@dataclass(frozen=True, slots=True)
class CommitPlanChoice:
    """Which plan commits a unit of work's mutation phase on this dialect
    (:mod:`aiofragno.uow.plans`), with the SQL that plan needs:

    - ``"statements-then-commit"``: the operations, checked as their results
      come back, then the unit's record with COMMIT.
    - ``"checked-in-process"``: the engine runs in this process, so a batch
      and the checks on its results cost nothing on the wire: the
      operations, their checks, the record and COMMIT go in one
      :meth:`Connection.commit_batch` with a stop point.
    - ``"guarded-batch"``: ``stale_guard`` statements stop the batch at a
      stale operation on the server, so a transaction's writes, their
      checks, the record and COMMIT go out as one batch.
    - ``"one-committing-statement"``: with the outbox on, the operations
      and the entry as one statement outside a transaction (a writable
      WITH), which ``abort_sql`` — an expression failing the statement with
      ``{message}`` (an SQL text expression) in the error's message — aborts
      at a stale operation.
    """

    plan: Literal[
        "statements-then-commit",
        "checked-in-process",
        "guarded-batch",
        "one-committing-statement",
    ] = "statements-then-commit"
    stale_guard: StaleGuard | None = None
    abort_sql: str | None = None


@dataclass(frozen=True, slots=True)
class DialectAdapter:
    """What the core needs to know of one SQL dialect, in groups: what it
    can do (:class:`Capabilities`), SQL in its words (:class:`SqlSnippets`),
    how values are stored (:class:`StorageProfile`), how tables are created
    (:class:`DdlSpec`) and how units of work commit
    (:class:`CommitPlanChoice`). The core branches on these, never on the
    dialect's name."""

    capabilities: Capabilities
    sql: SqlSnippets
    storage: StorageProfile
    ddl: DdlSpec
    commit: CommitPlanChoice
    outbox_version_strategy: Literal[
        "insert-on-conflict-returning", "insert-on-duplicate-last-insert-id"
    ]
    default_naming: Literal["schema", "suffix"]
    max_identifier_length: int
    # True for a raw statement's text that may leave state in its session
    # beyond the statement — settings, session locks, temporary objects, user
    # variables: a connection that ran one is restored
    # (:meth:`Connection.reset_session`) before it is reused. Conservative:
    # anything but a plain read, write or schema change, or one calling what
    # changes the session (:class:`aiofragno.dialects.common.SessionChanges`).
    session_changes: Callable[[str], bool]

    # The flags the README's capability table named, where they were before
    # the groups (``db.adapter`` may have been read): deprecated.

    @property
    def supports_returning(self) -> bool:
        return _moved("supports_returning", self.capabilities.supports_returning)

    @property
    def supports_transactional_ddl(self) -> bool:
        return _moved("supports_transactional_ddl", self.capabilities.supports_transactional_ddl)

    @property
    def supports_skip_locked(self) -> bool:
        return _moved("supports_skip_locked", self.capabilities.supports_skip_locked)

    @property
    def supports_writable_cte(self) -> bool:
        return _moved("supports_writable_cte", self.capabilities.supports_writable_cte)

    @property
    def one_writer(self) -> bool:
        return _moved("one_writer", self.capabilities.one_writer)

    @property
    def supports_advisory_locks(self) -> bool:
        return _moved(
            "supports_advisory_locks",
            self.ddl.migration_lock_sql is not None,
            "ddl.migration_lock_sql",
        )

    @property
    def stale_guard(self) -> StaleGuard | None:
        return _moved("stale_guard", self.commit.stale_guard, "commit.stale_guard")


_T = TypeVar("_T")


def _moved(name: str, value: _T, where: str | None = None) -> _T:
    warnings.warn(
        f"DialectAdapter.{name} is deprecated: read adapter.{where or 'capabilities.' + name}",
        DeprecationWarning,
        stacklevel=3,
    )
    return value


@dataclass(frozen=True, slots=True)
class StaleGuard:
    """Statements that fail when the statement right before them, in the
    same batch, matched no row: ``after_write`` follows an UPDATE or DELETE,
    ``after_read`` a SELECT. Each fails with ``{message}`` (an SQL text
    literal) in the error's message, and a failing statement ends its batch
    on the server: what follows it, COMMIT included, does not run."""

    after_write: str
    after_read: str


StopWhen = Callable[[int, QueryResult], bool]


class RowStream(Protocol):
    """A statement's result read in batches (:meth:`Connection.stream`): at
    most one batch of rows is held in memory at a time. Used by one task; its
    connection runs nothing else until it is closed."""

    async def fetch(self) -> list[Row]:
        """The next rows, at most the batch size; ``[]`` once every row was
        read. A statement that fails part-way raises here (its driver
        exception, as :meth:`Connection.execute_query` does)."""
        ...

    async def close(self, *, drain: bool) -> bool:
        """Stop reading and free what the result holds (a cursor, the write
        gate). True when the connection can run statements again. A result
        not read to its end may leave the connection unusable until it has
        been read (MySQL's unbuffered results): with ``drain`` the rest is
        read and thrown away first; without, False tells the caller to
        discard the connection. Called once, also after ``fetch`` raised or
        was cancelled."""
        ...


class Connection(Protocol):
    """One open connection to the database, used by one task at a time.

    Guarantees a backend must keep: ``execute_query`` sends ``query.parameters``
    as bound parameters; statements outside ``begin``/``commit`` autocommit;
    driver exceptions escape unchanged (the core translates them with
    :meth:`Dialect.translate_error`).

    Round trips are the cost that matters, so a backend may defer ``begin``
    and send it together with the transaction's first statement (with a
    :class:`DeferredBegin`); a transaction that ran no statement then commits
    or rolls back without sending anything.
    """

    @property
    def is_closed(self) -> bool:
        """True once the connection is known to be unusable (no I/O is done)."""
        ...

    @property
    def is_stale(self) -> bool:
        """True when the connection may still work but should not be handed
        out again: another connection to its server was lost since it was
        opened (a failover, a restart), so the pool replaces it. Not
        ``is_closed``: a COMMIT sent on it is in flight on a live connection,
        and ambiguous if that breaks."""
        ...

    @property
    def server_session(self) -> str | None:
        """This connection's server session, named so that the dialect's
        ``session_process_sql`` finds it from another connection for as long
        as it runs on the server — and never finds a later one (a server
        process id alone can be reused). None where the database has no
        server session (SQLite)."""
        ...

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        """Run one statement and return its rows and counts."""
        ...

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """Run ``queries`` in order, in as few round trips as the driver allows,
        and return their results up to and including the first one for which
        ``stop(index, result)`` is true (all of them if none is).

        ``stop`` must be a pure function of its arguments: it may run on a
        driver's thread. Statements after the stop point may have run as well
        (a driver that sends the whole batch at once runs them all), so a
        caller that stops inside a transaction rolls it back. A statement that
        fails before the stop point raises its driver exception; the ones
        after it did not run.
        """
        ...

    async def stream(self, query: CompiledQuery, batch_size: int) -> RowStream:
        """Start ``query`` and return its result, to be read in batches of at
        most ``batch_size`` rows without the rest being held in memory
        (server-side portal, unbuffered result, stepping a cursor). An error
        the statement raises before its first row may be raised here or by
        the first :meth:`RowStream.fetch`. Where the adapter's
        ``streams_in_transaction`` says so, the caller has begun a
        transaction first."""
        ...

    async def begin(self, isolation: IsolationLevel | None) -> None:
        """Start a transaction, at ``isolation`` if given (else the server's
        default). May be deferred to the next statement (see the class)."""
        ...

    async def commit(self) -> None: ...

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """Run ``queries`` in the open transaction, then COMMIT it, in as few
        round trips as the driver allows — so that locks the statements take
        are released without waiting on the caller. A statement that fails
        raises before COMMIT is sent, leaving the transaction open. So does a
        stop point (``stop`` as in :meth:`execute_batch`): the results up to
        it come back, without COMMIT (:func:`stopped` tells)."""
        ...

    async def rollback(self) -> None: ...

    async def ping(self) -> None:
        """One cheap round trip; raises if the connection is dead."""
        ...

    @property
    def in_transaction(self) -> bool:
        """True while the server holds a transaction open on this connection,
        or (MySQL with autocommit off) will open one with the next statement
        — as the server last reported it, without I/O; never raises (False
        once closed). A deferred ``begin`` not yet sent does not count."""
        ...

    async def reset(self) -> bool:
        """Bring the connection back to idle (no open transaction) after an
        interrupted operation (a cancelled query). False means it cannot be
        trusted any more and the caller discards it."""
        ...

    async def reset_session(self) -> bool:
        """Bring the session back to the state it had when the connection
        was opened: no transaction, the connection's own settings, no
        session-level locks but the one naming :attr:`server_session`, no
        temporary objects, user variables or listeners. Costs a round trip
        (or two); called only for a connection that may have changed them.
        False means it could not, and the caller discards the connection."""
        ...

    async def close(self) -> None:
        """Close the connection. Idempotent; never raises for a dead peer."""
        ...


async def execute_in_turn(
    connection: Connection, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
) -> list[QueryResult]:
    """:meth:`Connection.execute_batch` for a driver that sends one statement
    per round trip: nothing after the stop point is sent."""
    results: list[QueryResult] = []
    for index, query in enumerate(queries):
        result = await connection.execute_query(query)
        results.append(result)
        if stop is not None and stop(index, result):
            break
    return results


async def commit_after(
    connection: Connection, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
) -> list[QueryResult]:
    """:meth:`Connection.commit_batch` for a driver that cannot send COMMIT
    with the statements before it: their batch, then COMMIT unless it stopped."""
    results = await connection.execute_batch(queries, stop)
    if not stopped(queries, results, stop):
        await connection.commit()
    return results


def stopped(
    queries: Sequence[CompiledQuery], results: Sequence[QueryResult], stop: StopWhen | None
) -> bool:
    """Whether a batch of ``queries`` ended at a stop point, not after the last one."""
    if stop is None:
        return False
    return len(results) < len(queries) or (bool(results) and stop(len(results) - 1, results[-1]))


COMMIT = CompiledQuery("COMMIT")
ROLLBACK = CompiledQuery("ROLLBACK")

B = TypeVar("B")


class DeferredBegin(Generic[B]):
    """A transaction's BEGIN held back to travel with its first statement
    (see :class:`Connection`): the state every backend that defers it keeps.
    ``B`` is what the backend sends as BEGIN (SQL text, statements, a call).

    Held from :meth:`defer` until :meth:`take` hands it over with the first
    statement; :meth:`drop` at COMMIT or ROLLBACK tells whether it was ever
    sent — if not, the transaction ran nothing and there is nothing to end."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: B | None = None  # (read directly on hot paths)

    def defer(self, begin: B) -> None:
        self.pending = begin

    def take(self) -> B | None:
        """The held BEGIN, to send ahead of the next statement; from now on
        it counts as sent."""
        begin, self.pending = self.pending, None
        return begin

    def drop(self) -> bool:
        """Forget the held BEGIN: True if there was one (nothing was sent, so
        COMMIT or ROLLBACK has nothing to send either)."""
        return self.take() is not None


@runtime_checkable
class Listens(Protocol):
    """A connection that can receive the server's notifications (PostgreSQL
    LISTEN)."""

    async def listen(self, channel: str, on_notify: Callable[[], object]) -> None:
        """Listen on ``channel``: call ``on_notify`` (in the caller's event
        loop, never from a task of the caller's) for each notification, and
        once when the connection is lost."""
        ...


class Driver(Protocol):
    """Hands out connections. (Transactions belong to the connection:
    :meth:`Connection.begin`, whose BEGIN may travel with the first statement.)"""

    @property
    def pool_size(self) -> int:
        """Most connections open at once."""
        ...

    async def init(self) -> None:
        """Prepare the driver (e.g. open the pool's first connection, so a bad
        URL or a dead server fails at ``connect`` time)."""
        ...

    async def acquire_connection(self) -> Connection: ...

    async def release_connection(self, connection: Connection, *, discard: bool = False) -> None:
        """Give ``connection`` back; ``discard=True`` closes it instead of reusing."""
        ...

    def take_idle_connection(self) -> Connection | None:
        """A connection ready for use, taken without awaiting anything, or
        None (then :meth:`acquire_connection`): the usual checkout without
        a coroutine of its own."""
        ...

    def return_idle_connection(self, connection: Connection) -> bool:
        """Give back ``connection``, unchanged since it was taken, without
        awaiting anything; False (nothing done) when it must go through
        :meth:`release_connection` instead."""
        ...

    async def open_unpooled(self) -> Connection:
        """A new connection of the caller's own, outside the pool (for a
        long-lived use such as listening); the caller closes it."""
        ...

    async def destroy(self) -> None:
        """Close every connection. Idempotent; acquiring afterwards raises."""
        ...

    async def servers(self) -> list[HostStatus]:
        """Each server the URL names, asked afresh what it is (role,
        timeline, replay lag: :class:`~aiofragno.hosts.HostStatus`); empty
        where the backend cannot tell (SQLite, MySQL)."""
        ...


class QueryCompiler(Protocol):
    """Turns an ``af.sql`` fragment into a :class:`CompiledQuery` for one
    dialect (placeholders, identifier quoting, value encoding)."""

    def compile(self, node: Any) -> CompiledQuery: ...

    def compile_parts(self, node: Any) -> tuple[SqlText, tuple[Any, ...]]:
        """The fragment as text with a slot per parameter (no placeholders
        yet), and its parameters in slot order."""
        ...

    def render(self, text: SqlText) -> str:
        """``text`` with this dialect's placeholders in its slots, every
        piece through :meth:`escape_text`: what the driver receives."""
        ...

    def quote_identifier(self, name: str) -> str: ...

    def escape_text(self, text: str) -> str:
        """SQL text without placeholders as the driver must receive it, so
        that nothing in it (a name, a literal) is taken for a placeholder."""
        ...


class Dialect(Protocol):
    """Everything aiofragno needs to talk to one kind of database through one
    driver."""

    name: Literal["postgresql", "sqlite", "mysql"]

    def create_driver(self) -> Driver: ...

    def create_query_compiler(self) -> QueryCompiler: ...

    def create_adapter(self) -> DialectAdapter: ...

    def translate_error(self, exc: BaseException) -> Exception:
        """The aiofragno error for a driver exception (raise it ``from exc``)."""
        ...
