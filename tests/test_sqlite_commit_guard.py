"""The guard that lets a cancelled caller interrupt SQLite's batch-and-COMMIT
hop before its COMMIT, and never during it."""

from __future__ import annotations

import sqlite3

import pytest

from aiofragno.backends.sqlite_connection import CommitGuard


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
