"""SQL text whose placeholders are not written yet: text pieces with one
parameter slot between each two.

Statements are built, cached and combined in this form, and a dialect's
compiler writes the placeholders once, for the final statement
(:meth:`~aiofragno.sql.SqlCompiler.render`: ``$1``, ``$2``, ... or ``?`` or
``%s``). So combining statements is joining their texts: no placeholder is
renumbered, and nothing looks inside the text — a ``$1`` in a quoted name or
a string literal is text like any other. The parameters travel beside the
text, in slot order.
"""

from __future__ import annotations

import string
from collections.abc import Iterable


class SqlText:
    """``pieces[0] <parameter 1> pieces[1] ... <parameter n> pieces[n]``: SQL
    as written (names quoted, nothing escaped for a driver), with ``n``
    unnumbered parameter slots. Immutable; ``+`` joins it with another
    SqlText or with plain SQL text (no slots)."""

    __slots__ = ("pieces",)

    def __init__(self, pieces: tuple[str, ...] = ("",)) -> None:
        if not pieces:
            raise ValueError("an SqlText has at least one piece")
        self.pieces = pieces

    @property
    def slots(self) -> int:
        """How many parameters the text takes."""
        return len(self.pieces) - 1

    def __add__(self, other: SqlText | str) -> SqlText:
        pieces = self.pieces
        if isinstance(other, str):
            return SqlText((*pieces[:-1], pieces[-1] + other))
        if isinstance(other, SqlText):
            return SqlText((*pieces[:-1], pieces[-1] + other.pieces[0], *other.pieces[1:]))
        return NotImplemented

    def __radd__(self, other: str) -> SqlText:
        if isinstance(other, str):
            return SqlText((other + self.pieces[0], *self.pieces[1:]))
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SqlText) and other.pieces == self.pieces

    def __hash__(self) -> int:
        return hash(self.pieces)

    def __repr__(self) -> str:
        return f"SqlText({self.pieces!r})"

    @staticmethod
    def join(texts: Iterable[SqlText | str], separator: str = ", ") -> SqlText:
        """``texts`` one after the other, ``separator`` (plain SQL text) between them."""
        writer = SqlTextWriter()
        for i, text in enumerate(texts):
            if i:
                writer.text(separator)
            writer.add(text)
        return writer.done()

    @staticmethod
    def fill(template: str, /, **values: SqlText | str) -> SqlText:
        """``template`` (plain SQL text with ``{name}`` holes, ``{{`` and
        ``}}`` for braces: a dialect's snippet) with each hole filled by its
        value, an SqlText or plain SQL text."""
        writer = SqlTextWriter()
        for literal, name, _, _ in string.Formatter().parse(template):
            writer.text(literal)
            if name is not None:
                writer.add(values[name])
        return writer.done()


class SqlTextWriter:
    """Writes an :class:`SqlText` from left to right."""

    __slots__ = ("_open", "_pieces")

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._open: list[str] = []  # the text of the piece being written

    def text(self, sql: str) -> None:
        """Plain SQL text (never a placeholder, whatever it holds)."""
        self._open.append(sql)

    def slot(self) -> None:
        """One parameter's slot."""
        self._pieces.append("".join(self._open))
        self._open.clear()

    def add(self, text: SqlText | str) -> None:
        """Plain SQL text, or an SqlText with its slots."""
        if isinstance(text, str):
            self._open.append(text)
            return
        first, *rest = text.pieces
        self._open.append(first)
        for piece in rest:
            self.slot()
            self._open.append(piece)

    def done(self) -> SqlText:
        return SqlText((*self._pieces, "".join(self._open)))
