"""Helpers for tests that migrate schemas: unique namespaces, cleanup of what
a migration created, and catalog look-ups on every dialect."""

from __future__ import annotations

import contextlib
import uuid

import aiofragno as af
from aiofragno.migrate import SETTINGS_TABLE
from aiofragno.naming import Layout, PhysicalTable
from aiofragno.schema import tables_in_dependency_order

SETTINGS = af.Identifier(SETTINGS_TABLE)


def new_namespace(prefix: str = "ns") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Namespaces:
    """Namespaces one test migrates into; everything in them is dropped at the
    end (``DROP SCHEMA ... CASCADE`` for a PostgreSQL schema per namespace,
    otherwise the tables), and their keys are deleted from the settings table."""

    def __init__(self, db: af.Database) -> None:
        self.db = db
        self.layouts: list[Layout] = []

    def use(self, db: af.Database, schema: af.Schema, namespace: str | None = None) -> Layout:
        """Track ``schema`` under ``namespace`` (a new one by default) as laid
        out by ``db`` (whose naming strategy decides the physical names)."""
        layout = db.layout(schema, namespace or new_namespace())
        self.layouts.append(layout)
        return layout

    async def drop(self) -> None:
        db = self.db
        if db.closed:
            return
        for layout in reversed(self.layouts):
            if layout.db_schemas and db.name == "postgresql":
                for name in layout.db_schemas:
                    await _quietly(
                        db, af.sql("DROP SCHEMA IF EXISTS {s} CASCADE", s=af.Identifier(name))
                    )
            else:
                for table in reversed(list(tables_in_dependency_order(layout.schema))):
                    physical = layout.table(table.name)
                    await _quietly(db, af.sql("DROP TABLE IF EXISTS {t}", t=physical.identifier))
            await _quietly(
                db,
                af.sql(
                    "DELETE FROM {t} WHERE {k} LIKE {p}",
                    t=SETTINGS,
                    k=af.Identifier("key"),
                    p=f"{layout.namespace}.%",
                ),
            )


async def _quietly(db: af.Database, query: af.Fragment) -> None:
    # Absent when never created (e.g. a migration that was expected to fail).
    with contextlib.suppress(af.Error):
        await db.execute(query)


async def table_count(db: af.Database, physical: PhysicalTable) -> int:
    """How many tables named like ``physical`` the database has (0 or 1)."""
    if db.name == "sqlite":
        query = af.sql(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = {n}",
            n=physical.name,
        )
    else:
        current = "current_schema()" if db.name == "postgresql" else "DATABASE()"
        where = af.sql("{s}", s=physical.schema) if physical.schema else db._engine.raw(current)
        query = af.sql(
            "SELECT COUNT(*) AS n FROM information_schema.tables "
            "WHERE table_schema = {w} AND table_name = {n}",
            w=where,
            n=physical.name,
        )
    return int(await db.fetch_value(query))


async def column_names(db: af.Database, physical: PhysicalTable) -> set[str]:
    """The columns the table has in the database."""
    if db.name == "sqlite":
        query = af.sql("SELECT name FROM pragma_table_info({t})", t=physical.name)
    else:
        current = "current_schema()" if db.name == "postgresql" else "DATABASE()"
        where = af.sql("{s}", s=physical.schema) if physical.schema else db._engine.raw(current)
        query = af.sql(
            "SELECT column_name AS name FROM information_schema.columns "
            "WHERE table_schema = {w} AND table_name = {n}",
            w=where,
            n=physical.name,
        )
    return {row["name"] for row in await db.fetch(query)}


async def setting(db: af.Database, key: str) -> list[str]:
    """The values stored under ``key`` in the settings table (a list, so that a
    duplicate would show; empty when there is no settings table yet)."""
    try:
        rows = await db.fetch(
            af.sql(
                "SELECT {v} AS value FROM {t} WHERE {k} = {key}",
                t=SETTINGS,
                k=af.Identifier("key"),
                v=af.Identifier("value"),
                key=key,
            )
        )
    except af.ProgrammingError:
        return []
    return [row["value"] for row in rows]
