"""Private database servers for tests that restart, crash or stall a server.

The shared servers (PostgreSQL on 127.0.0.1:5432, MariaDB on :3306) serve
every suite at once: no test restarts, stops or reconfigures them. A test
that needs to do that to a server gets one of its own, started from the
installed Debian packages under a temporary directory, listening on
127.0.0.1 and a free port:

* PostgreSQL: ``initdb`` (trust auth) and ``postgres`` from the newest
  ``/usr/lib/postgresql/*/bin`` (or ``$AIOFRAGNO_TEST_PG_BIN``), a database
  ``test``; ``fsync`` and ``synchronous_commit`` on, as crash tests need.
* MariaDB: ``mariadb-install-db`` and ``mariadbd`` with ``--no-defaults``
  (nothing of /etc/mysql applies), root without a password over TCP, a
  database ``test``, ``innodb_flush_log_at_trx_commit=1``; the character set
  and name resolution as Debian configures the shared server.

Run as root (as in CI), the servers run as the ``postgres`` / ``mysql`` OS
user (PostgreSQL refuses root); otherwise as the current user.

In a test, through the fixtures (``pytest_plugins`` in tests/conftest.py)::

    async def test_crash(private_server: PrivateServer, target: Target) -> None:
        async with af.connect(private_server.url, backend=target.backend) as db:
            ...
            await private_server.stop("crash")  # pg_ctl stop -m immediate / SIGKILL
            await private_server.start()        # crash recovery; returns when ready

``private_server`` is the target's server (a test on a SQLite target is
skipped). ``tls_server`` is one with TLS (see :class:`TLSPostgresServer` and
:class:`TLSMariaDBServer`), its throw-away certificates made by
tests/certificates.py. One server per dialect serves the whole session, shared by the
tests of both runtimes: starting one takes about a second (``initdb`` /
``mariadb-install-db``), a restart a tenth of that. After each test it is
running again (resumed, or started if the test left it stopped), or replaced
by a new one if it cannot be started; tests keep their data apart as on the
shared servers (unique namespaces). The times are listed at the end of the
run ("private test servers").

Cleanup is guaranteed: the session's teardown stops each server and removes
its directory, also after a failed or interrupted (Ctrl-C) test; and a
watchdog process (``tests/server_watchdog.py``) does it when the test
process ends without teardown (killed, or SIGTERM from a CI timeout). The
servers run in sessions of their own, so a Ctrl-C in the terminal reaches
only pytest.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, ClassVar, Generic, Literal, Protocol, TypeVar

import anyio.to_thread
import pytest

from tests.certificates import CLIENT_USER, make_certificates
from tests.conftest import Target, required_dialects
from tests.server_watchdog import children, signal_server

StopMode = Literal["clean", "crash"]

START_TIMEOUT = 60.0  # seconds until a started server accepts connections (crash recovery included)
STOP_TIMEOUT = 60.0  # seconds a server has to stop before it is killed
POLL = 0.02  # seconds between readiness checks
# Below Linux's ephemeral range (32768-60999 by default), so that no outgoing
# connection takes the port while the server is down for a restart.
PORTS = range(20000, 32768)
WATCHDOG = Path(__file__).with_name("server_watchdog.py")


class ServerUnavailable(Exception):
    """The server cannot be run here (not installed, no OS user for it)."""


class ServerFailed(RuntimeError):
    """The server did not start or stop as it should; the message ends with
    the last lines of its log."""


class PrivateServer(ABC):
    """One database server of a test's own, in a temporary directory.

    Not thread-safe: one lifecycle call at a time. The ``*_blocking`` methods
    are for fixtures; the async ones run them in a worker thread, so that a
    test's load goes on while the server stops and starts.
    """

    dialect: ClassVar[str]
    kind: ClassVar[str]  # which server of the dialect: the session has one of each kind
    service_user: ClassVar[str]  # the OS user the server runs as when we are root
    # How each stop mode is asked for: a signal to the server's main process.
    stop_signals: ClassVar[dict[StopMode, signal.Signals]]

    def __init__(self) -> None:
        self._run_as = self.service_user if os.geteuid() == 0 else None
        self._check_installed()
        self.port = free_port()
        self.timings: list[tuple[str, float]] = []  # (what, seconds), for the run's summary
        self._process: subprocess.Popen[bytes] | None = None
        self.directory = Path(tempfile.mkdtemp(prefix=f"aiofragno-{self.dialect}-"))
        try:
            if self._run_as is not None:
                user = pwd.getpwnam(self._run_as)
                os.chown(self.directory, user.pw_uid, user.pw_gid)
            self._watchdog = subprocess.Popen(
                [
                    sys.executable,
                    str(WATCHDOG),
                    str(self.directory),
                    self.stop_signals["crash"].name,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.url} {state} in {self.directory}>"

    # -- what each server does differently ---------------------------------------

    @property
    @abstractmethod
    def url(self) -> str:
        """The URL of the ``test`` database (for ``af.connect``)."""

    @abstractmethod
    def _check_installed(self) -> None:
        """Raise ServerUnavailable (saying what to install) if the server cannot run."""

    @abstractmethod
    def _initialise(self) -> None:
        """Create the data directory (the server is not running yet)."""

    @abstractmethod
    def _after_first_start(self) -> None:
        """Anything that needs the running server once (the ``test`` database)."""

    @abstractmethod
    def _command(self) -> list[str]:
        """The server's command line: it runs in the foreground."""

    @abstractmethod
    def _ready(self, pid: int) -> bool:
        """Whether the server process ``pid`` accepts connections."""

    @property
    @abstractmethod
    def log(self) -> Path:
        """Where the server's output goes."""

    @property
    def data(self) -> Path:
        """The server's data directory."""
        return self.directory / "data"

    # -- lifecycle ----------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the server process runs (it may be paused)."""
        return self._process is not None and self._process.poll() is None

    def create_blocking(self) -> None:
        """Initialise the data directory, start the server, create ``test``."""
        started = time.monotonic()
        self._initialise()
        self.timings.append(("initialise", time.monotonic() - started))
        self.start_blocking()
        self._after_first_start()

    def start_blocking(self) -> float:
        """Start the server (after a crash: with recovery) and return the
        seconds until it accepted connections. Raises ServerFailed, with its
        log, if it exits or is not ready within START_TIMEOUT (then it is
        killed)."""
        if self.running:
            raise ServerFailed(f"{self!r} is already running")
        started = time.monotonic()
        with self.log.open("ab") as log:
            process = self._spawn(self._command(), log)
        self._process = process
        (self.directory / "server.pid").write_text(str(process.pid))  # for the watchdog
        while not self._ready(process.pid):
            if process.poll() is not None:
                raise ServerFailed(f"{self!r} exited with {process.returncode}{self._log_tail()}")
            if time.monotonic() - started > START_TIMEOUT:
                self._kill()
                raise ServerFailed(
                    f"{self!r} not ready after {START_TIMEOUT}s; killed{self._log_tail()}"
                )
            time.sleep(POLL)
        elapsed = time.monotonic() - started
        self.timings.append(("start", elapsed))
        return elapsed

    def stop_blocking(self, mode: StopMode = "clean") -> float:
        """Stop the server and return the seconds until its process ended.

        ``clean``: PostgreSQL's fast shutdown (``pg_ctl stop -m fast``: open
        transactions rolled back, clients disconnected, a checkpoint),
        MariaDB's normal shutdown (SIGTERM). ``crash``: PostgreSQL's immediate
        shutdown (``pg_ctl stop -m immediate``: every process quits at once,
        no checkpoint; the next start recovers from the WAL), SIGKILL for
        MariaDB (InnoDB recovers at the next start). A paused server is
        resumed to act on it; one that has not ended after STOP_TIMEOUT is
        killed (and ServerFailed raised)."""
        process = self._process
        if process is None or process.poll() is not None:
            return 0.0
        started = time.monotonic()
        process.send_signal(self.stop_signals[mode])
        self.resume()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._kill()
            raise ServerFailed(
                f"{self!r} did not stop ({mode}) within {STOP_TIMEOUT}s; killed" + self._log_tail()
            ) from None
        elapsed = time.monotonic() - started
        self.timings.append((f"stop {mode}", elapsed))
        return elapsed

    async def start(self) -> float:
        """:meth:`start_blocking`, in a worker thread."""
        return await anyio.to_thread.run_sync(self.start_blocking)

    async def stop(self, mode: StopMode = "clean") -> float:
        """:meth:`stop_blocking`, in a worker thread."""
        return await anyio.to_thread.run_sync(self.stop_blocking, mode)

    async def restart(self, mode: StopMode = "clean") -> float:
        """Stop (``mode``) and start again; the seconds the start took."""
        await self.stop(mode)
        return await self.start()

    def pause(self) -> None:
        """Stall the server: SIGSTOP to all its processes. Connections stay
        open and nothing is answered (a hung server, not a dead one) until
        :meth:`resume`. Returns once every thread has stopped: kill() only
        queues the signal, and a thread busy with a reply would still send it."""
        self._signal(signal.SIGSTOP)
        if self._process is not None:
            wait_stopped(self._process.pid)

    def resume(self) -> None:
        """Undo :meth:`pause` (harmless if not paused)."""
        self._signal(signal.SIGCONT)

    def close(self) -> None:
        """Crash-stop the server if it runs (killed if it does not end), and
        remove its directory. Idempotent."""
        if self.running:
            with contextlib.suppress(ServerFailed):  # (then it was killed)
                self.stop_blocking("crash")
        self._process = None
        shutil.rmtree(self.directory, ignore_errors=True)
        if self._watchdog.stdin is not None:
            self._watchdog.stdin.close()  # the watchdog finds nothing to do and exits
        self._watchdog.wait()

    # -- helpers -------------------------------------------------------------------

    def _spawn(self, command: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        """``command`` as the service user, in a session of its own (so that
        a terminal's Ctrl-C does not reach it), in the server's directory,
        its output to ``log``."""
        user = pwd.getpwnam(self._run_as) if self._run_as is not None else None
        return subprocess.Popen(
            command,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )

    def _run(self, command: list[str], *, what: str) -> None:
        """Run a set-up command to completion as the service user; its output
        goes to the log. Raises ServerFailed if it fails."""
        with self.log.open("ab") as log:
            process = self._spawn(command, log)
        if process.wait(START_TIMEOUT) != 0:
            raise ServerFailed(f"{what} failed with {process.returncode}{self._log_tail()}")

    def _capture(self, command: list[str], *, what: str) -> str:
        """Run a client command as the service user; its stripped output.
        Raises ServerFailed, with its error output, if it fails."""
        user = pwd.getpwnam(self._run_as) if self._run_as is not None else None
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
            check=False,
        )
        if done.returncode != 0:
            raise ServerFailed(f"{what!r} on {self!r}: {done.stderr.strip()}")
        return done.stdout.strip()

    def _signal(self, sig: signal.Signals) -> None:
        """``sig`` for the running server's processes."""
        if self.running:
            assert self._process is not None
            signal_server(self._process.pid, sig)

    def _kill(self) -> None:
        self._signal(signal.SIGKILL)
        if self._process is not None:
            self._process.wait()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"; the last lines of {self.log}:\n" + "\n".join(tail)


