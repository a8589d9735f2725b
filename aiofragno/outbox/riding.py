"""How a consumer rides out lost connections.

Every step of a consumer's cycle is safe to run again after its connection
broke, whatever the server did with it: reads have no effects; claiming or
renewing the lease sets it to what it would be anyway; a cursor advance is
guarded so that it only ever moves the cursor forward, and a delivery whose
COMMIT was lost is settled by the cursor row (see
:mod:`aiofragno.outbox.lease`). So :func:`ride_out` runs a step again on a
fresh connection, with backoff, until ``reconnect_deadline`` — one budget per
step, shared by every retry inside it — and then raises
:class:`~aiofragno.errors.DatabaseUnavailable`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from ..errors import ConnectionLost, DatabaseUnavailable
from ..resilience import shared_deadline
from ..server_sessions import end_server_session_reconnecting

if TYPE_CHECKING:
    from ..engine import Engine
    from ..session import Session
    from ..transaction import Transaction

T = TypeVar("T")
LOSSES = (ConnectionLost, DatabaseUnavailable)


async def ride_out(db: Engine, what: str, step: Callable[[], Awaitable[T]]) -> T:
    """``step()``, again after each lost connection until the deadline;
    then :class:`DatabaseUnavailable` naming ``what`` stopped."""
    with shared_deadline(db.options.reconnect_deadline) as deadline:
        while True:
            try:
                return await step()
            except LOSSES as exc:
                if not await deadline.wait():
                    raise unavailable(db, what, exc) from exc


def unavailable(db: Engine, what: str, exc: Exception) -> DatabaseUnavailable:
    """The error a consumer stops with once the database stayed out of reach."""
    return DatabaseUnavailable(
        f"{what} stopped: the database could not be reached again within "
        f"reconnect_deadline={db.options.reconnect_deadline}s ({exc}); what it delivered "
        "is recorded by its cursor, so run it again once the database is back"
    )


class Attempt:
    """One transaction of a consumer's cycle. After it failed, :meth:`lost`
    tells a lost connection from any other error (a handler's own), and
    :meth:`end_lost_session` ends the server session behind a lost one: after
    that, nothing of the transaction can still commit, or hold a lock."""

    __slots__ = ("db", "session")

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.session: Session | None = None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        async with self.db.transaction() as tx:
            self.session = tx.session
            yield tx

    def lost(self, exc: BaseException) -> bool:
        if self.session is None:  # no connection, or BEGIN failed
            return isinstance(exc, LOSSES)
        return self.session.broken

    async def end_lost_session(self) -> None:
        """Safe to call again (a session that has ended is not looked for twice)."""
        if self.session is not None and self.session.broken:
            await end_server_session_reconnecting(self.db, self.session.connection.server_session)
