"""Writing the outbox entry of a unit, inside its mutation transaction.

Two strategies. Under "ticks" (:class:`TickedStatements`, PostgreSQL) the
entry goes in without a version, which a tick gives it after it commits
(:mod:`.ticks`). Under "counter" (:class:`OutboxStatements`), the version
is reserved last, just before COMMIT, from a counter row in the settings
table. Every writer updates that one row, so each holds its lock from
the reservation until it commits: versions are handed out in commit order and a
rolled-back reservation is undone with its transaction — no gaps, and a reader
polling ``versionstamp > cursor`` never skips an entry that commits later
(on MySQL only up to the counter's version read under a shared lock:
:attr:`SqlSnippets.outbox_read_horizon
<aiofragno.driver.SqlSnippets.outbox_read_horizon>`, see
:func:`.queries.horizon`). Where a standby can be promoted (PostgreSQL),
the reservation is also above the server's version floor
(:attr:`SqlSnippets.outbox_version_floor
<aiofragno.driver.SqlSnippets.outbox_version_floor>`): the one jump, at a
promotion, past every version the old primary could have given.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..codec import ValueCodec, read_back, utc_now
from ..driver import CompiledQuery, DialectAdapter, QueryCompiler, QueryResult
from ..settings_table import SETTINGS_TABLE
from ..sql import Fragment, Identifier, Unbound, sql, sql_using
from ..sqltext import SqlText, SqlTextWriter
from ..tagged_json import _SAFE_INT, dump_tagged, tag
from .tables import OUTBOX_ID, UNIT_KEYS_ID, VERSION_KEY

if TYPE_CHECKING:
    from ..uow.catalog import ColumnInfo, TableInfo
    from ..uow.ops import MutationOp

_RESERVE = {
    "insert-on-conflict-returning": (
        "INSERT INTO {t} ({k}, {v}) VALUES ({key}, '1') ON CONFLICT ({k}) "
        "DO UPDATE SET {v} = CAST(CAST({t}.{v} AS BIGINT) + 1 AS TEXT) RETURNING {v}"
    ),
    # LAST_INSERT_ID(expr) puts the new version in the statement's OK packet
    # (its insert id), so no SELECT is needed to learn it. The session
    # variable keeps it for the entry's insert, in both branches (VALUES is
    # evaluated first, then the update, if any).
    "insert-on-duplicate-last-insert-id": (
        "INSERT INTO {t} ({k}, {v}) VALUES ({key}, @aiofragno_version := 1) "
        "ON DUPLICATE KEY UPDATE {v} = "
        "LAST_INSERT_ID(@aiofragno_version := CAST({v} AS UNSIGNED) + 1)"
    ),
}
# The reservation where versions have a floor (SqlSnippets.outbox_version_floor,
# {floor}): above the counter and above the floor — the floor's only in the
# new row, so it is evaluated once per reservation.
_RESERVE_ABOVE_FLOOR = {
    "insert-on-conflict-returning": (
        "INSERT INTO {t} ({k}, {v}) VALUES ({key}, CAST({floor} + 1 AS TEXT)) "
        "ON CONFLICT ({k}) DO UPDATE SET {v} = CAST(GREATEST(CAST({t}.{v} AS BIGINT) + 1, "
        "CAST(EXCLUDED.{v} AS BIGINT)) AS TEXT) RETURNING {v}"
    ),
}
# The version just reserved, as the statement after the reservation sees it.
_RESERVED = {
    # Read back from the counter row, which this transaction holds.
    "insert-on-conflict-returning": "(SELECT {v} FROM {t} WHERE {k} = {key})",
    # Session state, not a read: a subquery on the counter row costs MariaDB
    # ~60 us more per unit (measured). Not ROW_COUNT(), which tells the two
    # branches apart but is -1 once the client has gone (the server runs the
    # rest of a batch regardless), nor LAST_INSERT_ID(), which is the new
    # row's generated id when the reservation creates the row.
    "insert-on-duplicate-last-insert-id": "@aiofragno_version",
}
# The entry: its versionstamp and payload are the prepared texts with the
# stand-in replaced by the reserved version, so nothing waits on a reply.
_INSERT = (
    "INSERT INTO {o} ({vs}, {u}, {p}, {r}, {c}, {n}) VALUES (REPLACE({stamp}, {stand_in}, {version}), "
    "{uow_id}, {payload_json}, {refs}, {created}, {nonce})"
)
# What the entry binds per use (the keys of entry_values()).
_UNBOUND = {
    name: Unbound(name)
    for name in ("stamp", "stand_in", "uow_id", "payload", "refs", "created", "nonce")
}
# The WITH part holding the entry, in a statement that also carries the writes.
_ENTRY = "af_outbox_entry"
_NAMES: dict[str, Any] = {
    "t": Identifier(SETTINGS_TABLE),
    "k": Identifier("key"),
    "v": Identifier("value"),
    "o": OUTBOX_ID,
    "vs": Identifier("versionstamp"),
    "u": Identifier("uow_id"),
    "p": Identifier("payload"),
    "r": Identifier("ref_map"),
    "c": Identifier("created_at"),
    "n": Identifier("nonce"),
    "x": Identifier("xid"),
    "key": VERSION_KEY,
}
# An idempotency key's row (UNIT_KEYS): every unit given a key records it
# there, whether or not it also writes an entry (see KeyedStatements).
KEY_INSERT = "INSERT INTO {keys} ({key}, {n}, {c}) VALUES ({uow_id}, {nonce}, {created})"
_KEY_NAMES: dict[str, Any] = {"keys": UNIT_KEYS_ID, "key": Identifier("key")}
# The WITH part holding the key's row.
_KEY = "af_unit_key"
# Under ticks (.ticks): the entry without a version, naming its transaction.
_TICKED_INSERT = (
    "INSERT INTO {o} ({u}, {p}, {r}, {c}, {n}, {x}) "
    "VALUES ({uow_id}, {payload_json}, {refs}, {created}, {nonce}, {xid})"
)


class _Prepared:
    """A statement compiled once, its :class:`Unbound` parameters filled in per use.

    Where ``values`` has a ``payload_sql`` (see :func:`entry_values`), the
    payload's parameter becomes that expression (its first parameter the
    payload itself): the statement's text for each such expression is
    rendered once."""

    def __init__(self, compiler: QueryCompiler, statement: Fragment) -> None:
        self.compiler = compiler
        self.text, parameters = compiler.compile_parts(statement)
        self.sql = compiler.render(self.text)
        # Per parameter: the name of the value filled in per use, or None and
        # the value fixed at compile time.
        self._slots = [
            (value.name, None) if isinstance(value, Unbound) else (None, value)
            for value in parameters
        ]
        self._spliced: dict[SqlText, str] = {}

    def parameters(self, values: dict[str, Any]) -> tuple[Any, ...]:
        if values.get("payload_sql") is not None:
            raise RuntimeError("an entry describing upserts is written by its own statement")
        return tuple(value if name is None else values[name] for name, value in self._slots)

    def bind(self, values: dict[str, Any]) -> CompiledQuery:
        spliced = values.get("payload_sql")
        if spliced is None:
            return CompiledQuery(self.sql, self.parameters(values))
        expression, expression_parameters = spliced
        text = self._spliced.get(expression)
        if text is None:
            writer = SqlTextWriter()
            pieces = self.text.pieces
            writer.text(pieces[0])
            for (name, _), piece in zip(self._slots, pieces[1:], strict=True):
                if name == "payload":
                    writer.add(expression)
                else:
                    writer.slot()
                writer.text(piece)
            text = self._spliced[expression] = self.compiler.render(writer.done())
        parameters: list[Any] = []
        for name, value in self._slots:
            if name == "payload":
                parameters += expression_parameters
            else:
                parameters.append(value if name is None else values[name])
        return CompiledQuery(text, tuple(parameters))


class EntryStatements(Protocol):
    """The writer's SQL for one strategy, compiled once."""

    stamp: SqlText
    """Selects the entry's versionstamp from :meth:`with_parts`."""

    def queries(self, values: dict[str, Any]) -> list[CompiledQuery]:
        """The entry's statements, for the values of :func:`entry_values`."""
        ...

    def with_parts(self, values: dict[str, Any]) -> tuple[SqlText, tuple[Any, ...]]:
        """The entry as parts of a WITH, and their parameters."""
        ...

    def versionstamp(self, results: Sequence[QueryResult]) -> str | None:
        """The entry's versionstamp from the results of :meth:`queries`, if known."""
        ...


