"""Counters a Database keeps about its own work, readable as ``db.stats``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class Stats:
    """Running totals since the Database was opened (plain ints, no locking:
    every update happens on the event loop thread)."""

    units: int = 0
    """Units of work that completed (returned a value)."""
    attempts: int = 0
    """Runs of unit-of-work functions, retries included."""
    conflicts: int = 0
    """Mutation phases that conflicted (stale version, 40001, deadlock)."""
    lost_connection_retries: int = 0
    """Units re-run after losing their connection before COMMIT."""
    commits_resolved: int = 0
    """Ambiguous COMMITs resolved through the outbox."""
    reconnect_waits: int = 0
    """Times new work waited for an unreachable server."""
    session_resets: int = 0
    """Connections whose session was reset before reuse (raw SQL may have
    changed it, or left a transaction open)."""
    replica_reads: int = 0
    """Reads served by a read replica (``db.replica`` statements, and units
    run with ``reads="replica"``)."""
    replica_waits: int = 0
    """Of those, reads that first waited for the replica to replay this
    task's commits."""
    replica_fallbacks: int = 0
    """Replica reads that ran on the primary instead: no replica was up,
    within ``max_replica_lag``, or caught up with the task's commits within
    ``replica_wait``."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
