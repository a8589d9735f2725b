"""Resilience under real faults, per target (see DESIGN.md, "Resilience").

Nothing is mocked: connections are cut, stalled, refused and selectively
dropped by a real TCP proxy (``tests/faults.py``), server backends are killed
with ``pg_terminate_backend`` / ``KILL``, a private server of the test's own
(``tests/servers.py``) is restarted and crashed, and SQLite's write lock is
held by a second process.

What each fault must give (the design's promises):

* a read that loses its connection is run again: the caller sees nothing;
* a mutation phase that loses its connection before COMMIT reached the server
  is re-run as a whole and applied once;
* loss during COMMIT: with the outbox, the unit's entry tells — success is
  reported (never re-applied) or the unit re-run; without, the caller gets
  ``CommitOutcomeUnknown`` — whatever the database holds, never twice;
* a user transaction whose connection breaks raises ``ConnectionLost`` and
  nothing of it is written;
* while the server is unreachable, work waits up to ``reconnect_deadline``,
  then raises ``DatabaseUnavailable``; the same Database recovers by itself;
* under all of it, money is conserved and no unit is applied twice.

The server faults (proxy, kill, restart, crash) need a server: on SQLite
they are skipped with the reason; SQLite's own fault is another process
holding the write lock. Restart, crash and kill-under-load tests are
``slow``; restarts and crashes happen only to the private server, never to
the shared ones other suites use at the same time. Measured numbers (kills,
recovery times) are printed: run with ``-s`` to see them.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import Namespaces, new_namespace
from tests.conftest import Target
from tests.faults import Proxy, tcp_proxy
from tests.servers import PrivateServer

pytestmark = pytest.mark.anyio

ACCOUNTS = 50
INITIAL_BALANCE = 1_000
LOAD_UNITS = 1_000
CONCURRENCY = 16
RETRY = af.ExponentialBackoff(max_retries=100, initial=0.001, maximum=0.05)
KILL_INTERVAL = 0.5  # seconds between rounds of killing every pooled backend
MIN_KILL_ROUNDS = 3  # rounds that must kill sessions while the load runs
DEADLINE = 1.0  # reconnect_deadline of the "unreachable" tests
CONNECT_TIMEOUT = 2.0
TEST_LIMIT = 60  # seconds; a hang fails the test instead of blocking the suite

SKIP_SQLITE_SERVER = (
    "SQLite is embedded: there is no server connection to cut, kill or restart "
    "(its fault, another process holding the write lock, is "
    "test_sqlite_write_lock_held_by_another_process)"
)

BANK = af.Schema(
    "bank",
    af.Table(
        "accounts",
        af.Column("owner", "string"),
        af.Column("balance", "bigint", default=0),
        af.Index("by_owner", ["owner"], unique=True),
    ),
    af.Table(
        "transfers",
        af.Reference("src", "accounts"),
        af.Reference("dst", "accounts"),
        af.Column("amount", "bigint"),
        # Not unique on purpose: a unit applied twice must show, not fail.
        af.Column("seq", "bigint"),
        af.Index("by_seq", ["seq"]),
    ),
)

ALLOWED = (af.ConnectionLost, af.DatabaseUnavailable)  # CommitOutcomeUnknown is a ConnectionLost
# The outcome of a unit whose caller cancelled it: applied or not, but whole.
CANCELLED = object()


# -- fixtures ------------------------------------------------------------------


@dataclass
class Server:
    """The database server of a target: its URL, and how to reach it through
    a proxy."""

    target: Target
    url: str
    host: str
    port: int

    def via(self, proxy: Proxy) -> str:
        """The URL of this server through ``proxy``."""
        parts = urlsplit(self.url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def connect(self, url: str | None = None, **options: Any) -> af.Connect:
        return af.connect(url or self.url, backend=self.target.backend, **options)

    @asynccontextmanager
    async def proxied(self, **options: Any) -> AsyncIterator[tuple[Proxy, af.Database]]:
        """A proxy to the server and a Database connected through it."""
        async with (
            tcp_proxy(self.host, self.port) as proxy,
            self.connect(self.via(proxy), **options) as db,
        ):
            yield proxy, db


@pytest.fixture
def server(target: Target, url: str) -> Server:
    if target.dialect == "sqlite":
        pytest.skip(SKIP_SQLITE_SERVER)
    parts = urlsplit(url)
    default_port = 5432 if target.dialect == "postgresql" else 3306
    return Server(target, url, parts.hostname or "127.0.0.1", parts.port or default_port)


class Bank:
    """A migrated, seeded namespace; ``admin`` is a separate, direct
    Database used to set up, inspect and clean up (never faulted)."""

    def __init__(self, admin: af.Database, namespace: str) -> None:
        self.admin = admin
        self.namespace = namespace
        self.outbox_start: str | None = None

    def ident(self, table: str) -> af.Identifier:
        return self.admin.layout(BANK, self.namespace).table(table).identifier

    def marker(self, table: str) -> bytes:
        """How the table's name appears in this dialect's SQL text."""
        return self.admin.compile(af.sql("{t}", t=self.ident(table))).sql.encode()

    def key(self, seq: int) -> str:
        return f"{self.namespace}-{seq}"

    async def transfers(self) -> list[af.Row]:
        return await self.admin.fetch(af.sql("SELECT * FROM {t}", t=self.ident("transfers")))

    async def seqs(self) -> Counter[int]:
        return Counter(int(t["seq"]) for t in await self.transfers())


@pytest.fixture
def private(target: Target, private_server: PrivateServer) -> Server:
    """The target's private server (tests/servers.py), for the faults the
    shared servers must not see: restarts and crashes."""
    return Server(target, private_server.url, "127.0.0.1", private_server.port)


@pytest.fixture
async def bank(server: Server) -> AsyncIterator[Bank]:
    async with open_bank(server) as made:
        yield made


@pytest.fixture
async def private_bank(private: Server) -> AsyncIterator[Bank]:
    async with open_bank(private) as made:
        yield made


@asynccontextmanager
async def open_bank(server: Server) -> AsyncIterator[Bank]:
    """A Bank in a new namespace on ``server``, dropped afterwards."""
    # pre_ping: after a restart the admin must not trip over its own dead
    # idle connections when it inspects and cleans up.
    async with server.connect(pool_size=4, pre_ping=True) as admin:
        namespaces = Namespaces(admin)
        namespace = namespaces.use(admin, BANK).namespace
        try:
            await admin.migrate(BANK, namespace=namespace)

            async def seed(uow: af.UnitOfWork) -> None:
                for i in range(ACCOUNTS):
                    uow.create("accounts", {"owner": f"acct{i:02}", "balance": INITIAL_BALANCE})

            await admin.execute_uow(seed, schema=BANK, namespace=namespace)
            made = Bank(admin, namespace)
            made.outbox_start = await admin.outbox.latest()
            yield made
        finally:
            await namespaces.drop()


# -- the transfer workload -----------------------------------------------------


def plan(seq: int) -> tuple[str, str, int]:
    """Transfer ``seq``: (from, to, amount), the same on every attempt."""
    rng = random.Random(seq)
    src, dst = rng.sample(range(ACCOUNTS), 2)
    return f"acct{src:02}", f"acct{dst:02}", rng.randint(1, 25)


@dataclass
class Load:
    """Runs transfer units on ``db`` and records what each one gave."""

    bank: Bank
    db: af.Database
    calls: Counter[int] = field(default_factory=Counter)  # fn runs per unit
    # Attempts per unit that got past the function (to the mutation phase).
    mutating: Counter[int] = field(default_factory=Counter)
    # Given a proxy: per unit, how many faults it had injected at each run of fn.
    proxy: Proxy | None = None
    drops_at_call: dict[int, list[int]] = field(default_factory=dict)
    outcomes: dict[int, Any] = field(default_factory=dict)  # RowId, or the exception
    finished: list[float] = field(default_factory=list)  # monotonic times of successes
    conflicts: int = 0
    # Units run with an idempotency key: with the outbox off, the key's row
    # then settles a lost COMMIT as the outbox entry does.
    keyed: bool = True

    @property
    def outbox(self) -> bool:
        return bool(self.db.options.outbox)

    @property
    def settles(self) -> bool:
        """Whether a lost COMMIT of these units is settled (not CommitOutcomeUnknown)."""
        return self.outbox or self.keyed

    def transfer(self, seq: int) -> Callable[[af.UnitOfWork], Awaitable[af.RowId]]:
        src, dst, amount = plan(seq)

        async def transfer(uow: af.UnitOfWork) -> af.RowId:
            self.calls[seq] += 1
            if self.proxy is not None:
                self.drops_at_call.setdefault(seq, []).append(self.proxy.drops)
            a = uow.find_first("accounts", where={"owner": src})
            b = uow.find_first("accounts", where={"owner": dst})
            await uow.retrieve()
            acc_a, acc_b = a.result, b.result
            uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - amount}, check=True)
            uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + amount}, check=True)
            return uow.create(
                "transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": amount, "seq": seq}
            )

        return transfer

    def _count_conflict(self, uow: af.UnitOfWork, exc: Exception) -> None:
        self.conflicts += 1

    async def run(self, seq: int) -> Any:
        """Unit ``seq``; its result or exception is recorded (and returned)."""
        try:
            value = await self.db.execute_uow(
                self.transfer(seq),
                schema=BANK,
                namespace=self.bank.namespace,
                retry=RETRY,
                idempotency_key=self.bank.key(seq) if self.keyed else None,
                hooks=af.UowHooks(
                    before_mutation=lambda uow: self.mutating.update([seq]),
                    on_conflict=self._count_conflict,
                ),
            )
        except Exception as exc:
            self.outcomes[seq] = exc
            return exc
        self.outcomes[seq] = value
        self.finished.append(time.monotonic())
        return value

    async def run_while(
        self, seqs: Iterator[int], concurrency: int, more: Callable[[], bool]
    ) -> None:
        """Units numbered from ``seqs``, ``concurrency`` at a time, each worker
        starting another while ``more()`` holds."""

        async def worker() -> None:
            while more():
                await self.run(next(seqs))

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)

    def assert_retries(self, seq: int, forced: int = 0) -> None:
        """Unit ``seq`` (the only one its Database has run) ran its function
        once per attempt, and each attempt after the first was a legitimate
        retry counted in ``db.stats``: a conflict, the connection lost
        before COMMIT, or a lost COMMIT its record showed not applied —
        ``forced`` of the last two the test's fault's doing, any more the
        machine's (a loaded CI runner). The audit shows it applied once."""
        stats = self.db.stats
        assert self.calls[seq] == stats.attempts, stats
        assert self.calls[seq] == 1 + stats.conflicts + stats.lost_connection_retries, stats
        assert stats.lost_connection_retries >= forced, stats

    def assert_none_after_fault(self, seq: int, allowed: int = 0) -> None:
        """No run of unit ``seq`` started after the proxy's fault (at most
        ``allowed``): a unit whose COMMIT may have been applied is not run
        again. (Runs before the fault are retries before COMMIT.)"""
        assert self.proxy is not None
        after = sum(1 for drops in self.drops_at_call[seq] if drops)
        assert after <= allowed, (self.drops_at_call, self.summary())

    def reruns_were_retries(self, seq: int) -> None:
        """:meth:`assert_retries`, and none after the fault: the attempt
        whose COMMIT was lost was the last."""
        self.assert_retries(seq)
        self.assert_none_after_fault(seq)

    def summary(self) -> str:
        kinds = Counter(
            "ok" if isinstance(v, af.RowId) else type(v).__name__ for v in self.outcomes.values()
        )
        reruns = sum(self.calls.values()) - len(self.calls) - self.conflicts
        return (
            f"outbox={self.outbox}: outcomes {dict(kinds)}, conflicts retried "
            f"{self.conflicts}, re-runs after a lost connection {reruns}"
        )


