"""Writes by unique key on every backend and runtime: ``uow.upsert`` (its
result, its outbox mutation, its checked forms), ``uow.check_absent``,
``uow.conflict_on_unique``, what they refuse before any SQL, and both under
concurrent writers of the same key."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import new_namespace
from tests.conformance.uow_env import Env, SentBatches, drop_namespace
from tests.conftest import Target

pytestmark = pytest.mark.anyio

KEYS = af.Schema(
    "keys",
    af.Table(
        "counters",
        af.Column("name", "string"),
        af.Column("count", "bigint", default=0),
        af.Column("email", "string", nullable=True),
        af.Column("note", "string", nullable=True),
        af.Index("by_name", ["name"], unique=True),
        af.Index("by_email", ["email"], unique=True),
        af.Index("by_note", ["note"]),
    ),
    af.Table(
        "tags",
        af.Reference("counter", "counters"),
        af.Column("label", "string"),
        af.Column("uses", "bigint", default=0),
        af.Index("by_counter_label", ["counter", "label"], unique=True),
    ),
    af.Table(  # one unique index: on MySQL, an upsert here is two statements
        "singles",
        af.Column("name", "string"),
        af.Column("count", "bigint", default=0),
        af.Column("code", "bigint", nullable=True),
        af.Index("by_name", ["name"], unique=True),
    ),
)
PATIENT = af.ExponentialBackoff(max_retries=200, initial=0.001, maximum=0.02)


@pytest.fixture
async def keys(url: str, target: Target) -> AsyncIterator[Env]:
    async with af.connect(url, backend=target.backend, outbox=True, pool_size=8) as db:
        env = Env(db, KEYS, new_namespace())
        await db.migrate(KEYS, namespace=env.namespace)
        try:
            yield env
        finally:
            await drop_namespace(db, KEYS, env.namespace)


async def mutations(env: Env, start: str | None) -> list[dict[str, Any]]:
    """The outbox mutations of ``env``'s namespace since ``start``."""
    entries = await env.db.outbox.list(after=start, limit=1000)
    return [
        m
        for entry in entries
        for m in entry.payload["mutations"]
        if m["namespace"] == env.namespace
    ]


async def row_of(env: Env, name: str) -> dict[str, Any] | None:
    async def read(uow: af.UnitOfWork) -> Any:
        found = uow.find_first("counters", where={"name": name})
        await uow.retrieve()
        return found.result

    return await env.run(read)


async def test_upsert_creates_then_updates_and_the_outbox_says_which(keys: Env) -> None:
    start = await keys.db.outbox.latest()

    def upsert(count: int) -> Any:
        async def unit(uow: af.UnitOfWork) -> af.Upserted:
            return uow.upsert("counters", {"name": "a", "count": count, "note": "n"}, on="by_name")

        return unit

    first = await keys.run(upsert(1))
    assert first.created and first.result.version == 0
    second = await keys.run(upsert(2))
    assert not second.created
    assert second.result == first.result and second.result.version == 1
    row = await row_of(keys, "a")
    assert row is not None and row["count"] == 2 and row["id"].version == 1
    assert row["id"].internal_id == second.result.internal_id
    # By its columns, updating only "count".
    third = await keys.run(
        lambda uow: _ret(
            uow.upsert(
                "counters", {"name": "a", "count": 3, "note": "x"}, on=["name"], update=["count"]
            )
        )
    )
    assert (third.created, third.result.version) == (False, 2)
    row = await row_of(keys, "a")
    assert row is not None and (row["count"], row["note"]) == (3, "n")

    created, updated, narrowed = await mutations(keys, start)
    assert created["op"] == "create" and created["external_id"] == first.result
    assert created["values"] == {"name": "a", "count": 1, "email": None, "note": "n"}
    assert updated["op"] == "update" and updated["external_id"] == first.result
    assert updated["set"] == {"count": 2, "note": "n"}
    assert narrowed["op"] == "update" and narrowed["set"] == {"count": 3}


def _ret(value: Any) -> Any:
    async def done() -> Any:
        return value

    return done()


