"""The helpers aiofragno.driver gives the core and the backends: the one
classification of a statement by its first word, and the deferred BEGIN's
state."""

from __future__ import annotations

import pytest

from aiofragno.driver import DeferredBegin, TextMemo, leading_keyword


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("SELECT 1", "select"),
        ("  \n\tselect(1)", "select"),
        ("Explain query plan SELECT 1", "explain"),
        ("INSERT\nINTO t VALUES (1)", "insert"),
        ("replace into t values (1)", "replace"),
        ("WITH x AS (SELECT 1) SELECT * FROM x", "with"),
        ("-- a comment\nSELECT 1", ""),
        ("/* a comment */ SELECT 1", ""),
        ("", ""),
    ],
)
def test_leading_keyword(sql: str, keyword: str) -> None:
    assert leading_keyword(sql) == keyword
    assert leading_keyword(sql) == keyword  # (remembered: the same answer)


def test_leading_keyword_of_a_long_statement() -> None:
    # Longer than what is remembered: classified all the same.
    sql = "update t set v = 1 where " + " or ".join(["id = 1"] * 1000)
    assert leading_keyword(sql) == "update"


def test_a_begin_is_held_until_taken() -> None:
    begin: DeferredBegin[str] = DeferredBegin()
    assert begin.take() is None
    begin.defer("BEGIN IMMEDIATE")
    assert begin.pending == "BEGIN IMMEDIATE"
    assert begin.take() == "BEGIN IMMEDIATE"
    # Sent with the first statement: COMMIT or ROLLBACK must go out.
    assert begin.take() is None
    assert begin.drop() is False


def test_a_begin_never_sent_ends_without_a_statement() -> None:
    begin: DeferredBegin[tuple[str, ...]] = DeferredBegin()
    begin.defer(("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "BEGIN"))
    assert begin.drop() is True  # nothing ran: nothing to commit or roll back
    assert begin.pending is None
    assert begin.take() is None


def test_a_text_memo_computes_once_and_stays_bounded() -> None:
    calls: list[str] = []

    def compute(text: str) -> int:
        calls.append(text)
        return len(text)

    memo = TextMemo(compute, max_size=3, max_length=5)
    assert [memo["ab"], memo["ab"], memo["abc"]] == [2, 2, 3]
    assert calls == ["ab", "abc"]
    assert memo["toolong"] == 7 and memo["toolong"] == 7  # computed each time, never kept
    assert calls.count("toolong") == 2 and "toolong" not in memo
    memo["x"], memo["y"]  # the fourth text starts the memo afresh
    assert len(memo) == 1 and "y" in memo
