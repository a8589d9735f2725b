"""Every commit plan (:mod:`aiofragno.uow.plans`) through the same scenarios
on every run, whatever servers there are: a fake connection stands in for
the database, records what it is sent, and fails where a test tells it to —
a checked write that matches no row, a connection lost before COMMIT, a
COMMIT whose reply is lost. Each plan runs with its own dialect's SQL (the
adapter and compiler are the real ones); what the plans send to a real
server is covered by the conformance modules (test_uow_*.py,
test_commit_outcomes.py, test_outbox.py), each on its own database."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import aiofragno as af
from aiofragno.driver import (
    CommitPlanChoice,
    CompiledQuery,
    IsolationLevel,
    QueryResult,
    StopWhen,
    column_index,
    commit_after,
    execute_in_turn,
)
from aiofragno.engine import Engine
from aiofragno.errors import CommitOutcomeUnknown, ConnectionLost, DataError, Error
from aiofragno.naming import Layout, resolve_naming
from aiofragno.pool import PooledDialect
from aiofragno.schema import RowId
from aiofragno.uow import plans
from aiofragno.uow.catalog import Catalog
from aiofragno.uow.executor import HeldConnection, run_mutations
from aiofragno.uow.ops import MutationOp
from aiofragno.uow.outcomes import Outcome, PhaseConflict, classify
from aiofragno.uow.stale import STALE
from aiofragno.uow.unit import UnitOfWork
from aiofragno.url import Options, OutboxStrategy, parse_url

STAMP = "0000000000000000000a"
SCHEMA = af.Schema(
    "plans", af.Table("items", af.Column("name", "string"), af.Column("qty", "bigint"))
)
_COUNTS = re.compile(r"\) AS n\d+")
_STALE_MESSAGE = re.compile(re.escape(STALE) + r"\d+")


class Lost(ConnectionLost):
    """What the fake raises when told to lose the connection."""


@dataclass(eq=False)  # (the pool keeps connections in sets)
class FakeConnection:
    """A :class:`~aiofragno.driver.Connection` that answers like a server
    running the unit's operations ``ops``: each statement running some of
    them (alone or combined in one WITH) matches one row per operation
    except ``stale`` (an index into ``ops``), which matches none; a stale
    guard or abort expression after it fails the statement with a
    :class:`DataError` naming the operation; any other statement (the
    outbox entry, the key's row) returns one row holding :data:`STAMP`.
    ``lose``: "write" loses the connection at the first statement running
    an operation, "commit" at COMMIT (or at the statement that commits on
    its own) — its reply never comes back."""

    ops: Sequence[MutationOp] = ()
    stale: int | None = None
    lose: str | None = None
    log: list[str] = field(default_factory=list)
    committed: list[list[str]] = field(default_factory=list)
    transaction: list[str] | None = None
    closed: bool = False
    last_matched: int = 1

    # -- Connection ------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.closed

    is_stale = False

    @property
    def server_session(self) -> str | None:
        return None

    @property
    def in_transaction(self) -> bool:
        return self.transaction is not None

    async def execute_query(self, query: CompiledQuery) -> QueryResult:
        self._check_open()
        self.log.append(query.sql)
        involved = self._involved(query)
        if involved and self.lose == "write":
            self._lose()
        if self.transaction is None and self.lose == "commit":
            self._lose()  # (a statement outside a transaction commits on its own)
        found = _STALE_MESSAGE.search(query.sql)
        if found is not None and not involved and self.last_matched == 0:
            raise DataError(f"stopped by the stale guard: {found[0]}")
        result = self._result(query, involved)
        if self.transaction is not None:
            self.transaction.append(query.sql)
        else:
            self.committed.append([query.sql])
        return result

    async def execute_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await execute_in_turn(self, queries, stop)

    async def begin(self, isolation: IsolationLevel | None) -> None:
        self._check_open()
        self.log.append("BEGIN" if isolation is None else f"BEGIN {isolation}")
        self.transaction = []

    async def commit(self) -> None:
        self._check_open()
        self.log.append("COMMIT")
        if self.lose == "commit":
            self._lose()
        assert self.transaction is not None
        self.committed.append(self.transaction)
        self.transaction = None

    async def commit_batch(
        self, queries: Sequence[CompiledQuery], stop: StopWhen | None = None
    ) -> list[QueryResult]:
        return await commit_after(self, queries, stop)

    async def rollback(self) -> None:
        self._check_open()
        self.log.append("ROLLBACK")
        self.transaction = None

    async def ping(self) -> None:
        self._check_open()

    async def reset(self) -> bool:
        self.transaction = None
        return not self.closed

    async def reset_session(self) -> bool:
        return await self.reset()

    async def close(self) -> None:
        self.closed = True

    # -- the server it pretends to be -------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise Lost("the fake connection is closed")

    def _lose(self) -> None:
        self.closed = True
        self.transaction = None  # (the server rolls back what it had)
        raise Lost("the fake connection was lost")

    def _involved(self, query: CompiledQuery) -> list[int]:
        """The indexes of the operations ``query`` runs: one's own
        statement, or a WITH combining a run of them (its parameters start
        with theirs, in order)."""
        for index, op in enumerate(self.ops):
            if query == op.query:
                return [index]
        count = len(_COUNTS.findall(query.sql))
        for start in range(len(self.ops) - count + 1) if count else ():
            run = self.ops[start : start + count]
            parameters = tuple(p for op in run for p in op.query.parameters)
            if query.parameters[: len(parameters)] == parameters:
                return list(range(start, start + count))
        return []

    def _result(self, query: CompiledQuery, involved: list[int]) -> QueryResult:
        if not involved:
            return QueryResult([_row({"versionstamp": STAMP})], 1)
        counts = {f"n{i}": 0 if index == self.stale else 1 for i, index in enumerate(involved)}
        self.last_matched = min(counts.values())
        if self.last_matched == 0 and "AS stamp" in query.sql:
            # The abort expression of the statement that commits on its own.
            stale = next(i for i, n in enumerate(counts.values()) if n == 0)
            raise DataError(f'invalid input syntax for type integer: "{STALE}{stale}:0"')
        if query in (self.ops[index].query for index in involved):
            return QueryResult([], self.last_matched)
        if "AS stamp" in query.sql:
            counts["stamp"] = STAMP
        return QueryResult([_row(counts)], 1)


def _row(values: dict[str, Any]) -> af.Row:
    return af.Row(column_index(tuple(values)), list(values.values()))


def _translate(exc: BaseException) -> Exception:
    assert isinstance(exc, Error), exc  # (the fake raises aiofragno's errors only)
    return exc


DIALECTS = {
    "postgresql": ("aiofragno.dialects.postgresql", "ADAPTER"),
    "mysql": ("aiofragno.dialects.mysql", "ADAPTER"),
    "sqlite": ("aiofragno.dialects.sqlite", "_BASE"),
}


def _engine(name: str, connection: FakeConnection, *, outbox: bool | OutboxStrategy) -> Engine:
    """An engine on ``connection``; ``outbox=True`` is the counter strategy
    (the cases below are its statements) on every dialect."""
    module = __import__(DIALECTS[name][0], fromlist=["create_compiler"])
    options = Options(outbox="counter" if outbox is True else outbox, reconnect_deadline=None)

    async def connect() -> FakeConnection:
        return connection

    dialect = PooledDialect(
        name=name,  # type: ignore[arg-type]
        adapter=getattr(module, DIALECTS[name][1]),
        compiler=module.create_compiler,
        translate=_translate,
        connect=connect,
        options=options,
        pool_size=1,
    )
    url = "sqlite:///:memory:" if name == "sqlite" else f"{name}://fake/fake"
    return Engine(dialect, parse_url(url), options, "fake")


@dataclass(frozen=True)
class Case:
    """One plan on its dialect: ``plan`` the class :func:`plans.choose`
    gives (or that the phase falls back on), ``outbox`` and ``isolation``
    how the unit runs, ``lost_write`` what a connection lost at the first
    write means for the unit."""

    dialect: str
    plan: type[Any]
    outbox: bool | OutboxStrategy
    isolation: IsolationLevel | None
    lost_write: Outcome
    key: str | None = None


CASES = {
    # PostgreSQL, outbox on: the operations and the entry as one statement.
    "one-committing-statement": Case(
        "postgresql", plans.OneCommittingStatement, True, None, Outcome.AMBIGUOUS
    ),
    # PostgreSQL otherwise: combined runs, checked here, then COMMIT (with
    # the outbox at a snapshot level: the counter is waited for first).
    "statements-then-commit-combined": Case(
        "postgresql", plans.StatementsThenCommit, False, None, Outcome.LOST_BEFORE_COMMIT
    ),
    "statements-then-commit-snapshot": Case(
        "postgresql", plans.StatementsThenCommit, True, "serializable", Outcome.LOST_BEFORE_COMMIT
    ),
    # MySQL with an entry: guards, the entry and COMMIT as one batch.
    "guarded-batch-outbox": Case("mysql", plans.GuardedBatch, True, None, Outcome.AMBIGUOUS),
    "guarded-batch-key": Case("mysql", plans.GuardedBatch, False, None, Outcome.AMBIGUOUS, "k1"),
    # MySQL without one: the statements, checked here, then COMMIT.
    "statements-then-commit": Case(
        "mysql", plans.StatementsThenCommit, False, None, Outcome.LOST_BEFORE_COMMIT
    ),
    # SQLite: the whole phase in one call to the engine in this process.
    "checked-in-process": Case("sqlite", plans.CheckedInProcess, True, None, Outcome.AMBIGUOUS),
}


@dataclass
class Run:
    connection: FakeConnection
    uow: UnitOfWork
    error: Exception | None


async def run(case: Case, *, stale: int | None = None, lose: str | None = None) -> Run:
    """One mutation phase of a unit that creates an item and updates,
    checked, one it had read (version 1)."""
    connection = FakeConnection(stale=stale, lose=lose)
    engine = _engine(case.dialect, connection, outbox=case.outbox)
    layout = Layout(SCHEMA, "plans", resolve_naming("suffix"), engine.adapter.max_identifier_length)
    catalog = Catalog(layout, engine.compiler, engine.codec, engine.adapter, {})
    held = HeldConnection(engine)
    uow = UnitOfWork(held.read, catalog, "unit-1")
    uow.create("items", {"name": "new", "qty": 1})
    uow.update("items", RowId("seen-item", version=1), {"qty": 2}, check=True)
    connection.ops = uow.mutations
    error = None
    try:
        await run_mutations(
            engine, held, uow, catalog, case.isolation, None, case.key, "nonce", case.outbox
        )
    except Exception as exc:
        error = exc
    finally:
        await held.release()
    return Run(connection, uow, error)


def test_each_dialect_chooses_its_plan() -> None:
    chosen = {
        name: type(_engine(name, FakeConnection(), outbox=True).commit_plan) for name in DIALECTS
    }
    assert chosen == {
        "postgresql": plans.OneCommittingStatement,
        "mysql": plans.GuardedBatch,
        "sqlite": plans.CheckedInProcess,
    }


def test_a_dialect_without_a_plan_of_its_own_checks_statements_then_commits() -> None:
    from aiofragno.dialects import mysql

    plain = dataclasses.replace(mysql.ADAPTER, commit=CommitPlanChoice())
    plan = plans.choose(plain)
    assert isinstance(plan, plans.StatementsThenCommit)
    assert not plan.combines
    with pytest.raises(ValueError, match="stale_guard"):
        plans.choose(dataclasses.replace(plain, commit=CommitPlanChoice("guarded-batch")))


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_phase_commits_its_writes_and_its_record_together(case: Case) -> None:
    done = await run(case)
    assert done.error is None
    (transaction,) = done.connection.committed
    text = " ".join(transaction)
    assert text.count("INSERT INTO") >= 1 + case.outbox + (case.key is not None)
    assert "UPDATE" in text
    if case.outbox:
        assert done.uow.versionstamp is not None
        assert done.uow.versionstamp.startswith(STAMP if case.dialect != "mysql" else "0" * 19)
    else:
        assert done.uow.versionstamp is None
    if case.plan is plans.OneCommittingStatement:
        assert done.connection.log == transaction  # one statement, no BEGIN or COMMIT
    else:
        assert done.connection.log[0] == "BEGIN" if case.isolation is None else "BEGIN serializable"
        assert done.connection.log[-1] == "COMMIT"
    if case.isolation is not None:
        assert "LOCK TABLE" in transaction[0]  # before anything takes the snapshot
    # A stale guard right after the checked update where the plan stops the batch on the server.
    guards = [i for i, sql in enumerate(transaction) if STALE in sql and "AS stamp" not in sql]
    if case.plan is plans.GuardedBatch:
        assert guards == [next(i for i, sql in enumerate(transaction) if "UPDATE" in sql) + 1]
    else:
        assert guards == []


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_stale_checked_write_conflicts_and_nothing_commits(case: Case) -> None:
    done = await run(case, stale=1)
    assert isinstance(done.error, PhaseConflict)
    assert "seen-item" in str(done.error)
    assert classify(done.error) is Outcome.CONFLICT
    assert done.connection.committed == []
    assert done.uow.versionstamp is None
    if case.plan is not plans.OneCommittingStatement:
        assert done.connection.log[-1] == "ROLLBACK"
        assert "COMMIT" not in done.connection.log


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_connection_lost_at_a_write(case: Case) -> None:
    """Lost before COMMIT went out — unless the plan sends the writes and
    COMMIT together, when nobody can tell which of them the server ran."""
    done = await run(case, lose="write")
    assert isinstance(done.error, ConnectionLost)
    assert classify(done.error) is case.lost_write
    assert done.connection.committed == []
    assert "COMMIT" not in done.connection.log


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_commit_whose_reply_is_lost_is_ambiguous(case: Case) -> None:
    done = await run(case, lose="commit")
    assert isinstance(done.error, CommitOutcomeUnknown)
    assert classify(done.error) is Outcome.AMBIGUOUS
    assert "may or may not have been applied" in str(done.error)
    assert done.uow.versionstamp is None


@pytest.mark.anyio
@pytest.mark.parametrize("isolation", [None, "serializable"])
async def test_under_ticks_a_phase_shares_no_row_and_takes_no_lock(
    isolation: IsolationLevel | None,
) -> None:
    """PostgreSQL under ticks: the same plans, but the entry reserves no
    version (no settings row), names its transaction, and a serializable
    phase waits for nothing first; the versionstamp is not known yet."""
    plan = plans.OneCommittingStatement if isolation is None else plans.StatementsThenCommit
    case = Case("postgresql", plan, "ticks", isolation, Outcome.AMBIGUOUS)
    done = await run(case)
    assert done.error is None
    text = " ".join(done.connection.log)
    assert "pg_current_xact_id()" in text
    assert "fragno_db_settings" not in text and "LOCK TABLE" not in text
    if plan is plans.StatementsThenCommit:  # (the fake answers the one statement with a stamp)
        assert done.uow.versionstamp is None


@pytest.mark.anyio
async def test_the_committing_statement_falls_back_to_one_statement_each() -> None:
    """An error the one statement cannot pin to an operation: nothing was
    applied, and the phase runs again in a transaction, statement by
    statement, where the stale operation shows."""

    class Refusing(FakeConnection):
        async def execute_query(self, query: CompiledQuery) -> QueryResult:
            if "AS stamp" in query.sql:
                self.log.append(query.sql)
                raise DataError("value out of range")
            return await super().execute_query(query)

    connection = Refusing()
    engine = _engine("postgresql", connection, outbox=True)
    layout = Layout(SCHEMA, "plans", resolve_naming("suffix"), engine.adapter.max_identifier_length)
    catalog = Catalog(layout, engine.compiler, engine.codec, engine.adapter, {})
    held = HeldConnection(engine)
    uow = UnitOfWork(held.read, catalog, "unit-1")
    uow.create("items", {"name": "new", "qty": 1})
    uow.update("items", RowId("seen-item", version=1), {"qty": 2}, check=True)
    connection.ops = uow.mutations
    await run_mutations(engine, held, uow, catalog, None, None, None, "nonce", True)
    await held.release()
    assert [sql.split(" ")[0] for sql in connection.log] == [
        "WITH",
        "BEGIN",
        "INSERT",
        "UPDATE",
        "WITH",
        "COMMIT",
    ]
    (transaction,) = connection.committed
    assert len(transaction) == 3
    assert uow.versionstamp == STAMP


def test_outcomes_of_other_errors() -> None:
    assert classify(af.errors.UniqueViolation("duplicate")) is Outcome.DUPLICATE_KEY
    assert classify(af.errors.SerializationFailure("retry")) is Outcome.CONFLICT
    assert classify(af.errors.DatabaseUnavailable("down")) is Outcome.LOST_BEFORE_COMMIT
    assert classify(af.errors.RowNotFound("gone")) is Outcome.ERROR
    assert classify(ValueError("bug")) is Outcome.ERROR
