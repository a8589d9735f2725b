"""The guard that lets a cancelled caller interrupt SQLite's batch-and-COMMIT
hop before its COMMIT, and never during it."""

from __future__ import annotations

import sqlite3

import pytest

from aiofragno.backends.sqlite_gate import CommitGuard


def _open_transaction() -> sqlite3.Connection:
    raw = sqlite3.connect(":memory:", isolation_level=None)
    raw.execute("CREATE TABLE t (i integer)")
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("INSERT INTO t VALUES (1)")
    return raw


def test_an_interrupt_before_commit_stops_it() -> None:
    raw, interrupts = _open_transaction(), []
    guard = CommitGuard(lambda: interrupts.append(1))
    guard.interrupt()
    assert interrupts == [1]
    with pytest.raises(sqlite3.OperationalError, match="interrupted before COMMIT"):
        guard.commit(raw)
    assert raw.in_transaction  # left for the caller's side to roll back
    raw.execute("ROLLBACK")
    assert raw.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_an_interrupt_once_commit_started_is_ignored() -> None:
    raw, interrupts = _open_transaction(), []
    guard = CommitGuard(lambda: interrupts.append(1))
    guard.commit(raw)
    guard.interrupt()
    assert interrupts == []
    assert not raw.in_transaction
    assert raw.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_a_job_interrupted_before_it_started_does_not_start() -> None:
    """A job's guard (``started=False``): a caller gone while the job waited
    for the writer interrupts nothing there (the writer runs someone
    else's statements), and the job does not start."""
    interrupts: list[int] = []
    guard = CommitGuard(lambda: interrupts.append(1), started=False)
    guard.interrupt()
    assert interrupts == []
    assert not guard.start()


def test_a_finished_transaction_is_interrupted_no_more() -> None:
    interrupts: list[int] = []
    guard = CommitGuard(lambda: interrupts.append(1), started=False)
    assert guard.start()
    guard.finish()
    guard.interrupt()  # (late: the writer has gone on to the next job)
    assert interrupts == []
