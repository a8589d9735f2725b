"""Declared schema changes on every backend and runtime (#28 items 2, 3, 6):
one table holding rows goes through every kind of change in one reviewed
plan, with its data kept; the plan's SQL is what runs; a stale plan, a
narrowing, duplicate keys and NULLs without a backfill are refused with
nothing changed; a new index builds online while writes go on; a failed
MySQL migration says where it stopped and is resumed."""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import Namespaces, column_names, setting

pytestmark = pytest.mark.anyio

ROWS = 30


@pytest.fixture
async def spaces(db: af.Database) -> AsyncIterator[Namespaces]:
    made = Namespaces(db)
    yield made
    await made.drop()


def _v1() -> af.Schema:
    return af.Schema(
        "evo",
        af.Table(
            "items",
            af.Column("qty", "integer", default=0),
            af.Column("code", af.varchar(8)),
            af.Column("title", "string"),
            af.Column("label", "string", nullable=True),
            af.Column("flag", "string", default="a"),
            af.Column("legacy", "string", nullable=True),
            af.Column("old_name", "string"),
            af.Index("by_title", ["title"]),
            af.Index("by_flag", ["flag"]),
        ),
        af.Table("tags", af.Reference("item", "items"), af.Column("tag", "string")),
    )


def _v2() -> af.Schema:
    """Every kind of declared change at once."""
    return af.Schema(
        "evo",
        af.Table(
            "items",
            af.Column("qty", "bigint", default=0),  # widened
            af.Column("code", af.varchar(32)),  # widened
            af.Column("title", "string", nullable=True),  # NOT NULL -> NULL
            af.Column("label", "string", backfill="none"),  # NULL -> NOT NULL, backfilled
            af.Column("flag", "string", default="b"),  # default changed
            af.Dropped("legacy"),  # dropped
            af.Column("new_name", "string", renamed_from="old_name"),  # renamed
            af.Index("by_title2", ["title"], renamed_from="by_title"),  # index renamed
            af.Index("by_qty", ["qty"]),  # new index (online where it can be)
            af.Index("by_code", ["code"], unique=True),  # new unique index
            af.Dropped("by_flag", index=True),  # index dropped
        ),
        # (References to the table survive its changes: SQLite rebuilds it.)
        af.Table("tags", af.Reference("item", "items"), af.Column("tag", "string")),
    )


async def _seed(db: af.Database, schema: af.Schema, ns: str) -> None:
    async def fn(uow: af.UnitOfWork) -> None:
        for n in range(ROWS):
            item = uow.create(
                "items",
                {
                    "qty": n,
                    "code": f"c{n:05d}",
                    "title": "dup",
                    "label": None if n % 3 else f"l{n}",
                    "legacy": f"x{n}",
                    "old_name": f"name {n}",
                },
            )
            uow.create("tags", {"item": item, "tag": f"t{n}"})

    await db.execute_uow(fn, schema=schema, namespace=ns)


async def _rows(db: af.Database, schema: af.Schema, ns: str) -> list[dict[str, Any]]:
    async def fn(uow: af.UnitOfWork) -> list[dict[str, Any]]:
        op = uow.find("items", order_by=["qty"])
        await uow.retrieve()
        return list(op.result)

    rows: list[dict[str, Any]] = await db.execute_uow(fn, schema=schema, namespace=ns)
    return rows


