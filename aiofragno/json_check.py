"""What a JSON value must be before aiofragno writes it: every object key a
``str`` (``json`` would turn ``True`` into ``"true"`` and tagged JSON into
``"True"``: neither reads back as written), and arrays and objects nested at
most a bounded number of levels — so that encoding it, tagging it for an
outbox payload and decoding it again never runs into Python's recursion
limit, and the database's own limit (MariaDB: 32 levels) is known before
any SQL."""

from __future__ import annotations

from typing import Any

from .brief import brief
from .errors import ValidationError

MAX_DEPTH = 64
"""The most levels of arrays and objects a JSON value may nest."""

_CONTAINERS = (dict, list, tuple)


def check_json(value: Any, max_depth: int = MAX_DEPTH, *, escapes: bool = False) -> None:
    """Raise ValidationError unless every object key in ``value`` is a str
    and its arrays and objects nest at most ``max_depth`` levels. With
    ``escapes``, an object with a single key starting with ``$`` counts as
    three levels, as the outbox's tagged JSON writes it
    (``{"$obj": [[key, value]]}``). Walks with a stack of its own, so a value
    nested thousands deep is refused, not a RecursionError. (Other values
    JSON has no form for are left to the encoder.)"""
    if not isinstance(value, _CONTAINERS):
        return
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            _check_keys(item)
            escaped = escapes and len(item) == 1 and next(iter(item)).startswith("$")
            depth += 3 if escaped else 1
            children: Any = item.values()
        else:
            depth += 1
            children = item
        if depth > max_depth:
            raise ValidationError(
                f"JSON value nested more than {max_depth} levels of arrays and objects deep, "
                "the most that is stored here (see the README's Types)"
            )
        stack.extend((child, depth) for child in children if isinstance(child, _CONTAINERS))


def _check_keys(item: dict[Any, Any]) -> None:
    for key in item:
        if not isinstance(key, str):
            raise ValidationError(
                f"JSON object keys must be str, got {type(key).__name__} {brief(key, 40)}: it "
                "would be stored as a string and not read back as written"
            )
