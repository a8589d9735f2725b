"""Ending the server session behind a connection that broke.

A broken connection does not end its server session at once. With a COMMIT
in flight, the server may not have read it yet (it can sit in a socket
buffer or a proxy), or may still be waiting on a row lock to run the
statements sent with it — and then commit after the client has given up.
What that transaction did is only final once its session has ended, so
whoever looks for it ends the session first: find it by the name it got at
connect (:attr:`Connection.server_session <aiofragno.driver.Connection.server_session>`),
ask the server to end it, and wait until it is gone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import runtime
from .errors import ConnectionLost, DatabaseError, SessionStillRunning
from .resilience import retry_read
from .sql import sql

if TYPE_CHECKING:
    from .engine import Engine

logger = logging.getLogger("aiofragno")

# How often to look whether the session has gone, once asked to end.
POLL_INTERVAL = 0.01


async def end_server_session_reconnecting(
    db: Engine, server_session: str | None, give_up_after: float = 30.0
) -> None:
    """:func:`end_server_session`, run again on a fresh connection after its own
    was lost, until ``reconnect_deadline`` (the look-up has no effects)."""
    await retry_read(
        db.options.reconnect_deadline, lambda: end_server_session(db, server_session, give_up_after)
    )


async def end_server_session(db: Engine, server_session: str | None, give_up_after: float) -> None:
    """Return once ``server_session`` no longer runs on ``db``'s server,
    having asked the server to end it. Returns at once for None, or on a
    database without server sessions (SQLite). Raises
    :class:`~aiofragno.errors.SessionStillRunning` if it still runs ``give_up_after``
    seconds after it was asked to end (the server refused to end it and it has not ended
    by itself), :class:`~aiofragno.errors.ConnectionLost` if this look-up's
    own connection breaks (try again: it has no effects to repeat)."""
    find = db.adapter.sql.session_process
    end = db.adapter.sql.end_process
    if server_session is None or find is None or end is None:
        return
    running = sql(find, session=server_session)
    asked: set[int] = set()
    give_up = runtime.monotonic() + give_up_after
    while (row := await db.fetch_one(running)) is not None:
        process = int(row["process"])
        if process not in asked:
            asked.add(process)
            await _ask_to_end(db, end, process)
        if runtime.monotonic() > give_up:
            raise SessionStillRunning(
                f"server session {server_session} (process {process}) still runs {give_up_after}s "
                f"after it was asked to end; end it by hand, then look again"
            )
        await runtime.sleep(POLL_INTERVAL)


async def _ask_to_end(db: Engine, end: str, process: int) -> None:
    try:
        await db.execute(sql(end, process=process))
    except ConnectionLost:
        raise
    except DatabaseError as exc:
        # E.g. another role's session: it ends by itself when its statement
        # does (the server notices the closed socket), so keep waiting.
        logger.warning("could not end server process %s (%s); waiting for it to end", process, exc)
