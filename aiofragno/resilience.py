"""Riding out dropped connections and server restarts — only where that is
provably safe.

* Taking a connection from the pool never sent anything, so while the server
  is unreachable it is retried with backoff until ``reconnect_deadline``, then
  :class:`~aiofragno.errors.DatabaseUnavailable` is raised.
* A read (a SELECT outside a transaction, a retrieval phase) that loses its
  connection is run again on a fresh one: reads have no effects to repeat.
* Anything else that loses its connection raises
  :class:`~aiofragno.errors.ConnectionLost`; the unit-of-work executor decides
  separately whether a whole unit can be re-run (see
  :mod:`aiofragno.uow.executor`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from typing import TypeVar

from . import runtime
from .errors import CommitOutcomeUnknown, ConnectionLost, DatabaseUnavailable

T = TypeVar("T")

INITIAL_DELAY = 0.05
MAX_DELAY = 1.0
# The longest wait between reconnection attempts to a URL of several
# servers: a standby is being promoted, and each attempt asks every server
# once, so the first connection to the new primary comes soon after.
FAILOVER_MAX_DELAY = 0.25


class Deadline:
    """Backoff between attempts, until ``seconds`` have passed since the first
    failure (None: try once).

    One operation has one deadline, however many layers retry inside it:
    :func:`shared_deadline` makes the outermost one current, and inner layers
    (the read retry, the pool checkout) wait on that same budget."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.started: float | None = None
        self.delay = INITIAL_DELAY
        self.failures = 0
        # The longest sleep: lowered (FAILOVER_MAX_DELAY) by a layer that
        # knows the database fails over.
        self.max_delay = MAX_DELAY

    async def wait(self) -> bool:
        """Sleep before the next attempt; False when the deadline has passed."""
        now = runtime.monotonic()
        if self.started is None:
            self.started = now
        self.failures += 1
        delay = min(self.delay, self.max_delay)
        if self.seconds is None or now - self.started + delay > self.seconds:
            return False
        await runtime.sleep(delay)
        self.delay = min(MAX_DELAY, self.delay * 2)
        return True


def is_retryable_loss(exc: BaseException) -> bool:
    """A lost connection whose work certainly did not take effect."""
    return isinstance(exc, ConnectionLost | DatabaseUnavailable) and not isinstance(
        exc, CommitOutcomeUnknown
    )


_current: ContextVar[Deadline | None] = ContextVar("aiofragno_deadline", default=None)


class shared_deadline:
    """The deadline of the current operation: the one already running in this
    context, or a new one that inner retries share for the ``with`` block.

    (A class rather than a generator context manager: it is entered several
    times per unit of work, and this is the cheaper of the two.)"""

    __slots__ = ("_seconds", "_token")

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._token: Token[Deadline | None] | None = None

    def __enter__(self) -> Deadline:
        deadline = _current.get()
        if deadline is not None:
            return deadline
        deadline = Deadline(self._seconds)
        self._token = _current.set(deadline)
        return deadline

    def __exit__(self, *exc_info: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None


async def retry_read(deadline_seconds: float | None, read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, again on a fresh connection after a lost one, until the deadline."""
    with shared_deadline(deadline_seconds) as deadline:
        while True:
            try:
                return await read()
            except (ConnectionLost, DatabaseUnavailable) as exc:
                if not is_retryable_loss(exc) or not await deadline.wait():
                    raise


async def retry_read_after(
    failure: BaseException, deadline_seconds: float | None, read: Callable[[], Awaitable[T]]
) -> T:
    """:func:`retry_read` for a read whose first attempt, made outside it
    (the usual read needs no deadline), lost its connection with ``failure``:
    ``read()`` after the first backoff, then as :func:`retry_read` does.
    ``failure`` is raised when the deadline allows no retry."""
    with shared_deadline(deadline_seconds) as deadline:
        if not await deadline.wait():
            raise failure
        return await retry_read(deadline_seconds, read)