class OutboxStatements:
    """The writer's SQL for one dialect, compiled once: the statements that
    reserve the next version and write the entry, the last one returning the
    entry's versionstamp where the database has RETURNING. One statement where
    the database allows a data-modifying WITH (PostgreSQL); else the
    reservation and the insert, which learns the reserved version from the
    counter row this transaction holds (SQLite) or from the session
    (MySQL)."""

    def __init__(self, compiler: QueryCompiler, adapter: DialectAdapter) -> None:
        names = _NAMES
        self.entry = [_Prepared(compiler, q) for q in _statements(adapter, names)]
        self._stamp_returned = adapter.capabilities.supports_returning
        # The same as parts of a WITH, for a statement that also carries the
        # unit's writes; the expression selecting the entry's versionstamp.
        self.parts: _Prepared | None = None
        self.stamp = SqlText()
        if adapter.capabilities.supports_writable_cte:
            reserve, insert = _parts(adapter, names)
            cte = sql(
                f"reserved AS ({{reserve}}), {_ENTRY} AS ({{insert}}{_returning(adapter)})",
                reserve=reserve,
                insert=insert,
                vs=names["vs"],
            )
            self.parts = _Prepared(compiler, cte)
            stamp = sql(f"(SELECT {{vs}} FROM {_ENTRY})", vs=names["vs"])
            self.stamp, _ = compiler.compile_parts(stamp)

    def queries(self, values: dict[str, Any]) -> list[CompiledQuery]:
        """The entry's statements, for the values of :func:`entry_values`."""
        return [statement.bind(values) for statement in self.entry]

    def with_parts(self, values: dict[str, Any]) -> tuple[SqlText, tuple[Any, ...]]:
        """The entry as parts of a WITH (where :attr:`parts` is not None),
        and their parameters: ``reserved`` and the entry's insert, which
        :attr:`stamp` selects the versionstamp from."""
        if self.parts is None:
            raise RuntimeError("this database cannot write the outbox entry inside a WITH")
        return self.parts.text, self.parts.parameters(values)

    def versionstamp(self, results: Sequence[QueryResult]) -> str | None:
        """The entry's versionstamp, from the results of :meth:`queries`
        (None if the driver did not report it: the entry is committed by
        then, and this must not make it look as if it were not)."""
        if self._stamp_returned:
            return str(next(iter(results[-1].rows[0].values())))
        reserved = results[0]
        # One affected row: the counter row was created, at version 1; two:
        # it was updated, and the insert id carries the new version.
        version = 1 if reserved.rows_affected == 1 else reserved.insert_id
        return None if version is None else f"{version:020x}0000"


