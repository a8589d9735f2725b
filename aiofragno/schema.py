"""Schemas declared in Python: Schema, Table, Column, Reference, Index — and
RowId, the id of a row.

Every table gets three columns of ours besides the declared ones:

* ``id`` — the external id: a UUIDv7 string made by the client when the row is
  created (unique; URL-safe; sorts roughly by creation time, which keeps index
  inserts local; needs no round trip to the database);
* a hidden internal ``_id`` bigint primary key (what references store);
* a hidden ``_version`` integer, bumped by every update, for optimistic
  concurrency.

Declaring something invalid raises :class:`~aiofragno.errors.SchemaError`
immediately, naming the table and column.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, Generic, overload

from typing_extensions import TypeVar

from .codec import LOGICAL_TYPES, check_value
from .column_types import ArrayType, EnumType, TypeArg
from .errors import SchemaError, ValidationError
from .random_bytes import random_bytes

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,62}")  # (fullmatch: "$" would allow a final "\n")
RESERVED_COLUMNS = frozenset({"id"})
EXTERNAL_ID = "id"
INTERNAL_ID = "_id"
VERSION = "_version"


@dataclass(frozen=True, eq=False, slots=True)
class TableIdentity:
    """The table a :class:`RowId` was read from or created in: one physical
    table (``physical``: its database schema, if any, and name) as one
    Database reaches it, named for messages by its declared ``table`` and
    ``namespace``. Each Database makes one per physical table, so the same
    object means the same id space; an equal ``physical`` from another
    Database (or a pickled RowId) names the same table, but its internal ids
    may belong to another database's rows."""

    table: str
    namespace: str
    physical: tuple[str, ...]

    def __repr__(self) -> str:
        return f"<table {self.table!r} of namespace {self.namespace!r}>"


class RowId(str):
    """The external id of a row (a ``str``), carrying the row's ``version``,
    ``internal_id`` and ``table`` (a :class:`TableIdentity`) when it was read
    from the database — ``table`` also when ``create`` returned it. The
    internal id and version are trusted only by the table they came from;
    see the Units of work guide (docs/units-of-work.md)."""

    version: int | None
    internal_id: int | None
    table: TableIdentity | None

    def __new__(
        cls,
        external_id: str,
        version: int | None = None,
        internal_id: int | None = None,
        table: TableIdentity | None = None,
    ) -> RowId:
        row_id = str.__new__(cls, external_id)  # (not super(): one RowId per row read)
        # (One dict assigned costs half of three attributes set one by one.)
        row_id.__dict__ = {"version": version, "internal_id": internal_id, "table": table}
        return row_id

    def __repr__(self) -> str:
        return f"RowId({str(self)!r}, version={self.version})"


