"""Review of the unit of work's write paths (reviewer r2) on every backend
and runtime: a unit's own earlier writes and the caller's later changes to
its values against what a write checks and what its outbox entry says,
upserts under concurrency and after a lost COMMIT reply, bulk writes by
ids of no row, and idempotency keys that collide with unkeyed units' ids.
Defects not fixed here are xfail(strict=True), with the reason."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import new_namespace
from tests.conformance.test_uow_upsert import KEYS, PATIENT, keys, mutations  # noqa: F401
from tests.conformance.uow_env import Env, drop_namespace
from tests.conftest import Target

pytestmark = pytest.mark.anyio
ONCE = af.ExponentialBackoff(max_retries=2, initial=0.001, maximum=0.002)


async def test_checked_update_many_by_where_after_the_units_own_create(items: Env) -> None:
    """A row the unit created before its checked update_many by where is not
    a row "that appeared since the retrieval" made by someone else."""
    [a] = await items.create("items", {"name": "a", "qty": 1})

    async def unit(uow: af.UnitOfWork) -> af.BulkWrite:
        uow.create("items", {"name": "b", "qty": 1})
        return uow.update_many("items", {"qty": 1}, {"tag": "t"}, check=True)

    written = await items.run(unit, retry=ONCE)
    assert written.ids == [a]
    rows = {row["name"]: row["tag"] for row in await items.find("items")}
    assert rows == {"a": "t", "b": None}


async def test_upsert_then_later_writes_to_its_row_the_entry_says_what_it_did(
    keys: Env,  # noqa: F811
) -> None:
    """Later writes of the unit that delete an upsert's row, or move its key
    to another row, do not change what the entry says the upsert did: it
    updated X (then X was deleted; or X was re-keyed and a create took the
    key) — never a row that never existed, nor the row that holds the key
    at the end — and one that created its row says so."""
    [x, y] = await keys.create("counters", {"name": "a", "count": 1}, {"name": "b", "count": 1})
    start = await keys.db.outbox.latest()

    async def unit(uow: af.UnitOfWork) -> list[af.Upserted]:
        upserts = [uow.upsert("counters", {"name": "a", "count": 2}, on="by_name")]
        uow.delete("counters", x)
        upserts.append(uow.upsert("counters", {"name": "b", "count": 2}, on="by_name"))
        uow.update("counters", y, {"name": "b-old"})
        uow.create("counters", {"name": "b", "count": 9})
        upserts.append(uow.upsert("counters", {"name": "c", "count": 3}, on="by_name"))
        uow.update("counters", y, {"count": 5})
        return upserts

    on_x, on_y, made = await keys.run(unit)
    assert [(h.created, h.result) for h in (on_x, on_y)] == [(False, x), (False, y)]
    assert made.created
    got = [(m["op"], m["external_id"]) for m in await mutations(keys, start)]
    new_b = {row["name"]: row["id"] for row in await keys.find("counters")}["b"]
    assert got == [
        ("update", x),
        ("delete", x),
        ("update", y),
        ("update", y),
        ("create", new_b),
        ("create", made.result),
        ("update", y),
    ]


async def test_upsert_updates_the_key_row_when_its_other_values_collide_elsewhere(
    keys: Env,  # noqa: F811
) -> None:
    """The row holding the key named by on= is updated (only update= is
    set, so no other unique value changes), whatever other unique index
    the proposed row's values would collide on had it been inserted."""
    y1, _ = await keys.create(
        "counters", {"name": "a", "email": "e1", "count": 1}, {"name": "b", "email": "e2"}
    )

    async def unit(uow: af.UnitOfWork) -> af.Upserted:
        return uow.upsert(
            "counters", {"email": "e1", "name": "b", "count": 5}, on="by_email", update=["count"]
        )

    handle = await keys.run(unit)
    assert (handle.created, handle.result) == (False, y1)
    rows = {row["name"]: (row["email"], row["count"]) for row in await keys.find("counters")}
    assert rows == {"a": ("e1", 5), "b": ("e2", 0)}

    # Setting the key's row to a value another row holds is a violation of
    # that index, named (so conflict_on_unique counts it), as an update's.
    async def renaming(uow: af.UnitOfWork) -> None:
        uow.conflict_on_unique("counters", "by_name")
        uow.upsert("counters", {"email": "e1", "name": "b"}, on="by_email", update=["name"])

    with pytest.raises(af.ConcurrencyConflict):
        await keys.run(renaming, retry=af.NoRetry())
    after = {row["name"]: (row["email"], row["count"]) for row in await keys.find("counters")}
    assert after == rows


