"""Values shown in error messages."""

from __future__ import annotations

from typing import Any


def brief(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for an error message about
    a value that may be hostile. Never raises: an int too long for ``repr``
    (over ``sys.get_int_max_str_digits()`` digits), a structure nested past
    the recursion limit or an object whose ``__repr__`` fails is described
    by its type instead."""
    if isinstance(value, int) and value.bit_length() > 4000:
        return f"<{type(value).__name__} of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # (RecursionError, ValueError, or the object's own)
        return f"<{type(value).__name__} that cannot be shown>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
