"""The filters beyond comparisons: case-insensitive prefixes (istarts_with),
not_in_ and NULLs, IN lists at and past a statement's parameter limit,
equality at a JSON path (typed exactly, keys never spliced into SQL), and
hostile input refused before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import Env, MakeEnv

pytestmark = pytest.mark.anyio

DOCS = af.Schema(
    "docs",
    af.Table(
        "docs",
        af.Column("name", "string"),
        af.Column("n", "bigint", default=0),
        af.Column("tag", "string", nullable=True),
        af.Column("meta", "json", nullable=True),
    ),
)


@pytest.fixture
async def docs(make_env: MakeEnv) -> Env:
    return await make_env(DOCS)


async def _names(env: Env, conditions: list[Any]) -> list[list[str]]:
    async def unit(uow: af.UnitOfWork) -> list[list[str]]:
        ops = [uow.find("docs", where=c) for c in conditions]
        await uow.retrieve()
        return [sorted(r["name"] for r in op.result) for op in ops]

    result: list[list[str]] = await env.run(unit)
    return result


async def test_istarts_with(docs: Env) -> None:
    names = ["Alpha", "alpha", "ALPHA", "beta", "50%_OFF", "50%off", "50_off", "A!b", "a!!b"]
    names += ["X\\y", "x\\\\y", "Äpfel", "äpfel", "ΣΟΦΙΑ", "Привет"]
    await docs.create("docs", *({"name": n} for n in names))
    prefixes = ["al", "AL", "50%_o", "50_", "a!", "a!!", "x\\", "Z", "σοφ", "пРИ", "äp"]
    found = await _names(docs, [af.c.name.istarts_with(p) for p in prefixes])
    got = dict(zip(prefixes, found, strict=True))
    ascii_folded = {
        p: sorted(n for n in names if n.lower().startswith(p.lower())) for p in prefixes[:-1]
    }
    assert {p: got[p] for p in prefixes[:-1]} == ascii_folded
    # Beyond ASCII too (on SQLite, whose LOWER folds ASCII only, through Python's).
    assert got["äp"] == ["Äpfel", "äpfel"]
    with pytest.raises(af.ValidationError, match="istarts_with"):
        await _names(docs, [af.c.n.istarts_with("1")])


async def test_not_in_and_nulls(docs: Env) -> None:
    await docs.create(
        "docs", {"name": "a", "tag": "x"}, {"name": "b", "tag": "y"}, {"name": "c", "tag": None}
    )
    got = await _names(
        docs,
        [
            af.c.tag.not_in_(["x"]),  # a NULL tag is neither in nor not in
            af.c.tag.not_in_([]),  # no values: every row
            af.c.tag != "x",  # as for not_in_
            af.c.tag.not_in_(["x"]) | af.c.tag.is_null(),
            af.c.name.not_in_(n for n in ("a", "b")),
        ],
    )
    assert got == [["b"], ["a", "b", "c"], ["b"], ["b", "c"], ["c"]]
    with pytest.raises(af.ValidationError, match="not a string"):
        af.c.tag.not_in_("xy")


async def test_in_lists_up_to_the_parameter_limit(docs: Env) -> None:
    await docs.create("docs", *({"name": f"d{i}", "n": i * 1000} for i in range(5)))
    limit = docs.catalog.adapter.capabilities.max_parameters

    async def counts(uow: af.UnitOfWork) -> list[int]:
        # Two reads of 20000 values each: too many for one statement together,
        # so PostgreSQL sends them apart instead of combined.
        ops = [
            uow.count("docs", where=af.c.n.in_(range(0, 40000, 2))),
            uow.count("docs", where=af.c.n.in_(range(1, 40000, 2))),
            uow.count("docs", where=af.c.name.in_([])),
        ]
        await uow.retrieve()
        return [op.result for op in ops]

    assert await docs.run(counts) == [5, 0, 0]

    async def too_many(uow: af.UnitOfWork) -> None:
        uow.find("docs", where=af.c.n.in_(range(limit + 1)))
        await uow.retrieve()

    with pytest.raises(af.ValidationError, match=r"binds \d+ values, more than one statement"):
        await docs.run(too_many)


DOCUMENTS: dict[str, Any] = {
    "str1": {"k": "1", "a.b": "dot", "it's": "quote", "n": {"k2": "deep"}, "arr": [10, "x"]},
    "int1": {"k": 1, "arr": [1]},
    "true": {"k": True, "x') OR 1=1 --": 5},
    "upper": {"k": "A", "": "empty key", "*": "star", "[0]": "brackets", "$": "dollar"},
    "null": None,
    "array": [1, 2],
    "huge": {"k": 2**70, "u": 'é\n"q"'},
}


async def test_json_path_equality(docs: Env) -> None:
    await docs.create("docs", *({"name": name, "meta": m} for name, m in DOCUMENTS.items()))
    meta = af.c.meta
    cases: list[tuple[Any, list[str]]] = [
        (meta["k"] == "1", ["str1"]),  # the string "1", not the number
        (meta["k"] == 1, ["int1"]),  # the number 1, not true or "1"
        (meta["k"] == True, ["true"]),  # noqa: E712
        (meta["k"] == "a", []),  # case matters
        (meta["k"] == 0, []),
        (meta["k"] == 2**70, ["huge"]),
        (meta["u"] == 'é\n"q"', ["huge"]),
        (meta["a.b"] == "dot", ["str1"]),  # a dot in a key, not a path step
        (meta["a"]["b"] == "dot", []),
        (meta["it's"] == "quote", ["str1"]),
        (meta["x') OR 1=1 --"] == 5, ["true"]),
        (meta[""] == "empty key", ["upper"]),
        (meta["*"] == "star", ["upper"]),  # path syntax in a key is just characters
        (meta["[0]"] == "brackets", ["upper"]),
        (meta["$"] == "dollar", ["upper"]),
        (meta["n"]["k2"] == "deep", ["str1"]),
        (meta["arr"][0] == 10, ["str1"]),
        (meta["arr"][1] == "x", ["str1"]),
        (meta["arr"][0] == 1, ["int1"]),
        (meta[0] == 1, ["array"]),
        (meta["missing"] == "x", []),
        (meta["arr"][5] == 1, []),
        (~(meta["k"] == "1"), ["huge", "int1", "true", "upper"]),  # (no path: no match)
        ((meta["k"] == 1) | (meta["k"] == "A"), ["int1", "upper"]),
    ]
    got = await _names(docs, [c for c, _ in cases])
    assert dict(enumerate(got)) == {i: expected for i, (_, expected) in enumerate(cases)}


async def test_hostile_input_is_refused(docs: Env) -> None:
    meta = af.c.meta
    at_the_call: list[tuple[Any, str]] = [
        (lambda: meta['say "hi"'], "double quote"),
        (lambda: meta["back\\slash"], "backslash"),
        (lambda: meta["nl\n"], "control character"),
        (lambda: meta[-1], "count from 0"),
        (lambda: meta[True], "a key"),
        (lambda: meta[1.5], "a key"),
        (lambda: meta["k"] == 1.0, "floats compare inexactly"),
        (lambda: meta["k"] == None, "str, int or bool"),  # noqa: E711
        (lambda: meta["k"] == {"a": 1}, "str, int or bool"),
        (lambda: meta["k"] != 1, "~"),
        (lambda: af.c.name.istarts_with(3), "takes a str"),
        (lambda: list(meta), "not iterable"),
        (lambda: meta["\ud800"], "lone surrogate"),
    ]
    for make, match in at_the_call:
        with pytest.raises((af.ValidationError, TypeError), match=match):
            make()
    at_retrieve: list[tuple[Any, str]] = [
        (af.c.name["k"] == "x", r"docs\.name is a string column"),
        (af.c.nope == 1, "nope"),
        (af.c.n == "1", r"docs\.n"),  # a string compared with an integer column
        (af.c.n.in_([1, "2"]), r"docs\.n"),
        (af.c.name == 1, r"docs\.name"),
        (af.c._id == 1, "internal"),
        # A prefix is checked as a value of its column is (not left to the driver).
        (af.c.name.starts_with("a\ud800"), "lone surrogate"),
        (af.c.name.istarts_with("\udc80"), "lone surrogate"),
    ]
    for condition, match in at_retrieve:
        with pytest.raises(af.ValidationError, match=match):
            await _names(docs, [condition])
    # NUL: refused by both where the database cannot store it, else no row.
    answers: list[Any] = []
    for condition in (af.c.name == "a\x00", af.c.name.starts_with("a\x00")):
        try:
            answers.append(await _names(docs, [condition]))
        except af.ValidationError as exc:
            answers.append(str(exc))
    assert answers[0] == answers[1]
