"""Versionstamps: a 10-byte big-endian commit version and a 2-byte big-endian
index within the commit, written as 24 lowercase hex digits, so that string
order is commit order. On PostgreSQL a version numbered on timeline T
(after T - 1 promotions) is above ``(T - 1) << 48`` (see
:attr:`~aiofragno.driver.SqlSnippets.outbox_version_floor`)."""

from __future__ import annotations

import re

from ..errors import ValidationError

_HEX24 = re.compile(r"[0-9a-f]{24}")  # (fullmatch: "$" would allow a final "\n")
MAX_VERSION = 2**80 - 1
MAX_INDEX = 2**16 - 1


def versionstamp(version: int, index: int = 0) -> str:
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"outbox version {version} does not fit in 10 bytes")
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(
            f"a unit can carry at most {MAX_INDEX + 1} outbox mutations, not {index + 1}"
        )
    return f"{version:020x}{index:04x}"


def check_versionstamp(value: object, what: str = "cursor") -> str:
    """``value`` if it is a versionstamp, else a ValidationError naming ``what``."""
    if not isinstance(value, str) or not _HEX24.fullmatch(value):
        raise ValidationError(f"malformed {what} {value!r:.40}: expected 24 lowercase hex digits")
    return value


def version_of(stamp: str) -> int:
    return int(stamp[:20], 16)
