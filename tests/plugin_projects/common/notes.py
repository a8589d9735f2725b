"""What the projects' tests ask of ``aiofragno_db``."""

import asyncio
import json
import os
from collections.abc import AsyncIterator

import aiofragno as af

NOTES = af.Schema("notes", af.Table("note", af.Column("text", "string")))


async def add(db: af.Database, text: str) -> None:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("note", {"text": text})

    await db.execute_uow(unit, schema=NOTES)


async def texts(db: af.Database) -> list[str]:
    async def unit(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("note")
        await uow.retrieve()
        return sorted(row["text"] for row in op.result)

    return await db.execute_uow(unit, schema=NOTES)


async def check(db: af.Database, dialect: str, seeded: tuple[str, ...] = ()) -> None:
    """``db`` is on ``dialect``, migrated, holds only ``seeded`` and works in
    this loop (on PostgreSQL and MySQL a Database from another loop raises
    WrongEventLoop). Records where its data lives, so the outer test can see
    it was dropped."""
    assert db.name == dialect
    record(db)
    assert await texts(db) == list(seeded)
    await add(db, "mine")
    assert await texts(db) == sorted([*seeded, "mine"])


def record(db: af.Database) -> None:
    place = {"postgresql": db.options.search_path, "mysql": db.url.database}.get(db.name)
    if place is not None:
        with open(os.environ["AF_RECORD"], "a") as out:
            out.write(json.dumps([db.name, place]) + "\n")


def same_loop(seen: set[asyncio.AbstractEventLoop]) -> None:
    """Every test that passes ``seen`` runs in one loop."""
    seen.add(asyncio.get_running_loop())
    assert len(seen) == 1


async def seed(db: af.Database) -> AsyncIterator[tuple[str, ...]]:
    """The body of a fixture of the user's on top of ``aiofragno_db``: it
    writes before the test and reads after it, when ``db`` must still be open."""
    await add(db, "seed")
    yield ("seed",)
    assert "seed" in await texts(db)
