"""What the failover tests (test_failover.py on PostgreSQL,
test_mariadb_failover.py on MariaDB) share: the module's pairs of servers,
and units that each add one key to the table ``events``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pytest

import aiofragno as af
from tests.conftest import Target


class Pairs(Protocol):
    def close(self) -> None: ...


def module_pairs(make: Callable[[], Pairs]) -> Any:
    """A module-scoped fixture ``shared_pairs``: ``make()``, closed after the module."""

    @pytest.fixture(scope="module")
    def shared_pairs() -> Iterator[Pairs]:
        pairs = make()
        yield pairs
        pairs.close()

    return shared_pairs


def only_on(target: Target, dialect: str, why: str) -> Target:
    """``target``, or the test skipped (``why``) when it is not ``dialect``'s."""
    if target.dialect != dialect:
        pytest.skip(why)
    return target


async def add_key(db: af.Database, schema: af.Schema, key: str) -> None:
    """A unit adding ``key`` to ``events``."""

    async def add(uow: af.UnitOfWork) -> None:
        uow.create("events", {"key": key})

    await db.execute_uow(add, schema=schema)


async def keys(db: af.Database, schema: af.Schema) -> list[str]:
    """Every key in ``events``."""

    async def read(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("events")
        await uow.retrieve()
        return [row["key"] for row in op.result]

    return await db.execute_uow(read, schema=schema)