async def test_every_declared_change_runs_as_planned_with_the_rows_kept(
    db: af.Database, spaces: Namespaces
) -> None:
    v1, v2 = _v1(), _v2()
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    await _seed(db, v1, ns)
    before = await _rows(db, v1, ns)

    # A refused change refuses the whole plan, naming every reason.
    bad = af.Schema(
        "evo",
        _v1().tables["tags"],
        af.Table(
            "items",
            af.Column("qty", "integer", default=0),
            af.Column("code", af.varchar(4)),  # narrowing
            af.Column("title", "string"),
            af.Column("label", "string"),  # NOT NULL, NULLs, no backfill
            af.Column("flag", "string", default="a"),
            af.Column("old_name", "string"),  # "legacy" left out, not declared dropped
            af.Index("by_title", ["title"], unique=True),  # changed index
            af.Index("by_flag", ["flag"]),
            af.Index("u_title", ["title"], unique=True),  # duplicates
        ),
    )
    spaces.use(db, bad, ns)
    with pytest.raises(af.MigrationError) as info:
        await db.migration_plan(bad, namespace=ns)
    message = str(info.value)
    for part in (
        "column type 'code'",
        "only lossless widening",
        f"column 'label' cannot become NOT NULL: {ROWS - ROWS // 3} rows hold NULL",
        "index 'by_title': declared unique (title), database has (title)",
        f"unique index 'u_title' of table 'items' cannot be built: rows share its key, "
        f"e.g. title='dup' ({ROWS} rows)",
    ):
        assert part in message, (part, message)
    # ("legacy" is nullable: safe to leave, so only left, with a warning.)
    assert "'legacy'" not in message

    plan = await db.migration_plan(v2, namespace=ns)
    assert plan == await db.migration_plan(v2, namespace=ns)  # deterministic
    assert plan.text() == (await db.migration_plan(v2, namespace=ns)).text()
    steps = {(s.what, s.subject): s for s in plan.steps}
    assert steps[("rename column", "old_name -> new_name")].locks
    drop = steps[("drop column", "legacy")]
    assert drop.destructive and "DROP COLUMN" in drop.sql[0]
    new_index = steps[("create index", "by_qty")]
    assert new_index.online == (db.name != "sqlite")
    if db.name == "sqlite":
        [rebuild] = [s for s in plan.steps if s.what == "rebuild table"]
        assert rebuild.rewrites and rebuild.locks
    else:
        assert steps[("alter column", "label")].sql[0].startswith("-- UPDATE")
        assert steps[("alter column", "qty")].rewrites  # integer -> bigint
    assert plan.destructive and f"step {len(plan.steps)}:" in plan.text()
    assert not any(s.destructive for s in plan.steps if s.what != "drop column")
    assert not steps[("drop index", layout.index_name("items", "by_flag"))].destructive

    # A plan read back from its JSON runs, and exactly its SQL runs.
    reviewed = af.MigrationPlan.from_json(plan.to_json())
    assert reviewed.id == plan.id
    spaces.use(db, v2, ns)
    result = await db.migrate(v2, namespace=ns, plan=reviewed)
    assert result.statements == plan.statements and result.plan == plan
    assert result.version == 2

    after = await _rows(db, v2, ns)
    assert [r["id"] for r in after] == [r["id"] for r in before]
    for old, new in zip(before, after, strict=True):
        assert new["new_name"] == old["old_name"] and "old_name" not in new
        assert (new["qty"], new["code"], new["title"]) == (old["qty"], old["code"], "dup")
        assert new["label"] == (old["label"] or "none")
        assert new["flag"] == "a"  # (written when created: a new default changes no row)
    physical = layout.table("items")
    assert "legacy" not in await column_names(db, physical)
    live_items = (await db.inspect(namespace=ns)).table("items")
    assert live_items is not None
    assert layout.index_name("items", "by_flag") not in {i.name for i in live_items.indexes}
    tags = await db.execute_uow(_tags, schema=v2, namespace=ns)
    assert sorted(tags) == sorted((r["id"], f"t{r['qty']}") for r in after)
    [record] = await setting(db, f"{ns}.dropped:items.legacy")
    assert json.loads(record)["kind"] == "column"
    # The database now is the declaration: nothing left to plan, no drift.
    again = await db.migration_plan(v2, namespace=ns)
    assert again.steps == () and again.statements == []

    # What the widened types and the new defaults hold now.
    async def write(uow: af.UnitOfWork) -> af.RowId:
        return uow.create("items", {"qty": 2**40, "code": "c" * 32, "label": "l", "new_name": "n"})

    new_id = await db.execute_uow(write, schema=v2, namespace=ns)
    [row] = [r for r in await _rows(db, v2, ns) if r["id"] == new_id]
    assert (row["qty"], row["code"], row["title"], row["flag"]) == (2**40, "c" * 32, None, "b")

    async def duplicate(uow: af.UnitOfWork) -> None:
        uow.create("items", {"code": "c00001", "label": "l", "new_name": "n"})

    with pytest.raises(af.UniqueViolation):
        await db.execute_uow(duplicate, schema=v2, namespace=ns)

    # The reference is still enforced (on SQLite: foreign keys back on after the rebuild).
    await _refuses_dangling(db, layout.table("tags").identifier, "item", ("tag", "x"))

    # A plan made before the database changed is refused, nothing run.
    v3 = af.Schema(
        "evo",
        af.Table(
            "items", *v2.tables["items"].columns.values(), *v2.tables["items"].indexes.values()
        ),
        af.Table("more", af.Column("x", "string", nullable=True)),
    )
    stale = await db.migration_plan(v3, namespace=ns)
    await db.execute(
        af.sql(
            "ALTER TABLE {t} ADD COLUMN {c} integer",
            t=physical.identifier,
            c=af.Identifier("by_hand"),
        )
    )
    spaces.use(db, v3, ns)
    with pytest.raises(af.MigrationError, match="the database changed since it was made"):
        await db.migrate(v3, namespace=ns, plan=stale)
    assert "more" not in {t.table for t in (await db.inspect(namespace=ns)).tables}
    # A column added by hand is left (nullable), or dropped when allowed.
    left = await db.migrate(v3, namespace=ns)
    assert {d.name for d in left.left} == {"by_hand"}
    assert "by_hand" in await column_names(db, physical)
    await db.migrate(v3, namespace=ns, allow_drop={"items.by_hand"})
    assert "by_hand" not in await column_names(db, physical)
    with pytest.raises(af.ValidationError, match="allow_drop must be"):
        await db.migrate(v3, namespace=ns, allow_drop="items.by_hand")  # type: ignore[arg-type]


