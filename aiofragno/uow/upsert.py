"""Writes by unique key: ``uow.upsert`` (create the row holding a key, or
update it) and ``uow.check_absent`` (conflict if a row holds the key).

An upsert is one statement in the database's own words
(:class:`~aiofragno.driver.UpsertSql`: ``INSERT .. ON CONFLICT (key) DO
UPDATE`` on PostgreSQL and SQLite, ``INSERT .. ON DUPLICATE KEY UPDATE`` on
MySQL), which returns the row it wrote (or, without RETURNING, is followed
by a read of it, :class:`UpsertRead`). Which of the two happened is known
only once it ran, so its outbox mutation is written by the entry's own
statement, last in the transaction: the mutation as a create or as an
update, chosen by whether the row holding the key is the one the upsert
would have created (see :func:`aiofragno.outbox.writer.describe`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..driver import CompiledQuery, QueryResult
from ..errors import UniqueViolation, ValidationError
from ..schema import EXTERNAL_ID, INTERNAL_ID, VERSION, Index, RowId
from ..sqltext import SqlText
from .catalog import Catalog, TableInfo
from .compiling import Compiling
from .ops import Create, MutationOp, Update, cached_text
from .unique import id_by_key, key_values, render_key


class Upserted:
    """What ``uow.upsert`` returns: once the unit has committed, ``result``
    is the row's id (an :class:`~aiofragno.RowId` carrying the version the
    upsert left it at) and ``created`` whether the upsert created it."""

    __slots__ = ("_created", "_result", "committed", "table")

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self._result: RowId | None = None
        self._created = False
        self.committed = False  # (set by the unit once its phase committed)

    def _set(self, row_id: RowId, created: bool) -> None:
        self._result, self._created = row_id, created

    @property
    def result(self) -> RowId:
        if not self.committed:
            raise ValidationError(
                f"the result of this upsert on {self.table.name!r} is known once the unit has "
                "committed: return it from your function and read it after execute_uow"
            )
        if self._result is None:
            raise ValidationError(
                f"this upsert on {self.table.name!r} committed, but its connection was lost "
                "before the row came back (the unit's record proved the commit): read the row "
                "by its key"
            )
        return self._result

    @property
    def created(self) -> bool:
        """True if the upsert created the row, False if it updated it."""
        self.result  # noqa: B018 (raises before the unit committed)
        return self._created


def update_columns(
    table: TableInfo, index: Index, values: Mapping[str, Any], update: Sequence[str] | None
) -> tuple[str, ...]:
    """The columns an upsert sets on an existing row: ``update``, or the
    given columns that are not the key's."""
    if update is None:
        return tuple(name for name in values if name not in index.columns)
    if isinstance(update, str) or not isinstance(update, Sequence):
        raise ValidationError(f"update= takes a list of column names, got {update!r}")
    for name in update:
        if name not in values:
            table.column(name)  # (an unknown column is named as such)
            raise ValidationError(
                f"upsert on {table.name!r}: update= names {name!r}, which values does not give"
            )
    return tuple(update)


