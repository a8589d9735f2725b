"""SQL fragments: ``af.sql(template, **params)``, ``af.Identifier``, ``af.Json``.

A template names its holes with ``{name}``; ``{{`` and ``}}`` stand for literal
braces. What fills a hole decides how it is compiled:

* a plain value becomes one bound parameter — never text in the SQL;
* an :class:`Identifier` is spliced, quoted for the dialect (quote characters
  inside the name are doubled, so a name can never end the quoting);
* a nested fragment is spliced with its own parameters;
* a list, tuple or (frozen)set right after ``IN`` or ``NOT IN`` is a list of
  values: write ``owner IN {names}`` and aiofragno supplies the parentheses.
  PostgreSQL receives one array parameter (``= ANY($1)`` / ``<> ALL($1)``), the
  others one placeholder per item; an empty list is handled (``IN`` matches
  nothing, ``NOT IN`` everything). Elsewhere a list is an ordinary value (a
  PostgreSQL array).

Fragments are compiled per dialect by :class:`SqlCompiler`: first to an
:class:`~aiofragno.sqltext.SqlText` (text pieces, a slot per parameter), which
statements are combined in, then rendered with the dialect's placeholders.
"""

from __future__ import annotations

import functools
import json
import re
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final
from uuid import UUID

from .driver import CompiledQuery
from .errors import ValidationError
from .json_check import MAX_DEPTH, check_json
from .sqltext import SqlText

_IN_SUFFIX: Final = re.compile(r"(?is)\b(not\s+)?in\s*\Z")
_IN_PAREN_SUFFIX: Final = re.compile(r"(?is)\bin\s*\(\s*\Z")
_LIST_TYPES: Final = (list, tuple, set, frozenset)


class Identifier:
    """A table, column or schema name, possibly qualified: ``Identifier("s", "t")``
    compiles to ``"s"."t"``. Names are checked when compiled (empty, NUL bytes,
    longer than the dialect allows -> :class:`ValidationError`)."""

    __slots__ = ("parts",)

    def __init__(self, *parts: str) -> None:
        if not parts:
            raise ValidationError("Identifier() needs at least one name")
        for part in parts:
            if not isinstance(part, str):
                raise ValidationError(f"identifier parts must be str, got {type(part).__name__}")
        self.parts = parts

    def __repr__(self) -> str:
        return f"Identifier({', '.join(map(repr, self.parts))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Identifier) and other.parts == self.parts

    def __hash__(self) -> int:
        return hash(self.parts)


