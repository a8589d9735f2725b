"""Bulk writes in a unit of work: ``create_many``, ``update_many`` and
``delete_many`` (see docs/units-of-work.md, "Bulk writes").

Each call is cut into statements of bounded size (:data:`CHUNK_PARAMETERS`
parameters, :data:`CHUNK_BYTES` of text and binary values: below every
backend's limit on parameters and MySQL's ``max_allowed_packet``), each run
alone in the mutation phase — never combined into a WITH — so that no
statement grows with the number of rows beyond those bounds. They commit in
the unit's one transaction with its other writes, or not at all.

``update_many`` and ``delete_many`` write an exact set of rows, known before
the mutation phase — given (``rows=``) or read by the unit's retrieval
(``where=``) — so that the outbox entry can list every row written. In the
phase, after writing a chunk's rows (and so holding their locks), a
:class:`_RowsAt` check counts them, and with ``check=True`` sums their
versions: a row gone, or (checked) one whose version moved since it was
read, makes the unit conflict and run again. (Versions only grow, one per
write, so the sum of the versions read plus one per row is reached only if
no row moved.) A delete first bumps its rows' versions, to lock and check
them, then deletes them. With ``where=`` and ``check=True``, a
:class:`_MatchCount` check at the start of the phase (before the unit's
own writes, which it must not count) also conflicts if a row matching
``where`` appeared since the retrieval.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

from ..brief import brief
from ..codec import MUTABLE, MUTABLE_KINDS, as_queued
from ..driver import CompiledQuery
from ..errors import ValidationError
from ..outbox.writer import stored_column, stored_values
from ..schema import EXTERNAL_ID, VERSION, RowId, new_external_id
from .catalog import Catalog, ColumnInfo, TableInfo
from .compiling import Compiling, row_id
from .expr import Expr, where_expr
from .ops import (
    Check,
    MutationOp,
    ReadRows,
    RetrievalOp,
    _bind_value,
    _bind_values,
    _check_mapping,
    _refuse,
    cached_text,
    compile_cached,
)

# Far below every backend's limit on parameters (PostgreSQL 32,767, SQLite
# 32,766 since 3.32, MySQL 65,535), and small enough that a statement's text
# stays near 15 KiB, the largest whose prepared form asyncpg caches: a text
# prepared afresh at every run costs a round trip and a parse more. Measured
# (create_many of 10,000 two-column rows in one unit, against the driver's
# executemany): 0.75x at 30,000 parameters per statement, 1.07x at 2,000 on
# PostgreSQL; 0.72x and 0.99x on SQLite; 0.78x and 0.93x on MariaDB.
CHUNK_PARAMETERS = 2_000
# The text and binary values of one statement: well below MySQL's smallest
# usual max_allowed_packet (16 MiB), which the statement must fit in.
CHUNK_BYTES = 4 * 1024 * 1024


class All:
    """``where=af.ALL``: every row of the table. ``update_many`` and
    ``delete_many`` take no empty or missing ``where``, so that writing to a
    whole table is never an accident."""

    _instance: All | None = None

    def __new__(cls) -> All:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "af.ALL"


ALL = All()


class BulkWrite:
    """What ``update_many`` or ``delete_many`` returns: the rows it writes
    (``ids``) and how many (``count``, also ``result``) — known once the
    unit's retrieval has read them (at once for ``rows=``); once the unit has
    committed, exactly the rows written."""

    def __init__(self, table: TableInfo) -> None:
        self.table = table
        self._ids: list[RowId | str] | None = None
        self.read: _ReadTargets | None = None  # (by where: the read of its rows)

    @property
    def ids(self) -> list[RowId | str]:
        if self._ids is None and self.read is not None:
            return list(self.read.result)
        if self._ids is None:
            raise ValidationError(
                f"the rows of this bulk write on {self.table.name!r} are not known yet: "
                "they are read by the unit's retrieval (await uow.retrieve())"
            )
        return self._ids

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def result(self) -> int:
        return self.count


class _Chunk(MutationOp):
    """One statement of a bulk write. Run alone (never in a combined WITH);
    in the outbox only if it carries the ``description`` of its whole call."""

    runs_alone = True
    must_match = False

    def __init__(self, table: TableInfo, label: str, description: dict[str, Any] | None) -> None:
        super().__init__(table, label)
        self.description = description
        self.in_outbox = description is not None

    def describe(self, entry: dict[str, Any], index: int, ref_map: dict[str, str]) -> None:
        """Complete the outbox ``entry`` of the whole call (see writer.describe)."""
        assert self.description is not None
        entry.pop("external_id")
        entry["op"] = self.description["op"]
        entry["external_ids"] = [str(target) for target in self.description["ids"]]
        values = self.description.get("set")
        if values is not None:
            entry["set"] = stored_values(self.table, values, ref_map, f"{index}.")
        if self.description["check"]:
            entry["check_versions"] = [target.version for target in self.description["ids"]]


# -- create_many ----------------------------------------------------------


class _CreateRows(_Chunk):
    op = "create"

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        columns: tuple[str, ...],
        params: tuple[Any, ...],
        lookups: tuple[tuple[bool, ...], ...],
        description: dict[str, Any] | None,
    ) -> None:
        count = len(params) // (len(columns) + 1)
        super().__init__(table, f"<create_many of {count} rows>", description)
        self.columns = columns
        self.params = params
        self.count = count
        self.row_lookups = lookups
        key = (table.name, "create_many", columns, count, lookups)
        text = cached_text(catalog, table, key, self.render)
        self.query = CompiledQuery(text, params)

    def render(self, ctx: Compiling) -> None:
        table = self.table
        names = [
            table.columns[EXTERNAL_ID].quoted,
            *(table.columns[n].quoted for n in self.columns),
        ]
        ctx.text(f"INSERT INTO {table.sql_name} ({', '.join(names)}) VALUES ")
        targets = [table.columns[n].target for n in self.columns]
        params = iter(self.params)
        for i in range(self.count):
            ctx.text("(" if i == 0 else ", (")
            ctx.raw_value(next(params))
            looked_up = self.row_lookups[i] if self.row_lookups else ()
            for j, target in enumerate(targets):
                ctx.text(", ")
                param = next(params)
                if target is not None and looked_up[j]:
                    ctx.lookup(target, param)
                else:
                    ctx.raw_value(param)
            ctx.text(")")

    def describe(self, entry: dict[str, Any], index: int, ref_map: dict[str, str]) -> None:
        assert self.description is not None
        entry.pop("external_id")
        entry["op"] = "create_many"
        ids = self.description["ids"]
        # Column by column, as stored_values would tag them row by row.
        stored = [
            stored_column(self.table, name, values, ref_map, f"{index}.")
            for name, values in zip(self.columns, self.description["values"], strict=True)
        ]
        columns = self.columns
        entry["rows"] = [
            {"external_id": external_id, "values": dict(zip(columns, values, strict=True))}
            for external_id, values in zip(ids, zip(*stored, strict=True), strict=True)
        ]


_MISSING = object()


def create_rows(
    catalog: Catalog, table: TableInfo, rows: Sequence[Mapping[str, Any]]
) -> tuple[list[MutationOp], list[RowId]]:
    """The statements inserting ``rows`` (each checked and completed with
    the columns' defaults, like ``create``), and the rows' new ids."""
    if isinstance(rows, Mapping | str | bytes) or not isinstance(rows, Sequence):
        raise ValidationError(
            f"create_many on {table.name!r} takes a list of dicts of column values, "
            f"got {type(rows).__name__}"
        )
    if not rows:
        return [], []
    infos = [info for info in table.columns.values() if info.column is not None]
    columns = _fast_columns(table, infos, rows) or _checked_columns(table, infos, rows)
    ids, external = _new_ids(len(rows), table)
    width = len(infos) + 1
    description: dict[str, Any] | None = {"ids": external, "values": columns.values}
    ops: list[MutationOp] = []
    for start, stop in _chunks(len(rows), width, columns.sizes):
        params = tuple(
            chain.from_iterable(
                zip(external[start:stop], *(c[start:stop] for c in columns.params), strict=True)
            )
        )
        lookups = tuple(columns.lookups[start:stop])
        names = tuple(info.name for info in infos)
        ops.append(_CreateRows(catalog, table, names, params, lookups, description))
        description = None
    return ops, ids


class _Columns:
    """The rows of a ``create_many``, column by column: the values (defaults
    filled in), their parameters; per row, which references are looked up by
    external id (empty without references) and the bytes of its text and
    binary values (None: all rows together fit in :data:`CHUNK_BYTES`)."""

    def __init__(
        self,
        values: list[list[Any]],
        params: list[list[Any]],
        lookups: list[tuple[bool, ...]],
        sizes: list[int] | None,
    ) -> None:
        self.values = values
        self.params = params
        self.lookups = lookups
        self.sizes = sizes


def _fast_columns(
    table: TableInfo, infos: list[ColumnInfo], rows: Sequence[Any]
) -> _Columns | None:
    """The common case, column by column in comprehensions: dicts of
    plain columns (no references) whose values all encode. None for anything
    else, which :func:`_checked_columns` goes through row by row (and says
    what is wrong)."""
    if any(info.target is not None for info in infos) or set(map(type, rows)) != {dict}:
        return None
    names = {info.name for info in infos}
    if not names.issuperset(set().union(*rows)):
        return None  # a name that is no column of the table (a typo, say)
    values: list[list[Any]] = []
    params: list[list[Any]] = []
    lengths: list[list[int]] = []
    try:
        for info in infos:
            column = info.column
            assert column is not None
            encode = info.encode
            col = [row.get(info.name, column.default) for row in rows]
            if info.kind in MUTABLE_KINDS:  # (the entry describes them as bound now)
                col = list(map(as_queued, col))
            encoded: list[Any]
            if None in col:
                if not column.nullable:
                    return None
                encoded = [None if value is None else encode(value) for value in col]
            else:
                encoded = list(map(encode, col))
            values.append(col)
            params.append(encoded)
            lengths.append([len(p) if isinstance(p, _SIZED) else 0 for p in encoded])
    except Exception:  # (a value that does not encode, or compares strangely with None)
        return None
    total = sum(map(sum, lengths))
    sizes = None if total <= CHUNK_BYTES else [sum(row) for row in zip(*lengths, strict=True)]
    return _Columns(values, params, [], sizes)


_SIZED = (str, bytes)


def _checked_columns(table: TableInfo, infos: list[ColumnInfo], rows: Sequence[Any]) -> _Columns:
    """The rows checked one by one (:func:`_create_row`), as columns."""
    checked = []
    for values in rows:
        _check_mapping(table, values, "create_many")
        checked.append(_create_row(table, infos, values))
    params, lookups, completes, sizes = zip(*checked, strict=True)
    has_references = any(info.target is not None for info in infos)
    return _Columns(
        [list(col) for col in zip(*(c.values() for c in completes), strict=True)],
        [list(col) for col in zip(*params, strict=True)],
        list(lookups) if has_references else [],
        list(sizes),
    )


def _chunks(count: int, width: int, sizes: list[int] | None) -> Iterator[tuple[int, int]]:
    """(start, stop) of each statement's rows: at most :data:`CHUNK_PARAMETERS`
    parameters (``width`` per row) and :data:`CHUNK_BYTES` (``sizes``: per row)."""
    most = max(1, CHUNK_PARAMETERS // width)
    start = 0
    while start < count:
        stop = min(count, start + most)
        if sizes is not None:
            total = 0
            for index in range(start, stop):
                total += sizes[index]
                if total > CHUNK_BYTES and index > start:
                    stop = index
                    break
        yield start, stop
        start = stop


def _new_ids(count: int, table: TableInfo) -> tuple[list[RowId], list[str]]:
    """``count`` new row ids (UUIDv7, as :func:`~aiofragno.schema.new_external_id`
    makes them; their random bits drawn at once), as RowIds and as str."""
    identity = table.identity
    prefix = new_external_id()[:13] + "-7"  # the milliseconds, and the version nibble
    noise = os.urandom(10 * count)
    hexed = noise.hex()
    # As new_external_id: the variant (0b10) in the top two bits of noise byte 2.
    variants = ["89ab"[byte >> 6] for byte in noise[2::10]]
    pieces = [hexed[i : i + 20] for i in range(0, 20 * count, 20)]
    external = [
        f"{prefix}{r[1:4]}-{variant}{r[5:8]}-{r[8:]}"
        for r, variant in zip(pieces, variants, strict=True)
    ]
    return [RowId(e, 0, None, identity) for e in external], external


def _create_row(
    table: TableInfo, infos: list[Any], values: Mapping[str, Any]
) -> tuple[list[Any], tuple[bool, ...], dict[str, Any], int]:
    """One row's parameters (column order), which of them are references
    looked up by external id, its values completed with defaults, and the
    size of its text and binary values; or the ValidationError saying what
    is wrong with it."""
    params: list[Any] = []
    looked_up: list[bool] = []
    complete: dict[str, Any] = {}
    given = size = 0
    missing = None  # a required column without a value
    for info in infos:
        column = info.column
        value = values.get(info.name, _MISSING)
        if value is _MISSING:
            value = column.default
        else:
            given += 1
        complete[info.name] = value
        if value is None:
            if not column.nullable and missing is None:
                missing = info.name
            params.append(None)
            looked_up.append(False)
            continue
        param, lookup = _bind_value(table, info, value)
        params.append(param)
        looked_up.append(bool(lookup))
        if isinstance(value, MUTABLE):
            complete[info.name] = as_queued(value)  # (the entry describes it as bound now)
        if type(param) is str or type(param) is bytes:
            size += len(param)
    if given != len(values):  # a name that is no column of the table (a typo, say)
        for name in values:
            if name not in complete:
                _refuse(table, name, "create_many")
    if missing is not None:
        raise ValidationError(f"{table.name}.{missing} is required (NOT NULL, no default)")
    return params, tuple(looked_up), complete, size


# -- update_many and delete_many -----------------------------------------


class _UpdateRows(_Chunk):
    """``UPDATE ... SET <values>, _version = _version + 1 WHERE id IN (...)``."""

    op = "update"

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        values: dict[str, Any],
        ids: Sequence[RowId | str],
        description: dict[str, Any] | None,
    ) -> None:
        super().__init__(table, f"<update_many of {len(ids)} rows>", description)
        self.values = values
        self.ids = ids
        params, variant, self.lookups = _bind_values(table, values, "update_many", bind_nulls=False)
        key = (table.name, "update_many", tuple(values), variant, len(ids))
        text = cached_text(catalog, table, key, self.render)
        self.query = CompiledQuery(text, (*params, *map(str, ids)))

    def render(self, ctx: Compiling) -> None:
        table = self.table
        ctx.text(f"UPDATE {table.sql_name} SET ")
        for name, value in self.values.items():
            ctx.text(f"{table.columns[name].quoted} = ")
            if value is None:
                ctx.text("NULL")
            else:
                ctx.value(name, value)
            ctx.text(", ")
        version = ctx.catalog.compiler.quote_identifier(VERSION)
        ctx.text(f"{version} = {version} + 1")
        _render_ids(ctx, self.ids)


class _DeleteRows(_Chunk):
    op = "delete"

    def __init__(self, catalog: Catalog, table: TableInfo, ids: Sequence[RowId | str]) -> None:
        super().__init__(table, f"<delete_many of {len(ids)} rows>", None)
        self.ids = ids
        text = cached_text(catalog, table, (table.name, "delete_many", len(ids)), self.render)
        self.query = CompiledQuery(text, tuple(map(str, ids)))

    def render(self, ctx: Compiling) -> None:
        ctx.text(f"DELETE FROM {self.table.sql_name}")
        _render_ids(ctx, self.ids)


def _render_ids(ctx: Compiling, ids: Sequence[Any]) -> None:
    quote = ctx.catalog.compiler.quote_identifier
    ctx.text(f" WHERE {quote(EXTERNAL_ID)} IN (")
    for i, target in enumerate(ids):
        if i:
            ctx.text(", ")
        ctx.raw_value(str(target))
    ctx.text(")")


class _RowsAt(Check):
    """A conflict unless every row of ``ids`` is there (and, ``versions``
    given, their versions add up to it): run after the chunk's write, whose
    row locks keep it true until COMMIT. Alone in its statement: in a WITH
    it would not see the writes of the other parts."""

    runs_alone = True

    def __init__(
        self,
        catalog: Catalog,
        table: TableInfo,
        what: str,
        ids: Sequence[RowId | str],
        versions: int | None,
    ) -> None:
        MutationOp.__init__(self, table, f"<{what} of {len(ids)} rows>")
        self.what = what
        self.ids = ids
        self.versions = versions
        key = (table.name, "rows_at", len(ids), versions is not None)
        text = cached_text(catalog, table, key, self.render)
        sums = () if versions is None else (versions,)
        self.query = CompiledQuery(text, (*map(str, ids), len(ids), *sums))

    def render(self, ctx: Compiling) -> None:
        version = ctx.catalog.compiler.quote_identifier(VERSION)
        # A locking read: it reads the rows as they are now (MySQL's plain
        # reads keep to the transaction's first snapshot).
        ctx.text(
            f"SELECT 1 FROM (SELECT count(*) AS n, sum(r.{version}) AS s FROM "
            f"(SELECT {version} FROM {self.table.sql_name}"
        )
        _render_ids(ctx, self.ids)
        ctx.text(f"{ctx.catalog.adapter.sql.row_share_lock}) r) c WHERE c.n = ")
        ctx.raw_value(len(self.ids))
        if self.versions is not None:
            ctx.text(" AND c.s = ")
            ctx.raw_value(self.versions)

    @property
    def seen(self) -> bool:
        """Whether the unit read every row (each id carries its version):
        one gone is then a conflict. Given plain ids, a missing row may never
        have been there, which — as for ``update`` of such an id — is
        :class:`~aiofragno.RowNotFound`, not a conflict to run again."""
        return all(getattr(target, "version", None) is not None for target in self.ids)

    def stale(self) -> str:
        if not self.seen:
            return f"{self.what} on {self.table.name}: a row of the ids given does not exist"
        why = "a row changed or is gone" if self.versions is not None else "a row is gone"
        return f"{self.what} on {self.table.name}: {why} since the unit read it"


class _MatchCount(Check):
    """A conflict unless exactly ``count`` rows match ``where``: first in
    the phase (:func:`expand`), so that a row matching it that appeared
    since the unit's retrieval — not one of the unit's own writes — makes
    the unit run again. Alone in its statement, as
    :class:`_RowsAt`."""

    runs_alone = True

    def __init__(
        self, catalog: Catalog, table: TableInfo, what: str, where: Expr | None, count: int
    ) -> None:
        MutationOp.__init__(self, table, f"<{what} where>")
        self.what = what
        self.where = where
        self.count = count
        shape = ("match_count", None if where is None else where.shape())
        self.query = compile_cached(catalog, table, shape, self.render)

    def render(self, ctx: Compiling) -> None:
        # A locking read, as _RowsAt's (on MySQL it also keeps new matching
        # rows out until COMMIT).
        ctx.text(
            f"SELECT 1 FROM (SELECT count(*) AS n FROM (SELECT 1 AS x FROM {self.table.sql_name} t"
        )
        if self.where is not None:
            ctx.text(" WHERE ")
            self.where.render(ctx)
        ctx.text(f"{ctx.catalog.adapter.sql.row_share_lock}) r) c WHERE c.n = ")
        ctx.raw_value(self.count)

    def stale(self) -> str:
        return f"{self.what} on {self.table.name}: the rows matching where changed since the unit read them"


def _targets(table: TableInfo, rows: Any, check: bool) -> list[RowId | str]:
    """The row ids of ``rows=`` (rows read by the unit, RowIds or id
    strings), each once; with ``check``, each carrying its version."""
    if isinstance(rows, Mapping | str | bytes) or not isinstance(rows, Sequence):
        raise ValidationError(
            f"rows= on {table.name!r} takes a list of rows (a find result) or row ids, "
            f"got {type(rows).__name__}"
        )
    targets: list[RowId | str] = []
    seen: set[str] = set()
    for row in rows:
        value = row.get(EXTERNAL_ID) if isinstance(row, Mapping) else row
        target = row_id(value, table=table, need_version=check)
        if target in seen:
            raise ValidationError(f"rows= on {table.name!r} names row {brief(target)} twice")
        seen.add(target)
        targets.append(target)
    return targets


def _id_chunks(ids: Sequence[RowId | str], room: int) -> Iterator[Sequence[RowId | str]]:
    for start in range(0, len(ids), room):
        yield ids[start : start + room]


class _ReadTargets(ReadRows[list[RowId]]):
    """The ids and versions of the rows matching ``where``, in creation
    order: what an ``update_many`` or ``delete_many`` by ``where`` writes.
    (Its rows start as a whole row's do — internal id, external id,
    version — so it also reads them from a combined read's whole rows.)"""

    def __init__(self, table: TableInfo, where: Expr | None) -> None:
        super().__init__(table, where, None, None, None)

    def shape(self) -> Any:
        return ("targets", super().shape())

    def render(self, ctx: Compiling) -> None:
        if ctx.build_text:
            quote = ctx.catalog.compiler.quote_identifier
            ctx.text(
                f"SELECT {self.table.internal_id}, t.{quote(EXTERNAL_ID)}, t.{quote(VERSION)} FROM "
            )
        self.render_from(ctx)

    def compile(self, catalog: Catalog) -> CompiledQuery:
        return compile_cached(catalog, self.table, self.shape(), self.render)

    def accept(self, rows: Sequence[Sequence[Any]]) -> None:
        identity = self.table.identity
        self._result = [RowId(row[1], row[2], row[0], identity) for row in rows]

    def empty(self) -> None:
        self._result = []


class PendingBulk(MutationOp):
    """An ``update_many`` or ``delete_many`` by ``where``, until the unit's
    retrieval has read its rows (:meth:`expand`)."""

    op = "bulk"

    def __init__(self, write: BulkWrite, read: _ReadTargets, build: Any) -> None:
        super().__init__(write.table, "<pending bulk write>")
        self.write = write
        self.read = read
        self.build = build

    def expand(self) -> list[MutationOp]:
        """The statements writing the rows read (see :func:`bulk_ops`)."""
        ops: list[MutationOp] = self.build(self.read.result)
        return ops


def bulk_ops(
    catalog: Catalog,
    write: BulkWrite,
    values: dict[str, Any] | None,
    ids: list[RowId | str],
    check: bool,
) -> list[MutationOp]:
    """The statements of an update (``values``) or a delete (None) of the
    rows ``ids``: per chunk, the write (for a delete, a version bump first)
    and its :class:`_RowsAt` check; then the deletes."""
    table = write.table
    write._ids = ids
    what = "delete_many" if values is None else "update_many"
    if not ids:
        return []
    bound = 0 if values is None else len(values)
    description: dict[str, Any] | None = {"op": what, "ids": ids, "set": values, "check": check}
    ops: list[MutationOp] = []
    deletes: list[_DeleteRows] = []
    for chunk in _id_chunks(ids, max(1, CHUNK_PARAMETERS - bound - 2)):
        ops.append(_UpdateRows(catalog, table, values or {}, chunk, description))
        description = None
        versions = _bumped_versions(chunk) if check else None
        ops.append(_RowsAt(catalog, table, what, chunk, versions))
        if values is None:
            deletes.append(_DeleteRows(catalog, table, chunk))
    if deletes:
        # (The description rides on the first delete: the rows the entry names are gone.)
        first = ops[0]
        assert isinstance(first, _Chunk)
        deletes[0].description, deletes[0].in_outbox = first.description, True
        first.description, first.in_outbox = None, False
    return [*ops, *deletes]


def _bumped_versions(ids: Sequence[RowId | str]) -> int:
    """The sum of the rows' versions once each is bumped once (a checked
    target carries its version)."""
    return sum(getattr(target, "version", 0) + 1 for target in ids)


def queue_bulk(
    catalog: Catalog,
    table: TableInfo,
    where: Any,
    rows: Any,
    values: Any,
    check: Any,
) -> tuple[BulkWrite, list[MutationOp], RetrievalOp[object] | None]:
    """An ``update_many`` (``values``) or ``delete_many`` (None): its
    handle, its statements when its rows are known (``rows=``), or else a
    :class:`PendingBulk` and the read of its rows."""
    what = "delete_many" if values is None else "update_many"
    if type(check) is not bool:
        raise ValidationError(f"{what}: check must be a bool, got {brief(check)}")
    checked_values: dict[str, Any] | None = None
    if values is not None:
        _check_mapping(table, values, what)
        checked_values = dict(values)
        if not checked_values:
            raise ValidationError(f"{what} on {table.name!r} needs at least one column to set")
        _bind_values(table, checked_values, what, bind_nulls=False)
    write = BulkWrite(table)
    if rows is not None:
        if where is not None:
            raise ValidationError(f"{what} on {table.name!r} takes where= or rows=, not both")
        ids = _targets(table, rows, check)
        return write, bulk_ops(catalog, write, checked_values, ids, check), None
    if where is None or (isinstance(where, Mapping) and not where):
        raise ValidationError(
            f"{what} on {table.name!r} needs where= (a dict or an af.c condition; "
            "af.ALL for every row of the table) or rows="
        )
    condition = None if where is ALL else where_expr(where)
    read = write.read = _ReadTargets(table, condition)

    def build(ids: list[RowId | str]) -> list[MutationOp]:
        ops = bulk_ops(catalog, write, checked_values, ids, check)
        if check:
            match = _MatchCount(catalog, table, what, condition, len(ids))
            ops.insert(0, match)
        return ops

    return write, [PendingBulk(write, read, build)], read


def expand(ops: Sequence[MutationOp]) -> list[MutationOp]:
    """``ops`` with each :class:`PendingBulk` replaced by its statements,
    and their :class:`_MatchCount` checks first in the phase: a check that
    no other row matches ``where`` now must not count the rows the unit's
    own earlier writes made match (a row it created did not appear "since
    the retrieval"), or the unit would conflict with itself on every run."""
    checks: list[MutationOp] = []
    expanded: list[MutationOp] = []
    for op in ops:
        if isinstance(op, PendingBulk):
            for part in op.expand():
                (checks if isinstance(part, _MatchCount) else expanded).append(part)
        else:
            expanded.append(op)
    return [*checks, *expanded]
