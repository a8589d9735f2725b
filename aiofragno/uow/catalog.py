"""Per Database and schema layout: each table's quoted names, encoders,
decoders and SELECT list, built once, plus the cache of compiled SQL text
keyed by operation shape."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..brief import brief
from ..codec import Encode, ValueCodec
from ..driver import DialectAdapter, QueryCompiler
from ..errors import ValidationError
from ..naming import Layout
from ..schema import (
    EXTERNAL_ID,
    INTERNAL_ID,
    VERSION,
    Column,
    Reference,
    Table,
    TableIdentity,
)
from .row_decoder import Plan, row_decoder

ALIAS = "t"


@dataclass(frozen=True, slots=True)
class ColumnInfo:
    name: str
    kind: str  # logical type; "reference" for references, "id" for the external id
    quoted: str  # unqualified, for INSERT/UPDATE
    qualified: str  # t."name", for SELECT/WHERE
    encode: Encode
    column: Column | None  # None for the external id
    target: str | None = None  # referenced table
    target_identity: TableIdentity | None = None  # the referenced table's identity
    # A RowId of the referenced table may stand for its internal id (see
    # Capabilities.reuses_row_ids).
    trusts_internal_ids: bool = False


class TableInfo:
    """One table of a layout, ready for compiling operations."""

    def __init__(self, catalog: Catalog, name: str) -> None:
        physical = catalog.layout.table(name)
        quote = catalog.compiler.quote_identifier
        self.name = name
        self.table = physical.table
        self.identity = catalog.identity(name)
        self.sql_name = catalog.sql_name(name)
        self.internal_id = f"{ALIAS}.{quote(INTERNAL_ID)}"
        self.columns: dict[str, ColumnInfo] = {
            EXTERNAL_ID: ColumnInfo(
                EXTERNAL_ID,
                "id",
                quote(EXTERNAL_ID),
                f"{ALIAS}.{quote(EXTERNAL_ID)}",
                _external_id,
                None,
            )
        }
        for column in self.table.columns.values():
            self.columns[column.name] = _column_info(catalog, column)
        self.decimal_as_text = catalog.codec.storage.decimal == "text"
        self._sort_prefix_bytes = catalog.adapter.capabilities.sort_prefix_bytes
        self.unique_keys = _unique_keys(self.table, catalog.unique_indexes_confirmed)
        self._catalog = catalog
        self._selections: ShapeCache[Selection] = ShapeCache()
        # The columns of the unique keys: all that an order's tie-break
        # depends on of what a condition holds to one value (see ops.with_tie).
        self.unique_columns = frozenset[str]().union(*self.unique_keys)
        # What reads and aggregates build once per shape on this table.
        self.plans: ShapeCache[Any] = ShapeCache()
        self.select_list, self.select_from, self.decode = self._build_select(catalog, None)
        self.select_columns = ", ".join(self.select_list)

    def column(self, name: str) -> ColumnInfo:
        try:
            info = self.columns.get(name)
        except TypeError:  # (unhashable: no column name)
            info = None
        if info is None:
            if not isinstance(name, str):
                raise ValidationError(f"column names are str, got {brief(name)}")
            if name.startswith("_"):
                raise ValidationError(
                    f"column {name!r} of table {self.name!r} is internal to aiofragno"
                )
            self.table.column(name)  # raises, listing the columns
            raise AssertionError(name)
        return info

    def check_orderable(self, name: str) -> None:
        """Refuse ordering (and range comparisons) where the storage would not
        order by value: decimals kept as text (SQLite). (An unknown column
        is refused here too: a range comparison checks this first.)"""
        if self.column(name).kind == "decimal" and self.decimal_as_text:
            raise ValidationError(
                f"{self.name}.{name}: decimals are stored as text on this database, so they "
                "cannot be ordered or compared with < > (equality works)"
            )

    def check_sortable(self, name: str) -> None:
        """Refuse an order by a column whose values the database sorts by a
        prefix only (MariaDB, MySQL: the first 1,024 bytes; text, binary,
        JSON and ``varchar(n)`` over 256 characters, 4 sort bytes each):
        rows sharing a longer prefix would come in creation order, not by
        their values, and a page's cursor would repeat and skip them."""
        prefix = self._sort_prefix_bytes
        if prefix is None:
            return
        info = self.column(name)
        size = _SORT_BYTES.get(info.kind, 0)
        if info.kind == "varchar" and info.column is not None and info.column.length:
            size = 4 * info.column.length
        if size is None or size > prefix:
            raise ValidationError(
                f"{self.name}.{name} is a {info.column and info.column.type_name} column, whose "
                f"values may be longer than the {prefix} bytes this database sorts them by "
                "(max_sort_length), so an order by it would not be exact: order by a string "
                f"or varchar(n) column of at most {prefix // 4} characters, or sort in raw SQL"
            )

    def selection(self, names: tuple[str, ...]) -> Selection:
        """What reads ``names`` (columns of the table, checked) besides the id
        and version: the select list, the table and joins, the decoder (built
        once per tuple of names)."""
        selection = self._selections.get(names)
        if selection is None:
            for name in names:
                self.column(name)
            select_list, select_from, decode = self._build_select(self._catalog, frozenset(names))
            selection = Selection(select_list, ", ".join(select_list), select_from, decode)
            self._selections[names] = selection
        return selection

    def _build_select(
        self, catalog: Catalog, names: frozenset[str] | None
    ) -> tuple[tuple[str, ...], str, Callable[[Sequence[Any]], dict[str, Any]]]:
        """The select list of a row (``names``: of those columns only, else
        of all; the internal id first), the table and joins it selects from,
        and the row's decoder."""
        quote = catalog.compiler.quote_identifier
        selected = [self.internal_id, f"{ALIAS}.{quote(EXTERNAL_ID)}", f"{ALIAS}.{quote(VERSION)}"]
        joins: list[str] = []
        plan: list[Plan] = []
        for info in self.columns.values():
            if info.column is None or (names is not None and info.name not in names):
                continue
            plan_position = len(selected)
            selected.append(info.qualified)
            ref_position = None
            if info.target is not None:
                alias = f"r{len(joins) + 1}"
                joins.append(
                    f" LEFT JOIN {catalog.sql_name(info.target)} {alias} "
                    f"ON {alias}.{quote(INTERNAL_ID)} = {info.qualified}"
                )
                ref_position = len(selected)
                selected.append(f"{alias}.{quote(EXTERNAL_ID)}")
            convert = catalog.codec.decoder(info.kind, info.column.arg)
            plan.append((info.name, plan_position, convert, ref_position, info.target_identity))
        source = f"{self.sql_name} {ALIAS}{''.join(joins)}"
        return tuple(selected), source, row_decoder(plan, self.identity)


