"""What one engine knows of the outbox's ticks (:mod:`.ticks`)."""

from __future__ import annotations

import math

from .. import runtime


class TickState:
    """One engine's account of its ticks: how many commits it has seen
    (units it committed, notifications of others'), how many of those a
    finished tick covers, and when it last ticked.

    A tick covers the commits seen before it began: they were acknowledged
    before its snapshot. A read while some are not covered waits for the
    lock and ticks, rather than taking the word of a tick in progress
    (which may have begun before them) or of the last one."""

    __slots__ = ("covered", "seen", "ticked_at")

    def __init__(self) -> None:
        self.seen = 0
        self.covered = 0
        self.ticked_at = -math.inf

    def commit_seen(self) -> None:
        """A unit has committed an entry (this engine's, or announced):
        the next read waits for a tick that covers it."""
        self.seen += 1

    @property
    def behind(self) -> bool:
        """Whether a commit seen is not covered by a finished tick."""
        return self.covered < self.seen

    def finished(self, began_after: int) -> None:
        """A tick that began after ``began_after`` commits has committed."""
        self.covered = max(self.covered, began_after)
        self.ticked_at = runtime.monotonic()
