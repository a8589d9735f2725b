"""Statement batches and deferred BEGIN on every backend and runtime.

``Session.execute_batch`` sends several statements in as few round trips as
the driver allows (one multi-statement text on MySQL, one thread hop on
SQLite, one bridge crossing under trio, one statement per round trip on
asyncpg), and ``begin`` may travel with the transaction's first statement.
Whatever the transport, the results, errors and transaction outcomes must be
the same everywhere.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiofragno as af
from aiofragno.driver import CompiledQuery, QueryResult
from aiofragno.session import Session
from tests.conformance.conftest import Tables

pytestmark = pytest.mark.anyio


@pytest.fixture
async def table(db: af.Database, tables: Tables) -> af.Identifier:
    name = tables.new("batch")
    await db.execute(
        af.sql(
            "CREATE TABLE {t} (k INTEGER PRIMARY KEY, v INTEGER NOT NULL, note VARCHAR(50))",
            t=name,
        )
    )
    await db.execute(af.sql("INSERT INTO {t} (k, v) VALUES (1, 10), (2, 20)", t=name))
    return name


@pytest.fixture
async def session(db: af.Database) -> AsyncIterator[Session]:
    session = await db._engine.acquire()
    try:
        yield session
    finally:
        await db._engine.release(session)


def q(db: af.Database, template: str, **values: Any) -> CompiledQuery:
    return db.compile(af.sql(template, **values))


async def rows(db: af.Database, table: af.Identifier) -> list[tuple[int, int]]:
    found = await db.fetch(af.sql("SELECT k, v FROM {t} ORDER BY k", t=table))
    return [(int(r["k"]), int(r["v"])) for r in found]


async def test_results_come_back_per_statement_in_order(
    db: af.Database, session: Session, table: af.Identifier
) -> None:
    results = await session.execute_batch(
        [
            q(db, "SELECT v FROM {t} WHERE k = {k}", t=table, k=2),
            q(db, "UPDATE {t} SET v = v + 1 WHERE k IN {ks}", t=table, ks=[1, 2]),
            q(
                db,
                "INSERT INTO {t} (k, v, note) VALUES ({k}, {v}, {n})",
                t=table,
                k=3,
                v=30,
                n="%s;",
            ),
            q(db, "UPDATE {t} SET v = 0 WHERE k = {k}", t=table, k=99),
            q(db, "SELECT k, v, note FROM {t} ORDER BY k", t=table),
        ]
    )
    assert [r.rows_affected for r in results] == [1, 2, 1, 0, 3]
    assert int(results[0].rows[0]["v"]) == 20
    assert [(int(r["k"]), int(r["v"]), r["note"]) for r in results[4].rows] == [
        (1, 11, None),
        (2, 21, None),
        (3, 30, "%s;"),  # placeholder-like text and a semicolon stay a value
    ]
    assert results[1].rows == [] and results[3].rows == []


async def test_stop_returns_results_up_to_the_stop_point(
    db: af.Database, session: Session, table: af.Identifier
) -> None:
    seen: list[int] = []

    def stop(index: int, result: QueryResult) -> bool:
        seen.append(index)
        return result.rows_affected == 0

    await session.begin(None)
    results = await session.execute_batch(
        [
            q(db, "UPDATE {t} SET v = 11 WHERE k = 1", t=table),
            q(db, "UPDATE {t} SET v = 0 WHERE k = 99", t=table),  # matches nothing: stop
            q(db, "UPDATE {t} SET v = 22 WHERE k = 2", t=table),
        ],
        stop,
    )
    assert [r.rows_affected for r in results] == [1, 0]
    assert seen == [0, 1]
    await session.rollback()
    assert await rows(db, table) == [(1, 10), (2, 20)]  # nothing of the batch stayed


async def test_a_failing_statement_raises_and_later_ones_do_not_run(
    db: af.Database, session: Session, table: af.Identifier
) -> None:
    with pytest.raises(af.UniqueViolation):
        await session.execute_batch(
            [
                q(db, "INSERT INTO {t} (k, v) VALUES (3, 30)", t=table),
                q(db, "INSERT INTO {t} (k, v) VALUES (1, 0)", t=table),  # duplicate key
                q(db, "INSERT INTO {t} (k, v) VALUES (4, 40)", t=table),
            ]
        )
    # Outside a transaction each statement autocommits: the first stayed.
    assert await rows(db, table) == [(1, 10), (2, 20), (3, 30)]
    assert [r.rows_affected for r in await session.execute_batch([q(db, "SELECT 1")])] == [1]


async def test_a_failing_statement_in_a_transaction_rolls_back_cleanly(
    db: af.Database, table: af.Identifier
) -> None:
    with pytest.raises(af.UniqueViolation):
        async with db.transaction() as tx:
            await tx.execute(af.sql("UPDATE {t} SET v = 0 WHERE k = 2", t=table))
            await tx.execute(af.sql("INSERT INTO {t} (k, v) VALUES (1, 0)", t=table))
    assert await rows(db, table) == [(1, 10), (2, 20)]


async def test_an_empty_transaction_commits_and_rolls_back(
    db: af.Database, table: af.Identifier
) -> None:
    async with db.transaction():
        pass
    with pytest.raises(RuntimeError):
        async with db.transaction():
            raise RuntimeError("before any statement")
    async with db.transaction(isolation="serializable") as tx:
        assert len(await tx.fetch(af.sql("SELECT k FROM {t}", t=table))) == 2
    assert await rows(db, table) == [(1, 10), (2, 20)]


async def test_deferred_begin_still_isolates(
    db: af.Database, table: af.Identifier, url: str, target: Any
) -> None:
    """The transaction starts at its first statement, not later: a write made
    inside it stays invisible to other connections until COMMIT, and is
    undone by ROLLBACK."""
    async with af.connect(url, backend=target.backend, pool_size=1) as other:
        async with db.transaction() as tx:
            await tx.execute(af.sql("UPDATE {t} SET v = 99 WHERE k = 1", t=table))
            outside = await other.fetch_value(af.sql("SELECT v FROM {t} WHERE k = 1", t=table))
            assert int(outside) == 10
        assert int(await other.fetch_value(af.sql("SELECT v FROM {t} WHERE k = 1", t=table))) == 99
        with pytest.raises(RuntimeError):
            async with db.transaction() as tx:
                await tx.execute(af.sql("UPDATE {t} SET v = 0 WHERE k = 2", t=table))
                raise RuntimeError("roll back")
    assert await rows(db, table) == [(1, 99), (2, 20)]


async def test_commit_with_statements(
    db: af.Database, session: Session, table: af.Identifier
) -> None:
    """``Session.commit(queries)`` runs the statements and commits them with
    the transaction (one round trip where the driver can)."""
    await session.begin(None)
    await session.execute(q(db, "UPDATE {t} SET v = 11 WHERE k = 1", t=table))
    results = await session.commit(
        [
            q(db, "INSERT INTO {t} (k, v) VALUES (3, 30)", t=table),
            q(db, "SELECT COUNT(*) AS n FROM {t}", t=table),
        ]
    )
    assert not session.in_transaction
    assert [r.rows_affected for r in results] == [1, 1]
    assert int(results[1].rows[0]["n"]) == 3
    assert await rows(db, table) == [(1, 11), (2, 20), (3, 30)]


async def test_a_failing_statement_keeps_the_commit_from_happening(
    db: af.Database, session: Session, table: af.Identifier
) -> None:
    await session.begin(None)
    await session.execute(q(db, "UPDATE {t} SET v = 0 WHERE k = 2", t=table))
    with pytest.raises(af.UniqueViolation):
        await session.commit([q(db, "INSERT INTO {t} (k, v) VALUES (1, 0)", t=table)])
    assert session.in_transaction
    await session.rollback()
    assert await rows(db, table) == [(1, 10), (2, 20)]
