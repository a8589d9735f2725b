"""Keyset pagination in the unit of work: pages in order, stable under
inserts and through ties, with a where; ordering by a nullable column
refused; cursors that are malformed, truncated, tampered with or from another
query refused.

Every test runs against a real database in a namespace of its own, dropped
afterwards (the fixtures are in conftest.py, the helpers in uow_env.py)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

import aiofragno as af
from tests.conformance.uow_env import (
    Env,
)

pytestmark = pytest.mark.anyio


async def test_cursor_pagination(items: Env) -> None:
    await items.create("items", *({"name": f"n{i:02}", "qty": i} for i in range(10)))
    seen: list[str] = []
    cursors: list[str | None] = []
    after = None
    for _ in range(10):
        page = await items.find("items", order_by="qty", limit=4, after=after)
        assert isinstance(page, af.FindResult)
        assert len(page) <= 4
        seen.extend(row["name"] for row in page)
        cursors.append(page.cursor)
        if page.cursor is None:
            break
        assert isinstance(page.cursor, str)
        after = page.cursor
    assert seen == [f"n{i:02}" for i in range(10)]
    assert len(cursors) == 3 and cursors[-1] is None
    # Without limit there is no cursor; a last page that is exactly full has none.
    assert (await items.find("items")).cursor is None
    first = await items.find("items", order_by="qty", limit=5)
    second = await items.find("items", order_by="qty", limit=5, after=first.cursor)
    assert [r["qty"] for r in second] == [5, 6, 7, 8, 9]
    assert first.cursor is not None and second.cursor is None


async def test_keyset_pagination_stable_under_inserts(items: Env) -> None:
    originals = [
        {"name": f"o{i:02}", "qty": q} for i, q in enumerate([7, 3, 3, 9, 1, 3, 5, 5, 8, 2, 6, 3])
    ]
    await items.create("items", *originals)
    order = [("qty", "desc"), ("name", "asc")]

    def key(row: dict[str, Any]) -> tuple[int, str]:
        return (-row["qty"], row["name"])

    seen: list[dict[str, Any]] = []
    inserted_before: list[str] = []
    inserted_after: list[str] = []
    after = None
    for page_number in range(20):
        page = await items.find("items", order_by=order, limit=3, after=after)
        seen.extend(page)
        if page.cursor is None:
            break
        after = page.cursor
        last = page[-1]
        # Between pages: a row sorting before the cursor (never to be seen),
        # one sorting after it (to be seen), and one tied with the cursor row
        # on qty but before it by name (not to be seen).
        before_name, after_name, tied_name = (
            f"b{page_number:02}",
            f"z{page_number:02}",
            f"a{page_number:02}",
        )
        await items.create(
            "items",
            {"name": before_name, "qty": 100 + page_number},
            {"name": after_name, "qty": -1 - page_number},
            {"name": tied_name, "qty": last["qty"]},
        )
        inserted_before += [before_name, tied_name]
        inserted_after.append(after_name)
    else:
        pytest.fail("pagination did not end")

    names = [r["name"] for r in seen]
    assert len(names) == len(set(names)), "a row was returned twice"
    for original in originals:
        assert names.count(original["name"]) == 1, original
    assert not set(inserted_before) & set(names)
    assert set(inserted_after) <= set(names)
    assert [key(r) for r in seen] == sorted(key(r) for r in seen)


async def test_keyset_pagination_through_ties(items: Env) -> None:
    # Few distinct values: pages break inside runs of equal qty; creation
    # order (the internal id) breaks the ties, in the direction of the
    # order: oldest first ascending, newest first descending.
    qtys = [2, 1, 2, 2, 1, 3, 2, 1, 3, 2, 2]
    await items.create("items", *({"name": f"n{i:02}", "qty": q} for i, q in enumerate(qtys)))
    for direction, sign in (("asc", 1), ("desc", -1)):
        for limit in (1, 2, 3, 4):
            seen: list[str] = []
            after = None
            while True:
                page = await items.find(
                    "items", order_by=("qty", direction), limit=limit, after=after
                )
                seen.extend(r["name"] for r in page)
                if page.cursor is None:
                    break
                after = page.cursor
            expected = [
                f"n{i:02}"
                for i, _ in sorted(enumerate(qtys), key=lambda p: (sign * p[1], sign * p[0]))
            ]
            assert seen == expected, (direction, limit)


async def test_a_descending_cursor_from_before_ties_followed_the_order_is_refused(
    items: Env,
) -> None:
    # Such a cursor named its table and order only, and its ties ran oldest
    # first: read with today's newest-first ties, a page could repeat or
    # skip rows of equal qty. It is refused instead; ascending ones still work.
    await items.create("items", *({"name": f"n{i}", "qty": i % 2} for i in range(6)))
    physical = list(items.ident("items").parts)
    for direction, refused in (("desc", True), ("asc", False)):
        page = await items.find("items", order_by=("qty", direction), limit=2)
        assert page.cursor is not None
        order = [["qty", direction == "desc"]]
        old_key = hashlib.sha1(json.dumps([physical, order]).encode()).hexdigest()[:8]
        old = _tamper(page.cursor, lambda p, k=old_key: p.__setitem__("k", k))
        if refused:
            with pytest.raises(af.ValidationError, match="another order_by"):
                await items.find("items", order_by=("qty", direction), limit=2, after=old)
        else:
            rest = await items.find("items", order_by=("qty", direction), limit=2, after=old)
            assert [r["name"] for r in rest] == ["n4", "n1"]


async def test_keyset_pagination_with_where(items: Env) -> None:
    await items.create("items", *({"name": f"n{i:02}", "qty": i} for i in range(20)))
    seen: list[int] = []
    after = None
    while True:
        page = await items.find(
            "items", where=(af.c.qty >= 5) & (af.c.qty != 9), order_by="name", limit=4, after=after
        )
        seen.extend(r["qty"] for r in page)
        if page.cursor is None:
            break
        after = page.cursor
    assert seen == [q for q in range(5, 20) if q != 9]


async def test_pagination_by_nullable_column_is_refused(items: Env) -> None:
    """Keyset pages over a column with NULLs would lose rows: refused up front."""
    for direction in ("asc", "desc"):
        with pytest.raises(af.ValidationError, match=r"items\.tag may be NULL"):
            await items.find("items", order_by=("tag", direction), limit=2)
    # Without a limit there is nothing to page, so ordering by it is fine.
    await items.create("items", {"name": "x", "qty": 1, "tag": None})
    assert [r["name"] for r in await items.find("items", order_by="tag")] == ["x"]


MALFORMED_CURSORS = [
    "",
    "not a cursor!",
    "%%%%",
    base64.urlsafe_b64encode(b"[1, 2, 3]").decode(),
    base64.urlsafe_b64encode(b'{"k": "x"}').decode(),
    base64.urlsafe_b64encode(b"\xff\xfe\x00").decode(),
]


@pytest.mark.parametrize("cursor", MALFORMED_CURSORS, ids=range(len(MALFORMED_CURSORS)))
async def test_malformed_cursor(items: Env, cursor: str) -> None:
    with pytest.raises(af.ValidationError, match="cursor"):
        await items.find("items", order_by="qty", limit=2, after=cursor)


async def test_truncated_cursor(items: Env) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    page = await items.find("items", order_by="qty", limit=2)
    assert page.cursor is not None
    with pytest.raises(af.ValidationError, match="cursor"):
        await items.find(
            "items", order_by="qty", limit=2, after=page.cursor[: len(page.cursor) // 2]
        )


def _tamper(cursor: str, change: Callable[[dict[str, Any]], None]) -> str:
    payload = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    change(payload)
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")


TAMPERINGS: list[Any] = [
    pytest.param(lambda p: p.__setitem__("v", ["three", p["v"][1]]), id="wrong-value-type"),
    pytest.param(
        lambda p: p.__setitem__("v", []),
        id="too-few-values",
    ),
    pytest.param(
        lambda p: p.__setitem__("v", [{"$dec": "not a number"}, 1]),
        id="undecodable-tag",
    ),
]


@pytest.mark.parametrize("change", TAMPERINGS)
async def test_tampered_cursor(items: Env, change: Callable[[dict[str, Any]], None]) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    page = await items.find("items", order_by="qty", limit=2)
    assert page.cursor is not None
    with pytest.raises(af.ValidationError):
        await items.find("items", order_by="qty", limit=2, after=_tamper(page.cursor, change))


async def test_cursor_from_another_query(items: Env) -> None:
    await items.create("items", *({"name": f"n{i}", "qty": i} for i in range(5)))
    await items.create("others", *({"name": f"n{i}"} for i in range(5)))
    by_qty = await items.find("items", order_by="qty", limit=2)
    by_name = await items.find("items", order_by="name", limit=2)
    plain = await items.find("items", limit=2)
    assert by_qty.cursor and by_name.cursor and plain.cursor
    misuses = [
        ("items", {"order_by": "name"}, by_qty.cursor),
        ("items", {"order_by": ("qty", "desc")}, by_qty.cursor),
        ("items", {"order_by": ["qty", "name"]}, by_qty.cursor),
        ("items", {"order_by": "qty"}, by_name.cursor),
        ("items", {}, by_qty.cursor),
        ("items", {"order_by": "qty"}, plain.cursor),
        ("others", {}, plain.cursor),
        ("others", {"order_by": "name"}, by_name.cursor),
    ]
    for table, kwargs, cursor in misuses:
        with pytest.raises(af.ValidationError, match="cursor"):
            await items.find(table, limit=2, after=cursor, **kwargs)
    # The right query accepts it.
    rest = await items.find("items", order_by="qty", limit=2, after=by_qty.cursor)
    assert [r["qty"] for r in rest] == [2, 3]
