"""Streaming a statement's rows (``db.stream`` / ``tx.stream``) on every
backend and runtime: the same rows as ``fetch``, in bounded memory, and a
connection that comes back usable (or is discarded) however the block is
left — a break, an error part-way, a cancellation."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import aiofragno as af
from tests.conformance.conftest import Tables, Target
from tests.conformance.test_raw_sql import SLOW_QUERY, make_table
from tests.conformance.uow_env import Env

pytestmark = pytest.mark.anyio

_DIGITS = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"

# The integers 1..{n} as column x, per dialect (MySQL's recursive CTEs stop
# at 1000 levels by default: a cross join of as many digits as n needs).
SERIES = {
    "postgresql": "SELECT x FROM generate_series(1, {n}) AS x",
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) "
    "SELECT x FROM c",
}


def _mysql_series(n: int) -> str:
    places = range(len(str(max(n - 1, 1))))
    number = " + ".join(f"{10**p} * d{p}.d" for p in places)
    digits = ", ".join(f"{_DIGITS} AS d{p}" for p in places)
    return f"SELECT x FROM (SELECT 1 + {number} AS x FROM {digits}) AS s WHERE x <= {{n}}"


# Fails at the row where x = {k} (rows in no particular order): division by zero (PostgreSQL), integer overflow (SQLite),
# a scalar subquery of two rows (MySQL, which divides by zero into NULL).
FAILS_AT = {
    "postgresql": "SELECT x, 1 / (x - {k}) AS y FROM ({series}) AS s",
    "sqlite": "SELECT x, abs(CASE WHEN x = {k} THEN -9223372036854775807 - 1 ELSE x END) AS y "
    "FROM ({series}) AS s",
    "mysql": "SELECT x, (SELECT 1 FROM (SELECT 1 AS o UNION ALL SELECT 2) AS two "
    "WHERE x = {k}) AS y FROM ({series}) AS s",
}


def series(db: af.Database, n: int) -> af.Fragment:
    return af.sql(_mysql_series(n) if db.name == "mysql" else SERIES[db.name], n=n)


def numbered(db: af.Database, n: int, prefix: str = "row-") -> af.Fragment:
    """Rows x = 1..n in order, with a text (``prefix`` and x) and a NULL column."""
    return af.sql(
        "SELECT x, {p} || x AS label, NULL AS absent FROM ({s}) AS s ORDER BY x"
        if db.name != "mysql"
        else "SELECT x, CONCAT({p}, x) AS label, NULL AS absent FROM ({s}) AS s ORDER BY x",
        p=prefix,
        s=series(db, n),
    )


@pytest.fixture
async def db1(url: str, target: Target) -> AsyncIterator[af.Database]:
    """A Database whose pool holds one connection: a connection a stream
    left broken would be the next query's."""
    async with af.connect(url, backend=target.backend, pool_size=1) as database:
        yield database


def pool_in_use(db: af.Database) -> int:
    return int(db._engine._driver.pool.stats.in_use)  # type: ignore[attr-defined]


async def test_streamed_rows_are_fetchs_rows_in_order(db: af.Database) -> None:
    query = numbered(db, 2503)
    expected = [tuple(row.values()) for row in await db.fetch(query)]
    async with db.stream(query, batch_size=100) as rows:
        assert pool_in_use(db) == 1  # (held from the block's start to its end)
        got = [tuple(row.values()) async for row in rows]
    assert got == expected and len(got) == 2503
    assert got[0] == (1, "row-1", None)
    # A batch at a time: full batches, then the rest, then [].
    async with db.stream(query, batch_size=1000) as rows:
        first = await rows.__anext__()
        sizes = [len(await rows.next_batch())]  # (the first batch's other rows)
        while batch := await rows.next_batch():
            sizes.append(len(batch))
        assert await rows.next_batch() == []
    assert first["x"] == 1 and sizes == [999, 1000, 503]
    with pytest.raises(af.ProgrammingError, match="async with"):
        await rows.next_batch()
    async with db.stream(af.sql("SELECT x FROM ({s}) AS s WHERE x < 0", s=series(db, 3))) as rows:
        assert [row async for row in rows] == []
    assert pool_in_use(db) == 0


async def test_stream_arguments_are_checked_before_anything_is_sent(db: af.Database) -> None:
    with pytest.raises(af.ValidationError, match="batch_size"):
        db.stream(af.sql("SELECT 1"), batch_size=0)
    with pytest.raises(af.ValidationError, match=r"af\.sql"):
        db.stream("SELECT 1")  # type: ignore[arg-type]
    assert pool_in_use(db) == 0


async def test_a_break_gives_the_connection_back_usable(db1: af.Database) -> None:
    for _ in range(3):
        async with db1.stream(numbered(db1, 5000), batch_size=50) as rows:
            async for row in rows:
                if row["x"] == 75:  # part-way through the second batch
                    break
        assert pool_in_use(db1) == 0
        assert await db1.fetch_value(af.sql("SELECT {v} + 1", v=1)) == 2
    assert await db1.is_healthy()


