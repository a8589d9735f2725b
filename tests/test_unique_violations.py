"""Which unique index a violation names, from each database's message
(``SqlSnippets.unique_violation``): what ``uow.conflict_on_unique`` and
``uow.check_absent`` decide by."""

from __future__ import annotations

import pytest

from aiofragno.dialects import mysql, postgresql, sqlite
from aiofragno.uow.unique import violated

PG = postgresql.ADAPTER.sql.unique_violation
MY = mysql.ADAPTER.sql.unique_violation


def _sqlite_pattern() -> str:
    return sqlite._BASE.sql.unique_violation


@pytest.mark.parametrize(
    ("pattern", "message", "index"),
    [
        (
            PG,
            'duplicate key value violates unique constraint "ix_counters__by_name"',
            "ix_counters__by_name",
        ),
        (
            MY,
            "Duplicate entry 'a' for key 'ix_counters_ns__by_name' [code 1062]",
            "ix_counters_ns__by_name",
        ),
        # MySQL 8 names the table too.
        (
            MY,
            "Duplicate entry 'a' for key 'counters_ns.ix_counters_ns__by_name' [code 1062]",
            "ix_counters_ns__by_name",
        ),
        # A value that looks like another key's clause does not hide the real one.
        (MY, "Duplicate entry 'x' for key 'ix_b' [' for key 'ix_a' [code 1062]", "ix_a"),
    ],
)
def test_the_index_a_violation_names(pattern: str, message: str, index: str) -> None:
    found = violated(pattern, message)
    assert found is not None and found["index"] == index


def test_sqlite_names_the_columns() -> None:
    found = violated(_sqlite_pattern(), "UNIQUE constraint failed: t_ns.a, t_ns.b [code 2067]")
    assert found is not None and found["columns"] == "t_ns.a, t_ns.b"
    assert violated(_sqlite_pattern(), "NOT NULL constraint failed: t.a") is None
