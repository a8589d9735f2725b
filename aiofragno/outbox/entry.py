"""Outbox entries as readers see them."""

from __future__ import annotations

from collections.abc import Sequence
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

    def to_json(self) -> str:
        """The entry as one line of JSON with type tags (what ``aiofragno outbox
        tail`` prints and the relay publishes): ``tagged_json.loads`` gives back
        its fields exactly."""
        return tagged_json.dumps(
            {
                "versionstamp": self.versionstamp,
                "uow_id": self.uow_id,
                "created_at": self.created_at,
                "payload": self.payload,
                "ref_map": self.ref_map,
            }
        )


def entries_from_rows(rows: Sequence[Any], decode_timestamp: Decode | None) -> list[OutboxEntry]:
    """The entries of result rows (versionstamp, uow_id, payload, ref_map,
    created_at), their JSON decoded in one pass for the page."""
    columns = list(zip(*[row.raw for row in rows], strict=True)) or [()] * 5
    stamps, uow_ids, payloads, ref_maps, created = columns
    if decode_timestamp is not None:
        created = tuple(map(decode_timestamp, created))
    decoded = tagged_json.loads_many([*payloads, *ref_maps])
    return [
        OutboxEntry(*fields)
        for fields in zip(
            stamps,
            uow_ids,
            map(_stamped, decoded[: len(rows)], stamps),
            decoded[len(rows) :],
            created,
            strict=True,
        )
    ]


def _stamped(payload: dict[str, Any], stamp: str) -> dict[str, Any]:
    """``payload`` with each mutation's versionstamp: the entry's version and
    the mutation's index. Under the "ticks" strategy the payload is stored
    before its version is known (with a stand-in), so readers set it here;
    the counter's entries already hold these values."""
    version = stamp[:20]
    mutations = payload.get("mutations", ())
    if mutations and str(mutations[0].get("versionstamp", "")).startswith(version):
        return payload  # (stamped when written: the counter's; a tenth of a page's decoding)
    for index, mutation in enumerate(mutations):
        mutation["versionstamp"] = f"{version}{index:04x}"
    return payload