async def test_bulk_write_by_ids_of_no_row_is_row_not_found(items: Env) -> None:
    """update_many/delete_many by ids the unit never read (plain str), one
    of which names no row: RowNotFound at once, as uow.update of that id
    gives — not a "conflict" retried until the policy gives up and then
    reported as ConcurrencyConflict; nothing is written."""
    [a] = await items.create("items", {"name": "a", "qty": 1})
    nowhere = "01900000-0000-7000-8000-000000000000"

    for write in (
        lambda uow: uow.update_many("items", rows=[str(a), nowhere], values={"qty": 2}),
        lambda uow: uow.delete_many("items", rows=[str(a), nowhere]),
    ):

        async def unit(uow: af.UnitOfWork, write: Any = write) -> None:
            write(uow)

        with pytest.raises(af.RowNotFound):
            await items.run(unit, retry=ONCE)
    [row] = await items.find("items")
    assert (row["qty"], row["id"].version) == (1, 0)


DOCS = af.Schema(
    "docs",
    af.Table(
        "docs",
        af.Column("n", "bigint"),
        af.Column("doc", "json"),
        af.Column("blob", "binary", nullable=True),
    ),
)


async def test_payload_holds_values_as_queued_when_the_caller_reuses_them(
    url: str, target: Target
) -> None:
    """A dict (json) or bytearray (binary) the caller changes after queueing
    a write — a template reused in a loop — is stored as it was when queued;
    the outbox entry must describe that, not the value as it is at commit."""
    async with af.connect(url, backend=target.backend, outbox="counter") as odb:
        env = Env(odb, DOCS, new_namespace())
        await odb.migrate(DOCS, namespace=env.namespace)
        try:
            units: list[af.UnitOfWork] = []

            async def unit(uow: af.UnitOfWork) -> None:
                units.append(uow)
                doc, blob = {"i": 0}, bytearray(b"\x00")
                uow.create("docs", {"n": 0, "doc": doc, "blob": blob})
                uow.create_many("docs", [{"n": 1, "doc": doc, "blob": blob}])
                doc["i"], blob[0] = 9, 9

            await env.run(unit)
            stamp = units[-1].versionstamp
            assert stamp is not None
            [entry] = await odb.outbox.list(after=f"{int(stamp, 16) - 1:024x}", limit=1)
            stored = {row["n"]: (row["doc"], row["blob"]) for row in await env.find("docs")}
            assert stored == {0: ({"i": 0}, b"\x00"), 1: ({"i": 0}, b"\x00")}
            one, many = entry.payload["mutations"]
            described = [one["values"], many["rows"][0]["values"]]
            assert [(v["doc"], v["blob"]) for v in described] == [({"i": 0}, b"\x00")] * 2
        finally:
            await drop_namespace(odb, DOCS, env.namespace)


async def test_concurrent_plain_upserts_each_entry_says_what_it_did(keys: Env) -> None:  # noqa: F811
    """Concurrent unchecked upserts of one key: one creates, the others
    update that row, and each unit's entry says which it did, of that row."""
    start = await keys.db.outbox.latest()
    done: list[tuple[af.Upserted, str]] = []

    async def worker(count: int) -> None:
        units: list[af.UnitOfWork] = []

        async def unit(uow: af.UnitOfWork) -> af.Upserted:
            units.append(uow)
            return uow.upsert("counters", {"name": "k", "count": count}, on="by_name")

        done.append((await keys.run(unit, retry=PATIENT), units[-1].uow_id))

    async with anyio.create_task_group() as tg:
        for count in range(8):
            tg.start_soon(worker, count)
    [row] = await keys.find("counters")
    assert [handle.created for handle, _ in done].count(True) == 1
    assert {handle.result for handle, _ in done} == {row["id"]}
    entries = {
        entry.uow_id: entry.payload["mutations"]
        for entry in await keys.db.outbox.list(after=start, limit=1000)
    }
    for handle, uow_id in done:
        [mutation] = entries[uow_id]
        assert mutation["op"] == ("create" if handle.created else "update")
        assert mutation["external_id"] == row["id"]


