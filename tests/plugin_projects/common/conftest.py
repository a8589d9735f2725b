"""Each test runs once per dialect, pointed at its server through
AIOFRAGNO_TEST_URL as users do; SQLite is the default (no URL)."""

import json
import os

import pytest
from notes import NOTES

import aiofragno as af

URLS: dict[str, str | None] = json.loads(os.environ["AF_DIALECT_URLS"])


@pytest.fixture(params=sorted(URLS), autouse=True)
def dialect(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    url = URLS[request.param]
    if url is None:
        monkeypatch.delenv("AIOFRAGNO_TEST_URL", raising=False)
    else:
        monkeypatch.setenv("AIOFRAGNO_TEST_URL", url)
    return str(request.param)


@pytest.fixture
def aiofragno_schema() -> af.Schema:
    return NOTES
