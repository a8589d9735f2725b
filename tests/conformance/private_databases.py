"""Databases of a test module's own on the servers (so, their own outbox
and bookkeeping tables), for tests that need to see everything written to
them; dropped at the end of the module."""

from __future__ import annotations

import uuid
import warnings
from urllib.parse import urlsplit, urlunsplit

import pytest

import aiofragno as af
from tests.conftest import Target


class PrivateDatabases:
    """Databases of one test module's own on the servers (so, their own outbox),
    all dropped at the end of the module."""

    def __init__(self) -> None:
        self.shared: dict[str, str] = {}  # dialect -> URL used by most tests
        self.made: list[tuple[str, str, str]] = []  # (dialect, server URL, name)

    async def create(self, target: Target, base: str) -> str:
        name = f"aiofragno_outbox_{uuid.uuid4().hex[:10]}"
        async with af.connect(base, backend=target.backend, pool_size=1) as admin:
            await admin.execute(admin._engine.raw(_create_database(target.dialect, name)))
        self.made.append((target.dialect, base, name))
        return urlunsplit(urlsplit(base)._replace(path=f"/{name}"))

    async def fresh_url(self, target: Target, base: str, tmp_path: object) -> str:
        """A new, empty database on ``target`` (a new file on SQLite); the
        test is skipped if the server will not make one."""
        if target.dialect == "sqlite":
            return f"sqlite:///{tmp_path}/fresh-{uuid.uuid4().hex[:8]}.db"
        try:
            return await self.create(target, base)
        except af.Error as exc:
            pytest.skip(f"needs a new, empty database; cannot create one: {exc}")

    async def url_for(self, target: Target, base: str) -> str:
        """The module's database on ``target``'s server; the shared test
        database itself when we may not create one (then the tests rely on
        nobody else writing to its outbox meanwhile)."""
        if target.dialect not in self.shared:
            try:
                self.shared[target.dialect] = await self.create(target, base)
            except af.Error:
                self.shared[target.dialect] = base
        return self.shared[target.dialect]

    async def drop_all(self) -> None:
        for dialect, base, name in self.made:
            force = " WITH (FORCE)" if dialect == "postgresql" else ""
            try:
                async with af.connect(base, pool_size=1) as admin:
                    await admin.execute(
                        admin._engine.raw(f"DROP DATABASE IF EXISTS {_quote(dialect, name)}{force}")
                    )
            except af.Error as exc:
                warnings.warn(f"could not drop test database {name}: {exc}", stacklevel=1)


def _create_database(dialect: str, name: str) -> str:
    # template0: CREATE DATABASE from template1 fails while anyone is connected to it.
    template = " TEMPLATE template0" if dialect == "postgresql" else ""
    return f"CREATE DATABASE {_quote(dialect, name)}{template}"


def _quote(dialect: str, name: str) -> str:
    return f"`{name}`" if dialect == "mysql" else f'"{name}"'
