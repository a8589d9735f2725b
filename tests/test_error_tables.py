"""The mapping from driver errors to aiofragno errors: a table per backend, tested.

Every entry of each code table is checked with a real driver exception object:
built by the driver's own constructor for server errors (asyncpg's
``PostgresError.new``, asyncmy's ``raise_mysql_exception`` on an error packet),
produced by a real failing ``sqlite3`` call, and — where a server is running —
raised by the server itself (``RAISE ... USING ERRCODE`` / ``SIGNAL ... SET
MYSQL_ERRNO``) and caught through ``af.connect``. Then the type-based fallbacks,
and connection loss on live servers.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncmy.errors
import asyncpg
import asyncpg.exceptions
import pytest

import aiofragno as af
from aiofragno.backends import asyncmy as asyncmy_backend
from aiofragno.backends import asyncpg as asyncpg_backend
from aiofragno.backends import sqlite_connection
from aiofragno.dialects import mysql, postgresql
from aiofragno.dialects import sqlite as sqlite_dialect
from aiofragno.errors import ErrorTable
from aiofragno.url import Options, parse_url
from tests.conftest import (
    MYSQL_URL,
    POSTGRES_URL,
    TARGETS,
    Target,
    require_target,
    selected_targets,
)
from tests.faults import kill_mysql_connection, terminate_postgres_backend


@pytest.fixture
def anyio_backend() -> str:
    """Replaced by the runtimes tests/conftest.py parametrizes; defined here so
    that anyio's own (parametrized) fixture does not clash with that."""
    return "asyncio"


# The translation each backend really uses (code extraction + its ErrorTable).
PG_TRANSLATE = asyncpg_backend.create_dialect(parse_url(POSTGRES_URL), Options()).translate_error
MY_TRANSLATE = asyncmy_backend.create_dialect(parse_url(MYSQL_URL), Options()).translate_error
LITE_TRANSLATE = sqlite_connection.translate_error

SQLITE_CODES = sqlite_dialect._CODES


def check(
    error: BaseException,
    cls: type[af.Error],
    *,
    sqlstate: str | None,
    code: str | None,
    message: str,
) -> None:
    assert type(error) is cls, f"{type(error).__name__} is not {cls.__name__}: {error}"
    assert isinstance(error, af.DatabaseError)
    assert error.sqlstate == sqlstate
    assert error.code == code
    assert message in str(error)
    if code is not None:
        assert f"[code {code}]" in str(error)


# ------------------------------------------------------------------------------ PostgreSQL


def pg_error(sqlstate: str, message: str = "boom from the server") -> Exception:
    """The exception asyncpg builds for a server ErrorResponse with ``sqlstate``."""
    exc = asyncpg.exceptions.PostgresError.new({"S": "ERROR", "C": sqlstate, "M": message})
    assert isinstance(exc, asyncpg.exceptions.PostgresError)
    return exc


ASYNCPG_SQLSTATES = {
    cls.sqlstate: cls
    for cls in vars(asyncpg.exceptions).values()
    if isinstance(cls, type)
    and issubclass(cls, asyncpg.exceptions.PostgresError)
    and isinstance(getattr(cls, "sqlstate", None), str)
}


@pytest.mark.parametrize(("sqlstate", "cls"), postgresql.CODES.items(), ids=postgresql.CODES)
def test_postgresql_code(sqlstate: str, cls: type[af.Error]) -> None:
    exc = pg_error(sqlstate)
    assert type(exc) is ASYNCPG_SQLSTATES[sqlstate]  # asyncpg's own class for it
    check(PG_TRANSLATE(exc), cls, sqlstate=sqlstate, code=sqlstate, message="boom from the server")


@pytest.mark.parametrize(("prefix", "cls"), postgresql.PREFIXES.items(), ids=postgresql.PREFIXES)
def test_postgresql_prefix(prefix: str, cls: type[af.Error]) -> None:
    """Every SQLSTATE of the class that has no entry of its own maps by prefix."""
    members = sorted(
        state
        for state in ASYNCPG_SQLSTATES
        if state.startswith(prefix) and state not in postgresql.CODES
    )
    assert members, f"asyncpg knows no SQLSTATE in class {prefix}"
    wrong = {}
    for state in members:
        error = PG_TRANSLATE(pg_error(state))
        if type(error) is not cls or error.sqlstate != state or error.code != state:
            wrong[state] = (type(error).__name__, error.sqlstate, error.code)
    assert wrong == {}


