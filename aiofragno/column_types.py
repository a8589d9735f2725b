"""The declared column types that carry an argument beyond their name —
``af.enum(...)`` and ``af.array(...)`` — as plain data, shared by the schema
(which builds and checks them), the codec and the DDL (which read them).

A column's type is a *kind* (``"integer"``, ``"varchar"``, ``"enum"``, ...)
and its *argument* (:data:`TypeArg`): a varchar's length, an enum's
:class:`EnumType`, an array's :class:`ArrayType`, None for the others.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EnumType:
    """A string column holding one of ``values`` (made by ``af.enum``)."""

    values: tuple[str, ...]

    def __str__(self) -> str:
        return f"enum({', '.join(map(repr, self.values))})"


@dataclass(frozen=True, slots=True)
class ArrayType:
    """A PostgreSQL array of one scalar type (made by ``af.array``): the
    element's kind and argument, and its declared name (for messages and
    the schema's fingerprint)."""

    element: str
    element_arg: TypeArg
    element_name: str

    def __str__(self) -> str:
        return f"array({self.element_name})"


TypeArg = int | EnumType | ArrayType | None
