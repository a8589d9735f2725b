"""Outbox entries as readers see them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .. import tagged_json
from ..codec import Decode


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One committed unit of work.

    ``versionstamp``: 24 hex digits; string order is commit order.
    ``payload``: ``{"version": 1, "mutations": [...]}``, values decoded exactly
    (datetimes, Decimals, bytes, big integers). ``ref_map``: "<i>.<column>" ->
    external id of the row mutation ``i`` references, or None.
    """

    versionstamp: str
    uow_id: str
    payload: dict[str, Any]
    ref_map: dict[str, str] | None
    created_at: datetime

    @property
    def mutations(self) -> list[dict[str, Any]]:
        mutations: list[dict[str, Any]] = self.payload["mutations"]
        return mutations


def entry_from_row(values: Any, decode_timestamp: Decode | None) -> OutboxEntry:
    stamp, uow_id, payload, ref_map, created = values
    if decode_timestamp is not None:
        created = decode_timestamp(created)
    return OutboxEntry(
        versionstamp=stamp,
        uow_id=uow_id,
        payload=tagged_json.loads(payload),
        ref_map=None if ref_map is None else tagged_json.loads(ref_map),
        created_at=created,
    )
