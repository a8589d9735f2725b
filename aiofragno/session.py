"""A checked-out connection in use.

The Session is the one place where driver exceptions become aiofragno errors
and where we remember what happened to a connection (broken, interrupted, in a
transaction, its session changed by raw SQL), so that it is discarded or reset
— never returned dirty.
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from .driver import (
    CompiledQuery,
    Connection,
    IsolationLevel,
    QueryResult,
    StopWhen,
    stopped,
)
from .errors import CommitOutcomeUnknown, ConnectionLost, Error

logger = logging.getLogger("aiofragno")
T = TypeVar("T")


class Session:
    """One connection acquired from the pool for one logical caller: the
    client's side. (The server's side of a connection, its *server session*,
    is named by :attr:`Connection.server_session
    <aiofragno.driver.Connection.server_session>`; ending one that a broken
    connection left behind is :mod:`aiofragno.server_sessions`' job.)"""

    __slots__ = (
        "broken",
        "connection",
        "dirty",
        "in_transaction",
        "interrupted",
        "savepoints",
        "translate",
    )

    def __init__(
        self, connection: Connection, translate: Callable[[BaseException], Exception]
    ) -> None:
        self.connection = connection
        self.translate = translate
        self.broken = False  # lost: discard on release
        self.interrupted = False  # cancelled mid-operation: reset or discard
        self.in_transaction = False
        self.dirty = False  # raw SQL may have changed the session: reset it
        self.savepoints = 0

    def settle(self, exc: BaseException) -> BaseException:
        """What to raise for ``exc``, raised by an operation on this
        session's connection: the aiofragno error for a driver's exception
        (see :meth:`fail`); ``exc`` itself for a cancellation, with the
        session marked interrupted."""
        if isinstance(exc, Exception):
            return self.fail(exc)
        self.interrupted = True
        return exc

    def fail(self, exc: Exception) -> Exception:
        """The aiofragno error for driver exception ``exc``; notes a lost connection."""
        error = exc if isinstance(exc, Error) else self.translate(exc)
        if isinstance(error, ConnectionLost):
            self.broken = True
        return error

    async def execute(self, query: CompiledQuery) -> QueryResult:
        if logger.isEnabledFor(logging.DEBUG):
            log_statement(query)
        return await self._call(self.connection.execute_query(query))

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """:meth:`Connection.execute_batch <aiofragno.driver.Connection.execute_batch>`:
        ``queries`` in as few round trips as the driver allows, up to the first
        result for which ``stop(index, result)`` is true."""
        if logger.isEnabledFor(logging.DEBUG):
            for query in queries:
                log_statement(query)
        return await self._call(self.connection.execute_batch(queries, stop))

    async def begin(self, isolation: IsolationLevel | None) -> None:
        await self._call(self.connection.begin(isolation))
        self.in_transaction = True

    async def rollback(self) -> None:
        await self._call(self.connection.rollback())
        self.in_transaction = False

    async def commit(
        self, queries: Sequence[CompiledQuery] = (), stop: StopWhen | None = None
    ) -> list[QueryResult]:
        """COMMIT, after running ``queries`` in the same round trip where the
        driver can (:meth:`Connection.commit_batch
        <aiofragno.driver.Connection.commit_batch>`); their results. At a stop
        point (see :meth:`execute_batch`) the transaction stays open, for the
        caller to roll back. A lost connection raises :class:`CommitOutcomeUnknown`."""
        results: list[QueryResult] = []
        if queries:
            results = await self._committing(self.connection.commit_batch(queries, stop))
            if stopped(queries, results, stop):
                return results
        else:
            await self._committing(self.connection.commit())
        self.in_transaction = False
        return results

    async def execute_committing(self, query: CompiledQuery) -> QueryResult:
        """``query``, outside any transaction: it commits on its own, so a
        lost connection raises :class:`CommitOutcomeUnknown` as in :meth:`commit`."""
        if logger.isEnabledFor(logging.DEBUG):
            log_statement(query)
        return await self._committing(self.connection.execute_query(query))

    def _committing(self, operation: Awaitable[T]) -> Coroutine[Any, Any, T]:
        """``operation``, which commits: a connection lost on the way (open
        when it started) raises :class:`CommitOutcomeUnknown`."""
        return self._call(
            operation, functools.partial(self._commit_failed, not self.connection.is_closed)
        )

    def _commit_failed(self, was_open: bool, exc: Exception) -> Exception:
        error = self.fail(exc)
        if isinstance(exc, TimeoutError) and was_open:
            # The client stopped waiting (command_timeout), not the server:
            # the COMMIT may still be applied, and the connection is in an
            # unknown state.
            self.broken = True
            return CommitOutcomeUnknown(
                f"no reply to COMMIT within command_timeout, so the transaction may or may "
                f"not have been applied; check before re-running it ({error})",
                sqlstate=getattr(error, "sqlstate", None),
                code=getattr(error, "code", None),
                server_session=self.connection.server_session,
            )
        if isinstance(error, ConnectionLost) and was_open:
            return CommitOutcomeUnknown(
                f"the connection broke while COMMIT was in flight, so the transaction may "
                f"or may not have been applied; check before re-running it ({error})",
                sqlstate=error.sqlstate,
                code=error.code,
                server_session=self.connection.server_session,
            )
        return error

    async def _call(
        self, operation: Awaitable[T], fail: Callable[[Exception], Exception] | None = None
    ) -> T:
        """``operation``, its driver exception raised as the aiofragno error
        that ``fail`` (default: :meth:`fail`) makes of it; the session marked
        interrupted if it is cancelled."""
        try:
            return await operation
        except Exception as exc:
            error = (fail or self.fail)(exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException:
            self.interrupted = True
            raise


def log_statement(query: CompiledQuery) -> None:
    # Parameters stay out of logs (they may be personal data): their count only.
    logger.debug("%s  -- %d parameter(s)", query.sql, len(query.parameters))


# Where the names that moved out of this module now live.
_MOVED = {
    "Queries": "queries",
    "Transaction": "transaction",
    "TransactionContext": "transaction",
    "current_transaction": "transaction",
    "outside_transactions": "transaction",
}


def __getattr__(name: str) -> object:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"aiofragno.session.{name} moved to aiofragno.{module}.{name} "
        "(aiofragno.Transaction is the public name of the transaction)",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"aiofragno.{module}"), name)