class PostgresServer(PrivateServer):
    """PostgreSQL: ``initdb`` and ``postgres`` (see the module docstring)."""

    dialect = "postgresql"
    kind = "postgresql"
    service_user = "postgres"
    # What pg_ctl sends for "stop -m fast" and "stop -m immediate" (SIGTERM
    # would be a smart shutdown, which waits for every client to disconnect).
    stop_signals: ClassVar[dict[StopMode, signal.Signals]] = {
        "clean": signal.SIGINT,
        "crash": signal.SIGQUIT,
    }
    # More initdb options, for a subclass.
    initdb_options: ClassVar[tuple[str, ...]] = ()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/test"

    @property
    def log(self) -> Path:
        return self.directory / "postgres.log"

    def _check_installed(self) -> None:
        self.bin = postgres_bin()
        if self._run_as is not None:
            service_account(self._run_as)

    def _initialise(self) -> None:
        # --no-sync: a fresh cluster need not survive an OS crash; the server
        # itself runs with fsync on.
        self._run(
            [
                str(self.bin / "initdb"),
                f"--pgdata={self.data}",
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
                *self.initdb_options,
            ],
            what="initdb",
        )

    def _after_first_start(self) -> None:
        self._psql("CREATE DATABASE test", database="postgres")

    def _psql(self, sql: str, *, database: str = "test") -> None:
        """Run ``sql`` as the superuser."""
        self._run(
            [
                str(self.bin / "psql"),
                *("-X", "-q", "-w", "-h", "127.0.0.1", "-p", str(self.port)),
                *("-U", "postgres", "-d", database, "-c", sql),
            ],
            what=sql,
        )

    def _settings(self) -> dict[str, str]:
        return {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.directory),
            "fsync": "on",
            "synchronous_commit": "on",
            "timezone": "UTC",
        }

    def _command(self) -> list[str]:
        settings = self._settings()
        options = [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
        return [str(self.bin / "postgres"), "-D", str(self.data), *options]

    def _ready(self, pid: int) -> bool:
        # As pg_ctl tells: postmaster.pid names this process and says "ready"
        # (written once recovery is over and connections are accepted).
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0] == str(pid) and lines[7].strip() == "ready"


