"""Runs the code examples of README.md and docs/*.md as tests, against SQLite.

Collected by the ``conftest.py`` at the repository's root (README.md and
docs/ are in ``testpaths``), so ``python -m pytest -q`` runs them. Sybil
finds the examples; it keeps one namespace per page and runs the page's
examples in order, so a later example uses what an earlier one defined.

Each page gets, before its first example:

* ``db``: an open Database on a fresh SQLite file (``sqlite:///app.db``);
* a temporary directory as the working directory, so relative SQLite URLs
  (``sqlite:///shop.db``) land there;
* one asyncio event loop (an ``asyncio.Runner``) that runs every example of
  the page, so a Database opened in one example is usable in the next.

What an example may be:

* ````python```` — runs as a module body; top-level ``await``, ``async
  with`` and ``async for`` are allowed (compiled with
  ``PyCF_ALLOW_TOP_LEVEL_AWAIT``). What it prints must be exactly what its
  ``#>`` comment lines state (none stated: it must print nothing). An
  exception fails the test.
* ````python title="path/name.py"```` — a file of a small project shown on
  the page (Material renders the title above the block). It is written to
  the page's project directory (appended to, when the page shows a file in
  parts); a file named ``test_*.py`` is then run with pytest in a
  subprocess, which must pass at least one test and fail none. Used by
  docs/testing.md for the pytest plugin's examples.

An example that cannot run here — it needs a PostgreSQL or MySQL server, or
files a reader has and we do not — is preceded by the HTML comment
``<!-- skip: next -->`` (Sybil's skip directive; invisible when the page is
rendered). Keep those few: every other example must run.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import PythonEvaluator, pad
from sybil.parsers.markdown import ClearNamespaceParser, CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

import aiofragno as af

ROOT = Path(__file__).resolve().parent.parent
STATED = re.compile(r"^\s*#>(?: (?P<text>.*))?$")


def stated_output(source: str) -> list[str]:
    """The lines an example says it prints: its ``#> ...`` comments, in order."""
    return [m["text"] or "" for line in source.splitlines() if (m := STATED.match(line))]


class AsyncPythonEvaluator(PythonEvaluator):
    """Sybil's Python evaluator with top-level await, run on the page's loop."""

    def __init__(self) -> None:
        super().__init__()
        self.flags |= ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

    def __call__(self, example: Example) -> str | None:
        __tracebackhide__ = True
        source = pad(example.parsed, example.line + example.parsed.line_offset)
        code = compile(source, example.path, "exec", flags=self.flags, dont_inherit=True)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = eval(code, example.namespace)
            if inspect.iscoroutine(result):
                example.namespace["_doc_runner"].run(result)
        example.namespace.pop("__builtins__", None)
        expected = stated_output(example.parsed)
        got = printed.getvalue().splitlines()
        if got != expected:
            return (
                "the example printed something other than its #> lines state\n"
                f"stated:  {expected!r}\nprinted: {got!r}"
            )
        return None


TITLED = re.compile(r'^python title="(?P<path>[\w./-]+)"$')


class ProjectFileParser:
    """````python title="..."```` blocks: files of a small project, tests run."""

    def __init__(self) -> None:
        self.lexer = FencedCodeBlockLexer(
            language=r".+", mapping={"language": "arguments", "source": "source"}
        )

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in self.lexer(document):
            match = TITLED.match(region.lexemes["arguments"])
            if match:
                region.parsed = (match["path"], str(region.lexemes["source"]))
                region.evaluator = self.evaluate
                yield region

    @staticmethod
    def evaluate(example: Example) -> str | None:
        relative, source = example.parsed
        project: Path = example.namespace["_doc_project"]
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(source + "\n")
        if not path.name.startswith("test_"):
            return None
        path = [str(project), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        env.pop("AIOFRAGNO_TEST_URL", None)
        # Only the plugins the examples use: loading every installed one
        # (hypothesis, OpenTelemetry's, ...) doubles the run's start-up.
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        plugins = ["pytest_asyncio.plugin", "anyio.pytest_plugin", "aiofragno.testing"]
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            + [arg for plugin in plugins for arg in ("-p", plugin)]
            + [relative],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        summary = run.stdout.strip().splitlines()[-1:] or [""]
        if run.returncode != 0 or " passed" not in summary[0]:
            return f"pytest {relative} in the page's project failed:\n{run.stdout}{run.stderr}"
        return None


async def open_database(url: str) -> af.Database:
    return await af.connect(url)


def setup(namespace: dict[str, Any]) -> None:
    """Before a page's first example: a temporary directory, a loop, ``db``."""
    directory = Path(tempfile.mkdtemp(prefix="aiofragno-docs-"))
    (directory / "project").mkdir()
    namespace["_doc_cwd"] = os.getcwd()
    namespace["_doc_directory"] = directory
    namespace["_doc_project"] = directory / "project"
    os.chdir(directory)
    runner = asyncio.Runner()
    namespace["_doc_runner"] = runner
    namespace["db"] = runner.run(open_database("sqlite:///app.db"))


def teardown(namespace: dict[str, Any]) -> None:
    """After a page's last example: close what it opened, remove its files."""
    runner: asyncio.Runner = namespace["_doc_runner"]
    try:
        for value in list(namespace.values()):
            if isinstance(value, af.Database):
                runner.run(value.close())
    finally:
        runner.close()
        os.chdir(namespace["_doc_cwd"])
        shutil.rmtree(namespace["_doc_directory"], ignore_errors=True)


sybil = Sybil(
    parsers=[
        CodeBlockParser(language="python", evaluator=AsyncPythonEvaluator()),
        ProjectFileParser(),
        SkipParser(),
        ClearNamespaceParser(),
    ],
    path=str(ROOT),
    patterns=["*.md"],
    setup=setup,
    teardown=teardown,
)
_collect = sybil.pytest()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """The README and the pages of docs/ (not other Markdown files pytest walks past)."""
    if file_path == ROOT / "README.md" or file_path.parent == ROOT / "docs":
        return _collect(file_path, parent)
    return None
