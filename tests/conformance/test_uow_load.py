"""The unit of work under load, on every backend and runtime: hundreds of
concurrent transfer units over few accounts, so that they conflict and are
retried. Money must be conserved, every transfer present exactly once, and no
update lost. PostgreSQL at SERIALIZABLE (our stand-in for CockroachDB and
YugabyteDB) must report SQLSTATE 40001 under this contention, and the units
must still all complete."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import aiofragno as af
from tests.conformance.namespaces import new_namespace
from tests.conformance.uow_env import drop_namespace
from tests.conftest import Target

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ACCOUNTS = 50
UNITS = 500
CONCURRENCY = 32
INITIAL_BALANCE = 1_000
RETRY = af.ExponentialBackoff(max_retries=100, initial=0.001, maximum=0.05)
DEADLINE = 120  # seconds; a hang fails instead of blocking the suite

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
        af.Column("seq", "bigint"),
        af.Index("by_seq", ["seq"], unique=True),
    ),
)


class Bank:
    def __init__(self, db: af.Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace
        self.conflicts: list[Exception] = []
        self.calls = 0

    def ident(self, table: str) -> af.Identifier:
        return self.db.layout(BANK, self.namespace).table(table).identifier

    def on_conflict(self, uow: af.UnitOfWork, exc: Exception) -> None:
        self.conflicts.append(exc)


@pytest.fixture
async def bank(url: str, target: Target) -> AsyncIterator[Bank]:
    # A connection per concurrent unit, so that the units really overlap.
    async with af.connect(url, backend=target.backend, pool_size=CONCURRENCY) as db:
        namespace = new_namespace()
        await db.migrate(BANK, namespace=namespace)
        try:

            async def seed(uow: af.UnitOfWork) -> None:
                for i in range(ACCOUNTS):
                    uow.create("accounts", {"owner": f"acct{i:02}", "balance": INITIAL_BALANCE})

            await db.execute_uow(seed, schema=BANK, namespace=namespace)
            yield Bank(db, namespace)
        finally:
            await drop_namespace(db, BANK, namespace)


def plan(seq: int) -> tuple[str, str, int]:
    """Transfer ``seq``: (from, to, amount), the same on every retry."""
    rng = random.Random(seq)
    src, dst = rng.sample(range(ACCOUNTS), 2)
    return f"acct{src:02}", f"acct{dst:02}", rng.randint(1, 25)


async def run_transfers(bank: Bank, isolation: Any = None) -> float:
    limiter = anyio.CapacityLimiter(CONCURRENCY)
    hooks = af.UowHooks(on_conflict=bank.on_conflict)
    done: list[af.RowId] = []

    async def one(seq: int) -> None:
        src, dst, amount = plan(seq)

        async def transfer(uow: af.UnitOfWork) -> af.RowId:
            bank.calls += 1
            a = uow.find_first("accounts", where={"owner": src})
            b = uow.find_first("accounts", where={"owner": dst})
            await uow.retrieve()
            acc_a, acc_b = a.result, b.result
            uow.update("accounts", acc_a["id"], {"balance": acc_a["balance"] - amount}, check=True)
            uow.update("accounts", acc_b["id"], {"balance": acc_b["balance"] + amount}, check=True)
            return uow.create(
                "transfers", {"src": acc_a["id"], "dst": acc_b["id"], "amount": amount, "seq": seq}
            )

        async with limiter:
            done.append(
                await bank.db.execute_uow(
                    transfer,
                    schema=BANK,
                    namespace=bank.namespace,
                    retry=RETRY,
                    isolation=isolation,
                    hooks=hooks,
                )
            )

    started = time.perf_counter()
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            for seq in range(UNITS):
                tg.start_soon(one, seq)
    elapsed = time.perf_counter() - started
    assert len(done) == UNITS and len(set(done)) == UNITS
    return elapsed


async def check_books(bank: Bank) -> None:
    db = bank.db
    accounts = await db.fetch(af.sql("SELECT * FROM {t}", t=bank.ident("accounts")))
    transfers = await db.fetch(af.sql("SELECT * FROM {t}", t=bank.ident("transfers")))

    # Money is conserved.
    assert len(accounts) == ACCOUNTS
    assert sum(int(a["balance"]) for a in accounts) == ACCOUNTS * INITIAL_BALANCE

    # Every transfer is there exactly once, as planned.
    assert len(transfers) == UNITS
    assert sorted(int(t["seq"]) for t in transfers) == list(range(UNITS))
    owner_of = {a["_id"]: a["owner"] for a in accounts}
    for t in transfers:
        assert (owner_of[t["src"]], owner_of[t["dst"]], int(t["amount"])) == plan(int(t["seq"]))

    # No update was lost: each balance is its opening balance plus its
    # transfers, and each account's version counts the transfers touching it.
    expected_balance = Counter({a["_id"]: INITIAL_BALANCE for a in accounts})
    touches: Counter[Any] = Counter()
    for t in transfers:
        expected_balance[t["src"]] -= int(t["amount"])
        expected_balance[t["dst"]] += int(t["amount"])
        touches[t["src"]] += 1
        touches[t["dst"]] += 1
    for a in accounts:
        assert int(a["balance"]) == expected_balance[a["_id"]], a["owner"]
        assert int(a["_version"]) == touches[a["_id"]], a["owner"]

    # The units really competed, and the losers were retried.
    assert bank.conflicts, "no conflict at all: the load test did not contend"
    assert bank.calls == UNITS + len(bank.conflicts)


async def test_transfer_load(bank: Bank, target: Target) -> None:
    elapsed = await run_transfers(bank)
    await check_books(bank)
    kinds = Counter(type(exc).__name__ for exc in bank.conflicts)
    print(
        f"\n[load] {target}: {UNITS} units at concurrency {CONCURRENCY} in {elapsed:.2f}s; "
        f"conflicts {dict(kinds)}"
    )


@pytest.fixture
def postgresql_only(target: Target) -> None:
    if target.dialect != "postgresql":
        pytest.skip("SERIALIZABLE as a stand-in for distributed SQL is tested on PostgreSQL")


async def test_serializable_load_postgresql(
    postgresql_only: None, bank: Bank, target: Target
) -> None:
    elapsed = await run_transfers(bank, isolation="serializable")
    await check_books(bank)
    serialization = [e for e in bank.conflicts if isinstance(e, af.SerializationFailure)]
    assert serialization, f"no 40001 among {Counter(type(e).__name__ for e in bank.conflicts)}"
    assert all(e.sqlstate == "40001" for e in serialization)
    assert all(e.__cause__ is not None for e in serialization)
    kinds = Counter(type(exc).__name__ for exc in bank.conflicts)
    print(
        f"\n[load] {target} serializable: {UNITS} units at concurrency {CONCURRENCY} in "
        f"{elapsed:.2f}s; conflicts {dict(kinds)}"
    )