class TLSPostgresServer(PostgresServer):
    """PostgreSQL with TLS, for connections with and without it. Its
    pg_hba.conf: the role ``certuser`` must come over TLS with a client
    certificate (``hostssl ... cert``: the certificate's name is the role),
    ``pwuser`` with its password (``PASSWORD``, scram-sha-256), everyone
    else is trusted."""

    kind = "postgresql+tls"
    PASSWORD = "pw-Zr4-secret"

    def _check_installed(self) -> None:
        super()._check_installed()
        self.openssl = find_program("openssl", "apt-get install openssl")

    def _initialise(self) -> None:
        super()._initialise()
        self.certificates = make_certificates(self.openssl, self.directory / "tls", self._run_as)
        (self.data / "pg_hba.conf").write_text(
            "local   all all                      trust\n"
            f"hostssl all {CLIENT_USER} 127.0.0.1/32 cert\n"
            f"host    all {CLIENT_USER} 127.0.0.1/32 reject\n"
            "host    all pwuser     127.0.0.1/32 scram-sha-256\n"
            "host    all all        127.0.0.1/32 trust\n"
        )

    def _after_first_start(self) -> None:
        super()._after_first_start()
        self._psql(
            f"CREATE ROLE {CLIENT_USER} LOGIN; CREATE ROLE pwuser LOGIN PASSWORD '{self.PASSWORD}'"
        )

    def _settings(self) -> dict[str, str]:
        return {
            **super()._settings(),
            "ssl": "on",
            "ssl_cert_file": str(self.certificates.server_cert),
            "ssl_key_file": str(self.certificates.server_key),
            "ssl_ca_file": str(self.certificates.ca),  # to check client certificates
        }


