"""When the write gate's writer lets SQLite's write lock go between jobs.

Writers in other processes (and other Databases on the same file) wait for
the lock in SQLite's busy handler, which sleeps and tries again (after 1,
2, 5, ... 100 ms). Jobs run back to back on the writer leave the lock free
for a few microseconds between them, which such a writer almost never hits:
under a steady stream of units it would wait out its ``busy_timeout``. So:

- *Alone* (no other writer seen), the writer keeps the lock through a run
  of jobs, and every 10 to 30 ms of it (at random, so as not to fall in
  step with the busy handler) lets it go for a millisecond: about 5% of
  its time, which a writer that started waiting meanwhile hits within
  a second about half the time, within five (SQLite's default timeout)
  nine times in ten.
- Once it has seen another writer, it *shares* for a second (renewed each
  time it sees one): it lets the lock go for 2 ms after every 1 to 3 ms of
  jobs, so a waiting writer finds it free about half the time, and each
  of two busy processes gets about half of the writes.

Another writer is seen through ``PRAGMA data_version``, which changes when
another connection commits and not for the connection's own commits: in a
pause (the gate is held, so none of this Database's connections wrote), or
in the moment between two runs of jobs (at most 50 ms) in which none of
them did. A commit while the writer had nothing to do for longer says
nothing about anyone waiting. A process whose first
write comes while this one's writer runs jobs without end waits for a
1 ms pause, or past its ``busy_timeout`` (:class:`~aiofragno.LockTimeout`,
which a unit of work retries); from its first commit on both share.

Only the writer's thread uses an instance.
"""

from __future__ import annotations

import random
import sqlite3
import time

ALONE_EVERY = (0.01, 0.03)  # seconds of holding between pauses, alone
PROBE = 0.001  # seconds of a pause, alone
SHARED_EVERY = (0.001, 0.003)  # seconds of holding between pauses, sharing
SHARED_GAP = 0.002  # seconds of a pause, sharing
SHARE_FOR = 1.0  # seconds of sharing after another writer was last seen
BETWEEN_RUNS = 0.05  # a run that starts this soon after the last one ended
# continues it, as far as other writers can tell


def _data_version(raw: sqlite3.Connection) -> int:
    version: int = raw.execute("PRAGMA data_version").fetchone()[0]
    return version


class LockSharing:
    """The writer's pauses between jobs (see the module's docstring)."""

    def __init__(self) -> None:
        self._version: int | None = None  # the file's, as the writer last saw it
        self._shared_until = 0.0
        self._next_pause = 0.0
        self._ended = 0.0  # when the last run ended

    def run_starts(self, raw: sqlite3.Connection, others_wrote: bool) -> None:
        """Before a run of jobs. ``others_wrote``: this Database's own
        connections may have written since the last run (their commits
        look like another writer's)."""
        changed = self._look(raw)
        now = time.monotonic()
        if changed and not others_wrote and now - self._ended < BETWEEN_RUNS:
            self._shared_until = now + SHARE_FOR
        self._next_pause = now + self._hold(now)

    def run_ends(self) -> None:
        self._ended = time.monotonic()

    def between_jobs(self, raw: sqlite3.Connection) -> None:
        """After a job, another one waiting: let the lock go if it is time."""
        now = time.monotonic()
        if now < self._next_pause:
            return
        time.sleep(SHARED_GAP if now < self._shared_until else PROBE)
        now = time.monotonic()
        if self._look(raw):
            self._shared_until = now + SHARE_FOR
        self._next_pause = now + self._hold(now)

    def _look(self, raw: sqlite3.Connection) -> bool:
        """Whether another connection committed since the last look."""
        try:
            version = _data_version(raw)
        except sqlite3.Error:  # (then the next job's own statements fail and say why)
            return False
        changed = self._version is not None and version != self._version
        self._version = version
        return changed

    def _hold(self, now: float) -> float:
        """How long to hold the lock before the next pause (at random, so as
        not to fall in step with the busy handler's retries)."""
        return random.uniform(*(SHARED_EVERY if now < self._shared_until else ALONE_EVERY))