class Json:
    """Marks a value to be sent as a JSON document (dicts are JSON already)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Json({self.value!r})"


def json_text(value: Any, max_depth: int = MAX_DEPTH, *, escapes: bool = False) -> str:
    """Compact JSON text for ``value``; a :class:`ValidationError` if it is not
    JSON-serialisable, has keys that are not str or nests deeper than
    ``max_depth`` (see :func:`check_json`), or holds text no database can
    store (:func:`unicode_text`)."""
    check_json(value, max_depth, escapes=escapes)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"value is not a JSON document: {exc}") from exc
    return unicode_text(text)


def unicode_text(value: str) -> str:
    """``value`` if it can be encoded as UTF-8, else a ValidationError: a lone
    surrogate (``"\\ud800"``, e.g. from decoding bytes with
    ``errors="surrogateescape"``) is no character any database stores."""
    if not value.isascii():  # (O(1): CPython knows an ASCII string's kind)
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise ValidationError(
                f"text with a lone surrogate ({value[exc.start]!r} at {exc.start}) cannot be "
                "stored: it is not Unicode text; decode bytes without surrogateescape"
            ) from None
    return value


@dataclass(frozen=True, slots=True)
class Unbound:
    """A parameter whose value is given per use, not when the fragment is
    compiled: :meth:`SqlCompiler.compile_parts` leaves it, unencoded, in the
    parameters, for the caller to replace by ``name`` (statements compiled
    once and run many times with other values)."""

    name: str


@dataclass(slots=True)  # (never changed; not frozen: a frozen one is slower to make)
class _Param:
    value: Any


@dataclass(frozen=True, slots=True)
class _InList:
    negated: bool
    values: tuple[Any, ...]


class Fragment:
    """A piece of SQL with its parameters, made by :func:`sql`. Immutable.

    (One made by :func:`sql` keeps its template and parameters, and works
    out its parts only when something asks for them: a compiler that has
    compiled the template before needs only the parameters.)"""

    __slots__ = ("_params", "_parts", "_shape")

    def __init__(self, parts: tuple[_Part, ...]) -> None:
        self._parts: tuple[_Part, ...] | None = parts
        self._shape: _Shape | None = None
        self._params: dict[str, Any] | None = None

    @property
    def parts(self) -> tuple[_Part, ...]:
        parts = self._parts
        if parts is None:
            assert self._shape is not None and self._params is not None
            parts = self._parts = self._shape.parts(self._params)
        return parts

    def __add__(self, other: Fragment) -> Fragment:
        if not isinstance(other, Fragment):
            return NotImplemented
        return Fragment(self.parts + other.parts)

    def __repr__(self) -> str:
        return f"Fragment({self.parts!r})"

    @staticmethod
    def join(fragments: Iterable[Fragment], separator: str = ", ") -> Fragment:
        """``fragments`` joined by the literal SQL text ``separator``."""
        parts: list[_Part] = []
        for i, fragment in enumerate(fragments):
            if not isinstance(fragment, Fragment):
                raise ValidationError(
                    f"Fragment.join takes fragments, got {type(fragment).__name__}"
                )
            if i:
                parts.append(separator)
            parts.append(fragment)
        return Fragment(tuple(parts))

    def _has_no_values(self) -> bool:
        """Whether this fragment compiles to SQL text without parameters."""
        if self._params is not None:
            return not self._params
        return all(type(part) is str for part in self.parts)


_Part = str | _Param | _InList | Identifier | Fragment


@dataclass(frozen=True, slots=True)
class _Hole:
    """One ``{name}`` in a template, with the literal text before it."""

    before: str
    name: str
    # For a hole right after IN / NOT IN: the text before it without the keyword.
    before_in: str | None
    negated: bool


class _Shape:
    """A parsed template: its holes in order, the text after the last one,
    the names its holes use, and those of holes right after ``IN (``.
    Hashed by identity: compilers cache the text of each shape they compile."""

    __slots__ = ("holes", "in_lists", "in_paren", "names", "order", "tail")

    def __init__(self, holes: tuple[_Hole, ...], tail: str) -> None:
        self.holes = holes
        self.tail = tail
        self.order = tuple(hole.name for hole in holes)
        self.names = frozenset(self.order)
        self.in_paren = tuple(
            hole.name for hole in holes if _IN_PAREN_SUFFIX.search(hole.before)
        )  # Holes right after IN / NOT IN, where a list is a list of values.
        self.in_lists = tuple(hole.name for hole in holes if hole.before_in is not None)

    def parts(self, params: Mapping[str, Any]) -> tuple[_Part, ...]:
        """The parts of this template filled with ``params`` (checked by :func:`sql`)."""
        parts: list[_Part] = []  # (no empty text)
        for hole in self.holes:
            value = params[hole.name]
            if hole.before_in is not None and isinstance(value, _LIST_TYPES):
                if hole.before_in:
                    parts.append(hole.before_in)
                parts.append(_InList(hole.negated, tuple(value)))
                continue
            if hole.before:
                parts.append(hole.before)
            parts.append(value if isinstance(value, _SPLICED) else _Param(value))
        if self.tail:
            parts.append(self.tail)
        return tuple(parts)


@lru_cache(maxsize=1024)
def _parse(template: str) -> _Shape:
    """``template``, parsed."""
    holes: list[_Hole] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValidationError(
            f"bad sql template ({exc}); write {{{{ and }}}} for literal braces"
        ) from exc
    pending = ""  # literal text since the last hole ({{ and }} split it)
    for literal, name, spec, conversion in parsed:
        literal = pending + literal
        if name is None:
            pending = literal
            continue
        pending = ""
        if not name.isidentifier() or spec or conversion:
            raise ValidationError(
                f"bad placeholder {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} in sql template: use {{name}} with a plain "
                "keyword name; write {{ and }} for literal braces"
            )
        match = _IN_SUFFIX.search(literal)
        holes.append(
            _Hole(
                literal,
                name,
                literal[: match.start()] if match else None,
                bool(match and match.group(1)),
            )
        )
    return _Shape(tuple(holes), pending)


# Spliced into a fragment as they are, not bound.
_SPLICED: Final = (Identifier, Fragment)


def sql(template: str, /, **params: Any) -> Fragment:
    """Build a fragment from ``template``; see the module docstring for what each
    kind of parameter becomes. Every ``{name}`` needs a parameter and every
    parameter must be used."""
    if not isinstance(template, str):
        raise ValidationError(f"sql() takes a template string, got {type(template).__name__}")
    shape = _parse(template)
    if params.keys() != shape.names:
        raise _mismatch(shape, params)
    for name in shape.in_paren:
        if isinstance(params[name], _LIST_TYPES):
            raise ValidationError(
                f"write `IN {{{name}}}` without parentheses: aiofragno adds them for lists"
            )
    for name in shape.in_lists:  # (the values as they are now: the fragment is immutable)
        value = params[name]
        if isinstance(value, _LIST_TYPES):
            params[name] = tuple(value)
    fragment = Fragment.__new__(Fragment)
    fragment._parts = None
    fragment._shape = shape
    fragment._params = params
    return fragment


def _mismatch(shape: _Shape, params: Mapping[str, Any]) -> ValidationError:
    for name in shape.order:
        if name not in params:
            return ValidationError(f"sql template uses {{{name}}} but no such parameter was given")
    return ValidationError(
        f"sql() parameters not used in the template: {', '.join(sorted(params.keys() - shape.names))}"
    )


def sql_using(template: str, /, **params: Any) -> Fragment:
    """:func:`sql` given only the parameters ``template`` names — for templates
    that draw on one shared table of names (internal queries)."""
    used = _parse(template).names
    return sql(template, **{name: value for name, value in params.items() if name in used})


Encoder = Callable[[Any], Any]


class SqlCompiler:
    """Compiles fragments for one dialect. The dialect differences are data:

    ``placeholder``: ``"$n"`` (numbered), ``"?"`` or ``"%s"``;
    ``quote``: the identifier quote character;
    ``encoders``: per Python type, how a value is turned into what the driver
    binds (e.g. Decimal -> text on SQLite);
    ``array_in``: lists after IN travel as one array parameter;
    ``empty_set``: a subquery yielding no rows, for ``IN`` with an empty list;
    ``scalars``: the types (subclasses included) a value may have, checked
    when compiling; None where the driver checks values against the
    statement itself (PostgreSQL, which also binds lists as arrays).
    """

    def __init__(
        self,
        *,
        placeholder: str,
        quote: str,
        max_identifier_length: int,
        encoders: Mapping[type, Encoder],
        array_in: bool = False,
        empty_set: str = "SELECT NULL WHERE 1=0",
        scalars: tuple[type, ...] | None = None,
    ) -> None:
        self._numbered = placeholder == "$n"
        self._placeholder = placeholder
        # Drivers formatting with % (MySQL) need every literal % doubled.
        self._escape_percent = placeholder == "%s"
        self._quote = quote
        self.max_identifier_length = max_identifier_length
        self._encoders = dict(encoders)
        self._array_in = array_in
        self._empty_set = empty_set
        self._scalars = scalars
        self._quoted: dict[str, str] = {}
        # Value types bound as they are or through their encoder, that the
        # memo's path takes without the type check encode() makes.
        self._plain = frozenset(t for t in _PLAIN if scalars is None or t in scalars)
        # The SQL text of each af.sql template compiled here, per fragment or
        # identifier spliced into it (see compile).
        self._texts: dict[object, str] = {}

    def compile(self, node: Fragment) -> CompiledQuery:
        """``node`` as SQL text and its encoded parameters. The text of an
        ``af.sql`` fragment whose holes hold plain values or value-less
        fragments and identifiers is looked up by its template (and those
        fragments and identifiers): it is the same every time."""
        shape = node._shape if type(node) is Fragment else None
        if shape is not None:
            given = node._params
            assert given is not None
            plain, encoders = self._plain, self._encoders
            params: list[Any] = []
            spliced: list[object] = []
            for name in shape.order:
                value = given[name]
                kind = type(value)
                if kind in plain:
                    encoder = encoders.get(kind)
                    # (unicode_text's usual case, ASCII text, without its call)
                    if encoder is None or (encoder is unicode_text and value.isascii()):
                        params.append(value)
                    else:
                        params.append(encoder(value))
                elif kind is Identifier or (
                    kind is Fragment and (value._params == {} or value._has_no_values())
                ):
                    # (With its hole's position: which holes are spliced
                    # varies from call to call, and each way has its own text.)
                    spliced += (len(params) + len(spliced) // 2, value)
                else:
                    break  # (a list, a fragment with values, ...: compiled in full)
            else:
                key = (shape, *spliced) if spliced else shape
                memo = self._texts
                text = memo.get(key)
                if text is None:
                    text = self._render(self._pieces(node)[0])
                    if len(memo) >= _MEMO_SIZE:
                        memo.clear()  # (templates built at run time: start over)
                    memo[key] = text
                return _compiled((text, tuple(params)))
        pieces, values = self._pieces(node)
        return CompiledQuery(self._render(pieces), tuple(values))

    def compile_parts(self, node: Fragment) -> tuple[SqlText, tuple[Any, ...]]:
        """``node`` as text with a slot per parameter, and the parameters
        (encoded; an :class:`Unbound` one left as it is), in slot order."""
        pieces, params = self._pieces(node)
        return SqlText(tuple(pieces)), tuple(params)

    def render(self, text: SqlText) -> str:
        """``text`` as the driver must receive it: each piece through
        :meth:`escape_text`, and in each slot the next parameter's
        placeholder — numbered (``$1``, ``$2``, ...) here and only here."""
        return self._render(text.pieces)

    def _render(self, pieces: Sequence[str]) -> str:
        if not self._numbered:
            text = self._placeholder.join(pieces)
            # (Each "%s" placeholder holds one %: any more are in the text.)
            if self._escape_percent and text.count("%") >= len(pieces):
                text = self._placeholder.join(map(self.escape_text, pieces))
            return text
        out = [""] * (2 * len(pieces) - 1)
        out[::2] = pieces
        out[1::2] = _numbers(len(pieces) - 1)
        return "".join(out)

    def _pieces(self, node: Fragment) -> tuple[list[str], list[Any]]:
        """The text pieces around ``node``'s parameter slots, and the parameters."""
        if not isinstance(node, Fragment):
            raise ValidationError(
                f"expected an af.sql(...) fragment, got {type(node).__name__}: wrap the SQL "
                "in af.sql(...), with values as {name} parameters so they stay bound "
                'parameters, e.g. af.sql("SELECT * FROM t WHERE id = {id}", id=id)'
            )
        pieces: list[str] = []
        out: list[str] = []  # the text of the piece being written
        params: list[Any] = []
        self._emit(node, pieces, out, params)
        pieces.append("".join(out))
        return pieces, params

    def encode(self, value: Any) -> Any:
        """``value`` as the driver should bind it; a :class:`ValidationError`
        for a value of a type this database cannot bind as one value."""
        encoder = self._encoders.get(type(value))
        if encoder is not None:
            return encoder(value)
        if self._scalars is not None and not isinstance(value, self._scalars):
            raise _not_one_value(value, self._scalars)
        return value

    def quote_identifier(self, name: str) -> str:
        quoted = self._quoted.get(name)
        if quoted is None:
            self._check_identifier(name)
            q = self._quote
            quoted = q + name.replace(q, q + q) + q
            if len(self._quoted) >= _MEMO_SIZE:
                self._quoted.clear()  # (names made at run time: start over)
            self._quoted[name] = quoted
        return quoted

    def _check_identifier(self, name: str) -> None:
        if not name:
            raise ValidationError("empty identifier")
        if "\x00" in name:
            raise ValidationError(f"identifier {name!r} contains a NUL byte")
        if len(name.encode()) > self.max_identifier_length:
            raise ValidationError(
                f"identifier {name!r} is longer than {self.max_identifier_length} bytes, "
                "the limit of this database"
            )

    def escape_text(self, text: str) -> str:
        """``text`` — SQL without placeholders: keywords, quoted names, literals
        — as the driver must receive it so that nothing in it is taken for a
        placeholder: with ``%s`` placeholders (MySQL, whose driver formats the
        whole text with ``%``, with or without parameters) every ``%`` doubled.
        Every piece of text a :class:`~aiofragno.driver.CompiledQuery` carries
        goes through here (:meth:`render`); placeholders are added beside
        it, never inside."""
        if self._escape_percent and "%" in text:
            return text.replace("%", "%%")
        return text

    def _emit(
        self, fragment: Fragment, pieces: list[str], out: list[str], params: list[Any]
    ) -> None:
        """Write ``fragment``: its text to ``out``, the piece being written;
        at each parameter, the piece ends (is joined onto ``pieces``)."""
        for part in fragment.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, _Param):
                value = part.value
                params.append(value if isinstance(value, Unbound) else self.encode(value))
                pieces.append("".join(out))
                out.clear()
            elif isinstance(part, Identifier):
                out.append(".".join(map(self.quote_identifier, part.parts)))
            elif isinstance(part, _InList):
                self._emit_in(part, pieces, out, params)
            else:
                self._emit(part, pieces, out, params)

    def _emit_in(self, part: _InList, pieces: list[str], out: list[str], params: list[Any]) -> None:
        values = [self.encode(v) for v in part.values]
        if self._array_in:  # one array parameter
            params.append(values)
            out.append("<> ALL(" if part.negated else "= ANY(")
            slots = 1
        else:
            params += values
            out.append("NOT IN (" if part.negated else "IN (")
            if not values:
                out.append(self._empty_set)
            slots = len(values)
        for i in range(slots):
            if i:
                out.append(", ")
            pieces.append("".join(out))
            out.clear()
        out.append(")")


# Types a value is often of (and list types never are): see SqlCompiler._plain.
_PLAIN: Final = frozenset(
    {str, int, float, bool, type(None), bytes, Decimal, datetime, date, time, timedelta, UUID}
)
_MEMO_SIZE: Final = 1024
# CompiledQuery(text, parameters) without the NamedTuple's own __new__ (a
# Python call).
_compiled: Final = functools.partial(tuple.__new__, CompiledQuery)


@lru_cache(maxsize=256)
def _numbers(count: int) -> tuple[str, ...]:
    """The placeholders ``$1`` to ``$<count>``."""
    return tuple(f"${number}" for number in range(1, count + 1))


def _not_one_value(value: Any, scalars: tuple[type, ...]) -> ValidationError:
    kind = type(value).__name__
    if isinstance(value, _LIST_TYPES):
        return ValidationError(
            f"a {kind} is a list of values only right after IN or NOT IN (write "
            "`column IN {name}`, without parentheses); this database has no array values"
        )
    names = ", ".join("None" if t is type(None) else t.__name__ for t in scalars)
    return ValidationError(
        f"cannot bind a {kind} value here; this database takes {names}: convert it "
        "(for example str(value)) before passing it"
    )
