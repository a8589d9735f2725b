"""The state of compiling one statement: parameters always, SQL text (an
:class:`~aiofragno.sqltext.SqlText`, placeholders not yet written) only when
the text for this shape is not cached yet."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..brief import brief
from ..errors import ValidationError
from ..schema import INTERNAL_ID, RowId, TableIdentity
from ..sqltext import SqlText, SqlTextWriter

if TYPE_CHECKING:
    from .catalog import Catalog, ColumnInfo, TableInfo

_TEXT_KINDS = frozenset({"string", "text", "varchar", "id"})


class Compiling:
    """Collects the parameters of one statement on ``table`` (and its text when
    ``build_text``). ``signature`` records choices the text depends on beyond
    the operation's shape (how each reference value is resolved)."""

    __slots__ = ("build_text", "catalog", "params", "signature", "table", "writer")

    def __init__(self, catalog: Catalog, table: TableInfo, build_text: bool) -> None:
        self.catalog = catalog
        self.table = table
        self.build_text = build_text
        self.writer = SqlTextWriter() if build_text else None
        self.params: list[Any] = []
        self.signature: list[bool] = []

    def text(self, sql: str) -> None:
        """SQL text (names, keywords): never a placeholder, whatever a name holds."""
        writer = self.writer
        if writer is not None:
            writer.text(sql)

    def sql_text(self) -> SqlText:
        """The statement's text (with ``build_text``)."""
        assert self.writer is not None, "Compiling(build_text=False) writes no text"
        return self.writer.done()

    def column(self, name: str) -> str:
        return self.table.column(name).qualified

    def raw_value(self, value: Any) -> None:
        """A parameter bound as is (already encoded)."""
        self.params.append(value)
        writer = self.writer
        if writer is not None:
            writer.slot()

    def limit(self, count: int) -> None:
        """A LIMIT's row count, written into the text, not bound: PostgreSQL
        cannot plan ``LIMIT $n`` once for every execution (its generic plan
        guesses the count), so it plans such a statement again each time it
        runs, which costs a join's combined read more than running it.
        ``count`` is an exact int (the callers make it one), so its digits are
        all the text holds."""
        self.text(int.__repr__(count))

    def value(self, column: str, value: Any) -> None:
        """A parameter for ``column`` (see :func:`bind`); a reference looked up
        by external id becomes a subquery for the row's internal id."""
        info = self.table.columns.get(column) or self.table.column(column)
        param = bind(self.table, info, value)
        target = info.target
        if target is None:
            self.raw_value(param)
            return
        looked_up = type(param) is str
        self.signature.append(looked_up)
        if looked_up:
            self.lookup(target, param)
        else:
            self.raw_value(param)

    def lookup(self, target: str, external_id: str) -> None:
        quote = self.catalog.compiler.quote_identifier
        # -1 is no row's id: an unknown external id fails the foreign key
        # instead of becoming a silent NULL.
        self.text(
            f"COALESCE((SELECT {quote(INTERNAL_ID)} FROM {self.catalog.sql_name(target)} "
            f"WHERE {quote('id')} = "
        )
        self.raw_value(external_id)
        self.text("), -1)")

    def check_text_column(self, column: str, operation: str) -> None:
        if self.table.column(column).kind not in _TEXT_KINDS:
            raise ValidationError(f"{self.table.name}.{column}: {operation} needs a string column")


def bind(table: TableInfo, info: ColumnInfo, value: Any) -> Any:
    """``value`` as the parameter of column ``info``: checked and encoded for
    the column's type. A reference's parameter is the row's internal id (an
    int) where ``value`` is a RowId of the referenced table that carries it,
    else the external id (a str), by which the statement has to look the row
    up."""
    target = info.target_identity
    # (First the common cases: a value of a plain column, and a RowId this
    # Database read from the referenced table.)
    if target is None:
        try:
            return info.encode(value)
        except ValidationError as exc:
            raise ValidationError(f"{table.name}.{info.name}: {exc}") from None
    if type(value) is RowId and value.table is target:
        internal = value.internal_id
        return str(value) if internal is None or not info.trusts_internal_ids else internal
    try:
        return _reference(target, value, info.trusts_internal_ids)
    except ValidationError as exc:
        raise ValidationError(f"{table.name}.{info.name}: {exc}") from None


def _reference(target: TableIdentity, value: Any, trusted: bool) -> Any:
    """A reference's parameter (see :func:`bind`). An internal id is trusted
    only from a RowId made for ``target`` by this Database, and only where
    the database never gives a deleted row's id to another (``trusted``):
    one from another Database (or unpickled) may carry another database's id
    for the table, and is looked up by its external id instead."""
    if isinstance(value, RowId):
        source = value.table
        if source is target and trusted:
            internal = value.internal_id
            return str(value) if internal is None else internal
        _check_table(source, target, "a reference to")
        return str(value)
    if not isinstance(value, str):
        raise ValidationError(
            f"a reference takes a RowId or an id string, got {type(value).__name__}"
        )
    return str(value)


def _check_table(source: TableIdentity | None, table: TableIdentity, use: str) -> None:
    """Refuse a RowId of another physical table: its external id names no
    row of ``table``, and its internal id and version belong to another
    table's row (another table of the schema, or the same table in another
    namespace)."""
    if source is not None and source is not table and source.physical != table.physical:
        raise ValidationError(
            f"{use} {table!r} got a RowId of {source!r}; pass an id of a row of "
            f"{table.table!r} in namespace {table.namespace!r}"
        )


def row_id(value: Any, *, table: TableInfo, need_version: bool) -> RowId | str:
    """Check a row id argument: a RowId of ``table`` (or of no table), or
    (without ``need_version``) an id string."""
    if type(value) is not RowId or value.table is not table.identity:  # (else: ours)
        if not isinstance(value, str):
            raise ValidationError(
                f"{table.name}: a row id is a RowId or str, got {type(value).__name__}"
            )
        if isinstance(value, RowId):
            _check_table(value.table, table.identity, "the row id of")
    checked: RowId | str = value
    if not need_version:
        return checked
    version = getattr(value, "version", None)
    if version is None:
        raise ValidationError(
            f"{table.name}: check=True needs a RowId that carries a version (one read in this "
            f"unit's retrieval phase or returned by create), got {brief(value)}"
        )
    if type(version) is not int or not _VERSIONS[0] <= version <= _VERSIONS[1]:
        raise ValidationError(
            f"{table.name}: a row's version is an int in {_VERSIONS[0]}..{_VERSIONS[1]}, "
            f"got {brief(version)}"
        )
    return checked


_VERSIONS = (-(2**31), 2**31 - 1)  # (the version column's type, on every backend)
