"""Random bytes from the operating system's CSPRNG, read a page at a time.

Every unit of work draws a few: its id, each created row's id, the nonce of
its call. ``os.urandom`` is a system call that lets go of the GIL, and on a
busy event loop each such call is a chance for another thread (a SQLite
connection's) to take the GIL and keep it until its next statement: a few
per unit showed as 6% of SQLite's write throughput. The bytes are the same
``os.urandom`` bytes, each handed out once; a forked child starts afresh,
so parent and child never share them.
"""

from __future__ import annotations

import os
import threading

_PAGE = 4096

_lock = threading.Lock()
_buffer = b""
_offset = 0


def random_bytes(count: int) -> bytes:
    """``count`` bytes from ``os.urandom``, never handed out before."""
    global _buffer, _offset
    with _lock:
        start = _offset
        end = start + count
        if end > len(_buffer):
            _buffer = os.urandom(max(_PAGE, count))
            start, end = 0, count
        _offset = end
        return _buffer[start:end]


def _forget() -> None:
    # The child starts afresh: no bytes the parent hands out too, and a lock
    # that no thread of the parent's may have held as it forked.
    global _buffer, _offset, _lock
    _buffer, _offset, _lock = b"", 0, threading.Lock()


os.register_at_fork(after_in_child=_forget)
