"""Compiling af.sql fragments for each dialect (no database needed)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

import aiofragno as af
from aiofragno.dialects import mysql, postgresql, sqlite
from aiofragno.sql import Unbound
from aiofragno.sqltext import SqlText

PG = postgresql.create_compiler()
LITE = sqlite.create_compiler()
MY = mysql.create_compiler()


def test_values_become_placeholders_per_dialect() -> None:
    q = af.sql("SELECT * FROM t WHERE a = {a} AND b = {b} OR a = {a}", a=1, b="x")
    assert PG.compile(q) == ("SELECT * FROM t WHERE a = $1 AND b = $2 OR a = $3", (1, "x", 1))
    assert LITE.compile(q) == ("SELECT * FROM t WHERE a = ? AND b = ? OR a = ?", (1, "x", 1))
    assert MY.compile(q) == ("SELECT * FROM t WHERE a = %s AND b = %s OR a = %s", (1, "x", 1))


def test_compiling_to_parts_leaves_placeholders_to_the_render() -> None:
    q = af.sql(
        "UPDATE {t} SET a = {a}, b = {b} WHERE c IN {c}", t=af.Identifier("t"), a=1, b=2, c=[3]
    )
    assert PG.compile_parts(q) == (
        SqlText(('UPDATE "t" SET a = ', ", b = ", " WHERE c = ANY(", ")")),
        (1, 2, [3]),
    )
    assert LITE.compile_parts(q) == (
        SqlText(('UPDATE "t" SET a = ', ", b = ", " WHERE c IN (", ")")),
        (1, 2, 3),
    )
    text, _ = MY.compile_parts(q)
    assert text.slots == 3 and MY.render(text) == "UPDATE `t` SET a = %s, b = %s WHERE c IN (%s)"


def test_joined_statements_are_numbered_once_when_rendered() -> None:
    """Combining is joining: each statement's slots keep their order, and the
    placeholders are written for the whole, $10 and beyond included."""
    first, one = PG.compile_parts(
        af.sql("UPDATE t SET a = {a}, b = {b} WHERE c = {c}", a=1, b=2, c=3)
    )
    second, two = PG.compile_parts(af.sql("SELECT {x}", x=4))
    parts = [f"q{i} AS (" + text + ")" for i, text in enumerate([first, second, first, second])]
    statement = "WITH " + SqlText.join(parts) + " SELECT 1"
    assert statement.slots == 8
    assert PG.render(statement) == (
        "WITH q0 AS (UPDATE t SET a = $1, b = $2 WHERE c = $3), q1 AS (SELECT $4), "
        "q2 AS (UPDATE t SET a = $5, b = $6 WHERE c = $7), q3 AS (SELECT $8) SELECT 1"
    )
    many = SqlText.join([first] * 4, " UNION ALL ")
    assert PG.render(many).endswith("a = $10, b = $11 WHERE c = $12")
    assert LITE.render(statement).count("?") == MY.render(statement).count("%s") == 8
    assert (*one, *two) == (1, 2, 3, 4)


def test_sql_text_joins_and_fills() -> None:
    slot = SqlText(("", ""))
    assert "a = " + slot + " AND b = " + slot == SqlText(("a = ", " AND b = ", ""))
    assert (slot + slot).slots == 2 and SqlText().slots == 0
    assert SqlText.join([]) == SqlText()
    assert SqlText.join(["x", slot, "y"], ";") == SqlText(("x;", ";y"))
    filled = SqlText.fill(
        "ARRAY(SELECT ROW({columns}) FROM {rest}) {{x}}",
        columns="a, b",
        rest="t WHERE id = " + slot,
    )
    assert filled == SqlText(("ARRAY(SELECT ROW(a, b) FROM t WHERE id = ", ") {x}"))
    assert len({SqlText(("a", "")), SqlText(("a", ""))}) == 1
    assert repr(slot) == "SqlText(('', ''))"
    with pytest.raises(ValueError, match="one piece"):
        SqlText(())


def test_unbound_parameters_are_left_for_each_use() -> None:
    """A statement compiled once keeps its per-use parameters unencoded (and
    unchecked) in slot order; fixed values are encoded when compiled."""
    stamp = Unbound("stamp")
    q = af.sql(
        "INSERT INTO t VALUES ({a}, {d}, {s}, {a})", a=stamp, d=Decimal("1.5"), s=Unbound("s")
    )
    assert LITE.compile_parts(q) == (
        SqlText(("INSERT INTO t VALUES (", ", ", ", ", ", ", ")")),
        (stamp, "1.5", Unbound("s"), stamp),
    )


@pytest.mark.parametrize("quoted", ["'$1'", "'?'", "'%s'", "'it''s $2 %s ?'", '"$1"', "`%s`"])
def test_joining_leaves_placeholder_text_in_quotes_alone(quoted: str) -> None:
    """A name (from a custom naming strategy, say) or a literal holding $1,
    ? or %s is text: joining statements looks at no text, and rendering
    writes placeholders only in the slots (on MySQL every % of the text is
    doubled, so that the driver's formatting gives it back as written)."""
    q = af.sql(f"SELECT {quoted}, {{v}} FROM {{t}}", v=1, t=af.Identifier(quoted))
    for compiler, quote, placeholders in (
        (PG, '"', ("$1", "$2")),
        (LITE, '"', ("?", "?")),
        (MY, "`", ("1", "2")),  # (after the driver's formatting, below)
    ):
        text, _ = compiler.compile_parts(q)
        rendered = compiler.render(text + " UNION ALL " + text)
        if compiler is MY:
            rendered %= placeholders
        name = quote + quoted.replace(quote, quote * 2) + quote
        row = f"SELECT {quoted}, {{}} FROM {name}"
        assert rendered == row.format(placeholders[0]) + " UNION ALL " + row.format(placeholders[1])


def test_renumbering_leaves_dollars_in_names_and_literals_alone() -> None:
    """A name (from a custom naming strategy, say) or a literal holding $n is
    text: joining statements numbers only the placeholders."""
    q = af.sql(
        "INSERT INTO {t} ({c}) VALUES ({v}, '$1', 'it''s $2')",
        t=af.Identifier("s$1", 't$1"$2'),
        c=af.Identifier("$3"),
        v=1,
    )
    sql = PG.compile(q).sql
    assert sql == 'INSERT INTO "s$1"."t$1""$2" ("$3") VALUES ($1, \'$1\', \'it\'\'s $2\')'
    before, _ = PG.compile_parts(af.sql("SELECT {a}, {b}, {c}, {d}", a=1, b=2, c=3, d=4))
    text, _ = PG.compile_parts(q)
    joined = PG.render(before + "; " + text)
    assert joined == "SELECT $1, $2, $3, $4; " + sql.replace("VALUES ($1,", "VALUES ($5,")


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


def test_a_template_compiled_again_gets_its_text_from_the_memo_and_fresh_values() -> None:
    """The text of a template is remembered per compiler and per spliced
    identifier or value-less fragment; values are bound (and checked) every
    time, and an IN list is the one given to af.sql, whatever happens to it later."""
    template = "SELECT {t}.a FROM {t} WHERE b = {b} AND c IN {c}"
    for compiler, placeholders in ((MY, ("%s",) * 3), (PG, ("$1", "= ANY($2)"))):
        for table, b in (("t1", "x"), ("t2", "y"), ("t1", 5)):
            ids = [1, 2]
            q = af.sql(template, t=af.Identifier(table), b=b, c=ids)
            ids.append(3)
            sql, params = compiler.compile(q)
            assert f"{table}" in sql and sql.count(table) == 2
            assert params == ((b, 1, 2) if compiler is MY else (b, [1, 2]))
        raw = af.sql("t_raw")  # (a value-less fragment: spliced as text)
        assert compiler.compile(af.sql("SELECT a FROM {t} WHERE b = {b}", t=raw, b=1))[0] == (
            f"SELECT a FROM t_raw WHERE b = {placeholders[0]}"
        )
    with pytest.raises(af.ValidationError, match="cannot bind"):
        MY.compile(af.sql("SELECT {v}", v=object()))
    MY.compile(af.sql("SELECT {v}", v=1))
    with pytest.raises(af.ValidationError, match="cannot bind"):
        MY.compile(af.sql("SELECT {v}", v=object()))


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


def test_the_memo_tells_apart_which_holes_hold_names_and_which_values() -> None:
    """A template's holes may hold an identifier (or a value-less fragment)
    in one call and a value in the next: each way compiles to its own text,
    not the text remembered for the other (which put the name where the
    value belongs, and the value where the name does)."""
    template = "SELECT {a} AS p, {b} AS q"
    raw = af.sql("1")
    for compiler, slot in ((PG, "$1"), (MY, "%s"), (LITE, "?")):
        for name in (af.Identifier("x"), raw):
            spliced = '"x"' if name == af.Identifier("x") else "1"
            spliced = spliced.replace('"', "`") if compiler is MY else spliced
            assert compiler.compile(af.sql(template, a=name, b=2)) == (
                f"SELECT {spliced} AS p, {slot} AS q",
                (2,),
            )
            assert compiler.compile(af.sql(template, a=2, b=name)) == (
                f"SELECT {slot} AS p, {spliced} AS q",
                (2,),
            )


def test_the_compilers_memos_stay_bounded_for_names_and_templates_made_at_run_time() -> None:
    """A name or a template per call (built from data, say) must not make a
    compiler's memos grow for as long as the process lives."""
    compiler = postgresql.create_compiler()
    for i in range(5000):
        name = f"c{i}"
        assert compiler.compile(af.sql(f"SELECT {{n}} AS x{i}", n=af.Identifier(name))) == (
            f'SELECT "{name}" AS x{i}',
            (),
        )
    assert len(compiler._quoted) <= 1024 and len(compiler._texts) <= 1024


def test_an_aware_time_is_refused_on_mysql_not_bound_without_its_offset() -> None:
    """MySQL's TIME keeps no zone, and the driver wrote an aware time's clock
    reading alone (01:02 at +05:00 bound as 01:02): refused, as a time column
    refuses it; a naive time binds as it is."""
    aware = dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    with pytest.raises(af.ValidationError, match="time zone"):
        MY.compile(af.sql("SELECT {t}", t=aware))
    with pytest.raises(af.ValidationError, match="time zone"):
        MY.compile(af.sql("SELECT 1 WHERE {t} IN {ts}", t=1, ts=[dt.time(1), aware]))
    assert MY.compile(af.sql("SELECT {t}", t=dt.time(1, 2))).parameters == (dt.time(1, 2),)