def new_external_id() -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then 74 random bits."""
    # Built from hex text rather than one 128-bit int: every unit of work
    # makes at least one, and the big-int arithmetic cost a third more.
    ms = (time.time_ns() // 1_000_000).to_bytes(6).hex()
    noise = random_bytes(10)
    r = noise.hex()
    # The version nibble replaces noise[0]'s high one; the variant (0b10) takes
    # the top two bits of noise[2], whose other two stay random: 74 random bits.
    variant = "89ab"[noise[2] >> 6]
    return f"{ms[:8]}-{ms[8:]}-7{r[1:4]}-{variant}{r[5:8]}-{r[8:]}"


@dataclass(frozen=True, slots=True)
class VarChar:
    length: int

    def __str__(self) -> str:
        return f"varchar({self.length})"


def varchar(length: int) -> VarChar:
    """A string column of at most ``length`` characters (checked on write on
    every backend, SQLite included)."""
    if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= 16383:
        raise SchemaError(f"varchar length must be an int in 1..16383, got {length!r}")
    return VarChar(length)


ENUM_MAX_CHARS = 255  # (what a string column holds on MySQL, where enums are stored)


def enum(*values: str | type[Enum]) -> EnumType:
    """A string column holding one of ``values``: ``af.enum("new", "paid")``,
    or ``af.enum(Status)`` for a ``StrEnum`` (its members' values). Writes
    and where-values are checked against the set; reads return the stored
    str as it is (a value since dropped from the set stays readable)."""
    if len(values) == 1 and isinstance(values[0], type) and issubclass(values[0], Enum):
        values = tuple(member.value for member in values[0])
    if not values:
        raise SchemaError("an enum needs at least one value")
    names: list[str] = []
    for value in values:
        if not isinstance(value, str) or not _storable_text(value):
            raise SchemaError(
                f"enum values are str of at most {ENUM_MAX_CHARS} characters without NUL or "
                f"lone surrogates, got {value!r:.80}"
            )
        names.append(str.__str__(value))
    if len(set(names)) != len(names):
        raise SchemaError(f"an enum lists a value twice: {names!r:.200}")
    return EnumType(tuple(names))


def _storable_text(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return len(value) <= ENUM_MAX_CHARS and "\x00" not in value


# Types an array's items may have: scalars with an exact array form in
# PostgreSQL and asyncpg (not json, whose arrays the driver sends as text,
# nor arrays of arrays, which PostgreSQL flattens into dimensions).
_ARRAY_ITEMS = LOGICAL_TYPES - {"json", "array"}


def array(element: str | VarChar | EnumType) -> ArrayType:
    """A PostgreSQL array of ``element`` (a scalar type: ``"integer"``,
    ``af.varchar(20)``, ``af.enum(...)``, ...): a list in and out, each item
    checked as a value of that type, none of them None. Other databases
    have no arrays: migrating or using such a column there is an error."""
    kind, arg = _resolve_type(element, "an array's items")
    if kind not in _ARRAY_ITEMS:
        raise SchemaError(f"arrays hold scalar items, not {kind}")
    return ArrayType(kind, arg, _type_name(kind, arg))


def _resolve_type(declared: Any, what: str) -> tuple[str, TypeArg]:
    """A declared type as its kind and argument (see
    :mod:`aiofragno.column_types`)."""
    if isinstance(declared, VarChar):
        return "varchar", declared.length
    if isinstance(declared, EnumType):
        return "enum", declared
    if isinstance(declared, ArrayType):
        return "array", declared
    if isinstance(declared, str) and declared in LOGICAL_TYPES - _WITH_ARGUMENTS:
        return declared, None
    known = ", ".join(sorted(LOGICAL_TYPES - _WITH_ARGUMENTS))
    raise SchemaError(
        f"{what} has unknown type {declared!r}; use one of {known}, af.varchar(n), "
        "af.enum(...) or af.array(...)"
    )


_WITH_ARGUMENTS = frozenset({"varchar", "enum", "array"})


def _type_name(kind: str, arg: TypeArg) -> str:
    return kind if arg is None else str(arg) if kind != "varchar" else f"varchar({arg})"


def _check_name(what: str, name: Any, where: str = "") -> None:
    place = f" in {where}" if where else ""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "__" in name:
        if isinstance(name, str) and name.startswith("_"):
            why = "names starting with _ are reserved for aiofragno"
        elif isinstance(name, str) and "__" in name:
            why = "double underscores are reserved (they separate parts of index names)"
        else:
            why = "use a letter, then letters, digits or _ (at most 63)"
        raise SchemaError(f"bad {what} name {name!r}{place}: {why}")


def _check_distinct(what: str, name: str, existing: Iterable[str], where: str) -> None:
    """Names may not differ only in case: SQLite and MySQL would take them for
    the same one."""
    for other in existing:
        if other.lower() == name.lower():
            same = "declared twice" if other == name else f"the same as {other!r} but for case"
            raise SchemaError(f"{what} {name!r} is {same} in {where}")


class Declaration:
    """A column, index or drop: a value once a :class:`Table` holds it. The
    Table checked it as it was (names, renames, the row type): a later
    change would skip those checks, so it raises instead."""

    _sealed = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self._sealed:
            raise SchemaError(
                f"{self!r} belongs to a Table and cannot change: declare a new "
                f"{type(self).__name__} (and a new Table) instead"
            )
        object.__setattr__(self, name, value)

    def seal(self) -> None:
        object.__setattr__(self, "_sealed", True)


class Column(Declaration):
    """A column: ``Column("balance", "bigint", default=0)``. Types: string, text,
    smallint, integer, bigint, float, decimal, bool, json, binary, date,
    timestamp, time, uuid, or ``af.varchar(n)``, ``af.enum(...)``,
    ``af.array(...)``. ``default`` is used when ``create`` omits the column.

    ``kind`` is the type's name and ``arg`` its argument (a varchar's length,
    which ``length`` also holds; an enum's or array's declaration)."""

    kind: str
    arg: TypeArg
    length: int | None

    def __init__(
        self,
        name: str,
        type: str | VarChar | EnumType | ArrayType,
        *,
        nullable: bool = False,
        default: Any = None,
        renamed_from: str | None = None,
        backfill: Any = None,
    ) -> None:
        _check_name("column", name)
        if renamed_from is not None:
            _check_name("column", renamed_from, f"renamed_from of column {name!r}")
        self.name = name
        self.nullable = bool(nullable)
        self.default = default
        self.renamed_from = renamed_from
        self.backfill = backfill
        self.kind, self.arg = _resolve_type(type, f"column {name!r}")
        self.length = self.arg if isinstance(self.arg, int) else None
        for what, value in (("default", default), ("backfill", backfill)):
            if value is None:
                continue
            try:
                check_value(self.kind, value, self.arg)
            except ValidationError as exc:
                raise SchemaError(
                    f"column {name!r}: {what} {value!r} does not fit {self.type_name}: {exc}"
                ) from None

    @property
    def type_name(self) -> str:
        return _type_name(self.kind, self.arg)

    def describe(self) -> dict[str, Any]:
        default = self.default
        return {
            "name": self.name,
            "type": self.type_name,
            "nullable": self.nullable,
            "default": repr(default),
        }

    def __repr__(self) -> str:
        return f"Column({self.name!r}, {self.type_name!r}, nullable={self.nullable})"


class Reference(Column):
    """A reference to a row of ``to_table`` in the same schema (stored as that
    row's internal id, with a foreign key)."""

    def __init__(
        self,
        name: str,
        to_table: str,
        *,
        nullable: bool = False,
        renamed_from: str | None = None,
    ) -> None:
        super().__init__(name, "bigint", nullable=nullable, renamed_from=renamed_from)
        _check_name("table", to_table, f"reference {name!r}")
        self.kind = "reference"
        self.to_table = to_table

    @property
    def type_name(self) -> str:
        return f"reference({self.to_table})"


class Index(Declaration):
    """An index over ``columns`` (unique if ``unique=True``);
    ``renamed_from="old"`` renames the database's index ``old`` to this one
    instead of building a new one."""

    def __init__(
        self,
        name: str,
        columns: Sequence[str],
        *,
        unique: bool = False,
        renamed_from: str | None = None,
    ) -> None:
        _check_name("index", name)
        if renamed_from is not None:
            _check_name("index", renamed_from, f"renamed_from of index {name!r}")
        self.renamed_from = renamed_from
        if isinstance(columns, str) or not columns:
            raise SchemaError(f"index {name!r}: columns must be a non-empty list of column names")
        self.name = name
        self.columns = tuple(columns)
        self.unique = bool(unique)
        if len(set(self.columns)) != len(self.columns):
            raise SchemaError(f"index {name!r} names a column twice: {list(self.columns)}")

    def __repr__(self) -> str:
        return f"Index({self.name!r}, {list(self.columns)!r}, unique={self.unique})"


class Dropped(Declaration):
    """A column (or, with ``index=True``, an index) the table no longer has
    and whose data may go: ``af.Dropped("legacy")`` in a table's items makes
    a migration drop it if the database still has it (recorded in the
    settings table). Undeclared columns are otherwise never dropped."""

    def __init__(self, name: str, *, index: bool = False) -> None:
        _check_name("index" if index else "column", name, "af.Dropped")
        self.name = name
        self.index = bool(index)

    def __repr__(self) -> str:
        return f"Dropped({self.name!r}{', index=True' if self.index else ''})"


RowT = TypeVar("RowT", default=dict[str, Any])
Row2 = TypeVar("Row2")


class Table(Generic[RowT]):
    """A table: ``Table("accounts", Column(...), Reference(...), Index(...))``.
    ``outbox=False`` keeps its writes out of the outbox: they put nothing in
    an entry's payload, and a unit that writes only such tables writes no
    entry (see docs/outbox.md, Opting out).

    ``row=AccountRow`` (a TypedDict of the row's keys and types, checked
    here; see :mod:`aiofragno.row_types`) makes it a ``Table[AccountRow]``:
    finds given the table object return ``AccountRow`` rows to a type
    checker. Without it, rows are ``dict[str, Any]``.

    ``renamed_from="old"`` renames the database table of the namespace's
    table ``old`` (and its indexes) to this one, its rows kept."""

    @overload
    def __init__(
        self: Table[dict[str, Any]],
        name: str,
        *items: Column | Index | Dropped,
        outbox: bool = True,
    ) -> None: ...

    @overload
    def __init__(
        self: Table[Row2],
        name: str,
        *items: Column | Index | Dropped,
        row: type[Row2],
        outbox: bool = True,
        renamed_from: str | None = None,
    ) -> None: ...

    def __init__(
        self,
        name: str,
        *items: Column | Index | Dropped,
        row: Any = None,
        outbox: bool = True,
        renamed_from: str | None = None,
    ) -> None:
        _check_name("table", name)
        if renamed_from is not None:
            _check_name("table", renamed_from, f"renamed_from of table {name!r}")
            if renamed_from.lower() == name.lower():
                raise SchemaError(f"table {name!r} is renamed_from itself")
        self.renamed_from = renamed_from
        if not isinstance(outbox, bool):
            raise SchemaError(f"outbox= of table {name!r} must be a bool, got {outbox!r}")
        self.name = name
        self.outbox = outbox
        self._row: type[RowT] | None = row
        columns: dict[str, Column] = {}
        indexes: dict[str, Index] = {}
        self.dropped: dict[str, Dropped] = {}
        self.dropped_indexes: dict[str, Dropped] = {}
        for item in items:
            self._add(item, columns, indexes)
            item.seal()
        # Read-only: the row type was checked against these.
        self.columns: Mapping[str, Column] = MappingProxyType(columns)
        self.indexes: Mapping[str, Index] = MappingProxyType(indexes)
        _check_renames("column", self.columns, self.dropped, name)
        _check_renames("index", self.indexes, self.dropped_indexes, name)
        for index in self.indexes.values():
            for column in index.columns:
                if column not in self.columns and column != EXTERNAL_ID:
                    raise SchemaError(
                        f"index {index.name!r} of table {name!r} uses unknown column {column!r}"
                    )
        if row is not None:
            from .row_types import check_row_type  # (it reads tables: imports this module)

            check_row_type(row, self)

    @property
    def row(self) -> type[RowT] | None:
        """The row type given as ``row=`` (checked then; it cannot change)."""
        return self._row

    def _add(
        self,
        item: Column | Index | Dropped,
        columns: dict[str, Column],
        indexes: dict[str, Index],
    ) -> None:
        where = f"table {self.name!r}"
        if isinstance(item, Column):
            if item.name in RESERVED_COLUMNS:
                raise SchemaError(
                    f"column {item.name!r} in {where} is reserved: every table has it already"
                )
            if (item.renamed_from or "").lower() in RESERVED_COLUMNS:
                # (Renamed, the table would get a new id column: every row a new id.)
                raise SchemaError(
                    f"column {item.name!r} in {where} cannot be renamed_from="
                    f"{item.renamed_from!r}: every table keeps that column, the rows' ids"
                )
            _check_distinct("column", item.name, [*columns, "id"], where)
            columns[item.name] = item
        elif isinstance(item, Index):
            if item.name in indexes:
                raise SchemaError(f"index {item.name!r} is declared twice in {where}")
            indexes[item.name] = item
        elif isinstance(item, Dropped):
            declared: Mapping[str, Any] = indexes if item.index else columns
            dropped = self.dropped_indexes if item.index else self.dropped
            if item.name in declared or item.name in dropped:
                raise SchemaError(f"{item!r} in {where} names one declared there already")
            if not item.index and item.name.lower() in RESERVED_COLUMNS:
                raise SchemaError(
                    f"{item!r} in {where}: every table keeps that column, the rows' ids"
                )
            dropped[item.name] = item
        else:
            raise SchemaError(
                f"{where}: expected Column, Reference, Index or Dropped, got {item!r}"
            )

    def column(self, name: str) -> Column:
        try:
            return self.columns[name]
        except KeyError:
            known = ", ".join(["id", *self.columns])
            raise ValidationError(
                f"table {self.name!r} has no column {name!r}; columns: {known}"
            ) from None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "columns": [c.describe() for c in self.columns.values()],
            "indexes": [
                {"name": i.name, "columns": list(i.columns), "unique": i.unique}
                for i in self.indexes.values()
            ],
            # (Only when there are: existing declarations keep their fingerprint.)
            **({"dropped": sorted(self.dropped)} if self.dropped else {}),
            **({"dropped_indexes": sorted(self.dropped_indexes)} if self.dropped_indexes else {}),
        }