class TickedStatements:
    """The writer's SQL under ticks (:mod:`.ticks`): the entry without a
    version, with its transaction's id, as one statement (or a part of a
    WITH); its versionstamp is not known at commit, but from the first
    tick after it."""

    def __init__(self, compiler: QueryCompiler, adapter: DialectAdapter) -> None:
        ticks = adapter.sql.outbox_ticks
        if ticks is None or not adapter.capabilities.supports_writable_cte:
            raise ValueError("this dialect has no outbox ticks")
        payload = sql(adapter.sql.json_from_text, x=_UNBOUND["payload"])
        insert = sql_using(
            _TICKED_INSERT,
            **_NAMES,
            **_UNBOUND,
            payload_json=payload,
            xid=Fragment((ticks.entry_xid,)),
        )
        vs = _NAMES["vs"]
        # (The wake-up rides on it as under the counter: a woken reader
        # ticks before it reads. Selecting the entry's NULL versionstamp in
        # a WITH makes the insert run after the writes, whose counts come
        # first: the entry id of a unit that waited on another's row is
        # above that unit's.)
        insert += sql(_returning(adapter), vs=vs)
        self.entry = [_Prepared(compiler, insert)]
        self.parts = _Prepared(compiler, sql(f"{_ENTRY} AS ({{i}})", i=insert))
        self.stamp, _ = compiler.compile_parts(sql(f"(SELECT {{vs}} FROM {_ENTRY})", vs=vs))

    def queries(self, values: dict[str, Any]) -> list[CompiledQuery]:
        return [statement.bind(values) for statement in self.entry]

    def with_parts(self, values: dict[str, Any]) -> tuple[SqlText, tuple[Any, ...]]:
        return self.parts.text, self.parts.parameters(values)

    def versionstamp(self, results: Sequence[QueryResult]) -> str | None:
        return None