class Misclassified(AssertionError):
    """A unit failed with an error that is not one of the documented
    connection errors (ConnectionLost, CommitOutcomeUnknown,
    DatabaseUnavailable)."""


async def audit(
    *loads: Load,
    strict: bool | None = None,
    tolerate: Callable[[BaseException], bool] = lambda error: False,
) -> None:
    """The books after faulted loads on one bank (their unit numbers differ).

    * money is conserved, and every balance and version is what the applied
      transfers make it (no lost or doubled update);
    * a unit that returned is applied exactly once (its row is the one it
      returned); one that raised anything but ``CommitOutcomeUnknown`` is not
      applied; one that raised ``CommitOutcomeUnknown`` at most once;
    * with the outbox: exactly one entry per applied unit, none for any other
      unit, and versions contiguous after the starting point;
    * ``tolerate``: errors of known, separately tested bugs not to fail for
      (their units are still checked: applied at most once, and not at all
      unless the error is a ``CommitOutcomeUnknown``);
    * ``strict`` (default: when the load's lost COMMITs are settled — the
      outbox on, or units with idempotency keys): every unit returned;
    * finally, any unit that failed raised a documented connection error
      (else :class:`Misclassified`).
    """
    bank = loads[0].bank
    admin = bank.admin
    outcomes = {seq: outcome for load in loads for seq, outcome in load.outcomes.items()}
    with_outbox = {seq for load in loads if load.outbox for seq in load.outcomes}

    accounts = await admin.fetch(af.sql("SELECT * FROM {t}", t=bank.ident("accounts")))
    transfers = await bank.transfers()
    assert len(accounts) == ACCOUNTS
    assert sum(int(a["balance"]) for a in accounts) == ACCOUNTS * INITIAL_BALANCE

    applied = Counter(int(t["seq"]) for t in transfers)
    twice = {seq: n for seq, n in applied.items() if n > 1}
    assert not twice, f"units applied more than once: {twice}"
    assert set(applied) <= set(outcomes)
    row_of = {int(t["seq"]): t for t in transfers}
    for seq, outcome in outcomes.items():
        if isinstance(outcome, af.CommitOutcomeUnknown) or outcome is CANCELLED:
            continue  # either way, but once at most (checked above)
        if isinstance(outcome, BaseException):
            assert seq not in applied, f"unit {seq} raised {outcome!r} but was applied"
        else:
            assert seq in applied, f"unit {seq} returned but is not in the database"
            assert row_of[seq]["id"] == outcome

    owner_of = {a["_id"]: a["owner"] for a in accounts}
    balance = Counter({a["_id"]: INITIAL_BALANCE for a in accounts})
    touches: Counter[Any] = Counter()
    for t in transfers:
        src, dst, amount = plan(int(t["seq"]))
        assert (owner_of[t["src"]], owner_of[t["dst"]], int(t["amount"])) == (src, dst, amount)
        balance[t["src"]] -= amount
        balance[t["dst"]] += amount
        touches[t["src"]] += 1
        touches[t["dst"]] += 1
    for a in accounts:
        assert int(a["balance"]) == balance[a["_id"]], a["owner"]
        assert int(a["_version"]) == touches[a["_id"]], a["owner"]

    entries = await outbox_after(admin, bank.outbox_start)
    mine = Counter(e.uow_id for e in entries if e.uow_id.startswith(f"{bank.namespace}-"))
    assert all(n == 1 for n in mine.values()), f"duplicate outbox entries: {mine.most_common(3)}"
    assert set(mine) == {bank.key(seq) for seq in applied if seq in with_outbox}
    versions = [int(e.versionstamp[:20], 16) for e in entries]
    # Contiguous from the entry after the newest one present at the start (or
    # from the first, if the outbox was empty: it may have been emptied by hand
    # with its counter kept).
    if bank.outbox_start is not None:
        first = int(bank.outbox_start[:20], 16) + 1
    else:
        first = versions[0] if versions else 1
    assert versions == list(range(first, first + len(versions))), "outbox versions have gaps"

    for load in loads:
        if strict or (strict is None and load.settles):
            failed = {
                seq: error
                for seq, error in load.outcomes.items()
                if isinstance(error, ALLOWED) and not tolerate(error)
            }
            assert not failed, (
                f"units failed: {dict(itertools.islice(failed.items(), 5))!r}; the first: "
                + "".join(traceback.format_exception(next(iter(failed.values()))))
            )
    odd = {
        seq: error
        for seq, error in outcomes.items()
        if isinstance(error, Exception) and not isinstance(error, ALLOWED) and not tolerate(error)
    }
    if odd:
        kinds = Counter(f"{type(o).__name__}: {o}" for o in odd.values())
        raise Misclassified(f"units failed with undocumented errors: {dict(kinds.most_common(4))}")


