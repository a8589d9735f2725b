"""SQL functions aiofragno adds to each SQLite connection: exact aggregates
of decimals, which SQLite stores as text — its own SUM would add them as
floats, and its MIN and MAX would compare them as text ("9" > "10") — and a
lower case of all of Unicode (SQLite's LOWER folds ASCII letters only)."""

from __future__ import annotations

import sqlite3
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, Inexact, Rounded
from typing import Any

# Addition that is exact or fails: a sum never rounds.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[Inexact, Rounded])


class _DecimalSum:
    """The exact sum, as positional text (None over no values)."""

    def __init__(self) -> None:
        self.total: Decimal | None = None

    def step(self, value: str | None) -> None:
        if value is not None:
            number = Decimal(value)
            self.total = number if self.total is None else _EXACT.add(self.total, number)

    def finalize(self) -> str | None:
        return None if self.total is None else format(self.total, "f")


class _DecimalMin:
    """The least value, as stored (None over no values). (Decimal
    comparisons are exact: no context rounds them.)"""

    def __init__(self) -> None:
        self.best: tuple[Decimal, str] | None = None

    def step(self, value: str | None) -> None:
        if value is None:
            return
        number = Decimal(value)
        if self.best is None or self.better(number, self.best[0]):
            self.best = (number, value)

    @staticmethod
    def better(number: Decimal, best: Decimal) -> bool:
        return number < best

    def finalize(self) -> str | None:
        return None if self.best is None else self.best[1]


class _DecimalMax(_DecimalMin):
    """The greatest value, as stored."""

    @staticmethod
    def better(number: Decimal, best: Decimal) -> bool:
        return number > best


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def add_functions(raw: sqlite3.Connection) -> None:
    """Register the functions on ``raw`` (run on its thread)."""
    # (typeshed's protocol has an aggregate take and give ints only.)
    aggregates: dict[str, Any] = {
        "aiofragno_decimal_sum": _DecimalSum,
        "aiofragno_decimal_min": _DecimalMin,
        "aiofragno_decimal_max": _DecimalMax,
    }
    for name, aggregate in aggregates.items():
        raw.create_aggregate(name, 1, aggregate)
    raw.create_function("aiofragno_lower", 1, _lower, deterministic=True)