@pytest.mark.parametrize("sqlstate", ["XX000", "53100", "P0001", "0A000", "55000", "ZZ999"])
def test_postgresql_code_outside_the_table(sqlstate: str) -> None:
    check(
        PG_TRANSLATE(pg_error(sqlstate)),
        af.DatabaseError,
        sqlstate=sqlstate,
        code=sqlstate,
        message="boom from the server",
    )


def test_postgresql_table_entries_are_specific() -> None:
    # An exact code must win over its class prefix.
    assert PG_TRANSLATE(pg_error("23505")).__class__ is af.UniqueViolation
    assert PG_TRANSLATE(pg_error("23P01")).__class__ is af.IntegrityError
    assert PG_TRANSLATE(pg_error("40P01")).__class__ is af.DeadlockDetected
    assert PG_TRANSLATE(pg_error("40002")).__class__ is af.TransactionConflict


# ------------------------------------------------------------------------------ MySQL


def mysql_error(errno: int, message: str = "boom from the server") -> Exception:
    """The exception asyncmy raises for a server error packet carrying ``errno``."""
    packet = b"\xff" + struct.pack("<H", errno) + b"#HY000" + message.encode()
    try:
        asyncmy.errors.raise_mysql_exception(packet)
    except asyncmy.errors.MySQLError as exc:
        return exc
    raise AssertionError("asyncmy did not raise")


@pytest.mark.parametrize(("errno", "cls"), mysql.CODES.items(), ids=mysql.CODES)
def test_mysql_code(errno: str, cls: type[af.Error]) -> None:
    exc = mysql_error(int(errno))
    check(
        MY_TRANSLATE(exc),
        cls,
        sqlstate=mysql.SQLSTATES[errno],
        code=errno,
        message="boom from the server",
    )


def test_mysql_tables_agree() -> None:
    assert set(mysql.CODES) == set(mysql.SQLSTATES)
    for errno, state in mysql.SQLSTATES.items():
        assert errno.isdigit()
        assert len(state) == 5, (errno, state)


@pytest.mark.parametrize(
    ("errno", "driver_cls", "cls"),
    [
        (1045, asyncmy.errors.OperationalError, af.DatabaseError),  # access denied
        (1049, asyncmy.errors.OperationalError, af.DatabaseError),  # unknown database
        (1022, asyncmy.errors.OperationalError, af.DatabaseError),  # duplicate key name
        (1215, asyncmy.errors.IntegrityError, af.IntegrityError),  # cannot add foreign key
        (1265, asyncmy.errors.DataError, af.DataError),  # data truncated
        (1149, asyncmy.errors.ProgrammingError, af.ProgrammingError),  # syntax (old number)
    ],
)
def test_mysql_code_outside_the_table_falls_back_to_the_type(
    errno: int, driver_cls: type[Exception], cls: type[af.Error]
) -> None:
    exc = mysql_error(errno)
    assert type(exc) is driver_cls
    check(MY_TRANSLATE(exc), cls, sqlstate=None, code=str(errno), message="boom")


# ------------------------------------------------------------------------------ SQLite


def _fails(*statements: str, setup: Callable[[sqlite3.Connection], None] | None = None) -> Any:
    def run(tmp: Path) -> None:
        conn = sqlite3.connect(tmp / "codes.db", isolation_level=None)
        try:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(
                "CREATE TABLE p (id INTEGER PRIMARY KEY, u TEXT UNIQUE,"
                " n TEXT NOT NULL DEFAULT 'x', k INT CHECK (k > 0))"
            )
            conn.execute("CREATE TABLE c (pid INT REFERENCES p (id))")
            conn.execute("INSERT INTO p (id, u, k) VALUES (1, 'a', 1)")
            if setup is not None:
                setup(conn)
            for statement in statements:
                conn.execute(statement)
        finally:
            conn.close()

    return run


def _busy(tmp: Path) -> None:
    holder = sqlite3.connect(tmp / "busy.db", isolation_level=None)
    other = sqlite3.connect(tmp / "busy.db", isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
    finally:
        holder.close()
        other.close()


def _locked(tmp: Path) -> None:
    conn = sqlite3.connect(tmp / "locked.db", isolation_level=None)
    try:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5)])
        reading = conn.execute("SELECT x FROM t")
        reading.fetchone()
        conn.execute("DROP TABLE t")  # the table is still being read
    finally:
        conn.close()