class Upsert(MutationOp):
    """``INSERT .. ON CONFLICT (key) DO UPDATE`` (in the dialect's words),
    bumping the version of a row it updates; its result, the row written."""

    op = "upsert"
    must_match = False
    runs_alone = True
    wants_result = True

    def __init__(
        self,
        catalog: Catalog,
        create: Create,
        index: Index,
        update: tuple[str, ...],
        handle: Upserted,
    ) -> None:
        table = create.table
        super().__init__(table, create.target)
        self.values = create.values  # (every column, as a create gives them)
        self.lookups = create.lookups
        self.index = index
        self.update = update
        self.handle = handle
        self.key = key_values(table, index, self.values)
        # The key's values, to tell it from another upsert's (gathers); None
        # where Python's equality may disagree with the database's (NaN).
        key_id = tuple(self.key.values())
        self.key_id = None if float in map(type, key_id) else key_id
        self.returning = catalog.adapter.capabilities.supports_returning
        self.returns = 3 if self.returning else 0  # (see render)
        # ("create" in the key: the text depends on what Create's did.)
        key = ("upsert", create.query.sql, index.name, update, self.returning)
        self.query = CompiledQuery(
            cached_text(catalog, table, key, self.render), create.query.parameters
        )
        self._catalog = catalog

    @functools.cached_property
    def id_sql(self) -> tuple[SqlText, list[Any]]:
        """The outbox entry's look-up of the row holding the key (its
        external id), and its parameters."""
        return id_by_key(self._catalog, self.table, self.key)

    @property
    def set_values(self) -> dict[str, Any]:
        """What an update of an existing row sets."""
        return {name: self.values[name] for name in self.update}

    def render(self, ctx: Compiling) -> None:
        table = self.table
        words = ctx.catalog.adapter.sql.upsert
        quote = ctx.catalog.compiler.quote_identifier
        columns = [
            table.columns[EXTERNAL_ID].quoted,
            *(table.columns[n].quoted for n in self.values),
        ]
        ctx.text(f"{words.into.format(table=table.sql_name)} ({', '.join(columns)}) VALUES (")
        ctx.raw_value(str(self.target))
        for name, value in self.values.items():
            ctx.text(", ")
            if value is None:
                ctx.raw_value(None)
            else:
                ctx.value(name, value)
        ctx.text(")")
        matches = " AND ".join(
            words.matches.format(column=table.columns[n].quoted) for n in self.index.columns
        )
        assignments = [
            words.assign.format(column=table.columns[n].quoted, matches=matches)
            for n in self.update
        ]
        assignments.append(words.bump.format(column=quote(VERSION), matches=matches))
        keys = ", ".join(table.columns[n].quoted for n in self.index.columns)
        ctx.text(words.clause.format(keys=keys, assignments=", ".join(assignments)))
        if self.returning:
            ctx.text(f" RETURNING {quote(EXTERNAL_ID)}, {quote(VERSION)}, {quote(INTERNAL_ID)}")

    def take(self, result: QueryResult) -> None:
        if self.returning:
            self.found(result.rows[0].raw)

    @property
    def written(self) -> tuple[str, bool] | None:
        """The external id of the row written and whether the upsert
        created it, once its statement ran in this attempt (else None)."""
        row = self.handle._result
        return None if row is None else (str(row), self.handle._created)

    def found(self, row: Sequence[Any]) -> None:
        """The row written: external id, version, internal id."""
        external_id, version, internal_id = row
        created = external_id == str(self.target)
        self.handle._set(RowId(external_id, version, internal_id, self.table.identity), created)


class KeyRowUpdate(MutationOp):
    """Right after an :class:`Upsert` whose clause fires on whichever unique
    key the row collides on first (:attr:`UpsertSql.unchanged
    <aiofragno.driver.UpsertSql.unchanged>`: MySQL's ON DUPLICATE KEY
    UPDATE): if it changed no row, it fired on another key's row, so the
    row holding the named key — if any, and not the one it created — is
    updated here, as an upsert by that key alone would have."""

    op = "upsert_update"
    must_match = False
    runs_alone = True
    in_outbox = False

    def __init__(self, catalog: Catalog, upsert: Upsert, unchanged: str) -> None:
        super().__init__(upsert.table, upsert.target)
        table = upsert.table

        def render(ctx: Compiling) -> None:
            version = ctx.catalog.compiler.quote_identifier(VERSION)
            ctx.text(f"UPDATE {table.sql_name} t SET ")
            for name in upsert.update:
                ctx.text(f"{table.columns[name].quoted} = ")
                _value(ctx, name, upsert.values[name])
                ctx.text(", ")
            ctx.text(f"{version} = {version} + 1 WHERE ")
            render_key(ctx, upsert.key)
            ctx.text(f" AND {table.columns[EXTERNAL_ID].qualified} <> ")
            ctx.raw_value(str(upsert.target))
            ctx.text(f" AND {unchanged}")

        self.render = render
        self.query = _compiled(catalog, upsert, "upsert_update", render)


