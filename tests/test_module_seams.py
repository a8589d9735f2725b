"""The seam between the Database facade and the features under it.

Units of work, the outbox, transactions, lost sessions and migrations run
on :class:`aiofragno.engine.Engine` (or narrower arguments) and never see
the :class:`~aiofragno.Database`: only the public API and the applications
built on it import ``aiofragno.database``. Imports are read from the source
with ``ast`` — at module level, inside functions and under
``TYPE_CHECKING`` alike, since a type-only import is a dependency too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import aiofragno as af

PACKAGE = Path(af.__file__).parent

# The modules above the facade: the public API and what is built on it.
MAY_IMPORT_DATABASE = {
    "aiofragno",
    "aiofragno.bench",
    "aiofragno.cli",
    "aiofragno.demo",
    "aiofragno.otel",  # traces units run on a Database the user hands it
    "aiofragno.testing",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """The aiofragno modules ``name`` imports, anywhere in its source (a
    ``from package import name`` counts as the submodule when it is one)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.update(
                f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                for alias in node.names
            )
    return (found & MODULES.keys()) - {name}


GRAPH = {name: imports(name) for name in MODULES}


def reachable(start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(GRAPH[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(GRAPH[name])
    return seen


def test_the_graph_sees_the_imports_it_must() -> None:
    # (Guards the parser: a graph that missed imports would pass everything below.)
    assert "aiofragno.database" in GRAPH["aiofragno"]
    assert "aiofragno.engine" in GRAPH["aiofragno.database"]
    assert "aiofragno.engine" in GRAPH["aiofragno.uow.executor"]  # under TYPE_CHECKING
    assert "aiofragno.outbox.writer" in GRAPH["aiofragno.engine"]


@pytest.mark.parametrize("name", sorted(MODULES.keys() - MAY_IMPORT_DATABASE))
def test_features_do_not_import_the_database(name: str) -> None:
    assert "aiofragno.database" not in GRAPH[name], (
        f"{name} imports aiofragno.database: take the engine (aiofragno.engine.Engine) "
        "or the narrower pieces needed, as migrate() does"
    )


@pytest.mark.parametrize("name", ["aiofragno.engine", "aiofragno.database"])
def test_the_engine_and_the_facade_are_on_no_import_cycle(name: str) -> None:
    """Nothing the engine needs, however indirectly, runs on the engine (so
    it sits below every feature); likewise for the facade."""
    cycle = {other for other in reachable(name) if name in GRAPH[other]}
    assert not cycle, f"{name} is on an import cycle through {sorted(cycle)}"


# The plumbing the features used to reach through the Database lives on its
# engine now; undocumented, it left the facade without a deprecation.
MOVED = ("compiler", "codec", "checkout", "checkin", "raw", "catalog", "outbox_statements")


@pytest.mark.anyio
async def test_the_facade_keeps_only_what_users_call(tmp_path: Path) -> None:
    async with af.connect(f"sqlite:///{tmp_path}/seams.db", outbox=True) as db:
        assert [name for name in MOVED if hasattr(db, name)] == []
        # The documented surface still answers, over the engine.
        assert db.stats is db._engine.stats
        assert db.compile(af.sql("SELECT {x}", x=1)).parameters == (1,)
        assert db.layout(af.Schema("seams")).namespace == "seams"
        # db's own statements join the transaction its engine opened: rolled back with it.
        with pytest.raises(RuntimeError, match="roll back"):
            async with db.transaction():
                await db.execute(af.sql("CREATE TABLE seams (x integer)"))
                assert await db.fetch_value(af.sql("SELECT COUNT(*) FROM seams"), int) == 0
                raise RuntimeError("roll back")
        assert await db.fetch_value(af.sql("SELECT COUNT(*) FROM sqlite_master"), int) == 0


@pytest.mark.anyio
async def test_db_adapter_is_deprecated(tmp_path: Path) -> None:
    """The README names the capability flags of "the dialect's adapter", so
    ``db.adapter`` may have been read: it still answers, with a warning."""
    async with af.connect(f"sqlite:///{tmp_path}/adapter.db") as db:
        with pytest.deprecated_call(match="aiofragno doctor"):
            adapter = db.adapter
        assert adapter is db._engine.adapter
        # The README's flags moved into groups; their old names still answer.
        with pytest.deprecated_call(match="capabilities.supports_returning"):
            assert adapter.supports_returning
        with pytest.deprecated_call(match="commit.stale_guard"):
            assert adapter.stale_guard is None
        with pytest.deprecated_call(match="ddl.migration_lock_sql"):
            assert not adapter.supports_advisory_locks


@pytest.mark.anyio
async def test_a_consumer_made_from_the_database_still_works(tmp_path: Path) -> None:
    """``af.Consumer`` is exported and took the Database before the engine
    existed: given one, it warns and reads through the Database's engine."""
    async with af.connect(f"sqlite:///{tmp_path}/consumer.db", outbox=True) as db:
        await db.migrate(af.Schema("seams", af.Table("notes", af.Column("text", "string"))))
        with pytest.deprecated_call(match=r"db\.outbox\.consumer"):
            consumer = af.Consumer(db, "old-style")  # type: ignore[arg-type]
        assert await consumer.position() is None
        assert await consumer.position() == await db.outbox.consumer("old-style").position()


def test_names_that_left_the_session_module_still_answer() -> None:
    """``aiofragno.session`` held the transaction and the query methods; it
    now holds the checked-out connection only. The old imports work, with a
    warning naming the new place."""
    import aiofragno.session as session
    from aiofragno import queries, transaction

    with pytest.deprecated_call(match="aiofragno.transaction.Transaction"):
        assert session.Transaction is transaction.Transaction is af.Transaction
    with pytest.deprecated_call(match="aiofragno.queries.Queries"):
        assert session.Queries is queries.Queries
    with pytest.raises(AttributeError):
        session.Nothing  # noqa: B018
