"""SQLite's write gate hands over to the next writer as soon as a unit's
batch has committed on its thread, before the committing task resumes; a
batch stopped before COMMIT (a conflict) keeps it until its rollback.
(Under asyncio, whose ready tasks run first come first served: the order
is the test's; under trio it is the scheduler's, and the gate's guarantees
are the conformance suite's.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import aiofragno as af
from aiofragno.backends.sqlite_connection import WriteGate

SCHEMA = af.Schema("gate", af.Table("notes", af.Column("n", "bigint")))


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the writers did, in order: "gate <n>" as writer n passes the gate."""
    seen: list[str] = []
    acquire = WriteGate.acquire

    async def recording(self: WriteGate) -> None:
        await acquire(self)
        seen.append(f"gate {asyncio.current_task().get_name()}")  # type: ignore[union-attr]

    monkeypatch.setattr(WriteGate, "acquire", recording)
    return seen


def test_the_next_writer_passes_the_gate_before_the_committed_one_resumes(
    tmp_path: Path, events: list[str]
) -> None:
    async def check(db: af.Database) -> None:
        async def write(n: int) -> None:
            async def unit(uow: af.UnitOfWork) -> None:
                uow.create("notes", {"n": n})

            await db.execute_uow(unit, schema=SCHEMA)
            events.append(f"done {n}")

        first = asyncio.create_task(write(1), name="1")
        await asyncio.sleep(0)  # (the first takes the gate)
        second = asyncio.create_task(write(2), name="2")
        await asyncio.gather(first, second)
        assert events.index("gate 2") < events.index("done 1")
        assert await _count(db) == 2

    _with_database(tmp_path, check)


def test_a_conflicted_batch_keeps_the_gate_until_it_rolled_back(
    tmp_path: Path, events: list[str]
) -> None:
    async def check(db: af.Database) -> None:
        async def make(uow: af.UnitOfWork) -> af.RowId:
            return uow.create("notes", {"n": 0})

        row = await db.execute_uow(make, schema=SCHEMA)
        stale = af.RowId(str(row), 5)

        async def conflicted(uow: af.UnitOfWork) -> None:
            uow.update("notes", stale, {"n": 1}, check=True)

        async def write(uow: af.UnitOfWork) -> None:
            uow.create("notes", {"n": 2})

        async def run(fn: Any, **options: Any) -> None:
            try:
                await db.execute_uow(fn, schema=SCHEMA, **options)
            except af.ConcurrencyConflict:
                events.append("conflict")

        first = asyncio.create_task(run(conflicted, retry=af.NoRetry()), name="1")
        await asyncio.sleep(0)
        second = asyncio.create_task(run(write), name="2")
        await asyncio.gather(first, second)
        # (The stopped batch's transaction was open until its rollback, which
        # the conflicting task ran before it let the gate go.)
        assert events.index("conflict") < events.index("gate 2")
        assert await _count(db) == 2

    _with_database(tmp_path, check)


def _with_database(tmp_path: Path, check: Callable[[af.Database], Awaitable[None]]) -> None:
    """``check`` run under asyncio on a migrated SQLite database of two connections."""

    async def main() -> None:
        async with af.connect(f"sqlite:///{tmp_path}/g.db", backend="sqlite", pool_size=2) as db:
            await db.migrate(SCHEMA)
            await check(db)

    asyncio.run(main())


async def _count(db: af.Database) -> Any:
    notes = db.layout(SCHEMA).table("notes").identifier
    return await db.fetch_value(af.sql("SELECT count(*) FROM {t}", t=notes))