async def test_dropping_the_index_a_reference_uses_keeps_the_reference(
    db: af.Database, spaces: Namespaces
) -> None:
    """MariaDB and MySQL keep an index for each foreign key: a reference's
    only index ((author, n) here, which took the place of the one made with
    the key) could not be dropped (error 1553), and the migration stopped
    half done. It now gives the key an index of its own first, which the
    next migration leaves alone; the reference stays enforced."""

    def posts(*indexes: af.Index) -> af.Schema:
        return af.Schema(
            "fkidx",
            af.Table("users", af.Column("email", "string")),
            af.Table("posts", af.Reference("author", "users"), af.Column("n", "bigint"), *indexes),
        )

    both = posts(af.Index("by_author", ["author", "n"]), af.Index("by_n", ["author"], unique=False))
    other = posts(af.Index("by_other", ["author"]))
    with_index, without = posts(af.Index("by_author", ["author", "n"], unique=True)), posts()
    layout = spaces.use(db, with_index)
    ns = layout.namespace
    for before in (with_index, both):  # (one index on author, then two, both dropped)
        await db.migrate(before, namespace=ns)
        drop = {f"posts.{name}" for name in before.tables["posts"].indexes}

        async def seed(uow: af.UnitOfWork) -> None:
            uow.create("posts", {"author": uow.create("users", {"email": "a@x"}), "n": 1})

        await db.execute_uow(seed, schema=before, namespace=ns)
        # No index of its own where one made before the drop serves the key.
        plan = await db.migration_plan(other, namespace=ns, allow_drop=drop)
        assert not [sql for sql in plan.statements if "fk_" in sql]
        # Nor for a reference that goes with its index (planned here; run by
        # test_dropping_a_reference_column_drops_its_key).
        gone = af.Schema(
            "fkidx", without.tables["users"], af.Table("posts", af.Column("n", "bigint"))
        )
        plan = await db.migration_plan(gone, namespace=ns, allow_drop=True)
        assert not [sql for sql in plan.statements if "CREATE INDEX" in sql and "fk_" in sql]
        await db.migrate(without, namespace=ns, allow_drop=drop)
        assert not (await db.migration_plan(without, namespace=ns)).steps
        await _refuses_dangling(db, layout.table("posts").identifier, "author", ("n", 1))


def _posts(*items: af.Column | af.Index | af.Dropped) -> af.Schema:
    return af.Schema(
        "refdrop",
        af.Table("users", af.Column("email", "string")),
        af.Table("posts", af.Column("n", "bigint"), *items),
    )


