"""Values shown in error messages."""

from __future__ import annotations

from typing import Any


def brief(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message about
    a value that may be hostile: an int too long for ``repr`` (over
    ``sys.get_int_max_str_digits()`` digits, which ``repr`` refuses with
    ValueError) is described instead, and nothing long is shown whole."""
    if isinstance(value, int) and value.bit_length() > 4000:
        return f"<{type(value).__name__} of {value.bit_length()} bits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
