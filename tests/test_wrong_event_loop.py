"""A Database used from an event loop other than the one it was opened in.

asyncpg's and asyncmy's connections belong to the asyncio loop that opened
them: from another loop the Database says so (WrongEventLoop) before sending
anything, instead of the driver's "attached to a different loop" or a hang.
Where connections do not belong to a loop (SQLite's threads, the asyncio
bridge's own loop under trio) a Database keeps working from a later run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import aiofragno as af
from tests.conftest import TARGETS, Target, require_target

LOOP_BOUND = {("asyncio", "asyncpg"), ("asyncio", "asyncmy")}

Runner = Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any]


@pytest.fixture
def asyncio_home() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("home_target", TARGETS, ids=str)
def test_database_used_from_another_event_loop(
    home_target: Target, tmp_path: Path, asyncio_home: asyncio.AbstractEventLoop
) -> None:
    require_target(home_target)
    home, other = runners(home_target.runtime, asyncio_home)

    async def open_database() -> af.Database:
        return await af.connect(home_target.url(tmp_path), backend=home_target.backend)

    db: af.Database = home(open_database)

    async def query() -> Any:
        return await db.fetch_value(db._engine.raw("SELECT 1"))

    async def transaction() -> Any:
        async with db.transaction() as tx:
            return await tx.fetch_value(db._engine.raw("SELECT 1"))

    try:
        for use in (query, transaction):
            if (home_target.runtime, home_target.backend) in LOOP_BOUND:
                with pytest.raises(af.WrongEventLoop, match="opened in another event loop"):
                    other(use)
            else:
                assert other(use) == 1
        assert home(query) == 1
    finally:
        home(db.close)


def runners(runtime: str, asyncio_home: asyncio.AbstractEventLoop) -> tuple[Runner, Runner]:
    """Run in the Database's home loop, and in another one."""
    if runtime == "trio":
        return trio.run, trio.run  # each trio.run is a loop of its own
    return (lambda fn: asyncio_home.run_until_complete(fn())), (lambda fn: asyncio.run(fn()))
