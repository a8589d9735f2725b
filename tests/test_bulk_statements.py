"""The statements bulk writes make, on every dialect, without a server: each
bounded by CHUNK_PARAMETERS, and never combined with others into one
data-modifying WITH (where PostgreSQL allows at most 1,664 result columns),
so a unit of 100,000 rows is many small statements. What they do on a real
database is tests/conformance/test_uow_bulk.py."""

from __future__ import annotations

import pytest

from aiofragno.naming import Layout, resolve_naming
from aiofragno.schema import RowId
from aiofragno.uow import bulk
from aiofragno.uow.catalog import Catalog
from aiofragno.uow.combine import MAX_PARTS, combinable, groups
from aiofragno.uow.unit import UnitOfWork
from tests.test_commit_plans import SCHEMA, FakeConnection, _engine


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "sqlite"])
def test_bulk_statements_are_bounded_and_run_alone(dialect: str) -> None:
    engine = _engine(dialect, FakeConnection(), outbox=True)
    layout = Layout(SCHEMA, "plans", resolve_naming("suffix"), engine.adapter.max_identifier_length)
    catalog = Catalog(layout, engine.compiler, engine.codec, engine.adapter, {})

    async def no_reads(queries: object) -> list[object]:
        raise AssertionError("no reads")

    uow = UnitOfWork(no_reads, catalog, "unit-1")  # type: ignore[arg-type]
    uow.create("items", {"name": "one", "qty": 1})
    ids = uow.create_many("items", [{"name": f"n{i}", "qty": i} for i in range(3 * MAX_PARTS)])
    seen = [RowId(f"row-{i}", version=3) for i in range(5_000)]
    uow.update_many("items", rows=seen, values={"qty": 0}, check=True)
    uow.delete_many("items", rows=seen[:10])
    uow.update("items", ids[0], {"qty": 2})

    ops = uow.mutations
    assert max(len(op.query.parameters) for op in ops) <= bulk.CHUNK_PARAMETERS
    runs = groups(ops)
    assert all(len(run) == 1 for run in runs if any(op.runs_alone for op in run))
    assert not combinable(ops)
    # Per 1,998 ids an UPDATE and its check; the delete: bump, check, delete.
    assert sum(op.runs_alone for op in ops) == 1 + 3 * 2 + 3
    # One mutation per call in the outbox: create, create_many, update_many,
    # delete_many, update.
    assert sum(op.in_outbox for op in ops if op.op != "check") == 5
