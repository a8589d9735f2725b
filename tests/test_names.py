"""Names, without a database: validation leaves no way around it (a final
newline)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import aiofragno as af
from aiofragno.outbox.versionstamp import check_versionstamp

# A name followed by "\n": Python's "$" matches before a final newline.
NEWLINE_NAMES: dict[str, Callable[[], Any]] = {
    "schema": lambda: af.Schema("shop\n"),
    "table": lambda: af.Table("accounts\n"),
    "column": lambda: af.Column("owner\n", "string"),
    "index": lambda: af.Index("by_owner\n", ["owner"]),
    "reference": lambda: af.Reference("src\n", "accounts"),
    "referenced table": lambda: af.Reference("src", "accounts\n"),
}


@pytest.mark.parametrize("what", NEWLINE_NAMES)
def test_a_name_ending_in_a_newline_is_refused(what: str) -> None:
    with pytest.raises(af.SchemaError, match="bad"):
        NEWLINE_NAMES[what]()


def test_a_versionstamp_ending_in_a_newline_is_refused() -> None:
    stamp = "0" * 24
    assert check_versionstamp(stamp) == stamp
    with pytest.raises(af.ValidationError, match="24 lowercase hex digits"):
        check_versionstamp(stamp + "\n")
