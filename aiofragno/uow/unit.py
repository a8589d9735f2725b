"""The UnitOfWork handed to your function by ``db.execute_uow``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..driver import CompiledQuery, QueryResult
from ..errors import ValidationError
from ..schema import RowId
from .bulk import All, BulkWrite, create_rows, expand, queue_bulk
from .catalog import Catalog
from .combine_reads import combine_reads, split_reads
from .expr import Expr
from .ops import Check, Count, Create, Delete, Find, FindFirst, MutationOp, RetrievalOp, Update

Where = Expr | Mapping[str, Any] | None
R = TypeVar("R", bound=RetrievalOp[object])
Reader = Callable[[Sequence[CompiledQuery]], Awaitable[list[QueryResult]]]


class UnitOfWork:
    """Queue reads, ``await retrieve()`` them, then queue writes.

    Reads run when you call :meth:`retrieve` (any number of times; each runs
    the reads queued since the last one, on one pooled connection, outside any
    transaction). Writes are checked and compiled when queued, and run after
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
        self._pending_bulk = False  # a bulk write waits for its rows (settle_bulk)
        # The outbox entry's versionstamp once the mutation phase committed.
        self.versionstamp: str | None = None

    # -- retrieval ---------------------------------------------------------

    def find(
        self,
        table: str,
        where: Where = None,
        order_by: Any = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> Find:
        """Rows of ``table`` matching ``where``, in ``order_by`` order (a column,
        ``(column, "asc"|"desc")``, or a list of those; ties broken by creation
        order). With ``limit``, ``result.cursor`` continues after the page. Order
        columns that may be NULL give no cursor."""
        return self._queue(Find(self._catalog.table(table), where, order_by, limit, after))

    def find_first(self, table: str, where: Where = None, order_by: Any = None) -> FindFirst:
        """The first matching row, or None."""
        return self._queue(FindFirst(self._catalog.table(table), where, order_by))

    def count(self, table: str, where: Where = None) -> Count:
        """How many rows match ``where``."""
        return self._queue(Count(self._catalog.table(table), where))

    async def retrieve(self) -> None:
        """Run the reads queued so far and fill their ``.result`` (no reads, no
        database call)."""
        reads, self._reads = self._reads, []
        if not reads:
            return
        queries = [op.compile(self._catalog) for op in reads]
        if self._on_query is not None:
            for query in queries:
                self._on_query(query)
        if self._dry_run:
            for op in reads:
                op.empty()
            return
        combined = combine_reads(self._catalog, reads, queries)
        if combined is None:
            rows = [[row.raw for row in result.rows] for result in await self._reader(queries)]
        else:
            rows = split_reads(reads, (await self._reader([combined]))[0])
        for op, values in zip(reads, rows, strict=True):
            op.accept(values)

    # -- mutations ---------------------------------------------------------

    def create(self, table: str, values: Mapping[str, Any]) -> RowId:
        """Insert a row; returns its new id (usable as a reference in this unit)."""
        op = Create(self._catalog, self._catalog.table(table), values)
        self.mutations.append(op)
        return op.target  # type: ignore[return-value]

    def update(
        self, table: str, row_id: RowId | str, values: Mapping[str, Any], *, check: bool = False
    ) -> None:
        """Set ``values`` on the row; bumps its version. With ``check=True`` the
        unit conflicts unless the row still has ``row_id.version``."""
        self.mutations.append(
            Update(self._catalog, self._catalog.table(table), row_id, values, check)
        )

    def delete(self, table: str, row_id: RowId | str, *, check: bool = False) -> None:
        """Delete the row (``check=True``: only at ``row_id.version``)."""
        self.mutations.append(Delete(self._catalog, self._catalog.table(table), row_id, check))

    def create_many(self, table: str, rows: Sequence[Mapping[str, Any]]) -> list[RowId]:
        """Insert ``rows`` (each checked like :meth:`create`) with multi-row
        INSERTs of bounded size; returns their new ids, in order."""
        ops, ids = create_rows(self._catalog, self._catalog.table(table), rows)
        self.mutations += ops
        return ids

    def update_many(
        self,
        table: str,
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
            raise ValidationError(f"update_many on {table!r} needs values= (the columns to set)")
        return self._bulk(table, where, rows, values, check)

    def delete_many(
        self,
        table: str,
        where: Where | All = None,
        *,
        rows: Sequence[Any] | None = None,
        check: bool = False,
    ) -> BulkWrite:
        """Delete every row matching ``where`` (``af.ALL``: every row) as the
        unit's retrieval reads them, or ``rows``; conflicts like
        :meth:`update_many`."""
        return self._bulk(table, where, rows, None, check)

    def _bulk(self, table: str, where: Any, rows: Any, values: Any, check: Any) -> BulkWrite:
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

    def check(self, table: str, row_id: RowId) -> None:
        """Conflict unless the row still exists at ``row_id.version``."""
        self.mutations.append(Check(self._catalog, self._catalog.table(table), row_id))

    def _queue(self, op: R) -> R:
        self._reads.append(op)
        return op
