"""The outbox's tables: entries, consumer cursors and dead letters. Created by
every migration (they are small and empty until the outbox is used)."""

from __future__ import annotations

from collections.abc import Callable

from ..driver import DdlSpec
from ..sql import Identifier

OUTBOX = "fragno_db_outbox"
CONSUMERS = "fragno_db_outbox_consumers"
DEAD_LETTERS = "fragno_db_outbox_dead_letters"
NAMES = (OUTBOX, CONSUMERS, DEAD_LETTERS)
VERSION_KEY = "outbox.version"

OUTBOX_ID = Identifier(OUTBOX)
CONSUMERS_ID = Identifier(CONSUMERS)
DEAD_LETTERS_ID = Identifier(DEAD_LETTERS)


def _columns(spec: DdlSpec) -> dict[str, list[tuple[str, str]]]:
    t = spec.types
    name = t["varchar"].replace("{n}", "255")
    return {
        OUTBOX: [
            ("versionstamp", f"{t['versionstamp']} NOT NULL UNIQUE"),
            ("uow_id", f"{name} NOT NULL"),
            ("payload", f"{t['json_document']} NOT NULL"),
            ("ref_map", t["json_document"]),
            ("created_at", f"{t['timestamp']} NOT NULL"),
        ],
        CONSUMERS: [
            ("name", f"{name} NOT NULL UNIQUE"),
            ("cursor", t["versionstamp"]),
            ("lease_owner", t["varchar"].replace("{n}", "64")),
            ("lease_until", t["bigint"]),
            ("delivered", f"{t['bigint']} NOT NULL DEFAULT 0"),
        ],
        DEAD_LETTERS: [
            ("consumer", f"{name} NOT NULL"),
            ("versionstamp", f"{t['versionstamp']} NOT NULL"),
            ("uow_id", f"{name} NOT NULL"),
            ("entry", f"{t['json_document']} NOT NULL"),
            ("error", f"{t['text']} NOT NULL"),
            ("attempts", f"{t['integer']} NOT NULL"),
            ("created_at", f"{t['timestamp']} NOT NULL"),
        ],
    }


def create_statements(spec: DdlSpec, quote: Callable[[str], str]) -> list[tuple[str, str]]:
    """(table, CREATE TABLE IF NOT EXISTS ...) for each outbox table."""
    statements = []
    for table, columns in _columns(spec).items():
        lines = [
            f"{quote('id')} {spec.primary_key}",
            *(f"{quote(c)} {kind}" for c, kind in columns),
        ]
        body = ",\n  ".join(lines)
        statements.append(
            (table, f"CREATE TABLE IF NOT EXISTS {quote(table)} (\n  {body}\n){spec.table_options}")
        )
    return statements


def uow_index_statement(quote: Callable[[str], str]) -> str:
    # Resolving an ambiguous commit looks entries up by uow_id.
    return f"CREATE INDEX {quote(OUTBOX + '_uow_id')} ON {quote(OUTBOX)} ({quote('uow_id')})"
