"""A table's row decoder (row values -> the row's dict), generated once per
table and selection as straight-line code.

Every row a unit of work reads goes through one, and a join read decodes
dozens per call: a loop over the columns with a ``RowId(...)`` call per id
and reference cost about twice as much as code written out for the table's
columns. The generated source holds only positions and local names made
here (``v3``, ``c3``): column names, decoders and table identities are
passed in as values, never written into the source, so nothing a schema
declares becomes code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..codec import Decode
from ..schema import EXTERNAL_ID, RowId, TableIdentity

# Per column: name, position, decoder, and for a reference the position of the
# referenced row's external id and that table's identity.
Plan = tuple[str, int, Decode | None, int | None, TableIdentity | None]
Decoder = Callable[[Sequence[Any]], dict[str, Any]]


def row_decoder(plan: Sequence[Plan], identity: TableIdentity) -> Decoder:
    """Row values (internal id, external id, version, then as ``plan``
    says) -> a row dict; each RowId carries the table its internal id
    belongs to (a reference's, the referenced table), exactly as
    ``RowId(external, version, internal, table)`` makes it."""
    names: dict[str, Any] = {"_new": str.__new__, "_RowId": RowId, "_table": identity}
    lines = [
        "def decode(values):",
        "    i = _new(_RowId, values[1])",
        "    i.__dict__ = {'version': values[2], 'internal_id': values[0], 'table': _table}",
    ]
    keys = ["n_id: i"]
    names["n_id"] = EXTERNAL_ID
    for index, (name, position, convert, ref_position, target) in enumerate(plan):
        value, key = f"v{index}", f"n{index}"
        names[key] = name
        lines.append(f"    {value} = values[{position}]")
        if ref_position is not None:
            names[f"t{index}"] = target
            lines += [
                f"    if {value} is not None:",
                f"        r = _new(_RowId, values[{ref_position}])",
                f"        r.__dict__ = {{'version': None, 'internal_id': {value}, "
                f"'table': t{index}}}",
                f"        {value} = r",
            ]
        elif convert is not None:
            names[f"c{index}"] = convert
            lines.append(f"    if {value} is not None: {value} = c{index}({value})")
        keys.append(f"{key}: {value}")
    lines.append(f"    return {{{', '.join(keys)}}}")
    exec("\n".join(lines), names)  # (the source: positions and names made above only)
    decode: Decoder = names["decode"]
    return decode
