"""Compiling af.sql fragments for each dialect (no database needed)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

import aiofragno as af
from aiofragno.dialects import mysql, postgresql, sqlite

PG = postgresql.create_compiler()
LITE = sqlite.create_compiler()
MY = mysql.create_compiler()


def test_values_become_placeholders_per_dialect() -> None:
    q = af.sql("SELECT * FROM t WHERE a = {a} AND b = {b} OR a = {a}", a=1, b="x")
    assert PG.compile(q) == ("SELECT * FROM t WHERE a = $1 AND b = $2 OR a = $3", (1, "x", 1))
    assert LITE.compile(q) == ("SELECT * FROM t WHERE a = ? AND b = ? OR a = ?", (1, "x", 1))
    assert MY.compile(q) == ("SELECT * FROM t WHERE a = %s AND b = %s OR a = %s", (1, "x", 1))


def test_shifting_placeholders_for_a_combined_statement() -> None:
    q = af.sql("UPDATE t SET a = {a}, b = {b} WHERE c = {c}", a=1, b=2, c=3)
    sql = PG.compile(q).sql
    assert PG.shift_placeholders(sql, 0) == sql
    # $1 -> $10 and $10-style numbers are shifted whole, not digit by digit.
    assert PG.shift_placeholders(sql, 9) == "UPDATE t SET a = $10, b = $11 WHERE c = $12"
    assert PG.shift_placeholders("x = $10 AND y = $1", 5) == "x = $15 AND y = $6"
    for positional in (LITE, MY):
        sql = positional.compile(q).sql
        assert positional.shift_placeholders(sql, 9) == sql


def test_renumbering_leaves_dollars_in_names_and_literals_alone() -> None:
    """A name (from a custom naming strategy, say) or a literal holding $n is
    text: joining statements renumbers only the placeholders."""
    q = af.sql(
        "INSERT INTO {t} ({c}) VALUES ({v}, '$1', 'it''s $2')",
        t=af.Identifier("s$1", 't$1"$2'),
        c=af.Identifier("$3"),
        v=1,
    )
    sql = PG.compile(q).sql
    assert sql == 'INSERT INTO "s$1"."t$1""$2" ("$3") VALUES ($1, \'$1\', \'it\'\'s $2\')'
    assert PG.shift_placeholders(sql, 4) == sql.replace("VALUES ($1,", "VALUES ($5,")


# Text MySQL's driver would take for formatting directives, or other
# dialects for placeholders or quotes.
HOSTILE = ["rate_%", "rate_%%", "x%s", "%(a)s", "100%", "$1", "?", ":a", "it's", "a\\b", '"`']


@pytest.mark.parametrize("text", HOSTILE)
def test_names_and_literals_reach_the_driver_as_written(text: str) -> None:
    """What the driver receives — on MySQL the text after asyncmy's ``%``
    formatting, with or without parameters — is exactly the name and literal
    given, and the placeholders are the compiler's own."""
    literal = text.replace("'", "''")
    q = af.sql(f"SELECT {{v}}, '{literal}' FROM {{t}}", v=text, t=af.Identifier(text))
    quoted = text.replace("`", "``")
    my = MY.compile(q)
    assert my.sql % ("?",) == f"SELECT ?, '{literal}' FROM `{quoted}`"
    assert my.parameters == (text,)
    bare = MY.compile(af.sql(f"SELECT '{literal}' FROM {{t}}", t=af.Identifier(text)))
    assert bare.sql % () == f"SELECT '{literal}' FROM `{quoted}`"
    quoted = text.replace('"', '""')
    assert PG.compile(q).sql == f"SELECT $1, '{literal}' FROM \"{quoted}\""
    assert LITE.compile(q).sql == f"SELECT ?, '{literal}' FROM \"{quoted}\""


def test_escape_text_per_dialect() -> None:
    assert MY.escape_text("'100%' %s") == "'100%%' %%s"
    for compiler in (PG, LITE):
        assert compiler.escape_text("'100%' %s $1 ?") == "'100%' %s $1 ?"


def test_injection_in_values_stays_a_parameter() -> None:
    evil = "x'; DROP TABLE users; --"
    compiled = PG.compile(af.sql("SELECT {v}", v=evil))
    assert compiled.sql == "SELECT $1"
    assert compiled.parameters == (evil,)


def test_identifiers_are_quoted_and_quotes_doubled() -> None:
    q = af.sql("SELECT {c} FROM {t}", c=af.Identifier('we"ird'), t=af.Identifier("s", "t`x"))
    assert PG.compile(q).sql == 'SELECT "we""ird" FROM "s"."t`x"'
    assert MY.compile(q).sql == 'SELECT `we"ird` FROM `s`.`t``x`'


@pytest.mark.parametrize(
    ("name", "message"),
    [("", "empty identifier"), ("a\x00b", "NUL byte"), ("x" * 64, "longer than 63 bytes")],
)
def test_bad_identifiers_are_rejected(name: str, message: str) -> None:
    with pytest.raises(af.ValidationError, match=message):
        PG.compile(af.sql("SELECT * FROM {t}", t=af.Identifier(name)))