@pytest.mark.parametrize("index", ["none", "dropped before", "dropped with it"])
async def test_dropping_a_reference_column_drops_its_key(
    db: af.Database, spaces: Namespaces, index: str
) -> None:
    """A reference column declared af.Dropped goes with its foreign key
    (MariaDB refused with error 1553, SQLite with "unknown column in foreign
    key definition"). The key is dropped in the statement that drops the
    column, and on MariaDB the index kept for the key goes with the column
    (the key's own, ``fk_...``, after an earlier migration dropped the
    declared one); on MariaDB the key goes instead just before a dropped
    index it may be using; SQLite rebuilds the table without the key first.
    A reference column left undeclared keeps its key, and nothing is left
    to migrate."""
    author = af.Reference("author", "users")
    editor = af.Reference("editor", "users", nullable=True)
    by_author = [] if index == "none" else [af.Index("by_author", ["author", "n"])]
    v1 = _posts(author, editor, *by_author)
    with_it = [af.Dropped("by_author", index=True)] if index == "dropped with it" else []
    v2 = _posts(af.Dropped("author"), *with_it)  # ("editor" left out: nullable, so left)
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    if index == "dropped before":
        await db.migrate(_posts(author, editor, af.Dropped("by_author", index=True)), namespace=ns)

    async def seed(uow: af.UnitOfWork) -> None:
        ann, bob = uow.create("users", {"email": "ann"}), uow.create("users", {"email": "bob"})
        for n, edited_by in enumerate((None, bob, ann)):
            uow.create("posts", {"author": ann, "editor": edited_by, "n": n})

    await db.execute_uow(seed, schema=v1, namespace=ns)
    plan = await db.migration_plan(v2, namespace=ns)
    spaces.use(db, v2, ns)
    result = await db.migrate(v2, namespace=ns, plan=plan)
    # (The plan that ran.)
    titles = [s.title for s in plan.steps]
    drop = next(s for s in plan.steps if s.what == "drop column")
    assert drop.subject == "author" and drop.destructive
    key = layout.foreign_key_name("posts", "author")
    if db.name == "sqlite":  # (keys have no names there, and none is dropped in place)
        rebuild = "rebuild table posts.author (reference dropped) [locks table, REWRITES TABLE]"
        assert titles.index(rebuild) < titles.index(drop.title)
        assert drop.sql[0] == f'ALTER TABLE "{layout.table("posts").name}" DROP COLUMN "author"'
    elif db.name == "mysql" and index == "dropped with it":
        # (The index may be the key's: both go in its statement, or neither.)
        [step] = [s for s in plan.steps if s.what == "drop index"]
        statement = step.sql[0]  # (then the drop's record)
        assert f"DROP FOREIGN KEY `{key}`, DROP INDEX `" in statement
        assert key not in drop.sql[0]
    else:  # (one statement: the key and the column go together, or neither does)
        clause = "DROP FOREIGN KEY `" if db.name == "mysql" else 'DROP CONSTRAINT "'
        assert f"{clause}{key}" in drop.sql[0] and "DROP COLUMN" in drop.sql[0]
    if db.name != "sqlite":
        assert not [title for title in titles if title.startswith("rebuild")]

    assert [d.name for d in result.left] == ["editor"]
    live = (await db.inspect(namespace=ns)).table("posts")
    assert live is not None and live.column("author") is None
    assert [k.columns for k in live.references] == [("editor",)]
    assert not [i.name for i in live.indexes if "author" in i.columns]
    assert (await db.migration_plan(v2, namespace=ns)).steps == ()  # no drift left
    posts = layout.table("posts").identifier
    rows = await db.fetch(af.sql("SELECT n FROM {t} ORDER BY n", t=posts))
    assert [row["n"] for row in rows] == [0, 1, 2]
    await _refuses_dangling(db, posts, "editor", ("n", 9))


async def test_a_renamed_reference_keeps_its_key(db: af.Database, spaces: Namespaces) -> None:
    """renamed_from= on an af.Reference renames the column, which keeps its
    foreign key (it was refused: "reference of column ...: database has
    none") — also where an index is renamed with it or holds it, and, in a
    second migration, where the table it points to and a column of that
    table are renamed at the same time. The rows keep their references, a
    dangling one is refused, and nothing is left to migrate."""
    users = af.Table("users", af.Column("email", "string"))
    v1 = af.Schema(
        "refren",
        users,
        af.Table(
            "posts",
            af.Reference("author", "users"),
            af.Reference("editor", "users", nullable=True),
            af.Column("n", "bigint", nullable=True),
            af.Index("by_author", ["author"]),
            af.Index("by_editor_n", ["editor", "n"]),
        ),
    )
    v2 = af.Schema(
        "refren",
        users,
        af.Table(
            "posts",
            af.Reference("writer", "users", renamed_from="author"),
            af.Reference("reviewer", "users", nullable=True, renamed_from="editor"),
            af.Column("n", "bigint", nullable=True),
            af.Index("by_writer", ["writer"], renamed_from="by_author"),
            af.Index("by_editor_n", ["reviewer", "n"]),
        ),
    )
    v3 = af.Schema(
        "refren",
        af.Table("people", af.Column("mail", "string", renamed_from="email"), renamed_from="users"),
        af.Table(
            "posts",
            af.Reference("creator", "people", renamed_from="writer"),
            af.Reference("reviewer", "people", nullable=True),
            af.Column("n", "bigint", nullable=True),
            af.Index("by_writer", ["creator"]),
            af.Index("by_editor_n", ["reviewer", "n"]),
        ),
    )
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)

    async def seed(uow: af.UnitOfWork) -> None:
        ann, bob = uow.create("users", {"email": "ann"}), uow.create("users", {"email": "bob"})
        uow.create("posts", {"author": ann, "editor": bob, "n": 1})
        uow.create("posts", {"author": bob, "editor": None, "n": 2})

    await db.execute_uow(seed, schema=v1, namespace=ns)
    posts = layout.table("posts").identifier
    renames = {"rename table", "rename column", "rename index", "record"}
    for schema, (was, writer), (to, email) in (
        (v2, ("author", "writer"), ("users", "email")),
        (v3, ("writer", "creator"), ("people", "mail")),
    ):
        new = spaces.use(db, schema, ns)
        plan = await db.migration_plan(schema, namespace=ns)
        assert {s.what for s in plan.steps} <= renames
        assert ("rename column", f"{was} -> {writer}") in {(s.what, s.subject) for s in plan.steps}
        await db.migrate(schema, namespace=ns, plan=plan)
        assert await db.migration_sql(schema, namespace=ns) == []  # no drift left

        async def read(uow: af.UnitOfWork, writer: str = writer, email: str = email) -> list[Any]:
            op = uow.find("posts", order_by=["n"], join={"by": af.one(writer)})
            await uow.retrieve()
            return [(r["n"], r["by"][email]) for r in op.result]

        assert await db.execute_uow(read, schema=schema, namespace=ns) == [(1, "ann"), (2, "bob")]
        live = (await db.inspect(namespace=ns)).table("posts")
        assert live is not None
        target = new.table(to).name
        keys = {(k.columns, k.to_table, k.to_columns) for k in live.references}
        assert keys == {((c,), target, ("_id",)) for c in (writer, "reviewer")}
        await _refuses_dangling(db, posts, writer, ("n", 9))
        user = af.sql("SELECT MIN(_id) FROM {t}", t=new.table(to).identifier)
        await _refuses_dangling(db, posts, "reviewer", (writer, await db.fetch_value(user)))


