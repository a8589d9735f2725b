"""Outbox consumers under faults, on every backend and runtime: connections
cut by a real TCP proxy (``tests/faults.py``) at each step of a consumer's
cycle, the database out of reach past ``reconnect_deadline``, a worker that
dies holding its lease, handlers slower than the lease, and dead letters the
database cannot store as given.

After each: every entry was delivered at least once, first deliveries in
entry order, never to two workers at once; with ``transactional=True`` every
entry's effects committed exactly once; the cursor is at the last entry.

The consumers' tables are shared by every namespace of a database, so on
PostgreSQL and MariaDB this module works in a database of its own (dropped
at the end); SQLite gets a file per test.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import pytest

import aiofragno as af
from aiofragno.codec import as_utc
from aiofragno.outbox import Consumer, ConsumerHalted, OutboxEntry
from aiofragno.outbox.dead_letters import MAX_ERROR_LENGTH
from aiofragno.outbox.tables import CONSUMERS, DEAD_LETTERS
from tests.conformance.namespaces import Namespaces
from tests.conformance.private_databases import PrivateDatabases
from tests.conftest import Target, require_target
from tests.faults import Proxy, tcp_proxy

pytestmark = pytest.mark.anyio

SCHEMA = af.Schema(
    "cf",
    af.Table("events", af.Column("n", "bigint")),
    # What transactional handlers write: one row per committed delivery.
    af.Table("effects", af.Column("vs", "string")),
)
ENTRIES = 8
LIMIT = 60  # seconds: a hang fails the test instead of blocking the suite
MODES = pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])


# -- a database of the module's own ---------------------------------------------


@pytest.fixture
async def url(target: Target, tmp_path: Path, private_databases: PrivateDatabases) -> str:
    require_target(target)
    base = target.url(tmp_path)
    if target.dialect == "sqlite":
        return base
    return await private_databases.url_for(target, base)


# -- the environment: entries, a consumer, its deliveries -------------------------


@dataclass
class Deliveries:
    """What handlers saw: (worker, versionstamp) in call order, and the most
    calls in flight at once."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0

    def handler(
        self, worker: str, inner: Callable[..., Awaitable[None]] | None = None
    ) -> Callable[..., Awaitable[None]]:
        async def handle(entry: OutboxEntry, *tx: Any) -> None:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                if inner is not None:
                    await inner(entry, *tx)  # (a call that raises is not recorded)
                await anyio.lowlevel.checkpoint()  # a task switch: overlaps would show
                self.calls.append((worker, entry.versionstamp))
            finally:
                self.in_flight -= 1

        return handle

    def stamps(self) -> list[str]:
        return [vs for _, vs in self.calls]


