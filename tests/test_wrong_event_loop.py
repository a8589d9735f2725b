"""A Database belongs to the event loop it was opened in: used from another,
it says so (WrongEventLoop) before sending anything, instead of the driver's
"attached to a different loop" or a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import aiofragno as af
from tests.conftest import TARGETS, Target, require_target

ASYNCIO_TARGETS = [t for t in TARGETS if t.runtime == "asyncio"]


@pytest.mark.parametrize("home_target", ASYNCIO_TARGETS, ids=[t.backend for t in ASYNCIO_TARGETS])
def test_database_used_from_another_loop(home_target: Target, tmp_path: Path) -> None:
    require_target(home_target)
    home = asyncio.new_event_loop()
    db = home.run_until_complete(af.connect(home_target.url(tmp_path), backend=home_target.backend))
    try:

        async def query() -> None:
            await db.fetch_value(db.raw("SELECT 1"))

        async def transaction() -> None:
            async with db.transaction() as tx:
                await tx.fetch_value(db.raw("SELECT 1"))

        for use in (query, transaction):
            with pytest.raises(af.WrongEventLoop, match="opened in another event loop"):
                asyncio.run(use())
        assert home.run_until_complete(db.fetch_value(db.raw("SELECT 1"))) == 1
    finally:
        home.run_until_complete(db.close())
        home.close()
