"""The query methods (``fetch``, ``fetch_one``, ``fetch_value``,
``execute``) shared by the Database, its engine and transactions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, overload

from .driver import QueryResult, Row
from .errors import UnexpectedType
from .sql import Fragment
from .streaming import DEFAULT_BATCH_SIZE, Stream, check_batch_size

T = TypeVar("T")
# What a query method returns, read off the statement's result.
Read = Callable[[QueryResult], T]


def whole_result(result: QueryResult) -> QueryResult:
    return result


def all_rows(result: QueryResult) -> list[Row]:
    return result.rows


def first_row(result: QueryResult) -> Row | None:
    rows = result.rows
    return rows[0] if rows else None


class Queries(ABC):
    """``fetch`` / ``fetch_one`` / ``fetch_value`` / ``execute`` over one
    ``_run``; shared by :class:`~aiofragno.Database`, its engine and :class:`Transaction`.
    Each takes an ``af.sql(...)`` fragment, never a str: values stay bound
    parameters (anything else is a :class:`ValidationError` before any SQL is sent).

    (``execute``, ``fetch`` and ``fetch_one`` return ``_run``'s coroutine
    itself, which reads what they return off the result: no coroutine of
    their own per statement.)"""

    @abstractmethod
    def _run(self, query: Fragment, read: Read[T]) -> Coroutine[Any, Any, T]:
        """Run one ``af.sql`` query where this object runs queries; ``read(result)``."""

    @abstractmethod
    def _stream(self, query: Fragment, batch_size: int) -> Stream:
        """A stream of ``query``'s rows where this object runs queries."""

    def stream(self, query: Fragment, *, batch_size: int = DEFAULT_BATCH_SIZE) -> Stream:
        """``async with db.stream(query) as rows: async for row in rows: ...`` —
        the rows of ``query`` (an ``af.sql`` fragment) read ``batch_size`` at a
        time, so that memory holds one batch however many there are. The
        block holds one connection until it is left (by the end of the
        rows, ``break``, an exception or a cancellation), which gives it back
        usable or discards it. See :mod:`aiofragno.streaming`."""
        return self._stream(query, check_batch_size(batch_size))

    def execute(self, query: Fragment) -> Coroutine[Any, Any, QueryResult]:
        """Run ``query`` (an ``af.sql`` fragment) and return its
        :class:`QueryResult` (rows, ``rows_affected``, ``insert_id``)."""
        return self._run(query, whole_result)

    def fetch(self, query: Fragment) -> Coroutine[Any, Any, list[Row]]:
        """All rows of ``query``."""
        return self._run(query, all_rows)

    def fetch_one(self, query: Fragment) -> Coroutine[Any, Any, Row | None]:
        """The first row of ``query``, or None. (All rows are read; add
        ``LIMIT 1`` to a query that could return many.)"""
        return self._run(query, first_row)

    @overload
    async def fetch_value(self, query: Fragment) -> object: ...

    @overload
    async def fetch_value(self, query: Fragment, kind: type[T]) -> T: ...

    async def fetch_value(self, query: Fragment, kind: type[object] | None = None) -> object:
        """The first column of the first row, or None when there is no row.
        With ``kind`` (``fetch_value(query, int)``), the value must be an
        instance of it, and is typed so: None (NULL, or no row) or a value
        of another type is an :class:`UnexpectedType`."""
        row = await self.fetch_one(query)
        value = None if row is None else next(iter(row.values()))
        if kind is None or isinstance(value, kind):
            return value
        raise _unexpected_type(value, kind, no_row=row is None)


def _unexpected_type(value: object, kind: type[object], *, no_row: bool) -> UnexpectedType:
    # The value's type only: the value itself may be personal data.
    got = "no row" if no_row else "NULL" if value is None else f"a {type(value).__name__}"
    return UnexpectedType(
        f"fetch_value(query, {kind.__name__}) got {got}; make the query return a "
        f"{kind.__name__} (COALESCE a NULL, CAST a value), or call fetch_value(query) "
        "without a type to take whatever it returns, None included"
    )