def _busy_snapshot(tmp: Path) -> None:
    path = tmp / "snapshot.db"
    writer = sqlite3.connect(path, isolation_level=None)
    reader = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("CREATE TABLE t (x)")
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM t").fetchall()  # snapshot taken
        writer.execute("INSERT INTO t VALUES (1)")
        reader.execute("INSERT INTO t VALUES (2)")  # cannot upgrade a stale snapshot
    finally:
        writer.close()
        reader.close()


def _interrupted(tmp: Path) -> None:
    conn = sqlite3.connect(":memory:")
    try:
        conn.set_progress_handler(lambda: 1, 1)
        conn.execute("SELECT 1")
    finally:
        conn.close()


def _too_big(tmp: Path) -> None:
    conn = sqlite3.connect(":memory:")
    try:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100)
        conn.execute("SELECT ?", ("x" * 1000,))
    finally:
        conn.close()


def _cant_open(tmp: Path) -> None:
    sqlite3.connect(tmp / "no" / "such" / "dir.db")


def _constraint(tmp: Path) -> None:
    # No statement yields the bare SQLITE_CONSTRAINT any more (every constraint
    # has an extended code): build the exception sqlite3 would raise for it.
    exc = sqlite3.IntegrityError("constraint failed")
    exc.sqlite_errorcode = 19  # type: ignore[attr-defined]
    exc.sqlite_errorname = "SQLITE_CONSTRAINT"  # type: ignore[attr-defined]
    raise exc


# Extended result code -> a real way to make sqlite3 raise it.
SQLITE_PRODUCERS: dict[str, Callable[[Path], None]] = {
    "2067": _fails("INSERT INTO p (id, u, k) VALUES (2, 'a', 1)"),
    "1555": _fails("INSERT INTO p (id, u, k) VALUES (1, 'b', 1)"),
    "787": _fails("INSERT INTO c VALUES (99)"),
    "1299": _fails("INSERT INTO p (id, u, n, k) VALUES (3, 'c', NULL, 1)"),
    "275": _fails("INSERT INTO p (id, u, k) VALUES (4, 'd', 0)"),
    "19": _constraint,
    "5": _busy,
    "6": _locked,
    "517": _busy_snapshot,
    "1": _fails("SELEC 1"),
    "9": _interrupted,
    "18": _too_big,
    "20": _fails("INSERT INTO p (id, u, k) VALUES ('abc', 'e', 1)"),
    "14": _cant_open,
}


def sqlite_error(code: str, tmp: Path) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as info:
        SQLITE_PRODUCERS[code](tmp)
    assert info.value.sqlite_errorcode == int(code)  # type: ignore[attr-defined]
    return info.value


@pytest.mark.parametrize(
    ("code", "entry"), SQLITE_CODES.items(), ids=[f"{c}" for c in SQLITE_CODES]
)
def test_sqlite_code(code: str, entry: tuple[type[af.Error], str | None], tmp_path: Path) -> None:
    cls, sqlstate = entry
    assert code in SQLITE_PRODUCERS, f"no test producer for SQLite code {code}"
    exc = sqlite_error(code, tmp_path)
    check(LITE_TRANSLATE(exc), cls, sqlstate=sqlstate, code=code, message=str(exc))


def test_sqlite_extended_code_outside_the_table(tmp_path: Path) -> None:
    # RAISE(ABORT) in a trigger: SQLITE_CONSTRAINT_TRIGGER (1811).
    def setup(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TRIGGER no_c BEFORE INSERT ON c BEGIN SELECT RAISE(ABORT, 'no'); END")

    with pytest.raises(sqlite3.IntegrityError) as info:
        _fails("INSERT INTO c VALUES (1)", setup=setup)(tmp_path)
    assert info.value.sqlite_errorcode == 1811
    error = LITE_TRANSLATE(info.value)
    check(error, af.IntegrityError, sqlstate=None, code="1811", message="no")


def test_sqlite_binding_an_unsupported_value_is_a_validation_error() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        with pytest.raises(sqlite3.ProgrammingError) as info:
            conn.execute("SELECT ?", ([1, 2],))
    finally:
        conn.close()
    error = LITE_TRANSLATE(info.value)
    assert type(error) is af.ValidationError
    assert "binding" in str(error)


def test_sqlite_closed_connection_is_connection_lost() -> None:
    """A statement on a closed sqlite3 connection raises sqlite3.ProgrammingError
    ("Cannot operate on a closed database."). The connection is gone: that is
    ConnectionLost (so the Session discards it), not a ValidationError (which
    says the caller's input was bad, and keeps the dead connection pooled)."""
    conn = sqlite3.connect(":memory:")
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError) as info:
        conn.execute("SELECT 1")
    assert isinstance(LITE_TRANSLATE(info.value), af.ConnectionLost)