async def outbox_after(db: af.Database, start: str | None) -> list[Any]:
    entries: list[Any] = []
    after = start
    while True:
        page = await db.outbox.list(after=after, limit=10_000)
        entries += page
        if len(page) < 10_000:
            return entries
        after = page[-1].versionstamp


# -- cancellation storms -------------------------------------------------------------

STORM_ROUNDS = 15
STORM_TASKS = 16


@pytest.mark.slow
async def test_cancel_storm_during_load(server: Server, bank: Bank, target: Target) -> None:
    """Fifteen rounds of 16 tasks running transfer units with the outbox on,
    each cancelled after a random time up to twice a unit's duration —
    before, during or after its mutation phase (a cancelled query is interrupted: PostgreSQL cancel
    request, MySQL ``KILL QUERY`` from a second connection, the connection
    discarded). A cancelled unit may or may not be applied, but only whole:
    money conserved, every transfer row with exactly one outbox entry and
    none without, versions contiguous; and the Database goes on working."""
    rng = random.Random(23)
    seqs = itertools.count()
    async with server.connect(pool_size=STORM_TASKS, outbox=True) as db:
        load = Load(bank, db)

        async def one(seq: int, after: float) -> None:
            load.outcomes[seq] = CANCELLED
            with anyio.move_on_after(after):
                await load.run(seq)

        with anyio.fail_after(TEST_LIMIT * 2):
            # How long a unit takes here, 16 at a time (warm-up, uncancelled;
            # the first round opens the connections).
            for rounds in (1, 3):
                started = time.monotonic()
                target_count = len(load.outcomes) + STORM_TASKS * rounds
                await load.run_while(
                    seqs, STORM_TASKS, lambda n=target_count: len(load.outcomes) < n
                )
                took = (time.monotonic() - started) / rounds
            for _ in range(STORM_ROUNDS):
                async with anyio.create_task_group() as tg:
                    for _ in range(STORM_TASKS):
                        tg.start_soon(one, next(seqs), rng.uniform(0, 2 * took))
            last = next(seqs)
            assert isinstance(await load.run(last), af.RowId), load.outcomes[last]
    kinds = Counter(
        "cancelled" if o is CANCELLED else "ok" if isinstance(o, af.RowId) else type(o).__name__
        for o in load.outcomes.values()
    )
    applied = await bank.seqs()
    print(
        f"\n[fault] {target} cancel storm (a unit takes ~{took * 1000:.0f} ms): "
        f"outcomes {dict(kinds)}, applied {len(applied)}"
    )
    await audit(load, strict=False)


# -- server-side faults: killing backends ------------------------------------------


async def kill_backends(admin: af.Database, ports: set[int]) -> int:
    """Terminate, on the server, the sessions whose client port is in
    ``ports`` (the proxy's upstream connections: only the Database under
    test). Returns how many were killed."""
    if not ports:
        return 0
    params = {f"p{i}": port for i, port in enumerate(sorted(ports))}
    if admin.name == "postgresql":
        listed = ", ".join(f"{{{name}}}" for name in params)
        rows = await admin.fetch(
            af.sql(
                "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity "
                f"WHERE client_port IN ({listed}) AND pid <> pg_backend_pid()",
                **params,
            )
        )
        return sum(1 for row in rows if row["killed"])
    hosts = {name: f"127.0.0.1:{port}" for name, port in params.items()}
    listed = ", ".join(f"{{{name}}}" for name in hosts)
    rows = await admin.fetch(
        af.sql(
            f"SELECT ID AS id FROM information_schema.PROCESSLIST WHERE HOST IN ({listed}) "
            "AND ID <> CONNECTION_ID()",
            **hosts,
        )
    )
    killed = 0
    for row in rows:
        try:
            await admin.execute(af.sql("KILL {i}", i=int(row["id"])))
            killed += 1
        except af.DatabaseError as exc:
            if exc.code != "1094":  # unknown thread id: it ended meanwhile
                raise
    return killed


@pytest.mark.parametrize("outbox", [False, True], ids=["no-outbox", "outbox"])
async def test_server_terminates_idle_connection(
    server: Server, bank: Bank, target: Target, outbox: bool, request: pytest.FixtureRequest
) -> None:
    """The server ends an idle pooled session (``pg_terminate_backend`` /
    ``KILL``) and the close reaches the client a moment after what the server
    said before closing (here: held 1 s by the proxy). The next unit of work
    on that Database must still succeed, applied exactly once."""
    async with server.proxied(pool_size=1, outbox=outbox) as (proxy, db):
        load = Load(bank, db)
        assert isinstance(await load.run(0), af.RowId)
        proxy.delay_close(1.0)
        assert await kill_backends(bank.admin, proxy.upstream_ports()) == 1
        await anyio.sleep(0.2)  # the server's last words arrive; its close does not yet
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(1)
    # (Outside the proxy's task group, which would wrap it in an ExceptionGroup.)
    assert isinstance(outcome, af.RowId), repr(outcome)
    await audit(load, strict=True)


