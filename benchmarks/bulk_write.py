"""A bulk write of ``--rows`` rows (default 10,000) in one transaction, per
backend: aiofragno's ``uow.create_many`` (with and without the outbox) and
``uow.update_many`` against hand-written raw-driver code and SQLAlchemy 2
Core doing the same writes.

Creates insert (id, name, n) rows — a new external id each, as aiofragno
makes — into the table aiofragno migrated, emptied before each variant:

* ``create_many``, ``create_many+outbox``: one unit, ``uow.create_many``
  (every value checked and encoded; with the outbox, one entry listing every
  row and its values).
* ``create loop``: one unit, ``uow.create`` per row (what there was before).
* ``raw executemany``: asyncpg ``executemany`` / asyncmy ``executemany`` /
  sqlite3 ``executemany`` (on a worker thread, ``asyncio.to_thread``), in a
  transaction.
* ``raw copy``: asyncpg ``copy_records_to_table`` (PostgreSQL only).
* ``sqlalchemy``: SQLAlchemy 2 Core ``conn.execute(insert(t), rows)``
  (its "insertmanyvalues") on its asyncio engine.
* ``sqlalchemy orm``: the ORM's unit of work: ``session.add_all`` of 10,000
  mapped objects in ``session.begin()`` (flushed as batched INSERTs; their
  primary keys fetched back, RETURNING where the driver allows).

Updates set ``n`` on every row (bumping ``_version``): ``update_many``
(the unit reads the rows' ids, then updates them by id in bounded chunks
and checks each chunk), ``update_many check`` (``check=True``), against
one raw ``UPDATE ... SET n = ?, _version = _version + 1`` and the same
through SQLAlchemy.

Rounds interleave the variants (every other round in reverse order);
reported: median seconds, and the median over rounds of each variant's
speed relative to ``raw executemany`` (creates) or ``raw update`` in the
same round.

    python -m benchmarks.bulk_write [--backend all] [--rows 10000] [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiofragno as af
from aiofragno.schema import new_external_id

from . import _common as common
from . import _sqlalchemy as sa

ITEMS = af.Schema(
    "bulkw",
    af.Table("items", af.Column("name", "string"), af.Column("n", "bigint")),
)
Variant = Callable[[], Awaitable[None]]


class Bench:
    """One backend: its Databases, the migrated table's name, raw connections."""

    def __init__(self, target: common.Target, rows: int) -> None:
        self.target = target
        self.rows = rows
        self.namespace = f"bw{uuid.uuid4().hex[:8]}"

    async def open(self) -> None:
        url = self.target.url
        self.db = await af.connect(url, pool_size=2).__aenter__()
        self.odb = await af.connect(url, pool_size=2, outbox=True).__aenter__()
        await self.odb.migrate(ITEMS, namespace=self.namespace)
        parts = self.db.layout(ITEMS, self.namespace).table("items").identifier.parts
        quote = self.db._engine.compiler.quote_identifier
        self.table = ".".join(quote(p) for p in parts)
        self.parts = parts
        self.payload_bytes = 0
        await self._open_raw()
        await self._open_sqlalchemy()

    async def _open_raw(self) -> None:
        dialect = self.target.dialect
        if dialect == "postgresql":
            import asyncpg

            self.pg = await asyncpg.connect(self.target.url)
        elif dialect == "mysql":
            import asyncmy

            self.my = await asyncmy.connect(**common.asyncmy_options(self.target.url))
        else:
            self.lite = sqlite3.connect(
                self.target.sqlite_path, isolation_level=None, check_same_thread=False
            )

    async def _open_sqlalchemy(self) -> None:
        from sqlalchemy import BigInteger, Integer, String
        from sqlalchemy.ext.asyncio import async_sessionmaker
        from sqlalchemy.orm import DeclarativeBase, mapped_column

        self.engine = await sa.engine(self.target, pool_size=1)

        class Base(DeclarativeBase):
            pass

        class Item(Base):
            __tablename__ = self.parts[-1]
            __table_args__ = {"schema": sa.schema_of(self.parts)}
            pk = mapped_column("_id", sa.internal_id(), primary_key=True)
            id = mapped_column(String(64))
            version = mapped_column("_version", Integer)
            name = mapped_column(String(255))
            n = mapped_column(BigInteger)

        self.Item = Item
        self.sa_table = Item.__table__
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)

    async def close(self) -> None:
        await self.engine.dispose()
        if self.target.dialect == "postgresql":
            await self.pg.close()
        elif self.target.dialect == "mysql":
            self.my.close()
        else:
            self.lite.close()
        await self.odb.execute(af.sql("DROP TABLE {t}", t=self._identifier()))
        if self.target.dialect == "postgresql":
            await self.odb.execute(af.sql("DROP SCHEMA {s}", s=af.Identifier(self.namespace)))
        await self.odb.__aexit__(None, None, None)
        await self.db.__aexit__(None, None, None)

    def _identifier(self) -> af.Identifier:
        return self.db.layout(ITEMS, self.namespace).table("items").identifier

    async def empty(self) -> None:
        await self.db.execute(af.sql("DELETE FROM {t}", t=self._identifier()))

    def values(self) -> list[dict[str, Any]]:
        return [{"name": f"item{i}", "n": i} for i in range(self.rows)]

    # -- creates ---------------------------------------------------------

    async def create_many(self) -> None:
        rows = self.values()

        async def unit(uow: af.UnitOfWork) -> None:
            uow.create_many("items", rows)

        await self.db.execute_uow(unit, schema=ITEMS, namespace=self.namespace)

    async def create_many_outbox(self) -> None:
        rows = self.values()

        async def unit(uow: af.UnitOfWork) -> None:
            uow.create_many("items", rows)

        await self.odb.execute_uow(
            unit, schema=ITEMS, namespace=self.namespace, on_query=self._payload_size
        )

    def _payload_size(self, query: af.CompiledQuery) -> None:
        """The outbox entry's payload (its largest text parameter), in bytes."""
        texts = [len(p.encode()) for p in query.parameters if isinstance(p, str)]
        self.payload_bytes = max([self.payload_bytes, *texts])

    async def create_loop(self) -> None:
        rows = self.values()

        async def unit(uow: af.UnitOfWork) -> None:
            for row in rows:
                uow.create("items", row)

        await self.db.execute_uow(unit, schema=ITEMS, namespace=self.namespace)

    def raw_rows(self) -> list[tuple[str, str, int]]:
        return [(new_external_id(), f"item{i}", i) for i in range(self.rows)]

    async def raw_executemany(self) -> None:
        rows = self.raw_rows()
        table, dialect = self.table, self.target.dialect
        if dialect == "postgresql":
            async with self.pg.transaction():
                await self.pg.executemany(
                    f'INSERT INTO {table} ("id", "name", "n") VALUES ($1, $2, $3)', rows
                )
        elif dialect == "mysql":
            async with self.my.cursor() as cursor:
                await cursor.execute("BEGIN")
                await cursor.executemany(
                    f"INSERT INTO {table} (`id`, `name`, `n`) VALUES (%s, %s, %s)", rows
                )
                await cursor.execute("COMMIT")
        else:
            # On a worker thread, as an asyncio application would (and as
            # aiofragno's sqlite backend does): one hop for the transaction.
            await asyncio.to_thread(self._lite_insert, rows)

    def _lite_insert(self, rows: list[tuple[str, str, int]]) -> None:
        self.lite.execute("BEGIN")
        self.lite.executemany(
            f'INSERT INTO {self.table} ("id", "name", "n") VALUES (?, ?, ?)', rows
        )
        self.lite.execute("COMMIT")

    async def raw_copy(self) -> None:
        rows = self.raw_rows()
        schema = self.parts[0] if len(self.parts) == 2 else None
        async with self.pg.transaction():
            await self.pg.copy_records_to_table(
                self.parts[-1], records=rows, columns=["id", "name", "n"], schema_name=schema
            )

    async def sqlalchemy_insert(self) -> None:
        from sqlalchemy import insert

        rows = [{"id": new_external_id(), **row} for row in self.values()]
        async with self.engine.begin() as conn:
            await conn.execute(insert(self.sa_table), rows)

    async def sqlalchemy_orm_insert(self) -> None:
        item = self.Item
        async with self.sessions() as session, session.begin():
            session.add_all([item(id=new_external_id(), version=0, **row) for row in self.values()])

    # -- updates ---------------------------------------------------------

    async def update_many(self, check: bool = False) -> None:
        async def unit(uow: af.UnitOfWork) -> None:
            uow.update_many("items", af.ALL, {"n": 7}, check=check)

        await self.db.execute_uow(unit, schema=ITEMS, namespace=self.namespace)

    async def update_many_checked(self) -> None:
        await self.update_many(check=True)

    async def raw_update(self) -> None:
        dialect, table = self.target.dialect, self.table
        if dialect == "postgresql":
            await self.pg.execute(f'UPDATE {table} SET "n" = $1, "_version" = "_version" + 1', 7)
        elif dialect == "mysql":
            async with self.my.cursor() as cursor:
                await cursor.execute(
                    f"UPDATE {table} SET `n` = %s, `_version` = `_version` + 1", (7,)
                )
        else:
            update = f'UPDATE {table} SET "n" = ?, "_version" = "_version" + 1'
            await asyncio.to_thread(self.lite.execute, update, (7,))

    async def sqlalchemy_update(self) -> None:
        from sqlalchemy import update

        t = self.sa_table
        async with self.engine.begin() as conn:
            await conn.execute(update(t).values(n=7, _version=t.c._version + 1))