class Env:
    """A migrated namespace on ``db`` (direct, outbox on) with ENTRIES
    entries, and a consumer whose cursor starts just before them."""

    def __init__(self, target: Target, url: str, db: af.Database) -> None:
        self.target = target
        self.url = url
        self.db = db
        self.namespaces = Namespaces(db)
        self.namespace = self.namespaces.use(db, SCHEMA).namespace
        self.name = f"cf-{uuid.uuid4().hex}"
        self.start: str | None = None  # the newest entry before ours
        self.stamps: list[str] = []

    async def setup(self, entries: int = ENTRIES) -> None:
        await self.db.migrate(SCHEMA, namespace=self.namespace)
        self.start = await self.db.outbox.latest()
        await self.write(entries)
        assert len(self.stamps) == entries, "another writer used this module's database"
        await self.db.execute(
            af.sql(
                "INSERT INTO {t} ({n}, {c}) VALUES ({name}, {cursor})",
                t=af.Identifier(CONSUMERS),
                n=af.Identifier("name"),
                c=af.Identifier("cursor"),
                name=self.name,
                cursor=self.start,
            )
        )

    async def write(self, entries: int, pause: float = 0.0) -> None:
        """``entries`` more units of one create each; ``stamps`` updated."""
        for n in range(entries):

            async def unit(uow: af.UnitOfWork, n: int = n) -> None:
                uow.create("events", {"n": n})

            await self.db.execute_uow(unit, schema=SCHEMA, namespace=self.namespace)
            await anyio.sleep(pause)
        self.stamps = []
        while page := await self.db.outbox.list(after=(self.stamps or [self.start])[-1]):
            self.stamps += [e.versionstamp for e in page]

    async def cleanup(self) -> None:
        for table, column in ((CONSUMERS, "name"), (DEAD_LETTERS, "consumer")):
            await self.db.execute(
                af.sql(
                    "DELETE FROM {t} WHERE {c} = {n}",
                    t=af.Identifier(table),
                    c=af.Identifier(column),
                    n=self.name,
                )
            )
        await self.namespaces.drop()

    def consumer(self, db: af.Database | None = None, lease: float = 30.0) -> Consumer:
        return (db or self.db).outbox.consumer(self.name, lease=lease)

    def effects_table(self) -> af.Identifier:
        return self.db.layout(SCHEMA, self.namespace).table("effects").identifier

    def effect(self, entry: OutboxEntry) -> af.Fragment:
        """The transactional handlers' write for ``entry``."""
        return af.sql(
            "INSERT INTO {t} ({i}, {vs}, {v}) VALUES ({id}, {stamp}, 0)",
            t=self.effects_table(),
            i=af.Identifier("id"),
            vs=af.Identifier("vs"),
            v=af.Identifier("_version"),
            id=uuid.uuid4().hex,
            stamp=entry.versionstamp,
        )

    async def effects(self) -> list[str]:
        rows = await self.db.fetch(
            af.sql(
                "SELECT {vs} FROM {t} ORDER BY {vs}", vs=af.Identifier("vs"), t=self.effects_table()
            )
        )
        return [row["vs"] for row in rows]

    async def _lease(self, column: str) -> Any:
        """``column`` of the consumer's row (its lease's owner or end)."""
        return await self.db.fetch_value(
            af.sql(
                "SELECT {c} FROM {t} WHERE {n} = {name}",
                c=af.Identifier(column),
                t=af.Identifier(CONSUMERS),
                n=af.Identifier("name"),
                name=self.name,
            )
        )

    async def lease_left(self) -> float:
        """Seconds until the consumer's lease lapses, on the database's clock
        (as the lease itself counts them; negative once it has lapsed)."""
        until = int(await self._lease("lease_until"))
        engine = self.db._engine
        now = as_utc(await self.db.fetch_value(engine.raw(engine.adapter.sql.now)))
        return until / 1000 - now.timestamp()

    async def lease_owner(self) -> str | None:
        owner: str | None = await self._lease("lease_owner")
        return owner

    async def check(self, deliveries: Deliveries, *, transactional: bool) -> None:
        """The invariants every test ends with."""
        seen = deliveries.stamps()
        assert set(seen) == set(self.stamps), "an entry was never delivered"
        assert list(dict.fromkeys(seen)) == self.stamps, "first deliveries out of order"
        assert deliveries.most_in_flight == 1, "an entry was delivered to two workers at once"
        assert await self.consumer().position() == self.stamps[-1]
        if transactional:
            assert await self.effects() == self.stamps, "effects not exactly once"


@pytest.fixture
async def env(target: Target, url: str) -> AsyncIterator[Env]:
    async with af.connect(url, backend=target.backend, outbox=True, pool_size=4) as db:
        made = Env(target, url, db)
        try:
            await made.setup()
            yield made
        finally:
            await made.cleanup()


def server_only(target: Target) -> None:
    if target.dialect == "sqlite":
        pytest.skip("SQLite is embedded: there is no connection to cut")


@asynccontextmanager
async def proxied(env: Env, **options: Any) -> AsyncIterator[tuple[Proxy, af.Database]]:
    """A proxy to ``env``'s server and a Database connected through it."""
    parts = urlsplit(env.url)
    default_port = 5432 if env.target.dialect == "postgresql" else 3306
    async with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or default_port) as proxy:
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
        via = urlunsplit(parts._replace(netloc=netloc))
        options = {"pool_size": 2, "reconnect_deadline": 10, **options}
        async with af.connect(via, backend=env.target.backend, **options) as db:
            yield proxy, db


# -- connections cut at each step of the cycle ------------------------------------

# (name, marker of the statement to cut, forward it to the server first?, when
# to arm: "start" before the run, or in the handler of the "first", the 3rd
# ("entry") or the "last" entry). A statement's text goes over the wire only
# the first time where the driver prepares statements: cut it then.
CUTS = {
    "claim-lost-before": (b"SKIP LOCKED", False, "start"),
    "claim-reply-lost": (b"SKIP LOCKED", True, "start"),
    "claim-commit-lost": (b"COMMIT", True, "start"),
    "read-lost-before": (b"payload", False, "start"),
    "read-reply-lost": (b"payload", True, "start"),
    "advance-lost-before": (b"delivered", False, "entry"),
    "advance-reply-lost": (b"delivered", True, "entry"),
    "release-lost-before": (b"= NULL", False, "last"),
    "release-reply-lost": (b"= NULL", True, "last"),
}
TRANSACTIONAL_CUTS = {
    "handler-statement-lost": (b"effects", False, "first"),
    "delivery-commit-lost-before": (b"COMMIT", False, "entry"),
    "delivery-commit-reply-lost": (b"COMMIT", True, "entry"),
}


