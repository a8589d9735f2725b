"""A migration plan: every step a migration takes, with its SQL, made before
anything runs and then executed exactly as made.

:meth:`Database.migration_plan <aiofragno.Database.migration_plan>` returns a
:class:`MigrationPlan`; :meth:`Database.migrate <aiofragno.Database.migrate>`
makes one and runs it (the same code: a plan is the only thing migrations
execute). Each :class:`PlanStep` says what it changes, its statements, and
whether it ``locks`` the table (writes wait while it runs), ``rewrites`` it
(copies every row: a long lock on a big table), is ``destructive`` (data is
lost) or is built ``online`` (outside the migration's transaction, while
writes go on: PostgreSQL's ``CREATE INDEX CONCURRENTLY``).

A plan is deterministic — the same declaration and the same database give
the same plan, whose :attr:`~MigrationPlan.id` hashes its steps and the
state of the database it was made from — so it can be written to a file
(:meth:`~MigrationPlan.to_json`), reviewed, and passed back
(``migrate(schema, plan=...)``, ``aiofragno migrate --apply FILE``): the
migration then makes the plan again under the migration lock and refuses to
run anything unless it is the same one.

Statements that bind values (a backfill, new external ids) or check data
first (no NULLs left, no duplicate keys) appear in the plan as SQL comments
saying what they do — with each value they bind (:func:`shown_value`), so
that the plan's id covers it; the rest is the SQL text as it runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import MigrationError

# Runs a bound or checking action on the migration's session.
Runner = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class PlanAction:
    """One thing a step does: ``sql`` run as it is, or (``runner`` set) a
    bound statement or data check that ``sql`` describes as a comment."""

    sql: str
    runner: Runner | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One change: ``what`` it is, of ``table`` (declared name; None: the
    database or aiofragno's own tables) and its column or index ``subject``."""

    what: str
    table: str | None
    subject: str | None
    actions: tuple[PlanAction, ...]
    locks: bool = False
    rewrites: bool = False
    destructive: bool = False
    online: bool = False

    @property
    def sql(self) -> tuple[str, ...]:
        """The step's statements and comments, as the plan shows them."""
        return tuple(action.sql for action in self.actions)

    @property
    def title(self) -> str:
        where = "" if self.table is None else f" {self.table}"
        subject = "" if self.subject is None else f"{'.' if where else ' '}{self.subject}"
        flags = [
            name
            for name, on in (
                ("locks table", self.locks),
                ("REWRITES TABLE", self.rewrites),
                ("DESTRUCTIVE", self.destructive),
                ("online, outside the transaction", self.online),
            )
            if on
        ]
        return f"{self.what}{where}{subject}" + (f" [{', '.join(flags)}]" if flags else "")

    def describe(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "table": self.table,
            "subject": self.subject,
            "sql": list(self.sql),
            "locks": self.locks,
            "rewrites": self.rewrites,
            "destructive": self.destructive,
            "online": self.online,
        }


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """The steps that bring ``namespace`` in line with a declaration, made
    from the database in the state ``database`` (a hash of its catalog and
    records) and leaving it at schema ``version``."""

    namespace: str
    version: int
    database: str
    steps: tuple[PlanStep, ...]

    @property
    def id(self) -> str:
        """A hash of the plan and the database state it was made from."""
        text = json.dumps(self._body(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def statements(self) -> list[str]:
        """The statements run as they are (no comments), in order."""
        return [a.sql for step in self.steps for a in step.actions if a.runner is None]

    @property
    def destructive(self) -> bool:
        return any(step.destructive for step in self.steps)

    def text(self) -> str:
        """The plan for a reader: each step, its flags and its SQL."""
        lines = [
            f"-- migration plan {self.id} for namespace {self.namespace}: "
            f"{len(self.steps)} steps, to schema version {self.version}"
        ]
        for number, step in enumerate(self.steps, 1):
            lines.append(f"-- step {number}: {step.title}")
            lines += [s.rstrip() + ("" if s.startswith("--") else ";") for s in step.sql]
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        """The plan as JSON (``from_json`` reads it back), for review and
        ``--apply``."""
        return json.dumps({**self._body(), "id": self.id}, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> MigrationPlan:
        """A plan written by :meth:`to_json` (which can only be compared:
        ``migrate(plan=...)`` runs the plan it makes anew once it matches)."""
        try:
            data = json.loads(text)
            steps = tuple(
                PlanStep(
                    s["what"],
                    s["table"],
                    s["subject"],
                    tuple(PlanAction(str(sql)) for sql in s["sql"]),
                    **{k: bool(s[k]) for k in ("locks", "rewrites", "destructive", "online")},
                )
                for s in data["steps"]
            )
            plan = cls(str(data["namespace"]), int(data["version"]), str(data["database"]), steps)
        except (ValueError, TypeError, KeyError) as exc:
            raise MigrationError(f"not a migration plan written by to_json(): {exc!r}") from None
        if data.get("id") != plan.id:
            raise MigrationError(
                "the migration plan file was edited after it was made (its id does not match "
                "its steps); make the plan again"
            )
        return plan

    def _body(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "version": self.version,
            "database": self.database,
            "steps": [step.describe() for step in self.steps],
        }


SHOWN_VALUE = 120
"""How much of a bound value's repr a plan shows (beyond: a prefix and a hash)."""


def shown_value(value: Any) -> str:
    """``value`` as a plan shows a value it binds: its repr (one line: repr
    escapes line breaks), or a long one's start and a hash of all of it."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[:SHOWN_VALUE]}... ({len(text)} characters, sha256 {digest})"


def database_state(*parts: Any) -> str:
    """A hash of what a plan was made from (the live tables, the records)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def refuse_stale(expected: MigrationPlan, fresh: MigrationPlan) -> None:
    """:class:`MigrationError` unless ``fresh`` (made now) is ``expected``."""
    if expected.id == fresh.id:
        return
    why = (
        "the database changed since it was made"
        if expected.database != fresh.database
        else "it was made for another declaration or namespace"
    )
    raise MigrationError(
        f"refusing to run migration plan {expected.id}: {why} (a plan made now is "
        f"{fresh.id}, with {len(fresh.steps)} steps); nothing was changed. Make and review "
        "the plan again, then apply that one"
    )
