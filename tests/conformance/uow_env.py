"""What the unit-of-work conformance modules (test_uow_*.py) share: the
schemas most of them migrate, ``Env`` (one migrated schema in a namespace of
its own, with short-cuts to read and write through units), seeding helpers,
a retry policy that records what it was asked, and a spy on the statements
mutation phases send (``SentBatches``). Their fixtures
(``make_env``, ``shop``, ``items``) are in conftest.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import aiofragno as af
from aiofragno.schema import tables_in_dependency_order
from aiofragno.session import Session

SHOP = af.Schema(
    "shop",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Column("note", "string", nullable=True),
        af.Index("by_owner", ["owner"]),
    ),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("dst", "accounts"),
        af.Column("amount", "bigint"),
    ),
    af.Table(
        "people",
        af.Column("email", "string"),
        af.Reference("account", "accounts", nullable=True),
        af.Index("by_email", ["email"], unique=True),
    ),
)


ITEMS = af.Schema(
    "items",
    af.Table(
        "items",
        af.Column("name", "string"),
        af.Column("qty", "bigint"),
        af.Column("tag", "string", nullable=True),
    ),
    af.Table("others", af.Column("name", "string")),
)


Unit = Callable[[af.UnitOfWork], Awaitable[Any]]


async def drop_namespace(db: af.Database, schema: af.Schema, namespace: str) -> None:
    """Drop what ``db.migrate(schema, namespace=namespace)`` created."""
    if db.closed:
        return
    layout = db.layout(schema, namespace)
    if layout.db_schemas:
        for name in layout.db_schemas:
            await db.execute(af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name)))
    else:
        for table in reversed(list(tables_in_dependency_order(schema))):
            await db.execute(
                af.sql("DROP TABLE IF EXISTS {t}", t=layout.table(table.name).identifier)
            )
    await db.execute(
        af.sql(
            "DELETE FROM {t} WHERE {k} LIKE {p}",
            t=af.Identifier("fragno_db_settings"),
            k=af.Identifier("key"),
            p=f"{namespace}.%",
        )
    )


class Env:
    """One migrated schema in a fresh namespace of one database."""

    def __init__(self, db: af.Database, schema: af.Schema, namespace: str) -> None:
        self.db = db
        self.schema = schema
        self.namespace = namespace

    async def run(self, fn: Unit, **options: Any) -> Any:
        return await self.db.execute_uow(
            fn, schema=self.schema, namespace=self.namespace, **options
        )

    def ident(self, table: str) -> af.Identifier:
        return self.db.layout(self.schema, self.namespace).table(table).identifier

    @property
    def catalog(self) -> Any:
        return self.db._catalog(self.schema, self.namespace)

    async def count(self, table: str) -> int:
        value = await self.db.fetch_value(af.sql("SELECT COUNT(*) FROM {t}", t=self.ident(table)))
        return int(value)

    async def raw_rows(self, table: str) -> list[dict[str, Any]]:
        rows = await self.db.fetch(
            af.sql("SELECT * FROM {t} ORDER BY {i}", t=self.ident(table), i=af.Identifier("_id"))
        )
        return [dict(row) for row in rows]

    async def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every stored row (hidden columns included) of every table."""
        return {
            name: [tuple(row.values()) for row in await self.raw_rows(name)]
            for name in self.schema.tables
        }

    async def version(self, table: str, row_id: str) -> int | None:
        value = await self.db.fetch_value(
            af.sql(
                "SELECT {v} FROM {t} WHERE {i} = {x}",
                v=af.Identifier("_version"),
                t=self.ident(table),
                i=af.Identifier("id"),
                x=str(row_id),
            )
        )
        return None if value is None else int(value)

    async def find(self, table: str, **kwargs: Any) -> Any:
        async def unit(uow: af.UnitOfWork) -> Any:
            op = uow.find(table, **kwargs)
            await uow.retrieve()
            return op.result

        return await self.run(unit)

    async def create(self, table: str, *rows: dict[str, Any]) -> list[af.RowId]:
        async def unit(uow: af.UnitOfWork) -> list[af.RowId]:
            return [uow.create(table, values) for values in rows]

        return await self.run(unit)


