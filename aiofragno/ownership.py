"""Which declared table each physical table is, as migrations record it.

A naming strategy can map two declarations to one physical table (suffix
naming: ``orders`` in namespace ``eu_west`` and ``orders_eu`` in ``west`` are
both ``orders_eu_west``), and a declared table can have the name of a table
that is not aiofragno's at all. Either table would be shared without a word:
migrations would alter it, and units would read each other's rows. So
``migrate`` records, in the settings table, the physical table of every
(namespace, table) it migrates — key ``<namespace>.table:<table>``, value
``{"namespace", "table", "schema", "name"}`` as JSON — and, before it changes
anything, refuses with :class:`~aiofragno.errors.MigrationError`:

* a physical table recorded for another (namespace, table), or one of
  aiofragno's internal tables;
* an existing table that is recorded for nobody and lacks one of the
  columns every aiofragno table has (``_id``, ``id``, ``_version``):
  someone else's — unless ``adopt`` is given (``migrate(..., adopt=True)``),
  which records it and adds those columns
  (:mod:`aiofragno.internal_columns`).

A table recorded for the (namespace, table) migrating it that has lost one of
those columns (dropped by hand) is healed: the column is added again.

An existing aiofragno table recorded for nobody (migrated before these records
existed) is adopted: recorded for the (namespace, table) migrating it.
Physical names are compared ignoring case (see :mod:`aiofragno.naming`), with
the default schema resolved (PostgreSQL's ``current_schema()``), so a table
named with and without its schema is one table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .driver import DdlSpec
from .errors import MigrationError
from .naming import Layout, PhysicalTable, physical_key
from .outbox import tables as outbox_tables
from .schema import EXTERNAL_ID, INTERNAL_ID, VERSION
from .settings_table import SETTINGS_TABLE, read_settings_like, write_setting
from .sql import sql

if TYPE_CHECKING:
    from .session import Session

# aiofragno's own tables, in the default schema: no declared table may be one.
INTERNAL_TABLES = (SETTINGS_TABLE, *outbox_tables.NAMES)
# The columns every aiofragno table has.
_OURS = (INTERNAL_ID, EXTERNAL_ID, VERSION)
# (Namespaces and tables are [A-Za-z][A-Za-z0-9_]*: no key of another kind
# matches, and ".table:" splits a key in one way only.)
_PATTERN = "%.table:%"

Key = tuple[str, str]
Owner = tuple[str, str]  # (namespace, table)
# Records to write: (settings key, value).
Pending = list[tuple[str, str]]


def owner_key(namespace: str, table: str) -> str:
    """The settings key recording the physical table of ``namespace``.``table``."""
    return f"{namespace}.table:{table}"


async def check(
    session: Session,
    compile: Any,
    spec: DdlSpec,
    layout: Layout,
    columns: Mapping[str, set[str]],
    *,
    recorded: bool,
    adopt: bool = False,
) -> Pending:
    """Raise :class:`MigrationError` if a table of ``layout`` would be
    another's (``columns``: what each has in the database; ``recorded``:
    whether the settings table exists; ``adopt``: take tables that are not
    aiofragno's); return the records to write."""
    default = await _default_schema(session, compile, spec)
    owners: dict[Key, Owner | None] = {
        physical_key(default, name): None for name in INTERNAL_TABLES
    }
    if recorded:
        owners.update(await _recorded_owners(session, compile))
    pending: Pending = []
    for name, physical in layout.tables.items():
        schema = physical.schema or default
        key = physical_key(schema, physical.name)
        _refuse_another(layout.namespace, name, physical, owners, key, columns[name], adopt)
        if key not in owners:
            pending.append(
                (owner_key(layout.namespace, name), _record(layout, name, physical, schema))
            )
    return pending


def _refuse_another(
    namespace: str,
    name: str,
    physical: PhysicalTable,
    owners: Mapping[Key, Owner | None],
    key: Key,
    columns: set[str],
    adopt: bool,
) -> None:
    """Raise :class:`MigrationError` if ``physical`` (``key``, with
    ``columns``) is not ``namespace``.``name``'s to migrate."""
    where = (
        f"table {name!r} of namespace {namespace!r} would be the database table {str(physical)!r}"
    )
    if key in owners:
        owner = owners[key]
        if owner is None:
            raise MigrationError(
                f"{where}, which is aiofragno's own; use another namespace or table name"
            )
        if owner != (namespace, name):
            raise MigrationError(_collision(where, owner))
    folded = {column.lower() for column in columns}
    missing = [column for column in _OURS if column not in folded]
    if columns and missing and key not in owners and not adopt:
        raise MigrationError(
            f"{where}, which exists and is not an aiofragno table (it has no "
            f"{', '.join(missing)} column); aiofragno leaves it alone: migrate under another "
            "namespace, or rename that table; or, to make it this table, declare its columns "
            "and migrate with adopt=True, which adds aiofragno's columns to it (its rows kept)"
        )


async def record(session: Session, compile: Any, pending: Pending) -> None:
    """Write the records :func:`check` returned."""
    for key, value in pending:
        await write_setting(session, compile, key, value)


def _collision(where: str, owner: Owner) -> str:
    namespace, table = owner
    return (
        f"{where}, which is table {table!r} of namespace {namespace!r} (recorded in "
        f"{SETTINGS_TABLE} under {owner_key(namespace, table)!r}); migrate under another "
        "namespace, or use a naming strategy that keeps them apart. If namespace "
        f"{namespace!r} is no longer used, drop its tables and delete its keys "
        f"('{namespace}.%') from {SETTINGS_TABLE}"
    )


def _record(layout: Layout, name: str, physical: PhysicalTable, schema: str | None) -> str:
    return json.dumps(
        {"namespace": layout.namespace, "table": name, "schema": schema, "name": physical.name},
        ensure_ascii=False,
    )


async def _recorded_owners(session: Session, compile: Any) -> dict[Key, Owner | None]:
    owners: dict[Key, Owner | None] = {}
    for key, value in await read_settings_like(session, compile, _PATTERN):
        try:
            data = json.loads(value)
            owners[physical_key(data["schema"], data["name"])] = (data["namespace"], data["table"])
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise MigrationError(
                f"{SETTINGS_TABLE} key {key!r} holds {value!r:.80}, which is not a table record; "
                "delete the key (the next migration of its namespace records it again)"
            ) from exc
    return owners


async def _default_schema(session: Session, compile: Any, spec: DdlSpec) -> str | None:
    """The schema unqualified table names resolve to (None: no schemas)."""
    if spec.current_schema_sql is None:
        return None
    result = await session.execute(compile(sql(spec.current_schema_sql)))
    name = result.rows[0]["name"] if result.rows else None
    return None if name is None else str(name)