async def _refuses_dangling(
    db: af.Database, table: af.Identifier, reference: str, other: tuple[str, Any]
) -> None:
    """A row of ``table`` whose ``reference`` names no row is refused: the
    reference is enforced. (``other``: a required column and its value.)"""
    with pytest.raises(af.ForeignKeyViolation):
        await db.execute(
            af.sql(
                "INSERT INTO {t} ({i}, {r}, {o}) VALUES ('dangling', 987654321, {v})",
                t=table,
                i=af.Identifier("id"),
                r=af.Identifier(reference),
                o=af.Identifier(other[0]),
                v=other[1],
            )
        )


async def _tags(uow: af.UnitOfWork) -> list[tuple[str, str]]:
    op = uow.find("tags", join={"of": af.one("item")})
    await uow.retrieve()
    return [(r["of"]["id"], r["tag"]) for r in op.result]


async def test_a_new_index_builds_online_while_writes_go_on(
    db: af.Database, spaces: Namespaces
) -> None:
    """PostgreSQL builds it concurrently outside the transaction, MariaDB in
    place without a lock: writes to the table keep succeeding meanwhile, and
    a second migrator at the same time neither deadlocks nor builds twice."""
    v1 = af.Schema("big", af.Table("events", af.Column("n", "bigint")))
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    v2 = af.Schema("big", af.Table("events", af.Column("n", "bigint"), af.Index("by_n", ["n"])))
    [step] = [s for s in (await db.migration_plan(v2, namespace=ns)).steps if s.what != "record"]
    if db.name == "sqlite":
        # (One writer at a time: the build is a plain, locking one.)
        assert step.locks and not step.online
        return
    assert step.online and not step.locks
    table = layout.table("events").identifier
    await db.execute(_fill_sql(db, table, 100_000))
    written: list[tuple[float, float]] = []  # (start, seconds) of each write
    done = anyio.Event()

    async def writer() -> None:
        n = 0
        while not done.is_set():
            n += 1
            start = time.perf_counter()
            await db.execute(
                af.sql(
                    "INSERT INTO {t} ({i}, {n}) VALUES ({v}, {k})",
                    t=table,
                    i=af.Identifier("id"),
                    n=af.Identifier("n"),
                    v=f"w{n}",
                    k=-n,
                )
            )
            written.append((start, time.perf_counter() - start))

    spaces.use(db, v2, ns)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        await anyio.sleep(0.05)
        began = time.perf_counter()
        # Two migrators at once: one builds, the other waits for it (a build
        # waits for older transactions: no migrator's wait may be one).
        async with anyio.create_task_group() as migrators:
            for _ in range(2):
                migrators.start_soon(functools.partial(db.migrate, v2, namespace=ns))
        ended = time.perf_counter()
        done.set()
    during = [seconds for start, seconds in written if began <= start < ended]
    print(
        f"{db.name}: online index over 100000 rows built in {ended - began:.2f} s; "
        f"{len(during)} writes meanwhile, slowest {max(during, default=0):.3f} s"
    )
    assert len(during) >= 5, (len(during), ended - began)
    assert max(during) < max(0.5, (ended - began) / 2)
    live = await db.inspect(namespace=ns)
    events = live.table("events")
    assert events is not None
    index = layout.index_name("events", "by_n")
    assert index in {i.name for i in events.indexes}
    count = await db.fetch_value(af.sql("SELECT COUNT(*) AS n FROM {t}", t=table))
    assert count == 100_000 + len(written)