async def test_cancelled_part_way_the_connection_is_not_reused_broken(db1: af.Database) -> None:
    seen = 0
    with anyio.CancelScope() as scope:
        async with db1.stream(numbered(db1, 5000), batch_size=20) as rows:
            async for _row in rows:
                seen += 1
                if seen == 30:
                    scope.cancel()  # (delivered at the next batch's fetch)
    assert scope.cancelled_caught and seen == 40
    assert pool_in_use(db1) == 0
    assert await db1.fetch(numbered(db1, 3)) == await db1.fetch(numbered(db1, 3))
    # Cancelled before the first row: the statement itself is interrupted.
    started = anyio.current_time()
    with anyio.move_on_after(0.3) as scope:
        async with db1.stream(db1._engine.raw(SLOW_QUERY[db1.name])) as rows:
            pytest.fail("the slow statement returned a row")
    assert scope.cancelled_caught
    assert anyio.current_time() - started < 5, "cancellation must not wait for the query"
    assert await db1.fetch_value(af.sql("SELECT {v} + 1", v=1)) == 2


async def test_an_error_part_way_is_translated_and_the_pool_recovers(db1: af.Database) -> None:
    query = af.sql(FAILS_AT[db1.name], k=250, series=series(db1, 1000))
    seen: list[int] = []
    with pytest.raises(af.DatabaseError) as failure:
        async with db1.stream(query, batch_size=100) as rows:
            async for row in rows:
                seen.append(row["x"])
    # Whole batches came before the one holding row 250, which failed as a whole.
    assert seen and len(seen) % 100 == 0 and 250 not in seen
    expected = {"postgresql": af.DataError, "sqlite": af.ProgrammingError}
    assert isinstance(failure.value, expected.get(db1.name, af.DatabaseError))
    assert failure.value.__cause__ is not None
    assert pool_in_use(db1) == 0
    assert await db1.fetch_value(af.sql("SELECT {v} + 1", v=1)) == 2


async def test_a_stream_in_a_transaction_sees_it_and_holds_it(db: af.Database) -> None:
    async with db.transaction() as tx:
        await tx.execute(af.sql("CREATE TEMPORARY TABLE stream_tmp (x integer)"))
        await tx.execute(
            af.sql("INSERT INTO stream_tmp (x) SELECT x FROM ({s}) AS s", s=series(db, 300))
        )
        # db.stream inside the block joins the transaction, as db.fetch does.
        async with db.stream(af.sql("SELECT x FROM stream_tmp ORDER BY x"), batch_size=40) as rows:
            with pytest.raises(af.ProgrammingError, match="stream is open"):
                await tx.fetch(af.sql("SELECT 1"))
            total = 0
            async for row in rows:
                total += row["x"]
                if row["x"] == 100:
                    break  # early: the rest is read (MySQL) and the transaction goes on
        assert total == 5050
        assert await tx.fetch_value(af.sql("SELECT count(*) FROM stream_tmp"), int) == 300
        async with tx.stream(af.sql("SELECT x FROM stream_tmp ORDER BY x")) as rows:
            assert [row["x"] async for row in rows] == list(range(1, 301))
        await tx.execute(af.sql("DROP TABLE stream_tmp"))
    assert pool_in_use(db) == 0


async def test_memory_stays_bounded(db: af.Database) -> None:
    """20k rows of ~220 bytes: fetch holds them all, a stream one batch (1000
    rows) — tracemalloc's peak counts the driver's buffers too, in every thread."""
    query = numbered(db, 20_000, prefix="x" * 200)
    await db.fetch_value(af.sql("SELECT 1"))  # (a warm connection)

    async def peak(read: object) -> int:
        tracemalloc.start()
        try:
            await read()  # type: ignore[operator]
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    async def fetch() -> None:
        assert len(await db.fetch(query)) == 20_000

    async def stream() -> None:
        count = 0
        async with db.stream(query) as rows:
            while batch := await rows.next_batch():
                count += len(batch)
                await (
                    anyio.lowlevel.checkpoint()
                )  # (a consumer that awaits: the driver may read on)
        assert count == 20_000

    streamed = await peak(stream)
    fetched = await peak(fetch)
    assert streamed < fetched / 5, (streamed, fetched)
    assert streamed < 3_000_000, streamed


# Rows x = 1..{n} (in no particular order) with the server session's id;
# past x = 20 each takes 10 ms, so the result is still being produced when
# the session is ended. (Rows of 2 kB: MySQL sends a result 16 kB at a time;
# and a recursive CTE, up to its 1000 levels: MySQL produces the join of
# digits whole before its first row.)
PACED = {
    "postgresql": "SELECT x, pg_backend_pid() AS pid, repeat('x', 2000) AS pad, "
    "CASE WHEN x > 20 THEN pg_sleep(0.01) END AS pause FROM ({series}) AS s",
    "mysql": "SELECT x, CONNECTION_ID() AS pid, REPEAT('x', 2000) AS pad, "
    "IF(x > 20, SLEEP(0.01), 0) AS pause FROM ({series}) AS s",
}
PACED_SERIES = {"postgresql": SERIES["postgresql"], "mysql": SERIES["sqlite"]}
END_SESSION = {
    "postgresql": "SELECT pg_terminate_backend({pid})",
    "mysql": "KILL {pid}",
}