class MariaDBServer(PrivateServer):
    """MariaDB: ``mariadb-install-db`` and ``mariadbd`` (see the module docstring)."""

    dialect = "mysql"
    kind = "mysql"
    service_user = "mysql"
    stop_signals: ClassVar[dict[StopMode, signal.Signals]] = {
        "clean": signal.SIGTERM,
        "crash": signal.SIGKILL,
    }

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/test"

    @property
    def log(self) -> Path:
        return self.directory / "mariadb.log"

    @property
    def socket(self) -> Path:
        return self.directory / "mysqld.sock"

    def _check_installed(self) -> None:
        self.mariadbd = find_program("mariadbd", "apt-get install mariadb-server")
        self.install_db = find_program("mariadb-install-db", "apt-get install mariadb-server")
        self.client = find_program("mariadb", "apt-get install mariadb-client")
        if self._run_as is not None:
            service_account(self._run_as)

    def _server_options(self) -> list[str]:
        """Options for both the bootstrap and the server."""
        return [
            "--no-defaults",
            f"--datadir={self.data}",
            # Its own tmpdir: a server deletes every "#sql*" file in its tmpdir
            # when it starts, which in the shared /tmp would include the
            # shared server's in-flight temporary tables.
            f"--tmpdir={self.directory}",
            "--innodb-log-file-size=16M",  # (not the 96M default: quicker to create)
        ]

    def _initialise(self) -> None:
        self._run(
            [
                str(self.install_db),
                *self._server_options(),
                "--auth-root-authentication-method=normal",
            ],
            what="mariadb-install-db",
        )

    def _after_first_start(self) -> None:
        """Nothing: mariadb-install-db created the database ``test``."""

    def query_blocking(self, sql: str) -> str:
        """``sql`` run as root over the socket; its result, tab-separated
        without column names (``mariadb -N -B``)."""
        return self._capture(
            [
                str(self.client),
                *("--no-defaults", "-S", str(self.socket), "-u", "root", "-N", "-B"),
                *("-e", sql),
            ],
            what=sql,
        )

    def _command(self) -> list[str]:
        return [
            str(self.mariadbd),
            *self._server_options(),
            "--bind-address=127.0.0.1",
            f"--port={self.port}",
            f"--socket={self.socket}",
            f"--pid-file={self.directory / 'mysqld.pid'}",
            # As Debian configures the shared server:
            "--skip-name-resolve",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            "--innodb-flush-log-at-trx-commit=1",
        ]

    def _ready(self, pid: int) -> bool:
        # The server greets a new connection (protocol version 10) only once
        # it handles connections: after InnoDB recovery and the grant tables.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as probe:
                greeting = probe.recv(5)
        except OSError:
            return False
        return len(greeting) == 5 and greeting[4] == 10