def _fill_sql(db: af.Database, table: af.Identifier, rows: int) -> af.Fragment:
    names = {"t": table, "i": af.Identifier("id"), "n": af.Identifier("n"), "rows": rows}
    if db.name == "postgresql":
        return af.sql(
            "INSERT INTO {t} ({i}, {n}) SELECT 'r' || g, g FROM generate_series(1, {rows}) g",
            **names,
        )
    # (Digits crossed: the server may cap recursive CTEs at 1000 rows.)
    return af.sql(
        "INSERT INTO {t} ({i}, {n}) WITH RECURSIVE d(k) AS (SELECT 0 UNION ALL "
        "SELECT k + 1 FROM d WHERE k < 9), s(g) AS (SELECT 1 + a.k + 10 * b.k + 100 * c.k "
        "+ 1000 * e.k + 10000 * f.k + 100000 * h.k FROM d a, d b, d c, d e, d f, d h) "
        "SELECT CONCAT('r', g), g FROM s WHERE g <= {rows}",
        **names,
    )


async def test_a_failed_migration_says_where_it_stopped_and_resumes(
    db: af.Database, spaces: Namespaces
) -> None:
    """A table the migration must alter is held by another transaction: on
    MySQL (no transactional DDL) the steps before it stay applied, the error
    and the settings table say where it stopped, and migrating again
    finishes."""
    if db.name != "mysql":
        pytest.skip(
            "transactional DDL: a failed migration changes nothing (test_names_and_ownership)"
        )
    tables = ("a", "b")
    v1 = af.Schema("res", *(af.Table(t, af.Column("x", "string")) for t in tables))
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    v2 = af.Schema(
        "res",
        *(
            af.Table(t, af.Column("x", "string"), af.Column("y", "string", nullable=True))
            for t in tables
        ),
    )
    spaces.use(db, v2, ns)
    b = layout.table("b")
    async with db.transaction() as tx:
        await tx.execute(af.sql("SELECT COUNT(*) AS n FROM {t}", t=b.identifier))
        with pytest.raises(af.MigrationError) as info:
            await db.migrate(v2, namespace=ns, lock_timeout=1)
    message = str(info.value)
    assert "waited lock_timeout=1 s for a lock" in message
    assert "stopped at step 2 of" in message and "add column b.y" in message
    assert "Steps 1 to 1 are applied" in message and "migrate again" in message
    assert "y" in await column_names(db, layout.table("a"))
    [progress] = await setting(db, f"{ns}.migration_progress")
    assert json.loads(progress)["done"] == 1
    resumed = await db.migrate(v2, namespace=ns)
    assert [(s.what, s.table) for s in resumed.plan.steps if s.what != "record"] == [
        ("add column", "b")
    ]
    assert "y" in await column_names(db, b)
    final = json.loads((await setting(db, f"{ns}.migration_progress"))[0])
    assert final["done"] == final["of"] == len(resumed.plan.steps) and final["note"] == ""