def test_sqlite_type_fallbacks() -> None:
    assert type(LITE_TRANSLATE(sqlite3.IntegrityError("x"))) is af.IntegrityError
    assert type(LITE_TRANSLATE(sqlite3.DataError("x"))) is af.DataError
    assert type(LITE_TRANSLATE(sqlite3.OperationalError("x"))) is af.ProgrammingError
    for exc in (sqlite3.DatabaseError("file is not a database"), RuntimeError("odd")):
        error = LITE_TRANSLATE(exc)
        assert type(error) is af.DatabaseError
        assert (error.sqlstate, error.code) == (None, None)
        assert str(error) == str(exc)


# ------------------------------------------------------------------------------ fallbacks

TABLES = {
    "asyncpg": (asyncpg_backend.ERRORS, PG_TRANSLATE),
    "asyncmy": (asyncmy_backend.ERRORS, MY_TRANSLATE),
}


@pytest.mark.parametrize("backend", TABLES)
@pytest.mark.parametrize(
    ("exc", "cls"),
    [
        (OSError(113, "No route to host"), af.ConnectionLost),
        (ConnectionResetError(104, "Connection reset by peer"), af.ConnectionLost),
        (BrokenPipeError(32, "Broken pipe"), af.ConnectionLost),
        (ConnectionAbortedError(103, "aborted"), af.ConnectionLost),
        (ConnectionRefusedError(111, "Connect call failed"), af.DatabaseUnavailable),
        (TimeoutError(), af.QueryCanceled),
        (RuntimeError("something else"), af.DatabaseError),
        (ValueError("odd"), af.DatabaseError),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None,
)
def test_type_fallbacks(backend: str, exc: BaseException, cls: type[af.Error]) -> None:
    table, translate = TABLES[backend]
    for error in (table.translate(exc), translate(exc)):
        assert type(error) is cls
        assert isinstance(error, af.DatabaseError)
        assert (error.sqlstate, error.code) == (None, None)
        assert str(error) == (str(exc) or type(exc).__name__)
        assert "[code" not in str(error)


def test_asyncmy_incomplete_read_is_connection_lost() -> None:
    exc = asyncio.IncompleteReadError(b"\x01", 4)
    assert type(MY_TRANSLATE(exc)) is af.ConnectionLost


async def _closed_asyncpg_error() -> BaseException:
    conn = await asyncpg.connect(POSTGRES_URL)
    await conn.close()
    try:
        await conn.fetch("SELECT 1")
    except asyncpg.exceptions.InterfaceError as exc:
        return exc
    raise AssertionError("no error on a closed connection")


def _target(request: pytest.FixtureRequest, backend: str, runtime: str) -> Target:
    target = next((t for t in TARGETS if t.backend == backend and t.runtime == runtime), None)
    if target is None:
        pytest.skip(f"{backend} does not run under {runtime}")
    if target not in selected_targets(request.config):
        pytest.skip(f"{target} not selected (--backend / --runtime)")
    require_target(target)
    return target


def test_asyncpg_interface_error_on_a_closed_connection(request: pytest.FixtureRequest) -> None:
    _target(request, "asyncpg", "asyncio")
    exc = asyncio.run(_closed_asyncpg_error())
    assert "connection is closed" in str(exc)
    error = PG_TRANSLATE(exc)
    assert type(error) is af.ConnectionLost
    assert (error.sqlstate, error.code) == (None, None)


def test_translate_keeps_message_sqlstate_and_code() -> None:
    table = ErrorTable(
        codes={"X1": af.UniqueViolation},
        prefixes={"Y0": af.DataError},
        types=[(KeyError, af.ValidationError)],
        sqlstates={"X1": "23505"},
    )
    error = table.translate(RuntimeError("duplicate key"), "X1")
    check(error, af.UniqueViolation, sqlstate="23505", code="X1", message="duplicate key")
    # A code without a SQLSTATE mapping: the code is kept, the SQLSTATE is unknown.
    error = table.translate(RuntimeError("bad"), "Y0123")
    check(error, af.DataError, sqlstate=None, code="Y0123", message="bad")
    # Non-DatabaseError classes take only the message.
    error = table.translate(KeyError("k"))
    assert type(error) is af.ValidationError
    assert "k" in str(error)
    # An exception without text is named by its type.
    assert str(table.translate(RuntimeError())) == "RuntimeError"
    # sqlstates=None: the codes are SQLSTATEs already.
    assert ErrorTable(codes={}).translate(RuntimeError("x"), "42P01").sqlstate == "42P01"


# ----------------------------------------------------- server-raised errors, through af


def _pg_raise(code: str) -> af.Fragment:
    # code comes from the tables above: trusted text.
    return af.sql(f"DO $$ BEGIN RAISE EXCEPTION 'boom %', 1 USING ERRCODE = '{code}'; END $$")


def _my_signal(errno: str) -> af.Fragment:
    return af.sql(f"SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = {int(errno)}, MESSAGE_TEXT = 'boom'")


async def _collect(url: str, codes: list[str], make: Callable[[str], af.Fragment]) -> dict:
    caught: dict[str, BaseException] = {}
    async with af.connect(url, pool_size=1) as db:
        for code in codes:
            try:
                await db.execute(make(code))
            except af.Error as exc:
                caught[code] = exc
        # Connection-loss classes made the session discard its connection; the
        # Database is still fine.
        assert await db.fetch_value(af.sql("SELECT 1")) == 1
    return caught


PG_PREFIX_SAMPLES = {"08": "08006", "22": "22012", "23": "23P01", "40": "40002", "42": "42P01"}


@pytest.fixture(scope="session")
def pg_raised(request: pytest.FixtureRequest) -> dict[str, BaseException]:
    _target(request, "asyncpg", "asyncio")
    codes = [*postgresql.CODES, *PG_PREFIX_SAMPLES.values()]
    return anyio.run(_collect, POSTGRES_URL, codes, _pg_raise, backend="asyncio")


@pytest.fixture(scope="session")
def my_raised(request: pytest.FixtureRequest) -> dict[str, BaseException]:
    _target(request, "asyncmy", "asyncio")
    return anyio.run(_collect, MYSQL_URL, list(mysql.CODES), _my_signal, backend="asyncio")


@pytest.mark.parametrize("sqlstate", [*postgresql.CODES, *PG_PREFIX_SAMPLES.values()])
def test_postgresql_server_raised(sqlstate: str, pg_raised: dict[str, BaseException]) -> None:
    expected = postgresql.CODES.get(sqlstate) or postgresql.PREFIXES[sqlstate[:2]]
    error = pg_raised[sqlstate]
    check(error, expected, sqlstate=sqlstate, code=sqlstate, message="boom 1")
    assert isinstance(error.__cause__, asyncpg.exceptions.PostgresError)
    assert error.__cause__.sqlstate == sqlstate


@pytest.mark.parametrize("errno", mysql.CODES)
def test_mysql_server_raised(errno: str, my_raised: dict[str, BaseException]) -> None:
    error = my_raised[errno]
    check(error, mysql.CODES[errno], sqlstate=mysql.SQLSTATES[errno], code=errno, message="boom")
    assert isinstance(error.__cause__, asyncmy.errors.MySQLError)
    assert error.__cause__.args[0] == int(errno)


# ------------------------------------------------------------- end to end on SQLite


@pytest.mark.anyio
async def test_sqlite_errors_through_af(tmp_path: Path) -> None:
    async with af.connect(f"sqlite:///{tmp_path}/e2e.db", backend="sqlite", pool_size=2) as db:
        await db.execute(af.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, n TEXT NOT NULL)"))
        await db.execute(af.sql("INSERT INTO t VALUES (1, 'a')"))
        with pytest.raises(af.UniqueViolation) as info:
            await db.execute(af.sql("INSERT INTO t VALUES ({i}, 'b')", i=1))
        check(info.value, af.UniqueViolation, sqlstate="23505", code="1555", message="UNIQUE")
        assert isinstance(info.value.__cause__, sqlite3.IntegrityError)
        with pytest.raises(af.NotNullViolation):
            await db.execute(af.sql("INSERT INTO t VALUES (2, NULL)"))
        with pytest.raises(af.ProgrammingError) as info:
            await db.execute(af.sql("SELECT nope FROM t"))
        assert info.value.code == "1"
        assert await db.fetch_value(af.sql("SELECT count(*) FROM t")) == 1


@pytest.mark.anyio
async def test_sqlite_lock_held_by_another_process_is_lock_timeout(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    async with af.connect(f"sqlite:///{path}", backend="sqlite", busy_timeout=0.05) as db:
        await db.execute(af.sql("CREATE TABLE t (x INTEGER)"))
        outsider = sqlite3.connect(path, isolation_level=None)  # like another process
        try:
            outsider.execute("BEGIN IMMEDIATE")
            with anyio.fail_after(5):
                with pytest.raises(af.LockTimeout) as info:
                    await db.execute(af.sql("INSERT INTO t VALUES (1)"))
            assert info.value.code == "5"
            assert info.value.sqlstate == "55P03"
        finally:
            outsider.close()
        await db.execute(af.sql("INSERT INTO t VALUES (1)"))
        assert await db.fetch_value(af.sql("SELECT count(*) FROM t")) == 1


# ------------------------------------------------------- connection loss on live servers


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, anyio_backend: str) -> str:
    return _target(request, "asyncpg", anyio_backend).url(None)


@pytest.fixture
def my_url(request: pytest.FixtureRequest, anyio_backend: str) -> str:
    return _target(request, "asyncmy", anyio_backend).url(None)


PID_SQL = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
async def test_connection_killed_inside_a_transaction(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    url = request.getfixturevalue("pg_url" if dialect == "postgresql" else "my_url")
    kill = terminate_postgres_backend if dialect == "postgresql" else kill_mysql_connection
    pid_sql = af.sql(PID_SQL[dialect])
    async with af.connect(url, pool_size=1) as db:
        with anyio.fail_after(15):
            with pytest.raises(af.ConnectionLost) as info:
                async with db.transaction() as tx:
                    pid = await tx.fetch_value(pid_sql)
                    await kill(url, pid)
                    await tx.fetch_value(af.sql("SELECT 1"))
            # Not the commit: the statement after the kill failed.
            assert not isinstance(info.value, af.CommitOutcomeUnknown)
            assert info.value.__cause__ is not None
            # The broken connection was discarded (pool_size=1: the next
            # statement gets a new one) and the Database works.
            assert await db.fetch_value(af.sql("SELECT 1")) == 1
            assert await db.fetch_value(pid_sql) != pid
            async with db.transaction() as tx:
                assert await tx.fetch_value(af.sql("SELECT 2")) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
async def test_connection_killed_outside_a_transaction_is_not_reused(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    url = request.getfixturevalue("pg_url" if dialect == "postgresql" else "my_url")
    kill = terminate_postgres_backend if dialect == "postgresql" else kill_mysql_connection
    pid_sql = af.sql(PID_SQL[dialect])
    async with af.connect(url, pool_size=1) as db:
        with anyio.fail_after(15):
            session = await db._engine.acquire()
            try:
                pid = (await session.execute(db.compile(pid_sql))).rows[0][
                    "pg_backend_pid" if dialect == "postgresql" else "CONNECTION_ID()"
                ]
                await kill(url, pid)
                with pytest.raises(af.ConnectionLost):
                    await session.execute(db.compile(af.sql("SELECT 1")))
                assert session.broken
            finally:
                await db._engine.release(session)
            assert await db.fetch_value(pid_sql) != pid


ER_QUERY_INTERRUPTED = 1317


async def _sleep_killed(url: str, lock: str, named: str) -> bool:
    """SLEEP(1) on a connection holding ``lock`` while the backend's query
    killer is pointed at its id and the session lock ``named``: whether the
    server interrupted it."""
    parsed = parse_url(url)
    conn = await asyncmy_backend.open_raw(parsed, Options())
    interrupted: list[bool] = []
    try:
        async with conn.cursor() as cursor:
            await cursor.execute(mysql.SESSION_LOCK_SQL, (lock,))
            assert (await cursor.fetchone())[0] == 1

        async def sleep() -> None:
            async with conn.cursor() as cursor:
                try:
                    await cursor.execute("SELECT SLEEP(1)")
                except asyncmy.errors.OperationalError as exc:
                    assert exc.args[0] == ER_QUERY_INTERRUPTED, exc
                    interrupted.append(True)
                    return
                assert (await cursor.fetchone())[0] == 0
                interrupted.append(False)

        async with anyio.create_task_group() as tg:
            tg.start_soon(sleep)
            await anyio.sleep(0.3)
            await asyncmy_backend.kill_query(parsed, Options(), conn.thread_id(), named)
    finally:
        conn.close()
    return interrupted[0]


@pytest.mark.anyio
async def test_mysql_query_killer_stops_only_the_connection_holding_the_session(
    my_url: str, anyio_backend: str
) -> None:
    """After a server restart a connection id can name another client's
    connection; the killer checks the session lock before KILL QUERY."""
    if anyio_backend != "asyncio":
        pytest.skip("drives the asyncmy backend directly, which runs on asyncio (trio bridges)")
    with anyio.fail_after(15):
        assert await _sleep_killed(my_url, "aiofragno-test-held", "aiofragno-test-held")
        # The same id, but the session lock named is not this connection's.
        assert not await _sleep_killed(my_url, "aiofragno-test-other", "aiofragno-test-gone")


# --------------------------------------------------- connecting: refused, silent server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections but never says anything."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_connection_refused_is_database_unavailable(scheme: str, anyio_backend: str) -> None:
    url = f"{scheme}://root@127.0.0.1:{_free_port()}/test"
    with anyio.fail_after(5):
        with pytest.raises(af.DatabaseUnavailable) as info:
            await af.connect(url, connect_timeout=1)
    assert "127.0.0.1" in str(info.value)
    assert isinstance(info.value.__cause__, Exception)


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_silent_server_is_database_unavailable_after_connect_timeout(
    scheme: str, silent_server: int, anyio_backend: str
) -> None:
    """A server that accepts the TCP connection but never answers the handshake
    must fail af.connect after ``connect_timeout`` with DatabaseUnavailable —
    not QueryCanceled (no statement was running), and not hang."""
    url = f"{scheme}://root@127.0.0.1:{silent_server}/test"
    started = anyio.current_time()
    with anyio.fail_after(1.5):
        with pytest.raises(af.DatabaseUnavailable):
            await af.connect(url, connect_timeout=0.3)
    assert anyio.current_time() - started < 1.5


# ------------------------------------------------ asyncpg client-side errors on a live server


@pytest.mark.anyio
async def test_asyncpg_wrong_argument_count_is_not_connection_lost(pg_url: str) -> None:
    """asyncpg raises InterfaceError ("the server expects 1 argument for this
    query, 0 were passed") for a placeholder without a value: a programming
    error. Classified as ConnectionLost, it discards a healthy connection and
    tells the caller the connection broke."""
    async with af.connect(pg_url, pool_size=1) as db:
        pid = await db.fetch_value(af.sql("SELECT pg_backend_pid()"))
        with pytest.raises(af.Error) as info:
            await db.fetch_value(af.sql("SELECT $1::int"))
        assert isinstance(info.value.__cause__, asyncpg.exceptions.InterfaceError)
        assert type(info.value) is af.ProgrammingError
        # The connection was fine: it is kept.
        assert await db.fetch_value(af.sql("SELECT pg_backend_pid()")) == pid


@pytest.mark.anyio
async def test_asyncpg_unencodable_argument_is_a_validation_error(pg_url: str) -> None:
    """asyncpg refuses a value its codec cannot encode before sending anything
    (``invalid input for query argument $1``). The asyncpg table maps
    ``asyncpg.exceptions.DataError`` to ValidationError for exactly this, but
    asyncpg gives the exception SQLSTATE 22000, so the "22" prefix wins and the
    type entry is never reached."""
    async with af.connect(pg_url, pool_size=1) as db:
        pid = await db.fetch_value(af.sql("SELECT pg_backend_pid()"))
        with pytest.raises(af.Error) as info:
            await db.fetch_value(af.sql("SELECT {v}::int", v="not a number"))
        assert "invalid input for query argument" in str(info.value)
        assert type(info.value) is af.ValidationError
        assert await db.fetch_value(af.sql("SELECT pg_backend_pid()")) == pid