class TLSMariaDBServer(MariaDBServer):
    """MariaDB with TLS, for connections with and without it; the user
    ``certuser`` must present a client certificate (``REQUIRE X509``).
    performance_schema is on, for the connection attributes."""

    kind = "mysql+tls"

    def _check_installed(self) -> None:
        super()._check_installed()
        self.openssl = find_program("openssl", "apt-get install openssl")

    def _initialise(self) -> None:
        super()._initialise()
        self.certificates = make_certificates(self.openssl, self.directory / "tls", self._run_as)

    def _after_first_start(self) -> None:
        self.query_blocking(
            f"CREATE USER {CLIENT_USER}@'%' REQUIRE X509; GRANT ALL ON test.* TO {CLIENT_USER}@'%'"
        )

    def _command(self) -> list[str]:
        return [
            *super()._command(),
            f"--ssl-ca={self.certificates.ca}",
            f"--ssl-cert={self.certificates.server_cert}",
            f"--ssl-key={self.certificates.server_key}",
            "--performance-schema=ON",
        ]


SERVERS: dict[str, type[PrivateServer]] = {
    server.kind: server
    for server in (PostgresServer, MariaDBServer, TLSPostgresServer, TLSMariaDBServer)
}


def postgres_bin() -> Path:
    """``$AIOFRAGNO_TEST_PG_BIN``, or the newest ``/usr/lib/postgresql/*/bin``."""
    configured = os.environ.get("AIOFRAGNO_TEST_PG_BIN")
    candidates = (
        [Path(configured)]
        if configured
        else sorted(
            Path("/usr/lib/postgresql").glob("*/bin"),
            key=lambda path: [int(part) for part in path.parent.name.split(".") if part.isdigit()],
            reverse=True,
        )
    )
    for candidate in candidates:
        if all((candidate / tool).is_file() for tool in ("initdb", "postgres", "psql")):
            return candidate
    raise ServerUnavailable(
        "no PostgreSQL server binaries (initdb, postgres, psql) in "
        f"{configured or '/usr/lib/postgresql/*/bin'}; apt-get install postgresql "
        "(or point AIOFRAGNO_TEST_PG_BIN at them)"
    )