@pytest.mark.parametrize(
    ("transactional", "cut"),
    [
        *((False, cut) for cut in CUTS),
        *((True, cut) for cut in CUTS if not cut.startswith("advance")),
        *((True, cut) for cut in TRANSACTIONAL_CUTS),
    ],
)
async def test_a_cut_at_any_step_is_ridden_out(
    env: Env, target: Target, transactional: bool, cut: str
) -> None:
    """One connection cut at the named step (the statement lost on its way,
    or its reply): the run goes on, nothing is skipped, nothing is delivered
    to two at once, transactional effects commit exactly once, and the
    lease is released at the end."""
    server_only(target)
    marker, forward, when = {**CUTS, **TRANSACTIONAL_CUTS}[cut]
    deliveries = Deliveries()
    async with proxied(env) as (proxy, db):

        async def inner(entry: OutboxEntry, *tx: Any) -> None:
            index = env.stamps.index(entry.versionstamp)
            arm_at = {"first": 0, "entry": 2, "last": ENTRIES - 1}.get(when)
            if index == arm_at and not proxy.drops and not proxy.armed:
                proxy.drop_after(marker, forward)
            if tx:
                await tx[0].execute(env.effect(entry))

        if when == "start":
            proxy.drop_after(marker, forward)
        with anyio.fail_after(LIMIT):
            delivered = await env.consumer(db).run(
                deliveries.handler("A", inner),
                until_caught_up=True,
                transactional=transactional,
                batch_size=3,
            )
        drops = proxy.drops
    assert drops == 1, "the fault was not injected"
    await env.check(deliveries, transactional=transactional)
    assert delivered >= 1
    assert await env.lease_owner() is None, "the lease was not released"


@MODES
async def test_an_outage_shorter_than_the_deadline_is_ridden_out(
    env: Env, target: Target, transactional: bool
) -> None:
    """The server goes away (connections cut, new ones refused) for a second
    in the middle of a run; the run waits and goes on."""
    server_only(target)
    deliveries = Deliveries()
    async with proxied(env, reconnect_deadline=15) as (proxy, db):

        async def back_after_a_second() -> None:
            await anyio.sleep(1.0)
            proxy.refuse(False)

        async with anyio.create_task_group() as tg:
            outages = 0

            async def inner(entry: OutboxEntry, *tx: Any) -> None:
                nonlocal outages
                if tx:
                    await tx[0].execute(env.effect(entry))
                if entry.versionstamp == env.stamps[3] and not outages:
                    outages += 1
                    proxy.refuse(True)
                    proxy.cut_all()
                    tg.start_soon(back_after_a_second)

            with anyio.fail_after(LIMIT):
                await env.consumer(db).run(
                    deliveries.handler("A", inner),
                    until_caught_up=True,
                    transactional=transactional,
                    batch_size=2,
                )
    await env.check(deliveries, transactional=transactional)


@MODES
async def test_past_the_deadline_the_run_raises_and_a_later_one_resumes(
    env: Env, target: Target, transactional: bool
) -> None:
    """The server stays away past ``reconnect_deadline``: ``run`` raises
    DatabaseUnavailable (in about that time, not at once and not never). Its
    lease could not be released; another worker waits for it to lapse,
    takes over and delivers the rest."""
    server_only(target)
    deliveries = Deliveries()
    raised: BaseException | None = None
    async with proxied(env, reconnect_deadline=1) as (proxy, db):

        async def inner(entry: OutboxEntry, *tx: Any) -> None:
            if tx:
                await tx[0].execute(env.effect(entry))
            if entry.versionstamp == env.stamps[3]:
                proxy.refuse(True)
                proxy.cut_all()

        began = anyio.current_time()
        try:
            with anyio.fail_after(LIMIT):
                await env.consumer(db, lease=1.0).run(
                    deliveries.handler("A", inner), transactional=transactional, batch_size=2
                )
        except af.DatabaseUnavailable as exc:
            raised = exc
        took = anyio.current_time() - began
    assert isinstance(raised, af.DatabaseUnavailable), raised
    assert env.name in str(raised) and "reconnect_deadline" in str(raised)
    assert took < 20
    assert await env.lease_owner() is not None  # the release could not happen

    async def rest(entry: OutboxEntry, *tx: Any) -> None:
        if tx:
            await tx[0].execute(env.effect(entry))

    with anyio.fail_after(LIMIT):
        await env.consumer(lease=1.0).run(
            deliveries.handler("B", rest), until_caught_up=True, transactional=transactional
        )
    await env.check(deliveries, transactional=transactional)