async def test_a_renamed_table_keeps_its_rows_indexes_and_references(
    db: af.Database, spaces: Namespaces
) -> None:
    def schema(name: str, renamed_from: str | None = None) -> af.Schema:
        # (Renamed, the table's rows are checked under its former name, and
        # an index it drops is found by its name after the former one.)
        nick = (
            [af.Column("nick", "string", nullable=True), af.Index("by_nick", ["nick"])]
            if renamed_from is None
            else [
                af.Column("nick", "string", backfill="-"),
                af.Index("by_id", ["id"], unique=True),
                af.Dropped("by_nick", index=True),
            ]
        )
        return af.Schema(
            "ren",
            af.Table(
                name,
                af.Column("name", "string"),
                af.Index("by_name", ["name"], unique=True),
                *nick,
                renamed_from=renamed_from,
            ),
            af.Table("pets", af.Reference("owner", name), af.Column("pet", "string")),
        )

    v1, v2 = schema("owners"), schema("people", renamed_from="owners")
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)

    async def seed(uow: af.UnitOfWork) -> list[af.RowId]:
        ids = [uow.create("owners", {"name": n}) for n in ("ann", "bob")]
        for owner, pet in zip(ids, ("cat", "dog"), strict=True):
            uow.create("pets", {"owner": owner, "pet": pet})
        return ids

    ids = await db.execute_uow(seed, schema=v1, namespace=ns)
    new = spaces.use(db, v2, ns)
    plan = await db.migration_plan(v2, namespace=ns)
    changes = [(s.what, s.subject) for s in plan.steps if s.what != "record"]
    renamed = [
        ("rename index", f"{layout.index_name('owners', n)} -> {new.index_name('people', n)}")
        for n in ("by_name", "by_nick")  # (the one to drop too: it is the table's)
    ]
    assert changes[:3] == [("rename table", "owners -> people"), *renamed]
    assert changes[3][0] in ("alter column", "rebuild table")
    assert set(changes[4:]) == {
        ("create index", "by_id"),
        ("drop index", new.index_name("people", "by_nick")),
    }
    await db.migrate(v2, namespace=ns, plan=plan)
    assert await db.migration_sql(v2, namespace=ns) == []  # no drift left
    people = (await db.inspect(namespace=ns)).table("people")
    assert people is not None and not [i for i in people.indexes if "by_nick" in i.name]

    async def pets(uow: af.UnitOfWork) -> list[tuple[str, str, str]]:
        op = uow.find("pets", order_by=["pet"], join={"of": af.one("owner")})
        await uow.retrieve()
        return [(r["pet"], r["of"]["id"], r["of"]["name"]) for r in op.result]

    async def nicks(uow: af.UnitOfWork) -> list[str]:
        op = uow.find("people", order_by=["name"])
        await uow.retrieve()
        return [r["nick"] for r in op.result]

    assert await db.execute_uow(nicks, schema=v2, namespace=ns) == ["-", "-"]
    rows = await db.execute_uow(pets, schema=v2, namespace=ns)
    assert rows == [("cat", ids[0], "ann"), ("dog", ids[1], "bob")]
    assert await setting(db, f"{ns}.table:owners") == []
    assert json.loads((await setting(db, f"{ns}.table:people"))[0])["name"] == str(
        new.table("people").name
    )
    assert {t.table for t in (await db.inspect(namespace=ns)).tables} == {"people", "pets"}


async def test_an_invalid_index_left_by_a_failed_build_is_built_again(
    db: af.Database, spaces: Namespaces
) -> None:
    """PostgreSQL: a CREATE INDEX CONCURRENTLY that failed leaves an invalid
    index behind; it is not taken for the declared index, but dropped and
    built again."""
    if db.name != "postgresql":
        pytest.skip("only PostgreSQL builds indexes outside the transaction")
    v1 = af.Schema("inv", af.Table("t", af.Column("n", "integer")))
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    table = layout.table("t").identifier
    await db.execute(af.sql("INSERT INTO {t} (id, n) VALUES ('a', 1), ('b', 1)", t=table))
    index = layout.index_name("t", "by_n")
    with pytest.raises(af.UniqueViolation):  # (as a crashed unique build would)
        await db.execute(
            af.sql(
                "CREATE UNIQUE INDEX CONCURRENTLY {i} ON {t} (n)",
                i=af.Identifier(index),
                t=table,
            )
        )
    v2 = af.Schema("inv", af.Table("t", af.Column("n", "integer"), af.Index("by_n", ["n"])))
    spaces.use(db, v2, ns)
    [step] = [s for s in (await db.migration_plan(v2, namespace=ns)).steps if s.what != "record"]
    assert step.sql[0] == f"-- drop index {index} if an interrupted build left it invalid"
    await db.migrate(v2, namespace=ns)
    valid = await db.fetch_value(
        af.sql(
            "SELECT bool_and(x.indisvalid AND NOT x.indisunique) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_namespace s "
            "ON s.oid = i.relnamespace WHERE i.relname = {n} "
            "AND s.nspname = COALESCE({s}, current_schema())",
            n=index,
            s=layout.table("t").schema,
        )
    )
    assert valid is True
    assert await db.migration_sql(v2, namespace=ns) == []