CREATES = {
    "raw executemany": "raw_executemany",
    "raw copy": "raw_copy",
    "sqlalchemy": "sqlalchemy_insert",
    "sqlalchemy orm": "sqlalchemy_orm_insert",
    "create_many": "create_many",
    "create_many+outbox": "create_many_outbox",
    "create loop": "create_loop",
}
UPDATES = {
    "raw update": "raw_update",
    "sqlalchemy update": "sqlalchemy_update",
    "update_many": "update_many",
    "update_many check": "update_many_checked",
}


async def measure(dialects: Sequence[str], rounds: int, rows: int) -> dict[str, Any]:
    seconds: dict[str, dict[str, list[float]]] = {}
    payloads: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dialect in dialects:
            async with common.target(dialect, Path(tmp)) as target:
                if target is None:
                    continue
                bench = Bench(target, rows)
                await bench.open()
                try:
                    for round_ in range(rounds):
                        # Every other round in reverse order, so that no variant
                        # always runs just after another.
                        creates = list(CREATES.items())
                        updates = list(UPDATES.items())
                        if round_ % 2:
                            creates.reverse()
                            updates.reverse()
                        for label, method in creates:
                            if label == "raw copy" and dialect != "postgresql":
                                continue
                            await bench.empty()
                            started = time.perf_counter()
                            await getattr(bench, method)()
                            elapsed = time.perf_counter() - started
                            seconds.setdefault(dialect, {}).setdefault(label, []).append(elapsed)
                        # The table now holds `rows` rows (from the last create).
                        for label, method in updates:
                            started = time.perf_counter()
                            await getattr(bench, method)()
                            elapsed = time.perf_counter() - started
                            seconds[dialect].setdefault(label, []).append(elapsed)
                        print(
                            f"  {dialect:10} "
                            + " ".join(f"{k}={v[-1]:.3f}" for k, v in seconds[dialect].items())
                        )
                    payloads[dialect] = bench.payload_bytes
                finally:
                    await bench.close()
    return {"seconds": seconds, "outbox_payload_bytes": payloads}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bulk_write")
    parser.add_argument("--backend", default="all", help="sqlite,postgresql,mysql or all")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    dialects = common.BACKENDS if args.backend == "all" else args.backend.split(",")
    measured = asyncio.run(measure(dialects, args.rounds, args.rows))
    seconds = measured["seconds"]
    medians = {d: {k: statistics.median(v) for k, v in by.items()} for d, by in seconds.items()}
    # Each variant's speed relative to the raw driver's in the same round
    # (the machine's load drifts between rounds), the median over rounds.
    ratios = {
        d: {
            k: statistics.median(
                base / t
                for base, t in zip(
                    by["raw executemany" if k in CREATES else "raw update"], v, strict=True
                )
            )
            for k, v in by.items()
        }
        for d, by in seconds.items()
    }
    # create_many against SQLAlchemy, per round likewise.
    versus_sqlalchemy = {
        d: {
            other: statistics.median(
                t / mine for mine, t in zip(by["create_many"], by[other], strict=True)
            )
            for other in ("sqlalchemy", "sqlalchemy orm")
        }
        for d, by in seconds.items()
    }
    table = []
    for dialect, by in medians.items():
        for label, median in by.items():
            table.append(
                [
                    dialect,
                    label,
                    f"{median * 1000:.1f}",
                    f"{args.rows / median:,.0f}",
                    f"{ratios[dialect][label]:.2f}",
                ]
            )
    print()
    common.print_table(["backend", "variant", "median ms", "rows/s", "speed vs raw"], table)
    print("create_many speed vs SQLAlchemy Core / ORM:", versus_sqlalchemy)
    print("outbox payload bytes for one create_many:", measured["outbox_payload_bytes"])
    common.write_json(
        args.json or common.default_json_path("bulk_write"),
        {
            "benchmark": "bulk_write",
            "rounds": args.rounds,
            "rows": args.rows,
            "seconds": seconds,
            "median_seconds": medians,
            "speed_vs_raw": ratios,
            "create_many_speed_vs_sqlalchemy": versus_sqlalchemy,
            "outbox_payload_bytes": measured["outbox_payload_bytes"],
            "machine": common.machine_info({}),
        },
    )


if __name__ == "__main__":
    main()
