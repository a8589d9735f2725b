"""The docs' example harness (tests/doc_examples.py) fails when it should,
and the docs cover what they must."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sybil.example import SybilFailure

import aiofragno
import aiofragno.errors
from tests.doc_examples import ROOT, setup, stated_output, sybil, teardown


def run_page(tmp_path: Path, text: str) -> None:
    """Run every example of a Markdown page as the suite does, in order."""
    page = tmp_path / "page.md"
    page.write_text(text)
    document = sybil.parse(page)
    setup(document.namespace)
    try:
        for example in document.examples():
            example.evaluate()
    finally:
        teardown(document.namespace)


def block(source: str, info: str = "python") -> str:
    return f"```{info}\n{source}\n```\n\n"


def test_stated_output_is_the_hash_arrow_lines() -> None:
    assert stated_output('print("a")\n#> a\nx = 1  # not output\n  #>\n') == ["a", ""]


def test_examples_share_a_namespace_a_loop_and_db(tmp_path: Path) -> None:
    run_page(
        tmp_path,
        block('import aiofragno as af\nq = af.sql("SELECT {v}", v=41)')
        + block("print(await db.fetch_value(q, int) + 1)\n#> 42"),
    )


def test_wrong_stated_output_fails(tmp_path: Path) -> None:
    with pytest.raises(SybilFailure, match=r"stated:  \['3'\]\nprinted: \['2'\]"):
        run_page(tmp_path, block("print(1 + 1)\n#> 3"))


def test_output_not_stated_fails(tmp_path: Path) -> None:
    with pytest.raises(SybilFailure, match="printed"):
        run_page(tmp_path, block('print("surprise")'))


def test_an_example_that_raises_fails(tmp_path: Path) -> None:
    with pytest.raises(aiofragno.ValidationError):
        run_page(tmp_path, block('await db.fetch("SELECT 1")'))


def test_skip_directive_skips_only_the_next_block(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError):
        run_page(tmp_path, "<!-- skip: next -->\n" + block("1 / 0") + block("1 / 0"))


def test_a_failing_project_test_fails(tmp_path: Path) -> None:
    with pytest.raises(SybilFailure, match="1 failed"):
        run_page(
            tmp_path,
            block("X = 1", 'python title="pkg/values.py"')
            + block(
                "from pkg.values import X\n\ndef test_x():\n    assert X == 2",
                'python title="test_values.py"',
            ),
        )


def test_a_passing_project_test_passes(tmp_path: Path) -> None:
    run_page(
        tmp_path,
        block("X = 1", 'python title="pkg/values.py"')
        + block("X = 2", 'python title="pkg/values.py"')  # shown in parts: appended
        + block(
            "from pkg.values import X\n\ndef test_x():\n    assert X == 2",
            'python title="test_values.py"',
        ),
    )


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = (ROOT / "docs" / "reference" / "index.md").read_text()
    documented = set(re.findall(r"^::: aiofragno\.(\w+)$", reference, re.MULTILINE))
    in_errors_page = set(vars(aiofragno.errors))  # ::: aiofragno.errors renders them all
    missing = [n for n in aiofragno.__all__ if n not in documented and n not in in_errors_page]
    assert not missing, f"add these to docs/reference/index.md: {missing}"


def test_readme_stays_a_front_door() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < 15_000, f"README.md is {size} bytes: move detail into docs/"


def test_readme_links_point_at_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert targets
    assert [t for t in targets if not (ROOT / t).exists()] == []
