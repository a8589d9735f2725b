"""The bookkeeping tables of units of work: the outbox's entries, consumer
cursors and dead letters, and the idempotency keys of units that write no
outbox entry. Created by every migration (they are small and empty until
used)."""

from __future__ import annotations

from collections.abc import Callable

from ..driver import DdlSpec
from ..sql import Identifier

OUTBOX = "fragno_db_outbox"
CONSUMERS = "fragno_db_outbox_consumers"
DEAD_LETTERS = "fragno_db_outbox_dead_letters"
UNIT_KEYS = "fragno_db_unit_keys"
# The "ticks" strategy's (aiofragno.outbox.ticks; only where the dialect has it).
TICKS = "fragno_db_outbox_ticks"
VERSIONS = "fragno_db_outbox_versions"
NAMES = (OUTBOX, CONSUMERS, DEAD_LETTERS, UNIT_KEYS, TICKS, VERSIONS)
VERSION_KEY = "outbox.version"
# The versionstamp of the newest entry prune has deleted (the prune
# horizon): written in the transaction that deletes, read with every page.
PRUNED_KEY = "outbox.pruned"
# One entry per idempotency key: a unit of work commits once per key.
UOW_INDEX = OUTBOX + "_uow_key"
# What an earlier layout had instead: the same look-up, without uniqueness.
OLD_UOW_INDEX = OUTBOX + "_uow_id"

OUTBOX_ID = Identifier(OUTBOX)
CONSUMERS_ID = Identifier(CONSUMERS)
DEAD_LETTERS_ID = Identifier(DEAD_LETTERS)
UNIT_KEYS_ID = Identifier(UNIT_KEYS)
VERSIONS_ID = Identifier(VERSIONS)
TICKS_ID = Identifier(TICKS)


def nonce_type(spec: DdlSpec) -> str:
    """32 hex digits: 128 random bits per execute_uow call."""
    return spec.types["varchar"].replace("{n}", "32")


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
            # Which execute_uow call wrote the entry (see UNIT_KEYS).
            ("nonce", nonce_type(spec)),
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
        # The idempotency key of each unit of work that was given one and
        # committed without an outbox entry (the outbox off): the key is
        # unique, so a second unit with it cannot commit, and ``nonce``
        # names the execute_uow call that committed, so that call alone —
        # not a later one with the same key — finds it after a lost COMMIT.
        UNIT_KEYS: [
            ("key", f"{name} NOT NULL UNIQUE"),
            ("nonce", f"{nonce_type(spec)} NOT NULL"),
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
    """The outbox's unique index on ``uow_id``: units look entries up by it
    after a lost COMMIT, and it refuses a second entry for one key."""
    return f"CREATE UNIQUE INDEX {quote(UOW_INDEX)} ON {quote(OUTBOX)} ({quote('uow_id')})"


def nonce_column_statement(spec: DdlSpec, quote: Callable[[str], str]) -> str:
    """Adds ``nonce`` to an outbox table created without it."""
    return f"ALTER TABLE {quote(OUTBOX)} ADD COLUMN {quote('nonce')} {nonce_type(spec)}"


def old_uow_index_drop_statement(spec: DdlSpec, quote: Callable[[str], str]) -> str:
    """Drops the outbox's non-unique ``uow_id`` index, once the unique one exists."""
    return spec.drop_index_sql.format(index=quote(OLD_UOW_INDEX), table=quote(OUTBOX))
