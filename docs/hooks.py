"""MkDocs hooks (see mkdocs.yml): the docstrings' Sphinx roles as code.

aiofragno's docstrings name other objects the Sphinx way
(:class:`~aiofragno.errors.Error`); mkdocstrings renders the role's text as
it is. Show the name alone, as code, as Sphinx would.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):<code>(~?)([^<]+)</code>")


def _name(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    return ROLE.sub(_name, html)
