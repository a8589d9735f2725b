"""Declared changes and plans without a database: what a declaration may
say about renames and drops, which type changes are lossless widenings, and
a plan file that was edited or is not a plan."""

from __future__ import annotations

import pytest

import aiofragno as af
from aiofragno.introspection import LiveColumn
from aiofragno.migration_plan import PlanAction
from aiofragno.schema_changes import widening


@pytest.mark.parametrize(
    "items",
    [
        (af.Column("a", "string", renamed_from="a"),),
        (af.Column("a", "string"), af.Column("b", "string", renamed_from="a")),
        (af.Column("b", "string", renamed_from="x"), af.Column("c", "string", renamed_from="X")),
        (af.Column("b", "string", renamed_from="x"), af.Dropped("x")),
        (af.Column("a", "string"), af.Dropped("a")),
        (af.Index("i", ["id"], renamed_from="j"), af.Index("j", ["id"])),
        # (The rows' ids stay: renamed, every row would get a new one.)
        (af.Column("a", "string", renamed_from="id"),),
        (af.Reference("a", "t", renamed_from="ID"),),
        (af.Dropped("id"),),  # (it would do nothing: the ids stay)
        (af.Dropped("Id"),),
    ],
)
def test_a_rename_or_drop_that_contradicts_the_declaration_is_refused(items: tuple[object]) -> None:
    with pytest.raises(af.SchemaError):
        af.Table("t", *items)  # type: ignore[arg-type]


def test_renames_and_drops_are_declared() -> None:
    table = af.Table(
        "t",
        af.Column("b", "bigint", renamed_from="a", backfill=0),
        af.Dropped("old"),
        af.Index("ix", ["b"], renamed_from="by_a"),
        af.Dropped("by_old", index=True),
    )
    assert table.columns["b"].renamed_from == "a" and table.columns["b"].backfill == 0
    assert list(table.dropped) == ["old"] and list(table.dropped_indexes) == ["by_old"]
    with pytest.raises(af.SchemaError, match="backfill"):
        af.Column("n", "integer", backfill="zero")


def _live(*types: str) -> LiveColumn:
    return LiveColumn("c", "x", types, nullable=False, default=None)


@pytest.mark.parametrize(
    ("stored", "declared", "change"),
    [
        (("integer",), af.Column("c", "bigint"), "widen_integer"),
        (("smallint",), af.Column("c", "integer"), "widen_integer"),
        (("bigint",), af.Column("c", "integer"), None),
        (("varchar(8)",), af.Column("c", af.varchar(9)), "widen_text"),
        (("varchar(8)",), af.Column("c", af.varchar(8)), None),
        (("varchar(9)",), af.Column("c", af.varchar(8)), None),
        (("varchar(300)",), af.Column("c", "string"), None),
        (("varchar(30)",), af.Column("c", "text"), "widen_text"),
        (("string", "varchar(255)"), af.Column("c", "text"), "widen_text"),
        (("integer",), af.Column("c", "string"), None),
        (("text",), af.Column("c", af.varchar(10)), None),
    ],
)
def test_only_lossless_widening_is_made_in_place(
    stored: tuple[str, ...], declared: af.Column, change: str | None
) -> None:
    assert widening(_live(*stored), declared) == change


def _plan() -> af.MigrationPlan:
    step = af.PlanStep("add column", "t", "c", (PlanAction('ALTER TABLE "t" ADD "c" int'),))
    return af.MigrationPlan("ns", 2, "state", (step,))


def test_a_plan_file_reads_back_and_an_edited_one_is_refused() -> None:
    plan = _plan()
    assert af.MigrationPlan.from_json(plan.to_json()) == plan
    edited = plan.to_json().replace('ADD \\"c\\" int', 'DROP \\"c\\"')
    assert edited != plan.to_json()
    with pytest.raises(af.MigrationError, match="edited after it was made"):
        af.MigrationPlan.from_json(edited)
    for junk in ("", "[]", '{"steps": 1}', "null"):
        with pytest.raises(af.MigrationError, match="not a migration plan"):
            af.MigrationPlan.from_json(junk)
    assert plan.text().splitlines()[1:] == [
        "-- step 1: add column t.c",
        'ALTER TABLE "t" ADD "c" int;',
    ]