@MODES
async def test_two_workers_under_repeated_cuts_and_outages(
    env: Env, target: Target, transactional: bool
) -> None:
    """Two workers of one consumer, each through a proxy of its own, while
    entries keep coming and the network keeps failing: every 0.05-0.3 s one
    proxy cuts its connections; every fourth time the delivering worker's
    network is gone for twice its lease, so the other takes over. Every entry is delivered, first deliveries in order, never to both
    workers at once, transactional effects exactly once."""
    server_only(target)
    lease = 0.5
    deliveries = Deliveries()
    rng = random.Random(23)
    stop = False
    faults = 0

    async def handle(entry: OutboxEntry, *tx: Any) -> None:
        if tx:
            await tx[0].execute(env.effect(entry))

    async def chaos(proxies: dict[str, Proxy]) -> None:
        nonlocal faults
        while True:
            await anyio.sleep(rng.uniform(0.05, 0.3))
            faults += 1
            if faults % 4:
                rng.choice(list(proxies.values())).cut_all()
                continue
            # The worker delivering now loses its network for longer than
            # its lease: the other one takes over.
            holder = proxies[deliveries.calls[-1][0] if deliveries.calls else "A"]
            holder.refuse(True)
            holder.cut_all()
            try:
                await anyio.sleep(lease * 2)
            finally:  # (also when the chaos is called off meanwhile)
                holder.refuse(False)

    async def work(worker: str, db: af.Database) -> None:
        await env.consumer(db, lease=lease).run(
            deliveries.handler(worker, handle),
            transactional=transactional,
            stop=lambda: stop,
            poll_interval=0.02,
            batch_size=5,
        )

    with anyio.fail_after(LIMIT * 2):
        async with (
            proxied(env) as (proxy_a, db_a),
            proxied(env) as (proxy_b, db_b),
            anyio.create_task_group() as workers,
        ):
            workers.start_soon(work, "A", db_a)
            workers.start_soon(work, "B", db_b)
            async with anyio.create_task_group() as faulting:
                faulting.start_soon(chaos, {"A": proxy_a, "B": proxy_b})
                await env.write(40, pause=0.05)
                while await env.consumer().position() != env.stamps[-1]:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
                faulting.cancel_scope.cancel()
            stop = True
    assert faults >= 5, "too few faults were injected"
    takeovers = sum(a != b for (a, _), (b, _) in itertools.pairwise(deliveries.calls))
    assert takeovers >= 1, "the lease never changed hands"
    await env.check(deliveries, transactional=transactional)


# -- a worker that dies holding the lease ----------------------------------------


async def _die_with_closed_database(env: Env, target: Target, run: Run) -> None:
    """A's process is gone: its Database closed under it, its task ended."""

    class Died(BaseException):
        pass

    async with af.connect(env.url, backend=target.backend, pool_size=2) as a_db:

        async def die(entry: OutboxEntry) -> None:
            await a_db.close()
            raise Died

        with pytest.raises(Died):
            await run(a_db, die)


async def _die_unreachable(env: Env, target: Target, run: Run) -> None:
    """A's network is gone (connections cut, none accepted) and its task is
    cancelled: its release cannot reach the server."""
    server_only(target)
    async with proxied(env, reconnect_deadline=0.5) as (proxy, a_db):
        with anyio.CancelScope() as scope:

            async def die(entry: OutboxEntry) -> None:
                proxy.refuse(True)
                proxy.cut_all()
                scope.cancel()
                await anyio.sleep_forever()

            await run(a_db, die)
        assert scope.cancelled_caught


Run = Callable[[af.Database, Callable[[OutboxEntry], Awaitable[None]]], Awaitable[int]]
DEATHS = {"closed": _die_with_closed_database, "unreachable": _die_unreachable}