class KeyedStatements:
    """An entry's statements (``inner``) preceded by the row recording the
    unit's idempotency key in ``fragno_db_unit_keys``, the one table where
    every key given to a unit is unique — whether the unit writes an entry
    or not. (A key recorded only in the entry's ``uow_id`` would not stop a
    unit with the same key that writes no entry, and the other way round.)
    The key's row goes first, so that a second unit with the key fails on
    it before it reserves a version."""

    def __init__(self, inner: EntryStatements, compiler: QueryCompiler) -> None:
        self.inner = inner
        names = {**_NAMES, **_KEY_NAMES, **_UNBOUND}
        self.key = _Prepared(compiler, sql_using(KEY_INSERT, **names))
        self.key_part = _Prepared(
            compiler, sql(f"{_KEY} AS ({{i}})", i=sql_using(KEY_INSERT, **names))
        )
        self.stamp = inner.stamp

    def queries(self, values: dict[str, Any]) -> list[CompiledQuery]:
        return [self.key.bind(values), *self.inner.queries(values)]

    def with_parts(self, values: dict[str, Any]) -> tuple[SqlText, tuple[Any, ...]]:
        text, parameters = self.inner.with_parts(values)
        joined = SqlText.join([self.key_part.text, text])
        return joined, (*self.key_part.parameters(values), *parameters)

    def versionstamp(self, results: Sequence[QueryResult]) -> str | None:
        return self.inner.versionstamp(results[1:])


def _parts(adapter: DialectAdapter, names: dict[str, Any]) -> tuple[Fragment, Fragment]:
    """The reservation and the entry's insert, which reads the reserved
    version from a WITH part named ``reserved`` where the database has them."""
    strategy = adapter.outbox_version_strategy
    reserved = (
        "(SELECT {v} FROM reserved)"
        if adapter.capabilities.supports_writable_cte
        else _RESERVED[strategy]
    )
    version = sql(adapter.sql.version_hex, value=sql_using(reserved, **names))
    payload = sql(
        adapter.sql.json_from_text,
        x=sql(
            "REPLACE({payload}, {stand_in}, {version})",
            payload=_UNBOUND["payload"],
            stand_in=_UNBOUND["stand_in"],
            version=version,
        ),
    )
    insert = sql_using(_INSERT, **names, **_UNBOUND, payload_json=payload, version=version)
    return _reserve(adapter, names), insert


def _reserve(adapter: DialectAdapter, names: dict[str, Any]) -> Fragment:
    """The statement reserving the next version: the counter's plus one, or
    the floor's where that is higher (after a promotion)."""
    strategy = adapter.outbox_version_strategy
    floor = adapter.sql.outbox_version_floor
    if floor is None:
        return sql_using(_RESERVE[strategy], **names)
    if strategy not in _RESERVE_ABOVE_FLOOR:
        raise ValueError(f"the {strategy!r} outbox counter has no version floor")
    return sql_using(_RESERVE_ABOVE_FLOOR[strategy], **names, floor=Fragment((floor,)))


def _returning(adapter: DialectAdapter) -> str:
    """The entry's RETURNING clause: its versionstamp, and the wake-up of
    waiting readers where the dialect has one (:mod:`.push`) — evaluated
    once, for the one row, in the entry's own statement: no round trip of
    its own."""
    wake = adapter.sql.outbox_wake
    return " RETURNING {vs}" + ("" if wake is None else f", {wake}")


def _statements(adapter: DialectAdapter, names: dict[str, Any]) -> list[Fragment]:
    reserve, insert = _parts(adapter, names)
    if adapter.capabilities.supports_returning:
        insert += sql(_returning(adapter), vs=names["vs"])
    elif adapter.sql.outbox_wake is not None:
        raise ValueError("an outbox wake-up needs RETURNING to ride on the entry's insert")
    if adapter.capabilities.supports_writable_cte:
        return [sql("WITH reserved AS ({reserve}) ", reserve=reserve) + insert]
    return [reserve, insert]


