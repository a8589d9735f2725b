"""A schema for the CLI tests to migrate by module:attr."""

import aiofragno as af

ledger = af.Schema("cliledger", af.Table("entries", af.Column("amount", "bigint")))
not_a_schema = 42
