"""Writing the outbox entry of a unit, inside its mutation transaction.

The version is reserved last, just before COMMIT, from a counter row in the
settings table. Every writer updates that one row, so each holds its lock from
the reservation until it commits: versions are handed out in commit order and a
rolled-back reservation is undone with its transaction — no gaps, and a reader
polling ``versionstamp > cursor`` never skips an entry that commits later.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from .. import tagged_json
from ..codec import ValueCodec, utc_now
from ..driver import CompiledQuery, DialectAdapter, QueryCompiler
from ..migrate import SETTINGS_TABLE
from ..session import Session
from ..sql import Identifier, sql
from .tables import OUTBOX_ID, VERSION_KEY

if TYPE_CHECKING:
    from ..uow.ops import MutationOp
from .versionstamp import versionstamp

Notify = Callable[[CompiledQuery], Any]

_RESERVE = {
    "insert-on-conflict-returning": (
        "INSERT INTO {t} ({k}, {v}) VALUES ({key}, '1') ON CONFLICT ({k}) "
        "DO UPDATE SET {v} = CAST(CAST({t}.{v} AS BIGINT) + 1 AS TEXT) RETURNING {v}"
    ),
    "insert-on-duplicate-last-insert-id": (
        "INSERT INTO {t} ({k}, {v}) VALUES ({key}, '1') "
        "ON DUPLICATE KEY UPDATE {v} = LAST_INSERT_ID(CAST({v} AS UNSIGNED) + 1)"
    ),
}


class OutboxStatements:
    """The writer's SQL for one dialect, compiled once: the reservation has no
    varying parameter, the insert only its values."""

    def __init__(self, compiler: QueryCompiler, adapter: DialectAdapter) -> None:
        names = {"t": Identifier(SETTINGS_TABLE), "k": Identifier("key"), "v": Identifier("value")}
        self.reserve = compiler.compile(
            sql(_RESERVE[adapter.outbox_version_strategy], **names, key=VERSION_KEY)
        )
        self.last_insert_id = compiler.compile(sql("SELECT LAST_INSERT_ID() AS v"))
        self.insert = compiler.compile(
            sql(
                "INSERT INTO {t} ({vs}, {u}, {p}, {r}, {c}) VALUES ({a}, {b}, {c_}, {d}, {e})",
                t=OUTBOX_ID,
                vs=Identifier("versionstamp"),
                u=Identifier("uow_id"),
                p=Identifier("payload"),
                r=Identifier("ref_map"),
                c=Identifier("created_at"),
                a="",
                b="",
                c_="",
                d="",
                e="",
            )
        ).sql


async def reserve_version(session: Session, statements: OutboxStatements, notify: Notify) -> int:
    """The next outbox version; its row lock is held until the transaction ends."""
    notify(statements.reserve)
    result = await session.execute(statements.reserve)
    if result.rows:
        return int(next(iter(result.rows[0].values())))
    if result.rows_affected == 1:
        return 1  # MySQL inserted the counter row: the first version
    if result.insert_id:  # MySQL reports LAST_INSERT_ID(expr) in the OK packet
        return int(result.insert_id)
    notify(statements.last_insert_id)
    last = await session.execute(statements.last_insert_id)
    return int(last.rows[0]["v"])


def _payload_value(kind: str, value: Any) -> Any:
    """The value as stored, in Python terms: a RowId travels as its external
    id, an int given for a decimal as a Decimal, a naive datetime accepted as
    UTC as an aware one."""
    if isinstance(value, str):
        return str(value)
    if kind == "decimal" and isinstance(value, int):
        return Decimal(value)
    if kind == "timestamp" and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if kind == "binary":
        return bytes(value)
    return value


def describe(
    schema: str, namespace: str, ops: Sequence[MutationOp], version: str
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The payload's mutations and the ref_map ("<index>.<column>" -> external
    id of the referenced row). ``version`` is the versionstamps' first 20 hex
    digits. References are always known by external id on our side (a RowId
    is its external id, even one created earlier in the unit), so the map
    needs no lookup."""
    mutations: list[dict[str, Any]] = []
    ref_map: dict[str, str] = {}
    for op in ops:
        index = len(mutations)
        entry: dict[str, Any] = {
            "op": op.op,
            "schema": schema,
            "namespace": namespace,
            "table": op.table.name,
            "external_id": str(op.target),
            "versionstamp": f"{version}{index:04x}",
        }
        values = getattr(op, "values", None)
        if values is not None:
            for column, value in values.items():
                info = op.table.columns[column]
                if info.target is not None and value is not None:
                    ref_map[f"{index}.{column}"] = str(value)
            entry["values" if op.op == "create" else "set"] = {
                k: None if v is None else _payload_value(op.table.columns[k].kind, v)
                for k, v in values.items()
            }
        if op.checked:
            entry["check_version"] = getattr(op.target, "version", None)
        mutations.append(entry)
    return mutations, ref_map


async def write_entry(
    session: Session,
    statements: OutboxStatements,
    codec: ValueCodec,
    notify: Notify,
    *,
    uow_id: str,
    schema: str,
    namespace: str,
    writes: Sequence[MutationOp],
) -> str:
    """Write the outbox row of a unit with these ``writes`` (creates, updates,
    deletes — never checks); returns its versionstamp."""
    # Everything but the version is prepared before the reservation: from the
    # reservation to COMMIT every outbox writer waits for this one, so that
    # window holds only the insert. A random stand-in takes the version's place
    # in the payload text until it is known.
    stand_in = os.urandom(10).hex()
    mutations, ref_map = describe(schema, namespace, writes, stand_in)
    payload = tagged_json.dumps({"version": 1, "mutations": mutations})
    refs = tagged_json.dumps(ref_map) if ref_map else None
    created = codec.encoder("timestamp")(utc_now())
    version = await reserve_version(session, statements, notify)
    stamp = versionstamp(version)
    payload = payload.replace(stand_in, stamp[:20])
    insert = CompiledQuery(statements.insert, (stamp, uow_id, payload, refs, created))
    notify(insert)
    await session.execute(insert)
    return stamp
