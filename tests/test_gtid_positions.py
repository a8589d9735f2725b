"""The GTID positions of MariaDB and MySQL read replicas
(aiofragno/dialects/gtid.py): what covers what, merging, and the server's
spelling back — the replicas themselves are in
tests/conformance/test_read_replicas.py."""

from __future__ import annotations

import pytest

import aiofragno as af
from aiofragno.dialects.gtid import DomainPosition, GtidSet

A = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
B = "4f22ab58-82db-22f2-af44-d91bb0530673"


def test_mariadb_positions_compare_seqnos_per_domain() -> None:
    primary = DomainPosition.parse("0-1-100,1-2-7")
    assert DomainPosition.parse("0-1-100,1-2-7,2-3-1").covers(primary)
    # (The server id does not matter: after a failover, the same domain goes on.)
    assert DomainPosition.parse("1-2-9,0-5-101").covers(primary)
    assert not DomainPosition.parse("0-1-100").covers(primary)  # (domain 1 missing)
    assert not DomainPosition.parse("0-1-99,1-2-7").covers(primary)
    assert DomainPosition.parse("").covers(DomainPosition.parse(""))
    assert DomainPosition.parse("0-1-1").covers(DomainPosition.parse(""))
    assert not DomainPosition.parse("").covers(DomainPosition.parse("0-1-1"))


def test_mariadb_positions_only_rise_when_merged() -> None:
    merged = DomainPosition.parse("0-1-100,1-2-7").merged(DomainPosition.parse("0-2-99,2-3-4"))
    assert str(merged) == "0-1-100,1-2-7,2-3-4"
    assert merged.merged(DomainPosition.parse("0-2-101")) == DomainPosition.parse(
        "0-2-101,1-2-7,2-3-4"
    )
    assert str(DomainPosition.parse(" 0-1-5,\n1-1-6 ")) == "0-1-5,1-1-6"


def test_mysql_gtid_sets_compare_as_sets() -> None:
    executed = GtidSet.parse(f"{A.upper()}:1-5:7-9,\n{B}:1-3")
    assert executed.covers(GtidSet.parse(f"{A}:2-4:8"))
    assert executed.covers(GtidSet.parse(f"{B}:3,{A}:9"))
    assert not executed.covers(GtidSet.parse(f"{A}:6"))  # (a gap)
    assert not executed.covers(GtidSet.parse(f"{A}:5-7"))
    assert not executed.covers(GtidSet.parse(f"{B}:4"))
    assert executed.covers(GtidSet.parse(""))
    assert not GtidSet.parse("").covers(executed)
    # MySQL 8.3+ tags: a tagged GTID is another source's.
    tagged = GtidSet.parse(f"{A}:1-3:batch:1-2")
    assert tagged.covers(GtidSet.parse(f"{A}:batch:2"))
    assert not tagged.covers(GtidSet.parse(f"{A}:batch:3"))
    assert not GtidSet.parse(f"{A}:1-3").covers(GtidSet.parse(f"{A}:batch:1"))


def test_mysql_gtid_sets_merge_as_unions() -> None:
    merged = GtidSet.parse(f"{A}:1-5:9").merged(GtidSet.parse(f"{A}:6-7,{B}:2:1"))
    assert str(merged) == f"{A}:1-7:9,{B}:1-2"
    assert str(GtidSet.parse(f"{A}:1-3:batch:1-2:4")) == f"{A}:1-3:batch:1-2:4"


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (DomainPosition.parse, "0-1"),
        (DomainPosition.parse, "a-b-c"),
        (GtidSet.parse, f"{A}:1-x"),
        (DomainPosition.parse, 7),
    ],
)
def test_what_is_not_a_position_is_refused(parse: object, text: object) -> None:
    with pytest.raises(af.DataError):
        parse(text)  # type: ignore[operator]
