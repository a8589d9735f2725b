"""Where a run's CPU time went: the event-loop thread, this process's other
threads (SQLite's engine and aiosqlite's queue; the thread backend's workers),
and the database server's processes on this machine.

On a 2-core machine the client and the server share the cores, so a variant's
throughput at high concurrency follows the sum of all three. Splitting them
shows which side a slower variant spends its extra time on.

Server CPU is read from ``/proc/<pid>/stat`` of every process named like the
server (``postgres`` backends and background workers; ``mariadbd``/``mysqld``
with all its threads). It is ``None`` when ``/proc`` is missing or the server
is not on this machine. Processes that exit during a run lose their share,
which is why the benchmarks keep their connections open across a measurement.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVER_COMMANDS = {"postgresql": ("postgres",), "mysql": ("mariadbd", "mysqld")}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "")
_PROC = Path("/proc")


def server_commands(dialect: str, host: str | None) -> tuple[str, ...]:
    """The process names to meter for a server at ``host``; none when remote."""
    if (host or "") not in LOCAL_HOSTS or not _PROC.is_dir():
        return ()
    return SERVER_COMMANDS.get(dialect, ())


def _ticks(commands: tuple[str, ...]) -> dict[int, int]:
    """utime + stime, in clock ticks, of each running process named in ``commands``."""
    found: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited between listing and reading
            continue
        name_end = stat.rindex(")")
        if stat[stat.index("(") + 1 : name_end] not in commands:
            continue
        fields = stat[name_end + 2 :].split()  # fields[0] is the state, field 3 of proc(5)
        found[int(entry.name)] = int(fields[11]) + int(fields[12])
    return found


@dataclass(frozen=True)
class CpuUsed:
    """CPU seconds spent between two samples."""

    loop: float
    threads: float
    server: float | None

    def __add__(self, other: CpuUsed) -> CpuUsed:
        server = None if self.server is None or other.server is None else self.server + other.server
        return CpuUsed(self.loop + other.loop, self.threads + other.threads, server)


@dataclass(frozen=True)
class CpuSample:
    """CPU time so far; take one before and one after a run, from the loop's thread."""

    process: float
    loop: float
    server: Mapping[int, int] | None

    @classmethod
    def take(cls, commands: tuple[str, ...]) -> CpuSample:
        return cls(time.process_time(), time.thread_time(), _ticks(commands) if commands else None)

    def until(self, later: CpuSample) -> CpuUsed:
        loop = later.loop - self.loop
        server = None
        if self.server is not None and later.server is not None:
            ticks = sum(t - self.server.get(pid, 0) for pid, t in later.server.items())
            server = ticks / os.sysconf("SC_CLK_TCK")
        return CpuUsed(loop, later.process - self.process - loop, server)


NO_CPU = CpuUsed(0.0, 0.0, 0.0)
