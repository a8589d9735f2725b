"""A schema for the CLI tests to migrate by module:attr."""

import aiofragno as af

ledger = af.Schema("cliledger", af.Table("entries", af.Column("amount", "bigint")))
not_a_schema = 42

# The ledger, evolved: a column renamed and an index added (for --plan/--apply).
ledger_v2 = af.Schema(
    "cliledger",
    af.Table(
        "entries",
        af.Column("total", "bigint", renamed_from="amount"),
        af.Index("by_total", ["total"]),
    ),
)
