"""Waking outbox readers when an entry commits, instead of after their poll
interval.

Where the dialect has a wake-up (:attr:`SqlSnippets.outbox_wake
<aiofragno.driver.SqlSnippets.outbox_wake>`: PostgreSQL's ``pg_notify``,
sent in the transaction that writes an entry and delivered at its COMMIT),
a :class:`CommitWaiter` listens for it on a connection of its own, opened
when its reader first has to wait. A notification only shortens the wait:

* **nothing is missed**: after every wait, woken or not, the reader reads
  again from its cursor — the notification carries nothing, and a reader
  never relies on having received one;
* **polling stays the fallback**: a wait never lasts longer than the poll
  interval; while the listening connection is down (lost, or the server
  unreachable) the reader polls, and tries to listen again at most once a
  :data:`RELISTEN_DELAY`;
* **after (re)connecting, the reader reads at once**: what committed while
  nobody listened was announced to nobody.

Elsewhere (MySQL, SQLite) the waiter just sleeps the poll interval.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import runtime
from ..driver import CompiledQuery, Connection, DialectAdapter

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("aiofragno")

# The least time between two attempts to listen again.
RELISTEN_DELAY = 1.0


def wake_statement(adapter: DialectAdapter) -> CompiledQuery | None:
    """A statement that wakes the outbox's waiting readers once the
    transaction it runs in commits (for a writer that does not go through
    :class:`~aiofragno.outbox.writer.OutboxStatements`, which wakes them
    itself); None where readers poll."""
    wake = adapter.sql.outbox_wake
    return None if wake is None else CompiledQuery(f"SELECT {wake}", ())


class CommitWaiter:
    """What one outbox reader waits on between reads: the next commit of an
    entry, or the poll interval (see the module docstring). Close it with
    :meth:`aclose`."""

    def __init__(self, db: Engine) -> None:
        self._db = db
        self._channel = db.adapter.sql.outbox_channel
        self._listener: Connection | None = None
        self._woken = runtime.Event()
        self._next_try = 0.0

    async def wait(self, poll_interval: float) -> None:
        """Return on the next notification (or one that came since the last
        wait returned), a lost listening connection, or after
        ``poll_interval`` seconds — at once if listening has just begun
        (again). While it cannot listen, it tries again every
        :data:`RELISTEN_DELAY` within the interval."""
        end = runtime.monotonic() + poll_interval
        while self._channel is not None and (self._listener is None or self._listener.is_closed):
            if await self._listen(end - runtime.monotonic()):
                return
            pause = self._next_try - runtime.monotonic()
            if self._next_try >= end or pause <= 0:
                break
            await runtime.sleep(pause)
        with runtime.move_on_after(end - runtime.monotonic()):
            await self._woken.wait()
        if self._woken.is_set():
            # An entry has committed: under ticks the read must tick (waiting
            # for a tick in progress) to see it, however recent the last tick.
            self._db.outbox_ticks.commit_seen()
        # (Before the caller reads again: a notification from now on wakes the next wait.)
        self._woken = runtime.Event()

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await self._db.close_listener(listener)

    async def _listen(self, within: float) -> bool:
        """Try to (re)open the listening connection (for at most ``within``
        seconds); whether it is listening now."""
        await self.aclose()
        now = runtime.monotonic()
        if now < self._next_try or self._channel is None or within <= 0:
            return False
        self._next_try = now + RELISTEN_DELAY
        try:
            with runtime.move_on_after(within) as scope:
                self._listener = await self._db.open_listener(self._channel, self._wake)
        except Exception as exc:
            logger.debug("outbox reader polls: cannot listen for commits (%r)", exc)
            return False
        if self._listener is None and not scope.cancelled_caught:
            self._channel = None  # this backend cannot listen: poll from now on
        return self._listener is not None

    def _wake(self) -> None:
        self._woken.set()