async def test_upsert_by_a_key_with_a_reference_and_next_to_other_writes(keys: Env) -> None:
    start = await keys.db.outbox.latest()

    async def unit(uow: af.UnitOfWork) -> tuple[af.RowId, af.Upserted, af.Upserted]:
        counter = uow.create("counters", {"name": "c"})
        one = uow.upsert(
            "tags", {"counter": counter, "label": "x", "uses": 1}, on="by_counter_label"
        )
        again = uow.upsert(
            "tags", {"counter": counter, "label": "x", "uses": 5}, on="by_counter_label"
        )
        return counter, one, again

    counter, one, again = await keys.run(unit)
    assert (one.created, again.created) == (True, False)
    assert again.result == one.result and again.result.version == 1
    [tag] = await keys.find("tags")
    assert (tag["counter"], tag["uses"]) == (counter, 5)
    kinds = [(m["op"], m["table"]) for m in await mutations(keys, start)]
    assert kinds == [("create", "counters"), ("create", "tags"), ("update", "tags")]


async def test_upserts_by_other_keys_travel_together_with_the_same_outcome(
    keys: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the database has data-modifying WITH (PostgreSQL), upserts by
    other keys of one unique index are one statement, returning each one's
    row; an upsert of a key already in the run starts another. Each result,
    row version and outbox mutation is what the upserts one by one give; a
    collision on another unique index fails as it would alone (then as a
    conflict where the unit counts it so)."""
    start = await keys.db.outbox.latest()
    await keys.create("counters", {"name": "a", "count": 1})
    sent = SentBatches(monkeypatch)

    async def unit(uow: af.UnitOfWork) -> list[af.Upserted]:
        names = [("a", 2), ("c", 3), ("a", 4), ("b", 5)]
        return [uow.upsert("counters", {"name": n, "count": c}, on="by_name") for n, c in names]

    a, c, again, b = await keys.run(unit)
    combined = keys.db._engine.adapter.capabilities.supports_writable_cte
    together = [b for b in sent.batches if len(b) == 1 and b[0].startswith("WITH q0 AS")]
    assert len(together) == (2 if combined else 0)
    assert [(u.created, u.result.version) for u in (a, c, again, b)] == [
        (False, 1),
        (True, 0),
        (False, 2),
        (True, 0),
    ]
    assert again.result == a.result and len({a.result, c.result, b.result}) == 3
    rows = await keys.find("counters", order_by="name")
    assert [(r["name"], r["count"], r["id"].version) for r in rows] == [
        ("a", 4, 2),
        ("b", 5, 0),
        ("c", 3, 0),
    ]
    assert [r["id"].internal_id for r in rows] == [
        a.result.internal_id,
        b.result.internal_id,
        c.result.internal_id,
    ]
    kinds = [(m["op"], m["external_id"]) for m in await mutations(keys, start)]
    assert kinds == [
        ("create", a.result),
        ("update", a.result),
        ("create", c.result),
        ("update", a.result),
        ("create", b.result),
    ]
    before = await keys.snapshot()

    def collide(*indexes: str) -> Any:
        async def unit(uow: af.UnitOfWork) -> None:
            if indexes:
                uow.conflict_on_unique("counters", *indexes)
            uow.upsert("counters", {"name": "x", "email": "same@x"}, on="by_name")
            uow.upsert("counters", {"name": "y", "email": "same@x"}, on="by_name")

        return unit

    with pytest.raises(af.UniqueViolation):
        await keys.run(collide())
    with pytest.raises(af.ConcurrencyConflict):
        await keys.run(collide("by_email"), retry=af.NoRetry())
    assert await keys.snapshot() == before


async def test_upsert_refuses_bad_input_before_any_sql(keys: Env) -> None:
    cases: list[tuple[Any, str]] = [
        (lambda u: u.upsert("nope", {"name": "a"}, on="by_name"), "no table"),
        (lambda u: u.upsert("counters", {"name": "a", "bogus": 1}, on="by_name"), "bogus"),
        (lambda u: u.upsert("counters", {"name": "a"}, on="by_nothing"), "no index"),
        (lambda u: u.upsert("counters", {"name": "a", "note": "n"}, on="by_note"), "not unique"),
        (lambda u: u.upsert("counters", {"name": "a"}, on=["count"]), "no unique index"),
        (lambda u: u.upsert("counters", {"name": "a"}, on=42), "its index's name"),
        (lambda u: u.upsert("counters", {"count": 1}, on="by_name"), "required"),
        (lambda u: u.upsert("counters", {"name": "a"}, on="by_email"), "by_email"),
        (lambda u: u.upsert("counters", {"name": None}, on="by_name"), "required"),
        (lambda u: u.upsert("counters", {"name": "a", "count": "many"}, on="by_name"), "count"),
        (lambda u: u.upsert("counters", {"name": "a"}, on="by_name", update=["count"]), "update="),
        (lambda u: u.upsert("counters", {"name": "a"}, on="by_name", check="plain-id"), "version"),
        (lambda u: u.upsert("counters", {"name": "a", "id": "x"}, on="by_name"), "generated"),
        (lambda u: u.upsert("counters", {"name": "a"}, on="by_name", update="name"), "a list"),
        (lambda u: u.upsert("counters", [("name", "a")], on="by_name"), "a dict"),
        (lambda u: u.check_absent("counters", where={"note": "n"}), "no unique index"),
        (lambda u: u.check_absent("counters", where="name"), "a dict"),
        (lambda u: u.check_absent("counters", where={"bogus": "n"}), "bogus"),
        (lambda u: u.check_absent("counters", where={"name": None}), "got None"),
        (lambda u: u.check_absent("counters", where={"name": 5}), "name"),
        (lambda u: u.conflict_on_unique("counters", "by_note"), "not unique"),
    ]
    for call, message in cases:
        sent: list[str] = []

        async def unit(uow: af.UnitOfWork, call: Any = call) -> None:
            call(uow)

        with pytest.raises(af.ValidationError, match=message):
            await keys.run(unit, on_query=lambda q, sent=sent: sent.append(q.sql))
        assert sent == []
    assert await keys.count("counters") == 0

    async def early(uow: af.UnitOfWork) -> None:
        uow.upsert("counters", {"name": "a"}, on="by_name").result  # noqa: B018

    with pytest.raises(af.ValidationError, match="once the unit has committed"):
        await keys.run(early)


async def test_upsert_colliding_on_another_unique_index_is_a_unique_violation(keys: Env) -> None:
    await keys.create("counters", {"name": "a", "email": "x@example.com"})
    before = await keys.snapshot()

    async def unit(uow: af.UnitOfWork) -> None:
        uow.upsert("counters", {"name": "b", "email": "x@example.com"}, on="by_name")

    with pytest.raises(af.UniqueViolation):
        await keys.run(unit)
    assert await keys.snapshot() == before


async def test_checked_upsert_conflicts_when_the_row_changed_or_appeared(keys: Env) -> None:
    start = await keys.db.outbox.latest()

    async def absent(uow: af.UnitOfWork) -> af.Upserted:
        return uow.upsert("counters", {"name": "a", "count": 1}, on="by_name", check=None)

    made = await keys.run(absent)
    assert made.created and made.result.version == 0
    with pytest.raises(af.ConcurrencyConflict):  # it exists now
        await keys.run(absent, retry=af.NoRetry())
    row = await row_of(keys, "a")
    assert row is not None

    async def seen(uow: af.UnitOfWork, row_id: af.RowId = row["id"]) -> af.Upserted:
        return uow.upsert("counters", {"name": "a", "count": 2}, on="by_name", check=row_id)

    done = await keys.run(seen)
    assert (done.created, done.result, done.result.version) == (False, made.result, 1)
    with pytest.raises(af.ConcurrencyConflict):  # at version 0 no more
        await keys.run(seen, retry=af.NoRetry())
    ops = [(m["op"], m.get("check_version")) for m in await mutations(keys, start)]
    assert ops == [("create", None), ("update", 0)]


async def test_check_absent_and_unique_violations_as_conflicts(keys: Env) -> None:
    await keys.create("counters", {"name": "a", "email": "a@example.com"})

    async def check(uow: af.UnitOfWork) -> None:
        uow.check_absent("counters", where={"name": "a"})
        uow.create("counters", {"name": "other"})

    with pytest.raises(af.ConcurrencyConflict):
        await keys.run(check, retry=af.NoRetry())
    assert await row_of(keys, "other") is None

    async def fine(uow: af.UnitOfWork) -> None:
        uow.check_absent("counters", where={"name": "b"})
        uow.create("counters", {"name": "b"})

    await keys.run(fine)
    assert await row_of(keys, "b") is not None

    def duplicate(*indexes: str, email: str = "new@example.com") -> Any:
        async def unit(uow: af.UnitOfWork) -> None:
            if indexes:
                uow.conflict_on_unique("counters", *indexes)
            uow.create("counters", {"name": "a", "email": email})

        return unit

    with pytest.raises(af.UniqueViolation):
        await keys.run(duplicate())
    with pytest.raises(af.ConcurrencyConflict):
        await keys.run(duplicate("by_name"), retry=af.NoRetry())
    # A violation of another index stays an error.
    with pytest.raises(af.UniqueViolation):
        await keys.run(duplicate("by_email", email="b@example.com"), retry=af.NoRetry())


async def test_concurrent_upserts_of_one_key_make_one_row(keys: Env) -> None:
    """Checked upserts count exactly; plain ones never collide on the key."""

    async def increment(uow: af.UnitOfWork) -> None:
        found = uow.find_first("counters", where={"name": "k"})
        await uow.retrieve()
        row = found.result
        count = 1 if row is None else row["count"] + 1
        check = None if row is None else row["id"]
        uow.upsert("counters", {"name": "k", "count": count}, on="by_name", check=check)

    async def plain(uow: af.UnitOfWork) -> None:
        uow.upsert("counters", {"name": "p", "count": 1}, on="by_name")

    async def worker() -> None:
        for _ in range(2):
            await keys.run(increment, retry=PATIENT)
        await keys.run(plain, retry=PATIENT)

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(worker)
    rows = await keys.find("counters", order_by="name")
    assert [(r["name"], r["count"]) for r in rows] == [("k", 32), ("p", 1)]
    assert rows[0]["id"].version == 31 and rows[1]["id"].version == 15


async def test_concurrent_creators_behind_check_absent_one_wins(keys: Env) -> None:
    async def get_or_create(uow: af.UnitOfWork) -> af.RowId:
        found = uow.find_first("counters", where={"name": "once"})
        await uow.retrieve()
        if found.result is not None:
            return found.result["id"]  # (after a conflict: the winner's row)
        uow.check_absent("counters", where={"name": "once"})
        return uow.create("counters", {"name": "once"})

    ids: list[af.RowId] = []

    async def worker() -> None:
        ids.append(await keys.run(get_or_create, retry=PATIENT))

    async with anyio.create_task_group() as tg:
        for _ in range(12):
            tg.start_soon(functools.partial(worker))
    assert len(set(ids)) == 1 and len(ids) == 12
    assert await keys.count("counters") == 1


@pytest.mark.parametrize("outbox", [False, "counter"])
async def test_upsert_without_the_outbox_and_under_its_counter(
    url: str, target: Target, outbox: Any
) -> None:
    """The other commit paths: no entry (MySQL keeps COMMIT apart; the
    read-back is checked here), and the counter's entry statement (on
    PostgreSQL, whose default is ticks); the others take these paths in
    the tests above."""
    if (outbox, target.dialect) not in ((False, "mysql"), ("counter", "postgresql")):
        pytest.skip("the tests above take this path on this database")
    async with af.connect(url, backend=target.backend, outbox=outbox) as db:
        env = Env(db, KEYS, new_namespace())
        await db.migrate(KEYS, namespace=env.namespace)
        try:
            start = await db.outbox.latest() if outbox else None

            async def unit(uow: af.UnitOfWork) -> af.Upserted:
                return uow.upsert("counters", {"name": "a", "email": "a@x"}, on="by_name")

            made, again = await env.run(unit), await env.run(unit)
            assert (made.created, again.created, again.result.version) == (True, False, 1)

            async def collide(uow: af.UnitOfWork) -> None:
                uow.upsert("counters", {"name": "b", "email": "a@x"}, on="by_name")

            with pytest.raises(af.UniqueViolation):
                await env.run(collide)

            async def absent(uow: af.UnitOfWork) -> None:
                uow.check_absent("counters", where={"name": "a"})
                uow.create("counters", {"name": "c"})

            with pytest.raises(af.ConcurrencyConflict):
                await env.run(absent, retry=af.NoRetry())
            assert await env.count("counters") == 1
            if outbox:
                ops = [(m["op"], m["external_id"]) for m in await mutations(env, start)]
                assert ops == [("create", made.result), ("update", made.result)]
        finally:
            await drop_namespace(db, KEYS, env.namespace)


async def test_upserts_by_a_tables_only_unique_key_under_concurrent_writers(keys: Env) -> None:
    """A key of a table's only unique index: each upsert reports exactly
    whether it created the row, and the versions count every update."""
    created: list[bool] = []

    async def upsert(uow: af.UnitOfWork, name: str, count: int) -> af.Upserted:
        return uow.upsert("singles", {"name": name, "count": count}, on="by_name")

    async def worker(number: int) -> None:
        for round_ in range(6):
            name = f"k{(number + round_) % 4}"
            done = await keys.run(functools.partial(upsert, name=name, count=number), retry=PATIENT)
            created.append(done.created)

    async with anyio.create_task_group() as tg:
        for number in range(12):
            tg.start_soon(worker, number)
    rows = await keys.find("singles", order_by="name")
    assert [r["name"] for r in rows] == ["k0", "k1", "k2", "k3"]
    assert created.count(True) == 4
    assert sum(r["id"].version for r in rows) == 12 * 6 - 4


async def test_upsert_firing_on_an_index_the_schema_does_not_declare_writes_nothing(
    keys: Env, target: Target
) -> None:
    """On MySQL the clause of an upsert by a table's only declared unique
    index fires on whichever unique index the row collides on: one made
    outside the schema makes the upsert a unique violation, as its own
    key's clause makes it on the other databases, and nothing is written."""
    table = keys.ident("singles")
    index = af.Identifier(f"extra_{keys.namespace}")
    await keys.db.execute(
        af.sql("CREATE UNIQUE INDEX {i} ON {t} ({c})", i=index, t=table, c=af.Identifier("code"))
    )
    [a, b] = await keys.create("singles", {"name": "a", "code": 1}, {"name": "b", "code": 2})
    before = await keys.snapshot()

    async def upsert(uow: af.UnitOfWork, values: dict[str, Any]) -> af.Upserted:
        return uow.upsert("singles", values, on="by_name")

    for values in ({"name": "c", "code": 1}, {"name": "b", "code": 1}):
        with pytest.raises(af.UniqueViolation):
            await keys.run(functools.partial(upsert, values=values))
        assert await keys.snapshot() == before
    again = await keys.run(functools.partial(upsert, values={"name": "a", "code": 1, "count": 7}))
    assert (again.created, again.result, again.result.version) == (False, a, 1)
    made = await keys.run(functools.partial(upsert, values={"name": "d", "code": 4}))
    assert made.created and made.result not in (a, b)
    assert await keys.count("singles") == 3
    if target.dialect != "mysql":
        return
    # MySQL's clause fires on the first unique index the row collides on:
    # those over NOT NULL columns before the others, each kind in the order
    # they were made. One on count, with by_name made again after it, comes
    # first: the clause fires on a's row, and b's, which holds the key, is
    # not updated.
    count, internal = af.Identifier("count"), af.Identifier("_id")
    await keys.db.execute(af.sql("UPDATE {t} SET {c} = {i}", t=table, c=count, i=internal))
    await keys.db.execute(
        af.sql(
            "CREATE UNIQUE INDEX {i} ON {t} ({c})", i=af.Identifier("by_count"), t=table, c=count
        )
    )
    name = await keys.db.fetch_value(
        af.sql(
            "SELECT index_name FROM information_schema.statistics WHERE table_schema = "
            "DATABASE() AND table_name = {t} AND column_name = 'name'",
            t=table.parts[-1],
        )
    )
    by_name = af.Identifier(name)
    await keys.db.execute(af.sql("ALTER TABLE {t} DROP INDEX {i}", t=table, i=by_name))
    await keys.db.execute(
        af.sql(
            "ALTER TABLE {t} ADD UNIQUE INDEX {i} ({c})",
            t=table,
            i=by_name,
            c=af.Identifier("name"),
        )
    )
    [row_a] = await keys.find("singles", where={"name": "a"})
    before = await keys.snapshot()

    async def code_only(uow: af.UnitOfWork) -> None:
        values = {"name": "b", "count": row_a["count"], "code": 5}
        uow.upsert("singles", values, on="by_name", update=["code"])

    with pytest.raises(af.UniqueViolation):
        await keys.run(code_only)
    assert await keys.snapshot() == before
