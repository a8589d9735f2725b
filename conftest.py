"""The code examples of README.md and docs/ run as tests: see tests/doc_examples.py."""

from tests.doc_examples import pytest_collect_file

__all__ = ["pytest_collect_file"]