def _payload_value(info: ColumnInfo, value: Any) -> Any:
    """The value as stored, tagged for JSON (:func:`tagged_json.tag`): a
    RowId travels as its external id, other values as a read gives them
    back (:func:`~aiofragno.codec.read_back`: an int given for a decimal as
    a Decimal, a naive datetime accepted as UTC as an aware one, ...)."""
    exact = type(value)
    kind = info.kind
    if exact is str or (exact is int and kind not in _NOT_INT):
        return tag(value)
    if info.column is None or info.target is not None:  # (an id: a RowId or str)
        return str(value)
    return tag(read_back(kind, info.column.arg, value))


_NOT_INT = frozenset({"decimal", "float"})  # (an int given is stored as another type)


def _head(
    op: MutationOp, kind: str, external_id: str, where: tuple[str, str, str], index: int
) -> dict[str, Any]:
    """What every mutation of the payload says: ``kind`` (create, update,
    delete) of the row ``external_id`` of ``op``'s table in ``where``
    (schema, namespace, versionstamps' first 20 hex digits)."""
    schema, namespace, version = where
    return {
        "op": kind,
        "schema": schema,
        "namespace": namespace,
        "table": op.table.name,
        "external_id": external_id,
        "versionstamp": f"{version}{index:04x}",
    }


def _mutation(
    op: MutationOp,
    kind: str,
    external_id: str,
    values: dict[str, Any] | None,
    where: tuple[str, str, str],
    index: int,
    ref_map: dict[str, str],
) -> dict[str, Any]:
    """One mutation of the payload (:func:`_head`) and, for a create or an
    update, its ``values`` (as "values" or "set"); the references among
    them go into ``ref_map``."""
    entry = _head(op, kind, external_id, where, index)
    if values is not None:
        stored = stored_values(op.table, values, ref_map, f"{index}.")
        entry["values" if kind == "create" else "set"] = stored
    if op.checked:
        entry["check_version"] = tag(getattr(op.target, "version", None))
    return entry


def stored_values(
    table: TableInfo, values: dict[str, Any], ref_map: dict[str, str], prefix: str
) -> dict[str, Any]:
    """``values`` of ``table``'s columns as the payload holds them, tagged
    for JSON; each reference also goes into ``ref_map`` as
    ``<prefix><column>``."""
    columns = table.columns
    stored: dict[str, Any] = {}
    for column, value in values.items():
        info = columns[column]
        if value is None:
            stored[column] = None
            continue
        if info.target is not None:
            ref_map[f"{prefix}{column}"] = str(value)
        stored[column] = _payload_value(info, value)
    return stored


def stored_column(
    table: TableInfo, column: str, values: list[Any], ref_map: dict[str, str], prefix: str
) -> list[Any]:
    """The ``values`` of one column in many rows, each as :func:`stored_values`
    stores it; the references go into ``ref_map`` as
    ``<prefix><row position>.<column>``."""
    info = table.columns[column]
    kind = info.kind
    if info.target is not None:
        for position, value in enumerate(values):
            if value is not None:
                ref_map[f"{prefix}{position}.{column}"] = str(value)
    # (The common exact types inline, as _payload_value would store them.)
    ints = kind not in _NOT_INT
    return [
        value
        if value is None
        or type(value) is str
        or (ints and type(value) is int and -_SAFE_INT < value < _SAFE_INT)
        else _payload_value(info, value)
        for value in values
    ]