MakeEnv = Callable[[af.Schema], Awaitable[Env]]


async def entry_numbered(db: af.Database, versionstamp: str) -> af.OutboxEntry:
    """The outbox entry with ``versionstamp``."""
    before = f"{int(versionstamp, 16) - 1:024x}"
    [entry] = await db.outbox.list(after=before, limit=1)
    assert entry.versionstamp == versionstamp
    return entry


async def seed_accounts(env: Env, *owners: str, balance: int = 100) -> dict[str, af.RowId]:
    """Create accounts; return their ids as read back (RowIds with version and
    internal id)."""
    await env.create("accounts", *({"owner": o, "balance": balance} for o in owners))
    rows = await env.find("accounts", where=af.c.owner.in_(owners))
    return {row["owner"]: row["id"] for row in rows}


async def read_account(env: Env, owner: str) -> dict[str, Any] | None:
    rows = await env.find("accounts", where={"owner": owner})
    assert len(rows) <= 1
    return rows[0] if rows else None


def stale(row_id: af.RowId, version: int = 999) -> af.RowId:
    """The same row at a version it does not have."""
    return af.RowId(str(row_id), version, row_id.internal_id)


class RecordingPolicy:
    """A custom retry policy: retries ``limit`` times without waiting."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.asked: list[int] = []

    def delay(self, attempt: int) -> float | None:
        self.asked.append(attempt)
        return 0.0 if attempt <= self.limit else None


class SentBatches:
    """The statements each mutation-phase batch carried to the driver (with
    COMMIT, where the engine checks the results in this process)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[list[str]] = []
        execute_batch, commit = Session.execute_batch, Session.commit

        async def spying(self_: Session, queries: Any, stop: Any = None) -> Any:
            if self_.in_transaction:  # (the retrieval phase runs outside one)
                self.batches.append([q.sql for q in queries])
            return await execute_batch(self_, queries, stop)

        async def spying_commit(self_: Session, queries: Any = (), stop: Any = None) -> Any:
            if stop is not None:  # (the writes, checked on the way)
                self.batches.append([q.sql for q in queries])
            return await commit(self_, queries, stop)

        monkeypatch.setattr(Session, "execute_batch", spying)
        monkeypatch.setattr(Session, "commit", spying_commit)

    def combined(self) -> bool:
        """Whether a phase since the last call went out as one statement (a
        failed one is retried statement by statement)."""
        batches, self.batches = self.batches, []
        return any(len(b) == 1 and b[0].startswith("WITH q0 AS") for b in batches)


def reads_combine(db: af.Database) -> bool:
    """Whether a retrieve's reads go as one statement on ``db``
    (aiofragno.uow.combine_reads): arrays of rows on PostgreSQL, a UNION ALL
    on MySQL and MariaDB."""
    adapter = db._engine.adapter
    return adapter.sql.rows_array is not None or adapter.capabilities.unites_reads


def write_after_first_read(monkeypatch: pytest.MonkeyPatch, env: Env, write: Unit) -> list[bool]:
    """Make the next batch of reads that has a statement after its first
    SELECT stop there while ``env`` runs the unit ``write`` (on another
    connection), then go on. The list returned holds True once that happened
    (never where a retrieve is one statement: see :func:`reads_combine`)."""
    original = Session.execute_batch
    raced: list[bool] = []

    async def execute_batch(self: Session, queries: Any, stop: Any = None) -> Any:
        reads = [i for i, q in enumerate(queries) if q.sql.lstrip()[:6].upper() == "SELECT"]
        if raced or not reads or reads[0] + 1 >= len(queries):
            return await original(self, queries, stop)
        raced.append(True)
        cut = reads[0] + 1
        head = await original(self, queries[:cut], stop)
        await env.run(write)
        return [*head, *await original(self, queries[cut:], stop)]

    monkeypatch.setattr(Session, "execute_batch", execute_batch)
    return raced