async def test_a_migration_during_an_online_build_neither_deadlocks_nor_fails(
    db: af.Database, url: str, target: Any, spaces: Namespaces
) -> None:
    """PostgreSQL: while one migrator builds an index online (``CREATE INDEX
    CONCURRENTLY``, which waits for every transaction older than it), others
    migrate the same table (a new column: ``ALTER TABLE``, which waits for
    the build's lock) and another namespace. A migration transaction waiting
    for the build, which waits for it, was a deadlock (40P01) that failed
    one of them; now a migration waits for running builds before its
    transaction begins, and all of them succeed."""
    if db.name != "postgresql":
        pytest.skip("only PostgreSQL builds outside the migration's transaction")
    events = [af.Column("n", "bigint")]
    v1 = af.Schema("big", af.Table("events", *events))
    layout = spaces.use(db, v1)
    ns = layout.namespace
    other = spaces.use(db, v1).namespace
    await db.migrate(v1, namespace=ns)
    await db.execute(_fill_sql(db, layout.table("events").identifier, 300_000))
    v2 = af.Schema("big", af.Table("events", *events, af.Index("by_n", ["n"])))
    more = af.Column("m", "bigint", nullable=True)
    v3 = af.Schema("big", af.Table("events", *events, more, af.Index("by_n", ["n"])))
    spaces.use(db, v3, ns)
    building = af.sql(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE query LIKE {p} AND state = 'active'",
        p="CREATE %INDEX CONCURRENTLY%",
    )
    async with (
        af.connect(url, backend=target.backend) as builder,
        af.connect(url, backend=target.backend) as alterer,
    ):
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(builder.migrate, v2, namespace=ns))
                await _until(lambda: db.fetch_value(building))
                tg.start_soon(functools.partial(alterer.migrate, v3, namespace=ns))
                tg.start_soon(functools.partial(db.migrate, v3, namespace=other))
    for namespace in (ns, other):
        live = (await db.inspect(namespace=namespace)).table("events")
        assert live is not None and "m" in {c.name for c in live.columns}
        assert layout.index_name("events", "by_n") in {i.name for i in live.indexes}
    assert await db.migration_sql(v3, namespace=ns) == []


async def _until(check: Any) -> None:
    """Poll ``check()`` (awaitable) until it is true."""
    for _ in range(20_000):
        if await check():
            return
        await anyio.sleep(0.005)
    raise AssertionError("never happened")


async def test_a_reviewed_plan_names_the_values_it_binds(
    db: af.Database, spaces: Namespaces
) -> None:
    """A backfill (and a default written into existing rows) is bound, not
    written into the SQL: the plan shows the value and its id covers it, so
    a plan reviewed with one value never runs with another."""

    def declared(backfill: str, default: Any) -> af.Schema:
        return af.Schema(
            "fill",
            af.Table(
                "t",
                af.Column("label", "string", backfill=backfill),
                af.Column("at", "timestamp", default=default),
            ),
        )

    v1 = af.Schema("fill", af.Table("t", af.Column("label", "string", nullable=True)))
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    await db.execute(
        af.sql(
            "INSERT INTO {t} ({i}, {c}) VALUES ('r1', NULL)",
            t=layout.table("t").identifier,
            i=af.Identifier("id"),
            c=af.Identifier("label"),
        )
    )
    noon = dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)
    reviewed = await db.migration_plan(declared("reviewed", noon), namespace=ns)
    assert "'reviewed'" in reviewed.text()
    for other in (declared("other", noon), declared("reviewed", noon + dt.timedelta(hours=1))):
        made = await db.migration_plan(other, namespace=ns)
        assert made.text() != reviewed.text() and made.id != reviewed.id
        spaces.use(db, other, ns)
        with pytest.raises(af.MigrationError, match="refusing to run migration plan"):
            await db.migrate(other, namespace=ns, plan=reviewed)
    spaces.use(db, declared("reviewed", noon), ns)
    await db.migrate(declared("reviewed", noon), namespace=ns, plan=reviewed)
    [row] = await db.fetch(af.sql("SELECT * FROM {t}", t=layout.table("t").identifier))
    assert row["label"] == "reviewed"


async def test_a_reviewed_plan_runs_only_for_its_declaration(
    db: af.Database, spaces: Namespaces
) -> None:
    """Two declarations whose migrations run the same statements — they
    differ in a default that the client writes, not the database — still
    make plans of different ids: a plan runs for the declaration it was
    made for, whose hash it records."""

    def declared(default: bytes) -> af.Schema:
        return af.Schema("hashed", af.Table("t", af.Column("b", "binary", default=default)))

    v1 = declared(b"one")
    layout = spaces.use(db, v1)
    ns = layout.namespace
    await db.migrate(v1, namespace=ns)
    reviewed = await db.migration_plan(declared(b"two"), namespace=ns)
    other = await db.migration_plan(declared(b"three"), namespace=ns)
    assert reviewed.statements == other.statements
    assert reviewed.id != other.id
    with pytest.raises(af.MigrationError, match="another declaration"):
        await db.migrate(declared(b"three"), namespace=ns, plan=reviewed)
    assert (await db.migrate(declared(b"two"), namespace=ns, plan=reviewed)).version == 2
    [stored] = await setting(db, f"{ns}.schema_hash")
    assert stored == declared(b"two").fingerprint