def describe(
    schema: str,
    namespace: str,
    ops: Sequence[MutationOp],
    version: str,
    outcomes: list[tuple[str, SqlText, list[Any]]] | None = None,
) -> tuple[list[dict[str, Any] | str], dict[str, str]]:
    """The payload's mutations, already tagged for JSON (only the column values
    can need tags: the rest is our own strings, and a column name never starts
    with ``$``), and the ref_map ("<index>.<column>" -> external id of the
    referenced row). ``version`` is the versionstamps' first 20 hex digits.
    References are always known by external id on our side (a RowId is its
    external id, even one created earlier in the unit), so the map needs no
    lookup.

    An upsert (:class:`~aiofragno.uow.upsert.Upsert`), whose outcome is
    known only once it ran, is a token string in the mutations, and
    ``outcomes`` gets what replaces the token (with its JSON quotes) when
    the entry is written: an SQL expression, and its parameters, giving the
    mutation as a create or as an update. An upsert that already ran
    (its ``written``; the unit's later writes could change what holds its
    key, see :mod:`aiofragno.uow.executor`) is described by its result."""
    mutations: list[dict[str, Any] | str] = []
    ref_map: dict[str, str] = {}
    where = (schema, namespace, version)
    for op in ops:
        index = len(mutations)
        describe_self = op.describe
        if describe_self is not None:  # a bulk write (uow.bulk) says what it wrote
            entry = _head(op, op.op, str(op.target), where, index)
            describe_self(entry, index, ref_map)
            mutations.append(entry)
            continue
        values = getattr(op, "values", None)
        if op.op != "upsert" or outcomes is None:
            mutations.append(_mutation(op, op.op, str(op.target), values, where, index, ref_map))
            continue
        upsert: Any = op  # (an Upsert; not imported: the unit of work imports this module)
        created = _mutation(op, "create", str(op.target), values, where, index, ref_map)
        written = upsert.written
        if written is not None:  # (it ran already: its own result says which)
            external_id, was_created = written
            if not was_created:
                created = _mutation(op, "update", external_id, upsert.set_values, where, index, {})
            mutations.append(created)
            continue
        token = f"{version}u{index:04x}"
        updated = _mutation(op, "update", token, upsert.set_values, where, index, {})
        look_up, look_up_parameters = upsert.id_sql
        parameters = [
            *look_up_parameters,
            str(op.target),
            dump_tagged(created),
            dump_tagged(updated),
            token,
            *look_up_parameters,
            str(op.target),
        ]
        outcomes.append((token, _outcome(look_up), parameters))
        mutations.append(token)
    return mutations, ref_map


def _outcome(look_up: SqlText) -> SqlText:
    """Chooses an upsert's mutation once it ran: the create if the row holding
    its key (``look_up``: its external id) is the one the upsert would have
    created, else the update, its external id put in place of the token."""
    writer = SqlTextWriter()
    writer.text("CASE WHEN ")
    writer.add(look_up)
    writer.text(" = ")
    writer.slot()  # the id the upsert would have created
    writer.text(" THEN ")
    writer.slot()  # the create
    writer.text(" ELSE REPLACE(")
    writer.slot()  # the update, with the token in its external id's place
    writer.text(", ")
    writer.slot()  # the token
    writer.text(", COALESCE(")
    writer.add(look_up)
    writer.text(", ")
    writer.slot()
    writer.text(")) END")
    return writer.done()


def entry_values(
    codec: ValueCodec,
    *,
    uow_id: str,
    nonce: str,
    schema: str,
    namespace: str,
    writes: Sequence[MutationOp],
) -> dict[str, Any]:
    """What the outbox entry of a unit with these ``writes`` (creates,
    updates, deletes — never checks) binds, for :meth:`OutboxStatements.queries`
    (run last in the unit's transaction; their results give the entry's
    versionstamp, :meth:`OutboxStatements.versionstamp`) or
    :meth:`OutboxStatements.with_parts`. ``nonce`` names the execute_uow
    call, so that after a lost COMMIT it finds its own entry only."""
    # A random stand-in takes the version's place in the prepared texts; the
    # database swaps in the version it reserves, so from the reservation to
    # COMMIT nothing waits for a reply from us.
    stand_in = os.urandom(10).hex()
    outcomes: list[tuple[str, SqlText, list[Any]]] = []
    mutations, ref_map = describe(schema, namespace, writes, stand_in, outcomes)
    payload = dump_tagged({"version": 1, "mutations": mutations})
    return {
        "stamp": stand_in + "0000",
        "stand_in": stand_in,
        "uow_id": uow_id,
        "payload": payload,
        "payload_sql": _with_outcomes(payload, outcomes) if outcomes else None,
        "refs": dump_tagged(ref_map) if ref_map else None,
        "created": codec.encoder("timestamp")(utc_now()),
        "nonce": nonce,
    }


def _with_outcomes(
    payload: str, outcomes: list[tuple[str, SqlText, list[Any]]]
) -> tuple[SqlText, list[Any]]:
    """The payload as an SQL expression that puts each upsert's mutation
    in its token's place (:func:`describe`), and its parameters."""
    expression = SqlText(("", ""))  # the payload's own parameter
    parameters: list[Any] = [payload]
    for token, outcome, outcome_parameters in outcomes:
        expression = "REPLACE(" + expression + ", " + SqlText(("", "")) + ", " + outcome + ")"
        parameters += [f'"{token}"', *outcome_parameters]
    return expression, parameters