@MODES
@pytest.mark.parametrize("death", list(DEATHS))
async def test_a_dead_workers_lease_is_taken_over_when_it_lapses(
    env: Env, target: Target, transactional: bool, death: str
) -> None:
    """Worker A dies in the middle of an entry, unable to advance or release
    its lease. B, started right after with ``until_caught_up``, must not
    return at once with entries left: it waits until A's lease lapses, takes
    over, and returns once the consumer is caught up."""
    lease = 1.0
    deliveries = Deliveries()

    async def run(a_db: af.Database, die: Callable[[OutboxEntry], Awaitable[None]]) -> int:
        async def on_the_third(entry: OutboxEntry, *tx: Any) -> None:
            if tx:
                await tx[0].execute(env.effect(entry))
            if entry.versionstamp == env.stamps[2]:
                await die(entry)

        with anyio.fail_after(LIMIT):
            return await env.consumer(a_db, lease=lease).run(
                deliveries.handler("A", on_the_third),
                transactional=transactional,
                batch_size=ENTRIES,
            )

    await DEATHS[death](env, target, run)
    assert await env.lease_owner() is not None, "A's lease must still be held"
    # (How much of it is left depends on how long A took to die: on a
    # loaded machine it may have lapsed already, and then B goes at once.)
    left = await env.lease_left()
    died = anyio.current_time()

    async def rest(entry: OutboxEntry, *tx: Any) -> None:
        if tx:
            await tx[0].execute(env.effect(entry))

    b_calls_from = len(deliveries.calls)
    with anyio.fail_after(LIMIT):
        delivered = await env.consumer(lease=lease).run(
            deliveries.handler("B", rest), until_caught_up=True, transactional=transactional
        )
    # It waited for the lease (less the two clocks' reading apart).
    assert anyio.current_time() - died >= min(left, lease) - 0.05
    b_saw = [vs for _, vs in deliveries.calls[b_calls_from:]]
    assert b_saw[-1] == env.stamps[-1] and delivered == len(b_saw)
    assert await env.consumer().lag() == 0
    # A's third call raised: its entry (and, in plain mode, the two before,
    # whose advance A never made) is B's to deliver.
    assert env.stamps[2] in b_saw
    await env.check(deliveries, transactional=transactional)


@MODES
async def test_until_caught_up_waits_for_a_live_holder_to_catch_up(
    env: Env, target: Target, transactional: bool
) -> None:
    """While a live worker holds the lease and works, a second worker with
    ``until_caught_up`` returns only once the consumer is caught up — never
    at once with entries left — and delivers nothing concurrently."""
    deliveries = Deliveries()
    a_started = anyio.Event()
    stop_a = False

    async def slow(entry: OutboxEntry, *tx: Any) -> None:
        a_started.set()
        if tx:
            await tx[0].execute(env.effect(entry))
        await anyio.sleep(0.1)

    async def quick(entry: OutboxEntry, *tx: Any) -> None:
        if tx:
            await tx[0].execute(env.effect(entry))

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: env.consumer(lease=5.0).run(
                    deliveries.handler("A", slow),
                    transactional=transactional,
                    stop=lambda: stop_a,
                    poll_interval=0.02,
                    batch_size=2,
                )
            )
            await a_started.wait()
            await env.consumer(lease=5.0).run(
                deliveries.handler("B", quick),
                until_caught_up=True,
                transactional=transactional,
                poll_interval=0.02,
            )
            assert await env.consumer().lag() == 0, "B returned before the consumer caught up"
            stop_a = True
    await env.check(deliveries, transactional=transactional)


# -- the lease is kept while a worker works ---------------------------------------


@MODES
async def test_the_lease_is_kept_through_long_batches_and_retries(
    env: Env, target: Target, transactional: bool
) -> None:
    """A batch that takes many leases' time, and a handler whose retries'
    backoff outlasts the lease: another worker polling all along never gets
    the lease from a worker that is still delivering."""
    lease = 0.4
    deliveries = Deliveries()
    failures = {env.stamps[1]: 3}  # the backoff: 0.15 + 0.3 + 0.6 s > lease
    stop = False

    async def slowly(entry: OutboxEntry, *tx: Any) -> None:
        if tx:
            await tx[0].execute(env.effect(entry))
        await anyio.sleep(0.1)  # ENTRIES of these: twice the lease
        if failures.get(entry.versionstamp, 0):
            failures[entry.versionstamp] -= 1
            raise RuntimeError("not yet")

    async def work(worker: str) -> None:
        await env.consumer(lease=lease).run(
            deliveries.handler(worker, slowly),
            transactional=transactional,
            stop=lambda: stop,
            poll_interval=0.02,
            batch_size=ENTRIES,
            retry_delay=0.15,
        )

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(work, "A")
            tg.start_soon(work, "B")
            while await env.consumer().position() != env.stamps[-1]:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            stop = True
    if transactional:
        # A failed attempt's effect was rolled back with it.
        assert await env.effects() == env.stamps
    await env.check(deliveries, transactional=transactional)
    assert await env.consumer().dead_letters() == []