class InsertAbsent(MutationOp):
    """After :class:`KeyRowUpdate`: the upsert's row inserted without the
    clause if no row holds the key — which happens only when the upsert's
    clause fired on another unique key's row, so the insert fails on that
    index, named in the database's message as an upsert by the key alone
    would fail (``conflict_on_unique`` can then count it)."""

    op = "upsert_insert"
    must_match = False
    runs_alone = True
    in_outbox = False

    def __init__(self, catalog: Catalog, upsert: Upsert) -> None:
        super().__init__(upsert.table, upsert.target)
        table = upsert.table

        def render(ctx: Compiling) -> None:
            columns = [table.columns[EXTERNAL_ID].quoted]
            columns += [table.columns[n].quoted for n in upsert.values]
            ctx.text(f"INSERT INTO {table.sql_name} ({', '.join(columns)}) SELECT ")
            ctx.raw_value(str(upsert.target))
            for name, value in upsert.values.items():
                ctx.text(", ")
                _value(ctx, name, value)
            ctx.text(f" WHERE NOT EXISTS (SELECT 1 FROM {table.sql_name} t WHERE ")
            render_key(ctx, upsert.key)
            ctx.text(")")

        self.render = render
        self.query = _compiled(catalog, upsert, "upsert_insert", render)


def _value(ctx: Compiling, name: str, value: Any) -> None:
    if value is None:
        ctx.raw_value(None)
    else:
        ctx.value(name, value)


def _compiled(
    catalog: Catalog, upsert: Upsert, kind: str, render: Callable[[Compiling], None]
) -> CompiledQuery:
    """``render``'s statement for ``upsert``, its text from the cache."""
    ctx = Compiling(catalog, upsert.table, build_text=False)
    render(ctx)
    shape = (upsert.query.sql, kind, tuple(ctx.signature))
    return CompiledQuery(cached_text(catalog, upsert.table, shape, render), tuple(ctx.params))


class UpsertRead(MutationOp):
    """Reads back the row an :class:`Upsert` wrote, by its key, where the
    database has no RETURNING. Where the upsert's clause fires on any
    unique key, either :class:`KeyRowUpdate` and :class:`InsertAbsent` ran
    between them, so that a row holding the key is the one the upsert
    wrote, or (``unchanged``: :attr:`UpsertSql.unchanged
    <aiofragno.driver.UpsertSql.unchanged>`) the read takes that row only
    if the upsert inserted or changed it. No row is then a unique
    violation of another index."""

    op = "upsert_read"
    is_read = True
    wants_result = True

    def __init__(self, catalog: Catalog, upsert: Upsert, unchanged: str | None = None) -> None:
        super().__init__(upsert.table, upsert.target)
        self.upsert = upsert
        table = upsert.table

        def render(ctx: Compiling) -> None:
            qualified = table.columns[EXTERNAL_ID].qualified
            ctx.text(f"SELECT {qualified}, t.{ctx.catalog.compiler.quote_identifier(VERSION)}, ")
            ctx.text(f"{table.internal_id} FROM {table.sql_name} t WHERE ")
            render_key(ctx, upsert.key)
            if unchanged is not None:
                # The row the upsert inserted, or one its update branch
                # changed; else its clause fired on another key's row.
                ctx.text(f" AND ({qualified} = ")
                ctx.raw_value(str(upsert.target))
                ctx.text(f" OR NOT ({unchanged}))")

        self.render = render
        kind = "upsert_read" if unchanged is None else "upsert_read_wrote"
        self.query = _compiled(catalog, upsert, kind, render)

    def take(self, result: QueryResult) -> None:
        self.upsert.found(result.rows[0].raw)

    @property
    def seen(self) -> bool:
        return False

    def stale(self) -> str:
        return f"upsert on {self.table.name} by {self.upsert.index.name!r}"

    def missing(self) -> Exception:
        return UniqueViolation(
            f"{self.stale()}: the row it would write collides with another row on another "
            "unique index; nothing was written"
        )