@pytest.mark.slow
async def test_backends_killed_repeatedly_during_load(
    server: Server, bank: Bank, target: Target, request: pytest.FixtureRequest
) -> None:
    """At least 1,000 transfer units at concurrency 16 — half on a Database
    with the outbox, half on one without, over the same 50 accounts — while
    every 0.5 s each server session of both is terminated (PostgreSQL
    ``pg_terminate_backend``, MariaDB ``KILL``). The load goes on until at
    least MIN_KILL_ROUNDS rounds have killed sessions, however fast the
    machine. Their sessions are told apart from everyone else's by their
    client port: the Databases connect through a pass-through proxy whose
    upstream ports we know."""
    kills: list[int] = []
    plain_seqs, outbox_seqs = itertools.count(0, 2), itertools.count(1, 2)

    def more() -> bool:
        started = len(plain.calls) + len(outboxed.calls)
        return started < LOAD_UNITS or sum(1 for k in kills if k) < MIN_KILL_ROUNDS

    async with (
        server.proxied(pool_size=CONCURRENCY // 2, outbox=False) as (proxy, plain_db),
        server.connect(server.via(proxy), pool_size=CONCURRENCY // 2, outbox=True) as outbox_db,
    ):
        # (The plain units have no key: their lost COMMITs stay unknown.)
        plain, outboxed = Load(bank, plain_db, keyed=False), Load(bank, outbox_db)
        started = time.monotonic()
        with anyio.fail_after(TEST_LIMIT):
            async with anyio.create_task_group() as tg:

                async def killer() -> None:
                    while True:
                        await anyio.sleep(KILL_INTERVAL)
                        kills.append(await kill_backends(bank.admin, proxy.upstream_ports()))

                tg.start_soon(killer)
                async with anyio.create_task_group() as units:
                    units.start_soon(plain.run_while, plain_seqs, CONCURRENCY // 2, more)
                    units.start_soon(outboxed.run_while, outbox_seqs, CONCURRENCY // 2, more)
                tg.cancel_scope.cancel()
        elapsed = time.monotonic() - started
        ran = len(plain.outcomes) + len(outboxed.outcomes)
        # The same Databases go on working.
        for load, seqs in ((plain, plain_seqs), (outboxed, outbox_seqs)):
            seq = next(seqs)
            assert isinstance(await load.run(seq), af.RowId), load.outcomes[seq]

    print(
        f"\n[fault] {target} kill every {KILL_INTERVAL}s: {ran} units in {elapsed:.2f}s, "
        f"{sum(kills)} sessions killed in {sum(1 for k in kills if k)} rounds; "
        f"{plain.summary()}; {outboxed.summary()}"
    )
    assert ran >= LOAD_UNITS
    assert sum(1 for k in kills if k) >= MIN_KILL_ROUNDS, f"too few rounds killed: {kills}"
    await audit(plain, outboxed)


# -- proxy faults on single units ------------------------------------------------


async def wait_cut(proxy: Proxy) -> None:
    """Until the proxy has closed every connection, and a little longer: the
    client's event loop (under trio, the bridge's thread) must have seen the
    close for the pool to know — as it would long since after a real outage."""
    with anyio.fail_after(5):
        await proxy.wait_closed()
    await anyio.sleep(0.2)


@pytest.mark.parametrize("outbox", [False, True], ids=["no-outbox", "outbox"])
async def test_cut_during_retrieval_is_retried(server: Server, bank: Bank, outbox: bool) -> None:
    """The connection breaks under the retrieval phase's first SELECT (it
    never reaches the server): the reads run again on a fresh connection,
    without re-running the unit's function, and the unit succeeds once."""
    async with server.proxied(pool_size=2, outbox=outbox) as (proxy, db):
        load = Load(bank, db)
        proxy.drop_after(bank.marker("accounts"), forward=False)
        with anyio.fail_after(TEST_LIMIT):
            await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        # The cut read ran again inside retrieve(): every run of the function
        # got past its reads, and any other run was a retry before COMMIT.
        assert load.mutating[0] == load.calls[0]
        assert load.calls[0] == 1 + db.stats.conflicts + db.stats.lost_connection_retries
    await audit(load, strict=True)


async def test_lost_plain_select_is_run_again_and_no_other_statement_is(
    server: Server, bank: Bank
) -> None:
    """``db.fetch`` of a plain SELECT whose reply is lost (the server ran it)
    runs it once more on a fresh connection and returns its rows; a read that
    is not a plain SELECT (``WITH ...``, which could be a data-changing CTE)
    lost the same way raises ConnectionLost, and is not sent again."""
    async with server.proxied(pool_size=2) as (proxy, db):
        await db.fetch(af.sql("SELECT 1 AS one"))
        proxy.drop_after(b"lost-plain-select", forward=True)
        with anyio.fail_after(TEST_LIMIT):
            rows = await db.fetch(af.sql("SELECT {m} AS m", m="lost-plain-select"))
        assert proxy.drops == 1, "the fault was not injected"
        assert [row["m"] for row in rows] == ["lost-plain-select"]
        proxy.drop_after(b"lost-with-read", forward=True)
        with anyio.fail_after(TEST_LIMIT), pytest.raises(af.ConnectionLost):
            await db.fetch(
                af.sql("WITH x AS (SELECT {m} AS m) SELECT m FROM x", m="lost-with-read")
            )
        assert proxy.drops == 2
        assert await db.fetch_value(af.sql("SELECT {n} + 1 AS v", n=1)) == 2


@pytest.mark.parametrize("outbox", [False, True], ids=["no-outbox", "outbox"])
async def test_loss_before_commit_reruns_the_unit_once(
    server: Server, bank: Bank, outbox: bool
) -> None:
    """The connection breaks in the mutation phase, on the INSERT (which never
    reaches the server), before COMMIT: the server rolls back and the whole
    unit is re-run and applied exactly once."""
    async with server.proxied(pool_size=2, outbox=outbox) as (proxy, db):
        load = Load(bank, db)
        proxy.drop_after(b"INSERT", forward=False)
        with anyio.fail_after(TEST_LIMIT):
            await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        load.assert_retries(0, forced=1)
    await audit(load, strict=True)


def assert_not_rerun(load: Load) -> None:
    """After a lost COMMIT reply that the unit's record settled (and an
    audit that found unit 0 applied once): the unit's function did not run
    again after the fault, and any other run was a counted retry before it.

    On MySQL one exception is correct: the COMMIT goes out in one
    multi-statement message with the unit's writes and record (its outbox
    entry or its key's row), and a server that finds its client gone
    mid-message stops before the COMMIT if the cut comes first (a race).
    The look-up then finds no record, and the unit rightly runs again
    (counted as a lost connection's retry); the audit shows it applied
    exactly once."""
    load.assert_retries(0)
    load.assert_none_after_fault(0, allowed=1 if load.db.name == "mysql" else 0)


def outbox_commit(bank: Bank, seq: int) -> bytes:
    """What the message that commits unit ``seq``'s mutation phase carries
    with the outbox on: the unit's id, bound only in its outbox entry, which
    goes out with the COMMIT (MySQL) or in the one statement that writes the
    phase and commits on its own (PostgreSQL; its text goes out earlier, to
    be prepared)."""
    return bank.key(seq).encode()


async def test_commit_never_reached_server_with_outbox(server: Server, bank: Bank) -> None:
    """The COMMIT itself is lost on the way (the server rolls back). The
    client cannot know that; with the outbox, the executor finds no entry for
    the unit and re-runs it: applied exactly once."""
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        load = Load(bank, db)
        proxy.drop_after(outbox_commit(bank, 0), forward=False)
        with anyio.fail_after(TEST_LIMIT):
            await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        load.assert_retries(0, forced=1)
    await audit(load, strict=True)


async def test_lost_commit_resolved_inside_a_callers_transaction(
    server: Server, bank: Bank
) -> None:
    """A unit run while the caller holds a ``db.transaction()`` of the same
    Database, whose COMMIT never reaches the server: the executor's look-up
    (end the lost session, lock the outbox counter, find the entry) must not
    join the caller's transaction — there its share lock on the counter
    would last until the caller commits, and the unit's re-run, which needs
    that row, would wait for a caller who waits for it. Re-run, applied
    once; the caller's transaction commits afterwards."""
    async with server.proxied(pool_size=3, outbox=True) as (proxy, db):
        load = Load(bank, db)
        proxy.drop_after(outbox_commit(bank, 0), forward=False)
        with anyio.fail_after(TEST_LIMIT):
            async with db.transaction() as tx:
                await tx.fetch(af.sql("SELECT 1 AS one"))  # (opened on the server)
                outcome = await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        assert isinstance(outcome, af.RowId), outcome
        assert load.calls[0] == 2
    await audit(load, strict=True)


async def test_commit_never_reached_server_without_outbox(server: Server, bank: Bank) -> None:
    """The same without the outbox or an idempotency key: the client cannot
    tell this from a lost reply, so it reports CommitOutcomeUnknown and
    re-runs nothing — and indeed nothing was written."""
    async with server.proxied(pool_size=2, outbox=False) as (proxy, db):
        load = Load(bank, db, keyed=False, proxy=proxy)
        proxy.drop_after(b"COMMIT", forward=False)
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        assert isinstance(outcome, af.CommitOutcomeUnknown), outcome
        assert outcome.__cause__ is not None
        load.reruns_were_retries(0)
        assert await bank.seqs() == Counter()
        # The Database replaced the connection and goes on.
        assert isinstance(await load.run(1), af.RowId)
    await audit(load, strict=False)


@pytest.mark.parametrize("forward", [False, True], ids=["never-reached", "reply-lost"])
async def test_lost_commit_settled_by_the_key_without_outbox(
    server: Server, bank: Bank, forward: bool
) -> None:
    """Without the outbox, a unit given an idempotency key records the key
    in its transaction: after a lost COMMIT the executor ends the session
    and finds the key's row — this call's — or not. A COMMIT that never
    reached the server re-runs the unit; one whose reply was lost reports
    success without re-running it. Applied exactly once either way."""
    async with server.proxied(pool_size=2, outbox=False) as (proxy, db):
        load = Load(bank, db, proxy=proxy)
        proxy.drop_after(b"COMMIT", forward=forward)
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        assert isinstance(outcome, af.RowId), outcome
        if not forward:
            load.assert_retries(0, forced=1)
        assert await bank.seqs() == Counter({0: 1})
    await audit(load, strict=True)
    if forward:  # (applied: not run again once its COMMIT was sent)
        assert_not_rerun(load)


async def test_commit_reply_lost_with_outbox(server: Server, bank: Bank) -> None:
    """The server commits but its reply is lost: with the outbox, the
    executor finds the unit's entry and reports success — without running
    the unit again. Applied exactly once."""
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        load = Load(bank, db, proxy=proxy)
        proxy.drop_after(outbox_commit(bank, 0), forward=True)
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        assert isinstance(outcome, af.RowId), outcome
    await audit(load, strict=True)
    assert_not_rerun(load)


@pytest.mark.parametrize("outbox", [True, False], ids=["outbox", "key-only"])
@pytest.mark.parametrize("forward", [True, False], ids=["reply-lost", "never-reached"])
async def test_lost_commit_whose_lookup_cannot_connect_is_unknown(
    server: Server, bank: Bank, outbox: bool, forward: bool
) -> None:
    """The message that commits the unit is lost (its reply, or itself), and
    then the server refuses new connections for longer than the unit's
    reconnect budget, so the look-up that would settle the COMMIT cannot
    run. Whether the unit committed is unknown: it must raise
    CommitOutcomeUnknown (chained to the look-up's error) — never
    DatabaseUnavailable, which would say that nothing was done and invite a
    second application — and it must not run again. Once the server is
    back, a retry with the same key settles it: AlreadyApplied if the first
    call committed, else applied now; once either way."""
    async with server.proxied(
        pool_size=1, outbox=outbox, reconnect_deadline=DEADLINE, connect_timeout=CONNECT_TIMEOUT
    ) as (proxy, db):
        load = Load(bank, db)
        marker = outbox_commit(bank, 0) if outbox else b"COMMIT"
        proxy.drop_after(marker, forward=forward)

        def refuse(uow: af.UnitOfWork) -> None:
            proxy.refuse(True)  # (the unit's own connection is open already)

        with anyio.fail_after(TEST_LIMIT):
            try:
                await db.execute_uow(
                    load.transfer(0),
                    schema=BANK,
                    namespace=bank.namespace,
                    idempotency_key=bank.key(0),
                    hooks=af.UowHooks(before_mutation=refuse),
                )
                outcome: BaseException | None = None
            except Exception as exc:
                outcome = exc
            assert proxy.drops == 1, "the fault was not injected"
            # Whether the server committed: usually yes when only the reply
            # was lost, but on MySQL a client gone mid-batch can also stop
            # the batch (a write's ROW_COUNT() reads -1), which is safe too.
            first = (await bank.seqs())[0]
            proxy.refuse(False)
            again = await load.run(0)  # the same key, the server reachable again
    assert isinstance(outcome, af.CommitOutcomeUnknown), repr(outcome)
    assert isinstance(outcome.__cause__, af.ConnectionLost | af.DatabaseUnavailable), repr(
        outcome.__cause__
    )
    assert load.calls[0] == 2  # once in the faulted call, once in the retry
    if not forward:
        assert first == 0
    if first:
        assert isinstance(again, af.AlreadyApplied), repr(again)
    else:
        assert isinstance(again, af.RowId), repr(again)
    assert await bank.seqs() == Counter({0: 1})


async def test_commit_in_flight_when_connection_lost_with_outbox(
    server: Server, bank: Bank
) -> None:
    """COMMIT is sent on to the server and the connection closed at once —
    the commit may still be running when the executor looks for the unit's
    outbox entry (it waits on the counter row's lock for exactly this). Over
    a few units: each succeeds and is applied exactly once, re-run or not."""
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        load = Load(bank, db)
        with anyio.fail_after(TEST_LIMIT):
            for seq in range(5):
                proxy.drop_after(outbox_commit(bank, seq), forward=True, wait_reply=False)
                assert isinstance(await load.run(seq), af.RowId), load.outcomes[seq]
        assert proxy.drops == 5, "the fault was not injected"
    await audit(load, strict=True)


async def test_commit_reply_lost_without_outbox(server: Server, bank: Bank) -> None:
    """The server commits but its reply is lost, no outbox and no key:
    CommitOutcomeUnknown, the unit is not re-run, and its write is in the
    database exactly once."""
    async with server.proxied(pool_size=2, outbox=False) as (proxy, db):
        load = Load(bank, db, keyed=False, proxy=proxy)
        proxy.drop_after(b"COMMIT", forward=True)
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
        assert proxy.drops == 1, "the fault was not injected"
        assert isinstance(outcome, af.CommitOutcomeUnknown), outcome
        load.reruns_were_retries(0)
        assert await bank.seqs() == Counter({0: 1})
        assert isinstance(await load.run(1), af.RowId)
    await audit(load, strict=False)


async def open_connections(db: af.Database, n: int) -> None:
    """Make ``db``'s pool hold ``n`` open connections (n overlapping queries)."""
    sleep = "SELECT pg_sleep(0.1)" if db.name == "postgresql" else "SELECT SLEEP(0.1)"
    async with anyio.create_task_group() as tg:
        for _ in range(n):
            tg.start_soon(db.execute, db._engine.raw(sleep))


class Unresolved(AssertionError):
    """The outbox did not resolve a lost COMMIT."""


async def test_commit_reply_lost_then_lookup_commit_lost_with_outbox(
    server: Server, bank: Bank
) -> None:
    """The unit's COMMIT reply is lost, and then so is the reply to the COMMIT
    of the executor's read-only look-up of the unit's outbox entry. The unit
    did commit and its entry is there: success must be reported, the unit
    applied exactly once."""
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        load = Load(bank, db, proxy=proxy)
        # Two pooled connections, so that the look-up runs on an open one
        # (on MySQL, opening one sends a COMMIT too, which would take the drop).
        await open_connections(db, 2)
        assert proxy.connections == 2
        proxy.drop_after(outbox_commit(bank, 0), forward=True, then=[b"COMMIT"])
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
        assert proxy.drops == 2, "the faults were not injected"
        assert await bank.seqs() == Counter({0: 1})
    # (Outside the proxy's task group, which would wrap it in an ExceptionGroup.)
    if not isinstance(outcome, af.RowId):
        raise Unresolved(f"the unit committed, but raised {outcome!r}")
    await audit(load, strict=True)
    assert_not_rerun(load)


async def test_commit_read_late_by_the_server_with_outbox(server: Server, bank: Bank) -> None:
    """The network keeps the message that commits the unit back (on MySQL the
    outbox entry with the COMMIT; on PostgreSQL the one statement that writes
    and commits the phase) and closes the client's side, while
    the server session lives on without having read it. The executor must end
    that session before it looks for the unit's entry: else it finds none and
    re-runs the unit, and the late COMMIT applies it a second time (or, where
    the session already holds the outbox counter row, the look-up waits on it
    forever). Delivered afterwards, the COMMIT finds its session gone: the
    unit is applied exactly once."""
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        load = Load(bank, db)
        proxy.hold_after(outbox_commit(bank, 0))
        with anyio.fail_after(TEST_LIMIT):
            outcome = await load.run(0)
            assert proxy.held == 1, "the fault was not injected"
            await proxy.release_held()
        load.assert_retries(0, forced=1)
    assert isinstance(outcome, af.RowId), outcome
    await audit(load, strict=True)


async def test_commit_read_late_unchecked_unit_with_outbox(server: Server, bank: Bank) -> None:
    """The same with a unit that only creates a row: no version check can
    stop the late statement there, so only ending the lost session keeps it
    from applying the unit a second time."""
    calls = 0

    async def unit(uow: af.UnitOfWork) -> None:
        nonlocal calls
        calls += 1
        account = uow.find_first("accounts", where={"owner": "acct00"})
        await uow.retrieve()
        ref = account.result["id"]
        uow.create("transfers", {"src": ref, "dst": ref, "amount": 0, "seq": 0})

    key = bank.key(0)
    start = await bank.admin.outbox.latest()
    async with server.proxied(pool_size=2, outbox=True) as (proxy, db):
        await open_connections(db, 2)  # (on MySQL, opening one sends a COMMIT)
        proxy.hold_after(key.encode())
        with anyio.fail_after(TEST_LIMIT):
            await db.execute_uow(unit, schema=BANK, namespace=bank.namespace, idempotency_key=key)
            assert proxy.held == 1, "the fault was not injected"
            await proxy.release_held()
        assert calls == 2
    assert await bank.seqs() == Counter({0: 1})
    entries = await outbox_after(bank.admin, start)
    assert [entry.uow_id for entry in entries].count(key) == 1


async def transfer_insert(bank: Bank) -> Callable[[str, int], af.Fragment]:
    """For user transactions: the INSERT of a transfer row (``id``, ``seq``)
    from and to one account."""
    account = await bank.admin.fetch_value(
        af.sql("SELECT MIN(_id) FROM {a}", a=bank.ident("accounts"))
    )
    template = (
        "INSERT INTO {t} (id, src, dst, amount, seq, _version) VALUES ({id}, {a}, {a}, 1, {s}, 0)"
    )

    def insert(row_id: str, seq: int) -> af.Fragment:
        return af.sql(template, t=bank.ident("transfers"), id=row_id, a=account, s=seq)

    return insert


async def test_end_session_after_a_lost_user_commit(server: Server, bank: Bank) -> None:
    """``db.transaction()`` whose COMMIT the network keeps back:
    CommitOutcomeUnknown names the lost server session, and
    ``db.end_session`` ends it — after that, the late COMMIT changes nothing
    and what the database holds is final (here: nothing of the transaction)."""
    insert = await transfer_insert(bank)
    async with server.proxied(pool_size=2) as (proxy, db):
        await open_connections(db, 2)
        proxy.hold_after(b"COMMIT")
        with anyio.fail_after(TEST_LIMIT):
            with pytest.raises(af.CommitOutcomeUnknown) as caught:
                async with db.transaction() as tx:
                    await tx.execute(insert("tx-a", 900))
            assert proxy.held == 1, "the fault was not injected"
            lost = caught.value.server_session
            assert lost is not None
            await db.end_session(lost)
            await proxy.release_held()
        assert await bank.seqs() == Counter()
        # Ending a session that is already gone returns at once.
        with anyio.fail_after(1):
            await db.end_session(lost)


# -- user transactions -----------------------------------------------------------


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
async def test_user_transaction_cut_midway(server: Server, bank: Bank, reset: bool) -> None:
    """``db.transaction()`` whose connection is cut (closed, or reset) between
    two statements: ConnectionLost (not CommitOutcomeUnknown: COMMIT was never
    sent), nothing of it written, and the Database goes on working."""
    insert = await transfer_insert(bank)
    async with server.proxied(pool_size=2) as (proxy, db):
        with anyio.fail_after(TEST_LIMIT), pytest.raises(af.ConnectionLost) as caught:
            async with db.transaction() as tx:
                await tx.execute(insert("tx-a", 900))
                assert proxy.cut_all(reset=reset) == 1
                await wait_cut(proxy)
                await tx.execute(insert("tx-b", 901))
        assert not isinstance(caught.value, af.CommitOutcomeUnknown)
        assert caught.value.__cause__ is not None
        assert await bank.seqs() == Counter()
        assert await db.fetch_value(af.sql("SELECT 40 + {n} AS v", n=2)) == 42


@pytest.mark.parametrize("forward", [False, True], ids=["commit-lost", "reply-lost"])
async def test_user_transaction_commit_lost(server: Server, bank: Bank, forward: bool) -> None:
    """``db.transaction()`` whose COMMIT (``forward=False``) or whose COMMIT's
    reply (``forward=True``) is lost: CommitOutcomeUnknown either way, and the
    database holds the transaction's writes exactly when the server got COMMIT."""
    insert = await transfer_insert(bank)
    async with server.proxied(pool_size=2) as (proxy, db):
        proxy.drop_after(b"COMMIT", forward=forward)
        with anyio.fail_after(TEST_LIMIT), pytest.raises(af.CommitOutcomeUnknown):
            async with db.transaction() as tx:
                await tx.execute(insert("tx-a", 900))
                await tx.execute(insert("tx-b", 901))
        assert proxy.drops == 1
        expected = Counter({900: 1, 901: 1}) if forward else Counter()
        assert await bank.seqs() == expected
        assert await db.fetch_value(af.sql("SELECT 40 + {n} AS v", n=2)) == 42


# -- an unreachable server -------------------------------------------------------


async def _unit_no_reads(db: af.Database, bank: Bank) -> Any:
    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "nobody", "balance": 0})

    return await db.execute_uow(unit, schema=BANK, namespace=bank.namespace)


ENTRY_POINTS: dict[str, Callable[[af.Database, Bank], Awaitable[Any]]] = {
    "execute": lambda db, bank: db.execute(
        af.sql("UPDATE {t} SET balance = balance WHERE owner = 'x'", t=bank.ident("accounts"))
    ),
    "fetch": lambda db, bank: db.fetch(af.sql("SELECT 1 AS one")),
    "transaction": lambda db, bank: _in_transaction(db),
    "execute_uow-writes": _unit_no_reads,
    "execute_uow-reads": lambda db, bank: db.execute_uow(
        Load(bank, db).transfer(0), schema=BANK, namespace=bank.namespace
    ),
}


async def _in_transaction(db: af.Database) -> None:
    async with db.transaction() as tx:
        await tx.execute(af.sql("SELECT 1 AS one"))


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
async def test_dead_idle_connections_are_replaced_at_checkout(
    server: Server, bank: Bank, target: Target, entry: str, request: pytest.FixtureRequest
) -> None:
    """The network closes every pooled connection while it is idle (the server
    itself stays reachable): the next operation, of any kind, gets a fresh
    connection and succeeds; the caller never sees the dead one."""
    async with server.proxied(pool_size=2) as (proxy, db):
        await db.fetch(af.sql("SELECT 1 AS one"))
        assert proxy.cut_all() == 1
        await wait_cut(proxy)
        with anyio.fail_after(TEST_LIMIT):
            await ENTRY_POINTS[entry](db, bank)
        assert proxy.accepted == 2


# ("execute_uow-writes" is left out to save time: it waits ~2.4 s, like "fetch".)
@pytest.mark.parametrize("entry", ["execute", "fetch", "transaction", "execute_uow-reads"])
async def test_unreachable_server_raises_within_deadline(
    server: Server, bank: Bank, target: Target, entry: str, request: pytest.FixtureRequest
) -> None:
    """Connections cut and new ones refused: every way in raises
    DatabaseUnavailable once ``reconnect_deadline`` (1 s) has passed — not
    much later."""
    async with server.proxied(
        pool_size=2, reconnect_deadline=DEADLINE, connect_timeout=CONNECT_TIMEOUT
    ) as (proxy, db):
        await db.fetch(af.sql("SELECT 1 AS one"))
        proxy.refuse(True)
        proxy.cut_all()
        await wait_cut(proxy)
        started = time.monotonic()
        with anyio.fail_after(TEST_LIMIT), pytest.raises(af.DatabaseUnavailable):
            await ENTRY_POINTS[entry](db, bank)
        elapsed = time.monotonic() - started
        print(f"\n[fault] unreachable, {entry}: DatabaseUnavailable after {elapsed:.2f}s")
        assert elapsed >= DEADLINE * 0.5, f"gave up after {elapsed:.2f}s: did not wait"
        assert elapsed <= DEADLINE + 0.5, (
            f"DatabaseUnavailable after {elapsed:.2f}s, reconnect_deadline is {DEADLINE}s"
        )


async def test_unreachable_server_then_recovers(server: Server, bank: Bank, target: Target) -> None:
    """While the server is unreachable, ``is_healthy()`` is False (quickly)
    and work fails with DatabaseUnavailable within ~1-3 s (per entry point:
    test_unreachable_server_raises_within_deadline); once the server is back,
    the same Database recovers by itself: health check, queries and units."""
    async with server.proxied(
        pool_size=4, reconnect_deadline=DEADLINE, connect_timeout=CONNECT_TIMEOUT, outbox=True
    ) as (proxy, db):
        load = Load(bank, db)
        await load.run(0)
        assert await db.is_healthy()

        proxy.refuse(True)
        proxy.cut_all()
        await wait_cut(proxy)
        started = time.monotonic()
        assert not await db.is_healthy()
        check = time.monotonic() - started
        assert check < CONNECT_TIMEOUT + 0.5

        started = time.monotonic()
        with anyio.fail_after(TEST_LIMIT), pytest.raises(af.DatabaseUnavailable) as caught:
            await db.fetch(af.sql("SELECT 1 AS one"))
        down = time.monotonic() - started
        assert caught.value.__cause__ is not None
        assert DEADLINE * 0.5 <= down <= 3.5, f"DatabaseUnavailable after {down:.2f}s"
        assert not await db.is_healthy()

        proxy.refuse(False)
        await proxy.wait_listening()
        started = time.monotonic()
        assert await db.is_healthy()
        assert await db.fetch_value(af.sql("SELECT 2 + {n} AS v", n=1)) == 3
        assert isinstance(await load.run(1), af.RowId), load.outcomes[1]
        back = time.monotonic() - started
        print(
            f"\n[fault] {target} unreachable: is_healthy() False after {check * 1000:.0f} ms; "
            f"fetch raised DatabaseUnavailable after {down:.2f}s (deadline {DEADLINE}s); "
            f"recovered {back * 1000:.0f} ms after the server came back"
        )
    await audit(load, strict=True)


async def test_stalled_network_health_check_and_recovery(
    server: Server, bank: Bank, target: Target
) -> None:
    """Bytes stop flowing (a black hole, not a refusal): ``is_healthy()`` gives
    False within ``connect_timeout`` instead of hanging; when traffic flows
    again the pool's connections are still usable or replaced — every result
    is right."""
    async with server.proxied(pool_size=1, connect_timeout=1.0) as (proxy, db):
        assert await db.fetch_value(af.sql("SELECT 1 + {n} AS v", n=1)) == 2
        proxy.stall(True)
        started = time.monotonic()
        assert not await db.is_healthy()
        stalled = time.monotonic() - started
        assert stalled < 1.0 + 0.5
        proxy.stall(False)
        for n in range(5):
            assert await db.fetch_value(af.sql("SELECT {n} + 100 AS v", n=n)) == n + 100
        assert await db.is_healthy()
        load = Load(bank, db)
        assert isinstance(await load.run(0), af.RowId)
        print(f"\n[fault] {target} stalled network: is_healthy() False after {stalled:.2f}s")
    await audit(load, strict=True)


# -- server restart and crash (a private server) -----------------------------------


async def server_uptime(admin: af.Database) -> float:
    """Seconds since the server (postmaster / mariadbd) started."""
    if admin.name == "postgresql":
        query = "SELECT EXTRACT(EPOCH FROM now() - pg_postmaster_start_time()) AS up"
    else:
        query = (
            "SELECT VARIABLE_VALUE AS up FROM information_schema.GLOBAL_STATUS "
            "WHERE VARIABLE_NAME = 'UPTIME'"
        )
    return float(await admin.fetch_value(admin._engine.raw(query)))


@dataclass
class Outage:
    """How a load saw its server go down and come back (monotonic times)."""

    start: float  # the fault began
    ready: float = math.inf  # the server accepted connections again
    down: float | None = None  # the probe first saw it down...
    back: float | None = None  # ...and then up again

    def saw(self, healthy: bool, now: float) -> None:
        if not healthy and self.down is None:
            self.down = now
        elif healthy and self.down is not None and self.back is None:
            self.back = now

    def resumed(self, load: Load) -> float | None:
        """When the first unit succeeded after the server was back."""
        return min((t for t in load.finished if t > self.ready), default=None)

    def describe(self, load: Load) -> str:
        resumed = self.resumed(load)
        last_before = max((t for t in load.finished if t < self.ready), default=None)

        def rel(t: float | None) -> str:
            return "-" if t is None else f"+{t - self.start:.2f}s"

        gap = "-" if resumed is None or last_before is None else f"{resumed - last_before:.2f}s"
        return (
            f"seen down {rel(self.down)}, back {rel(self.back)}, server ready {rel(self.ready)}; "
            f"recovery (first unit after that) {rel(resumed)}; no unit succeeded for {gap}"
        )


async def load_through_outage(
    server: Server, bank: Bank, fault: Callable[[], Awaitable[object]]
) -> tuple[Load, Outage]:
    """16 workers run transfer units (outbox on) on ``server``; after 0.5 s,
    ``fault()`` takes the server down and returns once it accepts connections
    again. The workers go on until 200 units have completed since then (at
    most 20 s), and one more unit runs after them. A probe (``is_healthy()``
    every 20 ms on a Database of its own) records when the server was seen
    down and back."""
    seqs = itertools.count()
    stop = False
    outage: Outage | None = None
    async with (
        server.connect(pool_size=CONCURRENCY, outbox=True) as db,
        server.connect(pool_size=1, reconnect_deadline=None, connect_timeout=2.0) as probe_db,
    ):
        load = Load(bank, db)

        async def worker() -> None:
            while not stop:
                await load.run(next(seqs))

        async def probe() -> None:
            while True:
                healthy = await probe_db.is_healthy()
                if outage is not None:
                    outage.saw(healthy, time.monotonic())
                await anyio.sleep(0.02)

        with anyio.fail_after(TEST_LIMIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(probe)
                # Workers are stopped, never cancelled: a cancelled unit
                # may have committed without its outcome being recorded.
                async with anyio.create_task_group() as workers:
                    for _ in range(CONCURRENCY):
                        workers.start_soon(worker)
                    await anyio.sleep(0.5)
                    outage = Outage(time.monotonic())
                    await fault()
                    outage.ready = time.monotonic()
                    # Run on until units have been completing for a while again.
                    while (  # noqa: ASYNC110 (polling a time-based condition)
                        sum(1 for t in load.finished if t > outage.ready) < 200
                        and time.monotonic() - outage.ready < 20
                    ):
                        await anyio.sleep(0.05)
                    stop = True
                tg.cancel_scope.cancel()
        await load.run(next(seqs))
    assert outage is not None
    return load, outage


async def check_outage(label: str, load: Load, outage: Outage, bank: Bank) -> None:
    """Print the outage; the server was restarted, and the load saw it and
    went on afterwards."""
    uptime = await server_uptime(bank.admin)
    since_fault = time.monotonic() - outage.start
    print(
        f"\n[fault] {label}: {outage.describe(load)}; {len(load.outcomes)} units, "
        f"{load.summary()}, lost COMMITs settled through the outbox "
        f"{load.db.stats.commits_resolved}"
    )
    assert uptime <= since_fault + 1.0, (
        f"the server has been up {uptime:.1f}s, the fault began {since_fault:.1f}s ago"
    )
    assert outage.down is not None and outage.back is not None, (
        f"the probe never saw the outage: {outage}"
    )
    assert outage.resumed(load) is not None, "no unit succeeded after the server was back"


@pytest.mark.slow
async def test_server_restart_during_load(
    private_server: PrivateServer, private: Server, private_bank: Bank, target: Target
) -> None:
    """16 workers keep running transfer units (outbox on) while the target's
    private server is restarted (PostgreSQL's fast shutdown, MariaDB's
    normal shutdown; then started again). Every unit completes (they wait
    out the outage), money is conserved, nothing is applied twice.

    Printed: when a probe (``is_healthy()`` every 20 ms on a separate Database)
    saw the server go down and come back, when it accepted connections again,
    and the recovery time: from the start of the restart to the first unit
    that succeeded after that."""
    load, outage = await load_through_outage(
        private, private_bank, partial(private_server.restart, "clean")
    )
    await check_outage(f"{target} restart", load, outage, private_bank)
    await audit(load, strict=True)


@pytest.mark.slow
async def test_server_crash_during_load(
    private_server: PrivateServer, private: Server, private_bank: Bank, target: Target
) -> None:
    """The same, but the server crashes under the load (PostgreSQL's
    immediate shutdown, ``pg_ctl stop -m immediate``; SIGKILL for mariadbd)
    and is started again at once (crash recovery). Each unit either
    succeeded — applied, with its outbox entry, exactly once — or raised
    CommitOutcomeUnknown (applied at most once) or DatabaseUnavailable (not
    applied); money is conserved, the outbox versions are contiguous, and no
    unit has two entries. Printed as for the restart."""
    load, outage = await load_through_outage(
        private, private_bank, partial(private_server.restart, "crash")
    )
    await check_outage(f"{target} crash", load, outage, private_bank)
    odd = {
        seq: error
        for seq, error in load.outcomes.items()
        if isinstance(error, Exception)
        and not isinstance(error, af.CommitOutcomeUnknown | af.DatabaseUnavailable)
    }
    assert not odd, f"units failed with other errors: {odd}"
    await audit(load, strict=False)


# -- SQLite: another process holds the write lock ----------------------------------

HOLDER = """
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN IMMEDIATE")
c.execute("INSERT INTO held (i) VALUES (99)")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
c.execute("ROLLBACK")
"""


async def test_sqlite_write_lock_held_by_another_process(target: Target, url: str) -> None:
    """A second process holds ``BEGIN IMMEDIATE`` on the same file for longer
    than ``busy_timeout``: a write through aiofragno raises LockTimeout after
    about ``busy_timeout`` (not a hang); reads go on meanwhile (WAL); once
    the other process lets go, writes succeed."""
    if target.dialect != "sqlite":
        pytest.skip("another process holding the database file's lock is SQLite's fault")
    busy = 0.5
    async with af.connect(url, backend=target.backend, busy_timeout=busy, pool_size=4) as db:
        await db.execute(af.sql("CREATE TABLE held (i integer)"))
        path = url.removeprefix("sqlite:///")
        async with await anyio.open_process([sys.executable, "-c", HOLDER, path]) as holder:
            assert holder.stdout is not None and holder.stdin is not None
            with anyio.fail_after(10):
                assert b"locked" in await holder.stdout.receive()

            async def timed(make: Callable[[], Awaitable[Any]]) -> tuple[BaseException, float]:
                started = time.monotonic()
                with anyio.fail_after(TEST_LIMIT), pytest.raises(af.Error) as caught:
                    await make()
                return caught.value, time.monotonic() - started

            async def in_transaction() -> None:
                async with db.transaction() as tx:
                    await tx.execute(af.sql("INSERT INTO held (i) VALUES (2)"))

            timings = {}
            for name, make in {
                "execute": lambda: db.execute(af.sql("INSERT INTO held (i) VALUES (1)")),
                "transaction": in_transaction,
            }.items():
                error, elapsed = await timed(make)
                assert isinstance(error, af.LockTimeout), repr(error)
                assert busy * 0.8 <= elapsed <= busy + 1.5, f"{name}: {elapsed:.2f}s"
                timings[name] = elapsed
            # Reads are not blocked by the writer (WAL), and see none of its rows.
            assert await db.fetch(af.sql("SELECT i FROM held")) == []

            await holder.stdin.aclose()
            with anyio.fail_after(10):
                await holder.wait()
            assert holder.returncode == 0
        await db.execute(af.sql("INSERT INTO held (i) VALUES (3)"))
        assert [r["i"] for r in await db.fetch(af.sql("SELECT i FROM held"))] == [3]
        print(
            f"\n[fault] {target} lock held by another process (busy_timeout {busy}s): "
            + ", ".join(f"{k} LockTimeout after {v:.2f}s" for k, v in timings.items())
        )


async def test_sqlite_concurrent_writers_against_foreign_lock(target: Target, url: str) -> None:
    """Four writers at once while another process holds the write lock: each
    raises LockTimeout within about ``busy_timeout`` — none waits for the
    others' timeouts in turn."""
    if target.dialect != "sqlite":
        pytest.skip("another process holding the database file's lock is SQLite's fault")
    busy = 0.5
    async with af.connect(url, backend=target.backend, busy_timeout=busy, pool_size=4) as db:
        await db.execute(af.sql("CREATE TABLE held (i integer)"))
        path = url.removeprefix("sqlite:///")
        async with await anyio.open_process([sys.executable, "-c", HOLDER, path]) as holder:
            assert holder.stdout is not None and holder.stdin is not None
            with anyio.fail_after(10):
                assert b"locked" in await holder.stdout.receive()
            outcomes: list[tuple[BaseException, float]] = []
            started = time.monotonic()

            async def write(i: int) -> None:
                with pytest.raises(af.LockTimeout) as caught:
                    await db.execute(af.sql("INSERT INTO held (i) VALUES ({i})", i=i))
                outcomes.append((caught.value, time.monotonic() - started))

            with anyio.fail_after(TEST_LIMIT):
                async with anyio.create_task_group() as tg:
                    for i in range(4):
                        tg.start_soon(write, i)
            await holder.stdin.aclose()
            with anyio.fail_after(10):
                await holder.wait()
        times = sorted(elapsed for _, elapsed in outcomes)
        listed = ", ".join(f"{t:.2f}s" for t in times)
        print(f"\n[fault] {target} 4 writers vs a foreign lock: LockTimeout after {listed}")
        assert times[-1] <= busy + 1.0, f"the last writer waited {times[-1]:.2f}s"


async def test_sqlite_unit_of_work_against_foreign_lock(target: Target, url: str) -> None:
    """The same fault under a unit of work with NoRetry: the lock timeout is a
    conflict (``TransactionConflict``), so the unit ends in ConcurrencyConflict
    whose cause is the LockTimeout, after about ``busy_timeout``."""
    if target.dialect != "sqlite":
        pytest.skip("another process holding the database file's lock is SQLite's fault")
    busy = 0.5

    async def unit(uow: af.UnitOfWork) -> None:
        uow.create("accounts", {"owner": "x", "balance": 1})

    async with af.connect(url, backend=target.backend, busy_timeout=busy) as db:
        namespace = new_namespace()
        await db.migrate(BANK, namespace=namespace)
        await db.execute(af.sql("CREATE TABLE held (i integer)"))
        path = url.removeprefix("sqlite:///")
        async with await anyio.open_process([sys.executable, "-c", HOLDER, path]) as holder:
            assert holder.stdout is not None and holder.stdin is not None
            with anyio.fail_after(10):
                assert b"locked" in await holder.stdout.receive()
            started = time.monotonic()
            with anyio.fail_after(TEST_LIMIT), pytest.raises(af.ConcurrencyConflict) as caught:
                await db.execute_uow(unit, schema=BANK, namespace=namespace, retry=af.NoRetry())
            elapsed = time.monotonic() - started
            assert isinstance(caught.value.__cause__, af.LockTimeout)
            assert busy * 0.8 <= elapsed <= busy + 1.5, f"{elapsed:.2f}s"
            await holder.stdin.aclose()
            with anyio.fail_after(10):
                await holder.wait()
        await db.execute_uow(unit, schema=BANK, namespace=namespace)
