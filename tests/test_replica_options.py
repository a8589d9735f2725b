"""af.connect's replica keywords: refused, before anything is opened, when
they cannot mean what they say (the replicas themselves are in
tests/conformance/test_read_replicas.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import aiofragno as af

pytestmark = pytest.mark.anyio

PG = "postgresql://postgres@127.0.0.1:1/none"


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"replicas": PG}, "a list of URLs"),
        ({"replicas": [PG], "replica_url": PG}, "not both"),
        ({"replicas": [7]}, "must be a str"),
        ({"replicas": [PG], "max_replica_lag": -1}, "max_replica_lag"),
        ({"replicas": [PG], "max_replica_lag": float("nan")}, "max_replica_lag"),
        ({"replicas": [PG], "replica_wait": float("inf")}, "replica_wait"),
        ({"replicas": [PG], "replica_wait": True}, "replica_wait"),
        ({"max_replica_lag": 1.0}, "needs replicas"),
    ],
)
def test_bad_replica_keywords_are_refused(keywords: dict[str, object], message: str) -> None:
    with pytest.raises(af.ValidationError, match=message):
        af.connect(PG, **keywords)  # type: ignore[arg-type]


async def test_replicas_need_postgresql(tmp_path: Path) -> None:
    primary = f"sqlite:///{tmp_path}/primary.db"
    with pytest.raises(af.ValidationError, match="need PostgreSQL"):
        await af.connect(primary, replica_url=f"sqlite:///{tmp_path}/copy.db")
    with pytest.raises(af.ValidationError, match="replicas are copies of the primary"):
        await af.connect(PG, replicas=["mysql://root@127.0.0.1:1/none"])


async def test_without_replicas_db_replica_reads_on_the_database(tmp_path: Path) -> None:
    async with af.connect(f"sqlite:///{tmp_path}/app.db", replicas=[]) as db:
        assert await db.replica.fetch_value(af.sql("SELECT 41 + 1"), int) == 42
        with pytest.raises(af.ValidationError, match="reads only"):
            await db.replica.execute(af.sql("CREATE TABLE t (x int)"))
        assert db.stats.replica_reads == db.stats.replica_fallbacks == 0