def test_identifier_limit_counts_bytes() -> None:
    # 32 two-byte characters = 64 bytes: over PostgreSQL's 63.
    with pytest.raises(af.ValidationError, match="longer than"):
        PG.compile(af.sql("SELECT {c}", c=af.Identifier("é" * 32)))
    assert MY.compile(af.sql("SELECT {c}", c=af.Identifier("é" * 32))).sql == f"SELECT `{'é' * 32}`"


def test_identifier_parts_must_be_strings() -> None:
    with pytest.raises(af.ValidationError, match="must be str"):
        af.Identifier(1)  # type: ignore[arg-type]


def test_nested_fragments_number_parameters_in_order() -> None:
    where = af.sql("a = {a} AND b = {b}", a=1, b=2)
    q = af.sql("SELECT {x} FROM t WHERE {where} AND c = {c}", x=0, where=where, c=3)
    assert PG.compile(q) == ("SELECT $1 FROM t WHERE a = $2 AND b = $3 AND c = $4", (0, 1, 2, 3))


def test_join_and_concatenation() -> None:
    parts = [af.sql("a = {v}", v=1), af.sql("b = {v}", v=2)]
    q = af.sql("SELECT 1 WHERE ") + af.Fragment.join(parts, " AND ")
    assert LITE.compile(q) == ("SELECT 1 WHERE a = ? AND b = ?", (1, 2))


def test_in_list_expands_or_uses_an_array() -> None:
    q = af.sql("SELECT * FROM t WHERE id IN {ids} AND x NOT IN {xs}", ids=[1, 2, 3], xs=("a",))
    assert PG.compile(q) == (
        "SELECT * FROM t WHERE id = ANY($1) AND x <> ALL($2)",
        ([1, 2, 3], ["a"]),
    )
    assert LITE.compile(q) == (
        "SELECT * FROM t WHERE id IN (?, ?, ?) AND x NOT IN (?)",
        (1, 2, 3, "a"),
    )


def test_empty_in_list() -> None:
    q = af.sql("SELECT * FROM t WHERE id in {ids}", ids=[])
    assert LITE.compile(q).sql == "SELECT * FROM t WHERE id IN (SELECT NULL WHERE 0)"
    assert MY.compile(q).sql == "SELECT * FROM t WHERE id IN (SELECT NULL FROM DUAL WHERE 1=0)"
    assert PG.compile(q) == ("SELECT * FROM t WHERE id = ANY($1)", ([],))


def test_in_list_with_parentheses_is_explained() -> None:
    with pytest.raises(af.ValidationError, match="without parentheses"):
        af.sql("SELECT 1 WHERE a IN ({xs})", xs=[1])


def test_list_elsewhere_is_one_value() -> None:
    assert PG.compile(af.sql("SELECT {tags}", tags=["a", "b"])) == ("SELECT $1", (["a", "b"],))


def test_word_ending_in_in_is_not_the_in_operator() -> None:
    q = af.sql("SELECT * FROM t WHERE login {v}", v=[1])
    assert PG.compile(q).parameters == ([1],)


def test_braces_escape_and_percent_on_mysql() -> None:
    q = af.sql("SELECT '{{\"a\": 1}}', 'x%' LIKE {p}", p="x%")
    assert PG.compile(q).sql == "SELECT '{\"a\": 1}', 'x%' LIKE $1"
    # asyncmy formats with %, so literal % is doubled.
    assert MY.compile(q).sql == "SELECT '{\"a\": 1}', 'x%%' LIKE %s"


@pytest.mark.parametrize(
    ("template", "params", "message"),
    [
        ("SELECT {a}", {}, "no such parameter"),
        ("SELECT 1", {"a": 1}, "not used"),
        ("SELECT {}", {}, "bad placeholder"),
        ("SELECT {0}", {}, "bad placeholder"),
        ("SELECT {a.b}", {"a": 1}, "bad placeholder"),
        ("SELECT {a!r}", {"a": 1}, "bad placeholder"),
        ("SELECT {a:>5}", {"a": 1}, "bad placeholder"),
        ("SELECT {a", {"a": 1}, "bad sql template"),
        ("SELECT a}", {}, "bad sql template"),
    ],
)
def test_template_errors(template: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(af.ValidationError, match=message):
        af.sql(template, **params)


def test_plain_strings_are_refused() -> None:
    with pytest.raises(af.ValidationError, match=r"af\.sql"):
        PG.compile("SELECT 1")


def test_value_encoding_per_dialect() -> None:
    aware = dt.datetime(2024, 2, 29, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    q = af.sql(
        "SELECT {d}, {ts}, {j}, {k}", d=Decimal("1.10"), ts=aware, j={"a": 1}, k=af.Json([1])
    )
    assert LITE.compile(q).parameters == ("1.10", "2024-02-29T21:30:00+00:00", '{"a":1}', "[1]")
    assert MY.compile(q).parameters == (
        Decimal("1.10"),
        dt.datetime(2024, 2, 29, 21, 30),
        '{"a":1}',
        "[1]",
    )


def test_nul_in_postgres_text_is_refused_before_sending() -> None:
    with pytest.raises(af.ValidationError, match="NUL"):
        PG.compile(af.sql("SELECT {v}", v="a\x00b"))
    assert LITE.compile(af.sql("SELECT {v}", v="a\x00b")).parameters == ("a\x00b",)


def test_json_must_be_serialisable() -> None:
    with pytest.raises(af.ValidationError, match="not a JSON document"):
        PG.compile(af.sql("SELECT {v}", v={"x": object()}))