# -- dead letters ------------------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


HOSTILE_ERRORS = {
    "nul": (ValueError("before\x00after"), "ValueError: before\\x00after"),
    "surrogate": (ValueError("lone \ud800 and \udfff"), "ValueError: lone \\ud800 and \\udfff"),
    "broken-str": (Unprintable(), "Unprintable: <the exception's message could not be built>"),
}


@MODES
@pytest.mark.parametrize("kind", [*HOSTILE_ERRORS, "huge"])
async def test_an_error_the_database_cannot_store_as_given_is_dead_lettered(
    env: Env, transactional: bool, kind: str
) -> None:
    """The handler's error holds NUL (PostgreSQL text cannot), a lone
    surrogate (no database's UTF-8 can), a broken ``__str__`` or a megabyte
    of text: the dead letter stores it escaped and bounded, and the consumer
    moves on instead of stopping at that entry for good."""
    bad = env.stamps[2]
    if kind == "huge":
        error: Exception = ValueError("x" * 1_000_000)
    else:
        error = HOSTILE_ERRORS[kind][0]
    deliveries = Deliveries()

    async def handle(entry: OutboxEntry, *tx: Any) -> None:
        if entry.versionstamp == bad:
            raise error
        if tx:
            await tx[0].execute(env.effect(entry))

    with anyio.fail_after(LIMIT):
        delivered = await env.consumer().run(
            deliveries.handler("A", handle),
            until_caught_up=True,
            transactional=transactional,
            max_attempts=2,
            retry_delay=0.001,
        )
    assert delivered == ENTRIES - 1
    [letter] = await env.consumer().dead_letters()
    assert letter.versionstamp == bad and letter.attempts == 2
    if kind == "huge":
        assert len(letter.error) == MAX_ERROR_LENGTH
        assert letter.error.startswith("ValueError: xxx") and letter.error.endswith("(truncated)")
    else:
        assert letter.error == HOSTILE_ERRORS[kind][1]
    assert await env.consumer().position() == env.stamps[-1]


@MODES
async def test_a_dead_letter_that_cannot_be_stored_halts_at_the_entry(
    env: Env, transactional: bool
) -> None:
    """When the dead letter cannot be stored at all (here: its table is
    gone), the consumer stops with ConsumerHalted naming the entry, the
    cursor before it — it neither skips the entry nor retries forever."""
    bad = env.stamps[2]
    moved = af.Identifier(f"{DEAD_LETTERS}_away")
    deliveries = Deliveries()

    async def handle(entry: OutboxEntry, *tx: Any) -> None:
        if entry.versionstamp == bad:
            raise ValueError("cannot")
        if tx:
            await tx[0].execute(env.effect(entry))

    rename = "ALTER TABLE {a} RENAME TO {b}"
    await env.db.execute(af.sql(rename, a=af.Identifier(DEAD_LETTERS), b=moved))
    try:
        with anyio.fail_after(LIMIT), pytest.raises(ConsumerHalted) as halted:
            await env.consumer().run(
                handle, until_caught_up=True, transactional=transactional, max_attempts=1
            )
    finally:
        await env.db.execute(af.sql(rename, a=moved, b=af.Identifier(DEAD_LETTERS)))
    assert halted.value.versionstamp == bad
    assert bad in str(halted.value) and "dead letter could not be stored" in str(halted.value)
    assert await env.consumer().position() == env.stamps[1]
    # Once it can be stored, the consumer moves on.
    with anyio.fail_after(LIMIT):
        await env.consumer().run(
            deliveries.handler("A", handle),
            until_caught_up=True,
            transactional=transactional,
            max_attempts=1,
        )
    assert [letter.versionstamp for letter in await env.consumer().dead_letters()] == [bad]
    assert await env.consumer().position() == env.stamps[-1]