@dataclass(frozen=True, slots=True)
class Selection:
    """A row read with some of its columns (see :meth:`TableInfo.selection`)."""

    select_list: tuple[str, ...]
    select_columns: str
    select_from: str
    decode: Callable[[Sequence[Any]], dict[str, Any]]


def _external_id(value: Any) -> Any:
    if not isinstance(value, str):
        raise ValidationError(f"expected an id (str or RowId), got {type(value).__name__}")
    return str(value)


# Sort bytes per value of a kind on MySQL and MariaDB (utf8mb4, 4 per
# character; None: unbounded); other kinds sort whole.
_SORT_BYTES: dict[str, int | None] = {
    "string": 4 * 255,
    "enum": 4 * 255,
    "text": None,
    "binary": None,
    "json": None,
    "json_document": None,
}


def _unique_keys(table: Table[Any], confirmed: bool) -> tuple[frozenset[str], ...]:
    """The sets of columns that no two rows have equal: the external id, and
    — where the database is known to have them (``confirmed``) — the
    columns of each declared unique index over NOT NULL columns (NULLs
    repeat). A declaration ahead of the database (its migration not run, or
    refused: rows share a key) must not make an order drop its tie-break:
    pages would skip the rows it ties."""
    keys = [frozenset((EXTERNAL_ID,))]
    if not confirmed:
        return tuple(keys)
    for index in table.indexes.values():
        columns = [table.columns[n] for n in index.columns if n != EXTERNAL_ID]
        if index.unique and not any(c.nullable or c.kind in _LOOSE_EQUALITY for c in columns):
            keys.append(frozenset(index.columns))
    return tuple(keys)


# Kinds whose values Python holds equal where the database does not (JSON:
# 1, 1.0 and True; dicts in another key order): a page's check that its
# order did not tie (ops.Find._check_untied) compares them in Python.
_LOOSE_EQUALITY = frozenset({"json", "json_document"})


