"""Names on every backend and runtime: a name or default holding placeholder
or quote characters is stored and used exactly as declared."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.namespaces import (
    Namespaces,
    new_namespace,
    table_count,
)
from tests.conftest import Target

pytestmark = pytest.mark.anyio


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


async def rows_of(db: af.Database, schema: af.Schema, ns: str, table: str) -> list[dict[str, Any]]:
    async def fn(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find(table, order_by="v")
        await uow.retrieve()
        return list(op.result)

    return await db.execute_uow(fn, schema=schema, namespace=ns)


# -- names and defaults are text ----------------------------------------------

# Everything a later step could take for a placeholder (MySQL's driver
# formats with %, PostgreSQL statements are renumbered when joined) or for
# the end of a quoted name or literal.
HOSTILE = "%s %% $1 ? :a ' \" ` \\"
DEFAULTS = [
    "100%",
    "100%%",
    "%s",
    "%(a)s",
    "$1",
    "?",
    ":a",
    "it's",
    "a\\b",
    "\\'; --",
    '"`',
    HOSTILE,
]


class HostileNaming:
    """Physical names full of that text. Tables ``one`` and ``three`` differ
    only in ``$1`` / ``$3``: renumbering a statement on ``one`` by two
    parameters without skipping quoted names would make it one on ``three``."""

    def table(self, namespace: str, table: str) -> tuple[str | None, str]:
        return None, f"{namespace}_t{'$1' if table == 'one' else '$3'} {HOSTILE}"

    def index(self, namespace: str, table: str, index: str) -> str:
        return f"ix_{namespace}_{table}_{index} {HOSTILE}"

    def foreign_key(self, namespace: str, table: str, column: str) -> str:
        return f"fk_{namespace}_{table}_{column} {HOSTILE}"


def hostile_schema(*, with_defaults: bool) -> af.Schema:
    defaults = [
        af.Column(f"d{i}", "string", default=value)
        for i, value in enumerate(DEFAULTS)
        if with_defaults
    ]
    return af.Schema(
        "hostile",
        af.Table("one", af.Column("v", "string"), af.Index("by_v", ["v"], unique=True), *defaults),
        af.Table(
            "three",
            af.Column("v", "string"),
            af.Reference("one", "one", nullable=True),
            af.Index("by_v", ["v"], unique=True),
            *defaults,
        ),
    )


async def test_names_defaults_and_values_holding_placeholder_text_are_kept_exactly(
    db: af.Database, url: str, target: Target, spaces: Namespaces
) -> None:
    v1, v2 = hostile_schema(with_defaults=False), hostile_schema(with_defaults=True)
    async with af.connect(url, backend=target.backend, naming=HostileNaming()) as custom:
        layout = spaces.use(custom, v1)
        ns = layout.namespace
        await custom.migrate(v1, namespace=ns)
        # Every name was created as declared: nothing is left to do.
        assert await custom.migration_sql(v1, namespace=ns) == []
        for name in ("one", "three"):
            assert await table_count(db, layout.table(name)) == 1

        async def write(uow: af.UnitOfWork) -> tuple[af.RowId, af.RowId]:
            # (On PostgreSQL one statement: "one"'s part is renumbered.)
            three = uow.create("three", {"v": f"three {HOSTILE}"})
            return three, uow.create("one", {"v": f"one {HOSTILE}"})

        three, one = await custom.execute_uow(write, schema=v1, namespace=ns)

        async def read(uow: af.UnitOfWork) -> tuple[list[Any], list[Any]]:
            # (On PostgreSQL one statement too, with parameters to renumber.)
            a = uow.find("three", where=af.c.v != HOSTILE)
            b = uow.find("one", where=af.c.v != HOSTILE)
            await uow.retrieve()
            return list(a.result), list(b.result)

        threes, ones = await custom.execute_uow(read, schema=v1, namespace=ns)
        assert [(r["id"], r["v"]) for r in threes] == [(three, f"three {HOSTILE}")]
        assert [(r["id"], r["v"]) for r in ones] == [(one, f"one {HOSTILE}")]

        # Columns added to rows that exist take the declared defaults, exactly.
        await custom.migrate(v2, namespace=ns)
        assert await custom.migration_sql(v2, namespace=ns) == []
        expected = {f"d{i}": value for i, value in enumerate(DEFAULTS)}
        for table in ("one", "three"):
            [row] = await rows_of(custom, v2, ns, table)
            assert {k: row[k] for k in expected} == expected
        # So does a row inserted without them, in raw SQL.
        await custom.execute(
            af.sql(
                "INSERT INTO {t} ({id}, {v}) VALUES ({i}, {value})",
                t=layout.table("one").identifier,
                id=af.Identifier("id"),
                v=af.Identifier("v"),
                i="raw-row",
                value=HOSTILE,
            )
        )
        raw = [r for r in await rows_of(custom, v2, ns, "one") if r["id"] == "raw-row"]
        assert [{k: r[k] for k in expected} for r in raw] == [expected]

        async def link(uow: af.UnitOfWork) -> None:
            uow.update("three", three, {"one": one})

        await custom.execute_uow(link, schema=v2, namespace=ns)
        [row] = await rows_of(custom, v2, ns, "three")
        assert row["one"] == one


RAW_NAMES = ["rate_%", "rate_%%", "r%s", "r%(a)s", "r$1", "r?", "r:a", "r'q", 'r"q', "r`q", "r\\q"]


async def test_raw_names_and_literals_reach_the_database_as_written(db: af.Database) -> None:
    made: list[af.Identifier] = []
    try:
        for text in RAW_NAMES:
            table = af.Identifier(f"{text}_{new_namespace()}")
            made.append(table)
            column = af.Identifier(f"c_{text}")
            await db.execute(af.sql("CREATE TABLE {t} ({c} integer)", t=table, c=column))
            await db.execute(af.sql("INSERT INTO {t} ({c}) VALUES (7)", t=table, c=column))
            assert await catalog_tables(db, table.parts[0]) == [table.parts[0]], text
            assert await db.fetch_value(af.sql("SELECT {c} FROM {t}", t=table, c=column)) == 7
            # (A backslash in a literal of one's own SQL means what the
            # database says: an escape on MySQL.)
            literal = text.replace("'", "''").replace("\\", "")
            row = await db.fetch_one(af.sql(f"SELECT '{literal}' AS a, {{v}} AS b", v=text))
            assert row is not None
            assert (row["a"], row["b"]) == (literal.replace("''", "'"), text)
    finally:
        for table in made:
            await db.execute(af.sql("DROP TABLE IF EXISTS {t}", t=table))


async def catalog_tables(db: af.Database, name: str) -> list[str]:
    """The tables of the current schema named exactly ``name`` (by the catalog)."""
    if db.name == "sqlite":
        query = af.sql("SELECT name FROM sqlite_master WHERE type = 'table' AND name = {n}", n=name)
    else:
        current = "current_schema()" if db.name == "postgresql" else "DATABASE()"
        query = af.sql(
            "SELECT table_name AS name FROM information_schema.tables "
            f"WHERE table_schema = {current} AND table_name = {{n}}",
            n=name,
        )
    # (MySQL's catalog compares names ignoring case: compare here.)
    return [row["name"] for row in await db.fetch(query) if row["name"] == name]