async def test_a_connection_lost_part_way_raises_and_is_not_retried(
    db1: af.Database, url: str, target: Target
) -> None:
    if db1.name == "sqlite":
        pytest.skip("an embedded SQLite connection has no server to lose")
    query = af.sql(PACED[db1.name], series=af.sql(PACED_SERIES[db1.name], n=500))
    seen: list[int] = []
    async with af.connect(url, backend=target.backend) as other:
        with pytest.raises(af.ConnectionLost):
            async with db1.stream(query, batch_size=10) as rows:
                async for row in rows:
                    seen.append(row["x"])
                    if len(seen) == 10:
                        await other.execute(af.sql(END_SESSION[db1.name], pid=row["pid"]))
    # Rows were handed out, so nothing was run again: no row came twice.
    assert 10 <= len(seen) < 500 and len(set(seen)) == len(seen)
    assert pool_in_use(db1) == 0
    assert await db1.fetch_value(af.sql("SELECT {v} + 1", v=1)) == 2


async def test_a_streamed_write_commits_and_frees_the_writer(
    db: af.Database, tables: Tables
) -> None:
    """``INSERT .. RETURNING`` through a stream on db commits when the block
    is left, also early (PostgreSQL: the stream's own transaction; SQLite:
    the write gate is held until the stream ends, then freed)."""
    if not db._engine.adapter.capabilities.supports_returning:
        pytest.skip("this database has no INSERT .. RETURNING")
    table = await make_table(db, tables, {"i": "integer"})
    insert = af.sql(
        "INSERT INTO {t} (i) SELECT x FROM ({s}) AS s RETURNING i", t=table, s=series(db, 50)
    )
    async with db.stream(insert, batch_size=10) as rows:
        async for _row in rows:
            break
    async with db.transaction() as tx:  # (the writer is free again)
        await tx.execute(af.sql("INSERT INTO {t} (i) VALUES (0)", t=table))
    assert await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=table), int) == 51


async def test_stream_find_pages_through_a_table_decoded(shop: Env) -> None:
    """``db.stream_find``: every row ``find`` returns, in order, decoded
    through the schema, a page (a unit's read) at a time; a page ending on a
    NULL order value cannot be continued from, and says so."""

    async def create(uow: af.UnitOfWork) -> None:
        for i in range(25):
            note = None if i % 10 == 9 else f"n{i:02}"
            uow.create("accounts", {"owner": f"o{i:02}", "balance": i, "note": note})

    await shop.run(create)
    db = shop.db

    def find(**options: Any) -> AsyncIterator[dict[str, Any]]:
        return db.stream_find("accounts", schema=shop.schema, namespace=shop.namespace, **options)

    rows = [
        row async for row in find(where=af.c.balance >= 3, order_by=("owner", "desc"), page_size=4)
    ]
    assert [row["owner"] for row in rows] == [f"o{i:02}" for i in range(24, 2, -1)]
    assert isinstance(rows[0]["id"], af.RowId) and rows[0]["balance"] == 24
    async for row in find(page_size=7):  # leaving early leaves nothing open
        if row["balance"] == 10:
            break
    assert pool_in_use(db) == 0
    with pytest.raises(af.ValidationError, match="NULL"):
        async for _row in find(order_by="note", page_size=2):  # (NULLs first or last)
            pass


async def test_a_transaction_left_while_another_task_streams_in_it(db1: af.Database) -> None:
    """A task streaming in a transaction that the task owning it leaves: the
    transaction's end is refused (its connection is reading the stream's
    result: MySQL's COMMIT waited forever for its reply, PostgreSQL's
    committed with the portal open and the stream then closed it on a
    connection back in the pool), the connection is discarded, and the
    stream touches it no more."""
    await db1.execute(af.sql("DROP TABLE IF EXISTS stream_left"))
    await db1.execute(af.sql("CREATE TABLE stream_left (x integer)"))
    release = anyio.Event()

    async def reader(tx: af.Transaction, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with tx.stream(numbered(db1, 300), batch_size=100) as rows:
            assert len(await rows.next_batch()) == 100
            task_status.started()
            await release.wait()
            with pytest.raises(af.TransactionClosed):
                await rows.next_batch()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with pytest.raises(af.ProgrammingError, match="stream was still open"):
                async with db1.transaction() as tx:
                    await tx.execute(af.sql("INSERT INTO stream_left (x) VALUES (1)"))
                    await tg.start(reader, tx)
            release.set()
    assert pool_in_use(db1) == 0
    assert await db1.fetch_value(af.sql("SELECT count(*) FROM stream_left"), int) == 0
    await db1.execute(af.sql("DROP TABLE stream_left"))