def _column_info(catalog: Catalog, column: Column) -> ColumnInfo:
    quote = catalog.compiler.quote_identifier
    quoted = quote(column.name)
    if isinstance(column, Reference):
        return ColumnInfo(
            column.name,
            "reference",
            quoted,
            f"{ALIAS}.{quoted}",
            _external_id,
            column,
            column.to_table,
            catalog.identity(column.to_table),
            not catalog.adapter.capabilities.reuses_row_ids,
        )
    encode = catalog.codec.encoder(column.kind, column.arg)
    return ColumnInfo(column.name, column.kind, quoted, f"{ALIAS}.{quoted}", encode, column)


# How many af.Table objects other than the schema's own a catalog remembers.
MAX_EQUAL_TABLES = 64


V = TypeVar("V")


class ShapeCache(dict[Any, V]):
    """What is built once per operation shape (statement texts, read and
    aggregate plans), at most :attr:`capacity` entries: past that, the
    oldest is dropped. Shapes come from user input — a LIMIT's count is part
    of a text, an aggregate's names of its plan — which must not grow the
    cache without end."""

    capacity = 4096

    def __setitem__(self, key: Any, value: V) -> None:
        if len(self) >= self.capacity and key not in self:
            del self[next(iter(self))]
        super().__setitem__(key, value)


class Catalog:
    """Everything compiled once per (Database, layout)."""

    def __init__(
        self,
        layout: Layout,
        compiler: QueryCompiler,
        codec: ValueCodec,
        adapter: DialectAdapter,
        identities: dict[tuple[str, ...], TableIdentity],
        unique_indexes_confirmed: bool = False,
    ) -> None:
        self.layout = layout
        # Whether a migration of this layout found (or made) the database as
        # declared, its unique indexes included (see _unique_keys).
        self.unique_indexes_confirmed = unique_indexes_confirmed
        self.compiler = compiler
        self.codec = codec
        self.adapter = adapter
        self.sql_cache: ShapeCache[str] = ShapeCache()
        # (row type, table, join tree shape) already checked (see joins.check_tree_row)
        self.checked_row_types: set[Any] = set()
        self._tables: dict[str, TableInfo] = {}
        # af.Table objects found to declare a table of the layout, by id (the
        # object kept, so that its id is not reused): compared once each.
        self._equal_tables: dict[int, tuple[Table[Any], TableInfo]] = {}
        # Shared by the Database's catalogs: one identity per physical table.
        self._identities = identities

    def identity(self, table: str) -> TableIdentity:
        """The identity of declared table ``table``'s physical table, the same
        object for every catalog of this Database that reaches it."""
        physical = self.layout.table(table)
        key = physical.identifier.parts
        identity = self._identities.get(key)
        if identity is None:
            identity = self._identities[key] = TableIdentity(table, self.layout.namespace, key)
        return identity

    def sql_name(self, table: str) -> str:
        """The quoted, qualified physical name of ``table``."""
        quote = self.compiler.quote_identifier
        return ".".join(quote(part) for part in self.layout.table(table).identifier.parts)

    def table(self, name: str | Table[Any]) -> TableInfo:
        """The layout's table named ``name``, or given as its ``af.Table``."""
        if type(name) is not str:
            if isinstance(name, Table):
                return self._declared(name)
            if not isinstance(name, str):
                raise ValidationError(
                    f"a table is its name (str) or its af.Table, got {type(name).__name__}"
                )
        info = self._tables.get(name)
        if info is None:
            info = self._tables[name] = TableInfo(self, name)
        return info

    def _declared(self, table: Table[Any]) -> TableInfo:
        """``table``'s info, if ``table`` is the schema's table of its name
        (or declares the same): a table of another schema would be read
        through a declaration that is not its own."""
        info = self.table(table.name)
        if info.table is table:
            return info
        known = self._equal_tables.get(id(table))
        if known is not None:
            return known[1]
        if info.table.describe() != table.describe():
            raise ValidationError(
                f"the af.Table {table.name!r} given is not the table of that name in the unit's "
                "schema (a table of another schema, or declared differently): pass the "
                "schema's own table, or its name"
            )
        if len(self._equal_tables) >= MAX_EQUAL_TABLES:
            self._equal_tables.clear()  # (objects made per call: bounded, not grown)
        self._equal_tables[id(table)] = (table, info)
        return info
