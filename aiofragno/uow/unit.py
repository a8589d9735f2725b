"""The UnitOfWork handed to your function by ``db.execute_uow``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import EllipsisType
from typing import Any, Protocol, TypeVar, overload

from ..driver import CompiledQuery, QueryResult
from ..errors import ProgrammingError, ValidationError
from ..schema import RowId, Table, table_name
from .aggregates import Aggregate, AggregateFn
from .bulk import All, BulkWrite, create_rows, expand, queue_bulk
from .catalog import Catalog
from .combine_reads import combine_reads
from .expr import Expr
from .joins import JoinedFind, JoinedFindFirst, Joins, check_tree_row, join_reads
from .ops import Check, Count, Create, Delete, Find, FindFirst, MutationOp, RetrievalOp, Update
from .snapshot import Then
from .staged_reads import StagedReads
from .unique import UniqueConflicts, index_for_key, key_values, unique_index
from .upsert import CheckAbsent, Upsert, Upserted, checked_upsert, update_columns, upsert_ops

Where = Expr | Mapping[str, Any] | None
TableRef = str | Table[Any]
"""A table: its name, or its ``af.Table``."""
RowT = TypeVar("RowT")
R = TypeVar("R", bound=RetrievalOp[object])
J = TypeVar("J", JoinedFind, JoinedFindFirst)


class Reader(Protocol):
    """Runs a retrieve's statements, and those ``then`` makes of their
    results, in one snapshot (the executor's ``HeldConnection.read``)."""

    def __call__(
        self, queries: Sequence[CompiledQuery], then: Then | None = None, /
    ) -> Awaitable[list[QueryResult]]: ...


class UnitOfWork:
    """Queue reads, ``await retrieve()`` them, then queue writes.

    Reads run when you call :meth:`retrieve` (any number of times; each runs
    the reads queued since the last one, on one pooled connection, all of
    them from one snapshot of the database: see :mod:`.snapshot`). Writes are checked and compiled when queued, and run after
    your function returns — all in one transaction, the *mutation phase*.
    ``uow_id`` is the same across retries of the unit (its idempotency key).
    """

    def __init__(
        self,
        reader: Reader,
        catalog: Catalog,
        uow_id: str,
        *,
        dry_run: bool = False,
        on_query: Callable[[CompiledQuery], Any] | None = None,
    ) -> None:
        self._reader = reader
        self._catalog = catalog
        self.uow_id = uow_id
        self._dry_run = dry_run
        self._on_query = on_query
        self._reads: list[RetrievalOp[object]] = []
        self.mutations: list[MutationOp] = []
        # Unique indexes whose violations make this unit a conflict.
        self.unique_conflicts = UniqueConflicts(catalog)
        self._upserts: list[Upserted] = []
        self._pending_bulk = False  # a bulk write waits for its rows (settle_bulk)
        # The outbox entry's versionstamp once the mutation phase committed.
        self.versionstamp: str | None = None

    # -- retrieval ---------------------------------------------------------

    @overload
    def find(  # type: ignore[overload-overlap]
        self,
        table: Table[RowT],
        where: Where = None,
        order_by: Any = None,
        limit: int | None = None,
        after: str | None = None,
        *,
        select: None = None,
        join: None = None,
    ) -> Find[RowT]: ...

    @overload
    def find(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        limit: int | None = None,
        after: str | None = None,
        *,
        join: Joins,
        row: type[RowT],
    ) -> Find[RowT]: ...

    @overload
    def find(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        limit: int | None = None,
        after: str | None = None,
        *,
        select: Sequence[str] | None = None,
        join: Joins | None = None,
    ) -> Find[dict[str, Any]]: ...

    def find(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        limit: int | None = None,
        after: str | None = None,
        *,
        select: Sequence[str] | None = None,
        join: Joins | None = None,
        row: type[Any] | None = None,
    ) -> Find[Any]:
        """Rows of ``table`` (its name, or its ``af.Table``) matching
        ``where``, in ``order_by`` order (a column, ``(column, "asc"|"desc")``,
        or a list of those; ties broken by creation order). With ``limit``,
        ``result.cursor`` continues after the page. Order columns that may be
        NULL give no cursor. With ``select``, each row has only those columns
        and ``id`` (a RowId with its version), and only they are read and
        decoded. ``join``: name -> ``af.one(...)`` or ``af.many(...)``, set on
        each row (see :mod:`aiofragno.uow.joins`); not with ``select``, whose
        rows might lack the columns a join follows.

        Typed rows: given a table declared with ``row=``, the rows are of
        that type; with ``join``, ``row=`` names the TypedDict of the joined
        rows (checked against the tree; see :mod:`aiofragno.row_types`)."""
        info = self._catalog.table(table)
        if join is not None:
            _no_select_with_join(select)
            op = JoinedFind(self._catalog, info, where, order_by, limit, after, join)
            check_tree_row(self._catalog, info, join, row)
            return self._queue_tree(op)
        _no_row_without_join(row)
        return self._queue(Find(info, where, order_by, limit, after, select=select))

    @overload
    def find_first(  # type: ignore[overload-overlap]
        self,
        table: Table[RowT],
        where: Where = None,
        order_by: Any = None,
        *,
        select: None = None,
        join: None = None,
    ) -> FindFirst[RowT]: ...

    @overload
    def find_first(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        *,
        join: Joins,
        row: type[RowT],
    ) -> FindFirst[RowT]: ...

    @overload
    def find_first(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        *,
        select: Sequence[str] | None = None,
        join: Joins | None = None,
    ) -> FindFirst[dict[str, Any]]: ...

    def find_first(
        self,
        table: TableRef,
        where: Where = None,
        order_by: Any = None,
        *,
        select: Sequence[str] | None = None,
        join: Joins | None = None,
        row: type[Any] | None = None,
    ) -> FindFirst[Any]:
        """The first matching row, or None (``select``, ``join`` and ``row``
        as for :meth:`find`)."""
        info = self._catalog.table(table)
        if join is not None:
            _no_select_with_join(select)
            op = JoinedFindFirst(self._catalog, info, where, order_by, join)
            check_tree_row(self._catalog, info, join, row)
            return self._queue_tree(op)
        _no_row_without_join(row)
        return self._queue(FindFirst(info, where, order_by, select))

    def count(self, table: TableRef, where: Where = None) -> Count:
        """How many rows match ``where``."""
        return self._queue(Count(self._catalog.table(table), where))

    @overload
    def aggregate(
        self,
        table: TableRef,
        aggregates: Mapping[str, AggregateFn],
        where: Where = None,
        *,
        group_by: None = None,
    ) -> Aggregate[dict[str, Any]]: ...

    @overload
    def aggregate(
        self,
        table: TableRef,
        aggregates: Mapping[str, AggregateFn],
        where: Where = None,
        *,
        group_by: str | Sequence[str],
    ) -> Aggregate[list[dict[str, Any]]]: ...

    def aggregate(
        self,
        table: TableRef,
        aggregates: Mapping[str, AggregateFn],
        where: Where = None,
        *,
        group_by: str | Sequence[str] | None = None,
    ) -> Aggregate[Any]:
        """``aggregates`` (name -> ``af.fn.count()``, ``af.fn.sum(column)``,
        ``.avg``, ``.min``, ``.max``) over the rows matching ``where``: a dict
        of name -> value; with ``group_by`` (a column or a list), a list of
        such dicts, one per group, each also holding its group's values,
        ordered by them (None last). Exact types: see :mod:`.aggregates`."""
        catalog = self._catalog
        op: Aggregate[Any] = Aggregate(catalog, catalog.table(table), aggregates, where, group_by)
        return self._queue(op)

    async def retrieve(self) -> None:
        """Run the reads queued so far and fill their ``.result`` (no reads, no
        database call)."""
        reads, self._reads = self._reads, []
        if not reads:
            return
        queries = self._compile(reads)
        if self._dry_run:
            for op in reads:
                op.empty()
            return
        try:
            rows = await self._run(reads, queries)
        except ProgrammingError as exc:
            if not self._split_sums(reads, exc):
                raise
            # (Reads have no effects: running them again is safe.)
            rows = await self._run(reads, self._compile(reads))
        for op, values in zip(reads, rows, strict=True):
            op.accept(values)

    def _compile(self, reads: Sequence[RetrievalOp[object]]) -> list[CompiledQuery]:
        queries = [op.compile(self._catalog) for op in reads]
        self._check_sizes(reads, queries)
        if self._on_query is not None:
            for op, query in zip(reads, queries, strict=True):
                if not op.runs_after_parent:  # (its statements are told when made)
                    self._on_query(query)
        return queries

    async def _run(
        self, reads: Sequence[RetrievalOp[object]], queries: Sequence[CompiledQuery]
    ) -> list[list[Sequence[Any]]]:
        """Each read's rows: one statement where the reads combine, else a batch."""
        combined = combine_reads(self._catalog, reads, queries)
        if combined is not None:
            return combined.split((await self._reader([combined.query]))[0])
        if not any(op.runs_after_parent for op in reads):
            return [[row.raw for row in result.rows] for result in await self._reader(queries)]
        staged = StagedReads(reads, queries, self._on_query)
        return staged.rows(await self._reader(staged.first, staged.then))

    def _split_sums(self, reads: Sequence[RetrievalOp[object]], exc: ProgrammingError) -> bool:
        """Whether ``exc`` is SUM failing past 64 bits (where it fails: SQLite)
        and an aggregate among ``reads`` now sums its integers as two halves."""
        overflow = self._catalog.adapter.sql.int_sum_overflow
        if overflow is None or overflow not in str(exc):
            return False
        split = [op.split_sums(self._catalog) for op in reads if isinstance(op, Aggregate)]
        return any(split)

    def _check_sizes(
        self, reads: Sequence[RetrievalOp[object]], queries: Sequence[CompiledQuery]
    ) -> None:
        """Refuse a read binding more parameters than one statement can (a
        long ``in_`` list, say) before anything runs."""
        limit = self._catalog.adapter.capabilities.max_parameters
        for op, query in zip(reads, queries, strict=True):
            if len(query.parameters) > limit:
                raise ValidationError(
                    f"a {type(op).__name__} on {op.table.name!r} binds {len(query.parameters)} "
                    f"values, more than one statement takes on this database ({limit}): split "
                    "the in_() list into several reads"
                )

    # -- mutations ---------------------------------------------------------

    def create(self, table: TableRef, values: Mapping[str, Any]) -> RowId:
        """Insert a row; returns its new id (usable as a reference in this unit)."""
        op = Create(self._catalog, self._catalog.table(table), values)
        self.mutations.append(op)
        return op.target  # type: ignore[return-value]

    def update(
        self,
        table: TableRef,
        row_id: RowId | str,
        values: Mapping[str, Any],
        *,
        check: bool = False,
    ) -> None:
        """Set ``values`` on the row; bumps its version. With ``check=True`` the
        unit conflicts unless the row still has ``row_id.version``."""
        self.mutations.append(
            Update(self._catalog, self._catalog.table(table), row_id, values, check)
        )

    def delete(self, table: TableRef, row_id: RowId | str, *, check: bool = False) -> None:
        """Delete the row (``check=True``: only at ``row_id.version``)."""
        self.mutations.append(Delete(self._catalog, self._catalog.table(table), row_id, check))

    def create_many(self, table: TableRef, rows: Sequence[Mapping[str, Any]]) -> list[RowId]:
        """Insert ``rows`` (each checked like :meth:`create`) with multi-row
        INSERTs of bounded size; returns their new ids, in order."""
        ops, ids = create_rows(self._catalog, self._catalog.table(table), rows)
        self.mutations += ops
        return ids

    def update_many(
        self,
        table: TableRef,
        where: Where | All = None,
        values: Mapping[str, Any] | None = None,
        *,
        rows: Sequence[Any] | None = None,
        check: bool = False,
    ) -> BulkWrite:
        """Set ``values`` on every row matching ``where`` (``af.ALL``: every
        row) as the unit's retrieval reads them, or on ``rows`` (rows or ids
        read earlier); bumps each one's version. A row gone by the mutation
        phase makes the unit conflict. ``check=True``: also if one of them
        changed, or (``where``) another row now matches. See
        docs/units-of-work.md, "Bulk writes"."""
        if values is None:
            raise ValidationError(
                f"update_many on {table_name(table)!r} needs values= (the columns to set)"
            )
        return self._bulk(table, where, rows, values, check)

    def delete_many(
        self,
        table: TableRef,
        where: Where | All = None,
        *,
        rows: Sequence[Any] | None = None,
        check: bool = False,
    ) -> BulkWrite:
        """Delete every row matching ``where`` (``af.ALL``: every row) as the
        unit's retrieval reads them, or ``rows``; conflicts like
        :meth:`update_many`."""
        return self._bulk(table, where, rows, None, check)

    def _bulk(self, table: TableRef, where: Any, rows: Any, values: Any, check: Any) -> BulkWrite:
        write, ops, read = queue_bulk(
            self._catalog, self._catalog.table(table), where, rows, values, check
        )
        if read is not None:
            self._reads.append(read)
            self._pending_bulk = True
        self.mutations += ops
        return write

    async def settle_bulk(self) -> None:
        """Before the mutation phase: read the rows of the bulk writes by
        ``where`` if the unit has not, and queue their statements."""
        if self._pending_bulk:
            await self.retrieve()
            self.mutations = expand(self.mutations)
            self._pending_bulk = False

    def check(self, table: TableRef, row_id: RowId) -> None:
        """Conflict unless the row still exists at ``row_id.version``."""
        self.mutations.append(Check(self._catalog, self._catalog.table(table), row_id))

    def upsert(
        self,
        table: TableRef,
        values: Mapping[str, Any],
        *,
        on: str | Sequence[str],
        update: Sequence[str] | None = None,
        check: RowId | EllipsisType | None = ...,
    ) -> Upserted:
        """Create the row holding ``values``' key on unique index ``on`` (its
        name, or its columns), or update that row: set ``update`` (by
        default, the given columns not in the key) and bump its version.
        Once the unit has committed, ``.result`` is the row's id at its new
        version and ``.created`` which of the two happened; the outbox entry
        says it too (the mutation is a ``create`` or an ``update``).

        ``check`` makes it depend on what the unit read: ``None`` (no row
        held the key) conflicts if one does now; a row's ``RowId`` updates
        that row only at that version (else a conflict). See
        docs/units-of-work.md, Writes by unique key."""
        info = self._catalog.table(table)
        index = unique_index(info, on)
        create = Create(self._catalog, info, values)
        columns = update_columns(info, index, values, update)
        handle = Upserted(info)
        self._upserts.append(handle)
        if check is ...:
            op = Upsert(self._catalog, create, index, columns, handle)
            self.mutations += upsert_ops(self._catalog, op)
        else:
            if check is None:
                self.unique_conflicts.add(info, index)
            self.mutations += checked_upsert(self._catalog, create, index, columns, check, handle)
        return handle

    def check_absent(self, table: TableRef, where: Mapping[str, Any]) -> None:
        """Conflict unless no row holds the unique key ``where`` (a dict of
        the columns of one unique index) when the writes run. A unique
        violation of that index in this unit (a row with the key created
        concurrently) is then a conflict too."""
        info = self._catalog.table(table)
        index = index_for_key(info, where)
        key = key_values(info, index, where)
        self.mutations.append(CheckAbsent(self._catalog, info, index, key))
        self.unique_conflicts.add(info, index)

    def conflict_on_unique(self, table: TableRef, *indexes: str) -> None:
        """Count a violation of these unique indexes of ``table`` in this
        unit as a conflict — the unit runs again under the retry policy, and
        can then read the row that got there first — instead of raising
        :class:`~aiofragno.UniqueViolation`."""
        info = self._catalog.table(table)
        if not indexes:
            raise ValidationError("conflict_on_unique needs at least one index name")
        for name in indexes:
            self.unique_conflicts.add(info, unique_index(info, name))

    def committed(self) -> None:
        """The mutation phase committed: the upserts' results are final."""
        for handle in self._upserts:
            handle.committed = True

    def _queue(self, op: R) -> R:
        self._reads.append(op)
        return op

    def _queue_tree(self, op: J) -> J:
        """Queue a find with joins after the reads of its joins, whose rows
        its own accept() puts together."""
        self._reads.extend(join_reads(op))
        return self._queue(op)


def _no_row_without_join(row: type[Any] | None) -> None:
    if row is not None:
        raise ValidationError(
            "row= names the row type of a find with join=; without joins, declare the "
            "table with af.Table(..., row=...) and pass the table object"
        )


def _no_select_with_join(select: Sequence[str] | None) -> None:
    if select is not None:
        raise ValidationError(
            "a find with join= reads whole rows: leave out select= (a join follows "
            "columns that select= could leave out)"
        )
