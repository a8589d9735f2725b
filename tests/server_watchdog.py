"""The last line of cleanup for a private test server (``tests/servers.py``).

Run as ``python server_watchdog.py DIRECTORY SIGNAL``, with stdin a pipe whose
writing end only the test process holds. It waits until that end closes —
the test process closed it after removing the server itself, or it ended
without doing so (killed, or SIGTERM from a CI timeout, which skips pytest's
teardown). Then, if the server whose pid ``DIRECTORY/server.pid`` names still
runs from that directory, it gets SIGNAL (its crash stop: the server ends
its own child processes and releases its shared memory), SIGKILL for it and
its children after a grace period, and ``DIRECTORY`` is removed.

Only the standard library: it runs detached from the test process, in a
session of its own (so a Ctrl-C in the terminal does not end it first).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

GRACE = 5.0  # seconds the server has to act on SIGNAL before SIGKILL


def server_pid(directory: Path) -> int | None:
    """The pid in ``server.pid``, if that process still runs from ``directory``
    (a pid of a server long gone may have been reused by another process)."""
    try:
        pid = int((directory / "server.pid").read_text())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if os.fsencode(directory) in command and alive(pid) else None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: nobody may be left to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


def signal_server(pid: int, sig: signal.Signals) -> None:
    """``sig`` for the server process ``pid`` and its children. (Not its
    process group: PostgreSQL's child processes each start a session of their
    own.) The server first, so that a stopped server forks no child after the
    list was taken."""
    os.kill(pid, sig)
    for child in children(pid):
        with suppress(ProcessLookupError):
            os.kill(child, sig)


def main(directory: Path, stop_signal: signal.Signals) -> None:
    sys.stdin.buffer.read()
    pid = server_pid(directory)
    if pid is not None:
        with suppress(ProcessLookupError):
            signal_server(pid, signal.SIGCONT)  # a paused server must run to stop
            os.kill(pid, stop_signal)
        deadline = time.monotonic() + GRACE
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with suppress(ProcessLookupError):
            signal_server(pid, signal.SIGKILL)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), signal.Signals[sys.argv[2]])
