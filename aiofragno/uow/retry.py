"""Retry policies for units of work that conflict with concurrent writers.

A policy is any object with ``delay(attempt) -> float | None``: given how many
attempts have failed so far (1, 2, ...), the seconds to wait before the next
one, or None to give up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol


class RetryPolicy(Protocol):
    def delay(self, attempt: int) -> float | None: ...


@dataclass(frozen=True, slots=True)
class ExponentialBackoff:
    """Up to ``max_retries`` retries; waits ``initial`` seconds, doubling up to
    ``maximum``, each wait drawn uniformly from [wait/2, wait] ("equal jitter")
    so that colliding units spread out."""

    max_retries: int = 5
    initial: float = 0.01
    maximum: float = 0.1

    def delay(self, attempt: int) -> float | None:
        if attempt > self.max_retries:
            return None
        wait = min(self.maximum, self.initial * 2.0 ** (attempt - 1))
        jittered: float = wait / 2 + random.random() * wait / 2
        return jittered


@dataclass(frozen=True, slots=True)
class NoRetry:
    """Never retry: the first conflict raises ``ConcurrencyConflict``."""

    def delay(self, attempt: int) -> float | None:
        return None