def _check_renames(
    what: str,
    declared: Mapping[str, Column] | Mapping[str, Index],
    dropped: dict[str, Dropped],
    table: str,
) -> None:
    """A rename names one old name that is neither declared nor dropped,
    and no two renames the same one."""
    taken = {n.lower() for n in declared} | {n.lower() for n in dropped}
    seen: set[str] = set()
    for item in declared.values():
        old = item.renamed_from
        if old is None:
            continue
        if old.lower() in taken or old.lower() in seen:
            raise SchemaError(
                f"{what} {item.name!r} of table {table!r} is renamed_from={old!r}, which the "
                f"table declares (or drops, or another {what} is renamed from) too"
            )
        seen.add(old.lower())


class Schema:
    """A named set of tables: ``Schema("shop", Table(...), Table(...))``."""

    def __init__(self, name: str, *tables: Table[Any]) -> None:
        _check_name("schema", name)
        self.name = name
        self.tables: dict[str, Table[Any]] = {}
        for table in tables:
            if not isinstance(table, Table):
                raise SchemaError(f"schema {name!r}: expected Table, got {table!r}")
            _check_distinct("table", table.name, self.tables, f"schema {name!r}")
            self.tables[table.name] = table
        for table in self.tables.values():
            old = table.renamed_from
            if old is not None and any(
                old.lower() in (t.name.lower(), (t.renamed_from or "").lower())
                for t in self.tables.values()
                if t is not table
            ):
                raise SchemaError(
                    f"table {table.name!r} of schema {name!r} is renamed_from={old!r}, which "
                    "the schema declares (or another table is renamed from) too"
                )
            for column in table.columns.values():
                if isinstance(column, Reference) and column.to_table not in self.tables:
                    raise SchemaError(
                        f"column {column.name!r} of table {table.name!r} references unknown table "
                        f"{column.to_table!r} (schema {name!r} has: {', '.join(self.tables)})"
                    )

    def table(self, name: str) -> Table[Any]:
        try:
            return self.tables[name]
        except KeyError:
            raise ValidationError(
                f"schema {self.name!r} has no table {name!r}; tables: {', '.join(self.tables)}"
            ) from None

    @property
    def fingerprint(self) -> str:
        """A hash of the declaration: equal schemas, equal fingerprints."""
        text = json.dumps([t.describe() for t in self.tables.values()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def table_name(table: str | Table[Any]) -> str:
    """The name of a table given by name or as its ``af.Table``."""
    return table if isinstance(table, str) else table.name


def tables_in_dependency_order(schema: Schema) -> Iterable[Table[Any]]:
    """Referenced tables before the tables that reference them (cycles: in
    declaration order; their foreign keys are added after the tables)."""
    done: set[str] = set()
    order: list[Table[Any]] = []

    def visit(table: Table[Any], path: tuple[str, ...]) -> None:
        if table.name in done or table.name in path:
            return
        for column in table.columns.values():
            if isinstance(column, Reference):
                visit(schema.tables[column.to_table], (*path, table.name))
        done.add(table.name)
        order.append(table)

    for table in schema.tables.values():
        visit(table, ())
    return order