def find_program(name: str, install: str) -> Path:
    path = shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))
    if path is None:
        raise ServerUnavailable(f"{name} is not installed; {install}")
    return Path(path)


def service_account(user: str) -> None:
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise ServerUnavailable(
            f"running as root, the server must run as the OS user {user!r}, which does not exist "
            "(the Debian package creates it)"
        ) from None


def wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Wait until every thread of ``pid`` and its children is stopped (state
    ``T`` in /proc), or ``timeout`` has passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_thread_states_stopped(p) for p in (pid, *children(pid))):
            return
        time.sleep(0.005)


def _thread_states_stopped(pid: int) -> bool:
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        # /proc/<pid>/task/<tid>/stat: "tid (comm) S ...": the state follows the last ')'.
        return all((t / "stat").read_text().rpartition(")")[2].split()[0] in "Tt" for t in tasks)
    except (OSError, IndexError):
        return True  # (gone: nothing left to answer)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to, below the ephemeral range."""
    for port in random.sample(PORTS, 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerUnavailable(f"no free port found in {PORTS}")


_templates: dict[type[PrivateServer], PrivateServer] = {}
_templates_lock = threading.Lock()  # (the servers of a pair may be made at once)


def copy_template(template: type[PrivateServer], server: PrivateServer) -> None:
    """``server``'s data directory: a copy (ownership kept) of the session's
    ``template`` server's — created, then stopped cleanly — made on first use
    and removed when the process exits. Copying a cleanly stopped data
    directory takes a fraction of initialising one (or of a base backup),
    which is what makes replication pairs cheap enough for every test run."""
    with _templates_lock:
        made = _templates.get(template)
        if made is None:
            made = template()
            try:
                made.create_blocking()
                made.stop_blocking("clean")
            except BaseException:
                made.close()
                raise
            _templates[template] = made
            atexit.register(made.close)
    subprocess.run(["cp", "-a", str(made.data), str(server.data)], check=True)


@contextlib.contextmanager
def skip_unless_available(dialect: str) -> Iterator[None]:
    """Turn :class:`ServerUnavailable` into a skip with its reason — or a
    failure, where AIOFRAGNO_REQUIRE_BACKENDS names ``dialect``."""
    try:
        yield
    except ServerUnavailable as exc:
        if dialect in required_dialects():
            pytest.fail(f"{exc}; AIOFRAGNO_REQUIRE_BACKENDS requires {dialect}")
        pytest.skip(str(exc))


class Closeable(Protocol):
    def close(self) -> None: ...


Made = TypeVar("Made", bound=Closeable)


class SharedPairs(Generic[Made]):
    """Servers (replication pairs) made on first use and kept, one per set
    of options — for a module-scoped fixture: made only once a test that
    runs asks, so that skipped tests cost nothing. ``make(**options)`` makes
    one; ``before_use()`` runs at each hand-out (the fence's forget)."""

    def __init__(self, make: Callable[..., Made], before_use: Callable[[], None]) -> None:
        self._make = make
        self._before_use = before_use
        self._made: dict[tuple[tuple[str, object], ...], Made] = {}

    def get(self, **options: object) -> Made:
        key = tuple(sorted(options.items()))
        if key not in self._made:
            self._made[key] = self._make(**options)
        self._before_use()
        return self._made[key]

    def take(self, **options: object) -> Made:
        """As :meth:`get`, for the caller to keep — and close: for a test
        that leaves it changed (a promotion), as the last to use it."""
        made = self.get(**options)
        del self._made[tuple(sorted(options.items()))]
        return made

    def close(self) -> None:
        for made in self._made.values():
            made.close()
        self._made.clear()


# -- fixtures ----------------------------------------------------------------------


class PrivateServers:
    """The session's private servers: one per kind, started on first use."""

    def __init__(self) -> None:
        self.servers: dict[str, PrivateServer] = {}
        self.unavailable: dict[str, str] = {}  # kind -> why it cannot run here
        self.retired: list[PrivateServer] = []  # replaced or closed: for the summary

    def get(self, kind: str) -> PrivateServer:
        """The running server of ``kind`` (a key of SERVERS); raises ServerUnavailable."""
        if kind in self.unavailable:
            raise ServerUnavailable(self.unavailable[kind])
        server = self.servers.get(kind)
        if server is None:
            try:
                server = SERVERS[kind]()
            except ServerUnavailable as exc:
                self.unavailable[kind] = str(exc)
                raise
            self.servers[kind] = server
            try:
                server.create_blocking()
            except BaseException:
                self.discard(server)
                raise
        return server

    def reset(self, server: PrivateServer) -> None:
        """After a test: ``server`` running again (resumed, or started), or
        discarded if it cannot be (the next test gets a new one)."""
        try:
            server.resume()
            if not server.running:
                server.start_blocking()
        except BaseException:
            self.discard(server)
            raise

    def discard(self, server: PrivateServer) -> None:
        server.close()
        if self.servers.get(server.kind) is server:
            del self.servers[server.kind]
        self.retired.append(server)

    def close(self) -> None:
        for server in list(self.servers.values()):
            self.discard(server)

    def summary(self) -> Iterator[str]:
        for server in self.retired:
            kinds: dict[str, list[float]] = {}
            for what, seconds in server.timings:
                kinds.setdefault(what, []).append(seconds)
            listed = "; ".join(
                f"{what} {len(times)}x {min(times):.2f}-{max(times):.2f}s"
                if len(times) > 1
                else f"{what} {times[0]:.2f}s"
                for what, times in kinds.items()
            )
            yield f"{server.kind} on port {server.port}: {listed}"


SERVERS_KEY = pytest.StashKey[PrivateServers]()


@pytest.fixture(scope="session")
def private_servers(request: pytest.FixtureRequest) -> Iterator[PrivateServers]:
    """The session's private servers (prefer ``private_server``)."""
    servers = request.config.stash.setdefault(SERVERS_KEY, PrivateServers())
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def private_server(target: Target, private_servers: PrivateServers) -> Iterator[PrivateServer]:
    """A private server of the target's dialect, running; after the test it
    runs again (see the module docstring). Skips on SQLite (embedded: no
    server); where the server or the driver is not installed, skips — or
    fails, if AIOFRAGNO_REQUIRE_BACKENDS names the dialect."""
    yield from _server(target, private_servers, target.dialect)


@pytest.fixture
def tls_server(target: Target, private_servers: PrivateServers) -> Iterator[TLSServer]:
    """As ``private_server``, a server with TLS (TLSPostgresServer, TLSMariaDBServer)."""
    for server in _server(target, private_servers, f"{target.dialect}+tls"):
        assert isinstance(server, TLSPostgresServer | TLSMariaDBServer)
        yield server


TLSServer = TLSPostgresServer | TLSMariaDBServer


def _server(target: Target, servers: PrivateServers, kind: str) -> Iterator[PrivateServer]:
    if target.dialect == "sqlite":
        pytest.skip("SQLite is embedded: there is no server to restart, crash, stall or encrypt")
    with skip_unless_available(target.dialect):
        if importlib.util.find_spec(target.module) is None:
            raise ServerUnavailable(
                f"driver {target.module} is not installed (pip install 'aiofragno[all]')"
            )
        server = servers.get(kind)
    yield server
    servers.reset(server)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    servers = terminalreporter.config.stash.get(SERVERS_KEY, None)
    lines = list(servers.summary()) if servers is not None else []
    if lines:
        terminalreporter.write_sep("-", "private test servers (tests/servers.py)")
        for line in lines:
            terminalreporter.write_line(line)
