"""aiofragno.random_bytes: os.urandom read a page at a time — each byte
handed out once, across threads and across a fork (the child starts with
bytes and a lock of its own)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from aiofragno.random_bytes import random_bytes


def test_bytes_are_handed_out_once_across_threads() -> None:
    drawn: list[bytes] = []

    def draw() -> None:
        drawn.extend(random_bytes(16) for _ in range(2000))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(drawn) == 8000 and len(set(drawn)) == 8000
    assert len(random_bytes(10_000)) == 10_000  # (more than a page at once)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (fork with threads: on purpose)
def test_a_child_forked_while_threads_draw_gets_bytes_of_its_own() -> None:
    """Threads refill the buffer (holding the lock across os.urandom) while
    the main thread forks: each child draws at once, and never the bytes
    the parent hands out next."""
    stop = threading.Event()

    def refill() -> None:
        while not stop.is_set():
            random_bytes(4096)

    threads = [threading.Thread(target=refill) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: its bytes to the parent, then out
                os.write(write, random_bytes(16))
                os._exit(0)
            os.close(write)
            parents = random_bytes(16)
            child = _read_within(read, 16, seconds=5, pid=pid)
            assert child is not None, "the child hung drawing random bytes"
            assert child != parents
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def _read_within(fd: int, size: int, *, seconds: float, pid: int) -> bytes | None:
    """``size`` bytes from ``fd`` once ``pid`` exited, or None (killed) if
    it did not within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            data = os.read(fd, size)
            os.close(fd)
            return data
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(fd)
    return None
