"""Replication positions of MariaDB and MySQL, as their GTIDs spell them
(the :class:`~aiofragno.driver.ReplayPosition` of read replicas).

* MariaDB: ``@@gtid_binlog_pos`` / ``@@gtid_slave_pos`` —
  ``domain-server-seqno`` per replication domain, comma-separated. Within a
  domain sequence numbers only rise (the GTID design; ``gtid_strict_mode``
  enforces it), so a replica has replayed a position once, in each of its
  domains, its seqno is at least as high — as ``MASTER_GTID_WAIT`` compares.
* MySQL: ``@@gtid_executed`` — a GTID *set*, ``source_uuid[:tag]:ranges``
  per source; a replica has replayed it once the set is a subset of its own
  (``GTID_SUBSET``), gaps included.

Both keep only what decides "covers"; ``str()`` spells the position back
as the server reads it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from ..errors import DataError


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode()
    if not isinstance(value, str):
        raise DataError(f"a GTID position is text, got {type(value).__name__}: {value!r}")
    return value


class DomainPosition:
    """A MariaDB GTID position: per domain, the last GTID
    ``(server_id, seqno)``."""

    __slots__ = ("last",)

    def __init__(self, last: Mapping[int, tuple[int, int]]) -> None:
        self.last = dict(last)

    @classmethod
    def parse(cls, value: object) -> DomainPosition:
        """``"0-1-100,1-2-7"`` (``""``: no transaction yet)."""
        last: dict[int, tuple[int, int]] = {}
        for gtid in _text(value).replace("\n", "").split(","):
            if not gtid.strip():
                continue
            try:
                domain, server, seqno = (int(part) for part in gtid.strip().split("-"))
            except ValueError:
                raise DataError(f"not a MariaDB GTID: {gtid!r} (in {value!r})") from None
            if domain not in last or last[domain][1] < seqno:
                last[domain] = (server, seqno)
        return cls(last)

    def covers(self, other: DomainPosition) -> bool:
        last = self.last
        return all(
            domain in last and last[domain][1] >= seqno for domain, (_, seqno) in other.last.items()
        )

    def merged(self, other: DomainPosition) -> DomainPosition:
        last = dict(self.last)
        for domain, gtid in other.last.items():
            if domain not in last or last[domain][1] < gtid[1]:
                last[domain] = gtid
        return DomainPosition(last)

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self.last.items()))

    def __repr__(self) -> str:
        return f"DomainPosition({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainPosition) and self.last == other.last

    __hash__ = None  # type: ignore[assignment]


# One source's transactions: sorted, disjoint, non-adjacent closed ranges.
Ranges = tuple[tuple[int, int], ...]


def _normalised(ranges: Iterable[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return tuple(out)


def _start(range_: tuple[int, int]) -> int:
    return range_[0]


def _contains(ranges: Ranges, start: int, end: int) -> bool:
    at = bisect.bisect_right(ranges, start, key=_start) - 1
    return at >= 0 and ranges[at][0] <= start and end <= ranges[at][1]


class GtidSet:
    """A MySQL GTID set: per source (its UUID, and the tag, if any, of
    MySQL 8.3+), the transactions executed."""

    __slots__ = ("sources",)

    def __init__(self, sources: Mapping[tuple[str, str], Ranges]) -> None:
        self.sources = dict(sources)

    @classmethod
    def parse(cls, value: object) -> GtidSet:
        """``"3e11fa47-...:1-5:11,4f2...:1-3"`` (``""``: the empty set)."""
        text = _text(value)
        sources: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for part in text.replace("\n", "").split(","):
            if not part.strip():
                continue
            uuid, *rest = part.strip().split(":")
            tag = ""
            for item in rest:
                if not item[:1].isdigit():
                    tag = item.lower()
                    continue
                try:
                    first, _, last = item.partition("-")
                    start = int(first)
                    sources.setdefault((uuid.lower(), tag), []).append(
                        (start, int(last) if last else start)
                    )
                except ValueError:
                    raise DataError(f"not a MySQL GTID set: {part!r} (in {text!r})") from None
        return cls({key: _normalised(ranges) for key, ranges in sources.items()})

    def covers(self, other: GtidSet) -> bool:
        return all(
            all(_contains(self.sources.get(key, ()), start, end) for start, end in ranges)
            for key, ranges in other.sources.items()
        )

    def merged(self, other: GtidSet) -> GtidSet:
        sources = dict(self.sources)
        for key, ranges in other.sources.items():
            sources[key] = _normalised((*sources.get(key, ()), *ranges))
        return GtidSet(sources)

    def __str__(self) -> str:
        by_uuid: dict[str, list[str]] = {}
        for (uuid, tag), ranges in sorted(self.sources.items()):
            spelled = [f"{a}-{b}" if a != b else str(a) for a, b in ranges]
            by_uuid.setdefault(uuid, []).extend([tag, *spelled] if tag else spelled)
        return ",".join(":".join([uuid, *items]) for uuid, items in by_uuid.items())

    def __repr__(self) -> str:
        return f"GtidSet({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GtidSet) and self.sources == other.sources

    __hash__ = None  # type: ignore[assignment]