async def test_a_key_equal_to_an_unkeyed_units_id_is_refused_not_already_applied(
    keys: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A unit without a key is recorded by its entry's generated uow_id,
    unique like a key. A later unit given that id as its idempotency_key (a
    consumer handling each entry once, say) never ran: it is refused with a
    ValidationError saying how to derive a key — not AlreadyApplied, which
    would have the consumer skip the entry as handled — and a derived key
    works, and applies once."""
    units: list[af.UnitOfWork] = []

    async def event(uow: af.UnitOfWork) -> None:
        units.append(uow)
        uow.create("counters", {"name": "event"})

    await keys.run(event)
    event_id = units[-1].uow_id

    async def handle(uow: af.UnitOfWork) -> None:
        uow.create("counters", {"name": "handled"})

    with pytest.raises(af.ValidationError, match="committed without a key") as refused:
        await keys.run(handle, idempotency_key=event_id)
    assert not isinstance(refused.value, af.AlreadyApplied)
    assert await keys.count("counters") == 1
    derived = f"consumer:{event_id}"
    await keys.run(handle, idempotency_key=derived)
    with pytest.raises(af.AlreadyApplied):
        await keys.run(handle, idempotency_key=derived)
    assert await keys.count("counters") == 2

    # Without an entry (outbox=False) the key's row alone records the unit:
    # it commits, and a lost COMMIT reply is settled by that row, not taken
    # for the other unit's entry (AlreadyApplied).
    from aiofragno.session import Session

    lost = {"armed": True}
    original = Session.commit

    async def commit(self: Session, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, *args, **kwargs)
        if lost["armed"]:
            lost["armed"] = False
            self.broken = True
            raise af.CommitOutcomeUnknown("reply to COMMIT lost (test)")
        return result

    async def handle_quietly(uow: af.UnitOfWork) -> None:
        uow.create("counters", {"name": "handled quietly"})

    monkeypatch.setattr(Session, "commit", commit)
    await keys.run(handle_quietly, idempotency_key=event_id, outbox=False)
    assert not lost["armed"] and await keys.count("counters") == 3
    with pytest.raises(af.AlreadyApplied):
        await keys.run(handle_quietly, idempotency_key=event_id, outbox=False)


async def test_upsert_and_bulk_writes_after_a_lost_commit_reply(
    keys: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The COMMIT of a keyed unit with an upsert, a create_many and an
    update_many is applied, and its reply lost: the unit is settled as
    committed (not run again, not reported failed), each handle tells what
    was written or says it cannot (never a wrong row), and one entry
    describes it."""
    from aiofragno.session import Session

    [x] = await keys.create("counters", {"name": "x", "count": 1})
    start = await keys.db.outbox.latest()
    lost = {"armed": True}

    def losing(original: Any) -> Any:
        async def commit(self: Session, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, *args, **kwargs)
            if lost["armed"]:
                lost["armed"] = False
                self.broken = True
                raise af.CommitOutcomeUnknown("reply to COMMIT lost (test)")
            return result

        return commit

    monkeypatch.setattr(Session, "commit", losing(Session.commit))
    monkeypatch.setattr(Session, "execute_committing", losing(Session.execute_committing))
    attempts: list[int] = []

    async def unit(uow: af.UnitOfWork) -> tuple[af.Upserted, list[af.RowId], af.BulkWrite]:
        attempts.append(1)
        upserted = uow.upsert("counters", {"name": "x", "count": 5}, on="by_name")
        made = uow.create_many("counters", [{"name": "m1"}, {"name": "m2"}])
        bulk = uow.update_many("counters", {"name": "x"}, {"note": "n"})
        return upserted, made, bulk

    key = f"lost-commit-{keys.namespace}"  # (the keys table is the database's)
    upserted, made, bulk = await keys.run(unit, idempotency_key=key)
    assert not lost["armed"] and len(attempts) == 1
    try:
        assert (upserted.result, upserted.created) == (x, False)
    except af.ValidationError as exc:
        assert "read the row by its key" in str(exc)
    assert bulk.ids == [x]
    rows = {row["name"]: row for row in await keys.find("counters")}
    assert set(rows) == {"x", "m1", "m2"} and [rows["m1"]["id"], rows["m2"]["id"]] == made
    assert (rows["x"]["count"], rows["x"]["note"], rows["x"]["id"].version) == (5, "n", 2)
    kinds = [m["op"] for m in await mutations(keys, start)]
    assert kinds == ["update", "create_many", "update_many"]
    with pytest.raises(af.AlreadyApplied):
        await keys.run(unit, idempotency_key=key)


async def test_a_key_freed_by_an_update_is_taken_by_a_create_in_the_same_unit(
    keys: Env,  # noqa: F811
) -> None:
    """Writes run in the order queued: an update that moves row x off key
    "k", then check_absent("k") and a create of "k", commit on every
    backend (run one by one they cannot collide)."""
    [x] = await keys.create("counters", {"name": "k"})

    async def unit(uow: af.UnitOfWork) -> af.RowId:
        uow.update("counters", x, {"name": "old-k"})
        uow.check_absent("counters", where={"name": "k"})
        return uow.create("counters", {"name": "k", "count": 2})

    new = await keys.run(unit, retry=ONCE)
    rows = {row["name"]: row["id"] for row in await keys.find("counters")}
    assert rows == {"old-k": x, "k": new}


async def test_upsert_colliding_on_an_index_counted_as_a_conflict_conflicts(
    keys: Env,  # noqa: F811
) -> None:
    """conflict_on_unique applies to an upsert's collision on another
    unique index as to any write's: the unit conflicts (and runs again)."""
    await keys.create("counters", {"name": "a", "email": "e"})

    async def unit(uow: af.UnitOfWork) -> None:
        uow.conflict_on_unique("counters", "by_email")
        uow.upsert("counters", {"name": "b", "email": "e"}, on="by_name")

    with pytest.raises(af.ConcurrencyConflict):
        await keys.run(unit, retry=af.NoRetry())
    assert await keys.count("counters") == 1