def gathers(run: Sequence[MutationOp], op: MutationOp) -> bool:
    """Whether ``op`` may join ``run`` in one statement (a data-modifying
    WITH, whose parts all see one snapshot and must not write one row
    twice): both upserts returning their rows, by the same unique index of
    the same table, ``op``'s key held by none of ``run``'s. A row holds one
    key, so no two of them write the same row; one that collides with
    another's row on another unique index fails as it would alone."""
    first = run[0]
    if not (isinstance(op, Upsert) and isinstance(first, Upsert) and op.returns):
        return False
    if op.table.name != first.table.name or op.index.name != first.index.name:
        return False
    key = op.key_id
    return key is not None and all(
        isinstance(other, Upsert) and other.key_id != key for other in run
    )


def upsert_ops(catalog: Catalog, upsert: Upsert) -> list[MutationOp]:
    """``upsert`` and, where the database has no RETURNING, what reads its
    row back (and, where its clause fires on any unique key, what makes it
    act on the named key alone)."""
    if upsert.returning:
        return [upsert]
    unchanged = catalog.adapter.sql.upsert.unchanged
    if unchanged is None:
        return [upsert, UpsertRead(catalog, upsert)]
    if _only_unique_index(upsert.table, upsert.index):
        # The clause can fire on no declared key but the named one (the id
        # is new, the internal id generated), so no statement has to make
        # it act on that key alone; the read finds no row if it fired on
        # another (an index the schema does not declare): a unique
        # violation, as the named key's clause would have had.
        return [upsert, UpsertRead(catalog, upsert, unchanged)]
    return [
        upsert,
        KeyRowUpdate(catalog, upsert, unchanged),
        InsertAbsent(catalog, upsert),
        UpsertRead(catalog, upsert),
    ]


def _only_unique_index(table: TableInfo, index: Index) -> bool:
    """Whether ``index`` is the only unique index ``table`` declares."""
    return not any(i.unique and i is not index for i in table.table.indexes.values())


class CheckAbsent(MutationOp):
    """``uow.check_absent``: one row (``SELECT 1 WHERE NOT EXISTS ..``)
    while no row holds the key, none — a conflict — once one does. Like a
    check, it holds a shared lock where the database has one (MySQL's also
    covers the gap, so a concurrent insert of the key waits)."""

    op = "check_absent"
    checked = True
    is_read = True

    def __init__(
        self, catalog: Catalog, table: TableInfo, index: Index, key: dict[str, Any]
    ) -> None:
        super().__init__(table, ", ".join(f"{n}={v!r}" for n, v in key.items()))
        self.index = index
        self.key = key

        def render(ctx: Compiling) -> None:
            ctx.text(f"SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM {table.sql_name} t WHERE ")
            render_key(ctx, key)
            ctx.text(ctx.catalog.adapter.sql.row_share_lock + ")")

        ctx = Compiling(catalog, table, build_text=False)
        render(ctx)
        shape = (table.name, "check_absent", tuple(key), tuple(ctx.signature))
        self.render = render
        self.query = CompiledQuery(cached_text(catalog, table, shape, render), tuple(ctx.params))

    def stale(self) -> str:
        return f"check_absent on {self.table.name} ({self.target}): a row with that key exists"


def checked_upsert(
    catalog: Catalog,
    create: Create,
    index: Index,
    update: tuple[str, ...],
    check: RowId | None,
    handle: Upserted,
) -> list[MutationOp]:
    """The operations of an upsert that knows what it read: ``check=None``
    (no row held the key) is a create after a :class:`CheckAbsent`;
    ``check=<RowId>`` an update of that row at that version."""
    table = create.table
    if check is None:
        handle._set(create.target, True)  # type: ignore[arg-type]
        key = key_values(table, index, create.values)
        return [CheckAbsent(catalog, table, index, key), create]
    op = Update(catalog, table, check, {n: create.values[n] for n in update}, True)
    target = op.target
    assert isinstance(target, RowId) and target.version is not None  # (row_id checked it)
    handle._set(RowId(str(target), target.version + 1, target.internal_id, table.identity), False)
    return [op]
